"""PostgreSQL canonical store (server mode): revisions, heads and the outbox in one database.

An outbox row's `own_event_json` is empty (`OUTBOX_EVENT_IS_RECORD`, migration 0007):
its event is the `RecordChanged` of the record row with the same `document_id` and
`revision`, written in the same transaction and never changed, so the store keeps a
record's JSON once, as the SQLite store does; the relay reads it from that row. Rows
written before (a whole event's JSON) are relayed as written. A record row keeps its
vector's float32 bytes beside its JSON (`vector_f32`, migration 0008; `vector_wire`), which
the relay ships so that the projector never parses the vector's decimals again.

Positions are gap-free and in commit order. A sequence gives neither: a rolled-back
`nextval` leaves a hole, and a later number can commit first. Instead a batch takes the
writers' transaction-level advisory lock, and its last statement before COMMIT advances
the single row of `outbox_counter` by the number of events it writes. A rolled-back batch
rolls the counter back too (no gap); the next writer waits for the lock, which PostgreSQL
releases only after the commit is visible, so a reader that sees position N sees every
position below it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from pydantic_core import to_json

from contracts.errors import ErrorCode, OrreryError
from contracts.events import OUTBOX_EVENT_IS_RECORD
from contracts.records import Record
from contracts.request_context import current_traceparent
from ingest.adapters.postgres_db import driver_errors, open_pool
from ingest.model import Decision, Outcome, decide_revision, stored_columns, vector_wire
from ingest.ports import Head

__all__ = ["WRITER_LOCK_KEY", "PostgresRecordStore"]

# Key of the writers' transaction-level advisory lock ("orrery-w" in ASCII).
WRITER_LOCK_KEY = 0x6F72726572792D77

_COPY_RECORDS = (
    "COPY records (document_id, revision, namespace, snapshot_kind, item_id, galaxy, "
    "deleted, payload_sha256, record_json, accepted_at, vector_f32) FROM STDIN (FORMAT BINARY)"
)
# The types of `_COPY_RECORDS`'s columns, in order (binary COPY: each value goes as its
# bytes, without text COPY's escaping of the record's JSON and the vector's hex).
_RECORD_TYPES = (
    "text",
    "int8",
    "text",
    "text",
    "text",
    "text",
    "bool",
    "text",
    "text",
    "timestamptz",
    "bytea",
)
_UPSERT_HEADS = (
    "INSERT INTO heads (document_id, revision, namespace, snapshot_kind, deleted) "
    "SELECT document_id, revision, namespace, snapshot_kind, deleted FROM "
    "json_to_recordset(%s::json) AS h(document_id text, revision bigint, namespace text, "
    "snapshot_kind text, deleted boolean) "
    "ON CONFLICT (document_id) DO UPDATE SET revision = excluded.revision, "
    "deleted = excluded.deleted"
)
_COPY_OUTBOX = (
    "COPY outbox (position, document_id, revision, namespace, snapshot_kind, own_event_json, "
    "created_at, trace_context) FROM STDIN"
)


class PostgresRecordStore:
    """`RecordStore` over PostgreSQL (schema from `postgres_db.migrate`, which the
    composition root runs first).

    Guarantees: a batch is one transaction (records, heads and outbox rows together);
    a stale or equal revision is rejected alone; writers in any number of threads and
    processes are serialized by one transaction-level advisory lock, so outbox positions
    are 1, 2, 3, … without gaps, in commit order. Driver errors raise
    `DependencyUnavailable` and leave nothing written.
    """

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self._pool: ConnectionPool = open_pool(url, max_size=pool_size, name="orrery-ingest")

    def write(
        self, records: Sequence[Record], *, stored_json: Sequence[str | None] | None = None
    ) -> list[Outcome]:
        if not records:
            return []
        with driver_errors("write records"), self._pool.connection() as conn:
            return self._write(conn, records, stored_json)

    def _write(
        self,
        conn: psycopg.Connection[Any],
        records: Sequence[Record],
        stored_json: Sequence[str | None] | None,
    ) -> list[Outcome]:
        now = datetime.now(UTC)
        outcomes: list[Outcome] = []
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK_KEY,))
            doc_ids = sorted({record.doc_id for record in records})
            cur.execute(
                "SELECT document_id, revision, namespace, snapshot_kind FROM heads "
                "WHERE document_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))",
                (to_json(doc_ids).decode(),),
            )
            heads: dict[str, tuple[int, str, str]] = {
                str(doc): (int(rev), str(ns), str(kind)) for doc, rev, ns, kind in cur.fetchall()
            }
            accepted: list[tuple[int, Record]] = []
            for index, record in enumerate(records):
                doc_id = record.doc_id
                head = heads.get(doc_id)
                if head is not None and head[1:] != (record.namespace, record.snapshot_kind):
                    # The identity rule (contracts.records.derive_document_id) makes this
                    # unreachable; never let a write re-home another scope's document.
                    raise OrreryError(
                        ErrorCode.INTERNAL,
                        "document id collision across scopes: the write is refused",
                        {"index": index},
                    )
                current = None if head is None else head[0]
                if decide_revision(record.revision, current) is Decision.CONFLICT:
                    outcomes.append(
                        Outcome(
                            index=index,
                            document_id=doc_id,
                            revision=record.revision,
                            decision=Decision.CONFLICT,
                            current_revision=current,
                            code="revision_conflict",
                            message=(
                                f"revision {record.revision} is not newer than the stored "
                                f"revision {current}"
                            ),
                        )
                    )
                    continue
                # Later records of the same batch compare against this one.
                heads[doc_id] = (record.revision, record.namespace, record.snapshot_kind)
                accepted.append((index, record))
            if not accepted:
                return outcomes
            # Serialized once: the outbox row points at the records row (its event).
            bodies = [_stored(index, r, stored_json) for index, r in accepted]
            # COPY, not a multi-row INSERT: rows go out in psycopg's C row writer, without a
            # Python round of parameter adaptation per row (the same rows, the same
            # constraints, in the same transaction).
            with cur.copy(_COPY_RECORDS) as copy:
                copy.set_types(_RECORD_TYPES)
                for (_, r), body in zip(accepted, bodies, strict=True):
                    copy.write_row((*stored_columns(r), body, now, vector_wire(r)))
            newest: dict[str, Record] = {r.doc_id: r for _, r in accepted}
            # One statement whose rows come as one JSON parameter (serialized by
            # pydantic-core; psycopg adapts arrays element by element in Python), each
            # document once (ON CONFLICT may touch a row once per statement), in
            # document order as before.
            cur.execute(
                _UPSERT_HEADS,
                (to_json([_head_row(r) for _, r in sorted(newest.items())]).decode(),),
            )
            cur.execute(
                "UPDATE outbox_counter SET position = position + %s RETURNING position",
                (len(accepted),),
            )
            row = cur.fetchone()
            assert row is not None, "migration 0001 inserts the counter row"
            first = int(row[0]) - len(accepted) + 1
            trace_context = current_traceparent()
            with cur.copy(_COPY_OUTBOX) as copy:
                for offset, (_, r) in enumerate(accepted):
                    copy.write_row(
                        (
                            first + offset,
                            r.doc_id,
                            r.revision,
                            r.namespace,
                            r.snapshot_kind,
                            OUTBOX_EVENT_IS_RECORD,
                            now,
                            trace_context,
                        )
                    )
            for offset, (index, r) in enumerate(accepted):
                outcomes.append(
                    Outcome(
                        index=index,
                        document_id=r.doc_id,
                        revision=r.revision,
                        decision=Decision.ACCEPTED,
                        position=first + offset,
                    )
                )
        outcomes.sort(key=lambda o: o.index)
        return outcomes

    def heads(self, document_ids: Sequence[str]) -> list[Head]:
        if not document_ids:
            return []
        with driver_errors("read heads"), self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT h.document_id, h.namespace, r.galaxy, h.snapshot_kind, r.item_id, "
                "h.revision, h.deleted FROM heads h JOIN records r ON r.document_id = "
                "h.document_id AND r.revision = h.revision WHERE h.document_id = ANY(%s)",
                (list(document_ids),),
            ).fetchall()
        return [
            Head(str(d), str(ns), str(g), str(k), str(i), int(rev), bool(dl))
            for d, ns, g, k, i, rev, dl in rows
        ]

    def high_water(self) -> int:
        with driver_errors("high water"), self._pool.connection() as conn:
            row = conn.execute("SELECT position FROM outbox_counter").fetchone()
        return 0 if row is None else int(row[0])

    def live_records(self, namespace: str, snapshot_kind: str, galaxy: str) -> Iterator[Record]:
        # One REPEATABLE READ transaction is the snapshot; a server-side cursor streams it.
        with driver_errors("read live records"), self._pool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction(), conn.cursor(name="orrery_live_records") as cur:
                    cur.itersize = 500
                    cur.execute(
                        "SELECT r.record_json FROM heads h JOIN records r ON r.document_id = "
                        "h.document_id AND r.revision = h.revision WHERE h.namespace = %s AND "
                        "h.snapshot_kind = %s AND NOT h.deleted AND r.galaxy = %s "
                        'ORDER BY r.item_id COLLATE "C"',
                        (namespace, snapshot_kind, galaxy),
                    )
                    for (record_json,) in cur:
                        yield Record.model_validate_json(record_json)
            finally:
                conn.isolation_level = None

    def close(self) -> None:
        self._pool.close()


def _head_row(record: Record) -> dict[str, Any]:
    return {
        "document_id": record.doc_id,
        "revision": record.revision,
        "namespace": record.namespace,
        "snapshot_kind": record.snapshot_kind,
        "deleted": record.deleted,
    }


def _stored(index: int, record: Record, stored_json: Sequence[str | None] | None) -> str:
    """The JSON the store keeps of `record`: the caller's serialization when it gave one."""
    given = None if stored_json is None else stored_json[index]
    return record.model_dump_json() if given is None else given
