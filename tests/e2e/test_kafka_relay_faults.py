"""Outbox relay → Kafka → the projector's event log under faults, against the harness
broker, for each Kafka client (`tests.kafka_clients`).

"Kafka down" is a publisher pointed at a closed loopback port: the shared broker keeps
running for the other tests. Every test uses its own topic prefix and consumer groups
and drops them afterwards.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import DependencyUnavailable
from contracts.events import POSITION_HEADER, LogEntry, topic_for
from contracts.records import Record
from ingest.adapters.kafka_wire import KafkaPublisherSettings, murmur2_many
from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.entrypoints.relay import RelayLoop
from ingest.model import Decision
from ingest.relay import relay_outbox
from ingest.relay_ports import EventPublisher
from projector.adapters.kafka_wire import KafkaLogSettings
from projector.ports import EventLog
from tests.conftest import require_server
from tests.kafka_clients import KAFKA_CLIENTS, make_log, make_publisher

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

NS = "faults"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rec(item: str, revision: int, body: str = "") -> Record:
    return Record.model_validate(
        {
            "namespace": NS,
            "snapshot_kind": "objects",
            "item_id": item,
            "revision": revision,
            "text": {"title": f"{item} r{revision}", "body": body},
        }
    )


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class KafkaRun:
    """One test's canonical store, outbox reader, and uniquely named Kafka resources."""

    bootstrap: str
    tmp: Path
    client: str = "kafka-python"
    run: str = field(default_factory=lambda: f"orrery-e2e-{uuid.uuid4().hex[:12]}")
    closers: list[Callable[[], None]] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = SqliteRecordStore(self.tmp / "orrery.sqlite")
        self.source = SqliteOutboxReader(self.tmp / "orrery.sqlite")
        self.closers += [self.store.close, self.source.close]

    @property
    def prefix(self) -> str:
        return f"{self.run}.records"

    def write(self, records: list[Record]) -> set[tuple[str, int]]:
        outcomes = self.store.write(records)
        assert all(o.decision is Decision.ACCEPTED for o in outcomes)
        return {(o.document_id, o.revision) for o in outcomes if o.document_id is not None}

    def publisher(self, bootstrap: str | None = None, **overrides: Any) -> EventPublisher:
        settings: dict[str, Any] = {
            "topic_prefix": self.prefix,
            "partitions": 3,
            "replication_factor": 1,
            "request_timeout_ms": 5_000,
            "ack_timeout_ms": 10_000,
            "bootstrap_timeout_ms": 3_000,
            "connect_timeout_s": 1.0,
            "attempts": 3,
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.2,
        }
        settings.update(overrides)
        publisher: EventPublisher = make_publisher(
            self.client, KafkaPublisherSettings(bootstrap or self.bootstrap, **settings)
        )
        self.closers.append(publisher.close)
        return publisher

    def group(self, group: str = "projector") -> str:
        group_id = f"{self.run}-{group}"
        if group_id not in self.groups:
            self.groups.append(group_id)
        return group_id

    def log(
        self, group: str = "projector", client: str | None = None, **overrides: Any
    ) -> EventLog:
        settings: dict[str, Any] = {
            "session_timeout_ms": 6_000,
            "heartbeat_interval_ms": 1_000,
            "max_poll_interval_ms": 10_000,
            "metadata_max_age_ms": 1_000,
            "poll_timeout_ms": 200,
            "join_timeout_ms": 15_000,
            "request_timeout_ms": 5_000,
            "bootstrap_timeout_ms": 5_000,
        }
        settings.update(overrides)
        log: EventLog = make_log(
            client or self.client,
            KafkaLogSettings(
                self.bootstrap, group_id=self.group(group), topic_prefix=self.prefix, **settings
            ),
        )
        self.closers.append(log.close)
        return log

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        from kafka import KafkaAdminClient  # after the adapters imported kafka quietly

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5_000)
        try:
            topics = [t for t in admin.list_topics() if t.startswith(f"{self.prefix}.")]
            if topics:
                admin.delete_topics(topics, timeout_ms=5_000)
            if self.groups:
                admin.delete_groups(self.groups)
        finally:
            admin.close()


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KafkaRun]:
    """One run per Kafka client: its relay and its logs use that client."""
    run = KafkaRun(require_server("kafka"), tmp_path, client=request.param)
    yield run
    run.close()


def read_all(log: EventLog, expected: int, timeout: float = 30.0) -> list[LogEntry]:
    """Fetch until `expected` entries arrived (bounded), then check nothing else waits."""
    entries: list[LogEntry] = []
    deadline = time.monotonic() + timeout
    while len(entries) < expected:
        assert time.monotonic() < deadline, f"got {len(entries)} of {expected} entries"
        entries.extend(log.fetch(100))
    entries.extend(log.fetch(100))
    return entries


def test_events_written_while_kafka_is_down_are_published_once_it_is_back(
    kafka_run: KafkaRun,
) -> None:
    expected = kafka_run.write([rec(f"doc-{i}", 1) for i in range(20)])
    expected |= kafka_run.write([rec(f"doc-{i}", 2) for i in range(0, 20, 2)])
    down = kafka_run.publisher(f"127.0.0.1:{closed_port()}", attempts=2)

    with pytest.raises(DependencyUnavailable) as raised:
        relay_outbox(source=kafka_run.source, publisher=down, batch_size=8)
    assert raised.value.details["dependency"] == "kafka"
    assert len(kafka_run.source.unpublished(1_000)) == 30

    current: dict[str, EventPublisher] = {"publisher": down}
    loop = RelayLoop(
        lambda: relay_outbox(source=kafka_run.source, publisher=current["publisher"], batch_size=8),
        poll_seconds=0.05,
        initial_backoff_seconds=0.05,
        max_backoff_seconds=0.3,
    )
    loop.start()
    try:
        wait_until(lambda: loop.status()["relay"]["consecutive_errors"] >= 3, 20, "relay failures")
        status = loop.status()["relay"]
        assert status["running"] and status["published"] == 0
        assert "DependencyUnavailable" in status["last_error"]
        expected |= kafka_run.write([rec(f"late-{i}", 1) for i in range(5)])
        assert len(kafka_run.source.unpublished(1_000)) == 35

        current["publisher"] = kafka_run.publisher()
        loop.wake()
        wait_until(lambda: not kafka_run.source.unpublished(1), 30, "the outbox to drain")
    finally:
        loop.stop(timeout=30)
    status = loop.status()["relay"]
    assert not status["running"]
    assert status["published"] == 35 and status["consecutive_errors"] == 0

    log = kafka_run.log()
    entries = read_all(log, expected=35)
    seen = {(e.event.document_id, e.event.revision) for e in entries}
    assert seen == expected and len(seen) == 35  # none lost, none extra after dedupe
    assert sorted({e.position for e in entries}) == list(range(1, 36))
    assert log.high_water() == kafka_run.store.high_water() == 35
    log.acknowledge(entries)


def test_unacknowledged_entries_go_to_the_next_member_of_the_group(kafka_run: KafkaRun) -> None:
    kafka_run.write([rec(f"doc-{i}", 1) for i in range(24)])
    assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    first = kafka_run.log("projector")
    acknowledged = first.fetch(5)
    assert acknowledged
    first.acknowledge(acknowledged)
    unacknowledged = read_all(first, expected=24 - len(acknowledged))
    assert len(unacknowledged) == 24 - len(acknowledged)
    first.close()  # a crash before acknowledging: nothing more is committed

    second = kafka_run.log("projector")
    again = read_all(second, expected=len(unacknowledged))
    assert sorted(e.position for e in again) == sorted(e.position for e in unacknowledged)
    assert not {e.position for e in again} & {e.position for e in acknowledged}
    second.acknowledge(again)


def test_a_new_namespace_is_read_without_waiting_for_the_metadata_age(kafka_run: KafkaRun) -> None:
    log = kafka_run.log(metadata_max_age_ms=120_000)
    assert log.fetch(10) == []  # a stable member of a group with no topic yet
    expected = kafka_run.write([rec(f"doc-{i}", 1) for i in range(15)])
    assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)

    started = time.monotonic()
    assert log.lag() == 15  # the probe sees the new topic
    entries = read_all(log, expected=15, timeout=30)
    assert {(e.event.document_id, e.event.revision) for e in entries} == expected
    # Far inside the metadata age: the fetch subscribed to the topic the probe saw.
    assert time.monotonic() - started < 30
    log.acknowledge(entries)
    assert log.lag() == 0


def test_a_member_that_cannot_join_leaves_and_a_new_one_reads_everything(
    kafka_run: KafkaRun,
) -> None:
    from kafka import KafkaConsumer  # after the adapters imported kafka quietly

    expected = kafka_run.write([rec(f"doc-{i}", 1) for i in range(20)])
    assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    topic = topic_for(kafka_run.prefix, NS)
    group = kafka_run.group()
    # A member that joined and then stopped polling: a rebalance waits for it to rejoin
    # (up to its 60 s poll interval), so a second member cannot become stable meanwhile.
    blocker = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_run.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
        max_poll_interval_ms=60_000,
    )
    try:
        wait_until(lambda: bool(blocker.poll(timeout_ms=200) or blocker.assignment()), 30, "join")

        log = kafka_run.log(join_timeout_ms=3_000)
        started = time.monotonic()
        with pytest.raises(DependencyUnavailable) as raised:
            log.fetch(100)
        waited = time.monotonic() - started
        assert raised.value.details["dependency"] == "kafka"
        assert "not a stable member" in raised.value.message
        assert "replaced" in raised.value.message
        assert 3 <= waited < 30
    finally:
        blocker.close(autocommit=False)

    entries = read_all(log, expected=20, timeout=60)  # a new member, from the start
    assert {(e.event.document_id, e.event.revision) for e in entries} == expected
    log.acknowledge(entries)
    assert log.lag() == 0


def test_relay_keeps_each_documents_order_across_three_partitions(kafka_run: KafkaRun) -> None:
    documents = [f"doc-{i}" for i in range(12)]
    revisions = 10
    shuffle = random.Random(7)
    for revision in range(1, revisions + 1):
        batch = [rec(doc, revision, body=f"b{revision}") for doc in documents]
        shuffle.shuffle(batch)
        kafka_run.write(batch[:5])
        kafka_run.write(batch[5:])
    total = len(documents) * revisions
    published = relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=7)
    assert published == total

    # What the broker holds: one partition per document, positions rising per partition.
    raw = _read_partitions(kafka_run.bootstrap, topic_for(kafka_run.prefix, NS), total)
    partition_of: dict[str, set[int]] = defaultdict(set)
    for partition, records in raw.items():
        positions = [int(dict(r.headers)[POSITION_HEADER]) for r in records]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        for record in records:
            partition_of[record.key.decode()].add(partition)
    assert all(len(parts) == 1 for parts in partition_of.values())
    # Kafka's default partition for a key, whichever client published: a switch of the
    # client keeps every document on its partition.
    keys = sorted(partition_of)
    hashes = murmur2_many([k.encode() for k in keys]).tolist()
    assert {k: {(h & 0x7FFFFFFF) % 3} for k, h in zip(keys, hashes, strict=True)} == partition_of
    assert len({p for parts in partition_of.values() for p in parts}) > 1

    # What a projector sees: every document's revisions in order, positions rising.
    entries = read_all(kafka_run.log(), expected=total)
    assert len(entries) == total
    by_document: dict[str, list[LogEntry]] = defaultdict(list)
    for entry in entries:
        by_document[entry.event.document_id].append(entry)
    for doc_entries in by_document.values():
        assert [e.event.revision for e in doc_entries] == list(range(1, revisions + 1))
        assert [e.position for e in doc_entries] == sorted(e.position for e in doc_entries)


def _read_partitions(bootstrap: str, topic: str, expected: int) -> dict[int, list[Any]]:
    """Every record of `topic`, by partition, read without a group."""
    from kafka import KafkaConsumer  # after the adapters imported kafka quietly
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
        ]
        assert len(partitions) == 3
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: dict[int, list[Any]] = defaultdict(list)
        deadline = time.monotonic() + 30
        while sum(len(r) for r in records.values()) < expected:
            assert time.monotonic() < deadline, "timed out reading the topic"
            for partition, batch in consumer.poll(timeout_ms=200).items():
                records[partition.partition].extend(batch)
        return dict(records)
    finally:
        consumer.close(autocommit=False)


def test_log_reports_kafka_unavailable_instead_of_hanging(kafka_run: KafkaRun) -> None:
    down = make_log(
        kafka_run.client,
        KafkaLogSettings(
            f"127.0.0.1:{closed_port()}", group_id=f"{kafka_run.run}-down", connect_timeout_s=1.0
        ),
    )
    try:
        for call in (lambda: down.fetch(10), down.high_water):
            with pytest.raises(DependencyUnavailable) as raised:
                call()
            assert raised.value.details["dependency"] == "kafka"
        down.reset()  # nothing fetched, nothing to rewind
        down.acknowledge([])
    finally:
        down.close()


def group_owners(bootstrap: str, group: str) -> list[set[int]]:
    """The partitions each member of a Stable `group` owns, as the broker assigned them
    (an empty list while the group rebalances)."""
    from kafka import KafkaAdminClient  # after the adapters imported kafka quietly

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    if described["group_state"] != "Stable":
        return []
    return [
        {p for topic in m["member_assignment"]["assigned_partitions"] for p in topic["partitions"]}
        for m in described["members"]
    ]


class Member:
    """One projector-like member of a consumer group, fetching in a thread of its own (a
    member that stops polling holds a rebalance up): it acknowledges what it fetches
    while `acknowledging` is set, and keeps every entry it was handed."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.received: list[LogEntry] = []
        self.acknowledging = threading.Event()
        self.acknowledging.set()
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.log.fetch(10)
                self.received.extend(e for e in batch if isinstance(e, LogEntry))
                if batch and self.acknowledging.is_set():
                    self.log.acknowledge(batch)
            except DependencyUnavailable as exc:  # a rebalance's failed commit: go on
                self.errors.append(exc)
                time.sleep(0.1)
            except BaseException as exc:  # kept for the test's assertion message
                self.errors.append(exc)
                raise

    def stop(self) -> None:
        """Stop fetching (a crash: nothing more is acknowledged) and leave the group."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()
        self.log.close()


@pytest.mark.parametrize("other_client", KAFKA_CLIENTS)
def test_two_members_split_the_log_and_a_crashed_members_events_go_to_the_other(
    kafka_run: KafkaRun, other_client: str
) -> None:
    """Members of either client share one group (a rolling switch of the client): the
    partitions are split, everything acknowledged is committed once, and what a member
    fetched without acknowledging goes to the survivor after the rebalance."""
    first = kafka_run.write([rec(f"doc-{i}", 1) for i in range(30)])
    publisher = kafka_run.publisher()
    assert relay_outbox(source=kafka_run.source, publisher=publisher, batch_size=50) == 30
    watcher = kafka_run.log("projector")  # never fetches: reads the group's lag
    a = Member(kafka_run.log("projector"))
    b = Member(kafka_run.log("projector", client=other_client))
    try:
        wait_until(lambda: watcher.lag() == 0, 60, "the group to acknowledge everything")
        received = {(e.event.document_id, e.event.revision) for e in a.received + b.received}
        assert received == first
        # The broker's view: one generation, each member owning its own partitions.
        wait_until(
            lambda: (
                len(owners := group_owners(kafka_run.bootstrap, kafka_run.group())) == 2
                and all(owners)
            ),
            60,
            "both members to own partitions",
        )
        owners = group_owners(kafka_run.bootstrap, kafka_run.group())
        assert sorted(p for parts in owners for p in parts) == [0, 1, 2]
        positions_before = {e.position for e in a.received + b.received}

        a.acknowledging.clear()  # a fetches and never acknowledges from here on
        b_before = len(b.received)
        second = kafka_run.write([rec(f"doc-{i}", 2) for i in range(30)])
        assert relay_outbox(source=kafka_run.source, publisher=publisher, batch_size=50) == 30
        wait_until(
            lambda: {e.event.revision for e in a.received} >= {2},
            60,
            f"a to fetch revision 2 (errors {a.errors}, {b.errors})",
        )
        a.stop()  # crashed with unacknowledged events
        wait_until(lambda: watcher.lag() == 0, 60, "b to take over and acknowledge")
        taken = b.received[b_before:]
        assert {(e.event.document_id, e.event.revision) for e in taken} == second
        assert not {e.position for e in taken} & positions_before  # committed: not again
        assert {e.position for e in a.received if e.event.revision == 2} <= {
            e.position for e in taken
        }
    finally:
        a.stop()
        b.stop()


def test_a_member_polling_briefly_still_completes_its_join(kafka_run: KafkaRun) -> None:
    """The rebalance stall of sessions 16-17: kafka-python 3.0 applies a completed
    JoinGroup/SyncGroup only while a poll waits for it, and a pattern subscription spends
    the start of every poll refreshing metadata; with polls shorter than that refresh the
    join never took (a 1 ms poll failed every time, as a 500 ms one sometimes did under
    load). A member now waits across the rebalance while joining, whatever its poll
    timeout; librdkafka joins in its own thread."""
    expected = kafka_run.write([rec(f"doc-{i}", 1) for i in range(30)])
    assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    for attempt in range(2):  # the first member joins a new group, the second a used one
        log = kafka_run.log(poll_timeout_ms=1, join_timeout_ms=12_000)
        entries = read_all(log, expected=30, timeout=30)
        assert {(e.event.document_id, e.event.revision) for e in entries} == expected
        if attempt:
            log.acknowledge(entries)
        log.close()
    assert kafka_run.log().lag() == 0


class PausableMember:
    """A plain kafka-python member of a group whose polls the test switches off and on:
    while paused it keeps heartbeating but does not rejoin, so a rebalance waits for it."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        from kafka import KafkaConsumer  # after the adapters imported kafka quietly

        self.consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=60_000,
        )
        self._polling = threading.Event()
        self._polling.set()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._polling.is_set():
                self._idle.clear()
                self.consumer.poll(timeout_ms=100)
            else:
                self._idle.set()
                time.sleep(0.01)

    def pause(self) -> None:
        self._polling.clear()
        assert self._idle.wait(timeout=30)

    def resume(self) -> None:
        self._polling.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.consumer.close(autocommit=False)


@pytest.mark.parametrize("kafka_run", ["kafka-python"], indirect=True)
def test_a_rejoin_that_completes_between_polls_is_not_lost(kafka_run: KafkaRun) -> None:
    """The CI failure of session 23: kafka-python 3.0.12 applies a completed JoinGroup /
    SyncGroup only in a poll that waits for it, and a join for a new topic (a pattern
    subscription's change) already records, in the join itself, what `need_rejoin()`
    compares. A poll that timed out before the join completed left the member
    `rebalancing` with no rejoin due: no later poll joined again, heartbeats stayed off,
    the broker dropped the member, and `fetch` gave up after its join timeout. Here the
    join is held up by a paused second member until the poll that sent it has returned,
    then completes with no poll waiting; the log's next fetch must still read the topic."""
    from kafka.structs import MemberState  # after the adapters imported kafka quietly

    group = kafka_run.group()
    # Room for a loaded machine: the steps between this member's polls may take long, and
    # once the join completed unseen the broker keeps the member only a session timeout.
    log = kafka_run.log(
        metadata_max_age_ms=120_000, session_timeout_ms=20_000, max_poll_interval_ms=60_000
    )
    assert log.fetch(10) == []  # the leader of a group with no topic yet
    # The other member reads a topic of its own (created by its subscription, dropped
    # with the run's topics): the new namespace's partitions all go to this member.
    other = PausableMember(kafka_run.bootstrap, group, f"{kafka_run.prefix}.other")
    try:
        # The second member's join waits for this one to rejoin, which it does in fetch.
        wait_until(
            lambda: log.fetch(10) == [] and len(group_owners(kafka_run.bootstrap, group)) == 2,
            60,
            "two stable members",
        )
        other.pause()
        expected = kafka_run.write([rec(f"doc-{i}", 1) for i in range(15)])
        assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
        assert log.lag() == 15

        # What a fetch's first poll does when the new topic arrives, with the rebalance held
        # up until that poll has returned: the member sends its JoinGroup and gives up on it.
        consumer = log._consumer  # type: ignore[attr-defined]
        consumer.topics()  # the pattern subscription takes the new topic
        deadline = time.monotonic() + 30
        while consumer.group_metadata().state == MemberState.STABLE:
            assert time.monotonic() < deadline, "the member never started its rejoin"
            assert consumer.poll(timeout_ms=200) == {}
        other.resume()  # the rebalance completes; no poll of this member waits for it
        wait_until(
            lambda: len(group_owners(kafka_run.bootstrap, group)) == 2,
            30,
            "the broker to complete the rebalance",
        )
        assert consumer.group_metadata().state == MemberState.REBALANCING  # not applied

        entries = read_all(log, expected=15, timeout=30)
        assert {(e.event.document_id, e.event.revision) for e in entries} == expected
        log.acknowledge(entries)
        assert log.lag() == 0
    finally:
        other.close()


@pytest.mark.parametrize("kafka_run", ["confluent"], indirect=True)
def test_a_rebalance_during_a_fetch_leaves_what_it_revoked_to_the_next_owner(
    kafka_run: KafkaRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second member joins while the first is inside a fetch that already holds
    events: the rebalance revokes every partition (eager protocol) before anything was
    acknowledged. The fetch returns none of what it held of them, so each event reaches
    exactly one member once — before, the first member returned them all (applied
    there) and their next owners, the first member itself for a partition it kept,
    delivered them again from the committed offsets. The broker, the group and both
    members are real; the first member's consumer only holds its second `consume` until
    the revoke was served (returning what it fetched meanwhile, as a call that served
    the revoke after queued messages does), so the join lands inside the fetch."""
    import confluent_kafka

    from projector.adapters import confluent_log

    written = kafka_run.write([rec(f"doc-{i}", 1) for i in range(30)])
    assert relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    second: list[Member] = []
    instances: list[Any] = []

    class JoinedMidFetch(confluent_kafka.Consumer):
        handed = 0
        revoked = False  # the adapter's `on_revoke` ran

        def subscribe(self, topics: Any, *args: Any, **kwargs: Any) -> Any:
            on_revoke = kwargs.get("on_revoke")

            def revoke(consumer: Any, partitions: Any) -> None:
                self.revoked = True
                if on_revoke is not None:
                    on_revoke(consumer, partitions)

            kwargs["on_revoke"] = revoke
            return super().subscribe(topics, *args, **kwargs)

        def consume(self, *args: Any, **kwargs: Any) -> Any:
            if self is not instances[0] or not self.handed or second:
                messages = super().consume(*args, **kwargs)
                self.handed += len(messages)
                return messages
            second.append(Member(kafka_run.log("projector")))  # joins: a rebalance
            deadline = time.monotonic() + 30
            held: list[Any] = []  # fetched before the revoke, returned with it
            # Until the revoke was served (inside consume). Not "until the assignment is
            # empty": the revoke, the rejoin and the next assignment can all be served
            # in one call, and the empty assignment is then never seen (a CI failure).
            while not self.revoked:
                assert time.monotonic() < deadline, (
                    f"no rebalance revoked the partitions ({second[0].errors})"
                )
                time.sleep(0.05)  # calls that do not wait, as the fetch makes them
                held.extend(super().consume(*args, **kwargs))
            # What was fetched before the revoke of a partition this member owns again
            # is outdated: one real call drops it (librdkafka's fetch of the partition
            # starts over from the committed offset); these merged calls drop it here.
            owned = {(tp.topic, tp.partition) for tp in self.assignment()}
            return [m for m in held if (m.topic(), m.partition()) not in owned]

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        consumer = JoinedMidFetch(*args, **kwargs)
        instances.append(consumer)
        return consumer

    monkeypatch.setattr(confluent_log, "Consumer", instrumented)
    first = kafka_run.log("projector", client="confluent")
    watcher = kafka_run.log("projector")  # never fetches: reads the group's lag
    received: list[LogEntry] = []
    deadline = time.monotonic() + 60
    try:
        while not second or watcher.lag():
            assert time.monotonic() < deadline, f"lag {watcher.lag()}, {len(received)} here"
            batch = first.fetch(1_000)
            received.extend(e for e in batch if isinstance(e, LogEntry))
            first.acknowledge(batch)
        assert instances[0].handed > 0  # the join came after events were fetched
        taken = received + second[0].received
        assert second[0].received, "the second member took no partition"
        assert sorted(e.position for e in taken) == sorted({e.position for e in taken})
        assert {(e.event.document_id, e.event.revision) for e in taken} == written
    finally:
        for member in second:
            member.stop()
