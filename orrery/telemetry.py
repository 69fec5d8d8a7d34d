"""Prometheus metrics of every role, and the one middleware that records a request.

`Metrics` owns one `prometheus_client.CollectorRegistry` per process (per stack: tests
open several stacks in one interpreter). What is counted where:

- every HTTP request, by route template (`/v1/admin/generations/{generation_id}/promote`,
  never the path), method and status: `orrery_http_request_duration_seconds` (its
  `_count` is the request count); errors by code and dependency: `orrery_errors_total`;
- every answered query (`query.ports.QueryObserver`): per-stage latency
  (`orrery_query_stage_duration_seconds{endpoint,stage}`, the stages of
  `query_plan.latency_ms`), time inside engine calls (`…engine_call_duration_seconds`),
  response-cache results (`orrery_query_cache_total{result}`), candidates per source;
- every projector batch and relay step (`wrap_projector_step`, `wrap_relay_step`);
- every embedding call (`CountingEmbedder`): texts, seconds, texts in flight;
- at scrape time (`StateCollector`), from the registry every role shares: lag in events
  and seconds per scope, generation states, eligibility, running builds (a build in the
  bulk-load child reports its progress back to the parent over the child's protocol, so
  the parent's numbers are the child's), the projector's log lag and dead letters, and
  the relay's outbox depth.

Labels are low-cardinality by construction: route templates, stage and engine names,
error codes, generation states, snapshot kinds. Namespaces appear only with
`ORRERY_METRICS_NAMESPACE_LABELS=true` (then one series per namespace and scope: size
the Prometheus server for it).

The request thread does not observe anything itself: a finished request and an answered
query are each one tuple appended to a queue (`collections.deque`: appends and pops are
atomic), and the histograms and counters of the hot path are brought up to date when
the registry is collected (`_HotPath`, the collector that owns them: every scrape, on
`GET /metrics` or the metrics port, sees every request finished before it), or by the
request that finds `MAX_PENDING` entries queued (no scrape for a long while).
`bench/metrics_overhead.py` measures what is left on the request thread.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Header
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.auth import Access, check_admin_key, declare
from contracts.embedding import Embedder
from contracts.errors import ErrorCode
from contracts.request_context import RequestContext, close_request, open_request
from orrery.logs import AccessLog

if TYPE_CHECKING:
    from orrery.tracing import Tracing
    from query.ports import Answered
    from query.settings import QuerySettings

__all__ = [
    "REQUEST_BUCKETS",
    "STAGE_BUCKETS",
    "CountingEmbedder",
    "Metrics",
    "Observability",
    "RequestTelemetry",
    "StateCollector",
    "metrics_router",
    "observed_projector_step",
    "open_observability",
    "query_observer",
    "serve_metrics_port",
    "state_collector",
]

log = logging.getLogger("orrery.metrics")

# Seconds. The benchmarks' stages run from ~20 us (scope_resolve, a cache hit's rerank)
# to tens of ms (a 100k-document index_search under load); requests from ~0.5 ms
# (/healthz, a cache hit) to seconds (a batch write, an admin call).
STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5,
)  # fmt: skip
REQUEST_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
)  # fmt: skip
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CANDIDATE_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000)
UNMATCHED_ROUTE = "<unmatched>"
_SAFE_LABEL = re.compile(r"[a-z0-9_.:-]{1,40}")
# Queued observations (requests plus answers) past which the request that queues one
# folds the queue in itself: bounds the memory of a process nobody scrapes. About 2 ms
# of work once every 8,192 requests.
MAX_PENDING = 8_192


def _bounded(value: str | None) -> str:
    """A label value from code we do not control (a dependency name): kept when it looks
    like a name, else `other`, so no message text can become a series."""
    if not value:
        return ""
    return value if _SAFE_LABEL.fullmatch(value) else "other"


class Metrics:
    """The metrics of one process (see the module docstring). Thread-safe."""

    def __init__(
        self,
        roles: Iterable[str],
        *,
        namespace_labels: bool = False,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace_labels = namespace_labels
        r = self.registry
        roles_gauge = Gauge("orrery_roles", "Roles this process runs", ["role"], registry=r)
        for role in sorted(roles):
            roles_gauge.labels(role).set(1)
        # The request path's families: counted by `flush` from the queues, exposed by
        # `_HotPath` (not prometheus_client's metric objects: a fold of one observation
        # into them cost ~2 us of locks and calls; into these, a bisect and two adds).
        self.http = _Family(
            "orrery_http_request_duration_seconds",
            "HTTP requests by route template, method and status (`_count`: requests)",
            ("route", "method", "status"),
            REQUEST_BUCKETS,
        )
        self.errors = _Family(
            "orrery_errors",
            "Error answers by code and, for dependency faults, the dependency",
            ("code", "dependency"),
        )
        self.stage = _Family(
            "orrery_query_stage_duration_seconds",
            "Query time per stage (query_plan.latency_ms), by endpoint",
            ("endpoint", "stage"),
            STAGE_BUCKETS,
        )
        self.engine = _Family(
            "orrery_engine_call_duration_seconds",
            "Time inside engine library calls per query (query_plan.engine_ms), by call",
            ("call",),
            STAGE_BUCKETS,
        )
        self.cache = _Family(
            "orrery_query_cache",
            "Response-cache lookups by result (hit, miss, unavailable)",
            ("result",),
        )
        self.candidates = _Family(
            "orrery_query_candidates",
            "Candidates each source returned per query",
            ("source",),
            CANDIDATE_BUCKETS,
        )
        self.projector_events = Counter(
            "orrery_projector_events_applied", "Log events the projector applied", registry=r
        )
        self.projector_batch = Histogram(
            "orrery_projector_batch_duration_seconds",
            "Projector batches that applied events",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.projector_failures = Counter(
            "orrery_projector_batch_failures", "Projector batches that failed", registry=r
        )
        self.projector_parked = Counter(
            "orrery_projector_dead_letters_parked",
            "Undecodable events this process parked as dead letters",
            registry=r,
        )
        self.projector_lag = Gauge(
            "orrery_projector_batch_lag_events",
            "The log lag this projector measured after its last batch (-1: not measured)",
            registry=r,
        )
        self.projector_lag.set(-1)
        self.projector_steps = Counter(
            "orrery_projector_steps",
            "Projector steps (one log fetch each), whether they applied events or not",
            registry=r,
        )
        self.relay_published = Counter(
            "orrery_relay_published", "Outbox events the relay published", registry=r
        )
        self.relay_steps = Counter(
            "orrery_relay_steps",
            "Relay steps (outbox claims until one comes back short), whether they "
            "published events or not",
            registry=r,
        )
        self.relay_failures = Counter(
            "orrery_relay_step_failures", "Relay steps that failed", registry=r
        )
        self.embedded = Counter(
            "orrery_embedder_texts", "Texts embedded, by use (documents, queries)", ["use"],
            registry=r,
        )  # fmt: skip
        self.embed_seconds = Histogram(
            "orrery_embedder_call_duration_seconds",
            "Embedding calls, by use",
            ["use"],
            buckets=(*STAGE_BUCKETS, 5.0, 10.0),
            registry=r,
        )
        self.embed_in_flight = Gauge(
            "orrery_embedder_texts_in_flight",
            "Texts handed to the embedder and not embedded yet (its queue), by use",
            ["use"],
            registry=r,
        )
        self._fold = threading.Lock()
        # What the request threads queued and `flush` has not folded in yet.
        self._requests: deque[tuple[str, str, int, float, str | None, str | None]] = deque()
        self._answers: deque[Answered] = deque()
        r.register(_HotPath(self))

    # --- HTTP ---------------------------------------------------------------------------

    def request(
        self,
        route: str,
        method: str,
        status: int,
        seconds: float,
        error_code: str | None,
        dependency: str | None,
    ) -> None:
        """One finished request (called by the middleware, once per request): queued."""
        requests = self._requests
        requests.append((route, method, status, seconds, error_code, dependency))
        if len(requests) > MAX_PENDING:
            self.flush()

    # --- queries (query.ports.QueryObserver) ---------------------------------------------

    def answered(self, answer: Answered) -> None:
        """One answered query: queued."""
        answers = self._answers
        answers.append(answer)
        if len(answers) > MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        """Fold every queued request and answer into the families. Thread-safe: each
        entry is popped, and so folded, exactly once."""
        requests, answers = self._requests, self._answers
        http, errors, stage = self.http.series, self.errors.series, self.stage.series
        engine, cache, candidates = self.engine.series, self.cache.series, self.candidates.series
        http_bounds, stage_bounds = self.http.bounds, self.stage.bounds
        candidate_bounds = self.candidates.bounds
        with self._fold:
            while True:
                try:
                    route, method, status, seconds, error_code, dependency = requests.popleft()
                except IndexError:
                    break
                _observe(http, http_bounds, (route, method, str(status)), seconds)
                if error_code is not None:
                    _count(errors, (error_code, _bounded(dependency)))
            while True:
                try:
                    endpoint, stages_ms, engine_ms, cache_result, counts = answers.popleft()
                except IndexError:
                    break
                for name, ms in stages_ms.items():
                    _observe(stage, stage_bounds, (endpoint, name), ms / 1000.0)
                for call, ms in engine_ms.items():
                    _observe(engine, stage_bounds, (_bounded(call),), ms / 1000.0)
                if cache_result != "disabled":
                    _count(cache, (cache_result,))
                for source, count in counts.items():
                    _observe(candidates, candidate_bounds, (source,), count)

    def hot_path_metrics(self) -> list[Metric]:
        """The request path's families as they stand after a `flush`."""
        self.flush()
        with self._fold:
            return [f.metric() for f in (self.http, self.errors, self.stage, self.engine,
                                         self.cache, self.candidates)]  # fmt: skip

    # --- background loops ----------------------------------------------------------------

    def wrap_projector_step(self, step: Callable[[], Any]) -> Callable[[], Any]:
        """`step` (a projector batch returning a `BatchReport`) that counts what it did."""

        def counted() -> Any:
            started = time.perf_counter()
            self.projector_steps.inc()
            try:
                report = step()
            except Exception:
                self.projector_failures.inc()
                raise
            if report.events:
                self.projector_events.inc(report.events)
                self.projector_batch.observe(time.perf_counter() - started)
            if report.parked:
                self.projector_parked.inc(report.parked)
            if report.lag is not None:
                self.projector_lag.set(report.lag)
            return report

        return counted

    def wrap_relay_step(self, step: Callable[[], int]) -> Callable[[], int]:
        """`step` (a relay step returning how many events it published), counted."""

        def counted() -> int:
            self.relay_steps.inc()
            try:
                published = step()
            except Exception:
                self.relay_failures.inc()
                raise
            if published:
                self.relay_published.inc(published)
            return published

        return counted


def _observe(
    series: dict[tuple[str, ...], list[float]],
    bounds: tuple[float, ...],
    key: tuple[str, ...],
    value: float,
) -> None:
    # One histogram observation: [count per bucket (the last: +Inf)..., sum].
    counts = series.get(key)
    if counts is None:
        counts = series.setdefault(key, [0.0] * (len(bounds) + 2))
    counts[bisect_left(bounds, value)] += 1
    counts[-1] += value


def _count(series: dict[tuple[str, ...], list[float]], key: tuple[str, ...]) -> None:
    counts = series.get(key)
    if counts is None:
        counts = series.setdefault(key, [0.0])
    counts[0] += 1


class _Family:
    """A histogram (`bounds`) or counter (no bounds) of the request path, counted by
    `Metrics.flush` under its lock: `series` maps label values to the bucket counts and
    sum (a histogram; a value falls in the first bucket whose bound it does not exceed,
    Prometheus' `le`) or to the count (a counter)."""

    def __init__(
        self, name: str, documentation: str, labels: tuple[str, ...], bounds: tuple[float, ...] = ()
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.bounds = bounds
        self.series: dict[tuple[str, ...], list[float]] = {}
        self.edges = [floatToGoString(b) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]

    def metric(self) -> Metric:
        if not self.bounds:
            counter = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
            for key, (value,) in sorted(self.series.items()):
                counter.add_metric(key, value)
            return counter
        histogram = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, counts in sorted(self.series.items()):
            cumulative, buckets = 0.0, []
            for edge, count in zip(self.edges, counts, strict=False):
                cumulative += count
                buckets.append((edge, cumulative))
            histogram.add_metric(key, buckets, sum_value=counts[-1])
        return histogram


class _HotPath(Collector):
    """The request-path families of a `Metrics`, collected after folding in what the
    request threads queued: a scrape sees every request that finished before it."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[Metric]:
        m = self.metrics
        for family in (m.http, m.errors, m.stage, m.engine, m.cache, m.candidates):
            # Names only (the registry refuses a second family of the same name).
            yield (CounterMetricFamily if not family.bounds else HistogramMetricFamily)(
                family.name, family.documentation, labels=family.labels
            )

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.hot_path_metrics()


class CountingEmbedder:
    """An `Embedder` that counts its texts, times its calls and shows how many texts
    wait for it (`use`: documents or queries)."""

    def __init__(self, inner: Embedder, metrics: Metrics, use: str) -> None:
        self._inner = inner
        self._texts = metrics.embedded.labels(use)
        self._seconds = metrics.embed_seconds.labels(use)
        self._in_flight = metrics.embed_in_flight.labels(use)

    @property
    def embedder_id(self) -> str:
        return self._inner.embedder_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        n = len(texts)
        self._in_flight.inc(n)
        started = time.perf_counter()
        try:
            return self._inner.embed(texts)
        finally:
            self._in_flight.dec(n)
            self._seconds.observe(time.perf_counter() - started)
            self._texts.inc(n)

    def __getattr__(self, name: str) -> Any:
        # Other capabilities of the wrapped embedder (e.g. a batch size) stay reachable.
        return getattr(self._inner, name)


class StateCollector(Collector):
    """Gauges read at scrape time from what every role shares (the registry, the outbox):
    correct whichever process did the work. Each source is optional; a source that fails
    is logged and left out of that scrape (`orrery_scrape_errors` counts it)."""

    def __init__(
        self,
        *,
        namespace_labels: bool,
        readiness: Callable[[], dict[str, Any]] | None = None,
        generations: Callable[[], Iterable[tuple[str, str, str]]] | None = None,
        builds: Callable[[], Iterable[tuple[str, int, int]]] | None = None,
        outbox_depth: Callable[[], int] | None = None,
    ) -> None:
        self.namespace_labels = namespace_labels
        self.readiness = readiness
        self.generations = generations
        self.builds = builds
        self.outbox_depth = outbox_depth
        self.errors: dict[str, int] = {}

    def _labels(self) -> list[str]:
        return ["namespace", "snapshot_kind"] if self.namespace_labels else ["snapshot_kind"]

    def _key(self, namespace: str, snapshot_kind: str) -> tuple[str, ...]:
        return (namespace, snapshot_kind) if self.namespace_labels else (snapshot_kind,)

    def collect(self) -> Iterator[Metric]:
        for name, source in (
            ("readiness", self._scopes),
            ("generations", self._generations),
            ("builds", self._builds),
            ("outbox", self._outbox),
        ):
            try:
                yield from list(source())
            except Exception as exc:  # a scrape must answer even when a store does not
                log.warning("metrics: %s not collected: %s", name, exc)
                self.errors[name] = self.errors.get(name, 0) + 1
        scrape_errors = GaugeMetricFamily(
            "orrery_scrape_errors", "Scrape-time sources that failed, by source", labels=["source"]
        )
        for name, count in sorted(self.errors.items()):
            scrape_errors.add_metric([name], count)
        yield scrape_errors

    def _scopes(self) -> Iterator[Metric]:
        if self.readiness is None:
            return
        body = self.readiness()
        labels = self._labels()
        lag_events = GaugeMetricFamily(
            "orrery_scope_lag_events",
            "Log events not applied to the scope's live generation (max over namespaces "
            "unless namespace labels are on)",
            labels=labels,
        )
        lag_seconds = GaugeMetricFamily(
            "orrery_scope_lag_seconds",
            "Age of the oldest event not applied to the scope (max over namespaces unless "
            "namespace labels are on)",
            labels=labels,
        )
        eligible = GaugeMetricFamily(
            "orrery_scopes_eligible",
            "Scopes whose live generation's last verification matched (eligible=true) or not",
            labels=[*labels, "eligible"],
        )
        events: dict[tuple[str, ...], float] = {}
        seconds: dict[tuple[str, ...], float] = {}
        verdicts: dict[tuple[str, ...], int] = {}
        for scope in body.get("scopes", []):
            key = self._key(scope["namespace"], scope["snapshot_kind"])
            events[key] = max(events.get(key, 0.0), float(scope["lag_events"]))
            seconds[key] = max(seconds.get(key, 0.0), float(scope["lag_seconds"]))
            verdict = (*key, "true" if scope.get("eligible", True) else "false")
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        for key, value in sorted(events.items()):
            lag_events.add_metric(list(key), value)
            lag_seconds.add_metric(list(key), seconds[key])
        for verdict, count in sorted(verdicts.items()):
            eligible.add_metric(list(verdict), count)
        yield from (lag_events, lag_seconds, eligible)
        high_water = GaugeMetricFamily("orrery_log_high_water", "The outbox's newest position")
        high_water.add_metric([], float(body.get("log_high_water", 0)))
        yield high_water
        projector_log = body.get("projector_log")
        if projector_log is not None:
            lag = GaugeMetricFamily(
                "orrery_projector_log_lag_events",
                "The projector's last measurement of its log's lag (Kafka consumer-group "
                "lag, or outbox rows after its position)",
            )
            lag.add_metric([], float(projector_log["lag_events"]))
            dead = GaugeMetricFamily(
                "orrery_projector_dead_letters", "Undecodable events parked so far (all time)"
            )
            dead.add_metric([], float(projector_log.get("dead_letters", 0)))
            yield from (lag, dead)

    def _generations(self) -> Iterator[Metric]:
        if self.generations is None:
            return
        labels = self._labels()
        family = GaugeMetricFamily(
            "orrery_generations", "Generations by state", labels=[*labels, "state"]
        )
        counts: dict[tuple[str, ...], int] = {}
        for namespace, snapshot_kind, state in self.generations():
            key = (*self._key(namespace, snapshot_kind), state)
            counts[key] = counts.get(key, 0) + 1
        for key, count in sorted(counts.items()):
            family.add_metric(list(key), count)
        yield family

    def _builds(self) -> Iterator[Metric]:
        if self.builds is None:
            return
        running = GaugeMetricFamily(
            "orrery_builds_running", "Generation builds running in this process, by phase",
            labels=["phase"],
        )  # fmt: skip
        done = GaugeMetricFamily(
            "orrery_build_items_done",
            "Items done in the current phase of the running builds (a bulk-load child's "
            "progress, reported back to this process)",
            labels=["phase"],
        )
        total = GaugeMetricFamily(
            "orrery_build_items_total", "Items of the current phase of the running builds",
            labels=["phase"],
        )  # fmt: skip
        phases: dict[str, list[int]] = {}
        for phase, d, t in self.builds():
            entry = phases.setdefault(phase, [0, 0, 0])
            entry[0] += 1
            entry[1] += d
            entry[2] += t
        for phase, (n, d, t) in sorted(phases.items()):
            running.add_metric([phase], n)
            done.add_metric([phase], d)
            total.add_metric([phase], t)
        yield from (running, done, total)

    def _outbox(self) -> Iterator[Metric]:
        if self.outbox_depth is None:
            return
        depth = GaugeMetricFamily(
            "orrery_relay_outbox_depth", "Outbox rows not published to the log yet"
        )
        depth.add_metric([], float(self.outbox_depth()))
        yield depth


class TracingCollector(Collector):
    """The span export's health at scrape time (`orrery.tracing.Tracing.status`): whether
    the exporter child runs, the sampled requests and batches whose spans were dropped
    (queue full, child down), the children that died, the items waiting, the spans the
    endpoint did not take."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def collect(self) -> Iterator[Metric]:
        status = self.tracing.status()
        up = GaugeMetricFamily(
            "orrery_trace_exporter_up",
            "1 when the span exporter (child process or thread) runs or has nothing to do yet",
        )
        up.add_metric([], 0.0 if status["exporter"] == "restarting" else 1.0)
        dropped = CounterMetricFamily(
            "orrery_trace_dropped",
            "Sampled requests and projector batches whose spans were not made (the "
            "exporter's queue was full or its child was down)",
        )
        dropped.add_metric([], float(status["dropped"]))
        restarts = CounterMetricFamily(
            "orrery_trace_exporter_restarts", "Span exporter children that died"
        )
        restarts.add_metric([], float(status["restarts"]))
        pending = GaugeMetricFamily(
            "orrery_trace_pending", "Sampled items queued for the span exporter"
        )
        pending.add_metric([], float(status.get("pending", 0)))
        failed = CounterMetricFamily(
            "orrery_trace_export_failed",
            "Spans the exporter child made but could not deliver to the OTLP endpoint "
            "(after the exporter's retries; as of its last health check or flush)",
        )
        failed.add_metric([], float(status.get("export_failed", 0)))
        yield from (up, dropped, restarts, pending, failed)


def with_tracing_status(
    status: Callable[[], dict[str, Any]], observability: Observability
) -> Callable[[], dict[str, Any]]:
    """`status` (a process's facts for `/v1/readiness`) with `tracing`: the span
    export's health when spans are exported (`Tracing.status`). A failing exporter never
    makes the process unready: tracing degrades, queries do not."""
    tracing = observability.tracing
    if tracing is None or not tracing.exporting:
        return status

    def with_tracing() -> dict[str, Any]:
        return {**status(), "tracing": tracing.status()}

    return with_tracing


@dataclass(frozen=True, slots=True)
class Observability:
    """What an app records per request: metrics (None: off), the access log line, spans
    (None: tracing off), and who may read `GET /metrics` (`admin_key`; `open` when the
    server has neither API keys nor an admin key, like every other route then)."""

    metrics: Metrics | None = None
    access_log: bool = False
    tracing: Tracing | None = None
    admin_key: str = ""
    open: bool = True


def metrics_router(metrics: Metrics, *, admin_key: str, open_: bool) -> APIRouter:
    """`GET /metrics` (Prometheus text format). Needs the admin key (`x-admin-key` or
    `Authorization: Bearer`, what Prometheus' `authorization` sends) unless the server
    is open; `ORRERY_METRICS_PORT` serves the same registry without a key on a port of
    its own (docs/deploy.md)."""
    router = APIRouter()

    @router.get(
        "/metrics",
        tags=["ops"],
        include_in_schema=False,  # text/plain, not a JSON model: not in the API document
        openapi_extra=declare(Access.ADMIN),
    )
    async def get_metrics(
        x_admin_key: str | None = Header(default=None),
        authorization: str | None = Header(default=None),
    ) -> Response:
        if not open_:
            check_admin_key(admin_key, x_admin_key, authorization)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


# One writer per process for every app's access lines (orrery.logs.AccessLog).
ACCESS_LOG = AccessLog(logging.getLogger("orrery.access"))
_REQUEST_ID = b"x-request-id"
_VALID_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


class RequestTelemetry:
    """The outermost middleware of every app: gives each request an id (the caller's
    `x-request-id` when it is a plain token, else a new one; echoed in the response),
    opens its `contracts.request_context`, its span when spans are exported (else its
    W3C ids), and when the response has left records it once: one queued observation
    (folded into the histograms at the next scrape), one queued access-log line (INFO,
    `orrery.access`, written by `ACCESS_LOG`'s thread) when enabled. Nothing of the body
    or the query string is logged."""

    def __init__(self, app: ASGIApp, *, observability: Observability) -> None:
        self.app = app
        self.metrics = observability.metrics
        self.access_log = observability.access_log
        self.tracing = observability.tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = None
        for name, value in scope["headers"]:
            if name == _REQUEST_ID:
                if _VALID_REQUEST_ID.fullmatch(value):
                    request_id = value.decode()
                break
        if request_id is None:
            request_id = os.urandom(8).hex()
        context = RequestContext(request_id)
        token = open_request(context)
        span = None if self.tracing is None else self.tracing.start_request(scope, context)
        status = 500
        id_header = (_REQUEST_ID, request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        failed = True
        try:
            await self.app(scope, receive, send_with_id)
            failed = False
        finally:
            close_request(token)
            if failed and context.error_code is None:
                # Escaped every handler: the server's last resort answers 500 internal.
                context.error_code = ErrorCode.INTERNAL.value
                status = 500
            route = getattr(scope.get("route"), "path", None) or UNMATCHED_ROUTE
            seconds = time.perf_counter() - started
            if self.metrics is not None:
                self.metrics.request(
                    route,
                    scope["method"],
                    status,
                    seconds,
                    context.error_code,
                    context.dependency,
                )
            if span is not None and self.tracing is not None:
                self.tracing.end_request(span, route, status, context)
            if self.access_log and ACCESS_LOG.enabled():
                ACCESS_LOG.line(
                    scope["method"],
                    scope["path"],
                    route,
                    status,
                    seconds,
                    (request_id, context.trace_id, context.namespace),
                    context.error_code,
                )


def open_observability(
    settings: QuerySettings, roles: Iterable[str], *, span_exporter: Any = None
) -> tuple[Observability, Callable[[], None]]:
    """The observability of one process from its settings, and the function that stops
    what it started (the metrics port's listener, the span exporter). `span_exporter`
    (an OpenTelemetry `SpanExporter`, tests: in memory) receives the spans instead of
    the OTLP endpoint."""
    from orrery.tracing import open_tracing

    closers: list[Callable[[], None]] = []
    metrics = None
    if settings.metrics:
        metrics = Metrics(roles, namespace_labels=settings.metrics_namespace_labels)
        if settings.metrics_port is not None:
            closers.append(
                serve_metrics_port(metrics, settings.metrics_host, settings.metrics_port)
            )
    tracing = None
    if settings.tracing:
        tracing = open_tracing(
            settings.otlp_endpoint,
            service="orrery",
            roles=roles,
            exporter=span_exporter,
            sample_ratio=settings.tracing_sample_ratio,
        )
        closers.append(tracing.close)
        if metrics is not None and tracing.exporting:
            metrics.registry.register(TracingCollector(tracing))
    access = settings.access_log if settings.access_log is not None else settings.mode == "servers"
    observability = Observability(
        metrics=metrics,
        access_log=access,
        tracing=tracing,
        admin_key=settings.admin_key,
        open=not settings.api_keys.strip() and not settings.admin_key,
    )

    def close() -> None:
        for closer in reversed(closers):
            closer()

    return observability, close


def serve_metrics_port(metrics: Metrics, host: str, port: int) -> Callable[[], None]:
    """Serve `metrics` at `http://host:port/metrics` (no key: bind it where only the
    scraper reaches) on a daemon thread; returns the function that stops it."""
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


class _Observers:
    """Several `QueryObserver`s told in turn."""

    def __init__(self, observers: Sequence[Any]) -> None:
        self.observers = tuple(observers)

    def answered(self, answer: Answered) -> None:
        for observer in self.observers:
            observer.answered(answer)


def query_observer(observability: Observability) -> Any:
    """The `query.ports.QueryObserver` of an app's observability (None: nothing to tell;
    spans only when they are exported, `Tracing.exporting`)."""
    parts: list[Any] = [observability.metrics] if observability.metrics is not None else []
    if observability.tracing is not None and observability.tracing.exporting:
        parts.append(observability.tracing)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else _Observers(parts)


def observed_projector_step(
    observability: Observability, step: Callable[[], Any]
) -> Callable[[], Any]:
    """`step` (a projector batch returning a `BatchReport`) counted (metrics on) and with
    its batch span (spans exported), the one wrapping every role's projector uses."""
    if observability.metrics is not None:
        step = observability.metrics.wrap_projector_step(step)
    if observability.tracing is not None and observability.tracing.exporting:
        step = observability.tracing.wrap_projector_step(step)
    return step


def state_collector(
    metrics: Metrics | None,
    *,
    readiness: Callable[[], dict[str, Any]] | None = None,
    generations: Callable[[], Iterable[tuple[str, str, str]]] | None = None,
    builds: Callable[[], Iterable[tuple[str, int, int]]] | None = None,
    outbox_depth: Callable[[], int] | None = None,
) -> None:
    """Register the scrape-time gauges of whichever sources this process has."""
    if metrics is None:
        return
    metrics.registry.register(
        StateCollector(
            namespace_labels=metrics.namespace_labels,
            readiness=readiness,
            generations=generations,
            builds=builds,
            outbox_depth=outbox_depth,
        )
    )
