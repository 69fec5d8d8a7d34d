"""The only module of the projector that picks adapters."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.admin import GenerationRow
from contracts.embedding import Embedder
from contracts.errors import OrreryError
from contracts.generations import (
    GenerationDescriptor,
    GenerationState,
    IndexConfig,
    Topology,
)
from contracts.index import IndexDocument, to_index_document
from contracts.index_fields import TextLanguages
from contracts.names import live_alias_name
from contracts.pacing import DutyCycle, Pace, no_pace
from contracts.qualification import QualificationReceipt, QualifyRequest
from contracts.vector_payload import GRAPH_FIELDS
from projector.adapters.file_lock import FileWriterLock, OperatorLock
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog
from projector.adapters.sqlite_ring_stats import SqliteRingStatistics
from projector.adapters.sqlite_snapshot import SqliteCanonicalSnapshot
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.adapters.subprocess_bulk_load import SubprocessBulkLoader
from projector.adapters.tantivy_lexical import (
    DEFAULT_FLAT_MAX_ROWS,
    DEFAULT_FLAT_OPEN_MAX_ROWS,
    TantivyLexicalIndex,
)
from projector.generations import (
    DeferredWrites,
    GenerationAdmin,
    GenerationOptions,
    GenerationPorts,
    LogHandover,
)
from projector.ports import AliasMirror, EngineReadback, EventLog, VectorIndex
from projector.ring_stats import RingStatsVectorIndex
from projector.service import BatchReport, PoisonGuard, project_batch, schema_digest

if TYPE_CHECKING:
    from contracts.migrations import Migration
    from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
    from projector.adapters.postgres_lock import PostgresWriterLock
    from projector.adapters.postgres_state import PostgresProjectorState
    from projector.adapters.qdrant_vectors import QdrantServerVectorIndex
    from projector.ports import CanonicalSnapshot

__all__ = [
    "COMPACT_SHARE",
    "SERVER_INDEX_CONFIG",
    "EmbeddedProjector",
    "EmbedderFactory",
    "SampleRunner",
    "ServerProjector",
    "bulk_load_ports",
    "default_embedder",
    "embedded_generation_admin",
    "embedded_projector",
    "lexical_documents",
    "operator_lock",
    "postgres_migrations",
    "server_generation_admin",
    "server_projector",
    "writer_lock_path",
]

# What a sample runs with: the generation, its applied position, the request and the
# generation id of its 1-shard reference copy (`orrery.servers` binds the query side's).
SampleRunner = Callable[[GenerationDescriptor, int, QualifyRequest, str], QualificationReceipt]

# What server mode configures its engines with, beyond shards and replicas (bound into
# each generation's schema digest): BM25 in OpenSearch; cosine, Qdrant's default HNSW
# (m 16, ef_construct 100), no quantization, payload-aware links for `GRAPH_FIELDS`.
SERVER_INDEX_CONFIG = IndexConfig(
    lexical_similarity="BM25",
    vector_distance="cosine",
    hnsw_m=16,
    hnsw_ef_construct=100,
    quantization="none",
    payload_index_policy=tuple(sorted(GRAPH_FIELDS)),
)

_log = logging.getLogger(__name__)

# The share of the wall time a background compaction of a tantivy index takes at most
# (it shares the interpreter with the queries: `contracts.pacing`).
COMPACT_SHARE = 0.5
# Documents written during a background compaction's copy past which it gives way.
_GIVE_WAY = 1_000
_COMPACTABLE = frozenset({GenerationState.SEALED, GenerationState.VERIFIED, GenerationState.LIVE})
# How long a background compaction (or lexical copy) waits, in all, for the vector
# index's builds (`QdrantEdgeVectorIndex.building`) before it runs beside them: twice
# what a 1M generation's build took with the cores to itself (session 32's child: 800 s
# on ~1.75 of two; session 29's, sharing them: 2,170 s), room for a slower machine.
BUILD_FIRST_MAX_WAIT_S = 1_800.0
# How often a compaction waiting for a build looks again.
_BUILD_POLL_S = 0.5

LEXICAL_ENGINE = "tantivy"
VECTOR_ENGINE = "qdrant-edge"
CONSUMER = "projector"


def postgres_migrations() -> tuple[str, list[Migration]]:
    """The projector's PostgreSQL migration set and its ledger component (the
    composition root applies it with the ledger's driver, `contracts.migrations`)."""
    from projector.adapters.postgres_migrations import COMPONENT, migrations

    return COMPONENT, migrations()


def dead_letter_box(
    db_path: Path, database_url: str | None
) -> SqliteProjectorState | PostgresProjectorState:
    """The projector's state as a `DeadLetterBox` for an operator's tools (listing and
    re-driving dead letters): PostgreSQL with a URL, else the SQLite file `db_path`.
    The caller closes it."""
    if not database_url:
        return SqliteProjectorState(db_path)
    from projector.adapters.postgres_state import PostgresProjectorState

    return PostgresProjectorState(database_url, pool_size=1)


def _server_state(
    db_path: Path, lock_path: Path, database_url: str | None
) -> tuple[SqliteProjectorState | PostgresProjectorState, FileWriterLock | PostgresWriterLock]:
    """Server mode's registry and writer lock: PostgreSQL (an advisory lock that fences
    every commit) with a URL, else the single-host SQLite file and flock."""
    if not database_url:
        return SqliteProjectorState(db_path), FileWriterLock(lock_path)
    from projector.adapters.postgres_lock import PostgresWriterLock
    from projector.adapters.postgres_state import PostgresProjectorState

    lock = PostgresWriterLock(database_url)
    return PostgresProjectorState(database_url, fence=lock.assert_held), lock


def _server_snapshot(db_path: Path, database_url: str | None) -> CanonicalSnapshot:
    if not database_url:
        return SqliteCanonicalSnapshot(db_path)
    from projector.adapters.postgres_snapshot import PostgresCanonicalSnapshot

    return PostgresCanonicalSnapshot(database_url)


def _server_writes(
    vectors: VectorIndex, db_path: Path, database_url: str | None
) -> RingStatsVectorIndex:
    """The vector index server mode writes through, with ring statistics next to the
    registry: its PostgreSQL tables with `database_url`, else the SQLite registry."""
    if not database_url:
        return RingStatsVectorIndex(vectors, SqliteRingStatistics(db_path))
    from projector.adapters.postgres_ring_stats import PostgresRingStatistics

    return RingStatsVectorIndex(vectors, PostgresRingStatistics(database_url))


def writer_lock_path(data_dir: Path) -> Path:
    """The generation writer lock shared by every process working on `data_dir`."""
    return data_dir / "generations.lock"


def operator_lock(data_dir: Path) -> OperatorLock:
    """The lock that lets one process at a time open `data_dir`'s embedded engines."""
    return OperatorLock(data_dir / "operator.lock")


def _embedded_alias_name(_engine: str, namespace: str, kind: str) -> str:
    """The alias a promote records for the embedded engines (no native aliases)."""
    return live_alias_name(namespace, kind)


def _embedded_topology(generation_id: str) -> Topology:
    return Topology(
        lexical_engine=LEXICAL_ENGINE,
        lexical_index=f"generations/lexical/{generation_id}",
        vector_engine=VECTOR_ENGINE,
        vector_index=f"generations/vectors/{generation_id}",
    )


class _Stopped(Exception):
    """The background compactor was stopped between two chunks of a compaction."""


class _BuildsFirst:
    """A compaction's pause for the vector index's HNSW builds: while `building()`
    says one runs, `wait` sleeps (in `poll_s` steps, until `stop` is set) — at most
    `max_wait_s` over this object's life, after which the compaction runs beside the
    build (one generation's long build never keeps another's compaction waiting for
    good). A build after an ingest and the compaction after it are both upkeep of a
    quiet generation; the build is the one queries wait for (a brute force over every
    unindexed point against a few milliseconds of a segment count), and a compaction,
    paced to half the wall time and not niced, took about a third of the build child's
    cores (session 32). Not thread-safe: one per round of the compactor."""

    def __init__(
        self,
        building: Callable[[], bool],
        stop: threading.Event,
        *,
        max_wait_s: float = BUILD_FIRST_MAX_WAIT_S,
        poll_s: float = _BUILD_POLL_S,
    ) -> None:
        self._building = building
        self._stop = stop
        self._left = max_wait_s
        self._poll = poll_s
        self.waited_s = 0.0

    def wait(self) -> None:
        while self._left > 0.0 and not self._stop.is_set() and self._building():
            step = min(self._poll, self._left)
            self._stop.wait(step)
            self._left -= step
            self.waited_s += step


@dataclass(slots=True)
class EmbeddedProjector:
    """The embedded projector's parts; `step` applies one batch of the log to every
    generation that takes writes, except those `deferred` (loaded by a child process)."""

    state: SqliteProjectorState
    log: SqliteOutboxLog
    lexical: TantivyLexicalIndex
    vectors: QdrantEdgeVectorIndex
    embedder: Embedder
    step: Callable[[], BatchReport]
    lock: FileWriterLock
    data_dir: Path
    deferred: DeferredWrites
    text_languages: TextLanguages
    # The vector index every write goes through: ring statistics are kept with it.
    writes: RingStatsVectorIndex
    # The registry and canonical store (SQLite).
    db_path: Path
    _compactor: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def compact_lexical(
        self, generation_id: str, *, pace: Pace = no_pace, max_journal: int | None = None
    ) -> bool:
        """Rewrite the generation's tantivy index as one segment (`TantivyLexicalIndex.
        compact`), its text read back from the canonical store; whether it did."""
        snapshot = SqliteCanonicalSnapshot(self.db_path)
        try:
            return self.lexical.compact(
                generation_id, lexical_documents(snapshot), pace=pace, max_journal=max_journal
            )
        finally:
            snapshot.close()

    def build_lexical_flat(self, generation_id: str, *, pace: Pace = no_pace) -> bool:
        """Make the generation's in-memory lexical copy (`TantivyLexicalIndex.build_flat`)
        from the canonical store; whether it did."""
        snapshot = SqliteCanonicalSnapshot(self.db_path)
        try:
            return self.lexical.build_flat(generation_id, lexical_documents(snapshot), pace=pace)
        finally:
            snapshot.close()

    def start_lexical_compactor(
        self,
        interval_s: float,
        *,
        growth: float,
        share: float = COMPACT_SHARE,
        building: Callable[[], bool] | None = None,
    ) -> None:
        """Every `interval_s`, compact each open generation's tantivy index that is due
        (`TantivyLexicalIndex.compaction_due`: several segments, quiet for `interval_s`,
        `growth` written since), one at a time, paced to `share` of the wall time
        (`DutyCycle`: the queries of this interpreter run in the gaps); then, for one
        that has no in-memory lexical copy and may have one (`TantivyLexicalIndex.
        flat_due`: quiet, no deleted document, small enough), builds it (`build_lexical_
        flat`), paced the same way. Both wait while `building()` says an HNSW build
        runs (default: `QdrantEdgeVectorIndex.building` of `vectors`; at most
        `BUILD_FIRST_MAX_WAIT_S` a round: `_BuildsFirst`). A daemon thread; `close()`
        stops it. Failures are logged and retried next round."""
        if self._compactor is not None and self._compactor.is_alive():
            return
        self._stop.clear()
        self._compactor = threading.Thread(
            target=self._compact_loop,
            args=(interval_s, growth, share, building or self.vectors.building),
            name="tantivy-compactor",
            daemon=True,
        )
        self._compactor.start()

    def _compact_loop(
        self, interval_s: float, growth: float, share: float, building: Callable[[], bool]
    ) -> None:
        while not self._stop.wait(interval_s):
            # Never one a build (here or in a bulk-load child) still writes whole.
            states = {g: state for g, _namespace, _kind, state in self.state.generations()}
            deferred = self.deferred.deferred()
            # One wait budget a round, whatever the number of generations.
            builds = _BuildsFirst(building, self._stop)
            for generation_id in self.lexical.generation_ids():
                if self._stop.is_set():
                    return
                if states.get(generation_id) not in _COMPACTABLE or generation_id in deferred:
                    continue
                duty = DutyCycle(share)

                def pace(duty: DutyCycle = duty, builds: _BuildsFirst = builds) -> None:
                    builds.wait()  # also a compaction that began before the build
                    if self._stop.is_set():
                        raise _Stopped  # `close` does not wait for a whole compaction.
                    duty()

                def due(generation_id: str = generation_id) -> bool:
                    return self.lexical.compaction_due(
                        generation_id, quiet_s=interval_s, growth=growth
                    )

                try:
                    if due():
                        pace()
                        if due():
                            # Writes flowing again: give way (due again once quiet).
                            self.compact_lexical(generation_id, pace=pace, max_journal=_GIVE_WAY)
                    if self.lexical.flat_due(generation_id, quiet_s=interval_s):
                        pace()
                        self.build_lexical_flat(generation_id, pace=pace)
                except _Stopped:
                    return
                except OrreryError as error:
                    if not self._stop.is_set():
                        _log.warning(
                            "compacting %s or building its lexical copy failed: %s",
                            generation_id,
                            error.message,
                        )

    def close(self) -> None:
        self._stop.set()
        if self._compactor is not None:
            self._compactor.join()
        self.writes.close()
        self.vectors.close()
        self.lexical.close()
        self.log.close()
        self.state.close()
        self.lock.close()


def default_embedder(threads: int = 2, cache_dir: str | Path | None = None) -> Embedder:
    """all-MiniLM-L6-v2 (int8 ONNX) from its PyPI package; loaded on first use. With
    `cache_dir` (`ORRERY_EMBEDDING_CACHE_DIR`), behind the vector store kept there."""
    from projector.adapters.onnx_embedder import OnnxMiniLMEmbedder

    embedder = OnnxMiniLMEmbedder(intra_op_num_threads=threads)
    if cache_dir:
        from projector.adapters.embedding_cache import CachingEmbedder

        return CachingEmbedder(embedder, Path(cache_dir))
    return embedder


def warm_query_embedder(threads: int) -> Embedder:
    """The query side's embedder (a session of its own), loaded and run once now: the
    first query must not pay the model load (seconds on a busy machine, past a 2 s
    request deadline)."""
    embedder = default_embedder(threads)
    embedder.embed(["warm up"])
    return embedder


def embedded_projector(
    data_dir: Path,
    db_path: Path,
    *,
    embedder: Embedder,
    batch_size: int,
    text_languages: TextLanguages | None = None,
    spare_shard: bool = False,
) -> EmbeddedProjector:
    """SQLite outbox as the log, tantivy + qdrant-edge generation directories; a new
    generation's text is analyzed in its namespace's language (`text_languages`).

    `spare_shard` (a serving process): keep an empty qdrant-edge shard of the embedder's
    dimension ready for the next new generation, made by a child process; creating one
    in process holds the GIL, stalling every query and write, for ~0.5 s."""
    languages = text_languages or TextLanguages()
    state = SqliteProjectorState(db_path)
    log = SqliteOutboxLog(db_path, start_after=state.position(CONSUMER))
    # Generations created here keep an in-memory copy the query side scores small ones
    # from (`contracts.flat_lexical`); the background compactor makes one for a quiet
    # generation of up to 100k documents opened from disk (`build_lexical_flat`).
    lexical = TantivyLexicalIndex(
        data_dir / "generations" / "lexical",
        flat_max_rows=DEFAULT_FLAT_MAX_ROWS,
        flat_open_max_rows=DEFAULT_FLAT_OPEN_MAX_ROWS,
    )
    vectors = QdrantEdgeVectorIndex(
        data_dir / "generations" / "vectors",
        spare_dimension=embedder.dimension if spare_shard else None,
    )
    writes = RingStatsVectorIndex(vectors, SqliteRingStatistics(db_path))
    lock = FileWriterLock(writer_lock_path(data_dir))
    deferred = DeferredWrites()
    step = functools.partial(
        project_batch,
        log=log,
        state=deferred.wrap(state),
        lexical=lexical,
        vectors=writes,
        embedder=embedder,
        cache=state,
        lexical_engine=LEXICAL_ENGINE,
        vector_engine=VECTOR_ENGINE,
        consumer=CONSUMER,
        batch_size=batch_size,
        lock=lock,
        topology=_embedded_topology,
        dead_letters=state,
        health=state,
        text_languages=languages,
        poison=PoisonGuard(),
    )
    return EmbeddedProjector(
        state,
        log,
        lexical,
        vectors,
        embedder,
        step,
        lock,
        data_dir,
        deferred,
        languages,
        writes,
        db_path,
    )


def lexical_documents(
    snapshot: CanonicalSnapshot,
) -> Callable[[Sequence[tuple[str, int]]], list[IndexDocument]]:
    """The lexical index documents of exactly the given `(document_id, revision)` pairs,
    from the canonical store (no vectors: the lexical index has no use for them)."""

    def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        return [to_index_document(record, None) for record in snapshot.records(pairs)]

    return documents


@dataclass(frozen=True, slots=True)
class EmbedderFactory:
    """How another process makes the same embedder: `factory` is `module:callable`,
    called with `kwargs` (JSON values)."""

    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def create(self) -> Embedder:
        module, _, name = self.factory.partition(":")
        embedder: Embedder = getattr(importlib.import_module(module), name)(**self.kwargs)
        return embedder


def _child_embedder(embedder: Embedder) -> EmbedderFactory | None:
    """The factory of the default embedder (one thread in a child); None for others."""
    kwargs: dict[str, Any] = {"threads": 1}
    cached = sys.modules.get("projector.adapters.embedding_cache")
    if cached is not None and isinstance(embedder, cached.CachingEmbedder):
        kwargs["cache_dir"] = str(embedder.directory)
        embedder = embedder.inner
    onnx = sys.modules.get("projector.adapters.onnx_embedder")
    if onnx is not None and isinstance(embedder, onnx.OnnxMiniLMEmbedder):
        return EmbedderFactory(f"{__name__}:default_embedder", kwargs)
    return None


def embedded_generation_admin(
    projector: EmbeddedProjector,
    db_path: Path,
    *,
    drive_log: Callable[[], bool] | None,
    options: GenerationOptions,
    embedder_factory: EmbedderFactory | None = None,
) -> GenerationAdmin:
    """The lifecycle over the embedded projector's own engines and registry.

    Builds bulk-load in a child process (`SubprocessBulkLoader`, `options.child_nice`)
    when `options.load_in_child` and the child can make the same embedder: the default
    one, or the one `embedder_factory` names; else in this process. tantivy and
    qdrant-edge have no native aliases: promote records that it skipped them.
    """
    factory = embedder_factory or _child_embedder(projector.embedder)
    loader = None
    if options.load_in_child and factory is not None:
        loader = SubprocessBulkLoader(
            projector.data_dir,
            db_path,
            embedder_factory=factory.factory,
            embedder_kwargs=factory.kwargs,
            batch_size=options.batch_size,
            pause_seconds=options.pause_seconds,
            nice=options.child_nice,
        )
    state = projector.state
    return GenerationAdmin(
        GenerationPorts(
            registry=projector.state,
            dead_letters=projector.state,
            contents=projector.state,
            maintenance=projector.state,
            evidence_log=projector.state,
            cache=projector.state,
            snapshot=SqliteCanonicalSnapshot(db_path),
            lexical=projector.lexical,
            vectors=projector.writes,
            lexical_readback=projector.lexical,
            vector_readback=projector.vectors,
            lock=projector.lock,
            embedder=projector.embedder,
            lexical_engine=LEXICAL_ENGINE,
            vector_engine=VECTOR_ENGINE,
            schema_digest=schema_digest(
                LEXICAL_ENGINE, VECTOR_ENGINE, projector.embedder.embedder_id
            ),
            topology=_embedded_topology,
            alias_name=_embedded_alias_name,
            aliases={LEXICAL_ENGINE: None, VECTOR_ENGINE: None},
            drive_log=drive_log,
            options=options,
            bulk_loader=loader,
            deferred=projector.deferred if loader is not None else None,
            handover=LogHandover(
                open_log=lambda position: SqliteOutboxLog(db_path, start_after=position),
                applied_position=lambda: state.position(CONSUMER),
            ),
            text_languages=projector.text_languages,
            receipts=projector.state,
        )
    )


class _NoLock:
    """The writer lock of a bulk-load child: it is its generation's only writer."""

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        yield


def bulk_load_ports(
    data_dir: Path,
    db_path: Path,
    *,
    embedder_factory: str,
    embedder_kwargs: dict[str, Any],
    options: GenerationOptions,
) -> tuple[GenerationPorts, Callable[[str], bool], Callable[[], None]]:
    """What a bulk-load child (`projector.entrypoints.bulk_load`) works with: its own
    registry connection, canonical snapshot and engine roots under `data_dir`; the
    function that builds a generation's HNSW in place; and the one that closes it all.

    No writer lock: while the child runs, the parent writes nothing to the generation
    (`DeferredWrites`), and nothing else of the child's is shared.
    """
    embedder = EmbedderFactory(embedder_factory, embedder_kwargs).create()
    state = SqliteProjectorState(db_path)
    snapshot = SqliteCanonicalSnapshot(db_path)
    lexical = TantivyLexicalIndex(data_dir / "generations" / "lexical")
    vectors = QdrantEdgeVectorIndex(data_dir / "generations" / "vectors")
    writes = RingStatsVectorIndex(vectors, SqliteRingStatistics(db_path))
    ports = GenerationPorts(
        registry=state,
        dead_letters=state,
        contents=state,
        maintenance=state,
        evidence_log=state,
        cache=state,
        snapshot=snapshot,
        lexical=lexical,
        vectors=writes,
        lexical_readback=lexical,
        vector_readback=vectors,
        lock=_NoLock(),
        embedder=embedder,
        lexical_engine=LEXICAL_ENGINE,
        vector_engine=VECTOR_ENGINE,
        schema_digest=schema_digest(LEXICAL_ENGINE, VECTOR_ENGINE, embedder.embedder_id),
        topology=_embedded_topology,
        alias_name=_embedded_alias_name,
        aliases={LEXICAL_ENGINE: None, VECTOR_ENGINE: None},
        options=options,
    )

    def close() -> None:
        writes.close()
        vectors.close()
        lexical.close()
        snapshot.close()
        state.close()

    return ports, vectors.optimize_in_place, close


@dataclass(slots=True)
class ServerProjector:
    """The server-mode projector: Kafka in, OpenSearch + Qdrant out, registry in
    PostgreSQL (or, on one host, SQLite)."""

    state: SqliteProjectorState | PostgresProjectorState
    log: EventLog
    lexical: OpenSearchLexicalIndex
    vectors: QdrantServerVectorIndex
    embedder: Embedder
    step: Callable[[], BatchReport]
    lock: FileWriterLock | PostgresWriterLock
    writes: RingStatsVectorIndex

    def close(self) -> None:
        self.log.close()
        self.writes.close()
        self.vectors.close()
        self.lexical.close()
        self.state.close()
        self.lock.close()


def server_projector(
    db_path: Path,
    *,
    lock_path: Path,
    embedder: Embedder,
    batch_size: int,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    kafka_group: str,
    kafka_session_timeout_ms: int,
    opensearch_url: str,
    opensearch_index_prefix: str,
    opensearch_refresh_interval: str,
    qdrant: Any,
    qdrant_collection_prefix: str,
    text_languages: TextLanguages | None = None,
    kafka_metadata_max_age_ms: int = 30_000,
    kafka_join_timeout_ms: int = 60_000,
    database_url: str | None = None,
    kafka_client: str = "confluent",
) -> ServerProjector:
    """Kafka consumer group as the log; OpenSearch and Qdrant (a `QdrantClient`) as the
    indexes; the registry in PostgreSQL when `database_url` is given (migrated first by
    the composition root), else in the SQLite file `db_path`. `qdrant` is shared with the
    query side when both run in one process (qdrant-client's local mode allows one client
    per path). `kafka_client` picks the Kafka client: "confluent" (librdkafka) or
    "kafka-python"."""
    # Imported here: the embedded deployment never loads these drivers.
    from projector.adapters.kafka_wire import KafkaLogSettings
    from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
    from projector.adapters.qdrant_vectors import QdrantServerVectorIndex

    state, lock = _server_state(db_path, lock_path, database_url)
    log_settings = KafkaLogSettings(
        bootstrap_servers=kafka_bootstrap,
        group_id=kafka_group,
        topic_prefix=kafka_topic_prefix,
        session_timeout_ms=kafka_session_timeout_ms,
        heartbeat_interval_ms=max(1_000, kafka_session_timeout_ms // 6),
        metadata_max_age_ms=kafka_metadata_max_age_ms,
        join_timeout_ms=kafka_join_timeout_ms,
    )
    log: EventLog
    if kafka_client == "confluent":
        from projector.adapters.confluent_log import ConfluentEventLog

        log = ConfluentEventLog(log_settings)
    elif kafka_client == "kafka-python":
        from projector.adapters.kafka_log import KafkaEventLog

        log = KafkaEventLog(log_settings)
    else:
        raise ValueError(f"unknown Kafka client {kafka_client!r} (confluent or kafka-python)")
    # Each apply refreshes once at its end (not `wait_for` the next scheduled refresh):
    # a batch is searchable before its registry commit, without idling under the writer
    # lock, and a large batch makes one segment instead of one per refresh interval.
    lexical = OpenSearchLexicalIndex(
        opensearch_url,
        index_prefix=opensearch_index_prefix,
        refresh="true",
        refresh_interval=opensearch_refresh_interval,
    )
    vectors = QdrantServerVectorIndex(qdrant, collection_prefix=qdrant_collection_prefix)
    writes = _server_writes(vectors, db_path, database_url)

    def topology(generation_id: str) -> Topology:
        return _server_topology(lexical, vectors, generation_id)

    step = functools.partial(
        project_batch,
        log=log,
        state=state,
        lexical=lexical,
        vectors=writes,
        embedder=embedder,
        cache=state,
        lexical_engine="opensearch",
        vector_engine="qdrant",
        consumer=kafka_group,
        batch_size=batch_size,
        lock=lock,
        topology=topology,
        dead_letters=state,
        health=state,
        text_languages=text_languages or TextLanguages(),
        poison=PoisonGuard(),
    )
    return ServerProjector(state, log, lexical, vectors, embedder, step, lock, writes)


def _server_topology(
    lexical: OpenSearchLexicalIndex, vectors: QdrantServerVectorIndex, generation_id: str
) -> Topology:
    return Topology(
        lexical_engine="opensearch",
        lexical_index=lexical.index_name(generation_id),
        vector_engine="qdrant",
        vector_index=vectors.collection_name(generation_id),
    )


def server_generation_admin(
    db_path: Path,
    *,
    projector: ServerProjector | None,
    embedder: Embedder,
    lock_path: Path,
    opensearch_url: str,
    opensearch_index_prefix: str,
    opensearch_refresh_interval: str,
    qdrant: Any,
    qdrant_collection_prefix: str,
    drive_log: Callable[[], bool] | None,
    options: GenerationOptions,
    text_languages: TextLanguages | None = None,
    database_url: str | None = None,
    index_shape: Callable[[str, str], tuple[int, int]] | None = None,
    qualify: SampleRunner | None = None,
) -> tuple[GenerationAdmin, Callable[[], None]]:
    """The lifecycle over OpenSearch and Qdrant, and the function that closes what it
    opened. Uses the projector's engines and registry when this process runs one, else
    opens its own (`qdrant` is the process's shared `QdrantClient`, left open). Promote
    mirrors both engines' native aliases `{prefix}-live.{namespace_token}.{kind}`
    (`contracts.names`; lowercase for OpenSearch). New generations are spread as
    `index_shape(namespace, kind)` says (default 1 shard, no replica); `qualify` runs a
    qualification sample against a 1-shard reference copy of the lexical index (made
    here; kept for the next qualification after a failed receipt, dropped after a
    passing one) — without it, this process cannot qualify."""
    from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
    from projector.adapters.qdrant_vectors import QdrantServerVectorIndex

    closers: list[Callable[[], None]] = []
    state: SqliteProjectorState | PostgresProjectorState
    lock: FileWriterLock | PostgresWriterLock
    if projector is not None:
        state, lexical, vectors, lock = (
            projector.state,
            projector.lexical,
            projector.vectors,
            projector.lock,
        )
        writes = projector.writes
    else:
        state, lock = _server_state(db_path, lock_path, database_url)
        lexical = OpenSearchLexicalIndex(
            opensearch_url,
            index_prefix=opensearch_index_prefix,
            refresh="true",  # as the projector's
            refresh_interval=opensearch_refresh_interval,
        )
        vectors = QdrantServerVectorIndex(qdrant, collection_prefix=qdrant_collection_prefix)
        writes = _server_writes(vectors, db_path, database_url)
        closers += [lexical.close, writes.close, state.close, lock.close]

    def alias_name(engine: str, namespace: str, kind: str) -> str:
        if engine == "opensearch":
            return live_alias_name(namespace, kind, opensearch_index_prefix).lower()
        return live_alias_name(namespace, kind, qdrant_collection_prefix)

    lexical_mirror: AliasMirror = lexical
    vector_mirror: AliasMirror = vectors
    lexical_readback: EngineReadback = lexical
    vector_readback: EngineReadback = vectors
    snapshot = _server_snapshot(db_path, database_url)  # closed by admin.close
    admin = GenerationAdmin(
        GenerationPorts(
            registry=state,
            dead_letters=state,
            contents=state,
            maintenance=state,
            evidence_log=state,
            cache=state,
            snapshot=snapshot,
            lexical=lexical,
            vectors=writes,
            lexical_readback=lexical_readback,
            vector_readback=vector_readback,
            lock=lock,
            embedder=embedder,
            lexical_engine="opensearch",
            vector_engine="qdrant",
            schema_digest=schema_digest("opensearch", "qdrant", embedder.embedder_id),
            topology=lambda generation_id: _server_topology(lexical, vectors, generation_id),
            alias_name=alias_name,
            aliases={"opensearch": lexical_mirror, "qdrant": vector_mirror},
            drive_log=drive_log,
            options=options,
            text_languages=text_languages or TextLanguages(),
            index_shape=index_shape or (lambda _ns, _kind: (1, 0)),
            index_config=SERVER_INDEX_CONFIG,
            spreads=True,
            receipts=state,
        )
    )
    if qualify is not None:
        runner = qualify

        def qualifier(
            row: GenerationRow, descriptor: GenerationDescriptor, request: QualifyRequest
        ) -> QualificationReceipt:
            with lexical.reference_copy(descriptor.generation_id) as reference_id:
                receipt = runner(descriptor, row.applied_position, request, reference_id)
            # Kept after a failed receipt (a qualification run again after a settings
            # change reuses it); a passing one is what a promote needs, and a live
            # generation should not carry a second copy of its index on disk.
            if receipt.passed:
                lexical.drop_reference(descriptor.generation_id)
            return receipt

        admin.qualifier = qualifier

    def close() -> None:
        admin.close()
        for closer in closers:
            closer()

    return admin, close
