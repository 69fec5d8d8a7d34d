"""The relay's view of the PostgreSQL outbox: claim unpublished rows, mark them.

Any number of relays share one outbox. `unpublished` opens a transaction that claims its
rows with `SELECT … FOR UPDATE SKIP LOCKED`; `mark_published` marks them and commits.
Other relays skip claimed rows; when a relay dies its connection drops, PostgreSQL
releases the claim and another relay takes the rows. A row is claimable only when no
older row of its document is still unpublished, so a document's events reach the log
in position order even with several relays. A row whose `own_event_json` is empty
(`OUTBOX_EVENT_IS_RECORD`, migration 0007) carries the `RecordChanged` of its record row,
read in the same statement, with the record's float32 vector (`vector_f32`, migration
0008; NULL for rows written before: published without it).

`PostgresOutboxSignal` wakes a relay when rows were committed: every statement that
inserts outbox rows notifies channel `orrery_outbox` (migration 0009), so a relay in
another process than the writer claims at once instead of polling an empty outbox.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from pydantic_core import to_json

from ingest.adapters.postgres_db import PostgresListener, driver_errors, open_pool
from ingest.relay_ports import OutboxRow, Placement, claimed_rows

__all__ = ["OUTBOX_CHANNEL", "PostgresOutboxReader", "PostgresOutboxSignal"]

# The channel migration 0009's trigger notifies after each statement inserting outbox rows.
OUTBOX_CHANNEL = "orrery_outbox"

_CLAIM = """
SELECT o.position, o.document_id, o.namespace, o.own_event_json,
       CASE WHEN o.own_event_json = '' THEN r.record_json END, o.trace_context, r.vector_f32
FROM outbox AS o
LEFT JOIN records AS r ON r.document_id = o.document_id AND r.revision = o.revision
WHERE o.published_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM outbox AS older
      WHERE older.document_id = o.document_id
        AND older.published_at IS NULL
        AND older.position < o.position
  )
ORDER BY o.position
LIMIT %s
FOR UPDATE OF o SKIP LOCKED
"""


class PostgresOutboxReader:
    """`OutboxRelaySource` over PostgreSQL, safe for several relays at once.

    Guarantees: each `unpublished` call returns rows that no other live relay holds, in
    increasing position order, and holds them (row locks in an open transaction) until
    `mark_published` commits the mark, the next `unpublished` call releases them
    (publishing failed), or the connection ends. A row is returned only when every older
    row of its document is published. `mark_published` never overwrites an earlier mark.
    Driver errors raise `DependencyUnavailable`; the claim is then released.
    """

    def __init__(self, url: str) -> None:
        self._pool: ConnectionPool = open_pool(url, max_size=2, name="orrery-relay")
        self._lock = threading.Lock()
        self._claim: psycopg.Connection[Any] | None = None

    def _release(self, *, commit: bool) -> None:
        conn, self._claim = self._claim, None
        if conn is None:
            return
        try:
            if commit:
                conn.commit()
            else:
                conn.rollback()
        finally:
            self._pool.putconn(conn)

    def unpublished(self, limit: int) -> list[OutboxRow]:
        with self._lock, driver_errors("claim outbox rows"):
            try:
                self._release(commit=False)
                self._claim = self._pool.getconn()
                # Binary results: the vector's bytes come as they are, not as hex text.
                rows = self._claim.execute(_CLAIM, (limit,), binary=True).fetchall()
            except psycopg.Error:
                self._release(commit=False)
                raise
            if not rows:
                self._release(commit=False)
        return claimed_rows(rows)

    def mark_published(
        self, positions: Sequence[int], placements: Sequence[Placement] = ()
    ) -> None:
        if not positions:
            return
        unique = _placed(positions, placements)
        with self._lock, driver_errors("mark outbox rows"):
            try:
                if self._claim is None:
                    with self._pool.connection() as conn:
                        self._mark(conn, unique)
                    return
                self._mark(self._claim, unique)
                self._release(commit=True)
            except psycopg.Error:
                self._release(commit=False)
                raise

    def pending(self) -> int:
        # Its own pooled connection: never inside a claim, so it takes no row lock.
        with driver_errors("count outbox rows"), self._pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _mark(
        conn: psycopg.Connection[Any], rows: list[tuple[int, int | None, int | None]]
    ) -> None:
        # The rows as one JSON parameter (serialized by pydantic-core): psycopg adapted
        # three arrays element by element in Python (~3 against ~1 CPU us a row).
        conn.execute(
            "UPDATE outbox o SET published_at = now(), kafka_partition = m.part, "
            "kafka_offset = m.off FROM json_to_recordset(%s::json) "
            "AS m(pos bigint, part integer, off bigint) "
            "WHERE o.published_at IS NULL AND o.position = m.pos",
            (
                to_json(
                    [{"pos": pos, "part": part, "off": off} for pos, part, off in rows]
                ).decode(),
            ),
        )

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(psycopg.Error):  # Closing drops the claim anyway.
                self._release(commit=False)
            self._pool.close()


def _placed(
    positions: Sequence[int], placements: Sequence[Placement]
) -> list[tuple[int, int | None, int | None]]:
    """(position, partition, offset) per distinct position, in position order (a position
    given twice keeps its last placement: the newest copy on the log)."""
    if placements and len(placements) != len(positions):
        raise ValueError(f"{len(placements)} placements for {len(positions)} positions")
    out: dict[int, tuple[int, int | None, int | None]] = {}
    for index, position in enumerate(positions):
        part, off = placements[index] if placements else (None, None)
        out[int(position)] = (int(position), part, off)
    return [out[p] for p in sorted(out)]


class PostgresOutboxSignal(PostgresListener):
    """Calls `on_rows()` (a relay's `wake`) when outbox rows were committed, by any
    process: a `PostgresListener` of `OUTBOX_CHANNEL`. A call is only a hint to claim
    now: nothing here reads or claims rows."""

    def __init__(
        self,
        url: str,
        on_rows: Callable[[], None],
        *,
        wait_seconds: float = 0.5,
        retry_seconds: float = 1.0,
    ) -> None:
        super().__init__(
            url,
            OUTBOX_CHANNEL,
            on_rows,
            name="orrery-outbox-signal",
            wait_seconds=wait_seconds,
            retry_seconds=retry_seconds,
        )
