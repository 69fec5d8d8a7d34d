"""Payload-aware HNSW links in qdrant-edge: build time and filtered recall per policy.

    .venv/bin/python bench/hnsw_payload.py [--size 100000] [--vectors clustered|uniform]
        [--policies all,graph,tenant,none] [--queries 60] [--out docs/bench/hnsw_payload.json]

Qdrant builds extra HNSW links for every value block of a payload index that has
`enable_hnsw` (the default) and covers more points than the full-scan threshold, so each
such field costs about one more graph build over the points it covers. This measures a
shard shaped like Orrery's (`contracts.vector_payload`: the same seven payload indexes,
384-d cosine vectors, payloads distributed like `bench/topk.py`'s corpus) under four
policies: `all` fields linked (Qdrant's default), `graph` = `GRAPH_FIELDS` (what Orrery
creates), `tenant` = `galaxy` only, `none`. For each: load time, `optimize()` time, and
recall@10 against exact search (hnsw_ef 128) for unfiltered, tenant + status, and
`updated_at` range queries (near-duplicates of stored vectors). `--vectors uniform`
draws i.i.d. unit vectors (an HNSW worst case where nearest neighbours barely differ);
`clustered` (default) draws around 1,000 centres, closer to real embeddings.

The engine is used directly, in this process, one policy at a time; figures are printed
and written as JSON, never asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as `python bench/hnsw_payload.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qdrant_edge import (
    DatetimeIndexParams,
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HnswIndexConfig,
    IntegerIndexParams,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Point,
    Query,
    QueryRequest,
    RangeDateTime,
    SearchParams,
    UpdateOperation,
)

from bench.common import REPO_ROOT, git_facts, machine_facts, utc_now, write_json
from bench.topk import GALAXIES, STATUS_WEIGHTS, STATUSES, VISIBILITY
from contracts.vector_payload import GRAPH_FIELDS, PAYLOAD_INDEXES, TENANT_FIELD

DIMENSION = 384
POLICIES: dict[str, frozenset[str]] = {
    "all": frozenset(PAYLOAD_INDEXES),
    "graph": GRAPH_FIELDS,
    "tenant": frozenset({TENANT_FIELD}),
    "none": frozenset(),
}


def vectors(size: int, kind: str, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if kind == "clustered":
        centres = rng.standard_normal((1_000, DIMENSION))
        raw = centres[rng.integers(0, 1_000, size)] + 0.8 * rng.standard_normal((size, DIMENSION))
    else:
        raw = rng.standard_normal((size, DIMENSION))
    unit: np.ndarray[Any, Any] = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(
        np.float32
    )
    return unit


def create_shard(path: Path, linked: frozenset[str]) -> Any:
    config = EdgeConfig(
        vectors={"v": EdgeVectorParams(size=DIMENSION, distance=Distance.Cosine)},
        hnsw_config=HnswIndexConfig(m=16, ef_construct=100, full_scan_threshold=10_000),
        optimizers=EdgeOptimizersConfig(indexing_threshold=10_000),
    )
    shard = EdgeShard.create(str(path), config)
    for field, kind in PAYLOAD_INDEXES.items():
        graph = field in linked
        params: Any
        if kind == "keyword":
            params = KeywordIndexParams(is_tenant=field == TENANT_FIELD or None, enable_hnsw=graph)
        elif kind == "integer":
            params = IntegerIndexParams(lookup=True, range=True, enable_hnsw=graph)
        else:
            params = DatetimeIndexParams(enable_hnsw=graph)
        shard.update(UpdateOperation.create_field_index(field, params))
    return shard


def payload(index: int, rng: random.Random) -> dict[str, Any]:
    return {
        "document_id": f"d{index}",
        "revision": 1,
        "galaxy": rng.choice(GALAXIES),
        "status": rng.choices(STATUSES, weights=STATUS_WEIGHTS)[0],
        "updated_at": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T00:00:00Z",
        "visibility": sorted(rng.sample(VISIBILITY, rng.randint(1, 2))),
        "facets": [f"room={rng.randint(0, 6)}"],
    }


def query_filter(kind: str, rng: random.Random) -> Filter | None:
    if kind == "tenant+status":
        return Filter(
            must=[
                FieldCondition("galaxy", match=MatchValue(rng.choice(GALAXIES))),
                FieldCondition("status", match=MatchAny(["active", "candidate"])),
            ]
        )
    if kind == "updated_at range":
        window = RangeDateTime(gte="2026-03-01T00:00:00Z", lte="2026-07-01T00:00:00Z")
        return Filter(must=[FieldCondition("updated_at", range=window)])
    return None


def _top10(shard: Any, vector: list[float], where: Filter | None, params: SearchParams) -> set[Any]:
    request = QueryRequest(
        query=Query.Nearest(vector, using="v"), filter=where, limit=10, params=params
    )
    return {point.id for point in shard.query(request)}


def measure(
    policy: str, data: np.ndarray[Any, Any], queries: int, seed: int, root: Path
) -> dict[str, Any]:
    rng, np_rng = random.Random(seed), np.random.default_rng(seed)
    shard = create_shard(root / policy, POLICIES[policy])
    try:
        started = time.perf_counter()
        for start in range(0, len(data), 2_000):
            points = [
                Point(id=i, vector={"v": data[i].tolist()}, payload=payload(i, rng))
                for i in range(start, min(len(data), start + 2_000))
            ]
            shard.update(UpdateOperation.upsert_points(points))
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        shard.optimize()
        optimize_s = time.perf_counter() - started
        recall: dict[str, Any] = {}
        for kind in ("unfiltered", "tenant+status", "updated_at range"):
            hits, latencies = [], []
            for _ in range(queries):
                near = data[np_rng.integers(0, len(data))] + 0.05 * np_rng.standard_normal(
                    DIMENSION
                )
                vector = (near / np.linalg.norm(near)).tolist()
                where = query_filter(kind, rng)
                exact = _top10(shard, vector, where, SearchParams(exact=True))
                tick = time.perf_counter()
                approximate = _top10(shard, vector, where, SearchParams(hnsw_ef=128))
                latencies.append(time.perf_counter() - tick)
                hits.append(len(exact & approximate) / max(1, len(exact)))
            recall[kind] = {
                "recall_at_10": round(float(np.mean(hits)), 3),
                "p50_ms": round(float(np.median(latencies)) * 1000, 2),
            }
        return {
            "policy": policy,
            "linked_fields": sorted(POLICIES[policy]),
            "load_s": round(load_s, 1),
            "optimize_s": round(optimize_s, 1),
            "queries": recall,
        }
    finally:
        shard.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--vectors", choices=("clustered", "uniform"), default="clustered")
    parser.add_argument("--policies", default="all,graph,tenant,none")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs/bench/hnsw_payload.json")
    args = parser.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = set(args.policies) - set(POLICIES)
    if unknown:
        parser.error(f"unknown policies {sorted(unknown)}; choose from {sorted(POLICIES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data = vectors(args.size, args.vectors, np.random.default_rng(args.seed))
    rows = []
    with tempfile.TemporaryDirectory(prefix="orrery-hnsw-") as tmp:
        for policy in args.policies:
            row = measure(policy, data, args.queries, args.seed, Path(tmp))
            print(row, flush=True)
            rows.append(row)
            shutil.rmtree(Path(tmp) / policy, ignore_errors=True)
    write_json(
        args.out,
        {
            "benchmark": "hnsw_payload",
            "date": utc_now(),
            "git": git_facts(),
            "machine": machine_facts(),
            "config": {
                "size": args.size,
                "vectors": args.vectors,
                "queries": args.queries,
                "seed": args.seed,
            },
            "result": rows,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
