"""Orrery's one-shot top-k against Qdrant's own hybrid query on a synthetic corpus with
HNSW on both sides (100k records by default).

    .venv/bin/python bench/versus_qdrant_synthetic.py [--size 100000] [--queries 300]
        [--data-root DIR] [--keep-collection] [--vectors clustered|uniform]
        [--out docs/bench/versus_qdrant_100k.json]

The sibling of `bench/versus_qdrant.py` (SciFact, 5,183 documents: both engines search
the vectors by brute force there). Here:

1. Corpus: `bench/topk.py`'s synthetic records (seeded; pseudo-words with Zipf
   frequencies, 0.5-1 KB payloads, a precomputed 384-d unit vector each, clustered
   around 1,000 embedded topics whose words the text shares: `bench/synthetic.py`;
   the committed 100k session-11 run had i.i.d. vectors, `--vectors uniform`); the
   corpus of N is a prefix of every larger one. Queries: `bench/topk.py`'s query texts (2-5
   words), unfiltered, each embedded once with Orrery's own query embedder (cached
   under `~/.cache/orrery-bench/`); Orrery embeds the text itself (its vector is
   warmed through `retrieve` before the clock), Qdrant gets the cached vector.
2. BM25 for Qdrant exactly as `bench/versus_qdrant.py` builds it: Orrery's english
   analyzer over `contracts.index_fields.combined_text`, BM25's tf part with the
   corpus's mean length, `modifier: idf` (`tests/unit/test_versus_qdrant_sparse.py`
   checks that the dot product is tantivy's score). The namespace is indexed english
   on Orrery's side too (`ORRERY_NAMESPACE_LANGUAGES`).
3. Qdrant (the harness's server): a dense vector (384, cosine, **default HNSW**: m 16,
   ef_construct 100, built once the segment passes the indexing threshold) and the
   sparse vector, payload = the record's payload plus its `item_id`; waits for green.
   Query: `prefetch=[dense limit 100, sparse limit 100]`, `FusionQuery(RRF)`,
   `limit=10`, `with_payload=True`.
4. Orrery: an embedded `orrery serve` (response cache off) with its default
   generation (qdrant-edge HNSW built by its background optimizer; the bench waits as
   `bench/topk.py` does until the optimizer is quiet, then until tantivy's compaction and
   the in-memory lexical copy the compactor builds are done), the one-shot `topk_records`,
   result limit 10, the default profile. With `--data-root` the data dir is kept and
   reused by the next run (ingest and HNSW build once); `--keep-collection` keeps the
   Qdrant collection the same way.
5. Timed as `bench/versus_qdrant.py` times: warm-up, then every query once per path,
   the path order rotating per query; server CPU per query from /proc; `/proc/loadavg`
   before and after. The top-10 overlap of Orrery's answer with Qdrant's is reported
   (the fusions differ: weighted min-max against RRF), as is the overlap of Qdrant's
   dense HNSW top 10 with its exact top 10 on the same queries.

Writes JSON (+ PNG) and prints a table. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/versus_qdrant_synthetic.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    exchange,
    ingest_env,
    latency_bars,
    latency_summary,
    poll_readiness,
    post_records,
    run_and_publish,
    serve,
    source_digest,
)
from bench.synthetic import VECTOR_KINDS
from bench.topk import (
    NAMESPACE,
    SCOPE_REF,
    QuerySpec,
    Vocabulary,
    corpus_batches,
    inspect_vector_shards,
    make_queries,
    wait_for_lexical_compaction,
    wait_for_vector_index,
)
from bench.versus_qdrant import (
    CACHE_DIR,
    DENSE,
    DIMENSION,
    LANGUAGE,
    OPTIMIZE_INTERVAL_S,
    PREFETCH_LIMIT,
    REQUEST_TIMEOUT_S,
    RESULT_LIMIT,
    SPARSE,
    bm25_corpus,
    english_analyzer,
    process_cpu_seconds,
    qdrant_raw_body,
    qdrant_request,
    qdrant_target,
    query_sparse,
)
from contracts.index_fields import combined_text

__all__ = ["main"]

SEED = 20_260_101
BATCH = 2_000
QDRANT_BATCH = 500
WARMUP_QUERIES = 20
PATHS = ("orrery", "qdrant_client_rest", "qdrant_raw_rest")
PATH_LABELS = {
    "orrery": "Orrery one-shot topk_records (HTTP, default profile)",
    "qdrant_client_rest": "Qdrant query_points, qdrant-client REST",
    "qdrant_raw_rest": "Qdrant query_points, raw REST JSON (httpx)",
}
TOPK = "/v1/external/retrieve/topk_records"

console = Console(stderr=True)


def corpus(
    size: int, kind: str = "clustered"
) -> tuple[list[bytes], list[dict[str, Any]], np.ndarray]:
    """`bench/topk.py`'s corpus: the POST bodies, and per record (in order) what Qdrant
    gets: item id, text, payload; and the vectors (float32, as sent)."""
    vocab = Vocabulary.build(random.Random(SEED))
    bodies: list[bytes] = []
    rows: list[dict[str, Any]] = []
    vectors = np.empty((size, DIMENSION), dtype=np.float32)
    for body in corpus_batches(size, BATCH, SEED, vocab, vectors=kind):
        bodies.append(body)
        for record in json.loads(body):
            vectors[len(rows)] = record["vector"]
            rows.append(
                {
                    "item_id": record["item_id"],
                    "title": record["text"]["title"],
                    "body": record["text"]["body"],
                    "payload": record["payload"],
                }
            )
    return bodies, rows, vectors


def queries(count: int) -> list[QuerySpec]:
    """`bench/topk.py`'s query texts (after its warm-up ones), without filters."""
    vocab = Vocabulary.build(random.Random(SEED))
    rng = random.Random(SEED + 1)
    specs = make_queries(rng, vocab, WARMUP_QUERIES + count)
    return [QuerySpec(spec.text, None) for spec in specs]


def query_vectors(texts: Sequence[str]) -> np.ndarray:
    """Each text embedded once by Orrery's query embedder, cached on disk."""
    from projector.bootstrap import default_embedder

    embedder = default_embedder(threads=os.cpu_count() or 2)
    key = hashlib.sha256(json.dumps([embedder.embedder_id, *texts]).encode()).hexdigest()
    path = CACHE_DIR / f"synthetic-queries-{key[:24]}.npy"
    if path.exists():
        stored: np.ndarray = np.load(path)
        return stored
    array = np.asarray(embedder.embed(list(texts)), dtype=np.float32)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npy")
    np.save(partial, array)
    partial.replace(path)
    return array


def qdrant_collection(
    client: Any,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    vectors: np.ndarray,
    sparse: Any,
) -> dict[str, Any]:
    """The collection (reused when it already holds every point), then the wait for green."""
    from qdrant_client import models

    started = time.perf_counter()
    reused = False
    if client.collection_exists(name) and client.count(name, exact=True).count == len(rows):
        reused = True
    else:
        if client.collection_exists(name):
            client.delete_collection(name)
        client.create_collection(
            name,
            vectors_config={
                DENSE: models.VectorParams(size=DIMENSION, distance=models.Distance.COSINE)
            },
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
        )
        for start in range(0, len(rows), QDRANT_BATCH):
            points = []
            for i in range(start, min(start + QDRANT_BATCH, len(rows))):
                indices, values = sparse.rows[i]
                vector: dict[str, Any] = {DENSE: vectors[i].tolist()}
                if indices:
                    vector[SPARSE] = models.SparseVector(indices=indices, values=values)
                payload = {**rows[i]["payload"], "item_id": rows[i]["item_id"]}
                points.append(models.PointStruct(id=i, vector=vector, payload=payload))
            client.upsert(name, points=points, wait=True)
    uploaded_s = time.perf_counter() - started
    while True:
        info = client.get_collection(name)
        if info.status == models.CollectionStatus.GREEN:
            break
        if time.perf_counter() - started > 1_800:
            raise RuntimeError(f"Qdrant collection {name} not green after 1,800 s")
        time.sleep(1.0)
    return {
        "name": name,
        "reused": reused,
        "upload_seconds": round(uploaded_s, 2),
        "green_seconds": round(time.perf_counter() - started, 2),
        "points": info.points_count,
        "indexed_vectors": info.indexed_vectors_count,
        "segments": info.segments_count,
        "hnsw_config": info.config.hnsw_config.model_dump(),
    }


def load_orrery(
    server: Any, client: httpx.Client, bodies: Sequence[bytes], size: int
) -> dict[str, Any]:
    """POST the corpus unless the (kept) data dir holds it already; then wait for the
    projector, for the HNSW build (`bench.topk.wait_for_vector_index`) and for tantivy's
    compaction to one segment (`bench.topk.wait_for_lexical_compaction`)."""

    def documents(ready: Mapping[str, Any]) -> int:
        return sum(int(s["document_count"]) for s in ready["scopes"] if s["namespace"] == NAMESPACE)

    started_wall = time.time()
    started = time.perf_counter()
    present = documents(client.get("/v1/readiness").json())
    posted = present < size
    if posted:
        if present:
            raise RuntimeError(f"the data dir holds {present} records, not {size}: use a fresh one")
        for body in bodies:
            response = post_records(client, body)
            if response.status_code != 200:
                raise RuntimeError(
                    f"POST /v1/records: {response.status_code} {response.text[:300]}"
                )
    poll_readiness(server, client, lambda r: bool(r["ready"]) and documents(r) >= size)
    ready_s = time.perf_counter() - started
    probes = queries(20)[:20]
    wait = wait_for_vector_index(
        server,
        client,
        probes,
        result_limit=RESULT_LIMIT,
        start_wall=started_wall,
        ready_wall=time.time(),
        max_wait_s=3_600,
    )
    return {
        "documents": size,
        "ingested_now": posted,
        "ready_seconds": round(ready_s, 2),
        "vector_index_wait": {k: v for k, v in wait.items() if k != "rounds"},
        "lexical_compaction_wait_seconds": wait_for_lexical_compaction(server),
        "lexical_copy_wait_seconds": wait_for_lexical_copy(client, probes[0].text),
    }


def wait_for_lexical_copy(
    client: httpx.Client, text: str, timeout_s: float = 900.0
) -> float | None:
    """Wait until the server answers the lexical side from its in-memory copy (the
    `flat_lexical` engine in a probe query's `engine_ms`), which its background compactor
    builds from the canonical store once the generation is quiet (session 17: up to 100k
    documents); returns the seconds waited, None after `timeout_s` (a server without
    such a copy: the figures are then tantivy's)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        response = client.post(TOPK, content=topk_content(text))
        if response.status_code == 200 and "flat_lexical" in (
            response.json()["query_plan"].get("engine_ms") or {}
        ):
            return round(time.perf_counter() - started, 2)
        time.sleep(1.0)
    return None


def topk_content(text: str) -> bytes:
    body = {
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
        "query_text": text,
        "result_limit": RESULT_LIMIT,
        "timeout_seconds": REQUEST_TIMEOUT_S,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def measure(
    orrery: httpx.Client,
    orrery_cpu: Any,
    rest: Any,
    raw: httpx.Client,
    qdrant_pid: int | None,
    collection: str,
    cases: Sequence[tuple[str, np.ndarray, tuple[list[int], list[float]]]],
    warmup: int,
) -> dict[str, dict[str, list[Any]]]:
    """Every query once per path (rotating order) after `warmup` untimed queries."""
    samples: dict[str, dict[str, list[Any]]] = {
        p: {"seconds": [], "cpu": [], "ranked": [], "stages": [], "engine": []} for p in PATHS
    }

    def run(
        path: str, case: tuple[str, np.ndarray, tuple[list[int], list[float]]], keep: bool
    ) -> None:
        text, vector, sparse = case
        if path == "orrery":
            before = orrery_cpu()
            ex = exchange(orrery, "POST", TOPK, content=topk_content(text))
            cpu = orrery_cpu() - before
            if ex.response.status_code != 200:
                raise RuntimeError(
                    f"topk_records: {ex.response.status_code} {ex.response.text[:300]}"
                )
            answer = ex.json()
            seconds, ranked = ex.seconds, [str(r["item_id"]) for r in answer["results"]]
            if keep:
                samples[path]["stages"].append(answer["query_plan"]["latency_ms"])
                samples[path]["engine"].append(answer["query_plan"].get("engine_ms") or {})
        elif path == "qdrant_client_rest":
            prefetch, fusion = qdrant_request(vector, sparse)
            before = process_cpu_seconds(qdrant_pid)
            started = time.perf_counter()
            points = rest.query_points(
                collection, prefetch=prefetch, query=fusion, limit=RESULT_LIMIT, with_payload=True
            ).points
            seconds = time.perf_counter() - started
            cpu = process_cpu_seconds(qdrant_pid) - before
            ranked = [str(p.payload["item_id"]) for p in points]
        else:
            before = process_cpu_seconds(qdrant_pid)
            ex = exchange(
                raw, "POST", f"/collections/{collection}/points/query",
                content=qdrant_raw_body(vector, sparse),
            )  # fmt: skip
            cpu = process_cpu_seconds(qdrant_pid) - before
            if ex.response.status_code != 200:
                raise RuntimeError(
                    f"qdrant query: {ex.response.status_code} {ex.response.text[:300]}"
                )
            seconds = ex.seconds
            ranked = [str(p["payload"]["item_id"]) for p in ex.json()["result"]["points"]]
        if keep:
            samples[path]["seconds"].append(seconds)
            samples[path]["cpu"].append(cpu)
            samples[path]["ranked"].append(ranked)

    for case in cases[:warmup]:
        for path in PATHS:
            run(path, case, False)
    timed = cases[warmup:]
    for i, case in enumerate(timed):
        shift = i % len(PATHS)
        for path in PATHS[shift:] + PATHS[:shift]:
            run(path, case, True)
        if (i + 1) % 50 == 0 or i + 1 == len(timed):
            console.print(f"timed {i + 1}/{len(timed)} queries on {len(PATHS)} paths")
    return samples


def hnsw_recall(client: Any, collection: str, vectors: Sequence[np.ndarray]) -> float:
    """Mean overlap of Qdrant's dense HNSW top 10 with its exact top 10."""
    from qdrant_client import models

    overlap = []
    for vector in vectors:
        approx = client.query_points(
            collection, query=vector.tolist(), using=DENSE, limit=RESULT_LIMIT
        ).points
        exact = client.query_points(
            collection, query=vector.tolist(), using=DENSE, limit=RESULT_LIMIT,
            search_params=models.SearchParams(exact=True),
        ).points  # fmt: skip
        overlap.append(len({p.id for p in approx} & {p.id for p in exact}) / RESULT_LIMIT)
    return round(float(np.mean(overlap)), 4)


def summarize(samples: Mapping[str, Mapping[str, list[Any]]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, s in samples.items():
        out: dict[str, Any] = {"latency_ms": latency_summary(s["seconds"])}
        cpu = [c for c in s["cpu"] if not np.isnan(c)]
        if cpu:
            out["server_cpu_ms_per_query"] = round(1000 * float(np.mean(cpu)), 3)
        if s["stages"]:
            out["server_stage_ms_p50"] = {
                k: round(float(np.percentile([x[k] for x in s["stages"]], 50)), 3)
                for k in s["stages"][0]
            }
            keys = sorted({k for e in s["engine"] for k in e})
            out["engine_ms_p50"] = {
                k: round(float(np.percentile([e.get(k, 0.0) for e in s["engine"]], 50)), 3)
                for k in keys
            }
        paths[path] = out
    return paths


def run(args: argparse.Namespace) -> dict[str, Any]:
    from qdrant_client import QdrantClient

    target = qdrant_target()
    console.print(f"generating {args.size:,} records (bench/topk.py's corpus)")
    bodies, rows, vectors = corpus(args.size, args.vectors)
    specs = queries(args.queries)
    console.print(f"embedding {len(specs)} query texts (cached)")
    qvectors = query_vectors([s.text for s in specs])
    with tempfile.TemporaryDirectory(prefix="orrery-vsqdrant-") as work:
        analyze = english_analyzer(Path(work) / "lexical")
        tokens = [analyze(combined_text(r["title"], r["body"], ())) for r in rows]
    sparse = bm25_corpus(tokens)
    del tokens
    cases = [
        (s.text, qvectors[i], query_sparse(analyze(s.text), sparse.vocabulary))
        for i, s in enumerate(specs)
    ]
    collection = args.collection or f"orrery-vsqdrant-synthetic-{args.size}-{SEED}"
    rest = QdrantClient(url=target.url, prefer_grpc=False, timeout=120, check_compatibility=False)
    env = {
        **ingest_env(BATCH),
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_NAMESPACE_LANGUAGES": json.dumps({NAMESPACE: LANGUAGE}),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
    }
    report: dict[str, Any] = {
        "corpus_size": args.size,
        "queries": args.queries,
        "config": {
            "seed": SEED,
            "vectors": args.vectors,
            "result_limit": RESULT_LIMIT,
            "warmup_queries_per_path": WARMUP_QUERIES,
            "qdrant_prefetch_limit": PREFETCH_LIMIT,
            "qdrant_fusion": "rrf",
            "filters": None,
            "bm25_avgdl": round(sparse.avgdl, 3),
            "bm25_vocabulary": len(sparse.vocabulary),
            "orrery_server_env": env,
            "orrery_profile": "server default",
            "qdrant_version": target.version,
        },
        "server_source_sha256": source_digest(),
    }
    root = args.data_root
    try:
        report["qdrant_collection"] = qdrant_collection(rest, collection, rows, vectors, sparse)
        console.print(f"Qdrant collection ready: {report['qdrant_collection']}")
        raw = httpx.Client(
            base_url=target.url,
            timeout=60,
            trust_env=False,
            headers={"accept-encoding": "identity"},
        )
        with serve(env, root=root, startup_s=600) as server, server.client() as orrery, raw:
            report["orrery_load"] = load_orrery(server, orrery, bodies, args.size)
            console.print("Orrery loaded and HNSW built")
            for text, _vector, _sparse in cases:
                warm = {
                    "namespace": NAMESPACE,
                    "scope_ref": SCOPE_REF,
                    "query_text": text,
                    "limit": 1,
                }
                orrery.post("/v1/external/retrieve", json=warm).raise_for_status()
            load_before = os.getloadavg()
            samples = measure(
                orrery, server.cpu_seconds, rest, raw, target.pid, collection, cases, WARMUP_QUERIES
            )
            report["loadavg"] = {"before": list(load_before), "after": list(os.getloadavg())}
            report["orrery_memory_kb"] = server.memory_kb()
            report["orrery_log_problems"] = server.log_problems()
            orrery.close()
            report["orrery_exit_code"] = server.stop()
            report["orrery_vector_shards"] = inspect_vector_shards(server.data_dir)
        report["qdrant_dense_hnsw_recall@10"] = hnsw_recall(
            rest, collection, [c[1] for c in cases[WARMUP_QUERIES:]][:100]
        )
    finally:
        if not args.keep_collection:
            with contextlib.suppress(Exception):
                rest.delete_collection(collection)
        rest.close()
    report["paths"] = summarize(samples)
    orrery_top = samples["orrery"]["ranked"]
    overlap = [
        len(set(a) & set(b)) / max(1, len(b))
        for a, b in zip(orrery_top, samples["qdrant_client_rest"]["ranked"], strict=True)
    ]
    report["orrery_top10_overlap_with_qdrant_mean"] = round(float(np.mean(overlap)), 3)
    o, q = (
        report["paths"]["orrery"]["latency_ms"],
        report["paths"]["qdrant_client_rest"]["latency_ms"],
    )
    report["orrery_over_qdrant_client_rest"] = {
        p: round(o[p] / q[p], 2) for p in ("p50", "p95", "p99", "mean")
    }
    return report


def print_table(report: Mapping[str, Any]) -> None:
    table = Table(
        title=f"synthetic {report['corpus_size']:,}, HNSW both sides, top {RESULT_LIMIT} (ms)"
    )
    for column in ("path", "p50", "p95", "p99", "mean", "srv CPU/q"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for path, figures in report["paths"].items():
        lat = figures["latency_ms"]
        table.add_row(
            PATH_LABELS[path],
            *(f"{lat[p]:.2f}" for p in ("p50", "p95", "p99", "mean")),
            f"{figures.get('server_cpu_ms_per_query', float('nan')):.2f}",
        )
    Console(width=150).print(table)
    print(f"Orrery stages p50: {report['paths']['orrery'].get('server_stage_ms_p50')}")
    print(f"Orrery engine_ms p50: {report['paths']['orrery'].get('engine_ms_p50')}")
    print(f"top-10 overlap Orrery/Qdrant: {report['orrery_top10_overlap_with_qdrant_mean']}")
    print(f"Qdrant dense HNSW recall@10: {report['qdrant_dense_hnsw_recall@10']}")
    print(f"Orrery/Qdrant client REST: {report['orrery_over_qdrant_client_rest']}")
    print(f"loadavg: {report['loadavg']}")


def plot(report: Mapping[str, Any], path: Path) -> None:
    load = report["loadavg"]
    latency_bars(
        report,
        path,
        label=lambda name, _figures: PATH_LABELS[name],
        title=f"synthetic {report['corpus_size']:,} records, HNSW both sides, top "
        f"{RESULT_LIMIT}; top-10 overlap {report['orrery_top10_overlap_with_qdrant_mean']:.2f}"
        f"; loadavg {load['before'][0]:.1f} -> {load['after'][0]:.1f}",
        figsize=(9, 4.4),
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--data-root", type=Path, default=None, help="keep Orrery's data here")
    parser.add_argument("--collection", default=None, help="Qdrant collection name")
    parser.add_argument("--keep-collection", action="store_true")
    parser.add_argument(
        "--vectors", choices=VECTOR_KINDS, default="clustered", help="bench/synthetic.py"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "versus_qdrant_100k.json"
    )
    parser.add_argument("--timeout", type=int, default=7_200, help="global timeout in s")
    args = parser.parse_args(argv)
    if args.size < BATCH or args.queries < 1:
        parser.error(f"--size must be >= {BATCH} and --queries >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_and_publish(
        "versus_qdrant_synthetic",
        lambda: run(args),
        timeout_s=args.timeout,
        out=args.out,
        plot=plot,
        table=print_table,
    )


if __name__ == "__main__":
    sys.exit(main())
