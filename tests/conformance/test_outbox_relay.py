"""Conformance suite of the `OutboxRelaySource` port (ingest, server mode).

Each backend gives a record store and a way to open relay sources on the same database
(each open is another relay, as another process would be). The SQLite outbox serves one
relay per database (it has no claims); tests of several relays are for backends whose
`several_relays` is true.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contracts.events import RecordChanged, decode_record_changed
from contracts.records import Record
from contracts.stored_vectors import PackedVector, float32_wire
from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.model import stored_columns
from ingest.ports import RecordStore
from ingest.relay import relay_outbox
from ingest.relay_ports import OutboxRelaySource, OutboxRow


@dataclass
class Backend:
    open_store: Callable[[], RecordStore]
    open_source: Callable[[], OutboxRelaySource]
    # Sets an outbox row's `event_json` in the database itself: a row written before the
    # outbox pointed at its record row held the whole event.
    set_event_json: Callable[[int, str], None]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def store(self) -> RecordStore:
        store = self.open_store()
        self.closers.append(store.close)
        return store

    def source(self) -> OutboxRelaySource:
        source = self.open_source()
        self.closers.append(source.close)
        return source


def _sqlite(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    path = tmp / "orrery.sqlite"

    def set_event_json(position: int, event_json: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE outbox SET event_json = ? WHERE position = ?", (event_json, position)
            )
        conn.close()

    # Server mode's SQLite store keeps the vectors' float32 bytes for the relay.
    return Backend(
        lambda: SqliteRecordStore(path, keep_vectors=True),
        lambda: SqliteOutboxReader(path),
        set_event_json,
    )


def _postgres(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore

    url: str = request.getfixturevalue("postgres_url")
    migrate(url)

    def set_event_json(position: int, event_json: str) -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE outbox SET own_event_json = %s WHERE position = %s", (event_json, position)
            )

    return Backend(
        lambda: PostgresRecordStore(url, pool_size=8),
        lambda: PostgresOutboxReader(url),
        set_event_json,
    )


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


# Outboxes that let several relays claim rows; SQLite's serves one relay per database,
# so the several-relay cases are not generated for it (rather than skipped).
CLAIMING = {"postgres"}


def _params(names: Iterable[str]) -> list[Any]:
    return [pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(names)]


def _open(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    instance = FACTORIES[request.param](request, tmp_path)
    yield instance
    for close in reversed(instance.closers):
        close()


@pytest.fixture(params=_params(FACTORIES))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _open(request, tmp_path)


@pytest.fixture(params=_params(CLAIMING))
def claiming(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _open(request, tmp_path)


def rec(item: str, revision: int = 1) -> Record:
    return Record(
        namespace="ns", snapshot_kind="objects", item_id=item, revision=revision, payload={}
    )


class RecordingPublisher:
    """An `EventPublisher` that keeps what it was given (thread-safe)."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self._lock = threading.Lock()

    def publish(self, rows: list[OutboxRow]) -> list[tuple[int, int]]:
        with self._lock:
            self.positions.extend(row.position for row in rows)
        return []  # a log without partitions

    def close(self) -> None:
        pass


def test_pending_counts_the_rows_not_marked(backend: Backend) -> None:
    store, source = backend.store(), backend.source()
    assert source.pending() == 0
    store.write([rec(f"d{i}") for i in range(5)])
    assert source.pending() == 5
    rows = source.unpublished(3)
    assert source.pending() == 5  # claimed rows are still pending until marked
    source.mark_published([r.position for r in rows])
    assert source.pending() == 2


def test_a_traced_write_keeps_its_trace_context_on_its_rows(backend: Backend) -> None:
    from contracts.request_context import RequestContext, close_request, open_request

    store, source = backend.store(), backend.source()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    token = open_request(RequestContext("r1", traceparent=traceparent))
    try:
        store.write([rec("traced")])
    finally:
        close_request(token)
    store.write([rec("untraced")])
    rows = source.unpublished(10)
    assert [r.trace_context for r in rows] == [traceparent, None]


def test_unpublished_in_order_until_marked(backend: Backend) -> None:
    store, source = backend.store(), backend.source()
    store.write([rec(f"d{i}") for i in range(5)])
    rows = source.unpublished(3)
    assert [r.position for r in rows] == [1, 2, 3]
    assert rows[0].namespace == "ns" and '"item_id":"d0"' in rows[0].event_json
    source.mark_published([1, 2, 3])
    source.mark_published([1, 2, 3, 99])  # idempotent; unknown positions are ignored
    assert [r.position for r in source.unpublished(10)] == [4, 5]


def test_each_row_carries_its_records_event_byte_for_byte(backend: Backend) -> None:
    store, source = backend.store(), backend.source()
    records = [
        rec("a"),
        rec("b"),
        rec("d", revision=3),
        rec("c").model_copy(update={"deleted": True}),
    ]
    for record in records:
        store.write([record])
    rows = source.unpublished(10)
    assert [r.event_json for r in rows] == [
        RecordChanged(record=r).model_dump_json() for r in records
    ]


def test_each_row_carries_its_records_vector_as_float32_bytes(backend: Backend) -> None:
    """The bytes the projector reads instead of the vector's decimals: those of the very
    record of the row's event; none for a record without a vector or a tombstone."""
    store, source = backend.store(), backend.source()
    records = [
        rec("a").model_copy(update={"vector": [0.5, -0.25, 1e-3]}),
        rec("b"),
        rec("d", revision=2).model_copy(update={"vector": [0.1, 0.2, 0.3]}),
        rec("c").model_copy(update={"vector": [1.0, 2.0, 3.0], "deleted": True}),
    ]
    store.write(records[:2])
    store.write(records[2:])
    rows = source.unpublished(10)
    assert [r.vector_f32 for r in rows] == [
        float32_wire([0.5, -0.25, 1e-3]),
        None,
        float32_wire([0.1, 0.2, 0.3]),
        None,
    ]
    for row, record in zip(rows, records, strict=True):
        entry = decode_record_changed(row.event_json.encode(), row.vector_f32)
        assert entry == RecordChanged(record=record)
        assert isinstance(entry.record.vector, PackedVector) == (row.vector_f32 is not None)


def test_a_row_holding_its_whole_event_is_relayed_as_written(backend: Backend) -> None:
    # Rows written before the outbox pointed at its record row (an outbox upgraded
    # with rows in it) keep their event: relayed byte for byte, beside the new rows.
    store, source = backend.store(), backend.source()
    new = rec("new")
    store.write([rec("old"), new])
    legacy = RecordChanged(
        record=Record(
            namespace="ns",
            snapshot_kind="objects",
            item_id="old",
            revision=1,
            payload={"written": "in full"},
        )
    ).model_dump_json()
    backend.set_event_json(1, legacy)
    rows = source.unpublished(10)
    assert [r.event_json for r in rows] == [
        legacy,
        RecordChanged(record=new).model_dump_json(),
    ]


def test_unmarked_rows_come_back_after_a_restart(backend: Backend) -> None:
    store = backend.store()
    store.write([rec(f"d{i}") for i in range(3)])
    first = backend.open_source()
    assert [r.position for r in first.unpublished(2)] == [1, 2]
    first.close()  # never marked: a crashed relay
    again = backend.source()
    assert [r.position for r in again.unpublished(10)] == [1, 2, 3]
    again.mark_published([1, 2, 3])
    assert again.unpublished(10) == []


def test_one_relay_beside_writers_publishes_positions_in_order(backend: Backend) -> None:
    """A relay running while 4 writers commit sees positions only in commit order: it
    publishes 1..N, each once, in increasing order (a hole filled later would show)."""
    stores = [backend.store(), backend.store()]
    source = backend.source()
    publisher = RecordingPublisher()
    done = threading.Event()

    def writer(worker: int) -> None:
        for batch in range(50):
            stores[worker % 2].write([rec(f"w{worker}-{batch}-{i}") for i in range(4)])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()

    def relay() -> None:
        while not done.is_set():
            relay_outbox(source=source, publisher=publisher, batch_size=37)
        relay_outbox(source=source, publisher=publisher, batch_size=37)

    relay_thread = threading.Thread(target=relay)
    relay_thread.start()
    for thread in threads:
        thread.join()
    done.set()
    relay_thread.join()
    assert publisher.positions == list(range(1, 4 * 50 * 4 + 1))


def test_two_relays_publish_each_position_once(claiming: Backend) -> None:
    store = claiming.store()
    total = 5_000
    for start in range(0, total, 500):
        store.write([rec(f"d{i}") for i in range(start, start + 500)])
    publishers = [RecordingPublisher(), RecordingPublisher()]
    sources = [claiming.source(), claiming.source()]

    def relay(n: int) -> None:
        while relay_outbox(source=sources[n], publisher=publishers[n], batch_size=100):
            pass

    threads = [threading.Thread(target=relay, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    published = publishers[0].positions + publishers[1].positions
    assert sorted(published) == list(range(1, total + 1))
    assert publishers[0].positions and publishers[1].positions, "both relays took rows"
    for publisher in publishers:
        assert publisher.positions == sorted(publisher.positions)


def test_claimed_rows_are_skipped_and_a_dead_relays_rows_go_to_another(
    claiming: Backend,
) -> None:
    store = claiming.store()
    store.write([rec(f"d{i}") for i in range(10)])
    dying = claiming.open_source()
    other = claiming.source()
    assert [r.position for r in dying.unpublished(4)] == [1, 2, 3, 4]
    assert [r.position for r in other.unpublished(3)] == [5, 6, 7]
    other.mark_published([5, 6, 7])
    dying.close()  # killed mid-batch: published maybe, never marked
    assert [r.position for r in other.unpublished(100)] == [1, 2, 3, 4, 8, 9, 10]


def test_a_documents_later_revision_waits_for_its_earlier_one(claiming: Backend) -> None:
    """With several relays a document's events still reach the log in position order."""
    store = claiming.store()
    store.write([rec("a", 1), rec("b", 1)])
    store.write([rec("a", 2), rec("c", 1)])
    first, second = claiming.source(), claiming.source()
    assert [r.position for r in first.unpublished(1)] == [1]  # a@1, held
    assert [r.position for r in second.unpublished(10)] == [2, 4]  # not a@2 (position 3)
    second.mark_published([2, 4])
    first.mark_published([1])
    assert [r.position for r in second.unpublished(10)] == [3]


def test_a_sqlite_store_from_before_the_vector_bytes_keeps_its_rows(tmp_path: Path) -> None:
    """A SQLite file written before records kept their float32 bytes: opened, it gains the
    column; its rows are relayed without bytes (decoded from their decimals, the same
    event), a record written after carries them."""
    from ingest.adapters.sqlite_store import SCHEMA

    path = tmp_path / "orrery.sqlite"
    old = rec("old").model_copy(update={"vector": [0.5, -0.25]})
    before = SCHEMA.replace("    vector_f32     BLOB,\n", "")
    assert before != SCHEMA
    conn = sqlite3.connect(path)
    conn.executescript(before)
    conn.execute(
        "INSERT INTO records (document_id, revision, namespace, snapshot_kind, item_id, "
        "galaxy, deleted, payload_sha256, record_json, accepted_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?)",
        (*stored_columns(old), old.model_dump_json(), "2026-01-01T00:00:00+00:00"),
    )
    conn.execute(
        "INSERT INTO outbox (document_id, revision, namespace, snapshot_kind, event_json, "
        "created_at) VALUES (?, 1, 'ns', 'objects', '', '2026-01-01T00:00:00+00:00')",
        (old.doc_id,),
    )
    conn.commit()
    conn.close()
    store = SqliteRecordStore(path, keep_vectors=True)
    source = SqliteOutboxReader(path)
    try:
        new = rec("new").model_copy(update={"vector": [1.0, 2.0]})
        store.write([new])
        rows = source.unpublished(10)
        assert [r.vector_f32 for r in rows] == [None, float32_wire([1.0, 2.0])]
        decoded = [decode_record_changed(r.event_json.encode(), r.vector_f32) for r in rows]
        assert decoded == [RecordChanged(record=old), RecordChanged(record=new)]
    finally:
        store.close()
        source.close()


def test_the_embedded_store_keeps_no_vector_bytes(tmp_path: Path) -> None:
    """Without a relay (the embedded deployment) nothing reads them: not written."""
    path = tmp_path / "orrery.sqlite"
    store = SqliteRecordStore(path)
    source = SqliteOutboxReader(path)
    try:
        store.write([rec("a").model_copy(update={"vector": [1.0, 2.0]})])
        assert [r.vector_f32 for r in source.unpublished(10)] == [None]
    finally:
        store.close()
        source.close()


@pytest.mark.servers
def test_a_commit_of_outbox_rows_wakes_a_relay_listening_in_another_connection(
    postgres_url: str,
) -> None:
    """PostgreSQL: each committed write of outbox rows calls the signal's `on_rows` (the
    relay's wake), also after the listening connection was lost and came back."""
    import psycopg

    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader, PostgresOutboxSignal
    from ingest.adapters.postgres_store import PostgresRecordStore

    migrate(postgres_url)
    woken = threading.Event()
    signal = PostgresOutboxSignal(postgres_url, woken.set, wait_seconds=0.1, retry_seconds=0.1)
    store = PostgresRecordStore(postgres_url)
    source = PostgresOutboxReader(postgres_url)
    signal.start()
    try:
        assert woken.wait(30), "woken once listening (rows committed before count)"
        woken.clear()
        store.write([rec("a"), rec("b")])
        assert woken.wait(30), "woken by the commit"
        assert [r.position for r in source.unpublished(10)] == [1, 2]
        source.mark_published([1, 2])

        woken.clear()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'orrery-outbox-signal' AND datname = current_database()"
            )
        assert woken.wait(30), "woken after the connection came back"
        # Listening again (the wake after a reconnection comes right after the LISTEN):
        # a later commit wakes it as well.
        woken.clear()
        store.write([rec("c")])
        assert woken.wait(30), "woken by a commit after the reconnection"
        assert [r.position for r in source.unpublished(10)] == [3]
    finally:
        signal.close()
        source.close()
        store.close()
