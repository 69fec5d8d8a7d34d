"""Settings of the query worker and of the embedded stack (read once, in `main()`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.admission import MAX_RECORD_BYTES
from contracts.events import KAFKA_MAX_RECORD_BYTES
from contracts.index_fields import DEFAULT_TEXT_LANGUAGE, TextLanguages, parse_text_languages
from contracts.qualification import QualificationThresholds
from contracts.vector_payload import (
    DEFAULT_HNSW_EF,
    DEFAULT_SPREAD_ACORN_SELECTIVITY,
    DEFAULT_SPREAD_EF_FACTOR,
)

__all__ = ["QuerySettings", "record_ceiling"]


def record_ceiling(mode: str) -> int:
    """The largest record (stored JSON bytes) a deployment's store or log takes, the
    default and the most of `ORRERY_MAX_RECORD_BYTES`: the embedded store's bound, or in
    server mode one Kafka message (the event wraps the record)."""
    return KAFKA_MAX_RECORD_BYTES if mode == "servers" else MAX_RECORD_BYTES


class QuerySettings(BaseSettings):
    """`ORRERY_*` environment variables. Defaults run offline on one machine."""

    model_config = SettingsConfigDict(env_prefix="ORRERY_", extra="ignore")

    mode: Literal["embedded", "servers"] = "embedded"
    data_dir: Path = Path("./orrery-data")
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: str = Field(default="", description="key=namespace[/galaxy],…")
    api_key_header: str = Field(
        default="x-api-key",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$",
        description="The header an API key travels in (ChonkyDB's `api_key_header`); "
        "`Authorization: Bearer` works whatever it is",
    )
    max_batch: int = Field(default=1_000, ge=1, le=100_000)
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1_024,
        le=1024 * 1024 * 1024,
        description="Largest request body of every HTTP app; larger (by Content-Length, or "
        "counted while a chunked body streams in) = 413 body_too_large. A batch of "
        "max_batch records with vectors may need more (about 8 KB per 384-d vector)",
    )
    max_import_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        ge=1_024,
        description="Largest body of a streamed JSON-lines import (POST /v1/koutendb/import); "
        "it is read line by line, at most one batch held at a time",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1_024,
        le=16 * 1024 * 1024,
        description="Largest request head (request line and headers) `orrery serve` reads; "
        "larger = 431 headers_too_large, connection closed",
    )
    max_headers: int = Field(
        default=100, ge=1, le=10_000, description="Most header lines of one request (431)"
    )
    max_record_bytes: int = Field(
        default=MAX_RECORD_BYTES,
        ge=1_024,
        description="Largest record (its stored JSON, UTF-8 bytes) every write route "
        "accepts; larger = 413 record_too_large (an import: an error line). Default and "
        "most: the deployment's store or log bound, 4 MiB embedded, 960 KiB in server mode "
        "(one Kafka message within the broker's default 1 MiB); read once at startup",
    )
    max_import_batch_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1_024,
        description="An import writes its pending lines as one batch once they hold this "
        "many bytes (or batchSize lines): its memory is bounded in bytes, not lines",
    )
    max_answer_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1_024,
        description="Most stored record bytes one answer materializes (by-id reads, "
        "top-k payloads); more = 413 answer_too_large (ask for fewer ids or a page)",
    )
    record_cache_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=0,
        description="Stored records each query worker keeps per tenant after an answer "
        "used them, in bytes (their JSON text plus ~2 KB a record; 16 tenants at most): a "
        "revision never changes, so a kept record is never stale and the next answers "
        "with it skip the store's read. 0 = off",
    )
    max_result_limit: int = Field(
        default=500,
        ge=1,
        le=1_000,
        description="Largest result_limit / page_size (Twinr asks for up to 500; the cost "
        "per limit: docs/chonkydb.md)",
    )
    candidate_depth: int = Field(
        default=100, ge=1, le=10_000, description="Candidates fetched per source"
    )
    lexical_candidate_depth: int | None = Field(
        default=None, ge=1, le=10_000, description="Lexical candidates; None = candidate_depth"
    )
    vector_candidate_depth: int | None = Field(
        default=None, ge=1, le=10_000, description="Vector candidates; None = candidate_depth"
    )
    vector_hnsw_ef: int = Field(
        default=DEFAULT_HNSW_EF,
        ge=1,
        le=100_000,
        description="Least HNSW ef of a vector search (Qdrant and qdrant-edge; raised to the "
        "points asked for, limit + 1)",
    )
    vector_spread_ef_factor: int = Field(
        default=DEFAULT_SPREAD_EF_FACTOR,
        ge=1,
        le=100,
        description="HNSW ef of a spread generation's search (more than one shard or copy: "
        "server mode) per point asked of each shard key; recorded in qualification receipts "
        "(docs/deploy.md)",
    )
    vector_spread_acorn_selectivity: float = Field(
        default=DEFAULT_SPREAD_ACORN_SELECTIVITY,
        ge=0.0,
        le=1.0,
        description="A spread generation's filtered HNSW searches use Qdrant's ACORN when "
        "the filter keeps at most this share of a segment's points (0: never); recorded in "
        "qualification receipts (docs/deploy.md)",
    )
    default_profile: str = Field(
        default="weighted@3", description="Fusion profile of requests that name none"
    )
    profiles: str = Field(
        default="",
        description="Operator fusion profiles: JSON ({'profiles': [...]} or a list), or "
        "the path of a file holding it (see contracts/profiles.py)",
    )
    vocabularies: str = Field(
        default="",
        description="Controlled-term vocabularies of phrase plans: JSON "
        "{namespace: {vocabulary: {term: [phrase, ...]}}}, or the path of a file holding "
        "it (see contracts/phrases.py, docs/query.md)",
    )
    phrase_max_documents: int = Field(
        default=10_000,
        ge=1,
        le=100_000,
        description="Most documents the required phrase groups of a request may match "
        "when the vector source is searched (they restrict it by id); more = 422 "
        "phrase_set_too_large",
    )
    freshness_half_life_days: float = Field(default=30.0, gt=0.0)
    default_language: str = Field(
        default=DEFAULT_TEXT_LANGUAGE,
        description="Stemming language of the text of namespaces not in namespace_languages "
        "(a Snowball language such as english or german; 'none' = no stemming). Read when a "
        "generation is created: a change applies to the next generation built",
    )
    namespace_languages: str = Field(
        default="",
        description='Stemming language per namespace, JSON: {"docs_de": "german"}',
    )
    scopes: str = Field(
        default="",
        description="Operator scope refs: JSON {namespace or '*': {scope_ref: snapshot_kind "
        "| {snapshot_kind, filters}}}, or the path of a file holding it (docs/query.md)",
    )
    cursor_keys: str = Field(
        default="",
        description="Continuation-cursor HMAC keys 'kid1:secret,kid0:oldsecret' (the first "
        "signs, all verify); unset = a random key per process (cursors then work only on "
        "the worker that issued them: set shared keys behind a load balancer)",
    )
    cursor_ttl_seconds: float = Field(
        default=600.0, gt=0.0, le=86_400.0, description="Lifetime of a continuation cursor"
    )
    paging_candidate_depth: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Candidates per source of paged requests (page_size or cursor): the "
        "window pages can reach; None = the usual candidate depths",
    )
    projector_batch_size: int = Field(default=2_048, ge=1, le=100_000)
    projector_poll_seconds: float = Field(default=0.05, gt=0.0)
    embedder_threads: int = Field(default=2, ge=1, le=64)
    embedding_cache_dir: Path | None = Field(
        default=None,
        description="A directory of document vectors kept across data dirs and processes, "
        "keyed by embedder id and text digest (a corpus loaded again is not re-embedded); "
        "None = each data dir's own vector cache only",
    )
    query_embedder_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Threads of the query worker's own embedding session (query texts "
        "only): a document batch being embedded never holds a query's embedding up",
    )
    optimize_interval_seconds: float = Field(default=5.0, gt=0.0)
    optimize_growth: float = Field(
        default=0.25,
        ge=0.0,
        le=10.0,
        description="While a generation takes writes, its HNSW is rebuilt once the points "
        "written since reach this fraction of the indexed ones (at least 1,000): the "
        "builds of an ingest add up to about (1 + growth) / growth times its size, not "
        "its square; once it is quiet for an optimize interval the rest is built. "
        "0 = every 1,000 points",
    )
    optimize_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="While a generation takes writes, the share of the wall time its "
        "HNSW builds take at most: after a build of t seconds the next waits t * (1 - "
        "share) / share, so at scale (a build outlasting the growth threshold) the builds "
        "get fewer and larger instead of running back to back; searches stay exact "
        "meanwhile. Once the generation is quiet the rest is built at once. 1 = no pause",
    )
    lexical_compaction: bool = Field(
        default=True,
        description="Embedded: rewrite a generation's tantivy index as one segment (fewer "
        "segments, faster BM25, same answers) once it was quiet for an optimize interval "
        "and is due (`lexical_compact_growth`); paced to half the wall time. The same "
        "thread then builds a quiet generation's in-memory BM25 copy from the canonical "
        "store (up to 100k documents, none deleted) for queries to score in numpy",
    )
    lexical_compact_growth: float = Field(
        default=0.25,
        ge=0.0,
        le=10.0,
        description="Due once the documents outside a generation's largest tantivy "
        "segment (in its other segments, or deleted) reach this fraction of that segment's: "
        "a trickle of writes is not worth rewriting everything for, an ingest's tail is",
    )
    cache_responses: bool = True
    response_ttl_seconds: float = Field(default=300.0, gt=0.0)

    # Server mode (ORRERY_MODE=servers). Without database_url the canonical store and the
    # generation registry stay in SQLite under data_dir, shared by the processes of one host.
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL of the canonical store and outbox (ingest and relay "
        "roles; the projector and query roles do not read it yet, docs/deploy.md). "
        "Unset = SQLite under data_dir",
    )
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_client: Literal["confluent", "kafka-python"] = Field(
        default="confluent",
        description="The Kafka client of the relay and the projector: confluent-kafka "
        "(librdkafka, compiled) or kafka-python (pure Python). Same wire format and "
        "consumer group protocol: the two can share topics and a group (docs/deploy.md)",
    )
    kafka_topic_prefix: str = "orrery.records"
    kafka_partitions: int = Field(default=3, ge=1, le=1_000)
    kafka_group: str = "orrery-projector"
    kafka_session_timeout_ms: int = Field(default=10_000, ge=1_000)
    kafka_metadata_max_age_ms: int = Field(
        default=30_000,
        ge=1_000,
        description="The projector sees a new namespace's topic within this time "
        "(sooner: within about a second once it measured the log's lag)",
    )
    kafka_join_timeout_ms: int = Field(
        default=60_000,
        ge=1_000,
        description="A projector not a stable consumer-group member after this long "
        "reports Kafka unavailable and rejoins with a new consumer",
    )
    opensearch_url: str = "http://127.0.0.1:9200"
    opensearch_index_prefix: str = "orrery"
    opensearch_refresh_interval: str = Field(
        default="1s",
        description="Index refresh interval, a backstop: the projector refreshes an index "
        "at the end of each batch it writes (before committing it), so this bounds neither "
        "freshness lag nor batch time; shorter means more segments during bulk ingest.",
    )
    qdrant_url: str | None = Field(
        default=None,
        description="A Qdrant server; unset = qdrant-client local mode under data_dir "
        "(one process only: for CI and single-process `serve --mode servers`).",
    )
    qdrant_collection_prefix: str = "orrery"
    redis_url: str | None = Field(default=None, description="unset = in-process cache")
    relay_batch_size: int = Field(default=500, ge=1, le=100_000)

    # Generations (`orrery gen …`, the admin API, replica eligibility).
    admin_key: str = Field(
        default="", description="Key of the admin API (/v1/admin/…); unset = the API is off"
    )
    coverage_fallback: Literal["none", "previous_verified"] = Field(
        default="none",
        description="When the live generation is not eligible: fail with 503 "
        "coverage_unavailable (none), or answer from the previous verified generation and "
        "declare it in query_plan.fallback",
    )
    eligibility_interval_seconds: float = Field(
        default=60.0,
        gt=0.0,
        description="How often each routed generation's evidence is re-checked (a full "
        "read-back of every engine: seconds of CPU at 100k documents)",
    )
    eligibility_background_share: float = Field(
        default=0.25,
        gt=0.0,
        le=1.0,
        description="Share of the wall time a periodic re-check of an eligible generation "
        "may work: it sleeps between pages so that queries sharing the interpreter are not "
        "stalled (1 = flat out). First checks, suspects and negative verdicts run flat out",
    )
    eligibility_recheck_share: float = Field(
        default=0.2,
        gt=0.0,
        le=1.0,
        description="Share of the wall time the periodic re-checks of one generation may "
        "take in all: after a check that lasted S seconds the next waits at least "
        "S * (1 / share - 1) (and at least eligibility_interval_seconds), so a large "
        "generation is not re-read back to back",
    )
    eligibility_max_interval_seconds: float = Field(
        default=3600.0,
        gt=0.0,
        description="The longest rest between periodic re-checks of a generation nothing "
        "changed: each re-check that finds it eligible at the same registry facts (no "
        "batch committed, the same state) as the verdict before doubles the rest, up to "
        "this; a change or a negative verdict starts over",
    )
    promote_max_lag_events: int = Field(
        default=1_000, ge=0, description="A promote is refused further behind the log"
    )
    gen_build_batch_size: int = Field(default=1_000, ge=1, le=100_000)
    gen_build_pause_seconds: float = Field(
        default=0.0, ge=0.0, description="Pause between snapshot batches of a build"
    )
    gen_catch_up_timeout_seconds: float = Field(default=600.0, gt=0.0)
    gen_build_in_child: bool = Field(
        default=True,
        description="Embedded builds bulk-load in a child process (serving keeps its "
        "interpreter and CPUs); false = in the server process with dual writes",
    )
    gen_build_child_nice: int = Field(
        default=10, ge=0, le=19, description="CPU niceness added to the bulk-load child"
    )
    index_shards: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Shards (OpenSearch primaries, Qdrant shards) of each new generation built "
        "in server mode; more than 1 must be qualified before promote (docs/deploy.md)",
    )
    index_replicas: int = Field(
        default=0,
        ge=0,
        le=8,
        description="Extra copies of each shard of a new generation (server mode); more than "
        "0 must be qualified before promote",
    )
    index_topology: str = Field(
        default="",
        description='Per-scope shards/replicas, JSON {"<namespace>[/<snapshot_kind>]": '
        '{"shards": N, "replicas": R}} (the longest matching key wins)',
    )
    opensearch_search_type: Literal["dfs_query_then_fetch", "query_then_fetch"] = Field(
        default="dfs_query_then_fetch",
        description="How OpenSearch scores across shards: dfs_query_then_fetch gathers global "
        "term statistics first (scores equal a 1-shard index's); query_then_fetch scores "
        "each shard with its own statistics and is for diagnosis only (a receipt catches it)",
    )
    qualify_queries: int = Field(
        default=200, ge=1, le=10_000, description="Sample size of `orrery gen qualify`"
    )
    qualify_workers: int = Field(
        default=4,
        ge=1,
        le=32,
        description="Qualification queries run side by side (each waits on the engines "
        "most of its time); the receipt is the same at any width",
    )
    qualify_profiles: str = Field(
        default="",
        description="Profiles a qualification compares (comma separated); unset = the "
        "default profile and rrf@2",
    )
    qualify_lexical_inclusion: float = Field(default=1.0, ge=0.0, le=1.0)
    qualify_order_agreement: float = Field(default=1.0, ge=0.0, le=1.0)
    qualify_order_agreement_over: Literal["all", "complete"] = Field(
        default="complete",
        description="Queries order agreement is judged over: 'complete' (every source's "
        "candidates held the reference's top D; the others are judged by vector inclusion "
        "and top-k overlap, since one candidate HNSW misses reorders fusion however right it "
        "is) or 'all' (docs/deploy.md)",
    )
    qualify_vector_inclusion_mean: float = Field(default=0.99, ge=0.0, le=1.0)
    qualify_vector_inclusion_min: float = Field(default=0.95, ge=0.0, le=1.0)
    qualify_overlap_mean: float = Field(default=0.99, ge=0.0, le=1.0)
    switch_interval_seconds: float | None = Field(
        default=0.001,
        gt=0.0,
        description="Interpreter thread switch interval while the embedded server runs "
        "(shorter: the projector, the POST handling and queries each wait less for the "
        "interpreter after an engine call let it go; docs/deploy.md); unset = Python's 5 ms",
    )
    gen_build_switch_interval_seconds: float | None = Field(
        default=0.001,
        gt=0.0,
        description="Interpreter thread switch interval while a build runs in the server "
        "(shorter: queries wait less behind the CPU-bound build); unset = unchanged",
    )

    # Operations: logs, metrics, traces (orrery.logs, orrery.telemetry, orrery.tracing).
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="Log lines on stderr: JSON objects (json), readable text (text), or "
        "text on a terminal and JSON otherwise (auto)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    malloc_arenas: int = Field(
        default=2,
        ge=0,
        le=1024,
        description="glibc malloc arenas of a server process, at most (contracts.malloc; "
        "0: glibc's default, 8 per core); MALLOC_ARENA_MAX in the environment wins",
    )
    access_log: bool | None = Field(
        default=None,
        description="One INFO line per HTTP request (orrery.access); unset = on in server "
        "mode, off embedded",
    )
    metrics: bool = Field(
        default=True, description="Prometheus metrics (GET /metrics, ORRERY_METRICS_PORT)"
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description="Also serve the metrics, without a key, on this port of metrics_host "
        "(the only HTTP listener of the relay and projector roles); unset = none",
    )
    metrics_host: str = Field(default="127.0.0.1", description="Bind address of metrics_port")
    metrics_namespace_labels: bool = Field(
        default=False,
        description="Label per-scope metrics with the namespace (one series per namespace "
        "and scope); off = the maximum over namespaces per snapshot kind",
    )
    tracing: bool = Field(
        default=False, description="OpenTelemetry spans per request, stage, write and batch"
    )
    tracing_sample_ratio: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Head sampling of spans (OpenTelemetry ParentBased(TraceIdRatioBased)): "
        "a request continuing a caller's trace follows its sampled flag, any other request "
        "and each projector batch is sampled with this probability; an unsampled request "
        "makes no span but keeps its W3C trace ids",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces endpoint (http://collector:4318/v1/traces); needs the "
        "'otlp' extra; spans are made and exported by an exporter child process; unset = "
        "no spans are made, each request still gets W3C trace ids "
        "(query plans, logs, the traceparent a write carries)",
    )

    @model_validator(mode="before")
    @classmethod
    def _record_bound_of_the_deployment(cls, data: Any) -> Any:
        # Unset: the most the deployment's store or log takes (`record_ceiling`).
        if isinstance(data, dict) and data.get("max_record_bytes") in (None, ""):
            mode = data.get("mode") or "embedded"
            data = {**data, "max_record_bytes": record_ceiling(str(mode))}
        return data

    @field_validator("max_record_bytes")
    @classmethod
    def _record_bound_fits(cls, value: int, info: ValidationInfo) -> int:
        mode = str(info.data.get("mode", "embedded"))
        ceiling = record_ceiling(mode)
        if value > ceiling:
            what = "the embedded store" if mode == "embedded" else "one Kafka message"
            raise ValueError(f"{value} is more than {what} takes in {mode} mode ({ceiling})")
        return value

    @field_validator("vector_spread_acorn_selectivity")
    @classmethod
    def _acorn_in_thousandths(cls, value: float) -> float:
        # The receipt records the share in thousandths: the search runs with exactly that.
        return round(value, 3)

    @model_validator(mode="after")
    def _languages_are_known(self) -> QuerySettings:
        self.text_languages()  # raises ValueError at startup, not at a generation's creation
        self._topology_overrides()  # the same for ORRERY_INDEX_TOPOLOGY
        return self

    def check_embedded_topology(self) -> None:
        """`ValueError` when sharding is configured for the embedded stack (its engines
        keep one copy in one place): said at startup, not at the first build."""
        if self.spread_configured():
            raise ValueError(
                "embedded mode keeps every generation in one shard with one copy: "
                "ORRERY_INDEX_SHARDS must be 1, ORRERY_INDEX_REPLICAS 0 and "
                "ORRERY_INDEX_TOPOLOGY unset (sharding needs ORRERY_MODE=servers)"
            )

    def _topology_overrides(self) -> dict[str, tuple[int, int]]:
        if not self.index_topology.strip():
            return {}
        try:
            raw = json.loads(self.index_topology)
        except ValueError as exc:
            raise ValueError(f"ORRERY_INDEX_TOPOLOGY is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("ORRERY_INDEX_TOPOLOGY must be an object")
        out: dict[str, tuple[int, int]] = {}
        for key, value in raw.items():
            if not isinstance(value, dict) or set(value) - {"shards", "replicas"}:
                raise ValueError(
                    f"ORRERY_INDEX_TOPOLOGY[{key!r}] must be {{'shards': N, 'replicas': R}}"
                )
            shards = value.get("shards", self.index_shards)
            replicas = value.get("replicas", self.index_replicas)
            if not (isinstance(shards, int) and 1 <= shards <= 64):
                raise ValueError(f"ORRERY_INDEX_TOPOLOGY[{key!r}].shards must be 1-64")
            if not (isinstance(replicas, int) and 0 <= replicas <= 8):
                raise ValueError(f"ORRERY_INDEX_TOPOLOGY[{key!r}].replicas must be 0-8")
            out[str(key)] = (shards, replicas)
        return out

    def spread_configured(self) -> bool:
        """Whether any scope's new generations would be sharded or replicated."""
        shapes = [(self.index_shards, self.index_replicas), *self._topology_overrides().values()]
        return any(shape != (1, 0) for shape in shapes)

    def index_shape(self, namespace: str, snapshot_kind: str) -> tuple[int, int]:
        """`(shards, replicas)` of a new generation of a scope: the override for
        `namespace/snapshot_kind`, else for `namespace`, else the defaults."""
        overrides = self._topology_overrides()
        for key in (f"{namespace}/{snapshot_kind}", namespace):
            if key in overrides:
                return overrides[key]
        return self.index_shards, self.index_replicas

    def qualification_thresholds(self) -> QualificationThresholds:
        return QualificationThresholds(
            lexical_inclusion=self.qualify_lexical_inclusion,
            order_agreement=self.qualify_order_agreement,
            order_agreement_over=self.qualify_order_agreement_over,
            vector_inclusion_mean=self.qualify_vector_inclusion_mean,
            vector_inclusion_min=self.qualify_vector_inclusion_min,
            overlap_mean=self.qualify_overlap_mean,
        )

    def vector_search(self) -> dict[str, int]:
        """The search-time settings that change what a vector search returns: a
        qualification receipt records them and vouches only for them."""
        return {
            "vector_hnsw_ef": self.vector_hnsw_ef,
            "vector_spread_ef_factor": self.vector_spread_ef_factor,
            # A receipt's settings are integers: the share in thousandths.
            "vector_spread_acorn_permille": round(self.vector_spread_acorn_selectivity * 1000),
        }

    def text_languages(self) -> TextLanguages:
        """The stemming language of each namespace's new generations."""
        return parse_text_languages(self.namespace_languages, self.default_language)
