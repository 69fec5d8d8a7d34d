"""A broker restart under the relay and a projector, for each Kafka client: every row
written before, during and after it reaches the projector, and the group's commits end
covering every entry (nothing the relay marked sent or a projector acknowledged is lost).

The shared harness broker serves every other test, so this one starts a broker of its own
(`tests/harness/servers.py up --only kafka` in a temporary directory, ~20 s), kills it
(SIGKILL: no clean shutdown) and starts the same command again on the same data.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts.errors import DependencyUnavailable
from contracts.events import LogEntry
from ingest.adapters.kafka_wire import KafkaPublisherSettings
from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.entrypoints.relay import RelayLoop
from ingest.relay import relay_outbox
from projector.adapters.kafka_wire import KafkaLogSettings
from tests.e2e.test_kafka_relay_faults import rec, wait_until
from tests.harness.servers import kafka_probe
from tests.kafka_clients import KAFKA_CLIENTS, make_log, make_publisher

pytestmark = [pytest.mark.servers, pytest.mark.slow, pytest.mark.timeout(300)]

HARNESS = Path(__file__).resolve().parents[1] / "harness" / "servers.py"


class Broker:
    """A single Kafka broker of this test, restartable on its data."""

    def __init__(self, base: Path) -> None:
        self.env = {**os.environ, "ORRERY_SERVERS_DIR": str(base)}
        subprocess.run(
            [sys.executable, str(HARNESS), "up", "--only", "kafka"],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=240,
        )
        state = json.loads((base / "servers.json").read_text())
        kafka = state["servers"]["kafka"]
        self.pid = int(kafka["pid"])
        self.bootstrap = str(kafka["url"])
        self.port = int(self.bootstrap.rpartition(":")[2])
        self.argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        self.cwd = os.readlink(f"/proc/{self.pid}/cwd")
        self.process: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)
        else:
            wait_until(lambda: not Path(f"/proc/{self.pid}").exists(), 30, "the broker to die")

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.process.pid
        wait_until(lambda: kafka_probe(self.port), 120, "the broker to answer again")


def _or_error(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as exc:  # a diagnostic: the failure message carries it
        return repr(exc)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    base = tmp_path_factory.mktemp("kafka-restart")
    started = Broker(base)
    yield started
    with contextlib.suppress(ProcessLookupError):
        os.kill(started.pid, signal.SIGKILL)
    if started.process is not None:
        started.process.wait(timeout=30)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_nothing_acknowledged_is_lost_across_a_broker_restart(
    broker: Broker, client: str, tmp_path: Path
) -> None:
    run = f"restart-{client}-{time.monotonic_ns()}"
    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    source = SqliteOutboxReader(tmp_path / "orrery.sqlite")
    publisher = make_publisher(
        client,
        KafkaPublisherSettings(
            broker.bootstrap,
            topic_prefix=run,
            partitions=3,
            replication_factor=1,
            request_timeout_ms=5_000,
            ack_timeout_ms=10_000,
            bootstrap_timeout_ms=3_000,
            connect_timeout_s=1.0,
            attempts=2,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
        ),
    )
    log = make_log(
        client,
        KafkaLogSettings(
            broker.bootstrap,
            group_id=run,
            topic_prefix=run,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=20_000,
            metadata_max_age_ms=1_000,
            poll_timeout_ms=200,
            join_timeout_ms=30_000,
            request_timeout_ms=5_000,
            bootstrap_timeout_ms=5_000,
        ),
    )
    relay = RelayLoop(
        lambda: relay_outbox(source=source, publisher=publisher, batch_size=20),
        poll_seconds=0.05,
        initial_backoff_seconds=0.05,
        max_backoff_seconds=0.5,
    )
    # The projector commits a batch's effects, then acknowledges it (projector.service):
    # an entry is applied once fetched here. An acknowledgement that raised may still
    # have landed (a commit in flight when the broker died: its answer is lost), and then
    # its entries are rightly not delivered again; so "nothing is lost" means every row
    # was applied, and the group's commits finally cover every entry (checked below).
    applied: list[LogEntry] = []
    crashed: list[Exception] = []
    stop = threading.Event()

    def project() -> None:  # fetch, "apply", acknowledge; errors are retried
        while not stop.is_set():
            try:
                batch = log.fetch(25)
                applied.extend(e for e in batch if isinstance(e, LogEntry))
                log.acknowledge(batch)
            except DependencyUnavailable:  # the broker is down: try again
                time.sleep(0.2)
            except Exception as exc:  # a defect: the failure message reports it
                crashed.append(exc)
                raise

    projector = threading.Thread(target=project, daemon=True)
    written = set()
    try:
        relay.start()
        projector.start()
        for i in range(10):
            written |= {
                (o.document_id, o.revision)
                for o in store.write([rec(f"doc-{i}-{j}", 1) for j in range(20)])
            }
        wait_until(lambda: not source.unpublished(1), 60, "the relay to publish")
        wait_until(lambda: len(applied) >= 100, 60, "some entries applied")
        broker.kill()
        for i in range(10, 20):  # written while the broker is down
            written |= {
                (o.document_id, o.revision)
                for o in store.write([rec(f"doc-{i}-{j}", 1) for j in range(20)])
            }
        time.sleep(2)
        broker.start()
        wait_until(lambda: not source.unpublished(1), 120, "the relay to publish after it")
        seen = lambda: {(e.event.document_id, e.event.revision) for e in applied}  # noqa: E731
        try:
            wait_until(lambda: seen() >= written, 120, "the projector to apply everything")
        except AssertionError as exc:
            missing = sorted(written - seen())
            raise AssertionError(
                f"{exc}: {len(missing)} never delivered, e.g. {missing[:5]}; "
                f"last applied {[(e.partition, e.position) for e in applied[-5:]]}; "
                f"group lag {_or_error(log.lag)}; projector crashed: {crashed!r}"
            ) from exc
    finally:
        stop.set()
        relay.stop(timeout=30)
        projector.join(timeout=60)
        log.close()
        publisher.close()
        source.close()
        store.close()
    assert len(written) == 400
    # A fresh member of the group finds nothing left: every acknowledgement was committed
    # durably, across the restart.
    again = make_log(
        client,
        KafkaLogSettings(
            broker.bootstrap,
            group_id=run,
            topic_prefix=run,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
            poll_timeout_ms=500,
        ),
    )
    try:
        wait_until(lambda: again.lag() == 0, 60, "the group's lag to read 0")
        assert again.fetch(100) == []
    finally:
        again.close()
