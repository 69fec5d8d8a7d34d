"""The only module of the query worker that picks adapters."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from contracts.embedding import Embedder
from contracts.generations import GenerationDescriptor
from contracts.qualification import QualificationReceipt, QualifyRequest
from contracts.vector_payload import (
    DEFAULT_HNSW_EF,
    DEFAULT_SPREAD_ACORN_SELECTIVITY,
    DEFAULT_SPREAD_EF_FACTOR,
)
from query.adapters.memory_cache import MemoryCache
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch, VectorMemo
from query.adapters.sqlite_koutendb import SqliteKoutenStore
from query.adapters.sqlite_ring_stats import SqliteRingStats
from query.adapters.sqlite_routing import (
    DEFAULT_MAX_ANSWER_BYTES,
    SqliteRecordReader,
    SqliteRouting,
)
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.cursors import CursorCodec, parse_cursor_keys
from query.koutendb import KoutenPorts, RingTables
from query.overlap import shared_source_pool
from query.phrases import VocabularyRegistry, parse_vocabularies
from query.ports import (
    Cache,
    EnvelopeLog,
    HeadListing,
    RecordReader,
    RingStatistics,
    SearchProfiles,
)
from query.profiles import ProfileRegistry, parse_profiles
from query.qualify import QualifySetup, qualify_generation
from query.record_cache import DEFAULT_RECORD_CACHE_BYTES, RecordCache
from query.scopes import ScopeRegistry, ScopeResolver, parse_scopes
from query.service import QueryEmbeddingCache, QueryLimits, QueryPorts
from query.settings import QuerySettings

if TYPE_CHECKING:
    from contracts.migrations import Migration
    from query.adapters.opensearch_lexical import SearchType
    from query.adapters.postgres_routing import PostgresRouting

__all__ = [
    "cursor_codec",
    "document_facts",
    "embedded_query_ports",
    "kouten_ports",
    "postgres_migrations",
    "profile_registry",
    "qualify_profiles",
    "query_limits",
    "scope_registry",
    "server_qualifier",
    "server_query_ports",
    "vocabulary_registry",
]

log = logging.getLogger("orrery.query")


def postgres_migrations() -> tuple[str, list[Migration]]:
    """The query workers' PostgreSQL migration set (the KoutenDB store) and its ledger
    component (the composition root applies it with the ledger's driver)."""
    from query.adapters.postgres_migrations import COMPONENT, migrations

    return COMPONENT, migrations()


def _json_or_file(value: str, setting: str) -> str:
    source = value.strip()
    if source and source[0] not in "{[":
        try:
            return Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{setting}: cannot read {source!r}: {exc}") from exc
    return source


def scope_registry(settings: QuerySettings) -> ScopeRegistry:
    """Built-in scope refs plus `ORRERY_SCOPES` (inline JSON when it starts with `{`,
    else the path of a JSON file). Raises `ValueError` at startup when invalid."""
    return parse_scopes(_json_or_file(settings.scopes, "ORRERY_SCOPES"))


def cursor_codec(settings: QuerySettings) -> CursorCodec:
    """Continuation cursors signed with `ORRERY_CURSOR_KEYS` (the first key signs, all
    verify); without keys, a random key of this process, with a warning: its cursors
    fail (`invalid_continuation`) on any other worker and after a restart."""
    keys = parse_cursor_keys(settings.cursor_keys)
    if keys:
        return CursorCodec(keys, ttl_seconds=settings.cursor_ttl_seconds)
    log.warning(
        "ORRERY_CURSOR_KEYS is unset: continuation cursors are signed with a random key of "
        "this process (set shared keys when several query workers serve one API)"
    )
    return CursorCodec.ephemeral(ttl_seconds=settings.cursor_ttl_seconds)


def profile_registry(settings: QuerySettings) -> ProfileRegistry:
    """Built-in profiles plus `ORRERY_PROFILES` (inline JSON when it starts with `{` or
    `[`, else the path of a JSON file), defaulting to `ORRERY_DEFAULT_PROFILE`.

    Raises `ValueError` (at startup) for unreadable or invalid profiles or an unknown
    default.
    """
    source = _json_or_file(settings.profiles, "ORRERY_PROFILES")
    return ProfileRegistry(parse_profiles(source).profiles, default=settings.default_profile)


def document_facts(settings: QuerySettings, vector_dimension: int | None) -> dict[str, Any]:
    """What this deployment's OpenAPI document says of the bounds its configuration sets
    (`contracts.openapi.DEPLOYMENT`): the largest result limit, the fusion profile ids,
    the embedder's dimension."""
    facts: dict[str, Any] = {
        "max_result_limit": settings.max_result_limit,
        "fusion_profiles": profile_registry(settings).ids(),
    }
    if vector_dimension is not None:
        facts["vector_dimension"] = vector_dimension
    return facts


def vocabulary_registry(settings: QuerySettings) -> VocabularyRegistry:
    """The phrase-plan vocabularies of `ORRERY_VOCABULARIES` (inline JSON when it starts
    with `{`, else the path of a JSON file) and the vector restriction's bound.

    Raises `ValueError` (at startup) for unreadable or invalid vocabularies.
    """
    source = _json_or_file(settings.vocabularies, "ORRERY_VOCABULARIES")
    return VocabularyRegistry(
        parse_vocabularies(source), max_documents=settings.phrase_max_documents
    )


def query_limits(settings: QuerySettings) -> QueryLimits:
    """The query worker's limits, depths and fusion profiles from its settings."""
    return QueryLimits(
        max_result_limit=settings.max_result_limit,
        candidate_depth=settings.candidate_depth,
        lexical_depth=settings.lexical_candidate_depth,
        vector_depth=settings.vector_candidate_depth,
        freshness_half_life_days=settings.freshness_half_life_days,
        response_ttl_seconds=settings.response_ttl_seconds,
        profiles=profile_registry(settings),
        paging_depth=settings.paging_candidate_depth,
        vocabularies=vocabulary_registry(settings),
    )


def embedded_query_ports(
    db_path: Path,
    *,
    embedder: Embedder,
    lexical_index_provider: Callable[[str], Any],
    vector_shard_provider: Callable[[str], Any],
    vector_flat_provider: Callable[[str], Any] | None = None,
    vector_points_provider: Callable[[str], Any] | None = None,
    vector_ids_provider: Callable[[str], Any] | None = None,
    lexical_flat_provider: Callable[[str], Any] | None = None,
    cache_responses: bool = True,
    scopes: ScopeRegistry | None = None,
    cursors: CursorCodec | None = None,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    record_cache_bytes: int = DEFAULT_RECORD_CACHE_BYTES,
    vector_hnsw_ef: int = DEFAULT_HNSW_EF,
) -> QueryPorts:
    """Query ports over the embedded stack.

    tantivy indexes and qdrant-edge shards are opened once per process by the
    projector's adapters; the query side reads the same objects through providers
    (`lexical_index_provider(generation_id)` -> `(tantivy.Index, text analyzer name,
    text analyzer)`).
    """
    routing = SqliteRouting(db_path)
    records = SqliteRecordReader(db_path, max_answer_bytes=max_answer_bytes)
    return QueryPorts(
        routing=routing,
        # Small append-only generations are scored from the projector's in-memory
        # copies (`contracts.flat_lexical`) when it offers them.
        lexical=TantivyLexicalSearch(lexical_index_provider, flat_provider=lexical_flat_provider),
        # The re-score's vectors of lexical candidates, by revision: 256 MiB of rows per
        # tenant, dropped a generation at a time, 4 tenants (`VectorMemo`; one tenant's
        # fills never evict another's).
        # Generations the engine would brute-force are scanned from the projector's
        # in-memory copies (`contracts.flat_vectors`) when it offers them.
        vectors=QdrantEdgeVectorSearch(
            vector_shard_provider,
            hnsw_ef=vector_hnsw_ef,
            memo=VectorMemo(),
            flat_provider=vector_flat_provider,
            # Searches read their candidates' fields from the projector's point tables
            # (`contracts.point_table`) instead of the points' payloads when it has one.
            points_provider=vector_points_provider,
            # How each generation keys its points (integer ids since session 27).
            ids_provider=vector_ids_provider,
        ),
        records=records,
        query_vectors=QueryEmbeddingCache(embedder),
        responses=MemoryCache() if cache_responses else None,
        scopes=ScopeResolver(routing, scopes, holds=records.holds),
        cursors=cursors,
        # A generation both engines answer (no in-memory copy: a large one) runs its
        # sources and score lookups side by side (`QueryPorts.overlap`): its tantivy
        # calls let the GIL go and last long enough to pay for the handoff. One with an
        # in-memory copy runs everything one after the other on the request's thread,
        # the vector search first: qdrant-edge keeps the GIL through its search, so the
        # BM25 copy's pass beside it only waited for it and slowed it down (session 22),
        # and beside the flat vector scan (numpy, ~0.2-0.4 ms with the GIL let go) the
        # pass's Python and the scan's hand-backs of the GIL cost more than the overlap
        # saved (docs/bench/README.md, session 23: SciFact server total x0.93).
        overlap=shared_source_pool(),
        overlap_for=_engines_answer(lexical_flat_provider, vector_flat_provider),
        # qdrant-edge keeps the GIL through its search: tantivy's is let in first.
        lexical_first=True,
        record_cache=_record_cache(record_cache_bytes, max_answer_bytes),
    )


def _engines_answer(
    *flat_providers: Callable[[str], Any] | None,
) -> Callable[[str], bool]:
    """Whether none of `flat_providers` offers an in-memory copy of a generation. A
    provider that fails (an unknown generation, a copy that could not be made) gives
    False: the search then asks the same provider and reports the failure itself."""
    providers = [provider for provider in flat_providers if provider is not None]

    def engines_answer(generation_id: str) -> bool:
        try:
            return all(provider(generation_id) is None for provider in providers)
        except Exception:  # reported by the search, through its adapter
            return False

    return engines_answer


def server_query_ports(
    db_path: Path,
    *,
    embedder: Embedder,
    opensearch_url: str,
    opensearch_index_prefix: str,
    qdrant: Any,
    qdrant_collection_prefix: str,
    redis_url: str | None,
    cache_responses: bool = True,
    scopes: ScopeRegistry | None = None,
    cursors: CursorCodec | None = None,
    database_url: str | None = None,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    opensearch_search_type: SearchType = "dfs_query_then_fetch",
    record_cache_bytes: int = DEFAULT_RECORD_CACHE_BYTES,
    vector_hnsw_ef: int = DEFAULT_HNSW_EF,
    vector_spread_ef_factor: int = DEFAULT_SPREAD_EF_FACTOR,
    vector_spread_acorn_selectivity: float = DEFAULT_SPREAD_ACORN_SELECTIVITY,
) -> tuple[QueryPorts, Callable[[], None]]:
    """Query ports over the servers, and the function that closes what they opened:
    OpenSearch, Qdrant (`qdrant` is a `QdrantClient`), Redis for responses and query
    vectors (in-process when `redis_url` is None); routing and payloads from PostgreSQL
    when `database_url` is given (nothing on disk), else from the canonical SQLite
    database `db_path`."""
    # Imported here: the embedded deployment never loads these drivers.
    from query.adapters.opensearch_lexical import OpenSearchLexicalSearch
    from query.adapters.qdrant_vectors import QdrantServerVectorSearch
    from query.adapters.redis_cache import RedisCache

    shared: Cache = MemoryCache() if redis_url is None else RedisCache(redis_url)
    routing: SqliteRouting | PostgresRouting
    records: RecordReader
    close: Callable[[], None] = shared.close
    if database_url:
        from query.adapters.postgres_routing import (
            PostgresRecordReader,
            PostgresRouting,
            open_reads,
        )

        reads = open_reads(database_url)
        routing = PostgresRouting(reads)
        records = PostgresRecordReader(reads, max_answer_bytes=max_answer_bytes)

        def close() -> None:
            shared.close()
            reads.close()

    else:
        routing = SqliteRouting(db_path)
        records = SqliteRecordReader(db_path, max_answer_bytes=max_answer_bytes)
    ports = QueryPorts(
        routing=routing,
        lexical=OpenSearchLexicalSearch(
            opensearch_url, index_prefix=opensearch_index_prefix, search_type=opensearch_search_type
        ),
        vectors=QdrantServerVectorSearch(
            qdrant,
            collection_prefix=qdrant_collection_prefix,
            hnsw_ef=vector_hnsw_ef,
            spread_ef_factor=vector_spread_ef_factor,
            spread_acorn_selectivity=vector_spread_acorn_selectivity,
        ),
        records=records,
        query_vectors=QueryEmbeddingCache(embedder, shared=None if redis_url is None else shared),
        responses=shared if cache_responses else None,
        scopes=ScopeResolver(
            routing, scopes, shared=None if redis_url is None else shared, holds=records.holds
        ),
        cursors=cursors,
        overlap=shared_source_pool(),
        record_cache=_record_cache(record_cache_bytes, max_answer_bytes),
    )
    return ports, close


def _record_cache(max_bytes: int, max_answer_bytes: int) -> RecordCache | None:
    """The per-tenant cache of stored records answers used (`ORRERY_RECORD_CACHE_BYTES`
    per tenant; 0: none)."""
    if max_bytes <= 0:
        return None
    return RecordCache(max_answer_bytes=max_answer_bytes, max_bytes=max_bytes)


def qualify_profiles(settings: QuerySettings) -> list[str]:
    """The profiles a qualification compares: `ORRERY_QUALIFY_PROFILES`, else the
    default profile and `rrf@2` (checked against the registry at startup)."""
    registry = profile_registry(settings)
    named = [p.strip() for p in settings.qualify_profiles.split(",") if p.strip()]
    profiles = list(dict.fromkeys(named or [registry.default_id, "rrf@2"]))
    for profile in profiles:
        registry.get(profile)  # unknown_profile at startup
    return profiles


def server_qualifier(
    settings: QuerySettings, ports: QueryPorts, *, qdrant: Any
) -> Callable[[GenerationDescriptor, int, QualifyRequest, str], QualificationReceipt]:
    """Runs qualification samples over the server query ports `ports`: the reference is
    the lexical copy the caller made (searched through the same OpenSearch adapter) and
    exact search in the generation's Qdrant collection (`qdrant`: the shared client)."""
    from query.adapters.qdrant_vectors import QdrantServerVectorSearch

    exact = QdrantServerVectorSearch(
        qdrant, collection_prefix=settings.qdrant_collection_prefix, exact=True
    )
    limits = query_limits(settings)
    profiles = qualify_profiles(settings)
    method = {
        "lexical": f"opensearch {settings.opensearch_search_type}",
        "lexical_reference": "opensearch, one shard, no replica, same mapping (a copy)",
        "vector": "qdrant hnsw (ef = max(vector_hnsw_ef, cap + 1); spread: at least "
        "vector_spread_ef_factor * (cap + 1) per shard key, filtered searches with acorn "
        "up to vector_spread_acorn_permille / 1000 of a segment)",
        "vector_reference": "qdrant exact",
        "fusion": "global source ranks (query.service)",
    }

    def run(
        descriptor: GenerationDescriptor, position: int, request: QualifyRequest, reference: str
    ) -> QualificationReceipt:
        setup = QualifySetup(
            production=ports,
            reference_lexical=ports.lexical,
            reference_vectors=exact,
            reference_id=reference,
            limits=limits,
            profiles=profiles,
            thresholds=settings.qualification_thresholds(),
            sample_size=settings.qualify_queries,
            workers=settings.qualify_workers,
            method=method,
            search=settings.vector_search(),
            heads=ports.records if isinstance(ports.records, HeadListing) else None,
        )
        return qualify_generation(descriptor, position, request, setup=setup)

    return run


def kouten_ports(
    settings: QuerySettings,
    ports: QueryPorts,
    *,
    routing: SqliteRouting | PostgresRouting,
    backend: Literal["embedded", "servers"],
) -> KoutenPorts:
    """The KoutenDB envelope's ports, next to the registry `routing` reads: over the
    SQLite registry, ring statistics from its database and profiles and kept envelopes
    in `DATA_DIR/koutendb.sqlite`; over PostgreSQL, both from its tables (on the
    worker's pool: nothing on disk)."""
    profiles: SearchProfiles
    envelopes: EnvelopeLog
    rings: RingStatistics
    if isinstance(routing, SqliteRouting):
        store = SqliteKoutenStore(settings.data_dir / "koutendb.sqlite")
        profiles, envelopes, rings = store, store, SqliteRingStats(routing.path)
    else:
        from query.adapters.postgres_koutendb import PostgresKoutenStore
        from query.adapters.postgres_ring_stats import PostgresRingStats

        shared = PostgresKoutenStore(routing.reads)
        profiles, envelopes, rings = shared, shared, PostgresRingStats(routing.reads)
    return KoutenPorts(
        query=ports,
        limits=query_limits(settings),
        tables=RingTables(rings),
        profiles=profiles,
        envelopes=envelopes,
        backend=backend,
    )
