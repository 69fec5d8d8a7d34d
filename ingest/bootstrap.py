"""The only module of ingest that picks adapters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from contracts.events import LogEntry
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.model import FlowLimits
from ingest.pacing import ChangeSignal, WriteFlow
from ingest.ports import JobStore, RecordStore, StoreMaintenance
from ingest.relay import relay_outbox
from ingest.relay_ports import EventPublisher

if TYPE_CHECKING:
    from contracts.migrations import Migration

__all__ = [
    "backups_dir",
    "canonical_db_path",
    "describe_store",
    "embedded_store",
    "job_store",
    "kafka_relay_step",
    "migrate_database",
    "server_store",
    "server_write_flow",
    "store_maintenance",
]


# How often a paced server-mode writer reads its namespace's backlog (one indexed
# query) without being told the projector moved: the projector's commits notify
# `PROJECTED_CHANNEL` (its migration 0007), which wakes the writer at once; this is the
# safety net for a notification lost while the listener reconnects (session 24's poll
# every 50 ms made ~100 reads a 2,000-record POST: ~50 calls per 1k records).
SERVER_SIGNALLED_POLL_SECONDS = 1.0
PROJECTED_CHANNEL = "orrery_projected"
# Outbox batches a relay step publishes at most (a step that published fewer drained the
# outbox).
RELAY_MAX_BATCHES = 20


def canonical_db_path(data_dir: Path) -> Path:
    return data_dir / "orrery.sqlite"


def embedded_store(
    data_dir: Path,
    *,
    on_committed: Callable[[list[LogEntry]], None] | None = None,
    on_positions: Callable[[list[tuple[str, int]]], None] | None = None,
    keep_vectors: bool = False,
) -> RecordStore:
    """The canonical store of the embedded deployment: SQLite with its outbox;
    `on_committed` gets each committed batch's outbox events (the log of a projector in
    the same process, which then need not read and decode them again). `keep_vectors`:
    keep each vector's float32 bytes beside the record (`vector_f32`) for a relay to
    ship (server mode on the SQLite file; the embedded projector reads no Kafka
    message, so it has no use for them)."""
    return SqliteRecordStore(
        canonical_db_path(data_dir),
        on_committed=on_committed,
        on_positions=on_positions,
        keep_vectors=keep_vectors,
    )


def migrate_database(
    database_url: str,
    migrations: list[Migration] | None = None,
    *,
    component: str = "ingest",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Apply the pending PostgreSQL migrations of `component` (by default the canonical
    store's own; another package passes its set, `contracts.migrations`): (applied,
    already there).

    Raises `MigrationMismatch` when an applied migration was edited (fatal at start)."""
    from ingest.adapters.postgres_db import migrate

    report = migrate(database_url, migrations, component=component)
    return report.applied, report.already


def describe_store(data_dir: Path, database_url: str | None) -> str:
    """Which canonical store server mode uses, for the start-up line (no password)."""
    if database_url:
        from ingest.adapters.postgres_db import redact

        return f"PostgreSQL at {redact(database_url)}"
    return (
        f"SQLite at {canonical_db_path(data_dir)} (one host only; set ORRERY_DATABASE_URL "
        "for PostgreSQL)"
    )


def server_store(data_dir: Path, database_url: str | None) -> RecordStore:
    """The canonical store of server mode: PostgreSQL (migrated first) when a URL is
    given, else the single-host SQLite file."""
    if not database_url:
        return embedded_store(data_dir, keep_vectors=True)
    from ingest.adapters.postgres_store import PostgresRecordStore

    migrate_database(database_url)
    return PostgresRecordStore(database_url)


def server_write_flow(
    database_url: str | None, limits: FlowLimits
) -> tuple[WriteFlow, Callable[[], None]] | None:
    """How server-mode ingest paces writers per namespace, and what closes it: by the
    namespace's outbox rows the projector has not applied (PostgreSQL, every package
    migrated: `ingest.adapters.postgres_backlog`); None without a database URL (the
    single-host SQLite file: not paced) or without a bound (`max_lag_events` 0)."""
    if not database_url or not limits.max_lag_events:
        return None
    from ingest.adapters.postgres_backlog import PostgresBacklog
    from ingest.adapters.postgres_db import PostgresListener

    backlog = PostgresBacklog(database_url, count_limit=limits.max_lag_events + 1)
    changes = ChangeSignal()
    listener = PostgresListener(
        database_url, PROJECTED_CHANNEL, changes.notify, name="orrery-projected-signal"
    )
    flow = WriteFlow(
        backlog,
        limits,
        poll_seconds=SERVER_SIGNALLED_POLL_SECONDS,
        blocking=True,
        changes=changes,
    )
    listener.start()

    def close() -> None:
        listener.close()
        backlog.close()

    return flow, close


def job_store(data_dir: Path, database_url: str | None) -> JobStore:
    """Where ChonkyDB's async bulk jobs live: the PostgreSQL database of the canonical
    store (migrated first) when a URL is given, else a SQLite file under `data_dir`
    (shared by the processes of one host)."""
    if not database_url:
        from ingest.adapters.sqlite_jobs import SqliteJobStore

        data_dir.mkdir(parents=True, exist_ok=True)
        return SqliteJobStore(data_dir / "chonkydb_jobs.sqlite")
    from ingest.adapters.postgres_jobs import PostgresJobStore

    migrate_database(database_url)
    return PostgresJobStore(database_url)


def kafka_relay_step(
    data_dir: Path,
    *,
    database_url: str | None = None,
    bootstrap_servers: str,
    topic_prefix: str,
    partitions: int,
    batch_size: int,
    client: str = "confluent",
) -> tuple[Callable[[], int], Callable[[], None], Callable[[], int]]:
    """One relay step (outbox → Kafka), the function that closes its resources, and the
    outbox depth (rows not published yet, for metrics). `client` picks the Kafka client:
    "confluent" (librdkafka) or "kafka-python"."""
    from ingest.adapters.kafka_wire import KafkaPublisherSettings
    from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
    from ingest.relay_ports import OutboxRelaySource

    source: OutboxRelaySource
    if database_url:
        from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader

        migrate_database(database_url)
        source = PostgresOutboxReader(database_url)
    else:
        source = SqliteOutboxReader(canonical_db_path(data_dir))
    settings = KafkaPublisherSettings(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, partitions=partitions
    )
    publisher: EventPublisher
    # Imported here: the embedded deployment never loads a Kafka client, and each
    # deployment only the one it uses.
    if client == "confluent":
        from ingest.adapters.confluent_publisher import ConfluentEventPublisher

        publisher = ConfluentEventPublisher(settings)
    elif client == "kafka-python":
        from ingest.adapters.kafka_publisher import KafkaEventPublisher

        publisher = KafkaEventPublisher(settings)
    else:
        raise ValueError(f"unknown Kafka client {client!r} (confluent or kafka-python)")
    step = functools.partial(
        relay_outbox,
        source=source,
        publisher=publisher,
        batch_size=batch_size,
        max_batches=RELAY_MAX_BATCHES,
    )

    def close() -> None:
        publisher.close()
        source.close()

    return step, close, source.pending


def outbox_signal(
    database_url: str | None, on_rows: Callable[[], None]
) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """What starts and what stops the calls of `on_rows` (a relay's `wake`) whenever
    outbox rows were committed, by any process (PostgreSQL: migration 0009's
    notifications, `PostgresOutboxSignal`); None for the single-host SQLite file, whose
    writers share the relay's process or poll."""
    if not database_url:
        return None
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxSignal

    signal = PostgresOutboxSignal(database_url, on_rows)
    return signal.start, signal.close


def store_maintenance(
    data_dir: Path,
    database_url: str | None,
    *,
    exclusive: Callable[[], AbstractContextManager[None]],
    log_is_outbox: bool,
) -> StoreMaintenance:
    """Backups and compaction of the canonical store: the SQLite file under `data_dir`
    (backups in `data_dir/backups`, where the temporary directories of backups that
    died are removed now), or, with PostgreSQL, refusals naming its tools."""
    if database_url:
        from ingest.adapters.postgres_maintenance import PostgresStoreMaintenance

        return PostgresStoreMaintenance()
    from ingest.adapters.sqlite_maintenance import SqliteStoreMaintenance, sweep_backup_temps

    sweep_backup_temps(backups_dir(data_dir))
    return SqliteStoreMaintenance(
        canonical_db_path(data_dir),
        backups_dir(data_dir),
        exclusive=exclusive,
        log_is_outbox=log_is_outbox,
    )


def backups_dir(data_dir: Path) -> Path:
    return data_dir / "backups"
