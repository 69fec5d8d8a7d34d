"""PostgreSQL projector state (server mode with `ORRERY_DATABASE_URL`): log positions,
generation registry, per-generation document revisions, live pointers, evidence checks,
log health, dead letters and the vector cache.

The tables are `postgres_migrations/0001_projector_state.sql`, the SQLite layout of
`sqlite_state.py` with PostgreSQL types; query workers on any machine read them
(`query.adapters.postgres_routing`). Writes run in READ COMMITTED transactions whose
read-modify-write steps are single statements or take row locks; consistent reads
(`registry_pairs`, `describe`) run in one REPEATABLE READ transaction. Generation ids
come from `MAX(seq) + 1` under a transaction-level advisory lock, so concurrent builders
on several machines never collide.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool
from pydantic_core import to_json

from contracts.admin import GenerationRow
from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.generations import (
    EvidenceCheck,
    GenerationDescriptor,
    GenerationState,
    LivePointer,
    Topology,
)
from contracts.qualification import QualificationReceipt
from projector.adapters.postgres_pool import driver_errors, open_pool
from projector.dead_letters import dead_letter_of, rejected_value
from projector.model import (
    WRITABLE_STATES,
    engine_named_topology,
    fetched_pairs,
    new_generation,
    transition,
)
from projector.ports import DeadLetter, RegistrySnapshot, RejectedRecord, Undecodable

__all__ = ["PostgresProjectorState"]

# "orrery-n" / "orrery-c" in ASCII: serialize generation and check numbering.
_NUMBERING_LOCK_KEY = 0x6F72726572792D6E
_CHECKS_LOCK_KEY = 0x6F72726572792D63
_WRITABLE = sorted(state.value for state in WRITABLE_STATES)
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
# A batch's documents travel as one JSON parameter each (serialized by pydantic-core):
# psycopg adapts list parameters element by element in Python, and `executemany`
# parameter by parameter; the statements and their effects are the same.
_UPSERT_DOCUMENTS = (
    "INSERT INTO generation_documents (generation_id, document_id, revision, deleted) "
    "SELECT %s, d.document_id, d.revision, d.deleted FROM json_to_recordset(%s::json) "
    "AS d(document_id text, revision bigint, deleted boolean) "
    "ON CONFLICT (generation_id, document_id) DO UPDATE SET "
    "revision = excluded.revision, deleted = excluded.deleted "
    "WHERE excluded.revision > generation_documents.revision"
)
_LIVE_AMONG = (
    "SELECT COUNT(*) FROM generation_documents WHERE generation_id = %s "
    "AND document_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json))) AND NOT deleted"
)

Cursor = psycopg.Cursor[Any]


class PostgresProjectorState:
    """Projector bookkeeping in PostgreSQL; the same ports and guarantees as
    `SqliteProjectorState` (`ProjectionState`, `GenerationRegistry`,
    `GenerationContents`, `GenerationMaintenance`, `EvidenceLog`, `VectorCache`,
    `DeadLetterBox`, `LogHealth`), for any number of processes on any machines.

    `fence(cursor)` (the writer lock's `assert_held`) runs inside every `commit`
    transaction: a projector that lost its writer lock fails the commit and replays the
    batch. Driver errors raise `DependencyUnavailable`.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        fence: Callable[[Cursor], None] | None = None,
    ) -> None:
        self._pool: ConnectionPool = open_pool(url, max_size=pool_size, name="orrery-projector")
        self._fence = fence
        self._recorded_lag: dict[str, tuple[int, int]] = {}

    @contextmanager
    def _transaction(self, what: str) -> Iterator[Cursor]:
        with (
            driver_errors(what),
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            yield cur

    @contextmanager
    def _snapshot(self, what: str) -> Iterator[Cursor]:
        """One REPEATABLE READ, read-only transaction: every read sees one commit."""
        with (
            driver_errors(what),
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur

    def _rows(self, what: str, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with driver_errors(what), self._pool.connection() as conn:
            return list(conn.execute(sql, params).fetchall())

    # -- positions -------------------------------------------------------------------
    def position(self, consumer: str) -> int:
        rows = self._rows(
            "read position",
            "SELECT position FROM projector_positions WHERE consumer = %s",
            (consumer,),
        )
        return 0 if not rows else int(rows[0][0])

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]:
        """Revisions the generation holds (live or tombstoned) for these documents."""
        if not document_ids:
            return {}
        rows = self._rows(
            "read revisions",
            "SELECT document_id, revision FROM generation_documents WHERE generation_id = %s "
            "AND document_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))",
            # One JSON parameter (see `_UPSERT_DOCUMENTS`): ~1 against ~3 us a document.
            (generation_id, to_json(list(document_ids)).decode()),
        )
        return {str(d): int(r) for d, r in rows}

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
        writable generation but those `held` is applied up to `position`; each of
        `namespaces` is applied up to its position (`projector_namespace_positions`,
        read by server-mode ingest to pace that namespace's writers); each of `partitions`
        ((namespace, partition) -> offset) is applied up to its offset
        (`projector_partition_offsets`: what readiness and pacing count exactly by)."""
        now = datetime.now(UTC)
        with self._transaction("commit projector batch") as cur:
            if self._fence is not None:
                self._fence(cur)
            for generation_id, docs in sorted(changes.items()):
                added = _record_documents(cur, generation_id, docs)
                cur.execute(
                    "UPDATE generations SET applied_position = GREATEST(applied_position, %s), "
                    "commit_seq = commit_seq + 1, document_count = document_count + %s "
                    "WHERE generation_id = %s",
                    (position, added, generation_id),
                )
            if namespaces:
                cur.executemany(
                    "INSERT INTO projector_namespace_positions VALUES (%s,%s,%s) "
                    "ON CONFLICT (namespace) DO UPDATE SET position = GREATEST("
                    "projector_namespace_positions.position, excluded.position), "
                    "updated_at = excluded.updated_at",
                    [(ns, int(pos), now) for ns, pos in sorted(namespaces.items())],
                )
            if partitions:
                cur.executemany(
                    "INSERT INTO projector_partition_offsets VALUES (%s,%s,%s,%s) "
                    "ON CONFLICT (namespace, kafka_partition) DO UPDATE SET kafka_offset = "
                    "GREATEST(projector_partition_offsets.kafka_offset, excluded.kafka_offset), "
                    "updated_at = excluded.updated_at",
                    [(ns, int(p), int(o), now) for (ns, p), o in sorted(partitions.items())],
                )
            cur.execute(
                "INSERT INTO projector_positions VALUES (%s,%s,%s) ON CONFLICT (consumer) "
                "DO UPDATE SET position = GREATEST(projector_positions.position, "
                "excluded.position), updated_at = excluded.updated_at",
                (consumer, position, now),
            )
            # Generations that saw no event in this batch are still caught up to it.
            cur.execute(
                "UPDATE generations SET applied_position = %s WHERE state = ANY(%s) "
                "AND applied_position < %s AND NOT (generation_id = ANY(%s))",
                (position, _WRITABLE, position, sorted(held)),
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
        """Register a new generation (`live` at once when `make_live`, else `building`)."""
        now = datetime.now(UTC)

        state = GenerationState.LIVE if make_live else GenerationState.BUILDING
        reason = "first generation of the scope, made live by the projector" if make_live else ""
        with self._transaction("create generation") as cur:
            descriptor = self._insert_generation(
                cur,
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
            if make_live:
                cur.execute(
                    "INSERT INTO live_pointers VALUES (%s,%s,%s,%s) ON CONFLICT (namespace, "
                    "snapshot_kind) DO UPDATE SET generation_id = excluded.generation_id, "
                    "switched_at = excluded.switched_at",
                    (namespace, snapshot_kind, descriptor.generation_id, now),
                )
        return descriptor

    def _insert_generation(
        self,
        cur: Cursor,
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
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_NUMBERING_LOCK_KEY,))
        cur.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM generations")
        row = cur.fetchone()
        assert row is not None
        seq = int(row[0])
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
        cur.execute(
            "INSERT INTO generations (seq, generation_id, namespace, snapshot_kind, state,"
            " descriptor_json, descriptor_digest, heartbeat_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
            (
                seq,
                generation_id,
                namespace,
                snapshot_kind,
                state.value,
                descriptor.model_dump_json(),
                descriptor.descriptor_digest,
                at,
            ),
        )
        return descriptor

    def write_targets(self, namespace: str, snapshot_kind: str) -> list[str]:
        """Generations that receive new events for a scope: building, sealed, verified,
        live."""
        rows = self._rows(
            "read write targets",
            "SELECT generation_id FROM generations WHERE namespace = %s AND "
            "snapshot_kind = %s AND state = ANY(%s) ORDER BY seq",
            (namespace, snapshot_kind, _WRITABLE),
        )
        return [str(r[0]) for r in rows]

    def live_pointer(self, namespace: str, snapshot_kind: str) -> LivePointer | None:
        rows = self._rows(
            "read live pointer",
            "SELECT generation_id, switched_at FROM live_pointers WHERE namespace = %s "
            "AND snapshot_kind = %s",
            (namespace, snapshot_kind),
        )
        if not rows:
            return None
        return LivePointer(
            namespace=namespace,
            snapshot_kind=snapshot_kind,
            generation_id=str(rows[0][0]),
            switched_at=rows[0][1],
        )

    def describe(self, generation_id: str) -> GenerationDescriptor:
        """The descriptor with evidence recomputed from the registry's document table."""
        with self._snapshot("describe generation") as cur:
            cur.execute(
                "SELECT descriptor_json, state, applied_position FROM generations "
                "WHERE generation_id = %s",
                (generation_id,),
            )
            row = cur.fetchone()
            if row is None:
                raise OrreryError(
                    ErrorCode.NOT_FOUND, f"generation {generation_id!r} does not exist"
                )
            pairs = _live_pairs(cur, generation_id)
        base = GenerationDescriptor.model_validate_json(str(row[0]))
        return base.model_copy(
            update={
                "state": GenerationState(str(row[1])),
                "applied_position": int(row[2]),
                "document_count": len(pairs),
                "id_set_digest": id_set_digest(pairs.items()),
            }
        ).with_digest()

    def generations(self) -> list[tuple[str, str, str, str]]:
        """`(generation_id, namespace, snapshot_kind, state)` of every generation."""
        rows = self._rows(
            "list generations",
            "SELECT generation_id, namespace, snapshot_kind, state FROM generations ORDER BY seq",
        )
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
        with self._transaction("begin generation") as cur:
            return self._insert_generation(
                cur,
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
        rows = self._rows(
            "read generation",
            f"SELECT {_ROW_COLUMNS} FROM {_ROW_FROM} WHERE g.generation_id = %s",
            (generation_id,),
        )
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
        rows = self._rows(
            "list generations",
            f"SELECT {_ROW_COLUMNS} FROM {_ROW_FROM} WHERE "
            "(%s::text IS NULL OR g.namespace = %s) AND "
            "(%s::text IS NULL OR g.snapshot_kind = %s) ORDER BY g.seq",
            (namespace, namespace, snapshot_kind, snapshot_kind),
        )
        return [_row(row) for row in rows]

    def save_descriptor(
        self, descriptor: GenerationDescriptor, *, expect: frozenset[GenerationState]
    ) -> None:
        with self._transaction("save descriptor") as cur:
            self._save_locked(cur, descriptor, expect)

    def switch_live(
        self,
        promoted: GenerationDescriptor,
        demoted: GenerationDescriptor | None,
        *,
        expected_live: str | None,
        at: datetime,
    ) -> None:
        namespace, kind = promoted.namespace, promoted.snapshot_kind
        with self._transaction("switch live generation") as cur:
            # The scope's pointer row (or, for a first pointer, the scope) is locked for
            # the compare-and-set.
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (json.dumps(["live", namespace, kind]),),
            )
            cur.execute(
                "SELECT generation_id FROM live_pointers WHERE namespace = %s "
                "AND snapshot_kind = %s",
                (namespace, kind),
            )
            row = cur.fetchone()
            current = None if row is None else str(row[0])
            if current != expected_live:
                raise OrreryError(
                    ErrorCode.INVALID_STATE,
                    f"the live generation of {namespace}/{kind} changed meanwhile "
                    f"(now {current}); nothing was switched",
                    {"namespace": namespace, "snapshot_kind": kind, "live": current},
                )
            self._save_locked(cur, promoted, frozenset({GenerationState.VERIFIED}))
            if demoted is not None:
                self._save_locked(cur, demoted, frozenset({GenerationState.LIVE}))
            cur.execute(
                "INSERT INTO live_pointers VALUES (%s,%s,%s,%s) ON CONFLICT (namespace, "
                "snapshot_kind) DO UPDATE SET generation_id = excluded.generation_id, "
                "switched_at = excluded.switched_at",
                (namespace, kind, promoted.generation_id, at),
            )

    def _save_locked(
        self,
        cur: Cursor,
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
        cur.execute(
            "UPDATE generations SET state = %s, descriptor_json = %s, descriptor_digest = %s "
            "WHERE generation_id = %s AND state = ANY(%s)",
            (
                descriptor.state.value,
                descriptor.model_dump_json(),
                descriptor.descriptor_digest,
                descriptor.generation_id,
                states,
            ),
        )
        if cur.rowcount == 1:
            return
        cur.execute(
            "SELECT state FROM generations WHERE generation_id = %s", (descriptor.generation_id,)
        )
        row = cur.fetchone()
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
        with self._transaction("record documents") as cur:
            added = _record_documents(cur, generation_id, changes)
            cur.execute(
                "UPDATE generations SET commit_seq = commit_seq + 1, "
                "document_count = document_count + %s WHERE generation_id = %s",
                (added, generation_id),
            )

    def mark_applied(self, generation_id: str, position: int) -> None:
        with self._transaction("mark applied") as cur:
            cur.execute(
                "UPDATE generations SET applied_position = GREATEST(applied_position, %s) "
                "WHERE generation_id = %s",
                (position, generation_id),
            )

    def registry_pairs(self, generation_id: str) -> RegistrySnapshot:
        # One REPEATABLE READ transaction: the pairs and the row belong to the same commit.
        with self._snapshot("read registry pairs") as cur:
            cur.execute(
                "SELECT state, applied_position, commit_seq FROM generations "
                "WHERE generation_id = %s",
                (generation_id,),
            )
            row = cur.fetchone()
            pairs = _live_pairs(cur, generation_id)
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
        rows = self._rows(
            "read commit_seq",
            "SELECT commit_seq FROM generations WHERE generation_id = %s",
            (generation_id,),
        )
        return -1 if not rows else int(rows[0][0])

    # -- GenerationMaintenance ---------------------------------------------------------
    def heartbeat(self, generation_id: str) -> None:
        self._set_heartbeat(generation_id, datetime.now(UTC))

    def _set_heartbeat(self, generation_id: str, at: datetime) -> None:
        with self._transaction("heartbeat") as cur:
            cur.execute(
                "UPDATE generations SET heartbeat_at = %s WHERE generation_id = %s",
                (at, generation_id),
            )

    def fail_orphaned_builds(self, reason: str, *, older_than: datetime | None) -> list[str]:
        now = datetime.now(UTC)
        failed: list[str] = []
        with self._transaction("fail orphaned builds") as cur:
            cur.execute(
                "SELECT descriptor_json, heartbeat_at, applied_position FROM generations "
                "WHERE state = 'building' ORDER BY seq FOR UPDATE"
            )
            for body, seen, applied in cur.fetchall():
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
                self._save_locked(cur, dead, frozenset({GenerationState.BUILDING}))
                failed.append(descriptor.generation_id)
        return failed

    def mark_indexes_dropped(self, generation_id: str) -> None:
        with self._transaction("mark indexes dropped") as cur:
            cur.execute(
                "UPDATE generations SET indexes_dropped = TRUE WHERE generation_id = %s",
                (generation_id,),
            )
            # The engines no longer hold it: its document table is garbage too.
            cur.execute(
                "DELETE FROM generation_documents WHERE generation_id = %s", (generation_id,)
            )

    # -- EvidenceLog -------------------------------------------------------------------
    def record_check(self, check: EvidenceCheck) -> None:
        with self._transaction("record check") as cur:
            # Numbered under a transaction lock (released after the commit is visible):
            # sequence numbers appear in commit order, so `checks_since` never skips one.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_CHECKS_LOCK_KEY,))
            cur.execute(
                "INSERT INTO generation_checks (seq, generation_id, kind, ok, checked_at, "
                "check_json) SELECT COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s "
                "FROM generation_checks",
                (
                    check.generation_id,
                    check.kind,
                    check.ok,
                    check.checked_at,
                    check.model_dump_json(),
                ),
            )
            cur.execute(
                "DELETE FROM generation_checks WHERE generation_id = %s AND seq NOT IN "
                "(SELECT seq FROM generation_checks WHERE generation_id = %s "
                "ORDER BY seq DESC LIMIT %s)",
                (check.generation_id, check.generation_id, _CHECKS_KEPT),
            )

    def latest_checks(self, generation_id: str, limit: int = 5) -> list[EvidenceCheck]:
        rows = self._rows(
            "read checks",
            "SELECT check_json FROM generation_checks WHERE generation_id = %s "
            "ORDER BY seq DESC LIMIT %s",
            (generation_id, limit),
        )
        return [EvidenceCheck.model_validate_json(str(r[0])) for r in rows]

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]:
        rows = self._rows(
            "read checks",
            "SELECT seq, check_json FROM generation_checks WHERE seq > %s ORDER BY seq",
            (sequence,),
        )
        return [(int(seq), EvidenceCheck.model_validate_json(str(body))) for seq, body in rows]

    # -- ReceiptLog --------------------------------------------------------------------
    def record_receipt(self, receipt: QualificationReceipt) -> None:
        if not receipt.id_is_valid():
            raise ValueError("a receipt is stored with its content id (with_id)")
        with self._transaction("record receipt") as cur:
            # Content-addressed: storing the same receipt twice is a no-op.
            cur.execute(
                "INSERT INTO qualification_receipts (receipt_id, generation_id, "
                "descriptor_digest, passed, created_at, receipt_json) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (receipt_id) DO NOTHING",
                (
                    receipt.receipt_id,
                    receipt.generation_id,
                    receipt.descriptor_digest,
                    receipt.passed,
                    receipt.created_at,
                    receipt.model_dump_json(),
                ),
            )

    def receipts(self, generation_id: str) -> list[QualificationReceipt]:
        rows = self._rows(
            "read receipts",
            "SELECT receipt_json FROM qualification_receipts WHERE generation_id = %s "
            "ORDER BY created_at DESC, receipt_id",
            (generation_id,),
        )
        return [QualificationReceipt.model_validate_json(str(r[0])) for r in rows]

    # -- vector cache ----------------------------------------------------------------
    def cached_vectors(self, keys: Iterable[str]) -> dict[str, tuple[float, ...]]:
        key_list = list(keys)
        if not key_list:
            return {}
        rows = self._rows(
            "read vector cache",
            "SELECT cache_key, vector FROM vector_cache WHERE cache_key = ANY(%s)",
            (key_list,),
        )
        return {
            str(key): tuple(np.frombuffer(bytes(blob), dtype=np.float32).tolist())
            for key, blob in rows
        }

    def store_vectors(self, vectors: Mapping[str, Sequence[float]]) -> None:
        if not vectors:
            return
        with self._transaction("store vectors") as cur:
            cur.executemany(
                "INSERT INTO vector_cache VALUES (%s,%s,%s) ON CONFLICT (cache_key) DO NOTHING",
                [
                    (key, len(vec), np.asarray(vec, dtype=np.float32).tobytes())
                    for key, vec in sorted(vectors.items())
                ],
            )

    # -- dead letters and log health ---------------------------------------------------
    def park(self, consumer: str, messages: Sequence[Undecodable]) -> None:
        if not messages:
            return
        now = datetime.now(UTC)
        with self._transaction("park dead letters") as cur:
            cur.executemany(
                "INSERT INTO dead_letters (consumer, location, position, message_key, "
                "message_value, headers_json, reason, parked_at) VALUES "
                "(%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (consumer, location) DO NOTHING",
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
        if not rejected:
            return
        now = datetime.now(UTC)
        with self._transaction("park rejected records") as cur:
            cur.executemany(
                "INSERT INTO dead_letters (consumer, location, position, message_key, "
                "message_value, headers_json, reason, parked_at, namespace, snapshot_kind, "
                "document_id, revision) SELECT %s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s "
                # A record revision is parked once, by whoever refused it first.
                "WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE namespace = %s AND "
                "snapshot_kind = %s AND document_id = %s AND revision = %s) "
                "ON CONFLICT (consumer, location) DO NOTHING",
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
        where, params = ("", ()) if namespace is None else (" WHERE namespace = %s", (namespace,))
        rows = self._rows(
            "read dead letters",
            "SELECT seq, consumer, location, position, message_key, message_value, "
            "headers_json, reason, parked_at, namespace, snapshot_kind, document_id, revision "
            f"FROM dead_letters{where} ORDER BY seq LIMIT %s",
            (*params, limit),
        )
        return [dead_letter_of(row, row[8]) for row in rows]

    def remove(self, seqs: Collection[int]) -> int:
        if not seqs:
            return 0
        with self._transaction("remove dead letters") as cur:
            cur.execute("DELETE FROM dead_letters WHERE seq = ANY(%s)", ([int(s) for s in seqs],))
            return int(cur.rowcount)

    def dead_letter_count(self) -> int:
        rows = self._rows("count dead letters", "SELECT COUNT(*) FROM dead_letters")
        return int(rows[0][0])

    def record_lag(self, consumer: str, *, position: int, lag_events: int) -> None:
        if self._recorded_lag.get(consumer) == (position, lag_events):
            return
        with self._transaction("record lag") as cur:
            cur.execute(
                "INSERT INTO projector_log_status VALUES (%s,%s,%s,%s) ON CONFLICT (consumer) "
                "DO UPDATE SET position = excluded.position, lag_events = "
                "excluded.lag_events, measured_at = excluded.measured_at",
                (consumer, position, lag_events, datetime.now(UTC)),
            )
        self._recorded_lag[consumer] = (position, lag_events)

    def close(self) -> None:
        self._pool.close()


def _row(row: Sequence[Any]) -> tuple[GenerationRow, GenerationDescriptor]:
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
            document_count=int(count),
            applied_position=int(applied),
            commit_seq=int(seq),
            descriptor_digest=str(digest) or descriptor.computed_digest(),
            indexes_dropped=bool(dropped),
            heartbeat_at=heartbeat,
        ),
        descriptor,
    )


def _record_documents(cur: Cursor, generation_id: str, docs: Mapping[str, tuple[int, bool]]) -> int:
    """Upsert a generation's document revisions (newer ones win); returns how many more
    live documents it holds now (negative when deletes outnumber new documents).

    The change of `document_count` is counted over the batch's documents only (not a
    recount of the generation: that made every commit O(documents held)). The
    generation's row is locked first, and every writer of its documents goes through
    here, so no other transaction changes these documents between the two counts.
    """
    ids = sorted(docs)
    id_json = to_json(ids).decode()
    rows = to_json(
        [{"document_id": d, "revision": docs[d][0], "deleted": docs[d][1]} for d in ids]
    ).decode()
    cur.execute("SELECT 1 FROM generations WHERE generation_id = %s FOR UPDATE", (generation_id,))
    cur.execute(_LIVE_AMONG, (generation_id, id_json))
    before = cur.fetchone()
    cur.execute(_UPSERT_DOCUMENTS, (generation_id, rows))
    cur.execute(_LIVE_AMONG, (generation_id, id_json))
    after = cur.fetchone()
    assert before is not None and after is not None
    return int(after[0]) - int(before[0])


def _live_pairs(cur: psycopg.Cursor[Any], generation_id: str) -> dict[str, int]:
    """The generation's live `(document_id, revision)` pairs in id order by code point
    (= UTF-8 bytes, "C": as Python compares them, so hashed without a sort), fetched a
    chunk at a time, in the transaction of `cur`."""
    cur.execute(
        "SELECT document_id, revision FROM generation_documents "
        'WHERE generation_id = %s AND NOT deleted ORDER BY document_id COLLATE "C"',
        (generation_id,),
    )
    return fetched_pairs(cur.fetchmany)
