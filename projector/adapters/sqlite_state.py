"""SQLite projector state: log positions, generation registry, per-generation document
revisions, live pointers and the vector cache — all in one database so that a batch's
position and its bookkeeping commit in one transaction.

Query workers read `generations`, `live_pointers` and `projector_positions` (see
`query.adapters.sqlite_routing`); the table layout is part of the embedded format.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.generations import GenerationDescriptor, GenerationState, LivePointer, Topology

__all__ = ["STATE_SCHEMA", "SqliteProjectorState"]

STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS projector_positions (
    consumer  TEXT PRIMARY KEY,
    position  INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS generations (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    generation_id  TEXT UNIQUE NOT NULL,
    namespace      TEXT NOT NULL,
    snapshot_kind  TEXT NOT NULL,
    state          TEXT NOT NULL,
    descriptor_json TEXT NOT NULL,
    document_count INTEGER NOT NULL DEFAULT 0,
    applied_position INTEGER NOT NULL DEFAULT 0,
    commit_seq     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS live_pointers (
    namespace     TEXT NOT NULL,
    snapshot_kind TEXT NOT NULL,
    generation_id TEXT NOT NULL,
    switched_at   TEXT NOT NULL,
    PRIMARY KEY (namespace, snapshot_kind)
);
CREATE TABLE IF NOT EXISTS generation_documents (
    generation_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    revision      INTEGER NOT NULL,
    deleted       INTEGER NOT NULL,
    PRIMARY KEY (generation_id, document_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vector_cache (
    cache_key   TEXT PRIMARY KEY,
    dimension   INTEGER NOT NULL,
    vector      BLOB NOT NULL
) WITHOUT ROWID;
"""


class SqliteProjectorState:
    """Projector bookkeeping in SQLite.

    Guarantees: `commit` stores the consumer position and every generation's document
    revisions in one transaction; the live pointer is one row, replaced atomically.
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(STATE_SCHEMA)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", str(exc)) from exc

    # -- positions -------------------------------------------------------------------
    def position(self, consumer: str) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT position FROM projector_positions WHERE consumer = ?", (consumer,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]:
        """Revisions the generation holds (live or tombstoned) for these documents."""
        out: dict[str, int] = {}
        with self._lock:
            for start in range(0, len(document_ids), 500):
                chunk = list(document_ids[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT document_id, revision FROM generation_documents "
                    f"WHERE generation_id = ? AND document_id IN ({marks})",
                    [generation_id, *chunk],
                ).fetchall()
                out.update({str(d): int(r) for d, r in rows})
        return out

    def commit(
        self,
        consumer: str,
        position: int,
        changes: Mapping[str, Mapping[str, tuple[int, bool]]],
    ) -> None:
        """Store the new position and each generation's new document revisions."""
        now = datetime.now(UTC).isoformat()
        with self._transaction() as conn:
            for generation_id, docs in changes.items():
                conn.executemany(
                    "INSERT INTO generation_documents VALUES (?,?,?,?) "
                    "ON CONFLICT(generation_id, document_id) DO UPDATE SET "
                    "revision = excluded.revision, deleted = excluded.deleted "
                    "WHERE excluded.revision > generation_documents.revision",
                    [(generation_id, d, rev, int(dead)) for d, (rev, dead) in docs.items()],
                )
                conn.execute(
                    "UPDATE generations SET applied_position = MAX(applied_position, ?), "
                    "commit_seq = commit_seq + 1, document_count = "
                    "(SELECT COUNT(*) FROM generation_documents WHERE generation_id = ? "
                    "AND deleted = 0) WHERE generation_id = ?",
                    (position, generation_id, generation_id),
                )
            conn.execute(
                "INSERT INTO projector_positions VALUES (?,?,?) ON CONFLICT(consumer) "
                "DO UPDATE SET position = MAX(position, excluded.position), "
                "updated_at = excluded.updated_at",
                (consumer, position, now),
            )
            # Generations that saw no event in this batch are still caught up to it.
            conn.execute(
                "UPDATE generations SET applied_position = ? WHERE state IN ('live', "
                "'building') AND applied_position < ?",
                (position, position),
            )

    # -- generations -----------------------------------------------------------------
    def create_generation(
        self,
        namespace: str,
        snapshot_kind: str,
        *,
        embedder_id: str,
        embedder_dim: int,
        lexical_engine: str,
        vector_engine: str,
        schema_digest: str,
        make_live: bool,
    ) -> GenerationDescriptor:
        """Register a new generation (`live` at once when `make_live`, else `building`)."""
        now = datetime.now(UTC)
        with self._transaction() as conn:
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM generations").fetchone()[0]
            generation_id = f"g{seq}"
            state = GenerationState.LIVE if make_live else GenerationState.BUILDING
            descriptor = GenerationDescriptor(
                generation_id=generation_id,
                namespace=namespace,
                snapshot_kind=snapshot_kind,
                state=state,
                created_at=now,
                embedder_id=embedder_id,
                embedder_dim=embedder_dim,
                topology=Topology(
                    lexical_engine=lexical_engine,
                    lexical_index=generation_id,
                    vector_engine=vector_engine,
                    vector_index=generation_id,
                ),
                schema_digest=schema_digest,
            )
            conn.execute(
                "INSERT INTO generations (seq, generation_id, namespace, snapshot_kind, state,"
                " descriptor_json) VALUES (?,?,?,?,?,?)",
                (
                    seq,
                    generation_id,
                    namespace,
                    snapshot_kind,
                    state.value,
                    descriptor.model_dump_json(),
                ),
            )
            if make_live:
                conn.execute(
                    "INSERT INTO live_pointers VALUES (?,?,?,?) ON CONFLICT(namespace, "
                    "snapshot_kind) DO UPDATE SET generation_id = excluded.generation_id, "
                    "switched_at = excluded.switched_at",
                    (namespace, snapshot_kind, generation_id, now.isoformat()),
                )
        return descriptor

    def write_targets(self, namespace: str, snapshot_kind: str) -> list[str]:
        """Generations that receive new events for a scope: the live one and builds."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT generation_id FROM generations WHERE namespace = ? AND "
                "snapshot_kind = ? AND state IN ('live', 'building') ORDER BY seq",
                (namespace, snapshot_kind),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def live_pointer(self, namespace: str, snapshot_kind: str) -> LivePointer | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT generation_id, switched_at FROM live_pointers WHERE namespace = ? "
                "AND snapshot_kind = ?",
                (namespace, snapshot_kind),
            ).fetchone()
        if row is None:
            return None
        return LivePointer(
            namespace=namespace,
            snapshot_kind=snapshot_kind,
            generation_id=str(row[0]),
            switched_at=datetime.fromisoformat(str(row[1])),
        )

    def describe(self, generation_id: str) -> GenerationDescriptor:
        """The descriptor with evidence recomputed from the registry's document table."""
        with self._lock:
            row = self._conn.execute(
                "SELECT descriptor_json, state, applied_position FROM generations "
                "WHERE generation_id = ?",
                (generation_id,),
            ).fetchone()
            if row is None:
                raise OrreryError(
                    ErrorCode.NOT_FOUND, f"generation {generation_id!r} does not exist"
                )
            pairs = self._conn.execute(
                "SELECT document_id, revision FROM generation_documents "
                "WHERE generation_id = ? AND deleted = 0",
                (generation_id,),
            ).fetchall()
        base = GenerationDescriptor.model_validate_json(row[0])
        return base.model_copy(
            update={
                "state": GenerationState(row[1]),
                "applied_position": int(row[2]),
                "document_count": len(pairs),
                "id_set_digest": id_set_digest((str(d), int(r)) for d, r in pairs),
            }
        )

    def generations(self) -> list[tuple[str, str, str, str]]:
        """`(generation_id, namespace, snapshot_kind, state)` of every generation."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT generation_id, namespace, snapshot_kind, state FROM generations "
                "ORDER BY seq"
            ).fetchall()
        return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]

    # -- vector cache ----------------------------------------------------------------
    def cached_vectors(self, keys: Iterable[str]) -> dict[str, tuple[float, ...]]:
        out: dict[str, tuple[float, ...]] = {}
        key_list = list(keys)
        with self._lock:
            for start in range(0, len(key_list), 500):
                chunk = key_list[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT cache_key, vector FROM vector_cache WHERE cache_key IN ({marks})",
                    chunk,
                ).fetchall()
                for key, blob in rows:
                    out[str(key)] = tuple(np.frombuffer(blob, dtype=np.float32).tolist())
        return out

    def store_vectors(self, vectors: Mapping[str, Sequence[float]]) -> None:
        with self._transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO vector_cache VALUES (?,?,?)",
                [
                    (key, len(vec), np.asarray(vec, dtype=np.float32).tobytes())
                    for key, vec in vectors.items()
                ],
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()
