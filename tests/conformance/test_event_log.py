"""Conformance suite of the `EventLog` port (projector input).

Each engine gets a producer side (how accepted records reach the log), the log, and a
way to reopen the log as a restarted consumer would. To add one, put a factory in
`FACTORIES` (and its marks, such as `servers`, in `FACTORY_MARKS`).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import DependencyUnavailable
from contracts.events import LogEntry
from contracts.records import Record
from ingest.adapters.kafka_wire import KafkaPublisherSettings
from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.relay import relay_outbox
from projector.adapters.kafka_wire import KafkaLogSettings
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog
from projector.ports import EventLog, Undecodable
from tests.conformance.corpus import HOSTILE_NAMESPACES
from tests.conftest import require_server
from tests.kafka_clients import make_log, make_publisher


@dataclass
class LogHarness:
    append: Callable[[list[Record]], None]
    open_log: Callable[[int], EventLog]
    # Puts a message that is no `RecordChanged` on the log, as a buggy or foreign
    # producer would (namespace "ns"; after at least one `append`).
    append_garbage: Callable[[bytes], None]
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Where the relay recorded each outbox row on a partitioned log: position ->
    # (partition, offset) (None: no relay, the outbox is the log).
    placements: Callable[[], dict[int, tuple[int, int]]] | None = None

    def log(self, committed: int = 0) -> EventLog:
        """A consumer whose durable position is `committed` (what a restart resumes at)."""
        log = self.open_log(committed)
        self.closers.append(log.close)
        return log

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def _sqlite(request: pytest.FixtureRequest, tmp: Path) -> LogHarness:
    store = SqliteRecordStore(tmp / "orrery.sqlite")

    def append(records: list[Record]) -> None:
        store.write(records)

    def open_log(committed: int) -> EventLog:
        return SqliteOutboxLog(tmp / "orrery.sqlite", start_after=committed)

    def append_garbage(value: bytes) -> None:
        with contextlib.closing(sqlite3.connect(tmp / "orrery.sqlite")) as conn, conn:
            conn.execute(
                "INSERT INTO outbox (document_id, revision, namespace, snapshot_kind, "
                "event_json, created_at) VALUES ('garbage', 1, 'ns', 'objects', ?, "
                "'2026-01-01T00:00:00+00:00')",
                (value,),  # a BLOB: any bytes, valid UTF-8 or not
            )

    return LogHarness(append, open_log, append_garbage, [store.close])


def _sqlite_remembered(request: pytest.FixtureRequest, tmp: Path) -> LogHarness:
    """The embedded wiring: the store hands each committed batch's events to the logs
    of this process (`SqliteOutboxLog.remember`), which serve them without decoding."""
    logs: list[SqliteOutboxLog] = []
    # A log opened later is handed what came before, as if it had been there.
    history: list[LogEntry] = []

    def handed_over(entries: list[LogEntry]) -> None:
        history.extend(entries)
        for log in logs:
            log.remember(entries)

    store = SqliteRecordStore(tmp / "orrery.sqlite", on_committed=handed_over)
    plain = _sqlite(request, tmp)

    def append(records: list[Record]) -> None:
        store.write(records)

    def open_log(committed: int) -> EventLog:
        log = SqliteOutboxLog(tmp / "orrery.sqlite", start_after=committed)
        log.remember(history)
        logs.append(log)
        return log

    return LogHarness(append, open_log, plain.append_garbage, [store.close, *plain.closers])


def _kafka(request: pytest.FixtureRequest, tmp: Path, client: str) -> LogHarness:
    """Records go SQLite store -> outbox -> relay -> Kafka (3 partitions per topic)."""
    store = SqliteRecordStore(tmp / "orrery.sqlite")
    return _kafka_from(
        store, SqliteOutboxReader(tmp / "orrery.sqlite"), client, store_path=tmp / "orrery.sqlite"
    )


def _kafka_postgres(request: pytest.FixtureRequest, tmp: Path, client: str) -> LogHarness:
    """Records go PostgreSQL store -> outbox -> relay (SKIP LOCKED claims) -> Kafka: the
    positions a Kafka consumer sees are the PostgreSQL store's."""
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore

    url: str = request.getfixturevalue("postgres_url")
    migrate(url)
    return _kafka_from(PostgresRecordStore(url), PostgresOutboxReader(url), client, store_url=url)


def _kafka_from(
    store: Any, source: Any, client: str, *, store_path: Path | None = None, store_url: str = ""
) -> LogHarness:
    """Records go `store` -> its outbox -> `source` (relay) -> Kafka (3 partitions per topic).

    `client` names the Kafka client of both the relay and the log. Topics and the
    consumer group are unique to the test and dropped afterwards. The
    durable position of a Kafka consumer is its group's committed offsets, so `open_log`
    ignores `committed`; opening a log closes the previous one, as a restart would (two
    live members would split the partitions between them).
    """
    bootstrap = require_server("kafka")
    run = f"orrery-conf-{uuid.uuid4().hex[:12]}"
    prefix = f"{run}.records"
    publisher = make_publisher(
        client,
        KafkaPublisherSettings(
            bootstrap,
            topic_prefix=prefix,
            partitions=3,
            replication_factor=1,
            request_timeout_ms=5_000,
            ack_timeout_ms=10_000,
            bootstrap_timeout_ms=5_000,
            backoff_initial_s=0.05,
            backoff_max_s=0.5,
        ),
    )
    open_logs: list[EventLog] = []

    def append(records: list[Record]) -> None:
        store.write(records)
        relay_outbox(source=source, publisher=publisher, batch_size=100)

    def placements() -> dict[int, tuple[int, int]]:
        sql = "SELECT position, kafka_partition, kafka_offset FROM outbox"
        if isinstance(store, SqliteRecordStore):
            with contextlib.closing(sqlite3.connect(store_path)) as conn:
                rows = conn.execute(sql).fetchall()
        else:
            import psycopg

            with psycopg.connect(store_url) as conn:
                rows = conn.execute(sql).fetchall()
        return {int(p): (int(part), int(off)) for p, part, off in rows if part is not None}

    def open_log(committed: int) -> EventLog:
        for previous in open_logs:
            previous.close()
        log = make_log(
            client,
            KafkaLogSettings(
                bootstrap,
                group_id=run,
                topic_prefix=prefix,
                session_timeout_ms=6_000,
                heartbeat_interval_ms=1_000,
                max_poll_interval_ms=10_000,
                metadata_max_age_ms=1_000,
                poll_timeout_ms=200,
                join_timeout_ms=15_000,
                request_timeout_ms=5_000,
                bootstrap_timeout_ms=5_000,
            ),
        )
        open_logs.append(log)
        return log

    def append_garbage(value: bytes) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
        try:
            producer.send(f"{prefix}.ns", key=b"garbage", value=value).get(timeout=10)
        finally:
            producer.close()

    def drop() -> None:
        _drop_kafka_resources(bootstrap, prefix, run)

    return LogHarness(
        append,
        open_log,
        append_garbage,
        [drop, publisher.close, source.close, store.close],
        placements,
    )


def _drop_kafka_resources(bootstrap: str, prefix: str, group_id: str) -> None:
    from kafka import KafkaAdminClient  # imported by the adapters above, warnings handled

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    try:
        topics = [t for t in admin.list_topics() if t.startswith(f"{prefix}.")]
        if topics:
            admin.delete_topics(topics, timeout_ms=5_000)
        admin.delete_groups([group_id])
    finally:
        admin.close()


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], LogHarness]] = {
    "sqlite-outbox": _sqlite,
    "sqlite-outbox-remembered": _sqlite_remembered,
    # Each Kafka client (relay and log), from SQLite's and from PostgreSQL's outbox.
    "kafka": functools.partial(_kafka, client="kafka-python"),
    "kafka-postgres": functools.partial(_kafka_postgres, client="kafka-python"),
    "kafka-confluent": functools.partial(_kafka, client="confluent"),
    "kafka-postgres-confluent": functools.partial(_kafka_postgres, client="confluent"),
}
FACTORY_MARKS: dict[str, Sequence[pytest.MarkDecorator]] = {
    name: (pytest.mark.servers,) for name in FACTORIES if name.startswith("kafka")
}


@pytest.fixture(
    params=[pytest.param(name, marks=FACTORY_MARKS.get(name, ())) for name in sorted(FACTORIES)]
)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogHarness]:
    instance = FACTORIES[request.param](request, tmp_path)
    yield instance
    instance.close()


def rec(item: str, revision: int) -> Record:
    return Record(namespace="ns", snapshot_kind="objects", item_id=item, revision=revision)


def drain(log: EventLog, limit: int = 100) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    while batch := log.fetch(limit):
        out.extend((e.event.record.item_id, e.event.revision) for e in batch)
    return out


def fetch_all(log: EventLog, count: int) -> list[Any]:
    """Fetch until `count` messages came back (a Kafka member may need several polls)."""
    out: list[Any] = []
    for _ in range(50):
        out.extend(log.fetch(100))
        if len(out) >= count:
            break
    assert len(out) == count, out
    return out


def test_empty_log(harness: LogHarness) -> None:
    log = harness.log()
    assert log.fetch(10) == []
    assert log.high_water() == 0


def test_delivers_in_order_per_document(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    harness.append([rec("a", 2)])
    log = harness.log()
    got = drain(log, limit=2)
    assert sorted(got) == [("a", 1), ("a", 2), ("b", 1)]
    assert [r for r in got if r[0] == "a"] == [("a", 1), ("a", 2)]
    assert log.high_water() >= 3


def test_positions_are_outbox_positions(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    log = harness.log()
    entries = log.fetch(10)
    positions = sorted(e.position for e in entries)
    assert len(set(positions)) == 2 and positions[-1] == log.high_water()


def test_high_water_is_the_newest_position_before_any_fetch(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    harness.append([rec("a", 2)])
    log = harness.log()
    assert log.high_water() == 3  # a fresh store numbers its outbox 1, 2, 3
    assert max(e.position for e in log.fetch(10)) == 3


def test_unacknowledged_entries_are_delivered_again_after_reset(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1)])
    log = harness.log()
    first = log.fetch(10)
    assert len(first) == 2
    log.reset()
    again = log.fetch(10)
    assert sorted(e.position for e in again) == sorted(e.position for e in first)


def test_acknowledged_entries_are_not_delivered_again(harness: LogHarness) -> None:
    harness.append([rec("a", 1)])
    log = harness.log()
    first = log.fetch(10)
    log.acknowledge(first)
    harness.append([rec("b", 1)])
    log.reset()
    assert [e.event.record.item_id for e in log.fetch(10)] == ["b"]


def test_restart_resumes_after_the_committed_position(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1), rec("c", 1)])
    log = harness.log()
    entries = log.fetch(1)
    log.acknowledge(entries)
    restarted = harness.log(committed=entries[0].position)
    # The port orders events per document only: the first fetch may return any of them.
    consumed = entries[0].event.record.item_id
    assert sorted(i for i, _ in drain(restarted)) == sorted({"a", "b", "c"} - {consumed})


def test_event_carries_the_whole_record(harness: LogHarness) -> None:
    record = Record.model_validate(
        {
            "namespace": "ns",
            "snapshot_kind": "objects",
            "item_id": "x",
            "revision": 1,
            "payload": {"ä": [1, 2]},
            "text": {"title": "T", "body": "B", "tags": ["t"]},
        }
    )
    harness.append([record])
    (entry,) = harness.log().fetch(10)
    assert entry.event.record == record


def test_lag_of_an_empty_log_is_zero(harness: LogHarness) -> None:
    assert harness.log().lag() == 0


def test_lag_counts_what_is_not_acknowledged(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1), rec("c", 1)])
    log = harness.log()
    assert log.lag() == 3  # before any fetch
    entries = fetch_all(log, 3)
    assert log.lag() == 3  # fetched is not applied
    log.acknowledge(entries[:1])
    assert log.lag() == 2
    log.acknowledge(entries[1:])
    assert log.lag() == 0
    harness.append([rec("d", 1)])
    assert log.lag() == 1  # appended after the last acknowledgement


def test_lag_survives_a_restart(harness: LogHarness) -> None:
    harness.append([rec("a", 1), rec("b", 1), rec("c", 1)])
    log = harness.log()
    (first,) = log.fetch(1)
    log.acknowledge([first])
    restarted = harness.log(committed=first.position)
    assert restarted.lag() == 2


def test_an_undecodable_message_comes_back_in_its_place_and_never_stalls(
    harness: LogHarness,
) -> None:
    harness.append([rec("a", 1)])
    harness.append_garbage(b'{"not": "an event"}')
    harness.append([rec("b", 1)])
    log = harness.log()
    messages = fetch_all(log, 3)
    bad = [m for m in messages if isinstance(m, Undecodable)]
    good = sorted(m.event.record.item_id for m in messages if not isinstance(m, Undecodable))
    assert good == ["a", "b"]
    (garbage,) = bad
    assert garbage.value == b'{"not": "an event"}'
    assert garbage.reason and garbage.where
    log.acknowledge(messages)
    assert log.lag() == 0
    committed = max(m.position or 0 for m in messages)
    assert harness.log(committed=committed).fetch(10) == []  # parked, not redelivered


def test_an_unacknowledged_undecodable_message_is_delivered_again(harness: LogHarness) -> None:
    harness.append([rec("a", 1)])
    harness.append_garbage(b"\xff garbage")
    log = harness.log()
    first = fetch_all(log, 2)
    log.reset()
    again = fetch_all(log, 2)
    values = [m.value for m in again if isinstance(m, Undecodable)]
    assert values == [m.value for m in first if isinstance(m, Undecodable)] == [b"\xff garbage"]


def test_acknowledging_out_of_order_still_commits_everything(harness: LogHarness) -> None:
    harness.append([rec(f"d{i}", 1) for i in range(9)])
    log = harness.log()
    entries = sorted(fetch_all(log, 9), key=lambda e: e.position)
    log.acknowledge(entries[-1:])  # the newest first, the rest afterwards
    log.acknowledge(entries[:-1])
    assert log.lag() == 0
    assert harness.log(committed=entries[-1].position).fetch(10) == []


def test_hostile_namespaces_round_trip(harness: LogHarness) -> None:
    records = [
        Record(namespace=ns, snapshot_kind="objects", item_id=f"i{n}", revision=1)
        for n, ns in enumerate(("ns", *HOSTILE_NAMESPACES))
    ]
    harness.append(records)
    entries = fetch_all(harness.log(), len(records))
    assert sorted(e.event.record.namespace for e in entries) == sorted(r.namespace for r in records)
    assert {e.event.record.document_id for e in entries} == {r.doc_id for r in records}


def test_remembered_events_are_served_as_handed_over_and_equal_the_rows(tmp_path: Path) -> None:
    """The embedded hand-over: what `fetch` returns for a remembered position is the
    entry handed over, equal to what decoding its row gives; rows never handed over
    (another writer's) are read from the table in their place."""
    handed: list[LogEntry] = []
    store = SqliteRecordStore(tmp_path / "orrery.sqlite", on_committed=handed.extend)
    records = [
        Record.model_validate(
            {
                "namespace": "ns",
                "snapshot_kind": "objects",
                "item_id": f"x{i}",
                "revision": 1 + i,
                "payload": {"ä": [1, 2.5, None], "n": {"k": i}},
                "text": {"title": "T", "body": "B", "tags": ["t"]},
                "metadata": {"updated_at": "2026-03-19T12:00:00+02:00", "room": i},
                "vector": [0.1 * (i + 1), -0.2, 3e-9],
            }
        )
        for i in range(5)
    ]
    store.write(records[:3])
    other = SqliteRecordStore(tmp_path / "orrery.sqlite")  # another writer: nothing handed
    other.write(records[3:])
    remembering = SqliteOutboxLog(tmp_path / "orrery.sqlite")
    remembering.remember(handed)
    reading = SqliteOutboxLog(tmp_path / "orrery.sqlite")
    try:
        served, decoded = remembering.fetch(10), reading.fetch(10)
        assert [e.position for e in served] == [1, 2, 3, 4, 5]
        assert served == decoded
        assert all(s is h for s, h in zip(served[:3], handed, strict=True))
        assert not any(s is h for s in served[3:] for h in handed)
    finally:
        for closable in (remembering, reading, store, other):
            closable.close()


def test_a_fetch_waits_for_the_hand_over_of_what_was_just_committed(tmp_path: Path) -> None:
    """The writer hands its events over right after its commit: a fetch in between
    waits for them (and serves the entries handed over, not rows decoded again) rather
    than reading the rows; a position past the newest handed over that never comes (a
    writer that does not hand over) is read from the table once the wait ran out."""
    handed: list[list[LogEntry]] = []
    store = SqliteRecordStore(tmp_path / "orrery.sqlite", on_committed=handed.append)
    other = SqliteRecordStore(tmp_path / "orrery.sqlite")  # hands nothing over
    records = [rec(f"d{i}", 1) for i in range(6)]
    # Long enough for the other thread on a busy machine; the fetch returns once notified.
    log = SqliteOutboxLog(tmp_path / "orrery.sqlite", handover_wait_seconds=30.0)
    reading = SqliteOutboxLog(tmp_path / "orrery.sqlite")
    try:
        store.write(records[:2])
        log.remember(handed[0])
        first = log.fetch(10)
        assert all(s is h for s, h in zip(first, handed[0], strict=True))
        log.acknowledge(first)
        store.write(records[2:4])  # committed; its hand-over comes from another thread
        later = threading.Timer(0.05, log.remember, args=(handed[1],))
        later.start()
        served = log.fetch(10)
        later.join()
        assert [e.position for e in served] == [3, 4]
        assert all(s is h for s, h in zip(served, handed[1], strict=True))
        log.acknowledge(served)
        other.write(records[4:])
        short = SqliteOutboxLog(tmp_path / "orrery.sqlite", handover_wait_seconds=0.01)
        short.remember(handed[0] + handed[1])
        short.acknowledge(handed[0] + handed[1])
        short.reset()
        decoded = short.fetch(10)
        assert [e.position for e in decoded] == [5, 6]
        assert decoded == [e for e in reading.fetch(10) if e.position > 4]
        short.close()
    finally:
        for closable in (log, reading, store, other):
            closable.close()


def test_entries_carry_where_the_relay_recorded_their_rows(harness: LogHarness) -> None:
    """On a partitioned log each entry names its partition and offset, exactly what the
    relay recorded on its outbox row from the broker's acknowledgement (readiness counts
    a namespace's unapplied events by them); the outbox log has neither."""
    harness.append([rec(f"d{i}", 1) for i in range(12)])
    harness.append([rec("d0", 2), rec("d1", 2)])
    entries = fetch_all(harness.log(), 14)
    seen = {e.position: (e.partition, e.offset) for e in entries}
    if harness.placements is None:
        assert set(seen.values()) == {(None, None)}
        return
    assert seen == harness.placements()
    # Offsets strictly increase within a partition, in the order of each document's events.
    partitions = {p for p, _ in seen.values()}
    assert len(partitions) > 1
    for partition in partitions:
        offsets = sorted(o for p, o in seen.values() if p == partition)
        assert len(set(offsets)) == len(offsets)


def _commits_fail_once(monkeypatch: pytest.MonkeyPatch, client: str) -> Callable[[], None]:
    """Arm a one-time commit failure in the Kafka client the log constructs.

    The broker, the group and every fetch are real; only the next offset commit fails,
    with the exception the client raises when its coordinator is away or the group moved
    on. No broker-side fault fails commits alone on a shared broker (the offsets topic
    also carries the group's joins), and a stopped broker also fails fetches, which
    rewind by themselves.
    """
    armed = [False]
    if client == "confluent":
        import confluent_kafka

        from projector.adapters import confluent_log

        class FailingConfluent(confluent_kafka.Consumer):
            def commit(self, *args: Any, **kwargs: Any) -> Any:
                if armed[0]:
                    armed[0] = False
                    error = confluent_kafka.KafkaError(confluent_kafka.KafkaError._TIMED_OUT)
                    raise confluent_kafka.KafkaException(error)
                return super().commit(*args, **kwargs)

        monkeypatch.setattr(confluent_log, "Consumer", FailingConfluent)
    else:
        from kafka.errors import CommitFailedError

        from projector.adapters import kafka_log

        class FailingKafkaPython(kafka_log.KafkaConsumer):
            def commit(self, *args: Any, **kwargs: Any) -> Any:
                if armed[0]:
                    armed[0] = False
                    raise CommitFailedError("injected: the coordinator did not answer")
                return super().commit(*args, **kwargs)

        monkeypatch.setattr(kafka_log, "KafkaConsumer", FailingKafkaPython)

    def arm() -> None:
        armed[0] = True

    return arm


@pytest.mark.servers
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_failed_commit_delivers_its_entries_again_from_the_same_member(
    client: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails while the member stays in the group and its fetches keep
    working (a coordinator fault): the entries left the member's ledger and its fetch
    position is past them, so only a rewind to the committed offsets delivers them
    again. Without it they would wait for the next rebalance, possibly forever."""
    arm = _commits_fail_once(monkeypatch, client)
    harness = _kafka(None, tmp_path, client)  # type: ignore[arg-type]  # its request is unused
    try:
        harness.append([rec(f"d{i}", 1) for i in range(6)])
        log = harness.log()
        first = fetch_all(log, 6)
        arm()
        with pytest.raises(DependencyUnavailable):
            log.acknowledge(first)
        again = fetch_all(log, 6)  # the same member: no rejoin brings them back
        assert sorted(e.position for e in again) == sorted(e.position for e in first)
        log.acknowledge(again)
        harness.append([rec("after", 1)])
        restarted = harness.log()
        assert [e.event.record.item_id for e in fetch_all(restarted, 1)] == ["after"]
    finally:
        harness.close()
