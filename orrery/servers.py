"""Composition root of the server deployment: Kafka, OpenSearch, Qdrant, Redis.

Roles run as separate processes (`orrery ingest-api`, `orrery relay`, `orrery project`,
`orrery query-worker`) or together (`orrery serve --mode servers`). With
`ORRERY_DATABASE_URL` every role keeps its state in PostgreSQL (records, outbox,
generation registry, writer lock; both packages' migrations are applied at start), so the
roles can run on any number of machines; a query worker then keeps nothing on disk and
needs `ORRERY_CURSOR_KEYS` and `ORRERY_QDRANT_URL`. Without the URL the canonical SQLite
database under `data_dir` holds it all and every role of one host shares it
(docs/deploy.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from fastapi import APIRouter, FastAPI

from contracts.auth import parse_api_keys
from contracts.embedding import Embedder
from contracts.pacing import Activity
from ingest.bootstrap import (
    RELAY_MAX_BATCHES,
    canonical_db_path,
    describe_store,
    job_store,
    kafka_relay_step,
    migrate_database,
    outbox_signal,
    server_store,
    server_write_flow,
)
from ingest.entrypoints.relay import RelayLoop
from ingest.ports import RecordStore
from ingest.settings import IngestSettings
from orrery.embedded import (
    STREAM_PATHS,
    generation_options,
    ingest_routers,
    observe_state,
    query_routers,
    store_admin_router,
)
from orrery.http import build_app
from orrery.telemetry import (
    CountingEmbedder,
    Observability,
    observed_projector_step,
    open_observability,
    query_observer,
    state_collector,
)
from orrery.ui import create_ui_router
from projector.adapters.file_lock import FileWriterLock
from projector.bootstrap import (
    ServerProjector,
    default_embedder,
    postgres_migrations,
    server_generation_admin,
    server_projector,
    warm_query_embedder,
    writer_lock_path,
)
from projector.entrypoints.admin_http import create_admin_router
from projector.entrypoints.worker import ProjectorLoop
from projector.generations import ORPHANED_AFTER, GenerationAdmin
from query.bootstrap import (
    cursor_codec,
    document_facts,
    scope_registry,
    server_qualifier,
    server_query_ports,
)
from query.bootstrap import postgres_migrations as query_migrations
from query.eligibility import EligibilityGate
from query.entrypoints.http import readiness
from query.settings import QuerySettings

__all__ = ["Role", "ServerStack", "check_settings", "migrate_all"]

log = logging.getLogger("orrery")


class Role(StrEnum):
    INGEST = "ingest"
    RELAY = "relay"
    PROJECTOR = "projector"
    QUERY = "query"


def migrate_all(database_url: str) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Apply every package's pending PostgreSQL migrations (ingest's canonical store, the
    projector's registry and ring statistics, then the query workers' KoutenDB store),
    each under the ledger's advisory lock: per component, (applied, already there).
    `MigrationMismatch` when an applied file was edited."""
    out = {"ingest": migrate_database(database_url)}
    for component, files in (postgres_migrations(), query_migrations()):
        out[component] = migrate_database(database_url, files, component=component)
    return out


def check_settings(settings: QuerySettings, roles: frozenset[Role]) -> None:
    """Refuse (`ValueError`, a message naming the setting) what cannot work across
    machines: with `ORRERY_DATABASE_URL`, the query role needs shared cursor keys (a
    cursor signed by one worker must verify on every other), and the projector and query
    roles need a Qdrant server (qdrant-client's local mode keeps vectors in a file of
    this host)."""
    if not settings.database_url:
        return
    if Role.QUERY in roles and not settings.cursor_keys.strip():
        raise ValueError(
            "ORRERY_DATABASE_URL is set but ORRERY_CURSOR_KEYS is not: every query worker "
            "must verify the continuation cursors the others sign; set the same "
            "ORRERY_CURSOR_KEYS (kid:secret,…) on every query worker (docs/deploy.md)"
        )
    if roles & {Role.PROJECTOR, Role.QUERY} and not settings.qdrant_url:
        raise ValueError(
            "ORRERY_DATABASE_URL is set but ORRERY_QDRANT_URL is not: the projector and "
            "query roles need a Qdrant server shared by every machine (qdrant-client's "
            "local mode keeps vectors in a file under data_dir)"
        )


def qdrant_client(settings: QuerySettings) -> Any:
    """A qdrant-client for the configured server, or local mode under `data_dir`."""
    from projector.adapters.qdrant_vectors import open_qdrant_client

    if settings.qdrant_url:
        return open_qdrant_client(url=settings.qdrant_url)
    return open_qdrant_client(path=str(settings.data_dir / "qdrant-local"))


# How long an idle relay waits between claims when the outbox's notifications wake it
# (PostgreSQL): a notification lost while its listener reconnects is claimed this late
# at most (the listener also wakes the relay after each reconnection).
RELAY_SIGNALLED_POLL_SECONDS = 2.0
# A woken relay claims no sooner than this after its previous claim step started: a
# stream of small commits (e.g. 32-record POSTs) is then published in batches of what
# came meanwhile, not one small batch a commit (which made the projector's batches small:
# session 25, `docs/bench/README.md`); a commit after a quiet spell is claimed at once.
RELAY_MIN_INTERVAL_SECONDS = 0.1


@dataclass(slots=True)
class ServerStack:
    """The roles of one server-mode process, started and stopped together."""

    settings: QuerySettings
    roles: frozenset[Role]
    app: FastAPI | None = None
    store: RecordStore | None = None
    relay: RelayLoop | None = None
    projector: ServerProjector | None = None
    projector_loop: ProjectorLoop | None = None
    admin: GenerationAdmin | None = None
    gate: EligibilityGate | None = None
    observability: Observability = field(default_factory=Observability)
    # `GET /v1/readiness`'s body (query role only; the banner waits on it).
    readiness: Callable[[], dict[str, Any]] | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def open(
        cls,
        settings: QuerySettings,
        roles: frozenset[Role],
        *,
        embedder: Embedder | None = None,
        span_exporter: Any = None,
    ) -> ServerStack:
        """The roles of this process; `span_exporter` receives the spans (with
        `settings.tracing`) instead of the OTLP endpoint."""
        check_settings(settings, roles)
        database_url = settings.database_url
        if database_url:
            # Nothing of this process goes under data_dir: it is not even created.
            migrate_all(database_url)
        else:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        db_path = canonical_db_path(settings.data_dir)
        stack = cls(settings, roles)
        grants = parse_api_keys(settings.api_keys)
        observability, close_observability = open_observability(
            settings, [role.value for role in roles], span_exporter=span_exporter
        )
        stack.observability = observability
        stack.closers.append(close_observability)
        metrics = observability.metrics
        log.info("canonical store: %s", describe_store(settings.data_dir, database_url))
        # The canonical store creates (or migrates) the schema every other role reads.
        # Every write route bounds a record by ORRERY_MAX_RECORD_BYTES (at most one Kafka
        # message here: `query.settings.record_ceiling`).
        store = server_store(settings.data_dir, database_url)
        stack.closers.append(store.close)
        if Role.INGEST in roles:
            stack.store = store
        if Role.RELAY in roles:
            step, close, outbox_depth = kafka_relay_step(
                settings.data_dir,
                database_url=settings.database_url,
                bootstrap_servers=settings.kafka_bootstrap,
                topic_prefix=settings.kafka_topic_prefix,
                partitions=settings.kafka_partitions,
                batch_size=settings.relay_batch_size,
                client=settings.kafka_client,
            )
            if metrics is not None:
                step = metrics.wrap_relay_step(step)
            state_collector(metrics, outbox_depth=outbox_depth)
            # On PostgreSQL the outbox's notifications wake the relay (`outbox_signal`):
            # it polls only as a safety net.
            signalled = bool(settings.database_url)
            stack.relay = relay = RelayLoop(
                step,
                poll_seconds=RELAY_SIGNALLED_POLL_SECONDS
                if signalled
                else settings.projector_poll_seconds * 4,
                min_interval_seconds=RELAY_MIN_INTERVAL_SECONDS if signalled else 0.0,
                drained_below=settings.relay_batch_size * RELAY_MAX_BATCHES if signalled else None,
            )
            stack.closers.append(close)
            signal = outbox_signal(settings.database_url, relay.wake)
            if signal is not None:
                start_signal, close_signal = signal
                start_signal()
                stack.closers.append(close_signal)
        needs_embedder = Role.PROJECTOR in roles or Role.QUERY in roles
        # Queries embed in a session of their own; an injected embedder serves both.
        query_embedder = embedder
        if needs_embedder and embedder is None:
            embedder = default_embedder(settings.embedder_threads, settings.embedding_cache_dir)
            if Role.QUERY in roles:
                query_embedder = warm_query_embedder(settings.query_embedder_threads)
        if metrics is not None:
            if embedder is not None:
                embedder = CountingEmbedder(embedder, metrics, "documents")
            if query_embedder is not None:
                query_embedder = CountingEmbedder(query_embedder, metrics, "queries")
        shared_qdrant = None
        if Role.PROJECTOR in roles or Role.QUERY in roles:
            shared_qdrant = qdrant_client(settings)
        if Role.PROJECTOR in roles:
            assert embedder is not None
            stack.projector = server_projector(
                db_path,
                lock_path=writer_lock_path(settings.data_dir),
                embedder=embedder,
                batch_size=settings.projector_batch_size,
                kafka_bootstrap=settings.kafka_bootstrap,
                kafka_topic_prefix=settings.kafka_topic_prefix,
                kafka_group=settings.kafka_group,
                kafka_session_timeout_ms=settings.kafka_session_timeout_ms,
                kafka_metadata_max_age_ms=settings.kafka_metadata_max_age_ms,
                kafka_join_timeout_ms=settings.kafka_join_timeout_ms,
                kafka_client=settings.kafka_client,
                opensearch_url=settings.opensearch_url,
                opensearch_index_prefix=settings.opensearch_index_prefix,
                opensearch_refresh_interval=settings.opensearch_refresh_interval,
                qdrant=shared_qdrant,
                qdrant_collection_prefix=settings.qdrant_collection_prefix,
                text_languages=settings.text_languages(),
                database_url=database_url,
            )
            stack.projector_loop = ProjectorLoop(
                observed_projector_step(observability, stack.projector.step),
                poll_seconds=settings.projector_poll_seconds,
            )
            stack.closers.append(stack.projector.close)
        routers: list[APIRouter] = []
        if Role.INGEST in roles:
            wake = stack.relay.wake if stack.relay is not None else None
            # Each namespace paced by its own backlog (issue 22), as embedded.
            paced = server_write_flow(database_url, IngestSettings().limits())
            if paced is not None:
                stack.closers.append(paced[1])
            routers += ingest_routers(
                settings,
                store,
                grants,
                vector_dimension=None if embedder is None else embedder.dimension,
                on_commit=wake,
                jobs=job_store(settings.data_dir, settings.database_url),
                backlog=None if paced is None else paced[0],
            )
            if stack.projector is not None:
                writer_lock = stack.projector.lock
            else:
                writer_lock = FileWriterLock(writer_lock_path(settings.data_dir))
                stack.closers.append(writer_lock.close)
            routers.append(
                store_admin_router(settings, exclusive=writer_lock.hold, log_is_outbox=False)
            )
        if Role.QUERY in roles:
            assert embedder is not None and query_embedder is not None
            ports, close_ports = server_query_ports(
                db_path,
                embedder=query_embedder,
                opensearch_url=settings.opensearch_url,
                opensearch_index_prefix=settings.opensearch_index_prefix,
                qdrant=shared_qdrant,
                qdrant_collection_prefix=settings.qdrant_collection_prefix,
                redis_url=settings.redis_url,
                cache_responses=settings.cache_responses,
                scopes=scope_registry(settings),
                cursors=cursor_codec(settings),
                max_answer_bytes=settings.max_answer_bytes,
                database_url=database_url,
                opensearch_search_type=settings.opensearch_search_type,
                record_cache_bytes=settings.record_cache_bytes,
                vector_hnsw_ef=settings.vector_hnsw_ef,
                vector_spread_ef_factor=settings.vector_spread_ef_factor,
                vector_spread_acorn_selectivity=settings.vector_spread_acorn_selectivity,
            )
            stack.closers.append(close_ports)
            ports = dataclasses.replace(ports, observer=query_observer(observability))
            loop = stack.projector_loop

            def wake_projector() -> bool:
                if loop is not None:
                    loop.wake()
                return False

            stack.admin, close_admin = server_generation_admin(
                db_path,
                projector=stack.projector,
                embedder=embedder,
                lock_path=writer_lock_path(settings.data_dir),
                opensearch_url=settings.opensearch_url,
                opensearch_index_prefix=settings.opensearch_index_prefix,
                opensearch_refresh_interval=settings.opensearch_refresh_interval,
                qdrant=shared_qdrant,
                qdrant_collection_prefix=settings.qdrant_collection_prefix,
                drive_log=wake_projector,
                options=generation_options(settings, ordered_log=False),
                text_languages=settings.text_languages(),
                database_url=database_url,
                index_shape=settings.index_shape,
                qualify=server_qualifier(settings, ports, qdrant=shared_qdrant),
            )
            stack.closers.append(close_admin)
            # Builds of other processes stay `building` while their heartbeat is fresh.
            for generation_id in stack.admin.ports.maintenance.fail_orphaned_builds(
                "the builder stopped before sealing (no heartbeat)",
                older_than=datetime.now(UTC) - ORPHANED_AFTER,
            ):
                log.warning("generation %s: its builder is gone; marked failed", generation_id)
            # A promote killed between the pointer flip and the alias mirror heals here.
            stack.admin.mirror_live_aliases()
            # The requests in flight: the gate's re-checks run in the gaps between them.
            activity = Activity()
            stack.gate, readers = query_routers(
                settings,
                ports,
                grants,
                admin=stack.admin,
                status=stack.status,
                backend="servers",
                activity=activity,
            )
            observe_state(
                metrics,
                routing=ports.routing,
                status=stack.status,
                gate=stack.gate,
                admin=stack.admin,
            )
            stack.readiness = functools.partial(readiness, ports.routing, stack.status, stack.gate)
            routers.append(create_admin_router(stack.admin, admin_key=settings.admin_key))
            routers.append(create_ui_router())
            stack.app = build_app(
                "Orrery",
                [*readers, *routers],
                max_body_bytes=settings.max_body_bytes,
                stream_paths=STREAM_PATHS,
                max_stream_bytes=settings.max_import_bytes,
                api_key_header=settings.api_key_header,
                document_facts=document_facts(
                    settings, None if embedder is None else embedder.dimension
                ),
                observability=observability,
                activity=activity,
            )
        elif routers:
            stack.app = build_app(
                "Orrery ingest",
                routers,
                max_body_bytes=settings.max_body_bytes,
                stream_paths=STREAM_PATHS,
                max_stream_bytes=settings.max_import_bytes,
                api_key_header=settings.api_key_header,
                document_facts=document_facts(
                    settings, None if embedder is None else embedder.dimension
                ),
                observability=observability,
            )
        if not grants and stack.app is not None:
            log.warning("no API keys configured (ORRERY_API_KEYS): the API is open")
        return stack

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": "servers", "roles": sorted(self.roles)}
        if self.admin is not None:
            out["qualification"] = self.admin.live_qualification()
        if self.projector_loop is not None:
            out.update(self.projector_loop.status())
        if self.relay is not None:
            out.update(self.relay.status())
        tracing = self.observability.tracing
        if tracing is not None and tracing.exporting:
            out["tracing"] = tracing.status()
        return out

    def start(self) -> None:
        if self.relay is not None:
            self.relay.start()
        if self.projector_loop is not None:
            self.projector_loop.start()
        if self.gate is not None:
            self.gate.start()

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        if self.relay is not None:
            self.relay.stop()
        if self.projector_loop is not None:
            self.projector_loop.stop()
        for close in reversed(self.closers):
            close()
