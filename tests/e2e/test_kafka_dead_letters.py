"""Dead letters and readiness lag of a projector reading Kafka, against the harness broker.

The projector here is `project_batch` in process with the real `KafkaEventLog` (three
partitions per topic) and the embedded engines (tantivy, qdrant-edge) and registry;
readiness is the query worker's own `readiness()` over the same SQLite file.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.events import LogEntry, topic_for
from ingest.relay import relay_outbox
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.ports import Undecodable
from projector.service import BatchReport, project_batch
from query.adapters.sqlite_routing import SqliteRouting
from query.entrypoints.http import readiness
from tests.conftest import require_server
from tests.e2e.test_kafka_relay_faults import NS, KafkaRun, rec
from tests.fakes import FakeHashingEmbedder
from tests.kafka_clients import KAFKA_CLIENTS

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KafkaRun]:
    run = KafkaRun(require_server("kafka"), tmp_path, client=request.param)
    yield run
    run.close()


class Projector:
    """One in-process projector over the run's Kafka topics; `step()` applies a batch."""

    def __init__(self, run: KafkaRun) -> None:
        self.db = run.tmp / "orrery.sqlite"
        self.group = f"{run.run}-projector"
        self.state = SqliteProjectorState(self.db)
        self.lexical = TantivyLexicalIndex(run.tmp / "lexical")
        self.vectors = QdrantEdgeVectorIndex(run.tmp / "vectors")
        self.log = run.log("projector")
        run.closers += [self.state.close, self.lexical.close, self.vectors.close]
        self.step: Callable[[], BatchReport] = functools.partial(
            project_batch,
            log=self.log,
            state=self.state,
            lexical=self.lexical,
            vectors=self.vectors,
            embedder=FakeHashingEmbedder(16),
            cache=self.state,
            lexical_engine="tantivy",
            vector_engine="qdrant-edge",
            consumer=self.group,
            batch_size=50,
            dead_letters=self.state,
            health=self.state,
        )

    def run_until(self, done: Callable[[], bool], timeout: float = 60.0) -> list[BatchReport]:
        reports: list[BatchReport] = []
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"not done after {timeout}s: {reports}"
            reports.append(self.step())
        return reports


def produce_raw(run: KafkaRun, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    from kafka import KafkaProducer  # after the adapters imported kafka quietly

    producer = KafkaProducer(bootstrap_servers=run.bootstrap, request_timeout_ms=5_000)
    try:
        producer.send(
            topic_for(run.prefix, NS), key=b"doc-garbage", value=value, headers=headers
        ).get(timeout=10)
    finally:
        producer.close()


def test_garbage_on_the_topic_is_parked_and_the_projector_continues(
    kafka_run: KafkaRun, caplog: pytest.LogCaptureFixture
) -> None:
    kafka_run.write([rec(f"doc-{i}", 1) for i in range(5)])
    publisher = kafka_run.publisher()
    relay_outbox(source=kafka_run.source, publisher=publisher, batch_size=50)
    produce_raw(kafka_run, b"\x00not json", [])
    produce_raw(kafka_run, b'{"event_type": "record_changed"}', [("orrery-position", b"99")])
    kafka_run.write([rec(f"doc-{i}", 1) for i in range(5, 10)])
    relay_outbox(source=kafka_run.source, publisher=publisher, batch_size=50)

    projector = Projector(kafka_run)
    routing = SqliteRouting(projector.db)
    with caplog.at_level("ERROR", logger="orrery.projector"):
        reports = projector.run_until(lambda: projector.state.dead_letter_count() == 2)
        projector.run_until(lambda: projector.log.lag() == 0)
        projector.step()  # an empty fetch records the final measurement
    assert sum(r.parked for r in reports) == 2

    parked = projector.state.dead_letters()
    assert sorted(d.message.value for d in parked) == sorted(
        [b"\x00not json", b'{"event_type": "record_changed"}']
    )
    for letter in parked:
        assert letter.consumer == projector.group
        assert letter.message.where.startswith(f"kafka:{topic_for(kafka_run.prefix, NS)}/")
        assert letter.message.key == b"doc-garbage" and letter.message.reason
    by_value = {d.message.value: d.message for d in parked}
    # A header on a message that failed to decode is kept, never trusted as a position.
    assert by_value[b'{"event_type": "record_changed"}'].position is None
    assert by_value[b'{"event_type": "record_changed"}'].headers == (("orrery-position", b"99"),)
    assert sum("undecodable event at kafka:" in r.getMessage() for r in caplog.records) >= 2

    # Every real event after the garbage was applied, nothing is pending, readiness says so.
    (scope,) = routing.scopes()
    assert scope.document_count == 10
    ready = readiness(routing, None)
    assert ready["ready"] is True
    assert ready["projector_log"]["lag_events"] == 0
    assert ready["projector_log"]["dead_letters"] == 2

    # A restarted projector (same group) neither re-parks nor re-delivers them.
    projector.log.close()
    again = kafka_run.log("projector")
    assert again.fetch(10) == []
    assert projector.state.dead_letter_count() == 2


def test_readiness_waits_for_every_partition_not_the_highest_position(
    kafka_run: KafkaRun,
) -> None:
    """Three partitions deliver out of position order: having applied the newest
    position is not being caught up while another partition still holds events."""
    kafka_run.write([rec(f"doc-{i}", 1) for i in range(12)])
    relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    projector = Projector(kafka_run)
    routing = SqliteRouting(projector.db)
    projector.state.create_generation(
        NS,
        "objects",
        embedder_id="fake",
        embedder_dim=16,
        lexical_engine="tantivy",
        vector_engine="qdrant-edge",
        schema_digest="test",
        make_live=True,
    )

    entries: list[Any] = []
    while len(entries) < 12:
        entries.extend(projector.log.fetch(50))
    assert all(isinstance(e, LogEntry) for e in entries)
    newest = max(entries, key=lambda e: e.position)
    assert newest.position == 12
    # The projector applied only the newest event (its partition's batch came first).
    projector.state.commit(projector.group, newest.position, {})
    projector.log.acknowledge([newest])
    lag = projector.log.lag()
    projector.state.record_lag(projector.group, position=newest.position, lag_events=lag)

    ready = readiness(routing, None)
    (scope,) = ready["scopes"]
    assert scope["applied_position"] == ready["log_high_water"] == 12
    assert scope["lag_events"] == 0  # what the applied position alone claims
    assert lag > 0 and ready["projector_log"]["lag_events"] == lag
    assert ready["ready"] is False

    projector.log.acknowledge([e for e in entries if e is not newest])
    projector.state.record_lag(projector.group, position=12, lag_events=projector.log.lag())
    final = readiness(routing, None)
    assert final["ready"] is True, (final["projector_log"], final["scopes"])


def test_undecodable_entries_are_never_applied(kafka_run: KafkaRun) -> None:
    kafka_run.write([rec("doc-1", 1)])
    relay_outbox(source=kafka_run.source, publisher=kafka_run.publisher(), batch_size=50)
    produce_raw(kafka_run, b"[]", [])
    projector = Projector(kafka_run)
    projector.run_until(lambda: projector.state.dead_letter_count() == 1)
    projector.run_until(lambda: projector.log.lag() == 0)
    (letter,) = projector.state.dead_letters()
    assert isinstance(letter.message, Undecodable) and letter.message.position is None
    (scope,) = SqliteRouting(projector.db).scopes()
    assert scope.document_count == 1
