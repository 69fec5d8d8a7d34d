"""Routing and record reads from the embedded SQLite database.

Reads the projector's `live_pointers` / `generations` tables and ingest's `records` /
`heads` / `outbox` tables (the embedded on-disk format). Each thread has its own
read connection: WAL readers never block the writer.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from contracts.errors import DependencyUnavailable
from query.ports import Route, ScopeReadiness, StoredRecord

__all__ = ["SqliteRecordReader", "SqliteRouting", "generation_document_ids"]


class _Reader:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    f"file:{self._path}?mode=ro", uri=True, timeout=30.0, isolation_level=None
                )
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", f"cannot open {self._path}: {exc}") from exc
            self._local.conn = conn
        return conn

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        try:
            return list(self._conn().execute(sql, params).fetchall())
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc


class SqliteRouting(_Reader):
    """`Routing` over the embedded registry tables."""

    def route(self, namespace: str, snapshot_kind: str) -> Route | None:
        rows = self._query(
            "SELECT g.generation_id, g.applied_position, g.descriptor_json, g.document_count, "
            "g.commit_seq "
            "FROM live_pointers p JOIN generations g ON g.generation_id = p.generation_id "
            "WHERE p.namespace = ? AND p.snapshot_kind = ?",
            (namespace, snapshot_kind),
        )
        if not rows:
            return None
        generation_id, applied, descriptor_json, count, commit_seq = rows[0]
        descriptor = json.loads(str(descriptor_json))
        return Route(
            namespace=namespace,
            snapshot_kind=snapshot_kind,
            generation_id=str(generation_id),
            applied_position=int(str(applied)),
            commit_seq=int(str(commit_seq)),
            embedder_id=str(descriptor["embedder_id"]),
            document_count=int(str(count)),
        )

    def scopes(self) -> list[ScopeReadiness]:
        rows = self._query(
            "SELECT p.namespace, p.snapshot_kind, g.generation_id, g.state, g.document_count,"
            " g.applied_position FROM live_pointers p JOIN generations g "
            "ON g.generation_id = p.generation_id ORDER BY p.namespace, p.snapshot_kind"
        )
        return [
            ScopeReadiness(
                namespace=str(ns),
                snapshot_kind=str(kind),
                generation_id=str(gen),
                state=str(state),
                document_count=int(str(count)),
                applied_position=int(str(applied)),
            )
            for ns, kind, gen, state, count, applied in rows
        ]

    def log_high_water(self) -> int:
        rows = self._query("SELECT COALESCE(MAX(position), 0) FROM outbox")
        return int(str(rows[0][0])) if rows else 0


class SqliteRecordReader(_Reader):
    """`RecordReader` over ingest's `records` and `heads` tables."""

    _COLUMNS = (
        "document_id, revision, item_id, namespace, snapshot_kind, galaxy, deleted, "
        "payload_sha256, record_json"
    )

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]:
        out: dict[tuple[str, int], StoredRecord] = {}
        for start in range(0, len(keys), 400):
            chunk = keys[start : start + 400]
            clause = " OR ".join("(document_id = ? AND revision = ?)" for _ in chunk)
            params = [v for key in chunk for v in key]
            for row in self._query(f"SELECT {self._COLUMNS} FROM records WHERE {clause}", params):
                stored = _stored(row)
                out[(stored.document_id, stored.revision)] = stored
        return out

    def heads(self, namespace: str, document_ids: Sequence[str]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        for start in range(0, len(document_ids), 500):
            chunk = list(document_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            cols = ", ".join(f"r.{c.strip()}" for c in self._COLUMNS.split(","))
            rows = self._query(
                f"SELECT {cols} FROM heads h JOIN records r ON r.document_id = h.document_id "
                f"AND r.revision = h.revision WHERE h.namespace = ? AND h.deleted = 0 "
                f"AND h.document_id IN ({marks})",
                [namespace, *chunk],
            )
            out.extend(_stored(row) for row in rows)
        return out


def _stored(row: tuple[object, ...]) -> StoredRecord:
    doc, rev, item, ns, kind, galaxy, deleted, digest, body = row
    return StoredRecord(
        document_id=str(doc),
        revision=int(str(rev)),
        item_id=str(item),
        namespace=str(ns),
        snapshot_kind=str(kind),
        galaxy=str(galaxy),
        deleted=bool(deleted),
        payload_sha256=str(digest),
        record_json=str(body),
    )


def generation_document_ids(routing: SqliteRouting, generation_id: str) -> list[str]:
    """Live document ids of a generation, from the projector's registry table."""
    rows = routing._query(
        "SELECT document_id FROM generation_documents WHERE generation_id = ? AND deleted = 0 "
        "ORDER BY document_id",
        (generation_id,),
    )
    return [str(r[0]) for r in rows]
