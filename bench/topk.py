"""Top-k latency over HTTP: the one-shot `topk_records` against the old split path.

    .venv/bin/python bench/topk.py [--sizes 10000,100000] [--queries 200]
                                   [--out docs/bench/topk.json] [--data-root DIR]

With `--data-root DIR`, each size's data dir is DIR/<N> and is kept with a `build.json`
of its ingest and HNSW figures; a later run with the same DIR skips steps 1-2 (it waits
only for a quiet optimizer) and reports those figures as the build's. So a 1M corpus can
be built once, on a busy machine if need be, and its queries measured on a quiet one. A run
stopped after its ingest (an `ingest.json` beside the data dir, no `build.json`) is
resumed by the next: it waits for the HNSW and measures; one stopped during its ingest
starts over.

For each corpus size N, against a fresh `orrery serve` on 127.0.0.1 (own temp data dir):

1. Ingest N deterministic synthetic records (Zipf-distributed words, statuses, 10
   galaxies, visibility labels, ~0.5-1 KB payloads, precomputed 384-d unit vectors so
   no document is embedded) in batches over `POST /v1/records`, until `/v1/readiness`
   shows zero lag.
2. Wait for the qdrant-edge HNSW build. Readiness has no vector-index state, so the
   server runs with `ORRERY_OPTIMIZE_INTERVAL_SECONDS=1` and rounds of probes go out
   until, for 5 optimizer intervals, no optimize ran (no child process of the server,
   no `.<generation>.optimizing` directory, no new optimizer log line), no probe failed
   or stalled (an in-process optimize holds the GIL, which stalls every request), and
   the p50 of three consecutive rounds agrees within 20 %. Probes go through
   `POST /v1/external/retrieve`, which ranks in full and is never answered from the
   response cache. After the server stops, its shard is opened here to record how many
   vectors ended up HNSW-indexed.
3. Measure, sequentially over one keep-alive client, the server in its default
   configuration (response cache on), with (a), (d), (b) interleaved query by query:
   (a) one-shot with cached query vectors: each text first goes through `retrieve`
       (caches its vector, not a response), then one timed `topk_records` (a
       response-cache miss, checked via `query_plan.cache`);
   (d) the same request again: a response-cache hit;
   (b) one-shot with a fresh text (one unseen token appended): the query is embedded;
   (c) afterwards, the split path `GET /v1/scopes/document_ids` ->
       `POST /v1/external/retrieve` with `allowed_doc_ids` (and the same filters) ->
       `POST /v1/records/by_id`, timed as a whole, client-side JSON work included.

Writes `docs/bench/topk.json` and `docs/bench/topk.png` and prints a table. Figures are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/topk.py`: put the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    WRITE_WORKER_MODULE,
    BenchTimeout,
    Exchange,
    ServeProcess,
    child_processes,
    deadline,
    exchange,
    git_facts,
    ingest_env,
    interpreter_speed,
    latency_summary,
    machine_facts,
    median,
    poll_readiness,
    publish,
    serve,
    source_digest,
    utc_now,
)
from bench.memory import TreeSampler
from bench.memory import describe as describe_memory
from bench.synthetic import VECTOR_KINDS, Topics

NAMESPACE = "bench"
SNAPSHOT_KIND = "objects"
SCOPE_REF = "longterm:objects:current"
DIMENSION = 384
# The spare empty shard a server keeps for its next new generation (projector/adapters/
# qdrant_edge_vectors.py, `_SpareMaker`): a directory beside the shards, not an optimize.
SPARE_SHARD_PREFIX = ".spare-"
VOCABULARY_SIZE = 8_000
ZIPF_EXPONENT = 1.05
GALAXIES = tuple(f"galaxy-{i}" for i in range(10))
STATUSES = ("active", "candidate", "uncertain", "superseded", "archived")
STATUS_WEIGHTS = (0.60, 0.15, 0.10, 0.10, 0.05)
STATUS_FILTERS = (["active"], ["active", "candidate"], ["active", "candidate", "uncertain"])
VISIBILITY = ("family", "private", "care", "household", "public")
ROOMS = ("kitchen", "hall", "bedroom", "garden", "garage", "living room", "bathroom")
COLOURS = ("red", "blue", "green", "black", "white", "yellow", "grey")
# updated_at is spread over the year before this instant (fixed: the corpus is a pure
# function of the seed).
REFERENCE_TIME = datetime(2026, 1, 1, tzinfo=UTC)
WARMUP_QUERIES = 20
SPLIT_WARMUP = 3
# Sent with every query so a slow path is measured rather than cut off at the default
# 2 s deadline; `over_default_deadline` counts requests that would have been.
REQUEST_TIMEOUT_S = 60.0
DEFAULT_DEADLINE_S = 2.0
OPTIMIZE_INTERVAL_S = 1.0
OPTIMIZE_LOG_LINE = "optimized qdrant-edge generation"
QUIET_INTERVALS = 5
# At least this long with no optimize before the index counts as built (`wait_for_vector_index`).
QUIET_WAIT_S = 65.0
STABLE_ROUNDS = 3
STABLE_SPREAD = 0.20
STALL_S = 0.5
# While an optimize runs: probes a round, and the seconds between rounds.
BUSY_PROBES = 1
BUSY_POLL_S = 1.0
# How often the server and its children (the optimizer's) are read together for the
# peak RSS of the whole process tree (`bench.memory`).
MEMORY_SAMPLE_S = 1.0
# How often the freshness watch polls readiness while records are POSTed.
FRESHNESS_POLL_S = 0.02
PATHS = ("one_shot_cached", "one_shot_embed", "split", "one_shot_response_hit")
# The order they run in, interleaved per query: (d) must follow (a), which caches it.
ONE_SHOT_PATHS = ("one_shot_cached", "one_shot_response_hit", "one_shot_embed")
PATH_LABELS = {
    "one_shot_cached": "(a) one-shot, cached query vector",
    "one_shot_embed": "(b) one-shot, query embedded",
    "split": "(c) split path (3 calls)",
    "one_shot_response_hit": "(d) one-shot, response-cache hit",
}

console = Console(stderr=True)


# -- corpus and queries -------------------------------------------------------------------


@dataclass(frozen=True)
class Vocabulary:
    """Pseudo-words with Zipf frequencies (rank r drawn with weight 1 / r^s)."""

    words: tuple[str, ...]
    cum_weights: tuple[float, ...]

    @classmethod
    def build(cls, rng: random.Random, size: int = VOCABULARY_SIZE) -> Vocabulary:
        syllables = [c + v for c in "bcdfgklmnprstvz" for v in "aeiou"]
        syllables += [s + "n" for s in syllables[::3]]
        words: dict[str, None] = {}
        while len(words) < size:
            words["".join(rng.choices(syllables, k=rng.randint(2, 4)))] = None
        weights = (1.0 / (rank**ZIPF_EXPONENT) for rank in range(1, size + 1))
        return cls(tuple(words), tuple(itertools.accumulate(weights)))

    def sample(self, rng: random.Random, count: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum_weights, k=count)

    def phrase(self, rng: random.Random, count: int) -> str:
        return " ".join(self.sample(rng, count))


def _record(
    index: int, rng: random.Random, vocab: Vocabulary, vector: list[float], text: tuple[str, str]
) -> dict[str, Any]:
    item_id = f"obj-{index:07d}"
    title, body = text
    updated_at = REFERENCE_TIME - timedelta(seconds=rng.randrange(365 * 86_400))
    payload: dict[str, Any] = {
        "memory_id": item_id,
        "kind": "object",
        "summary": title,
        "attributes": {
            "room": rng.choice(ROOMS),
            "colour": rng.choice(COLOURS),
            "confidence": round(rng.random(), 3),
        },
        "source": {"channel": rng.choice(("voice", "app", "import")), "turn": rng.randrange(10**6)},
        "notes": "",
    }
    missing = rng.randint(512, 1024) - len(json.dumps(payload, separators=(",", ":")))
    notes: list[str] = []
    while missing > 0:
        word = vocab.sample(rng, 1)[0]
        notes.append(word)
        missing -= len(word) + 1
    payload["notes"] = " ".join(notes)
    return {
        "namespace": NAMESPACE,
        "snapshot_kind": SNAPSHOT_KIND,
        "item_id": item_id,
        "revision": 1,
        "galaxy": rng.choice(GALAXIES),
        "payload_schema": "bench_object_v1",
        "payload": payload,
        "text": {"title": title, "body": body},
        "metadata": {
            "status": rng.choices(STATUSES, weights=STATUS_WEIGHTS)[0],
            "updated_at": updated_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "visibility": sorted(rng.sample(VISIBILITY, rng.randint(1, 2))),
        },
        "vector": vector,
    }


class SpooledCorpus:
    """The corpus's batches, generated once into a temp file and read back one at a
    time: the bench holds one batch in memory, not the corpus (5 GB of JSON at 1M), and
    the ingest timing holds no generation work.

    `cached(path, batches)`: the same, kept at `path` (its batch sizes beside it, written
    last) and read from there by any later run instead of generating it again (the 1M
    corpus took 1,109 s to generate on a quiet machine, session 19)."""

    def __init__(self, batches: Iterator[bytes], path: Path | None = None) -> None:
        # Closed by `close` (the run's `finally`); a temp file is deleted once closed.
        if path is None:
            self._file = tempfile.TemporaryFile(prefix="orrery-bench-corpus-")  # noqa: SIM115
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w+b")
        self.sizes: list[int] = []
        for body in batches:
            self._file.write(body)
            self.sizes.append(len(body))
        self._file.flush()
        if path is not None:
            _sizes_path(path).write_text(json.dumps(self.sizes))

    @classmethod
    def cached(
        cls, path: Path, batches: Callable[[], Iterator[bytes]]
    ) -> tuple[SpooledCorpus, bool]:
        """The corpus kept at `path` if complete, else generated into it; and whether
        it was reused."""
        sizes_path = _sizes_path(path)
        if path.is_file() and sizes_path.is_file():
            sizes = json.loads(sizes_path.read_text())
            if path.stat().st_size == sum(sizes):
                corpus = cls.__new__(cls)
                corpus._file = path.open("r+b")
                corpus.sizes = sizes
                return corpus, True
        sizes_path.unlink(missing_ok=True)
        return cls(batches(), path), False

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[bytes]:
        self._file.seek(0)
        for size in self.sizes:
            yield self._file.read(size)

    def close(self) -> None:
        self._file.close()


def _sizes_path(path: Path) -> Path:
    return path.with_name(path.name + ".sizes.json")


def corpus_batches(
    size: int, batch_size: int, seed: int, vocab: Vocabulary, *, vectors: str = "clustered"
) -> Iterator[bytes]:
    """JSON bodies of `POST /v1/records`; the corpus of N is a prefix of any larger one.

    `vectors="clustered"` (`bench/synthetic.py`): each record belongs to a topic, its
    vector lies near the topic's embedded centre and its text shares the topic's words;
    `"uniform"`: i.i.d. unit vectors and Zipf text (the corpus of results committed
    before session 12)."""
    rng = random.Random(seed)
    vector_rng = np.random.default_rng(seed)
    topics = Topics.build(seed, vocab) if vectors == "clustered" else None
    for start in range(0, size, batch_size):
        count = min(batch_size, size - start)
        records = []
        if topics is None:
            matrix = vector_rng.standard_normal((count, DIMENSION))
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            rows = np.round(matrix, 6).tolist()
            for i in range(count):
                text = (
                    vocab.phrase(rng, rng.randint(3, 7)),
                    vocab.phrase(rng, rng.randint(30, 60)),
                )
                records.append(_record(start + i, rng, vocab, rows[i], text))
        else:
            for i in range(count):
                title, body, vector = topics.document(rng, vector_rng, vocab)
                row = np.round(vector, 6).tolist()
                records.append(_record(start + i, rng, vocab, row, (title, body)))
        yield json.dumps(records, separators=(",", ":")).encode()


@dataclass(frozen=True)
class QuerySpec:
    text: str
    filters: dict[str, Any] | None


def stage_bench_batch(
    description: str, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, bytes]:
    """The arguments of a per-record stage benchmark (`--records`, `--rounds`, `--out`)
    and one request body of `--records` records of the fixed corpus (seed 42)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    vocab = Vocabulary.build(random.Random(42))
    return args, next(iter(corpus_batches(args.records, args.records, 42, vocab)))


def make_queries(rng: random.Random, vocab: Vocabulary, count: int) -> list[QuerySpec]:
    """2-5 words each; every second query filters on status (any-of) and galaxy."""
    out = []
    for i in range(count):
        text = vocab.phrase(rng, rng.randint(2, 5))
        filters = None
        if i % 2 == 1:
            filters = {"status": rng.choice(STATUS_FILTERS), "galaxy": rng.choice(GALAXIES)}
        out.append(QuerySpec(text, filters))
    return out


def fresh_variant(query: QuerySpec, index: int) -> QuerySpec:
    """The same query with one token appended that occurs in no text ever sent before
    (pseudo-words hold no digits), so the worker's query-embedding LRU misses."""
    return QuerySpec(f"{query.text} nr{index:04d}", query.filters)


# -- measurement ----------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-query latencies and wire bytes of one path (or one step of the split path)."""

    seconds: list[float] = field(default_factory=list)
    sent_body: list[int] = field(default_factory=list)
    sent_headers: list[int] = field(default_factory=list)
    received_body: list[int] = field(default_factory=list)
    received_headers: list[int] = field(default_factory=list)
    stages_ms: list[dict[str, float]] = field(default_factory=list)
    engine_ms: list[dict[str, float]] = field(default_factory=list)
    cache_states: Counter[str] = field(default_factory=Counter)
    profiles: Counter[str] = field(default_factory=Counter)

    def add(self, seconds: float, exchanges: Sequence[Exchange]) -> None:
        self.seconds.append(seconds)
        self.sent_body.append(sum(e.sent_body for e in exchanges))
        self.sent_headers.append(sum(e.sent_headers for e in exchanges))
        self.received_body.append(sum(e.received_body for e in exchanges))
        self.received_headers.append(sum(e.received_headers for e in exchanges))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "latency_ms": latency_summary(self.seconds),
            "over_default_deadline": sum(s > DEFAULT_DEADLINE_S for s in self.seconds),
            "bytes_per_query": {
                "sent_body": round(float(np.mean(self.sent_body))),
                "sent_headers": round(float(np.mean(self.sent_headers))),
                "received_body": round(float(np.mean(self.received_body))),
                "received_headers": round(float(np.mean(self.received_headers))),
                "sent": round(float(np.mean(self.sent_body) + np.mean(self.sent_headers))),
                "received": round(
                    float(np.mean(self.received_body) + np.mean(self.received_headers))
                ),
            },
        }
        if self.cache_states:
            out["response_cache"] = dict(self.cache_states)
        if self.profiles:
            out["profiles"] = dict(self.profiles)
        if self.stages_ms:
            for name, q in (("p50", 50), ("p95", 95)):
                out[f"server_stage_ms_{name}"] = {
                    stage: round(float(np.percentile([s[stage] for s in self.stages_ms], q)), 3)
                    for stage in self.stages_ms[0]
                }
        if self.engine_ms and any(self.engine_ms):
            out["server_vs_engines"] = server_vs_engines(self.stages_ms, self.engine_ms)
        return out


def server_vs_engines(
    stages_ms: Sequence[Mapping[str, float]], engine_ms: Sequence[Mapping[str, float]]
) -> dict[str, Any]:
    """Per query, in one run: the time inside the raw engine calls (tantivy's top-k
    searches + qdrant-edge's queries, as `query_plan.engine_ms` reports them), the
    engine calls including tantivy's stored-document reads, and the server's own
    stage total (`latency_ms.total`); percentiles of each and of their per-query ratio."""
    raw = [e.get("tantivy_search", 0.0) + e.get("qdrant_edge_query", 0.0) for e in engine_ms]
    calls = [sum(e.values()) for e in engine_ms]
    total = [s["total"] for s in stages_ms]
    ratio = [t / r for t, r in zip(total, raw, strict=True) if r > 0]

    def pct(values: Sequence[float]) -> dict[str, float]:
        if not values:
            return {}
        return {
            "p50": round(float(np.percentile(values, 50)), 3),
            "p95": round(float(np.percentile(values, 95)), 3),
            "mean": round(float(np.mean(values)), 3),
        }

    keys = sorted({k for e in engine_ms for k in e})
    return {
        "method": "per query: latency_ms.total over (tantivy_search + qdrant_edge_query) "
        "of query_plan.engine_ms, both measured inside the server",
        "engine_ms_by_call": {k: pct([e.get(k, 0.0) for e in engine_ms]) for k in keys},
        "raw_engines_ms": pct(raw),
        "engine_calls_incl_doc_reads_ms": pct(calls),
        "server_total_ms": pct(total),
        "server_over_raw_engines": pct(ratio),
    }


# How long a flat-out ingest keeps sending a POST the server refused with `503
# ingest_backlog` (its projector too far behind; nothing written) before giving up.
BACKLOG_MAX_WAIT_S = 3_600.0


def _backlog(ex: Exchange) -> bool:
    """Whether the POST was refused for the projector's backlog (and wrote nothing)."""
    if ex.response.status_code != 503:
        return False
    try:
        return bool(ex.response.json().get("error", {}).get("code") == "ingest_backlog")
    except ValueError:
        return False


def _checked(ex: Exchange, what: str) -> dict[str, Any]:
    if ex.response.status_code != 200:
        raise RuntimeError(f"{what}: HTTP {ex.response.status_code}: {ex.response.text[:500]}")
    body: dict[str, Any] = ex.json()
    return body


def topk_body(query: QuerySpec, result_limit: int) -> dict[str, Any]:
    """The `topk_records` request of `query` over the bench scope."""
    body: dict[str, Any] = {
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
        "query_text": query.text,
        "result_limit": result_limit,
        "timeout_seconds": REQUEST_TIMEOUT_S,
    }
    if query.filters is not None:
        body["filters"] = query.filters
    return body


def one_shot(
    client: httpx.Client, query: QuerySpec, result_limit: int
) -> tuple[Exchange, dict[str, Any]]:
    ex = exchange(
        client, "POST", "/v1/external/retrieve/topk_records", body=topk_body(query, result_limit)
    )
    return ex, _checked(ex, "topk_records")


def retrieve(
    client: httpx.Client,
    query: QuerySpec,
    result_limit: int,
    allowed_doc_ids: list[str] | None = None,
) -> tuple[Exchange, dict[str, Any]]:
    """`POST /v1/external/retrieve`: the full ranking without payloads, never served
    from the response cache (only `topk_records` is cached)."""
    body: dict[str, Any] = {
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
        "query_text": query.text,
        "limit": result_limit,
        "timeout_seconds": REQUEST_TIMEOUT_S,
    }
    if query.filters is not None:
        body["filters"] = query.filters
    if allowed_doc_ids is not None:
        body["allowed_doc_ids"] = allowed_doc_ids
    ex = exchange(client, "POST", "/v1/external/retrieve", body=body)
    return ex, _checked(ex, "external/retrieve")


@dataclass
class SplitResult:
    total: Samples = field(default_factory=Samples)
    steps: dict[str, Samples] = field(
        default_factory=lambda: {
            "document_ids": Samples(),
            "retrieve": Samples(),
            "by_id": Samples(),
        }
    )
    top_ids: list[list[str]] = field(default_factory=list)
    # Per query: total minus the three exchanges (decoding the ids, encoding them again).
    client_side_s: list[float] = field(default_factory=list)
    scope_size: int = 0


def split_path(
    client: httpx.Client, query: QuerySpec, result_limit: int, out: SplitResult | None
) -> list[str]:
    """The three calls of the split path; timed as a whole (client work included)."""
    started = time.perf_counter()
    ids_ex = exchange(
        client,
        "GET",
        "/v1/scopes/document_ids",
        params={"namespace": NAMESPACE, "scope_ref": SCOPE_REF},
    )
    ids: list[str] = _checked(ids_ex, "scopes/document_ids")["document_ids"]
    retrieve_ex, retrieved = retrieve(client, query, result_limit, ids)
    top = [c["document_id"] for c in retrieved["candidates"]]
    by_id_ex: Exchange | None = None
    if top:
        by_id_ex = exchange(
            client, "POST", "/v1/records/by_id", body={"namespace": NAMESPACE, "document_ids": top}
        )
        _checked(by_id_ex, "records/by_id")
    seconds = time.perf_counter() - started
    if out is not None:
        exchanges = [ids_ex, retrieve_ex] + ([by_id_ex] if by_id_ex else [])
        out.total.add(seconds, exchanges)
        out.client_side_s.append(seconds - sum(e.seconds for e in exchanges))
        out.steps["document_ids"].add(ids_ex.seconds, [ids_ex])
        out.steps["retrieve"].add(retrieve_ex.seconds, [retrieve_ex])
        out.steps["retrieve"].stages_ms.append(retrieved["query_plan"]["latency_ms"])
        if by_id_ex is not None:
            out.steps["by_id"].add(by_id_ex.seconds, [by_id_ex])
        out.top_ids.append(top)
        out.scope_size = len(ids)
    return top


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
    )


def _run_each(description: str, count: int, step: Callable[[int], object]) -> None:
    with _progress() as progress:
        task = progress.add_task(description, total=count, note="")
        for i in range(count):
            step(i)
            progress.advance(task)


# -- phases ---------------------------------------------------------------------------------


def _readiness(client: httpx.Client) -> dict[str, Any]:
    body: dict[str, Any] = client.get("/v1/readiness").json()
    return body


def bench_scopes(ready: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The readiness entries of the bench scope (one once the first record is applied)."""
    return [
        s
        for s in ready.get("scopes", [])
        if s["namespace"] == NAMESPACE and s["snapshot_kind"] == SNAPSHOT_KIND
    ]


def _scope_ready(ready: dict[str, Any], size: int) -> bool:
    scopes = bench_scopes(ready)
    return (
        bool(ready.get("ready"))
        and len(scopes) == 1
        and scopes[0]["document_count"] == size
        and scopes[0]["lag_events"] == 0
    )


class PositionWatch:
    """Polls `/v1/readiness` every `interval_s` in a thread (own connection) and keeps
    `(monotonic time, projector position)`: the position the projector committed, i.e.
    what a search sees (engines are written and reloaded before it commits)."""

    def __init__(self, server: ServeProcess, interval_s: float = FRESHNESS_POLL_S) -> None:
        self.samples: list[tuple[float, int]] = []
        self._server = server
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="position-watch", daemon=True)

    def __enter__(self) -> PositionWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with self._server.client() as client:
            while not self._stop.is_set():
                try:
                    ready = client.get("/v1/readiness").json()
                    position = int((ready.get("projector") or {}).get("position") or 0)
                    self.samples.append((time.perf_counter(), position))
                except (httpx.HTTPError, ValueError):
                    pass  # a missed poll only widens the bound
                self._stop.wait(self.interval_s)

    def searchable_at(self, position: int) -> float | None:
        """The first poll time at which the projector had committed `position`."""
        for at, seen in self.samples:
            if seen >= position:
                return at
        return None


def freshness(acks: Sequence[tuple[float, int]], watch: PositionWatch) -> dict[str, Any]:
    """Per POST: from its acknowledgement to the first poll that saw its last position
    committed by the projector (an upper bound: up to one poll interval late)."""
    lags = [
        (seen - acked) * 1000.0
        for acked, position in acks
        if (seen := watch.searchable_at(position)) is not None
    ]
    summary: dict[str, Any] = {
        "method": f"POST acknowledged -> first GET /v1/readiness (every "
        f"{watch.interval_s * 1000:.0f} ms, own connection) whose projector.position covers "
        "the POST's high_water; upper bound (poll interval + readiness call)",
        "posts": len(acks),
        "measured": len(lags),
        "polls": len(watch.samples),
    }
    if lags:
        summary["lag_ms"] = latency_summary([lag / 1000.0 for lag in lags])
    return summary


def ingest(
    server: ServeProcess,
    client: httpx.Client,
    batches: Iterable[bytes],
    size: int,
    wait: str | None = None,
) -> dict[str, Any]:
    """POST every batch (with `?wait=searchable` when `wait` says so), then poll
    readiness until the projector applied all of them; meanwhile a `PositionWatch` times
    each POST's freshness lag."""
    path = "/v1/records" if wait is None else f"/v1/records?wait={wait}"
    started = time.perf_counter()
    wall_start = time.time()
    sent = posts = body_bytes = unsearchable = backlog_retries = 0
    backlog_wait_s = 0.0
    acks: list[tuple[float, int]] = []
    with _progress() as progress, PositionWatch(server) as watch:
        task = progress.add_task("ingest (POST)", total=size, note="")
        for body in batches:
            posts += 1
            body_bytes += len(body)
            ex = exchange(client, "POST", path, content=body)
            while _backlog(ex) and time.perf_counter() - started < BACKLOG_MAX_WAIT_S:
                # A well-behaved producer: nothing was written; send it again after
                # the server's Retry-After (counted and reported, so a refused POST is
                # not a silent pause in the rate).
                backlog_retries += 1
                pause = float(ex.response.headers.get("retry-after", "1"))
                backlog_wait_s += pause
                time.sleep(pause)
                ex = exchange(client, "POST", path, content=body)
            written = _checked(ex, "POST /v1/records")
            acks.append((time.perf_counter(), int(written["high_water"])))
            unsearchable += written.get("searchable") is False
            if written["accepted"] + written["rejected"] == 0:
                raise RuntimeError(f"POST /v1/records wrote nothing: {written}")
            sent += ex.sent
            done = int(progress.tasks[0].completed) + len(written["items"])
            progress.update(
                task, completed=done, note=f"{done / (time.perf_counter() - started):,.0f} rec/s"
            )
        posted_s = time.perf_counter() - started
        task = progress.add_task("ingest (projector)", total=size, note="")

        def projected(ready: dict[str, Any]) -> bool:
            scopes = ready.get("scopes", [])
            count = sum(s["document_count"] for s in scopes)
            lag = sum(s["lag_events"] for s in scopes)
            progress.update(task, completed=count, note=f"lag {lag:,} events")
            return _scope_ready(ready, size)

        ready = poll_readiness(server, client, projected)
        ready_s = time.perf_counter() - started
        time.sleep(2 * FRESHNESS_POLL_S)  # the watch sees the last position too
    return {
        "records": size,
        "batch_bytes_mean": round(body_bytes / max(1, posts)),
        "bytes_sent": sent,
        "post_seconds": round(posted_s, 3),
        "ready_seconds": round(ready_s, 3),
        "records_per_s": round(size / ready_s, 1),
        "post_records_per_s": round(size / posted_s, 1),
        "backlog_retries": backlog_retries,
        "backlog_wait_seconds": round(backlog_wait_s, 1),
        "freshness": freshness(acks, watch),
        "wait": wait,
        "answered_before_searchable": unsearchable if wait else None,
        "wall_start": wall_start,
        "wall_ready": time.time(),
        "projector": ready.get("projector"),
    }


@dataclass(frozen=True)
class OptimizerLog:
    """What the server logged about the qdrant-edge optimizer (times in epoch s).

    `ended`: the optimizer loop's "optimized qdrant-edge generation" lines (one per
    optimize that changed segments), `failed`: its "optimizing … failed" lines,
    `lines`: every optimizer line as logged (its format has changed between versions).
    """

    ended: list[float]
    failed: list[tuple[float, str]]
    lines: list[str]

    @classmethod
    def parse(cls, log_text: str) -> OptimizerLog:
        ended: list[float] = []
        failed: list[tuple[float, str]] = []
        lines: list[str] = []
        for raw in log_text.splitlines():
            event = _log_event(raw)
            if event is None:
                continue
            stamp, line = event
            if "optimiz" not in line:
                continue
            lines.append(line)
            if OPTIMIZE_LOG_LINE in line:
                ended.append(stamp)
            elif "optimizing" in line and "failed" in line:
                failed.append((stamp, line.split("failed:", 1)[-1].strip()))
        return cls(ended, failed, lines)

    def last(self) -> float | None:
        times = self.ended + [t for t, _ in self.failed]
        return max(times) if times else None

    def child_seconds(self) -> list[float]:
        """Per optimize that changed segments: its child's time (segment merge + HNSW
        build), as the "optimized" line reports it."""
        out = []
        for line in self.lines:
            found = _CHILD_SECONDS.search(line) if OPTIMIZE_LOG_LINE in line else None
            if found:
                out.append(float(found.group(1)))
        return out


_CHILD_SECONDS = re.compile(r"child ([0-9.]+) s")


def _log_event(line: str) -> tuple[float, str] | None:
    """(epoch seconds, text) of a server log line; None for lines that are no event.

    The server logs JSON objects (`ts` in ISO 8601, `msg`); older ones logged
    `%(asctime)s` (local time) and the message on one line.
    """
    if line.startswith("{"):
        try:
            event = json.loads(line)
            return datetime.fromisoformat(event["ts"]).timestamp(), str(event["msg"])
        except (ValueError, KeyError, TypeError):
            return None
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line
    except ValueError:
        return None


def hnsw_build(wait: Mapping[str, Any], log: OptimizerLog) -> dict[str, Any]:
    """The HNSW build as the run saw it: from zero lag until the last optimize ended,
    and each optimize child's own seconds (merge + HNSW build of the copy)."""
    child = log.child_seconds()
    return {
        "method": "last optimize end after zero lag (the index is complete from then); "
        "child seconds from the optimizer's log lines",
        "ready_to_last_optimize_s": wait.get("last_optimize_s_after_ready"),
        "optimize_child_seconds": child,
        "last_optimize_child_s": child[-1] if child else None,
        "optimizes_failed": len(wait.get("optimizes_failed", [])),
        "optimizer_child_peak_rss_kb": wait.get("optimizer_child_peak_rss_kb"),
    }


def optimizer_busy(server: ServeProcess) -> dict[str, Any] | None:
    """Evidence of an optimize running now, or None.

    The adapter may optimize in a child process of the server (on a copy of the shard
    under `.<generation>.optimizing`, then caught up in `<generation>+<n>` until the
    pointer file names it, `swapping_dirs`) or in-process (then it holds the GIL and
    requests stall, which the probes detect). Any child process of the server counts
    as busy, except the write workers (`ORRERY_INGEST_WORKERS`: alive all along). A
    spare empty shard kept for the next new generation (`.spare-*`, with its short-lived
    maker child) is no optimize: only its directory is left out, a maker child at work
    still counts (it takes CPU from the probes).
    """
    vectors = server.data_dir / "generations" / "vectors"
    staging = (
        sorted(
            p.name
            for p in vectors.glob(".*")
            if p.is_dir() and not p.name.startswith(SPARE_SHARD_PREFIX)
        )
        if vectors.exists()
        else []
    )
    staging += swapping_dirs(vectors)
    children = [c for c in child_processes(server.pid) if WRITE_WORKER_MODULE not in c["command"]]
    lexical = server.data_dir / "generations" / "lexical"
    if lexical.exists():  # A tantivy compaction under way (`.compact.<generation>`).
        staging += sorted(p.name for p in lexical.glob(".compact.*") if p.is_dir())
    if not staging and not children:
        return None
    return {"staging_dirs": staging, "children": children}


def swapping_dirs(vectors: Path) -> list[str]:
    """Shard directories of qdrant-edge generations that are not the live one (the
    pointer file `<generation>+live` names it, else `<generation>`): a copy being caught
    up, or an old shard not closed yet."""
    if not vectors.exists():
        return []
    pointers = {p.name.removesuffix("+live") for p in vectors.glob("*+live")}
    out = []
    for path in vectors.iterdir():
        if not path.is_dir() or path.name.startswith("."):
            continue
        generation, mark, _ = path.name.rpartition("+")
        if not mark:
            generation = path.name
        try:
            live = (
                (vectors / f"{generation}+live").read_text().strip()
                if generation in pointers
                else generation
            )
        except FileNotFoundError:  # dropped meanwhile
            continue
        if path.name != live:
            out.append(path.name)
    return sorted(out)


# How long the tantivy generations must stay as they are, no compaction running, for
# the compactor to count as done (it starts once ingest was quiet for an optimize
# interval, and only where a compaction is due).
COMPACTION_QUIET_S = 10.0


def wait_for_lexical_compaction(server: ServeProcess, timeout_s: float = 1_200.0) -> float:
    """Wait until the embedded server's background compactor is done: every tantivy
    generation at one segment, or no compaction running and the same generations left
    with several segments for `COMPACTION_QUIET_S` (a small tail segment is not due: the
    compactor leaves it);
    returns the seconds waited. Only for a server no one writes to meanwhile. Gives up
    quietly after `timeout_s` (a compaction of 100k documents is ~40 s CPU, paced to half
    the wall time: minutes under load)."""
    started = time.perf_counter()
    last: list[str] | None = None
    since = started
    while time.perf_counter() - started < timeout_s:
        pending = lexical_uncompacted(server.data_dir)
        if not pending:
            break
        now = time.perf_counter()
        if pending != last:
            last, since = pending, now
        elif not any(p.startswith(".compact.") for p in pending) and (
            now - since >= COMPACTION_QUIET_S
        ):
            break
        time.sleep(0.2)
    return round(time.perf_counter() - started, 2)


def lexical_uncompacted(data_dir: Path) -> list[str]:
    """The tantivy generations of an embedded data dir with more than one segment (or
    being compacted: a `.compact.<generation>` directory); none when
    `ORRERY_LEXICAL_COMPACTION` is off in this environment (the server's)."""
    if os.environ.get("ORRERY_LEXICAL_COMPACTION", "true").lower() in ("0", "false", "no"):
        return []
    lexical = data_dir / "generations" / "lexical"
    if not lexical.exists():
        return []
    pending = []
    for path in sorted(lexical.iterdir()):
        if path.name.startswith(".compact."):
            pending.append(path.name)
            continue
        try:
            segments = json.loads((path / "meta.json").read_text(encoding="utf-8"))["segments"]
        except (OSError, ValueError, KeyError):
            continue  # Not an index (yet), or being swapped.
        if len(segments) > 1:
            pending.append(path.name)
    return pending


def wait_for_vector_index(
    server: ServeProcess,
    client: httpx.Client,
    probes: Sequence[QuerySpec],
    *,
    result_limit: int,
    start_wall: float,
    ready_wall: float,
    max_wait_s: float,
) -> dict[str, Any]:
    """Probe until the optimizer is quiet and latency is stable (see the module doc)."""
    # The optimizer waits for a generation to be quiet (twice its recent gaps between
    # writes, up to 60 s: `_quiet`) before the build after an ingest: a shorter window
    # declared a 100k ingest built before its one build had started (session 28).
    quiet_s = max(QUIET_INTERVALS * OPTIMIZE_INTERVAL_S, QUIET_WAIT_S)
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    busy_seen = 0
    errors: list[dict[str, Any]] = []
    child_peak_kb = 0
    idle_since: float | None = time.time()
    stable = False
    with _progress() as progress:
        task = progress.add_task("wait for HNSW", total=None, note="")
        while time.perf_counter() - started < max_wait_s:
            round_started = time.perf_counter()
            busy = optimizer_busy(server)
            # While a build runs, one probe a round: Qdrant's side of `ingest_anchor` is
            # polled for green without searches, and a round of brute-force searches over
            # the unindexed points took ~0.2 of a core from the build's child (session 32).
            asked = probes[:BUSY_PROBES] if busy is not None else probes
            latencies: list[float] = []
            for query in asked:
                try:
                    latencies.append(retrieve(client, query, result_limit)[0].seconds)
                except RuntimeError as error:  # an answer during an optimize is data too
                    errors.append(
                        {"at_s": round(time.perf_counter() - started, 2), "error": str(error)}
                    )
            failed = len(asked) - len(latencies)
            if not latencies:
                latencies = [float("nan")]
            busy = busy or optimizer_busy(server)
            now = time.time()
            if busy is not None:
                busy_seen += 1
                idle_since = None
                child_peak_kb = max([child_peak_kb, *(c["VmHWM_kb"] for c in busy["children"])])
            elif idle_since is None:
                idle_since = now
            last_event = OptimizerLog.parse(server.log_text()).last()
            quiet = 0.0 if idle_since is None else now - max(idle_since, last_event or 0.0)
            rounds.append(
                {
                    "at_s": round(time.perf_counter() - started, 2),
                    "probes": len(asked),
                    "p50_ms": round(median(latencies) * 1000, 3),
                    "max_ms": round(max(latencies) * 1000, 3),
                    "round_s": round(time.perf_counter() - round_started, 3),
                    "optimizer_busy": busy is not None,
                    "errors": failed,
                    "quiet_s": round(quiet, 2),
                }
            )
            last = rounds[-STABLE_ROUNDS:]
            p50s = [r["p50_ms"] for r in last]
            stable = (
                len(last) == STABLE_ROUNDS
                and quiet >= quiet_s
                and all(r["max_ms"] < STALL_S * 1000 and not r["errors"] for r in last)
                and (
                    max(p50s) - min(p50s) <= STABLE_SPREAD * min(p50s)
                    or max(p50s) - min(p50s) < 0.5
                )
            )
            progress.update(
                task,
                note=f"p50 {rounds[-1]['p50_ms']:.1f} ms, max {rounds[-1]['max_ms']:.0f} ms, "
                f"{'optimizing' if busy else 'idle'}, quiet {quiet:.0f} s",
            )
            if stable:
                break
            time.sleep(BUSY_POLL_S if busy else 0.2)
    log = OptimizerLog.parse(server.log_text())
    return {
        "method": (
            f"ORRERY_OPTIMIZE_INTERVAL_SECONDS={OPTIMIZE_INTERVAL_S:g}; rounds of "
            f"{len(probes)} probe retrieves ({BUSY_PROBES} every {BUSY_POLL_S:g} s while an "
            f"optimize runs) until, for {quiet_s:g} s, no optimize ran (no "
            f"child process of the server, no .<generation>.optimizing dir, no new "
            f"optimizer log line), no probe took over {STALL_S * 1000:.0f} ms (an "
            f"in-process optimize stalls the server), and {STABLE_ROUNDS} round p50s agree "
            f"within {STABLE_SPREAD:.0%}"
        ),
        "stable": stable,
        "seconds_after_ready": round(time.perf_counter() - started, 2),
        "rounds_with_optimizer_busy": busy_seen,
        "probe_errors": errors,
        "optimizer_child_peak_rss_kb": child_peak_kb,
        "optimizes_ended_s_after_first_post": [round(t - start_wall, 2) for t in log.ended],
        "optimizes_failed": [
            {"at_s_after_first_post": round(t - start_wall, 2), "error": e} for t, e in log.failed
        ],
        "optimizer_log": log.lines,
        "last_optimize_s_after_ready": None
        if log.last() is None
        else round((log.last() or 0.0) - ready_wall, 2),
        "rounds": rounds,
    }


def inspect_vector_shards(data_dir: Path) -> list[dict[str, Any]]:
    """HNSW coverage per generation, read from the shards after the server stopped."""
    from qdrant_edge import EdgeShard

    out = []
    for path in sorted((data_dir / "generations" / "vectors").glob("*")):
        if not path.is_dir() or path.name.startswith("."):
            continue
        try:
            shard = EdgeShard.load(str(path))
            info = shard.info()
            out.append(
                {
                    "generation_id": path.name,
                    "points": info.points_count,
                    "indexed_vectors": info.indexed_vectors_count,
                    "segments": info.segments_count,
                }
            )
            shard.close()
        except Exception as error:  # the driver raises bare Exception
            out.append({"generation_id": path.name, "error": str(error)})
    return out


def measure(
    client: httpx.Client,
    warmup: Sequence[QuerySpec],
    queries: Sequence[QuerySpec],
    result_limit: int,
    server_cpu: Callable[[], float],
    *,
    split: bool = True,
) -> dict[str, Any]:
    """Paths (a)-(d) over the same query texts; see the module docstring (without
    `split`, (c) is skipped and reported as such).

    (a), (d) and (b) are interleaved query by query, so a burst of load from other
    processes hits all three alike. Each path also records the server's CPU time per
    query, which hardly moves when other processes compete for the CPUs.
    """
    for query in warmup:
        one_shot(client, query, result_limit)
    # Through `retrieve`, so the query vectors are cached but no response is.
    _run_each(
        "(a) warm query vectors", len(queries), lambda i: retrieve(client, queries[i], result_limit)
    )

    one_shots = {path: Samples() for path in ONE_SHOT_PATHS}
    cpu_s: dict[str, float] = dict.fromkeys((*ONE_SHOT_PATHS, "split"), 0.0)
    cached_top: list[list[str]] = []

    def interleaved(i: int) -> None:
        variants = (queries[i], queries[i], fresh_variant(queries[i], i))
        for path, query in zip(ONE_SHOT_PATHS, variants, strict=True):
            before = server_cpu()
            ex, body = one_shot(client, query, result_limit)
            cpu_s[path] += server_cpu() - before
            samples = one_shots[path]
            samples.add(ex.seconds, [ex])
            samples.stages_ms.append(body["query_plan"]["latency_ms"])
            samples.engine_ms.append(body["query_plan"].get("engine_ms") or {})
            samples.cache_states[body["query_plan"]["cache"]] += 1
            samples.profiles[body["profile"]] += 1
            if path == "one_shot_cached":
                cached_top.append([r["document_id"] for r in body["results"]])

    _run_each("(a) (d) (b) one-shot, interleaved", len(queries), interleaved)

    split_result = SplitResult()
    split_error: str | None = None if split else "skipped (--no-split)"
    try:
        for query in warmup[:SPLIT_WARMUP] if split else ():
            split_path(client, query, result_limit, None)
        before = server_cpu()
        if split:
            _run_each(
                "(c) split path",
                len(queries),
                lambda i: split_path(client, queries[i], result_limit, split_result),
            )
        cpu_s["split"] = server_cpu() - before
    except RuntimeError as error:  # e.g. the allowed_doc_ids cap: reported, not raised
        split_error = str(error)

    paths: dict[str, Any] = {path: one_shots[path].summary() for path in ONE_SHOT_PATHS}
    if split_error is None:
        agreeing = sum(a == b for a, b in zip(cached_top, split_result.top_ids, strict=True))
        paths["split"] = {
            **split_result.total.summary(),
            "scope_document_ids": split_result.scope_size,
            "steps": {name: s.summary() for name, s in split_result.steps.items()},
            "client_side_ms_p50": round(median(split_result.client_side_s) * 1000, 3),
            "same_top_k_as_one_shot": f"{agreeing}/{len(queries)}",
        }
    else:
        paths["split"] = {"error": split_error}
    for path, seconds in cpu_s.items():
        if "latency_ms" in paths[path]:
            paths[path]["server_cpu_ms_per_query"] = round(seconds * 1000 / len(queries), 3)
    return paths


def ratios(paths: dict[str, Any]) -> dict[str, float]:
    base = paths["one_shot_cached"]["latency_ms"]
    out = {
        f"one_shot_embed_over_cached_{p}": round(
            paths["one_shot_embed"]["latency_ms"][p] / base[p], 2
        )
        for p in ("p50", "p95", "mean")
    }
    out["one_shot_cached_over_response_hit_p50"] = round(
        base["p50"] / paths["one_shot_response_hit"]["latency_ms"]["p50"], 2
    )
    if "latency_ms" in paths["split"]:
        for p in ("p50", "p95", "p99", "mean"):
            out[f"split_over_one_shot_cached_{p}"] = round(
                paths["split"]["latency_ms"][p] / base[p], 2
            )
        out["split_over_one_shot_received_bytes"] = round(
            paths["split"]["bytes_per_query"]["received"]
            / paths["one_shot_cached"]["bytes_per_query"]["received"],
            1,
        )
        out["split_over_one_shot_sent_bytes"] = round(
            paths["split"]["bytes_per_query"]["sent"]
            / paths["one_shot_cached"]["bytes_per_query"]["sent"],
            1,
        )
    return out


def targets(
    paths: dict[str, Any], ratio: dict[str, float], ingested: Mapping[str, Any]
) -> dict[str, Any]:
    """The targets to compare against (reported, never asserted)."""
    cached_p95 = paths["one_shot_cached"]["latency_ms"]["p95"]
    embed_p95 = paths["one_shot_embed"]["latency_ms"]["p95"]
    split_ratio = ratio.get("split_over_one_shot_cached_p50")
    versus = paths["one_shot_cached"].get("server_vs_engines", {})
    over_engines = versus.get("server_over_raw_engines", {}).get("p50")
    lag_p95 = ingested.get("freshness", {}).get("lag_ms", {}).get("p95")
    return {
        "ingest_ge_10000_rec_s": {
            "value": ingested["records_per_s"],
            "met": ingested["records_per_s"] >= 10_000,
        },
        "freshness_lag_p95_le_100ms": {
            "value": lag_p95,
            "met": None if lag_p95 is None else lag_p95 <= 100.0,
        },
        "server_le_2x_raw_engines_p50": {
            "value": over_engines,
            "met": None if over_engines is None else over_engines <= 2.0,
        },
        "one_shot_cached_p95_le_15ms": {"value": cached_p95, "met": cached_p95 <= 15.0},
        "one_shot_embed_p95_le_30ms": {"value": embed_p95, "met": embed_p95 <= 30.0},
        "split_p50_ge_2x_one_shot": {
            "value": split_ratio,
            "met": None if split_ratio is None else split_ratio >= 2.0,
        },
    }


def run_size(size: int, args: argparse.Namespace, vocab: Vocabulary) -> dict[str, Any]:
    console.rule(f"[bold]N = {size:,}")
    root = None if args.data_root is None else args.data_root / str(size)
    build_path = None if root is None else root / BUILD_FILE
    built = _load_build(build_path, size, args.seed)
    batches: SpooledCorpus | None = None
    generate_s = 0.0
    ingested = None if built is not None or root is None else _load_ingested(root, size, args.seed)
    if built is None and ingested is None and root is not None and root.exists():
        # An unfinished ingest (no ingest.json): its records would be sent again as
        # conflicts and its figures mean nothing, so it starts over.
        console.print(f"removing the unfinished build under {root}")
        shutil.rmtree(root)
    if ingested is not None:
        console.print(f"resuming the build under {root}: ingested, waiting for its HNSW")
    elif built is None:
        started = time.perf_counter()

        def generate() -> Iterator[bytes]:
            return corpus_batches(size, args.batch_size, args.seed, vocab, vectors=args.vectors)

        if args.corpus_cache is None:
            batches, reused = SpooledCorpus(generate()), False
        else:
            name = f"corpus-{size}-b{args.batch_size}-s{args.seed}-{args.vectors}.json"
            batches, reused = SpooledCorpus.cached(args.corpus_cache / name, generate)
        generate_s = time.perf_counter() - started
        done = "reused the kept" if reused else "generated"
        console.print(f"{done} {size:,} records in {generate_s:.1f} s ({len(batches)} batches)")
    else:
        console.print(f"reusing the data dir built at {built['built_at']} under {root}")
    query_rng = random.Random(args.seed + 1)
    warmup = make_queries(query_rng, vocab, WARMUP_QUERIES)
    queries = make_queries(query_rng, vocab, args.queries)
    env = {
        **ingest_env(args.batch_size),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
        # Whatever the server's default, the limit measured must be allowed.
        "ORRERY_MAX_RESULT_LIMIT": str(max(args.result_limit, 100)),
        **args.server_env,
    }
    result: dict[str, Any] = {"size": size, "corpus_generate_seconds": round(generate_s, 2)}
    result["server_source_sha256"] = source_digest()
    with (
        serve(env, keep_data=args.keep_data, root=root) as server,
        server.client(timeout_s=args.client_timeout) as client,
        TreeSampler(server.pid, interval_s=MEMORY_SAMPLE_S) as memory,
    ):
        if batches is not None:
            try:
                result["ingest"] = ingest(server, client, batches, size, args.ingest_wait)
            finally:
                batches.close()
            result["memory_kb_after_ingest"] = server.memory_kb()
            result["memory_tree_ingest"] = _without_series(memory.report())
            if root is not None:
                _save_ingested(root, size, args.seed, result)
        elif ingested is not None:
            # The ingest of an earlier run (stopped before its HNSW was built): its
            # figures stand, the build time below counts from that run's first POST
            # (so it includes the time between the runs: `resumed_at` says when).
            for key in _INGEST_KEYS:
                result[key] = ingested.get(key)
            result["resumed_at"] = utc_now()
        else:
            assert built is not None
            result["built"] = {key: built[key] for key in ("built_at", "server_source_sha256")}
            for key in _BUILD_KEYS:
                result[key] = built.get(key)  # builds before session 23 lack memory_tree_*
            result["memory_kb_after_start"] = server.memory_kb()
        wait = wait_for_vector_index(
            server,
            client,
            warmup,
            result_limit=args.result_limit,
            start_wall=result["ingest"]["wall_start"],
            ready_wall=result["ingest"]["wall_ready"],
            max_wait_s=args.index_wait or index_wait_s(size),
        )
        if batches is not None or ingested is not None:
            result["vector_index_wait"] = wait
            result["hnsw_build"] = hnsw_build(wait, OptimizerLog.parse(server.log_text()))
            # Ingest and HNSW builds together (the queries below add nothing to a build's
            # peak; `memory_tree` covers them too). A resumed build counts from its resume.
            result["memory_tree_build"] = memory.report()
            if build_path is not None:
                _save_build(build_path, size, args.seed, result)
        else:
            result["vector_index_wait_on_reuse"] = wait
        result["readiness_has_vector_index_state"] = _has_vector_index_state(_readiness(client))
        before = OptimizerLog.parse(server.log_text())
        busy_before = optimizer_busy(server)
        load_before = os.getloadavg()
        speed_before = interpreter_speed()
        result["paths"] = measure(
            client,
            warmup,
            queries,
            args.result_limit,
            server.cpu_seconds,
            split=not args.no_split,
        )
        # Other processes on the machine share its CPUs: recorded, not controlled.
        result["loadavg_1m"] = {"before_queries": load_before[0], "after": os.getloadavg()[0]}
        result["interpreter_speed"] = {"before_queries": speed_before, "after": interpreter_speed()}
        after = OptimizerLog.parse(server.log_text())
        result["optimizer_ran_during_queries"] = (
            busy_before is not None
            or optimizer_busy(server) is not None
            or (len(after.ended), len(after.failed)) != (len(before.ended), len(before.failed))
        )
        result["memory_kb_end"] = server.memory_kb()
        memory.stop()
        result["memory_tree"] = memory.report()
        result["server_log_problems"] = server.log_problems()
        result["server_pid"] = server.pid
        client.close()
        result["server_exit_code"] = server.stop()
        result["vector_shards"] = inspect_vector_shards(server.data_dir)
    # The bench's own peak: the corpus is spooled to disk, so this stays far below it.
    result["bench_peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result["ratios"] = ratios(result["paths"])
    result["targets"] = targets(result["paths"], result["ratios"], result["ingest"])
    result["embedding_check"] = {
        "client_p50_delta_ms": round(
            result["paths"]["one_shot_embed"]["latency_ms"]["p50"]
            - result["paths"]["one_shot_cached"]["latency_ms"]["p50"],
            3,
        ),
        "server_candidate_fetch_p50_ms": {
            path: result["paths"][path]["server_stage_ms_p50"]["candidate_fetch"]
            for path in ("one_shot_cached", "one_shot_embed")
        },
    }
    for key in ("wall_start", "wall_ready"):
        result["ingest"].pop(key)
    return result


BUILD_FILE = "build.json"
# Written once the ingest of a `--data-root` build is complete: a run stopped while the
# HNSW was still building is resumed from it (`run_size`), not started over.
INGEST_FILE = "ingest.json"
_INGEST_KEYS = (
    "corpus_generate_seconds",
    "ingest",
    "memory_kb_after_ingest",
    "memory_tree_ingest",
)


def _without_series(report: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key != "series_mib"}


def _save_ingested(root: Path, size: int, seed: int, result: Mapping[str, Any]) -> None:
    record = {key: result[key] for key in _INGEST_KEYS}
    record.update(size=size, seed=seed, ingested_at=utc_now())
    (root / INGEST_FILE).write_text(json.dumps(record, indent=1))


def _load_ingested(root: Path, size: int, seed: int) -> dict[str, Any] | None:
    """The ingest record of `root`'s data dir when its ingest of `size` records of
    `seed`'s corpus completed (and its build did not), else None."""
    try:
        record: dict[str, Any] = json.loads((root / INGEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if (record.get("size"), record.get("seed")) == (size, seed) else None


# What a reused data dir carries over from the run that built it.
_BUILD_KEYS = (
    "corpus_generate_seconds",
    "ingest",
    "memory_kb_after_ingest",
    "memory_tree_ingest",
    "vector_index_wait",
    "hnsw_build",
    "memory_tree_build",
)


def _save_build(path: Path, size: int, seed: int, result: Mapping[str, Any]) -> None:
    """Record the build of `path.parent/data` (ingest and HNSW figures) for a later
    `--data-root` run that measures queries on it without rebuilding."""
    build = {key: result[key] for key in _BUILD_KEYS}
    build.update(
        size=size,
        seed=seed,
        built_at=utc_now(),
        server_source_sha256=result["server_source_sha256"],
    )
    path.write_text(json.dumps(build, indent=1))


def _load_build(path: Path | None, size: int, seed: int) -> dict[str, Any] | None:
    """The build record of a complete data dir of `size` records of `seed`'s corpus,
    or None (no `--data-root`, or nothing built there yet)."""
    if path is None or not path.exists():
        return None
    build: dict[str, Any] = json.loads(path.read_text())
    if (build.get("size"), build.get("seed")) != (size, seed):
        raise SystemExit(
            f"{path} holds a build of {build.get('size')} records, seed "
            f"{build.get('seed')}: not {size}, {seed}"
        )
    return build


def _has_vector_index_state(ready: dict[str, Any]) -> bool:
    text = json.dumps(ready).lower()
    return any(word in text for word in ("hnsw", "indexed_vectors", "optimiz"))


# -- output ---------------------------------------------------------------------------------


def print_table(runs: Sequence[dict[str, Any]]) -> None:
    table = Table(title="top-k over HTTP (ms; bytes per query incl. headers)")
    columns = ("N", "path", "p50", "p95", "p99", "mean", "srv CPU/q", "sent B", "recv B")
    for column in columns:
        table.add_column(column, justify="left" if column == "path" else "right")
    for run in runs:
        for path in PATHS:
            figures = run["paths"][path]
            if "error" in figures:
                table.add_row(f"{run['size']:,}", PATH_LABELS[path], figures["error"][:60])
                continue
            lat, wire = figures["latency_ms"], figures["bytes_per_query"]
            table.add_row(
                f"{run['size']:,}",
                PATH_LABELS[path],
                *(f"{lat[p]:.2f}" for p in ("p50", "p95", "p99", "mean")),
                f"{figures.get('server_cpu_ms_per_query', float('nan')):.2f}",
                f"{wire['sent']:,}",
                f"{wire['received']:,}",
            )
    Console(width=150).print(table)
    for run in runs:
        ingest, wait = run["ingest"], run["vector_index_wait"]
        stages = run["paths"]["one_shot_cached"]["server_stage_ms_p50"]
        shards = ", ".join(
            f"{s.get('indexed_vectors', '?')}/{s.get('points', '?')} indexed"
            for s in run["vector_shards"]
        )
        print(
            f"N={run['size']:,}: ingest {ingest['records_per_s']:,.0f} rec/s "
            f"({ingest['ready_seconds']:.1f} s to zero lag); HNSW wait "
            f"{wait['seconds_after_ready']:.1f} s after ready ({shards}); server peak RSS "
            f"(VmHWM) {run['memory_kb_end'].get('VmHWM', 0) / 1024:,.0f} MiB"
        )
        for label, key in (("build", "memory_tree_build"), ("whole run", "memory_tree")):
            if run.get(key):
                print(f"  {label}: {describe_memory(run[key])}")
        print("  server stages p50 (a): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        lag = ingest.get("freshness", {}).get("lag_ms")
        if lag:
            print(
                f"  freshness lag under ingest (ms): p50 {lag['p50']:.1f}, p95 {lag['p95']:.1f}, "
                f"max {lag['max']:.1f} ({ingest['freshness']['measured']} POSTs)"
            )
        versus = run["paths"]["one_shot_cached"].get("server_vs_engines")
        if versus:
            raw, total = versus["raw_engines_ms"], versus["server_total_ms"]
            by_call = ", ".join(
                f"{k} {v['p50']:.2f}" for k, v in versus["engine_ms_by_call"].items()
            )
            print(
                f"  (a) raw engines p50 {raw['p50']:.2f} ms ({by_call}) vs server total p50 "
                f"{total['p50']:.2f} ms; per-query server/raw p50 "
                f"{versus['server_over_raw_engines']['p50']:.2f}, "
                f"p95 {versus['server_over_raw_engines']['p95']:.2f}"
            )
        print("  ratios: " + ", ".join(f"{k} {v}" for k, v in run["ratios"].items()))


def plot(runs: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    sizes = [run["size"] for run in runs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    width = 0.8 / len(PATHS)
    x = np.arange(len(sizes))
    for ax, stat in zip(axes, ("p50", "p95"), strict=True):
        for k, name in enumerate(PATHS):
            values = [
                run["paths"][name].get("latency_ms", {}).get(stat, float("nan")) for run in runs
            ]
            bars = ax.bar(
                x + (k - (len(PATHS) - 1) / 2) * width, values, width, label=PATH_LABELS[name]
            )
            ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=7, padding=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(x, [f"N = {n:,}" for n in sizes])
        ax.set_title(f"{stat} latency over HTTP")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("ms (log scale)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Orrery top-k: one-shot topk_records vs the split path (result_limit=10)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated corpus sizes")
    parser.add_argument("--queries", type=int, default=200, help="timed queries per path (>=100)")
    parser.add_argument("--result-limit", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=2_000, help="records per POST")
    parser.add_argument("--seed", type=int, default=20_260_101)
    parser.add_argument(
        "--vectors", choices=VECTOR_KINDS, default="clustered", help="bench/synthetic.py"
    )
    parser.add_argument(
        "--ingest-wait",
        choices=["searchable"],
        default=None,
        help="POST /v1/records?wait=searchable: each POST answers once its records are "
        "searchable (default: answer on commit, paced by the projector's backlog)",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "topk.json")
    parser.add_argument(
        "--index-wait", type=float, default=None, help="max s to wait for HNSW (default: by N)"
    )
    parser.add_argument("--timeout", type=int, default=None, help="global timeout in s (by N)")
    parser.add_argument("--keep-data", action="store_true", help="keep each temp data dir")
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=120.0,
        help="seconds a POST or readiness call may take (raise it on a starved machine)",
    )
    parser.add_argument(
        "--no-split", action="store_true", help="skip (c), the split path (slow at 1M)"
    )
    parser.add_argument(
        "--corpus-cache",
        type=Path,
        default=None,
        help="keep each size's generated corpus (its POST bodies) under DIR and reuse it "
        "in later runs with the same size, batch size, seed and vectors",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more ORRERY_* setting for the server (repeatable), for A/B runs of a "
        "setting; recorded in the report's config",
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="build each size's data dir under DIR/<N> and keep it; a later run with the "
        "same DIR measures the queries on it without ingesting again",
    )
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    args.server_env = dict(_setting(item, parser) for item in args.server_env)
    if args.queries < 1 or not args.sizes:
        parser.error("need at least one size and one query")
    if args.timeout is None:
        args.timeout = max(5_400, sum(run_budget_s(size) for size in args.sizes))
    return args


def _setting(item: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.startswith("ORRERY_"):
        parser.error(f"--server-env takes ORRERY_NAME=VALUE, not {item!r}")
    return name, value


def index_wait_s(size: int) -> float:
    """How long to wait for the HNSW build at most: 900 s, or 6 ms a record (the final
    build at 100k took 121 s; 1M needs several times 10x that on 2 cores)."""
    return max(900.0, size * 0.006)


def run_budget_s(size: int) -> int:
    """A size's share of the global timeout: corpus (~0.2 ms a record), ingest (~0.7 ms
    a record at 1,400 rec/s), the HNSW wait at most, and the queries (600 s)."""
    return int(600 + size * 0.0015 + index_wait_s(size))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    git = git_facts()  # before the runs: others may edit the tree meanwhile
    started = utc_now()
    vocab = Vocabulary.build(random.Random(args.seed))
    runs: list[dict[str, Any]] = []
    try:
        with deadline(args.timeout):
            for size in args.sizes:
                runs.append(run_size(size, args, vocab))
    except BenchTimeout as error:
        console.print(f"[red]{error}")
        return 1
    report = {
        "benchmark": "topk",
        "date": started,
        "git": git,
        "machine": machine_facts(),
        "config": {
            "sizes": args.sizes,
            "queries": args.queries,
            "warmup_queries": WARMUP_QUERIES,
            "result_limit": args.result_limit,
            "batch_size": args.batch_size,
            "ingest_wait": args.ingest_wait,
            "seed": args.seed,
            "vectors": args.vectors,
            "vector_dimension": DIMENSION,
            "vocabulary_size": VOCABULARY_SIZE,
            "zipf_exponent": ZIPF_EXPONENT,
            "filtered_queries": "every second: status any-of + galaxy",
            "request_timeout_seconds": REQUEST_TIMEOUT_S,
            "index_wait_seconds": {
                str(size): args.index_wait or index_wait_s(size) for size in args.sizes
            },
            "global_timeout_seconds": args.timeout,
            "corpus": "spooled to a temp file before the run, POSTed one batch at a time",
            "server_env": {
                "ORRERY_MAX_BATCH": args.batch_size,
                "ORRERY_OPTIMIZE_INTERVAL_SECONDS": OPTIMIZE_INTERVAL_S,
                "ORRERY_MAX_RESULT_LIMIT": max(args.result_limit, 100),
                **args.server_env,
            },
            "bytes_counted": (
                "HTTP/1.1 request and response bodies exactly (no content-encoding) plus "
                "head bytes rebuilt from the request/status line and header lines"
            ),
        },
        "runs": runs,
    }
    publish(args.out, report, runs, plot, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
