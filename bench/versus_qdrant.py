"""Orrery's one-shot top-k against Qdrant's own hybrid query, side by side on SciFact.

    .venv/bin/python bench/versus_qdrant.py [DATASET_DIR] [--queries N]
        [--out docs/bench/versus_qdrant.json] [--no-grpc] [--py-spy OUT.raw]

Both systems get the same vectors and the same analyzer:

1. SciFact (BEIR format, `../shared/data/scifact` by default) is read with
   `bench.quality.load_dataset`; rankings are scored with `bench.quality.ndcg_at`.
2. Vectors: every document's `contracts.embedding.embedding_text` (title, then body, as
   the projector embeds it) and every test query are embedded once with Orrery's own
   embedder (`projector.bootstrap.default_embedder`), cached under
   `~/.cache/orrery-bench/` keyed by the corpus's and the queries' sha256 and the
   embedder id, so a rerun skips the embedding (~4 min on 2 cores).
3. BM25 for Qdrant from Orrery's own analyzer: the analyzer a generation of language
   english registers with its tantivy index (`orrery_text_v2_english`, taken from
   `TantivyLexicalIndex.searchable`) tokenizes the combined text field
   (`contracts.index_fields.combined_text`, what `weighted@3` scores); each term gets a
   stable index (the sorted corpus vocabulary), a document's value is BM25's tf part
   `tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl))` with k1 = 1.2, b = 0.75, and the
   collection's sparse vector has `modifier: idf`, so Qdrant multiplies by the same
   BM25 idf tantivy uses. A query's sparse vector is its analyzed unique terms (those
   in the vocabulary: no other term can match) with value 1.0.
4. Qdrant: the harness's server (`ORRERY_QDRANT_URL`, 1.16.3), one collection with a
   named dense vector (384, cosine, default HNSW) and a named sparse vector, points
   carrying the SciFact row as payload; the bench waits for status green, then queries
   `prefetch=[dense limit 100, sparse limit 100]`, `FusionQuery(RRF)`, `limit=10`,
   `with_payload=True`. The collection is deleted at the end, whatever happens.
5. Orrery: a real embedded `orrery serve` (response cache off, so every answer is
   ranked: `query_plan.cache` is checked to be `disabled`), SciFact POSTed with the same
   precomputed vectors; every query's vector is cached in the server first through
   `POST /v1/external/retrieve` (the one-shot API takes text, not vectors); then the
   one-shot `POST /v1/external/retrieve/topk_records` with `result_limit` 10 and the
   default profile.
6. Timed, interleaved query by query (the order rotates each query, so load from other
   processes hits every path alike), after 20 warm-up queries of each path:
   Orrery one-shot over one keep-alive httpx client (timed until the body is read, JSON
   encoded before and decoded after the clock, `bench.common.exchange`); Qdrant through
   qdrant-client over REST and over gRPC (timed around `query_points`: request building
   and response parsing included, as a Qdrant user sees it); and the same Qdrant query
   as raw REST JSON through `exchange` on an httpx client of its own (timed exactly like
   Orrery's). Each path's server CPU per query comes from /proc (both servers run on
   this machine). After each query, `GET /healthz` of both servers times their HTTP
   stacks' floor. `/proc/loadavg` is recorded before and after.

With `--py-spy OUT.raw`, after the timed runs the Orrery one-shot is sent once more for
every query while `py-spy record -r 500 -f raw` samples the server (not timed).

Writes `docs/bench/versus_qdrant.json` and a PNG next to it and prints a table. Figures
are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/versus_qdrant.py`: repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    Exchange,
    ServeProcess,
    exchange,
    ingest_env,
    latency_bars,
    latency_summary,
    poll_readiness,
    run_and_publish,
    serve,
    source_digest,
)
from bench.quality import NAMESPACE, SCOPE_REF, Dataset, beir_record, load_dataset, ndcg_at
from contracts.index_fields import combined_text

__all__ = [
    "Bm25Corpus",
    "bm25_corpus",
    "main",
    "query_sparse",
]

DEFAULT_DATASET = REPO_ROOT.parent / "shared" / "data" / "scifact"
CACHE_DIR = Path.home() / ".cache" / "orrery-bench"
LANGUAGE = "english"
K1 = 1.2
B = 0.75
DIMENSION = 384
PREFETCH_LIMIT = 100
RESULT_LIMIT = 10
WARMUP_QUERIES = 20
BATCH = 500
QDRANT_BATCH = 256
REQUEST_TIMEOUT_S = 30.0
OPTIMIZE_INTERVAL_S = 1.0
QUIET_S = 5.0
DENSE = "dense"
SPARSE = "bm25"
PATHS = ("orrery", "orrery_rrf2", "qdrant_client_rest", "qdrant_client_grpc", "qdrant_raw_rest")
# The profile of the path "orrery_rrf2": RRF like Qdrant's query (k = 60, 100 per source)
# over the same BM25 field, to compare fusion alike; "orrery" is the server's default.
RRF_PROFILE = "rrf@2"
PATH_LABELS = {
    "orrery": "Orrery one-shot topk_records (HTTP, default weighted@3)",
    "orrery_rrf2": "Orrery one-shot topk_records (HTTP, rrf@2)",
    "qdrant_client_rest": "Qdrant query_points, qdrant-client REST",
    "qdrant_client_grpc": "Qdrant query_points, qdrant-client gRPC",
    "qdrant_raw_rest": "Qdrant query_points, raw REST JSON (httpx)",
}

console = Console(stderr=True)


# --------------------------------------------------------------------------- BM25 sparse


@dataclass(frozen=True, slots=True)
class Bm25Corpus:
    """BM25 sparse vectors of a corpus: `vocabulary` maps each term to its index (terms
    sorted, so the mapping is a pure function of the corpus), `rows[i]` is document i's
    `(indices, values)` with indices ascending, `avgdl` the mean analyzed length."""

    vocabulary: dict[str, int]
    rows: list[tuple[list[int], list[float]]]
    avgdl: float


def bm25_corpus(documents: Sequence[Sequence[str]], *, k1: float = K1, b: float = B) -> Bm25Corpus:
    """Each document's analyzed tokens (repeats kept: they are its term frequencies)
    become BM25's tf part per distinct term, `tf (k1 + 1) / (tf + k1 (1 - b + b dl /
    avgdl))`, dl = its token count; the idf part is the engine's (`modifier: idf`). A
    document without tokens gets an empty row."""
    vocabulary = {term: i for i, term in enumerate(sorted({t for doc in documents for t in doc}))}
    lengths = [len(doc) for doc in documents]
    avgdl = sum(lengths) / len(lengths) if lengths and sum(lengths) else 1.0
    rows: list[tuple[list[int], list[float]]] = []
    for doc, dl in zip(documents, lengths, strict=True):
        norm = k1 * (1.0 - b + b * dl / avgdl)
        counts = sorted((vocabulary[term], tf) for term, tf in Counter(doc).items())
        rows.append(([i for i, _ in counts], [tf * (k1 + 1.0) / (tf + norm) for _, tf in counts]))
    return Bm25Corpus(vocabulary, rows, avgdl)


def query_sparse(
    tokens: Sequence[str], vocabulary: Mapping[str, int]
) -> tuple[list[int], list[float]]:
    """A query's sparse vector: its distinct analyzed terms that occur in the corpus
    (indices ascending), each with value 1.0 — a BM25 query term counts once, as in
    Orrery's lexical search."""
    indices = sorted({vocabulary[t] for t in tokens if t in vocabulary})
    return indices, [1.0] * len(indices)


def english_analyzer(workdir: Path) -> Callable[[str], list[str]]:
    """The analyzer a generation of language english registers with its tantivy index
    (the very object the query side analyzes with), as `text -> tokens`."""
    from contracts.index_fields import text_analyzer_name
    from projector.adapters.tantivy_lexical import TantivyLexicalIndex

    lexical = TantivyLexicalIndex(workdir)
    lexical.create("g1", text_analyzer=text_analyzer_name(LANGUAGE))
    _, name, analyzer = lexical.searchable("g1")
    lexical.close()
    if name != f"orrery_text_v2_{LANGUAGE}":
        raise RuntimeError(f"unexpected analyzer {name}")

    def analyze(text: str) -> list[str]:
        # As the index writes and the search reads: invalid Unicode becomes a separator.
        return list(analyzer.analyze(text.encode("utf-8", "replace").decode("utf-8")))

    return analyze


# --------------------------------------------------------------------------- vectors


def _record_text(row: Mapping[str, Any]) -> tuple[str, str]:
    """(title, body) of a corpus row, exactly as `bench.quality.beir_record` writes them."""
    text = beir_record(row)["text"]
    return str(text["title"]), str(text["body"])


@dataclass(frozen=True, slots=True)
class Vectors:
    documents: np.ndarray  # (N, 384) float32, in corpus order
    queries: dict[str, np.ndarray]
    embedder_id: str
    cache_file: str
    embedded_now: bool
    embed_seconds: float


def cached_vectors(dataset: Dataset, dataset_dir: Path, query_ids: Sequence[str]) -> Vectors:
    """Every document's and every query's vector from Orrery's embedder, computed once and
    cached on disk (float32, as the embedder returns them)."""
    from contracts.embedding import embedding_text
    from contracts.records import RecordText
    from projector.bootstrap import default_embedder

    embedder = default_embedder(threads=os.cpu_count() or 2)
    corpus_sha = hashlib.sha256((dataset_dir / "corpus.jsonl").read_bytes()).hexdigest()
    query_sha = hashlib.sha256(
        json.dumps([[q, dataset.queries[q]] for q in query_ids]).encode()
    ).hexdigest()
    key = hashlib.sha256(f"{corpus_sha}\0{query_sha}\0{embedder.embedder_id}".encode()).hexdigest()
    path = CACHE_DIR / f"{dataset.name}-{key[:24]}.npz"
    if path.exists():
        with np.load(path) as stored:
            ids = [str(x) for x in stored["query_ids"]]
            return Vectors(
                stored["documents"],
                dict(zip(ids, stored["queries"], strict=True)),
                embedder.embedder_id,
                str(path),
                False,
                0.0,
            )
    texts = [
        embedding_text(RecordText(title=title, body=body))
        for title, body in map(_record_text, dataset.corpus)
    ]
    started = time.perf_counter()
    documents: list[tuple[float, ...]] = []
    chunk = 256
    for start in range(0, len(texts), chunk):
        documents += embedder.embed(texts[start : start + chunk])
        console.print(
            f"embedded {len(documents):,}/{len(texts):,} documents "
            f"({time.perf_counter() - started:.0f} s)"
        )
    queries = embedder.embed([dataset.queries[q] for q in query_ids])
    seconds = time.perf_counter() - started
    doc_array = np.asarray(documents, dtype=np.float32)
    query_array = np.asarray(queries, dtype=np.float32)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, documents=doc_array, queries=query_array, query_ids=np.asarray(query_ids))
    partial.replace(path)
    return Vectors(
        doc_array,
        dict(zip(query_ids, query_array, strict=True)),
        embedder.embedder_id,
        str(path),
        True,
        round(seconds, 1),
    )


# --------------------------------------------------------------------------- Qdrant


@dataclass(frozen=True, slots=True)
class QdrantTarget:
    """The harness's Qdrant server: REST URL, gRPC port, pid (for its CPU time)."""

    url: str
    grpc_port: int | None
    pid: int | None
    version: str | None


def qdrant_target() -> QdrantTarget:
    """From `tests/harness/servers.py` (its `servers.json`); `SystemExit` when Qdrant is
    not running."""
    from tests.harness.servers import server_urls

    url = server_urls().get("qdrant")
    if not url:
        raise SystemExit("the harness's Qdrant is not running (make servers-up)")
    state = Path(os.environ.get("ORRERY_SERVERS_DIR", "/tmp/orrery-servers")) / "servers.json"
    facts: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        facts = json.loads(state.read_text())["servers"]["qdrant"]
    grpc = facts.get("ports", {}).get("grpc")
    return QdrantTarget(
        str(url), int(grpc) if grpc else None, facts.get("pid"), facts.get("version")
    )


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process `pid` so far (NaN when unknown)."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_collection(
    client: Any, name: str, dataset: Dataset, dense: np.ndarray, sparse: Bm25Corpus
) -> dict[str, Any]:
    """The collection, its points (payload = the SciFact row), and the wait for green."""
    from qdrant_client import models

    client.create_collection(
        name,
        vectors_config={
            DENSE: models.VectorParams(size=DIMENSION, distance=models.Distance.COSINE)
        },
        sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
    )
    started = time.perf_counter()
    for start in range(0, len(dataset.corpus), QDRANT_BATCH):
        points = []
        for i in range(start, min(start + QDRANT_BATCH, len(dataset.corpus))):
            indices, values = sparse.rows[i]
            vector: dict[str, Any] = {DENSE: dense[i].tolist()}
            if indices:
                vector[SPARSE] = models.SparseVector(indices=indices, values=values)
            points.append(models.PointStruct(id=i, vector=vector, payload=dataset.corpus[i]))
        client.upsert(name, points=points, wait=True)
    uploaded_s = time.perf_counter() - started
    while True:
        info = client.get_collection(name)
        if info.status == models.CollectionStatus.GREEN:
            break
        if time.perf_counter() - started > 600:
            raise RuntimeError(f"Qdrant collection {name} not green after 600 s: {info.status}")
        time.sleep(0.5)
    return {
        "upload_seconds": round(uploaded_s, 2),
        "green_seconds": round(time.perf_counter() - started, 2),
        "points": info.points_count,
        "indexed_vectors": info.indexed_vectors_count,
        "segments": info.segments_count,
        "hnsw_config": info.config.hnsw_config.model_dump(),
        "optimizer_indexing_threshold_kb": info.config.optimizer_config.indexing_threshold,
    }


def qdrant_request(query_vector: np.ndarray, sparse: tuple[list[int], list[float]]) -> Any:
    """The hybrid query as qdrant-client arguments: (prefetch list, fusion query)."""
    from qdrant_client import models

    prefetch = [models.Prefetch(query=query_vector.tolist(), using=DENSE, limit=PREFETCH_LIMIT)]
    if sparse[0]:  # a query without a corpus term has no sparse side
        prefetch.append(
            models.Prefetch(
                query=models.SparseVector(indices=sparse[0], values=sparse[1]),
                using=SPARSE,
                limit=PREFETCH_LIMIT,
            )
        )
    return prefetch, models.FusionQuery(fusion=models.Fusion.RRF)


def qdrant_raw_body(query_vector: np.ndarray, sparse: tuple[list[int], list[float]]) -> bytes:
    """The same hybrid query as the JSON body of `POST /collections/{name}/points/query`."""
    prefetch: list[dict[str, Any]] = [
        {"query": query_vector.tolist(), "using": DENSE, "limit": PREFETCH_LIMIT}
    ]
    if sparse[0]:
        prefetch.append(
            {
                "query": {"indices": sparse[0], "values": sparse[1]},
                "using": SPARSE,
                "limit": PREFETCH_LIMIT,
            }
        )
    body = {
        "prefetch": prefetch,
        "query": {"fusion": "rrf"},
        "limit": RESULT_LIMIT,
        "with_payload": True,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def qdrant_quality(
    client: Any,
    name: str,
    queries: Sequence[tuple[str, np.ndarray, tuple[list[int], list[float]]]],
    dataset: Dataset,
) -> dict[str, float]:
    """nDCG@10 of Qdrant's single sources (dense only, sparse only) over every query:
    how close its BM25 is to Orrery's lexical-text run (`docs/bench/quality.json`)."""
    from qdrant_client import models

    ndcg: dict[str, list[float]] = {"dense_only": [], "sparse_only": []}
    for query_id, vector, sparse in queries:
        relevant = dataset.qrels[query_id]
        dense_hits = client.query_points(
            name, query=vector.tolist(), using=DENSE, limit=RESULT_LIMIT, with_payload=True
        ).points
        ndcg["dense_only"].append(ndcg_at([str(p.payload["_id"]) for p in dense_hits], relevant))
        ranked: list[str] = []
        if sparse[0]:
            hits = client.query_points(
                name,
                query=models.SparseVector(indices=sparse[0], values=sparse[1]),
                using=SPARSE,
                limit=RESULT_LIMIT,
                with_payload=True,
            ).points
            ranked = [str(p.payload["_id"]) for p in hits]
        ndcg["sparse_only"].append(ndcg_at(ranked, relevant))
    return {k: round(float(np.mean(v)), 4) for k, v in ndcg.items()}


# --------------------------------------------------------------------------- Orrery


def load_orrery(
    server: ServeProcess, client: httpx.Client, dataset: Dataset, dense: np.ndarray
) -> dict[str, Any]:
    """POST the corpus with its precomputed vectors, wait until the projector indexed all
    of it, then until the qdrant-edge optimizer has been quiet for `QUIET_S`, then until
    tantivy's background compaction left one segment per generation."""
    from bench.topk import OptimizerLog, optimizer_busy, wait_for_lexical_compaction

    started = time.perf_counter()
    total = len(dataset.corpus)
    for start in range(0, total, BATCH):
        records = [
            {**beir_record(row), "vector": dense[start + i].tolist()}
            for i, row in enumerate(dataset.corpus[start : start + BATCH])
        ]
        ex = exchange(client, "POST", "/v1/records", body=records)
        if ex.response.status_code != 200:
            raise RuntimeError(
                f"POST /v1/records: {ex.response.status_code} {ex.response.text[:500]}"
            )
    posted_s = time.perf_counter() - started

    def indexed(ready: dict[str, Any]) -> bool:
        count = sum(
            int(s["document_count"]) for s in ready["scopes"] if s["namespace"] == NAMESPACE
        )
        return bool(ready["ready"]) and count >= total

    poll_readiness(server, client, indexed)
    ready_s = time.perf_counter() - started
    quiet_since = time.time()
    while True:
        if optimizer_busy(server) is not None:
            quiet_since = time.time()
        last = OptimizerLog.parse(server.log_text()).last()
        if time.time() - max(quiet_since, last or 0.0) >= QUIET_S:
            break
        if time.perf_counter() - started > 900:
            raise RuntimeError("the qdrant-edge optimizer did not go quiet in 900 s")
        time.sleep(0.2)
    quiet_s = round(time.perf_counter() - started, 2)
    return {
        "documents": total,
        "post_seconds": round(posted_s, 2),
        "ready_seconds": round(ready_s, 2),
        "optimizer_quiet_seconds": quiet_s,
        "lexical_compaction_wait_seconds": wait_for_lexical_compaction(server),
        "optimizer_log": OptimizerLog.parse(server.log_text()).lines,
    }


def orrery_body(text: str, profile: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
        "query_text": text,
        "result_limit": RESULT_LIMIT,
        "timeout_seconds": REQUEST_TIMEOUT_S,
    }
    if profile is not None:
        body["profile"] = profile
    return body


def warm_query_vector(client: httpx.Client, text: str) -> None:
    """`POST /v1/external/retrieve`: the server embeds and caches the query's vector."""
    body = {"namespace": NAMESPACE, "scope_ref": SCOPE_REF, "query_text": text, "limit": 1}
    response = client.post("/v1/external/retrieve", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"retrieve: {response.status_code} {response.text[:300]}")


# --------------------------------------------------------------------------- measurement


@dataclass
class PathSamples:
    """Per query of one path: latency, server CPU, the ranking, the server's own figures."""

    seconds: list[float] = field(default_factory=list)
    server_cpu_s: list[float] = field(default_factory=list)
    ndcg: list[float] = field(default_factory=list)
    rankings: list[list[str]] = field(default_factory=list)
    stages_ms: list[dict[str, float]] = field(default_factory=list)
    engine_ms: list[dict[str, float]] = field(default_factory=list)
    cache_states: Counter[str] = field(default_factory=Counter)
    profiles: Counter[str] = field(default_factory=Counter)
    received_bytes: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "latency_ms": latency_summary(self.seconds),
            "ndcg@10": round(float(np.mean(self.ndcg)), 4),
        }
        cpu = [c for c in self.server_cpu_s if not np.isnan(c)]
        if cpu:
            out["server_cpu_ms_per_query"] = round(1000 * float(np.mean(cpu)), 3)
        if self.received_bytes:
            out["response_body_bytes_mean"] = round(float(np.mean(self.received_bytes)))
        if self.stages_ms:
            out["server_stage_ms_p50"] = {
                stage: round(float(np.percentile([s[stage] for s in self.stages_ms], 50)), 3)
                for stage in self.stages_ms[0]
            }
            out["server_stage_ms_p95"] = {
                stage: round(float(np.percentile([s[stage] for s in self.stages_ms], 95)), 3)
                for stage in self.stages_ms[0]
            }
        if self.engine_ms:
            keys = sorted({k for e in self.engine_ms for k in e})
            out["engine_ms_p50"] = {
                k: round(float(np.percentile([e.get(k, 0.0) for e in self.engine_ms], 50)), 3)
                for k in keys
            }
            out["engine_ms_total_p50"] = round(
                float(np.percentile([sum(e.values()) for e in self.engine_ms], 50)), 3
            )
        if self.cache_states:
            out["response_cache"] = dict(self.cache_states)
        if self.profiles:
            out["profiles"] = dict(self.profiles)
        return out


@dataclass(frozen=True, slots=True)
class QueryCase:
    query_id: str
    text: str
    vector: np.ndarray
    sparse: tuple[list[int], list[float]]


class Runner:
    """One timed request per path and query; see the module docstring for what is timed."""

    def __init__(
        self,
        orrery: httpx.Client,
        orrery_cpu: Callable[[], float],
        qdrant_rest: Any,
        qdrant_grpc: Any | None,
        qdrant_http: httpx.Client,
        qdrant_pid: int | None,
        collection: str,
        dataset: Dataset,
    ) -> None:
        self.orrery = orrery
        self.orrery_cpu = orrery_cpu
        self.qdrant_rest = qdrant_rest
        self.qdrant_grpc = qdrant_grpc
        self.qdrant_http = qdrant_http
        self.qdrant_pid = qdrant_pid
        self.collection = collection
        self.dataset = dataset
        self.paths = [p for p in PATHS if p != "qdrant_client_grpc" or qdrant_grpc is not None]
        self.healthz_s: dict[str, list[float]] = {"orrery": [], "qdrant": []}

    def floors(self) -> None:
        """`GET /healthz` of both servers: what their HTTP stacks cost for an empty answer."""
        for name, client in (("orrery", self.orrery), ("qdrant", self.qdrant_http)):
            ex = exchange(client, "GET", "/healthz")
            if ex.response.status_code != 200:
                raise RuntimeError(f"{name} /healthz: HTTP {ex.response.status_code}")
            self.healthz_s[name].append(ex.seconds)

    def run(self, path: str, case: QueryCase, out: PathSamples | None) -> None:
        if path == "orrery":
            self._orrery(case, out, None)
        elif path == "orrery_rrf2":
            self._orrery(case, out, RRF_PROFILE)
        elif path == "qdrant_raw_rest":
            self._qdrant_raw(case, out)
        else:
            client = self.qdrant_rest if path == "qdrant_client_rest" else self.qdrant_grpc
            self._qdrant_client(client, case, out)

    def _record(
        self,
        out: PathSamples | None,
        case: QueryCase,
        seconds: float,
        cpu: float,
        ranked: list[str],
    ) -> None:
        if out is None:
            return
        out.seconds.append(seconds)
        out.server_cpu_s.append(cpu)
        out.rankings.append(ranked)
        out.ndcg.append(ndcg_at(ranked, self.dataset.qrels[case.query_id], RESULT_LIMIT))

    def _orrery(self, case: QueryCase, out: PathSamples | None, profile: str | None) -> None:
        content = json.dumps(orrery_body(case.text, profile), separators=(",", ":")).encode()
        before = self.orrery_cpu()
        ex = exchange(self.orrery, "POST", "/v1/external/retrieve/topk_records", content=content)
        cpu = self.orrery_cpu() - before
        answer = _ok(ex, "topk_records")
        ranked = [str(r["item_id"]) for r in answer["results"]]
        self._record(out, case, ex.seconds, cpu, ranked)
        if out is not None:
            plan = answer["query_plan"]
            out.stages_ms.append(plan["latency_ms"])
            out.engine_ms.append(plan.get("engine_ms") or {})
            out.cache_states[plan["cache"]] += 1
            out.profiles[answer["profile"]] += 1
            out.received_bytes.append(ex.received_body)

    def _qdrant_client(self, client: Any, case: QueryCase, out: PathSamples | None) -> None:
        prefetch, fusion = qdrant_request(case.vector, case.sparse)
        before = process_cpu_seconds(self.qdrant_pid)
        started = time.perf_counter()
        points = client.query_points(
            self.collection, prefetch=prefetch, query=fusion, limit=RESULT_LIMIT, with_payload=True
        ).points
        seconds = time.perf_counter() - started
        cpu = process_cpu_seconds(self.qdrant_pid) - before
        self._record(out, case, seconds, cpu, [str(p.payload["_id"]) for p in points])

    def _qdrant_raw(self, case: QueryCase, out: PathSamples | None) -> None:
        content = qdrant_raw_body(case.vector, case.sparse)
        before = process_cpu_seconds(self.qdrant_pid)
        ex = exchange(
            self.qdrant_http,
            "POST",
            f"/collections/{self.collection}/points/query",
            content=content,
        )
        cpu = process_cpu_seconds(self.qdrant_pid) - before
        points = _ok(ex, "qdrant points/query")["result"]["points"]
        self._record(out, case, ex.seconds, cpu, [str(p["payload"]["_id"]) for p in points])
        if out is not None:
            out.received_bytes.append(ex.received_body)


def _ok(ex: Exchange, what: str) -> dict[str, Any]:
    if ex.response.status_code != 200:
        raise RuntimeError(f"{what}: HTTP {ex.response.status_code}: {ex.response.text[:500]}")
    body: dict[str, Any] = ex.json()
    return body


def measure(
    runner: Runner, cases: Sequence[QueryCase], warmup: Sequence[QueryCase]
) -> dict[str, PathSamples]:
    """Warm-up, then every query once per path, the order of the paths rotating per query."""
    for case in warmup:
        for path in runner.paths:
            runner.run(path, case, None)
    samples = {path: PathSamples() for path in runner.paths}
    for i, case in enumerate(cases):
        shift = i % len(runner.paths)
        for path in runner.paths[shift:] + runner.paths[:shift]:
            runner.run(path, case, samples[path])
        runner.floors()
        if (i + 1) % 50 == 0 or i + 1 == len(cases):
            console.print(f"timed {i + 1}/{len(cases)} queries on {len(runner.paths)} paths")
    return samples


def agreement(samples: Mapping[str, PathSamples]) -> dict[str, Any]:
    """How alike the rankings are: the Qdrant paths among themselves (they should be
    identical), and Orrery's top 10 against Qdrant's (mean overlap)."""
    out: dict[str, Any] = {}
    qdrant = [p for p in samples if p.startswith("qdrant")]
    base = samples[qdrant[0]].rankings
    for path in qdrant[1:]:
        same = sum(a == b for a, b in zip(base, samples[path].rankings, strict=True))
        out[f"{path}_same_ranking_as_{qdrant[0]}"] = f"{same}/{len(base)}"
    overlap = [
        len(set(a) & set(b)) / max(1, len(b))
        for a, b in zip(samples["orrery"].rankings, base, strict=True)
    ]
    out["orrery_top10_overlap_with_qdrant_mean"] = round(float(np.mean(overlap)), 3)
    return out


@contextlib.contextmanager
def py_spy(pid: int, out: Path) -> Iterator[None]:
    """`py-spy record -r 500 -f raw` on `pid` while the block runs (SIGINT ends it)."""
    binary = Path(sys.executable).with_name("py-spy")
    process = subprocess.Popen(
        [str(binary), "record", "-r", "500", "-f", "raw", "-o", str(out), "--pid", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # attached before the first request
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        if process.returncode not in (0, -signal.SIGINT):
            console.print(f"py-spy exited {process.returncode}: {err.decode()[-500:]}")


# --------------------------------------------------------------------------- output


def print_table(report: Mapping[str, Any]) -> None:
    table = Table(title=f"SciFact top {RESULT_LIMIT}: Orrery vs Qdrant hybrid (ms over loopback)")
    for column in ("path", "p50", "p95", "p99", "mean", "srv CPU/q", "nDCG@10"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for path, figures in report["paths"].items():
        lat = figures["latency_ms"]
        table.add_row(
            PATH_LABELS[path],
            *(f"{lat[p]:.2f}" for p in ("p50", "p95", "p99", "mean")),
            f"{figures.get('server_cpu_ms_per_query', float('nan')):.2f}",
            f"{figures['ndcg@10']:.4f}",
        )
    Console(width=150).print(table)
    orrery = report["paths"]["orrery"]
    print(
        "Orrery server stages p50: "
        + ", ".join(f"{k} {v:.2f}" for k, v in orrery["server_stage_ms_p50"].items())
    )
    print(
        "Orrery engine_ms p50: "
        + ", ".join(f"{k} {v:.2f}" for k, v in orrery["engine_ms_p50"].items())
        + f" (sum per query p50 {orrery['engine_ms_total_p50']:.2f})"
    )
    print(f"Qdrant single sources nDCG@10: {report['qdrant_single_sources_ndcg@10']}")
    floor = report["http_floor_healthz_ms"]
    print(
        "HTTP floor, GET /healthz p50/p95: "
        + ", ".join(f"{k} {v['p50']:.2f}/{v['p95']:.2f} ms" for k, v in floor.items())
    )
    print(f"agreement: {report['agreement']}")
    print(f"loadavg: {report['loadavg']}")


def plot(report: Mapping[str, Any], path: Path) -> None:
    load = report["loadavg"]
    latency_bars(
        report,
        path,
        label=lambda name, figures: f"{PATH_LABELS[name]} — nDCG@10 {figures['ndcg@10']:.3f}",
        title=f"SciFact ({report['corpus_size']:,} docs, {report['queries']} queries), top "
        f"{RESULT_LIMIT}, same vectors and analyzer; loadavg {load['before'][0]:.1f} -> "
        f"{load['after'][0]:.1f}",
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("dataset", type=Path, nargs="?", default=DEFAULT_DATASET)
    parser.add_argument(
        "--queries", type=int, default=None, help="time only the first N test queries (all)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "versus_qdrant.json"
    )
    parser.add_argument("--no-grpc", action="store_true", help="leave qdrant-client gRPC out")
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="profile the Orrery server into this raw file"
    )
    parser.add_argument("--timeout", type=int, default=3_600, help="global timeout in s")
    args = parser.parse_args(argv)
    if args.queries is not None and args.queries < 1:
        parser.error("--queries must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_and_publish(
        "versus_qdrant",
        lambda: run(args),
        timeout_s=args.timeout,
        out=args.out,
        plot=plot,
        table=print_table,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from qdrant_client import QdrantClient

    dataset = load_dataset(args.dataset)
    query_ids = sorted(dataset.qrels)
    target = qdrant_target()
    console.print(
        f"{dataset.name}: {len(dataset.corpus):,} documents, {len(query_ids)} test queries; "
        f"Qdrant {target.version} at {target.url} (gRPC {target.grpc_port})"
    )
    vectors = cached_vectors(dataset, args.dataset, query_ids)
    how = "embedded now" if vectors.embedded_now else "from cache"
    console.print(f"vectors: {how} ({vectors.cache_file})")
    with tempfile.TemporaryDirectory(prefix="orrery-vsqdrant-") as work:
        analyze = english_analyzer(Path(work) / "lexical")
        token_lists = [analyze(combined_text(*_record_text(row), ())) for row in dataset.corpus]
    sparse = bm25_corpus(token_lists)
    cases = [
        QueryCase(
            q,
            dataset.queries[q],
            vectors.queries[q],
            query_sparse(analyze(dataset.queries[q]), sparse.vocabulary),
        )
        for q in query_ids
    ]
    timed = cases[: args.queries] if args.queries else cases
    warmup = cases[-WARMUP_QUERIES:]
    collection = f"orrery-vsqdrant-{uuid.uuid4().hex[:8]}"
    rest = QdrantClient(url=target.url, prefer_grpc=False, timeout=60, check_compatibility=False)
    grpc = None
    if target.grpc_port is not None and not args.no_grpc:
        grpc = QdrantClient(
            url=target.url,
            grpc_port=target.grpc_port,
            prefer_grpc=True,
            timeout=60,
            check_compatibility=False,
        )
    env = {
        **ingest_env(BATCH),
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_NAMESPACE_LANGUAGES": json.dumps({NAMESPACE: LANGUAGE}),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
    }
    report: dict[str, Any] = {
        "dataset": dataset.name,
        "corpus_size": len(dataset.corpus),
        "queries": len(timed),
        "config": {
            "result_limit": RESULT_LIMIT,
            "warmup_queries_per_path": WARMUP_QUERIES,
            "qdrant_prefetch_limit": PREFETCH_LIMIT,
            "qdrant_fusion": "rrf",
            "bm25": {
                "k1": K1,
                "b": B,
                "avgdl": round(sparse.avgdl, 3),
                "vocabulary": len(sparse.vocabulary),
            },
            "analyzer": f"orrery_text_v2_{LANGUAGE} over contracts.index_fields.combined_text",
            "embedder_id": vectors.embedder_id,
            "vector_cache": vectors.cache_file,
            "embedded_now_seconds": vectors.embed_seconds if vectors.embedded_now else None,
            "orrery_server_env": env,
            "orrery_profile": "server default",
            "qdrant_version": target.version,
            "timing": {
                "orrery": "bench.common.exchange: request sent -> whole body read; JSON "
                "encoded before, decoded after the clock",
                "qdrant_raw_rest": "the same exchange() on an httpx client of its own",
                "qdrant_client_*": "around QdrantClient.query_points: request building and "
                "response parsing included",
                "server_cpu": "utime+stime of the server process from /proc around each request",
            },
        },
    }
    try:
        report["qdrant_collection"] = create_collection(
            rest, collection, dataset, vectors.documents, sparse
        )
        console.print(f"Qdrant collection ready: {report['qdrant_collection']}")
        report["server_source_sha256"] = source_digest()
        # Uncompressed like Orrery's answers (httpx asks for gzip by default, and Qdrant
        # obliges): exchange() counts the bytes as framed.
        raw = httpx.Client(
            base_url=target.url,
            timeout=60,
            trust_env=False,
            headers={"accept-encoding": "identity"},
        )
        with serve(env) as server, server.client() as orrery, raw as qdrant_http:
            report["orrery_load"] = load_orrery(server, orrery, dataset, vectors.documents)
            console.print(f"Orrery loaded: {report['orrery_load']}")
            for case in cases:
                warm_query_vector(orrery, case.text)
            runner = Runner(
                orrery, server.cpu_seconds, rest, grpc, qdrant_http, target.pid, collection, dataset
            )
            load_before = os.getloadavg()
            samples = measure(runner, timed, warmup)
            load_after = os.getloadavg()
            report["loadavg"] = {"before": list(load_before), "after": list(load_after)}
            if args.py_spy is not None:
                with py_spy(server.pid, args.py_spy):
                    for case in timed:
                        runner.run("orrery", case, None)
                report["py_spy_raw"] = str(args.py_spy)
            report["orrery_memory_kb"] = server.memory_kb()
            report["orrery_log_problems"] = server.log_problems()
            report["qdrant_single_sources_ndcg@10"] = qdrant_quality(
                rest, collection, [(c.query_id, c.vector, c.sparse) for c in timed], dataset
            )
            orrery.close()
            report["orrery_exit_code"] = server.stop()
            from bench.topk import inspect_vector_shards

            report["orrery_vector_shards"] = inspect_vector_shards(server.data_dir)
    finally:
        with contextlib.suppress(Exception):  # best effort: report the original error
            rest.delete_collection(collection)
        rest.close()
        if grpc is not None:
            grpc.close()
    report["paths"] = {path: s.summary() for path, s in samples.items()}
    report["http_floor_healthz_ms"] = {
        name: latency_summary(seconds) for name, seconds in runner.healthz_s.items()
    }
    report["agreement"] = agreement(samples)
    orrery_p = report["paths"]["orrery"]["latency_ms"]
    qdrant_p = report["paths"]["qdrant_client_rest"]["latency_ms"]
    report["orrery_over_qdrant_client_rest"] = {
        p: round(orrery_p[p] / qdrant_p[p], 2) for p in ("p50", "p95", "p99", "mean")
    }
    return report


if __name__ == "__main__":
    sys.exit(main())
