"""Composition root of the embedded deployment: ingest, projector and query worker in
one process, sharing one SQLite file and the generation directories.

This module (with `orrery.cli`) is the only place where the three packages
meet; import-linter allows exactly these imports.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from fastapi import APIRouter, FastAPI
from prometheus_client import Gauge

from contracts.auth import ApiKeyGrant, parse_api_keys
from contracts.embedding import Embedder
from contracts.events import LogEntry
from contracts.pacing import Activity
from contracts.progress import LogProgress
from ingest.bootstrap import canonical_db_path, embedded_store, job_store, store_maintenance
from ingest.entrypoints.admin_http import create_router as create_store_admin_router
from ingest.entrypoints.chonkydb_http import create_router as create_ingest_chonkydb_router
from ingest.entrypoints.http import WriteFlow
from ingest.entrypoints.http import create_router as create_ingest_router
from ingest.entrypoints.koutendb_http import IMPORT_PATH
from ingest.entrypoints.koutendb_http import create_router as create_ingest_koutendb_router
from ingest.pacing import WritePacer
from ingest.ports import JobStore, RecordStore
from ingest.settings import IngestSettings
from ingest.write_workers import WriteWorkers
from orrery.http import build_app
from orrery.telemetry import (
    CountingEmbedder,
    Metrics,
    Observability,
    observed_projector_step,
    open_observability,
    query_observer,
    state_collector,
    with_tracing_status,
)
from orrery.ui import create_ui_router
from projector.adapters.file_lock import OperatorLock
from projector.bootstrap import (
    CONSUMER,
    EmbeddedProjector,
    EmbedderFactory,
    default_embedder,
    embedded_generation_admin,
    embedded_projector,
    operator_lock,
    warm_query_embedder,
)
from projector.entrypoints.admin_http import create_admin_router
from projector.entrypoints.worker import ProjectorLoop
from projector.generations import GenerationAdmin, GenerationOptions
from projector.service import BatchReport
from query.adapters.sqlite_routing import SqliteRouting
from query.bootstrap import (
    cursor_codec,
    document_facts,
    embedded_query_ports,
    kouten_ports,
    query_limits,
    scope_registry,
)
from query.eligibility import EligibilityGate, ReportingLexicalSearch, ReportingVectorSearch
from query.entrypoints.chonkydb_http import create_router as create_query_chonkydb_router
from query.entrypoints.http import create_router as create_query_router
from query.entrypoints.http import readiness, ready_check
from query.entrypoints.koutendb_http import create_router as create_query_koutendb_router
from query.ports import Routing
from query.service import QueryPorts
from query.settings import QuerySettings

if TYPE_CHECKING:
    from query.adapters.postgres_routing import PostgresRouting

__all__ = [
    "STREAM_PATHS",
    "EmbeddedStack",
    "generation_options",
    "ingest_routers",
    "observe_state",
    "query_routers",
    "store_admin_router",
]

# Routes that read their body as a stream of JSON lines (`orrery.guard`).
STREAM_PATHS = (IMPORT_PATH,)

# A build that started in a process that is gone can never finish.
ORPHANED_BUILD = "the builder stopped before sealing (its process ended)"


def generation_options(settings: QuerySettings, *, ordered_log: bool = True) -> GenerationOptions:
    """The lifecycle knobs from the settings (`ordered_log`: False with Kafka)."""
    return GenerationOptions(
        batch_size=settings.gen_build_batch_size,
        pause_seconds=settings.gen_build_pause_seconds,
        catch_up_timeout_seconds=settings.gen_catch_up_timeout_seconds,
        max_promote_lag=settings.promote_max_lag_events,
        ordered_log=ordered_log,
        switch_interval_seconds=settings.gen_build_switch_interval_seconds,
        load_in_child=settings.gen_build_in_child,
        child_nice=settings.gen_build_child_nice,
        qualification=settings.qualification_thresholds(),
        vector_search=settings.vector_search(),
    )


class RegistryRouting(Routing, Protocol):
    """The routing of both registries (SQLite, PostgreSQL): the port plus the live
    document ids of a generation (`GET /v1/scopes/document_ids`)."""

    def document_ids(self, generation_id: str, galaxy: str | None = None) -> list[str]: ...


def _copy_verdicts(
    gate: EligibilityGate, engine: str, generation_id: str
) -> dict[str, bool] | None:
    return gate.copy_verdicts(generation_id, engine)


def eligibility_gate(
    settings: QuerySettings,
    admin: GenerationAdmin,
    routing: Routing,
    activity: Activity | None = None,
) -> EligibilityGate:
    """The gate of a query process; its periodic re-checks yield to `activity` (the
    process's HTTP requests in flight, `build_app(activity=…)`)."""
    return EligibilityGate(
        admin,
        routing,
        interval_seconds=settings.eligibility_interval_seconds,
        fallback=settings.coverage_fallback,
        background_share=settings.eligibility_background_share,
        recheck_share=settings.eligibility_recheck_share,
        max_interval_seconds=settings.eligibility_max_interval_seconds,
        yield_to=activity,
    )


def ingest_routers(
    settings: QuerySettings,
    store: RecordStore,
    grants: dict[str, ApiKeyGrant],
    *,
    vector_dimension: int | None,
    on_commit: Callable[[], None] | None,
    jobs: JobStore,
    flow: WriteFlow | None = None,
    backlog: WriteFlow | None = None,
    workers: WriteWorkers | None = None,
    on_events: Callable[[list[tuple[str, int]]], None] | None = None,
    on_committed: Callable[[list[LogEntry]], None] | None = None,
    expecting: Callable[[list[str]], AbstractContextManager[None]] | None = None,
) -> list[APIRouter]:
    """The write side of a process: Orrery's `/v1/records` (paced by `flow` when the
    projector runs in this process, with `?wait=searchable`; by `backlog` in server mode
    on PostgreSQL), the ChonkyDB dialect, and KoutenDB's import and dump (scope refs
    resolved like the query side resolves them). With `workers`, `/v1/records` parses,
    validates and writes in those processes and reports each batch's events to
    `on_events` and its committed outbox events to `on_committed` (announced by
    `expecting(namespaces)`, held meanwhile)."""
    # One pacer for every write route: a namespace's writers queue behind each other
    # whichever route they use, never behind another namespace's.
    pacer = WritePacer(flow or backlog)
    routers = [
        create_ingest_router(
            store=store,
            grants=grants,
            max_batch=settings.max_batch,
            vector_dimension=vector_dimension,
            max_record_bytes=settings.max_record_bytes,
            on_commit=on_commit,
            flow=flow,
            pacer=pacer,
            workers=workers,
            on_events=on_events,
            on_committed=on_committed,
            expecting=expecting,
        ),
        create_ingest_chonkydb_router(
            store=store,
            jobs=jobs,
            grants=grants,
            max_batch=settings.max_batch,
            vector_dimension=vector_dimension,
            max_record_bytes=settings.max_record_bytes,
            on_commit=on_commit,
            pacer=pacer,
        ),
    ]
    scopes = scope_registry(settings)
    routers.append(
        create_ingest_koutendb_router(
            store=store,
            grants=grants,
            max_batch=settings.max_batch,
            vector_dimension=vector_dimension,
            on_commit=on_commit,
            resolve_scope=lambda namespace, ref: scopes.target(namespace, ref).snapshot_kind,
            max_batch_bytes=settings.max_import_batch_bytes,
            max_record_bytes=settings.max_record_bytes,
            pacer=pacer,
        )
    )
    return routers


def store_admin_router(
    settings: QuerySettings,
    *,
    exclusive: Callable[[], AbstractContextManager[None]],
    log_is_outbox: bool,
) -> APIRouter:
    """`/v1/admin/backups…` and `/v1/admin/compact` over the canonical store;
    `exclusive` is the generation writer lock of `settings.data_dir`."""
    maintenance = store_maintenance(
        settings.data_dir,
        settings.database_url,
        exclusive=exclusive,
        log_is_outbox=log_is_outbox,
    )
    return create_store_admin_router(maintenance, admin_key=settings.admin_key)


def query_routers(
    settings: QuerySettings,
    ports: QueryPorts,
    grants: dict[str, ApiKeyGrant],
    *,
    admin: GenerationAdmin,
    status: Callable[[], dict[str, Any]],
    backend: Literal["embedded", "servers"] = "embedded",
    activity: Activity | None = None,
) -> tuple[EligibilityGate, list[APIRouter]]:
    """The read side of a process: the eligibility gate in front of both searches (its
    re-checks yield to `activity`), and Orrery's query routes, the ChonkyDB dialect and
    KoutenDB's envelope over the gated ports (ring statistics, profiles and kept
    envelopes next to the registry)."""
    routing = cast(RegistryRouting, ports.routing)
    gate = eligibility_gate(settings, admin, routing, activity)
    # Server engines search only copies whose read-back matched the registry.
    for source, engine in ((ports.vectors, "qdrant"), (ports.lexical, "opensearch")):
        use_copy_verdicts = getattr(source, "use_copy_verdicts", None)
        if use_copy_verdicts is not None:
            use_copy_verdicts(functools.partial(_copy_verdicts, gate, engine))
    gated = dataclasses.replace(
        ports,
        lexical=ReportingLexicalSearch(ports.lexical, gate),
        vectors=ReportingVectorSearch(ports.vectors, gate),
        eligibility=gate,
    )
    routers = [
        create_query_router(
            ports=gated,
            limits=query_limits(settings),
            grants=grants,
            document_ids=routing.document_ids,
            status=status,
            eligibility=gate,
            inline=True,
        ),
        create_query_chonkydb_router(
            ports=gated,
            grants=grants,
            ready=ready_check(routing, status, gate),
            api_key_header=settings.api_key_header,
        ),
    ]
    routers.append(
        create_query_koutendb_router(
            ports=kouten_ports(
                settings,
                gated,
                routing=cast("SqliteRouting | PostgresRouting", routing),
                backend=backend,
            ),
            grants=grants,
        )
    )
    return gate, routers


def observe_state(
    metrics: Metrics | None,
    *,
    routing: Routing,
    status: Callable[[], dict[str, Any]],
    gate: EligibilityGate,
    admin: GenerationAdmin,
) -> None:
    """The scrape-time gauges of a process with the query role: per-scope lag and
    eligibility (what `/v1/readiness` reports), generation states, running builds."""

    def generations() -> list[tuple[str, str, str]]:
        return [(r.namespace, r.snapshot_kind, r.state.value) for r in admin.rows()]

    def builds() -> list[tuple[str, int, int]]:
        out = []
        for row in admin.rows():
            if row.state.value == "building":
                progress = admin.jobs.progress(row.generation_id)
                if progress is not None:
                    out.append((progress.phase, progress.done, progress.total))
        return out

    state_collector(
        metrics,
        readiness=lambda: readiness(routing, status, gate),
        generations=generations,
        builds=builds,
    )


def observe_flat_copies(metrics: Metrics | None, usage: Callable[[], tuple[int, int]]) -> None:
    """Scrape-time gauges of the in-memory vector copies small generations are scanned
    from (`QdrantEdgeVectorIndex.flat_for`): how many, and the bytes they reserve."""
    if metrics is None:
        return
    copies = Gauge(
        "orrery_flat_vector_copies",
        "Generations searched from an exact in-memory copy of their vectors",
        registry=metrics.registry,
    )
    copies.set_function(lambda: float(usage()[0]))
    reserved = Gauge(
        "orrery_flat_vector_bytes",
        "Bytes the in-memory vector copies reserve (at most 512 MiB in all)",
        registry=metrics.registry,
    )
    reserved.set_function(lambda: float(usage()[1]))


log = logging.getLogger("orrery")


@dataclass(slots=True)
class EmbeddedStack:
    """Everything `orrery serve` runs, started and stopped as one unit.

    The process holds the data directory's operator lock for its lifetime (qdrant-edge
    and tantivy allow one process per generation directory), so a direct `orrery gen …`
    refuses to run meanwhile and talks to this server's admin API instead. At start,
    builds left `building` by a process that died are marked failed.
    """

    settings: QuerySettings
    store: RecordStore
    projector: EmbeddedProjector
    loop: ProjectorLoop
    app: FastAPI
    admin: GenerationAdmin
    gate: EligibilityGate
    lock: OperatorLock
    # `GET /v1/readiness`'s body as an unrestricted key sees it (the banner waits on it).
    readiness: Callable[[], dict[str, Any]]
    observability: Observability = dataclasses.field(default_factory=Observability)
    close_observability: Callable[[], None] = lambda: None
    # `POST /v1/records`' parse, validation and store write (ORRERY_INGEST_WORKERS).
    write_workers: WriteWorkers | None = None
    # Whether events are written and not applied yet (the vector optimizer's `backlog`).
    backlog: Callable[[], bool] | None = None
    _saved_switch_interval: float | None = dataclasses.field(default=None, init=False)

    @classmethod
    def open(
        cls,
        settings: QuerySettings,
        *,
        embedder: Embedder | None = None,
        ingest: IngestSettings | None = None,
        span_exporter: Any = None,
    ) -> EmbeddedStack:
        """The stack on `settings.data_dir`; `ingest` paces `POST /v1/records` (default:
        `IngestSettings()` from the environment); `span_exporter` receives the spans
        (with `settings.tracing`) instead of the OTLP endpoint."""
        data_dir = settings.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        lock = operator_lock(data_dir)
        lock.acquire()
        try:
            return cls._open(settings, lock, embedder, ingest or IngestSettings(), span_exporter)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open(
        cls,
        settings: QuerySettings,
        lock: OperatorLock,
        embedder: Embedder | None,
        ingest: IngestSettings,
        span_exporter: Any = None,
    ) -> EmbeddedStack:
        settings.check_embedded_topology()
        data_dir = settings.data_dir
        db_path = canonical_db_path(data_dir)
        grants = parse_api_keys(settings.api_keys)
        observability, close_observability = open_observability(
            settings, ("embedded",), span_exporter=span_exporter
        )
        metrics = observability.metrics
        # The bulk-load child makes the default embedder itself (one thread), behind
        # the same vector store when one is configured.
        child_kwargs: dict[str, Any] = {"threads": 1}
        if settings.embedding_cache_dir is not None:
            child_kwargs["cache_dir"] = str(settings.embedding_cache_dir)
        child_embedder = (
            EmbedderFactory("projector.bootstrap:default_embedder", child_kwargs)
            if embedder is None
            else None
        )
        # Queries embed in a session of their own; an injected embedder serves both.
        query_embedder = embedder or warm_query_embedder(settings.query_embedder_threads)
        embedder = embedder or default_embedder(
            settings.embedder_threads, settings.embedding_cache_dir
        )
        if metrics is not None:
            query_embedder = CountingEmbedder(query_embedder, metrics, "queries")
            embedder = CountingEmbedder(embedder, metrics, "documents")
        projector = embedded_projector(
            data_dir,
            db_path,
            embedder=embedder,
            batch_size=settings.projector_batch_size,
            text_languages=settings.text_languages(),
            spare_shard=True,
        )
        # What the write path is paced by: positions committed by the store, applied
        # by the projector (each batch's report, after its commit).
        progress = LogProgress(applied=projector.state.position(CONSUMER))

        def committed(entries: list[LogEntry]) -> None:
            projector.log.remember(entries)

        project = observed_projector_step(observability, projector.step)

        def step() -> BatchReport:
            report: BatchReport = project()
            progress.applied_up_to(report.position)
            return report

        store = embedded_store(
            data_dir,
            on_committed=committed,
            on_positions=progress.wrote_events,
        )
        progress.wrote(store.high_water())
        # Each namespace's backlog left by the last run (the write path paces per
        # namespace: `ingest.pacing`).
        progress.wrote_events(projector.log.pending_events(progress.applied))
        for generation_id in projector.state.fail_orphaned_builds(ORPHANED_BUILD, older_than=None):
            log.warning("generation %s: %s; marked failed", generation_id, ORPHANED_BUILD)
        loop = ProjectorLoop(step, poll_seconds=settings.projector_poll_seconds)

        def wake_projector() -> bool:
            loop.wake()
            return False

        admin = embedded_generation_admin(
            projector,
            db_path,
            drive_log=wake_projector,
            options=generation_options(settings),
            embedder_factory=child_embedder,
        )
        ports = embedded_query_ports(
            db_path,
            embedder=query_embedder,
            lexical_index_provider=projector.lexical.searchable,
            vector_shard_provider=projector.vectors.shard_for,
            vector_flat_provider=projector.vectors.flat_for,
            vector_points_provider=projector.vectors.points_for,
            vector_ids_provider=projector.vectors.ids_for,
            lexical_flat_provider=projector.lexical.flat_for,
            cache_responses=settings.cache_responses,
            scopes=scope_registry(settings),
            cursors=cursor_codec(settings),
            max_answer_bytes=settings.max_answer_bytes,
            record_cache_bytes=settings.record_cache_bytes,
            vector_hnsw_ef=settings.vector_hnsw_ef,
        )
        ports = dataclasses.replace(ports, observer=query_observer(observability))
        status = with_tracing_status(loop.status, observability)
        # The requests in flight: the gate's re-checks run in the gaps between them.
        activity = Activity()
        gate, readers = query_routers(
            settings, ports, grants, admin=admin, status=status, activity=activity
        )
        observe_state(metrics, routing=ports.routing, status=status, gate=gate, admin=admin)
        observe_flat_copies(metrics, projector.vectors.flat_usage)
        # The serving interpreter keeps the projector and the queries; a POST's parse,
        # validation and store write (~40 % of an ingest's GIL-held time) run beside it.
        # Their committed events come back pickled and are handed to the projector's log
        # as the store hands over its own (unpickling costs less than decoding the rows).
        write_workers = (
            WriteWorkers(
                db_path,
                count=ingest.workers,
                max_batch=settings.max_batch,
                vector_dimension=embedder.dimension,
                max_record_bytes=settings.max_record_bytes,
            )
            if ingest.workers
            else None
        )
        writers = ingest_routers(
            settings,
            store,
            grants,
            vector_dimension=embedder.dimension,
            on_commit=loop.wake,
            jobs=job_store(data_dir, None),
            flow=WriteFlow(progress, ingest.limits()),
            workers=write_workers,
            on_events=progress.wrote_events,
            on_committed=committed,
            expecting=projector.log.expecting,
        )
        app = build_app(
            "Orrery",
            [
                *readers,
                *writers,
                create_admin_router(admin, admin_key=settings.admin_key),
                store_admin_router(settings, exclusive=projector.lock.hold, log_is_outbox=True),
                create_ui_router(),
            ],
            max_body_bytes=settings.max_body_bytes,
            stream_paths=STREAM_PATHS,
            max_stream_bytes=settings.max_import_bytes,
            api_key_header=settings.api_key_header,
            document_facts=document_facts(settings, embedder.dimension),
            observability=observability,
            activity=activity,
        )
        if not grants:
            log.warning("no API keys configured (ORRERY_API_KEYS): the API is open")
        ready = functools.partial(readiness, ports.routing, status, gate)
        return cls(
            settings,
            store,
            projector,
            loop,
            app,
            admin,
            gate,
            lock,
            ready,
            observability,
            close_observability,
            write_workers,
            lambda: progress.lag() > 0,
        )

    def start(self) -> None:
        wanted = self.settings.switch_interval_seconds
        if wanted is not None:
            # The projector's engine calls let the GIL go many times a batch (SQLite,
            # tantivy, qdrant-edge's point conversion); with Python's 5 ms each hand-back
            # waits up to 5 ms behind the POST handling (`bench/gil_release.py`).
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(wanted)
        if self.write_workers is not None:
            self.write_workers.start()
        self.loop.start()
        self.projector.vectors.start_background_optimizer(
            self.settings.optimize_interval_seconds,
            growth=self.settings.optimize_growth,
            share=self.settings.optimize_share,
            backlog=self.backlog,
        )
        if self.settings.lexical_compaction:
            self.projector.start_lexical_compactor(
                self.settings.optimize_interval_seconds,
                growth=self.settings.lexical_compact_growth,
            )
        self.gate.start()

    def close(self) -> None:
        self.gate.close()
        if self.write_workers is not None:
            self.write_workers.close()
        self.admin.close()
        self.loop.stop()
        self.projector.close()
        self.store.close()
        self.close_observability()
        self.lock.release()
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
