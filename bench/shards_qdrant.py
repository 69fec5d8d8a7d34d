"""What the per-copy Qdrant layout costs at the vector adapter (issue 23).

    .venv/bin/python bench/shards_qdrant.py [--documents 10000] [--queries 200]
        [--out docs/bench/shards_qdrant.json]

Starts a private 3-peer Qdrant cluster on loopback (`tests/harness/servers.py`) and
writes one seeded corpus (384-d unit vectors) through the projector's
`QdrantServerVectorIndex` into one collection per shape: N=1 without a replica (Qdrant's
own layout, the baseline), and N = 1, 2, 3, 4 with one replica (one shard key per copy,
`s{shard}c{copy}`). The same query vectors then run through the query side's
`QdrantServerVectorSearch` (limit = the cap, 100), interleaved query by query over every
shape. Reported per shape: write time, latency p50/p95 (ms) and candidate inclusion
against an exact search (|top-cap ∩ exact top-cap| / cap, mean and min). Last, peer 3 is
stopped and the N=3 shape measured again (its copies there are probed once and set aside).
The cluster is stopped and its directory removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import git_facts, latency_summary, machine_facts, utc_now, write_json  # noqa: E402
from contracts.index import IndexDocument, SearchFilter  # noqa: E402
from projector.adapters.qdrant_vectors import QdrantServerVectorIndex  # noqa: E402
from query.adapters.qdrant_vectors import QdrantServerVectorSearch  # noqa: E402
from tests.harness.servers import (  # noqa: E402
    start_qdrant_cluster,
    stop_qdrant_cluster,
    stop_qdrant_peer,
)

DIM = 384
CAP = 100
SHAPES = [(1, 0), (1, 1), (2, 1), (3, 1), (4, 1)]
BATCH = 500


def _name(shards: int, replicas: int) -> str:
    return f"n{shards}r{replicas}"


def corpus(count: int, seed: int) -> list[IndexDocument]:
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((count, DIM)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    at = datetime(2026, 6, 1, tzinfo=UTC)
    return [
        IndexDocument(
            document_id=f"doc-{i:07d}",
            revision=1,
            item_id=f"doc-{i:07d}",
            galaxy="north" if i % 3 else "south",
            ring="",
            status="active",
            updated_at=at,
            vector=tuple(float(x) for x in matrix[i]),
        )
        for i in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "docs/bench/shards_qdrant.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="orrery-bench-qshards-", dir="/tmp"))
    try:
        cluster = start_qdrant_cluster(base, 3, timeout_s=180)
        url = cluster["url"]
        index = QdrantServerVectorIndex(url=url, collection_prefix="bench")
        documents = corpus(args.documents, 23)
        writes: dict[str, float] = {}
        for shards, replicas in SHAPES:
            name = _name(shards, replicas)
            started = time.perf_counter()
            index.create(name, DIM, shards=shards, replicas=replicas)
            for start in range(0, len(documents), BATCH):
                index.apply(name, documents[start : start + BATCH], [])
            writes[name] = round(time.perf_counter() - started, 2)
            print(f"{name}: {len(documents)} written in {writes[name]} s", flush=True)
        from projector.adapters.qdrant_vectors import open_qdrant_client

        search = QdrantServerVectorSearch(open_qdrant_client(url=url), collection_prefix="bench")
        exact = QdrantServerVectorSearch(
            open_qdrant_client(url=url), collection_prefix="bench", exact=True
        )
        queries = [list(v.vector or ()) for v in corpus(args.queries, 99)]
        # The exact top-cap of every query, read once (the baseline's peer may be stopped).
        references = [
            {c.document_id for c in exact.search("n1r0", vector, SearchFilter(), CAP)}
            for vector in queries
        ]

        def measure(shapes: list[tuple[int, int]]) -> dict[str, Any]:
            seconds: dict[str, list[float]] = {_name(*s): [] for s in shapes}
            inclusion: dict[str, list[float]] = {_name(*s): [] for s in shapes}
            for vector, reference in zip(queries, references, strict=True):
                for shape in shapes:
                    name = _name(*shape)
                    started = time.perf_counter()
                    found = search.search(name, vector, SearchFilter(), CAP)
                    seconds[name].append(time.perf_counter() - started)
                    got = {c.document_id for c in found}
                    inclusion[name].append(len(got & reference) / len(reference))
            return {
                name: {
                    "latency_ms": latency_summary(seconds[name]),
                    "inclusion_mean": round(float(np.mean(inclusion[name])), 4),
                    "inclusion_min": round(float(np.min(inclusion[name])), 4),
                }
                for name in seconds
            }

        results = measure(SHAPES)
        for name, figures in results.items():
            lat = figures["latency_ms"]
            print(
                f"{name}: p50 {lat['p50']:.2f} ms p95 {lat['p95']:.2f} ms "
                f"inclusion mean {figures['inclusion_mean']} min {figures['inclusion_min']}",
                flush=True,
            )
        stop_qdrant_peer(base, 3)
        search.search("n3r1", queries[0], SearchFilter(), CAP)  # the one probe
        degraded = measure([(3, 1)])
        lat = degraded["n3r1"]["latency_ms"]
        print(f"n3r1 with peer 3 down: p50 {lat['p50']:.2f} ms p95 {lat['p95']:.2f} ms")
        ratio = results["n3r1"]["latency_ms"]["p95"] / results["n1r0"]["latency_ms"]["p95"]
        print(f"p95 ratio N=3,R=1 / N=1: {ratio:.2f}")
        write_json(
            args.out,
            {
                "bench": "shards_qdrant",
                "at": utc_now(),
                "documents": args.documents,
                "queries": args.queries,
                "dimension": DIM,
                "cap": CAP,
                "peers": 3,
                "write_seconds": writes,
                "results": results,
                "n3r1_peer3_down": degraded["n3r1"],
                "p95_ratio_n3r1_over_n1r0": round(ratio, 3),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "machine": machine_facts(),
                "git": git_facts(),
            },
        )
        print(f"wrote {args.out}")
    finally:
        stop_qdrant_cluster(base)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
