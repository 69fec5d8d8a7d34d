"""Maintenance of a PostgreSQL canonical store: refused, with the tools to use instead."""

from __future__ import annotations

from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb_io import BackupResponse, CompactResponse

__all__ = ["PostgresStoreMaintenance"]


class PostgresStoreMaintenance:
    """`StoreMaintenance` of a PostgreSQL canonical store: Orrery does not copy a
    database server; every call is `409 invalid_state` pointing at PostgreSQL's tools."""

    def _refuse(self, what: str) -> OrreryError:
        return OrreryError(
            ErrorCode.INVALID_STATE,
            f"{what} is not done by Orrery for a PostgreSQL canonical store "
            "(ORRERY_DATABASE_URL): use pg_dump / pg_basebackup for backups and "
            "PostgreSQL's autovacuum for space; docs/koutendb.md",
            {"store": "postgresql"},
        )

    def backup(self, name: str) -> BackupResponse:
        raise self._refuse("backup")

    def verify(self, name: str) -> BackupResponse:
        raise self._refuse("verify")

    def compact(self) -> CompactResponse:
        raise self._refuse("compact")
