"""SQLite canonical store: every record revision, the head per document, and the outbox.

In embedded mode the outbox table is the event log itself: an event's position is its
outbox row id. In server mode a relay publishes outbox rows to Kafka and marks them.

An outbox row's `event_json` is the `RecordChanged` JSON, or empty (`OUTBOX_EVENT_IS_RECORD`,
how this store writes them): then the event is `record_changed_json` of the `records`
row with the outbox row's `(document_id, revision)`, written in the same transaction
and never changed (revisions are append-only). So a record with its vector is stored
once, not twice; readers join the two (`contracts.events.outbox_event_json`).

`records` is a rowid table: its ~5 KB rows (a 384-d vector as JSON) are appended in
insertion order and only the `(document_id, revision)` key goes into a B-tree keyed by
random ids. As a `WITHOUT ROWID` table (databases created before this change keep that
layout, which works the same) every insert landed at a random place in a B-tree of
whole rows: at 80-100k records ~3x the CPU and wall time per insert (measured: 98 vs
30 us CPU, 263 vs 90 us wall).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.events import OUTBOX_EVENT_IS_RECORD, LogEntry, RecordChanged
from contracts.records import RECORD_BODY, Record, record_json_without_vector
from contracts.request_context import current_traceparent
from ingest.model import Decision, Outcome, decide_revision, stored_columns, vector_wire
from ingest.ports import Head

__all__ = ["HANDOVER_MAX_BYTES", "SCHEMA", "SqliteRecordStore", "connect"]

log = logging.getLogger(__name__)

# Records larger than this (as stored) are not handed to `on_committed`.
HANDOVER_MAX_BYTES = 256 * 1024
# With a hand-over, the store checkpoints its WAL itself, after handing a batch over,
# once the records written since its last checkpoint hold this many bytes (as stored;
# the WAL holds each about twice, with its vector): about SQLite's automatic checkpoint
# (1,000 pages of 4 KiB), which it turns off for its connection.
CHECKPOINT_RECORD_BYTES = 2 * 1024 * 1024

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    document_id    TEXT    NOT NULL,
    revision       INTEGER NOT NULL,
    namespace      TEXT    NOT NULL,
    snapshot_kind  TEXT    NOT NULL,
    item_id        TEXT    NOT NULL,
    galaxy         TEXT    NOT NULL,
    deleted        INTEGER NOT NULL,
    payload_sha256 TEXT    NOT NULL,
    record_body    TEXT,
    record_json    TEXT    NOT NULL,
    accepted_at    TEXT    NOT NULL,
    vector_f32     BLOB,
    PRIMARY KEY (document_id, revision)
);
CREATE TABLE IF NOT EXISTS heads (
    document_id   TEXT PRIMARY KEY,
    revision      INTEGER NOT NULL,
    namespace     TEXT    NOT NULL,
    snapshot_kind TEXT    NOT NULL,
    deleted       INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS heads_scope ON heads (namespace, snapshot_kind, deleted);
CREATE TABLE IF NOT EXISTS outbox (
    position      INTEGER PRIMARY KEY AUTOINCREMENT,
    document_id   TEXT    NOT NULL,
    revision      INTEGER NOT NULL,
    namespace     TEXT    NOT NULL,
    snapshot_kind TEXT    NOT NULL,
    event_json    TEXT    NOT NULL,
    created_at    TEXT    NOT NULL,
    published_at  TEXT
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (position) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_by_namespace ON outbox (namespace, position);
"""


def add_body_column(conn: sqlite3.Connection) -> None:
    """Give a records table made before it its `record_body` column (the record's JSON
    without its vector, what queries read: `contracts.records.RECORD_BODY`). Rows written
    before keep it NULL; readers cut those themselves."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    if RECORD_BODY not in columns:
        conn.execute(f"ALTER TABLE records ADD COLUMN {RECORD_BODY} TEXT")


def add_vector_column(conn: sqlite3.Connection) -> None:
    """Give a records table made before it its `vector_f32` column (the record's vector
    as float32 bytes, `ingest.model.vector_wire`; PostgreSQL: ingest's migration 0008).
    Rows written before keep it NULL: their events are published without the bytes."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    if "vector_f32" not in columns:
        conn.execute("ALTER TABLE records ADD COLUMN vector_f32 BLOB")


def add_trace_column(conn: sqlite3.Connection) -> None:
    """Give an outbox made before traces carried along its `trace_context` column."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(outbox)")}
    if "trace_context" not in columns:
        conn.execute("ALTER TABLE outbox ADD COLUMN trace_context TEXT")


def add_placement_columns(conn: sqlite3.Connection) -> None:
    """Give an outbox made before the relay recorded where Kafka holds each row its
    `kafka_partition` / `kafka_offset` columns and their indexes (PostgreSQL: ingest's
    migration 0006). Rows marked before keep them NULL."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(outbox)")}
    if "kafka_partition" not in columns:
        conn.execute("ALTER TABLE outbox ADD COLUMN kafka_partition INTEGER")
    if "kafka_offset" not in columns:
        conn.execute("ALTER TABLE outbox ADD COLUMN kafka_offset INTEGER")
    conn.execute(
        "CREATE INDEX IF NOT EXISTS outbox_by_placement ON outbox "
        "(namespace, kafka_partition, kafka_offset) WHERE kafka_partition IS NOT NULL"
    )
    conn.execute(
        "CREATE INDEX IF NOT EXISTS outbox_unpublished_by_namespace ON outbox "
        "(namespace, position) WHERE published_at IS NULL"
    )


def connect(path: Path) -> sqlite3.Connection:
    """Open the canonical database in WAL mode (readers never block the writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL: the WAL is synced at every commit, so a write answered 200 survives a power
    # loss or an OS crash, not only a crash of the process (with NORMAL, WAL mode syncs
    # only at checkpoints and such a commit may roll back). The canonical store is what
    # an acknowledgement promises; one fsync a commit (~0.35 ms on this machine's disk) is
    # per POST batch. The projector's own bookkeeping stays NORMAL: it is re-derived by
    # replaying the log, whose writes are idempotent.
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    # 64 MiB of page cache (default 2 MiB): a batch of records with vectors is ~10 MB,
    # and the B-tree pages it touches stay cached (write path ~15 % less CPU, measured).
    conn.execute("PRAGMA cache_size=-65536")
    return conn


class SqliteRecordStore:
    """`RecordStore` over one SQLite file.

    Guarantees: a batch is one transaction (records, heads and outbox rows together);
    a stale or equal revision is rejected alone (a record's size is bounded at the door:
    `contracts.admission.check_record_size`); all writes are serialized in-process by a
    lock and across processes by SQLite's write lock. After a batch committed,
    `on_positions` (if given) gets `(namespace, position)` of each of its outbox events,
    and `on_committed` (if given) its outbox events of records up to `HANDOVER_MAX_BYTES`
    as stored, as written, in position order (the
    embedded projector's log takes them instead of decoding the rows again).

    With `on_committed`, the WAL checkpoint that SQLite runs inside a `COMMIT` that
    filled its WAL (copying the pages into the database file and syncing it: ~100-150
    ms after a 2,000-record batch with 384-d vectors, while the rows are already
    visible) runs after the hand-over instead, as a passive checkpoint of this
    connection: a projector that reads the new positions meanwhile would decode every
    row again (`projector.adapters.sqlite_outbox_log`). With `defer_checkpoint`, `write`
    only counts the bytes and the owner runs `checkpoint_if_due` once the hand-over
    reached its reader (a write worker: after its answer went to the server, whose
    projector takes the events from that answer).
    """

    def __init__(
        self,
        path: Path,
        *,
        on_committed: Callable[[list[LogEntry]], None] | None = None,
        on_positions: Callable[[list[tuple[str, int]]], None] | None = None,
        keep_vectors: bool = False,
        defer_checkpoint: bool = False,
    ) -> None:
        self._path = path
        self._defer_checkpoint = defer_checkpoint
        self._keep_vectors = keep_vectors
        self._on_positions = on_positions
        self._on_committed = on_committed
        self._lock = threading.Lock()
        # Record bytes written since this connection's last checkpoint (with a hand-over).
        self._unchecked_bytes = 0
        try:
            self._conn = connect(path)
            if on_committed is not None:
                self._conn.execute("PRAGMA wal_autocheckpoint=0")
            self._conn.executescript(SCHEMA)
            add_trace_column(self._conn)
            add_body_column(self._conn)
            add_vector_column(self._conn)
            add_placement_columns(self._conn)
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

    def write(
        self, records: Sequence[Record], *, stored_json: Sequence[str | None] | None = None
    ) -> list[Outcome]:
        outcomes: list[Outcome] = []
        now = datetime.now(UTC).isoformat()
        with self._transaction() as conn:
            heads = self._scoped_heads(conn, sorted({record.doc_id for record in records}))
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
            # One serialization per record, stored once: the outbox row refers to it.
            record_jsons = [_stored(index, record, stored_json) for index, record in accepted]
            conn.executemany(
                "INSERT INTO records (document_id, revision, namespace, snapshot_kind, "
                f"item_id, galaxy, deleted, payload_sha256, {RECORD_BODY}, record_json, "
                "accepted_at, vector_f32) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        *stored_columns(r),
                        record_json_without_vector(record_json),
                        record_json,
                        now,
                        vector_wire(r) if self._keep_vectors else None,
                    )
                    for (_, r), record_json in zip(accepted, record_jsons, strict=True)
                ],
            )
            newest = {r.doc_id: r for _, r in accepted}
            conn.executemany(
                "INSERT INTO heads VALUES (?,?,?,?,?) ON CONFLICT(document_id) DO UPDATE "
                "SET revision = excluded.revision, deleted = excluded.deleted",
                [
                    (doc_id, r.revision, r.namespace, r.snapshot_kind, int(r.deleted))
                    for doc_id, r in sorted(newest.items())
                ],
            )
            before = conn.execute("SELECT COALESCE(MAX(position), 0) FROM outbox").fetchone()[0]
            trace_context = current_traceparent()
            conn.executemany(
                "INSERT INTO outbox (document_id, revision, namespace, snapshot_kind, "
                "event_json, created_at, trace_context) VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        r.doc_id,
                        r.revision,
                        r.namespace,
                        r.snapshot_kind,
                        OUTBOX_EVENT_IS_RECORD,
                        now,
                        trace_context,
                    )
                    for _, r in accepted
                ],
            )
            # The write lock is held and AUTOINCREMENT positions only grow: the rows
            # after `before`, in position order, are exactly these, in insertion order.
            positions = [
                int(row[0])
                for row in conn.execute(
                    "SELECT position FROM outbox WHERE position > ? ORDER BY position", (before,)
                )
            ]
            if len(positions) != len(accepted):
                raise OrreryError(
                    ErrorCode.INTERNAL,
                    "the outbox holds other rows than this batch's after its last position",
                    {"expected": len(accepted), "found": len(positions)},
                )
            for (index, r), position in zip(accepted, positions, strict=True):
                outcomes.append(
                    Outcome(
                        index=index,
                        document_id=r.doc_id,
                        revision=r.revision,
                        decision=Decision.ACCEPTED,
                        position=position,
                    )
                )
            # Built before the commit, handed over right after it: the projector may
            # fetch these positions in between and then reads them from the table.
            # A large record is not handed over (read back from the table when applied):
            # a reader holding handed-over events never holds more than that many bytes
            # of each.
            events = (
                []
                if self._on_committed is None
                else [
                    LogEntry(
                        position=position,
                        event=RecordChanged(record=r),
                        trace_context=trace_context,
                    )
                    for (_, r), position, record_json in zip(
                        accepted, positions, record_jsons, strict=True
                    )
                    if len(record_json) <= HANDOVER_MAX_BYTES
                ]
            )
            written = [
                (r.namespace, position)
                for (_, r), position in zip(accepted, positions, strict=True)
            ]
        outcomes.sort(key=lambda outcome: outcome.index)
        if self._on_positions is not None:
            self._on_positions(written)
        if self._on_committed is not None:
            self._on_committed(events)
            with self._lock:
                self._unchecked_bytes += sum(map(len, record_jsons))
            if not self._defer_checkpoint:
                self.checkpoint_if_due()
        return outcomes

    def checkpoint_if_due(self) -> None:
        """A passive WAL checkpoint once `CHECKPOINT_RECORD_BYTES` were written since the
        last one (the automatic checkpoint's work, after the hand-over; only a store with
        a hand-over counts them). A checkpoint that fails is only put off: the batch is
        committed and handed over, and the next write checkpoints again."""
        with self._lock:
            if self._unchecked_bytes < CHECKPOINT_RECORD_BYTES:
                return
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:
                log.warning("WAL checkpoint put off: %s", exc)
                return
            self._unchecked_bytes = 0

    @staticmethod
    def _scoped_heads(
        conn: sqlite3.Connection, document_ids: Sequence[str]
    ) -> dict[str, tuple[int, str, str]]:
        """`document_id -> (revision, namespace, snapshot_kind)` of the stored heads."""
        heads: dict[str, tuple[int, str, str]] = {}
        for start in range(0, len(document_ids), 500):
            chunk = list(document_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for doc_id, revision, namespace, kind in conn.execute(
                "SELECT document_id, revision, namespace, snapshot_kind FROM heads "
                f"WHERE document_id IN ({marks})",
                chunk,
            ):
                heads[str(doc_id)] = (int(revision), str(namespace), str(kind))
        return heads

    def heads(self, document_ids: Sequence[str]) -> list[Head]:
        try:
            return self._heads(document_ids)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"read heads: {exc}") from exc

    def _heads(self, document_ids: Sequence[str]) -> list[Head]:
        out: list[Head] = []
        with self._lock:
            for start in range(0, len(document_ids), 500):
                chunk = list(document_ids[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    "SELECT h.document_id, h.namespace, r.galaxy, h.snapshot_kind, r.item_id, "
                    "h.revision, h.deleted FROM heads h JOIN records r ON r.document_id = "
                    f"h.document_id AND r.revision = h.revision WHERE h.document_id IN ({marks})",
                    chunk,
                ).fetchall()
                out.extend(
                    Head(str(d), str(ns), str(g), str(k), str(i), int(rev), bool(dl))
                    for d, ns, g, k, i, rev, dl in rows
                )
        return out

    def high_water(self) -> int:
        try:
            with self._lock:
                row = self._conn.execute("SELECT COALESCE(MAX(position), 0) FROM outbox").fetchone()
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"high water: {exc}") from exc
        return int(row[0])

    def live_records(self, namespace: str, snapshot_kind: str, galaxy: str) -> Iterator[Record]:
        # A connection of its own: its read transaction is the snapshot, and a long dump
        # never holds the writers' lock (WAL: readers and the writer do not block).
        try:
            conn = sqlite3.connect(self._path, timeout=30.0, check_same_thread=False)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {self._path}: {exc}") from exc
        try:
            conn.execute("BEGIN")
            cursor = conn.execute(
                "SELECT r.record_json FROM heads h JOIN records r ON r.document_id = "
                "h.document_id AND r.revision = h.revision WHERE h.namespace = ? AND "
                "h.snapshot_kind = ? AND h.deleted = 0 AND r.galaxy = ? ORDER BY r.item_id",
                (namespace, snapshot_kind, galaxy),
            )
            while rows := cursor.fetchmany(500):
                for (record_json,) in rows:
                    yield Record.model_validate_json(record_json)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _stored(index: int, record: Record, stored_json: Sequence[str | None] | None) -> str:
    """The JSON the store keeps of `record`: the caller's serialization when it gave one."""
    given = None if stored_json is None else stored_json[index]
    return record.model_dump_json() if given is None else given
