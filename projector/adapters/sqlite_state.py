"""SQLite projector state: log positions, generation registry, per-generation document
revisions, live pointers, evidence checks and the vector cache — all in one database so
that a batch's position and its bookkeeping commit in one transaction.

Query workers read `generations`, `live_pointers`, `projector_positions`,
`generation_checks`, `projector_log_status` and `dead_letters` (see
`query.adapters.sqlite_routing`); the table layout is part of the embedded format.
`generations.state` always equals the state inside `descriptor_json`, and
`descriptor_digest` that descriptor's content digest.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from contracts.admin import GenerationRow
from contracts.digests import id_set_digest
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.generations import (
    EvidenceCheck,
    GenerationDescriptor,
    GenerationState,
    LivePointer,
    Topology,
)
from contracts.qualification import QualificationReceipt
from projector.dead_letters import dead_letter_of, rejected_value
from projector.model import (
    WRITABLE_STATES,
    engine_named_topology,
    fetched_pairs,
    new_generation,
    transition,
)
from projector.ports import DeadLetter, RegistrySnapshot, RejectedRecord, Undecodable

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
    commit_seq     INTEGER NOT NULL DEFAULT 0,
    descriptor_digest TEXT NOT NULL DEFAULT '',
    heartbeat_at   TEXT,
    indexes_dropped INTEGER NOT NULL DEFAULT 0
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
CREATE TABLE IF NOT EXISTS generation_checks (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    generation_id TEXT NOT NULL,
    kind          TEXT NOT NULL,
    ok            INTEGER NOT NULL,
    checked_at    TEXT NOT NULL,
    check_json    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS generation_checks_by_generation
    ON generation_checks (generation_id, seq);
CREATE TABLE IF NOT EXISTS qualification_receipts (
    receipt_id        TEXT PRIMARY KEY,
    generation_id     TEXT NOT NULL,
    descriptor_digest TEXT NOT NULL,
    passed            INTEGER NOT NULL,
    created_at        TEXT NOT NULL,
    receipt_json      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS qualification_receipts_by_generation
    ON qualification_receipts (generation_id, created_at);
CREATE TABLE IF NOT EXISTS projector_log_status (
    consumer    TEXT PRIMARY KEY,
    position    INTEGER NOT NULL,
    lag_events  INTEGER NOT NULL,
    measured_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS projector_namespace_positions (
    namespace  TEXT PRIMARY KEY,
    position   INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
-- The newest Kafka offset applied per (namespace, partition): see the PostgreSQL
-- migration 0006 of the projector.
CREATE TABLE IF NOT EXISTS projector_partition_offsets (
    namespace       TEXT NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    updated_at      TEXT NOT NULL,
    PRIMARY KEY (namespace, kafka_partition)
);
CREATE TABLE IF NOT EXISTS dead_letters (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer     TEXT NOT NULL,
    location     TEXT NOT NULL,
    position     INTEGER,
    message_key  BLOB,
    message_value BLOB NOT NULL,
    headers_json TEXT NOT NULL,
    reason       TEXT NOT NULL,
    parked_at    TEXT NOT NULL,
    UNIQUE (consumer, location)
);
CREATE TABLE IF NOT EXISTS vector_cache (
    cache_key   TEXT PRIMARY KEY,
    dimension   INTEGER NOT NULL,
    vector      BLOB NOT NULL
) WITHOUT ROWID;
"""
# Columns added after the first release of the format, with their definitions.
_ADDED_COLUMNS = {
    "descriptor_digest": "TEXT NOT NULL DEFAULT ''",
    "heartbeat_at": "TEXT",
    "indexes_dropped": "INTEGER NOT NULL DEFAULT 0",
}
# Dead letters of rejected records (issue 22) name their record; undecodable ones leave
# these NULL.
_DEAD_LETTER_COLUMNS = {
    "namespace": "TEXT",
    "snapshot_kind": "TEXT",
    "document_id": "TEXT",
    "revision": "INTEGER",
}
_DEAD_LETTER_SELECT = (
    "SELECT seq, consumer, location, position, message_key, message_value, headers_json, "
    "reason, parked_at, namespace, snapshot_kind, document_id, revision FROM dead_letters"
)
_WRITABLE = tuple(sorted(state.value for state in WRITABLE_STATES))
_WRITABLE_SQL = ",".join(f"'{state}'" for state in _WRITABLE)
# Evidence checks kept per generation.
_CHECKS_KEPT = 50
_ROW_COLUMNS = (
    "g.generation_id, g.namespace, g.snapshot_kind, g.state, g.descriptor_json, "
    "g.document_count, g.applied_position, g.commit_seq, g.descriptor_digest, "
    "g.heartbeat_at, g.indexes_dropped, p.generation_id IS NOT NULL"
)
_ROW_FROM = (
    "generations g LEFT JOIN live_pointers p ON p.generation_id = g.generation_id "
    "AND p.namespace = g.namespace AND p.snapshot_kind = g.snapshot_kind"
)


class SqliteProjectorState:
    """Projector bookkeeping in SQLite.

    Guarantees: `commit` stores the consumer position and every generation's document
    revisions in one transaction; the live pointer is one row, replaced atomically
    together with the descriptors of the generations it moves between; descriptor
    writes are compare-and-set on the state. Implements `ProjectionState`,
    `GenerationRegistry`, `GenerationContents`, `GenerationMaintenance`, `EvidenceLog`,
    `VectorCache`, `DeadLetterBox` (table `dead_letters`: key and value as BLOBs, headers as JSON
    with base64 values) and `LogHealth` (table `projector_log_status`,
    written only when the measurement changed).
    """

    def __init__(self, path: Path) -> None:
        self._lock = threading.RLock()
        self._recorded_lag: dict[str, tuple[int, int]] = {}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(STATE_SCHEMA)
            self._add_missing_columns()
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    def _add_missing_columns(self) -> None:
        present = {str(row[1]) for row in self._conn.execute("PRAGMA table_info(generations)")}
        for name, definition in _ADDED_COLUMNS.items():
            if name not in present:
                # Another process may add it at the same moment.
                with contextlib.suppress(sqlite3.OperationalError):
                    self._conn.execute(f"ALTER TABLE generations ADD COLUMN {name} {definition}")
        present = {str(row[1]) for row in self._conn.execute("PRAGMA table_info(dead_letters)")}
        for name, definition in _DEAD_LETTER_COLUMNS.items():
            if name not in present:
                with contextlib.suppress(sqlite3.OperationalError):
                    self._conn.execute(f"ALTER TABLE dead_letters ADD COLUMN {name} {definition}")

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
        *,
        held: Collection[str] = (),
        namespaces: Mapping[str, int] | None = None,
        partitions: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Store the new position and each generation's new document revisions; every
        writable generation but those `held` is applied up to `position`. `namespaces`
        (namespace -> its newest position in the batch) is kept for keyed readiness
        (`projector_namespace_positions`); writers are paced on it only on PostgreSQL
        (the embedded deployment measures each backlog in memory: `contracts.progress`).
        `partitions` ((namespace, partition) -> newest offset, from a Kafka log) is kept
        the same way (`projector_partition_offsets`), for readiness's exact count."""
        held = sorted(held)
        now = datetime.now(UTC).isoformat()
        with self._transaction() as conn:
            for generation_id, docs in changes.items():
                added = _record_documents(conn, generation_id, docs)
                conn.execute(
                    "UPDATE generations SET applied_position = MAX(applied_position, ?), "
                    "commit_seq = commit_seq + 1, document_count = document_count + ? "
                    "WHERE generation_id = ?",
                    (position, added, generation_id),
                )
            if namespaces:
                conn.executemany(
                    "INSERT INTO projector_namespace_positions VALUES (?,?,?) "
                    "ON CONFLICT(namespace) DO UPDATE SET position = MAX(position, "
                    "excluded.position), updated_at = excluded.updated_at",
                    [(ns, int(pos), now) for ns, pos in sorted(namespaces.items())],
                )
            if partitions:
                conn.executemany(
                    "INSERT INTO projector_partition_offsets VALUES (?,?,?,?) "
                    "ON CONFLICT(namespace, kafka_partition) DO UPDATE SET kafka_offset = "
                    "MAX(kafka_offset, excluded.kafka_offset), updated_at = excluded.updated_at",
                    [(ns, int(p), int(o), now) for (ns, p), o in sorted(partitions.items())],
                )
            conn.execute(
                "INSERT INTO projector_positions VALUES (?,?,?) ON CONFLICT(consumer) "
                "DO UPDATE SET position = MAX(position, excluded.position), "
                "updated_at = excluded.updated_at",
                (consumer, position, now),
            )
            # Generations that saw no event in this batch are still caught up to it.
            conn.execute(
                f"UPDATE generations SET applied_position = ? WHERE state IN ({_WRITABLE_SQL})"
                f" AND applied_position < ? AND generation_id NOT IN ({','.join('?' * len(held))})",
                (position, position, *held),
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
        topology: Callable[[str], Topology] | None = None,
    ) -> GenerationDescriptor:
        """Register a new generation (`live` at once when `make_live`, else `building`).

        `topology` names the generation's engine indexes; by default both are named
        like the generation.
        """
        now = datetime.now(UTC)

        state = GenerationState.LIVE if make_live else GenerationState.BUILDING
        reason = "first generation of the scope, made live by the projector" if make_live else ""
        with self._transaction() as conn:
            descriptor = self._insert_generation(
                conn,
                namespace,
                snapshot_kind,
                state=state,
                reason=reason,
                at=now,
                embedder_id=embedder_id,
                embedder_dim=embedder_dim,
                schema_digest=schema_digest,
                topology=topology or engine_named_topology(lexical_engine, vector_engine),
            )
            generation_id = descriptor.generation_id
            if make_live:
                conn.execute(
                    "INSERT INTO live_pointers VALUES (?,?,?,?) ON CONFLICT(namespace, "
                    "snapshot_kind) DO UPDATE SET generation_id = excluded.generation_id, "
                    "switched_at = excluded.switched_at",
                    (namespace, snapshot_kind, generation_id, now.isoformat()),
                )
        return descriptor

    def _insert_generation(
        self,
        conn: sqlite3.Connection,
        namespace: str,
        snapshot_kind: str,
        *,
        state: GenerationState,
        reason: str,
        at: datetime,
        embedder_id: str,
        embedder_dim: int,
        schema_digest: str,
        topology: Callable[[str], Topology],
    ) -> GenerationDescriptor:
        seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM generations").fetchone()[0])
        descriptor = new_generation(
            seq,
            namespace,
            snapshot_kind,
            state=state,
            reason=reason,
            at=at,
            embedder_id=embedder_id,
            embedder_dim=embedder_dim,
            schema_digest=schema_digest,
            topology=topology,
        )
        generation_id = descriptor.generation_id
        conn.execute(
            "INSERT INTO generations (seq, generation_id, namespace, snapshot_kind, state,"
            " descriptor_json, descriptor_digest, heartbeat_at) VALUES (?,?,?,?,?,?,?,?)",
            (
                seq,
                generation_id,
                namespace,
                snapshot_kind,
                state.value,
                descriptor.model_dump_json(),
                descriptor.descriptor_digest,
                at.isoformat(),
            ),
        )
        return descriptor

    def write_targets(self, namespace: str, snapshot_kind: str) -> list[str]:
        """Generations that receive new events for a scope: every one that is building,
        sealed, verified or live (so a promote or a rollback loses nothing)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT generation_id FROM generations WHERE namespace = ? AND "
                f"snapshot_kind = ? AND state IN ({_WRITABLE_SQL}) ORDER BY seq",
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
            pairs = self._live_pairs(generation_id)
        base = GenerationDescriptor.model_validate_json(row[0])
        return base.model_copy(
            update={
                "state": GenerationState(row[1]),
                "applied_position": int(row[2]),
                "document_count": len(pairs),
                "id_set_digest": id_set_digest(pairs.items()),
            }
        ).with_digest()

    def generations(self) -> list[tuple[str, str, str, str]]:
        """`(generation_id, namespace, snapshot_kind, state)` of every generation."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT generation_id, namespace, snapshot_kind, state FROM generations "
                "ORDER BY seq"
            ).fetchall()
        return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]

    # -- GenerationRegistry ------------------------------------------------------------
    def begin_generation(
        self,
        namespace: str,
        snapshot_kind: str,
        *,
        embedder_id: str,
        embedder_dim: int,
        schema_digest: str,
        topology: Callable[[str], Topology],
        at: datetime,
    ) -> GenerationDescriptor:
        with self._transaction() as conn:
            return self._insert_generation(
                conn,
                namespace,
                snapshot_kind,
                state=GenerationState.BUILDING,
                reason="build started",
                at=at,
                embedder_id=embedder_id,
                embedder_dim=embedder_dim,
                schema_digest=schema_digest,
                topology=topology,
            )

    def generation(self, generation_id: str) -> tuple[GenerationRow, GenerationDescriptor]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM {_ROW_FROM} WHERE g.generation_id = ?",
                (generation_id,),
            ).fetchall()
        if not rows:
            raise OrreryError(
                ErrorCode.NOT_FOUND,
                f"generation {generation_id!r} does not exist",
                {"generation_id": generation_id},
            )
        return _row(rows[0])

    def generation_rows(
        self, namespace: str | None = None, snapshot_kind: str | None = None
    ) -> list[tuple[GenerationRow, GenerationDescriptor]]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM {_ROW_FROM} WHERE (? IS NULL OR g.namespace = ?) "
                "AND (? IS NULL OR g.snapshot_kind = ?) ORDER BY g.seq",
                (namespace, namespace, snapshot_kind, snapshot_kind),
            ).fetchall()
        return [_row(row) for row in rows]

    def save_descriptor(
        self, descriptor: GenerationDescriptor, *, expect: frozenset[GenerationState]
    ) -> None:
        with self._transaction() as conn:
            self._save_locked(conn, descriptor, expect)

    def switch_live(
        self,
        promoted: GenerationDescriptor,
        demoted: GenerationDescriptor | None,
        *,
        expected_live: str | None,
        at: datetime,
    ) -> None:
        namespace, kind = promoted.namespace, promoted.snapshot_kind
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT generation_id FROM live_pointers WHERE namespace = ? AND snapshot_kind = ?",
                (namespace, kind),
            ).fetchone()
            current = None if row is None else str(row[0])
            if current != expected_live:
                raise OrreryError(
                    ErrorCode.INVALID_STATE,
                    f"the live generation of {namespace}/{kind} changed meanwhile "
                    f"(now {current}); nothing was switched",
                    {"namespace": namespace, "snapshot_kind": kind, "live": current},
                )
            self._save_locked(conn, promoted, frozenset({GenerationState.VERIFIED}))
            if demoted is not None:
                self._save_locked(conn, demoted, frozenset({GenerationState.LIVE}))
            conn.execute(
                "INSERT INTO live_pointers VALUES (?,?,?,?) ON CONFLICT(namespace, "
                "snapshot_kind) DO UPDATE SET generation_id = excluded.generation_id, "
                "switched_at = excluded.switched_at",
                (namespace, kind, promoted.generation_id, at.isoformat()),
            )

    def _save_locked(
        self,
        conn: sqlite3.Connection,
        descriptor: GenerationDescriptor,
        expect: frozenset[GenerationState],
    ) -> None:
        if not descriptor.digest_is_valid():
            raise OrreryError(
                ErrorCode.INTERNAL,
                "refusing to store a descriptor whose digest does not match its content",
                {"generation_id": descriptor.generation_id},
            )
        states = sorted(state.value for state in expect)
        marks = ",".join("?" * len(states))
        cursor = conn.execute(
            "UPDATE generations SET state = ?, descriptor_json = ?, descriptor_digest = ? "
            f"WHERE generation_id = ? AND state IN ({marks})",
            (
                descriptor.state.value,
                descriptor.model_dump_json(),
                descriptor.descriptor_digest,
                descriptor.generation_id,
                *states,
            ),
        )
        if cursor.rowcount == 1:
            return
        row = conn.execute(
            "SELECT state FROM generations WHERE generation_id = ?", (descriptor.generation_id,)
        ).fetchone()
        if row is None:
            raise OrreryError(
                ErrorCode.NOT_FOUND,
                f"generation {descriptor.generation_id!r} does not exist",
                {"generation_id": descriptor.generation_id},
            )
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"generation {descriptor.generation_id} is {row[0]}, expected one of "
            f"{', '.join(states)}; nothing was changed",
            {"generation_id": descriptor.generation_id, "state": str(row[0]), "expected": states},
        )

    # -- GenerationContents ------------------------------------------------------------
    def record_documents(self, generation_id: str, changes: Mapping[str, tuple[int, bool]]) -> None:
        with self._transaction() as conn:
            added = _record_documents(conn, generation_id, changes)
            conn.execute(
                "UPDATE generations SET commit_seq = commit_seq + 1, "
                "document_count = document_count + ? WHERE generation_id = ?",
                (added, generation_id),
            )

    def mark_applied(self, generation_id: str, position: int) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE generations SET applied_position = MAX(applied_position, ?) "
                "WHERE generation_id = ?",
                (position, generation_id),
            )

    def _live_pairs(self, generation_id: str) -> dict[str, int]:
        """The generation's live `(document_id, revision)` pairs in key order (the
        primary key's: hashed without a sort), a chunk at a time; under `_lock`."""
        return fetched_pairs(
            self._conn.execute(
                "SELECT document_id, revision FROM generation_documents "
                "WHERE generation_id = ? AND deleted = 0 ORDER BY document_id",
                (generation_id,),
            ).fetchmany
        )

    def registry_pairs(self, generation_id: str) -> RegistrySnapshot:
        # One read transaction: the pairs and the row belong to the same commit.
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                try:
                    row = self._conn.execute(
                        "SELECT state, applied_position, commit_seq FROM generations "
                        "WHERE generation_id = ?",
                        (generation_id,),
                    ).fetchone()
                    pairs = self._live_pairs(generation_id)
                finally:
                    self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", str(exc)) from exc
        if row is None:
            raise OrreryError(
                ErrorCode.NOT_FOUND,
                f"generation {generation_id!r} does not exist",
                {"generation_id": generation_id},
            )
        return RegistrySnapshot(
            generation_id=generation_id,
            state=GenerationState(str(row[0])),
            pairs=pairs,
            applied_position=int(row[1]),
            commit_seq=int(row[2]),
        )

    def commit_seq(self, generation_id: str) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT commit_seq FROM generations WHERE generation_id = ?", (generation_id,)
            ).fetchone()
        return -1 if row is None else int(row[0])

    # -- GenerationMaintenance ---------------------------------------------------------
    def heartbeat(self, generation_id: str) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE generations SET heartbeat_at = ? WHERE generation_id = ?",
                (datetime.now(UTC).isoformat(), generation_id),
            )

    def fail_orphaned_builds(self, reason: str, *, older_than: datetime | None) -> list[str]:
        now = datetime.now(UTC)
        failed: list[str] = []
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT descriptor_json, heartbeat_at, applied_position FROM generations "
                "WHERE state = 'building' ORDER BY seq"
            ).fetchall()
            for body, heartbeat, applied in rows:
                seen = None if heartbeat is None else datetime.fromisoformat(str(heartbeat))
                if older_than is not None and seen is not None and seen >= older_than:
                    continue
                descriptor = GenerationDescriptor.model_validate_json(str(body))
                dead = transition(
                    descriptor,
                    GenerationState.FAILED,
                    at=now,
                    position=int(applied),
                    reason=reason,
                )
                self._save_locked(conn, dead, frozenset({GenerationState.BUILDING}))
                failed.append(descriptor.generation_id)
        return failed

    def mark_indexes_dropped(self, generation_id: str) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE generations SET indexes_dropped = 1 WHERE generation_id = ?",
                (generation_id,),
            )
            # The engines no longer hold it: its document table is garbage too.
            conn.execute(
                "DELETE FROM generation_documents WHERE generation_id = ?", (generation_id,)
            )

    # -- EvidenceLog -------------------------------------------------------------------
    def record_check(self, check: EvidenceCheck) -> None:
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO generation_checks (generation_id, kind, ok, checked_at, "
                "check_json) VALUES (?,?,?,?,?)",
                (
                    check.generation_id,
                    check.kind,
                    int(check.ok),
                    check.checked_at.isoformat(),
                    check.model_dump_json(),
                ),
            )
            conn.execute(
                "DELETE FROM generation_checks WHERE generation_id = ? AND seq NOT IN "
                "(SELECT seq FROM generation_checks WHERE generation_id = ? "
                "ORDER BY seq DESC LIMIT ?)",
                (check.generation_id, check.generation_id, _CHECKS_KEPT),
            )

    def latest_checks(self, generation_id: str, limit: int = 5) -> list[EvidenceCheck]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT check_json FROM generation_checks WHERE generation_id = ? "
                "ORDER BY seq DESC LIMIT ?",
                (generation_id, limit),
            ).fetchall()
        return [EvidenceCheck.model_validate_json(str(r[0])) for r in rows]

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, check_json FROM generation_checks WHERE seq > ? ORDER BY seq",
                (sequence,),
            ).fetchall()
        return [(int(seq), EvidenceCheck.model_validate_json(str(body))) for seq, body in rows]

    # -- ReceiptLog --------------------------------------------------------------------
    def record_receipt(self, receipt: QualificationReceipt) -> None:
        if not receipt.id_is_valid():
            raise ValueError("a receipt is stored with its content id (with_id)")
        with self._transaction() as conn:
            # Content-addressed: storing the same receipt twice is a no-op.
            conn.execute(
                "INSERT OR IGNORE INTO qualification_receipts (receipt_id, generation_id, "
                "descriptor_digest, passed, created_at, receipt_json) VALUES (?,?,?,?,?,?)",
                (
                    receipt.receipt_id,
                    receipt.generation_id,
                    receipt.descriptor_digest,
                    int(receipt.passed),
                    receipt.created_at.isoformat(),
                    receipt.model_dump_json(),
                ),
            )

    def receipts(self, generation_id: str) -> list[QualificationReceipt]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT receipt_json FROM qualification_receipts WHERE generation_id = ? "
                "ORDER BY created_at DESC, receipt_id",
                (generation_id,),
            ).fetchall()
        return [QualificationReceipt.model_validate_json(str(r[0])) for r in rows]

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

    # -- dead letters and log health ---------------------------------------------------
    def park(self, consumer: str, messages: Sequence[Undecodable]) -> None:
        now = datetime.now(UTC).isoformat()
        with self._transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO dead_letters (consumer, location, position, "
                "message_key, message_value, headers_json, reason, parked_at) "
                "VALUES (?,?,?,?,?,?,?,?)",
                [
                    (
                        consumer,
                        m.where,
                        m.position,
                        m.key,
                        m.value,
                        json.dumps(
                            [[k, base64.b64encode(v).decode("ascii")] for k, v in m.headers]
                        ),
                        m.reason,
                        now,
                    )
                    for m in messages
                ],
            )

    def park_rejected(self, consumer: str, rejected: Sequence[RejectedRecord]) -> None:
        now = datetime.now(UTC).isoformat()
        with self._transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO dead_letters (consumer, location, position, "
                "message_key, message_value, headers_json, reason, parked_at, namespace, "
                "snapshot_kind, document_id, revision) SELECT ?,?,?,?,?,?,?,?,?,?,?,? "
                # A record revision is parked once, by whoever refused it first.
                "WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE namespace = ? AND "
                "snapshot_kind = ? AND document_id = ? AND revision = ?)",
                [
                    (
                        consumer,
                        r.where,
                        r.position,
                        r.record.doc_id.encode(),
                        rejected_value(r),
                        "[]",
                        f"{r.code}: {r.reason}",
                        now,
                        r.record.namespace,
                        r.record.snapshot_kind,
                        r.record.doc_id,
                        r.record.revision,
                        r.record.namespace,
                        r.record.snapshot_kind,
                        r.record.doc_id,
                        r.record.revision,
                    )
                    for r in rejected
                ],
            )

    def dead_letters(self, limit: int = 100, *, namespace: str | None = None) -> list[DeadLetter]:
        where, params = ("", ()) if namespace is None else (" WHERE namespace = ?", (namespace,))
        with self._lock:
            rows = self._conn.execute(
                f"{_DEAD_LETTER_SELECT}{where} ORDER BY seq LIMIT ?", (*params, limit)
            ).fetchall()
        return [dead_letter_of(row, datetime.fromisoformat(str(row[8]))) for row in rows]

    def remove(self, seqs: Collection[int]) -> int:
        if not seqs:
            return 0
        with self._transaction() as conn:
            cursor = conn.executemany(
                "DELETE FROM dead_letters WHERE seq = ?", [(int(s),) for s in seqs]
            )
            return int(cursor.rowcount)

    def dead_letter_count(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
        return int(row[0])

    def record_lag(self, consumer: str, *, position: int, lag_events: int) -> None:
        with self._lock:
            if self._recorded_lag.get(consumer) == (position, lag_events):
                return
            with self._transaction() as conn:
                conn.execute(
                    "INSERT INTO projector_log_status VALUES (?,?,?,?) ON CONFLICT(consumer) "
                    "DO UPDATE SET position = excluded.position, lag_events = "
                    "excluded.lag_events, measured_at = excluded.measured_at",
                    (consumer, position, lag_events, datetime.now(UTC).isoformat()),
                )
            self._recorded_lag[consumer] = (position, lag_events)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _row(row: Sequence[object]) -> tuple[GenerationRow, GenerationDescriptor]:
    (gid, ns, kind, state, body, count, applied, seq, digest, heartbeat, dropped, live) = row
    descriptor = GenerationDescriptor.model_validate_json(str(body))
    return (
        GenerationRow(
            generation_id=str(gid),
            namespace=str(ns),
            snapshot_kind=str(kind),
            state=GenerationState(str(state)),
            live=bool(live),
            created_at=descriptor.created_at,
            document_count=int(str(count)),
            applied_position=int(str(applied)),
            commit_seq=int(str(seq)),
            descriptor_digest=str(digest) or descriptor.computed_digest(),
            indexes_dropped=bool(dropped),
            heartbeat_at=None if heartbeat is None else datetime.fromisoformat(str(heartbeat)),
        ),
        descriptor,
    )


# Documents a lookup names at most (SQLite's bound variables per statement).
_LOOKUP_CHUNK = 500


def _record_documents(
    conn: sqlite3.Connection, generation_id: str, docs: Mapping[str, tuple[int, bool]]
) -> int:
    """Upsert a generation's document revisions (newer ones win; write transaction
    held); returns how many more live documents it holds now (negative when deletes
    outnumber new documents).

    Counted over the batch's documents, from their rows as the transaction found them,
    not by recounting the generation: a `COUNT(*)` of every document held, per commit,
    was ~55 ms at 1M documents (~30 µs a record of 2,000-record batches, growing with
    the generation; docs/bench/README.md, session 31). PostgreSQL counts the same way
    (`postgres_state._record_documents`)."""
    ids = list(docs)
    found: dict[str, tuple[int, int]] = {}
    for start in range(0, len(ids), _LOOKUP_CHUNK):
        chunk = ids[start : start + _LOOKUP_CHUNK]
        marks = ",".join("?" * len(chunk))
        for document_id, revision, deleted in conn.execute(
            f"SELECT document_id, revision, deleted FROM generation_documents "
            f"WHERE generation_id = ? AND document_id IN ({marks})",
            [generation_id, *chunk],
        ):
            found[document_id] = (revision, deleted)
    added = 0
    for document_id, (revision, dead) in docs.items():
        held = found.get(document_id)
        if held is None:
            added += not dead
        elif revision > held[0]:  # the upsert's own condition: only a newer one is written
            added += (not dead) - (not held[1])
    conn.executemany(
        "INSERT INTO generation_documents VALUES (?,?,?,?) "
        "ON CONFLICT(generation_id, document_id) DO UPDATE SET "
        "revision = excluded.revision, deleted = excluded.deleted "
        "WHERE excluded.revision > generation_documents.revision",
        [(generation_id, d, rev, int(dead)) for d, (rev, dead) in docs.items()],
    )
    return added
