"""Versioned SQL migrations as data: the file-name rule and the checksum (no I/O).

Each package that keeps tables in PostgreSQL owns its migration set, the files
`NNNN_name.sql` under its `adapters/postgres_migrations/` (ingest: the canonical store;
projector: the generation registry, positions, evidence, caches and ring statistics;
query: KoutenDB's search profiles and kept envelopes). One ledger table,
`orrery_migrations`, records every applied file per `component` (the owning package), so
the sets never meet; the driver that applies them is `ingest.adapters.postgres_db.migrate`,
called by the composition root for each component. Query workers read the other two sets
(docs/deploy.md).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources.abc import Traversable

__all__ = ["Migration", "migrations_from"]

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations_from(entries: Iterable[Traversable], *, where: str = "") -> list[Migration]:
    """The migrations among a package's files (`importlib.resources.files(...)` entries),
    in version order; other entries are ignored. Raises `ValueError` for duplicate
    versions."""
    found: list[Migration] = []
    for entry in entries:
        match = _FILE_NAME.match(entry.name)
        if match and entry.is_file():
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"{where}: duplicate migration versions {versions}")
    return found
