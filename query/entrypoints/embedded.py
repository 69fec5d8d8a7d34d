"""Composition root of the embedded deployment: ingest, projector and query worker in
one process, sharing one SQLite file and the generation directories.

This module (with `query.entrypoints.cli`) is the only place where the three packages
meet; import-linter allows exactly these imports.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from fastapi import FastAPI

from contracts.auth import parse_api_keys
from contracts.embedding import Embedder
from ingest.bootstrap import canonical_db_path, embedded_store
from ingest.entrypoints.http import create_router
from ingest.ports import RecordStore
from projector.bootstrap import EmbeddedProjector, default_embedder, embedded_projector
from projector.entrypoints.worker import ProjectorLoop
from query.adapters.sqlite_routing import SqliteRouting, generation_document_ids
from query.bootstrap import embedded_query_ports
from query.entrypoints.http import create_app
from query.service import QueryLimits
from query.settings import QuerySettings

__all__ = ["EmbeddedStack"]

log = logging.getLogger("orrery")


@dataclass(slots=True)
class EmbeddedStack:
    """Everything `orrery serve` runs, started and stopped as one unit."""

    settings: QuerySettings
    store: RecordStore
    projector: EmbeddedProjector
    loop: ProjectorLoop
    app: FastAPI

    @classmethod
    def open(cls, settings: QuerySettings, *, embedder: Embedder | None = None) -> EmbeddedStack:
        data_dir = settings.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        db_path = canonical_db_path(data_dir)
        grants = parse_api_keys(settings.api_keys)
        embedder = embedder or default_embedder(settings.embedder_threads)
        store = embedded_store(data_dir)
        projector = embedded_projector(
            data_dir, db_path, embedder=embedder, batch_size=settings.projector_batch_size
        )
        loop = ProjectorLoop(projector.step, poll_seconds=settings.projector_poll_seconds)
        ports = embedded_query_ports(
            db_path,
            embedder=embedder,
            lexical_index_provider=projector.lexical.index_for,
            vector_shard_provider=projector.vectors.shard_for,
            cache_responses=settings.cache_responses,
        )
        routing = ports.routing
        assert isinstance(routing, SqliteRouting)
        ingest_router = create_router(
            store=store,
            grants=grants,
            max_batch=settings.max_batch,
            vector_dimension=embedder.dimension,
            on_commit=loop.wake,
        )
        app = create_app(
            ports=ports,
            limits=QueryLimits(
                max_result_limit=settings.max_result_limit,
                candidate_depth=settings.candidate_depth,
                freshness_half_life_days=settings.freshness_half_life_days,
                response_ttl_seconds=settings.response_ttl_seconds,
            ),
            grants=grants,
            routers=[ingest_router],
            document_ids=functools.partial(generation_document_ids, routing),
            status=loop.status,
        )
        if not grants:
            log.warning("no API keys configured (ORRERY_API_KEYS): the API is open")
        return cls(settings, store, projector, loop, app)

    def start(self) -> None:
        self.loop.start()
        self.projector.vectors.start_background_optimizer(self.settings.optimize_interval_seconds)

    def close(self) -> None:
        self.loop.stop()
        self.projector.close()
        self.store.close()
