"""Whether rewrites of already-indexed points bring the background optimizer back.

    nice -n 10 .venv/bin/python bench/churn.py [--size 40000] [--dim 384] [--share 0.3]
        [--module path/to/qdrant_edge_vectors.py] [--out docs/bench/churn-session22.json]

Loads `--size` random unit vectors into one generation of
`QdrantEdgeVectorIndex`, builds its HNSW (`optimize`), then writes `--share` of the
points again with new vectors (new revisions). qdrant-edge keeps the old vectors in the
HNSW segment as tombstones and still counts them in `indexed_vectors_count`; the new ones
sit in the plain segment, brute-forced by every search. Reported: what the adapter counts
as unindexed and whether `optimize_needed` (the background optimizer's test, with its
defaults) asks for a build; search latency (top 10, `QdrantEdgeVectorSearch`, 200
queries) after the build, after the churn, and after a second build if one was asked for
(with recall@10 against exact search at each step).

`--module` runs the same steps against another revision of the adapter (a file from
`git show <rev>:projector/adapters/qdrant_edge_vectors.py`), for an A/B. Wall times
depend on the machine's load: `cat /proc/loadavg` is recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/churn.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench.common import edge_adapter, git_facts, latency_summary, machine_facts, write_json
from contracts.index import IndexDocument, SearchFilter
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch

_UPDATED = datetime(2026, 3, 19, 12, 0, tzinfo=UTC)
_BATCH = 2_000


def _unit(rng: np.random.Generator, count: int, dim: int) -> np.ndarray[Any, Any]:
    matrix = rng.standard_normal((count, dim)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


def _docs(vectors: np.ndarray[Any, Any], ids: np.ndarray[Any, Any], revision: int) -> list[Any]:
    return [
        IndexDocument(
            document_id=f"d{int(i):08d}",
            revision=revision,
            item_id=f"i{int(i)}",
            galaxy="g",
            ring="r",
            status="active",
            updated_at=_UPDATED,
            vector=tuple(float(x) for x in row),
        )
        for i, row in zip(ids, vectors, strict=True)
    ]


def _searches(
    search: QdrantEdgeVectorSearch,
    queries: np.ndarray[Any, Any],
    matrix: np.ndarray[Any, Any],
) -> dict[str, Any]:
    seconds: list[float] = []
    found = 0
    exact = np.argsort(-(matrix @ queries.T), axis=0)[:10].T
    for query, truth in zip(queries, exact, strict=True):
        started = time.perf_counter()
        hits = search.search("g", query.tolist(), SearchFilter(), 10)
        seconds.append(time.perf_counter() - started)
        found += len({int(h.document_id[1:]) for h in hits} & set(truth.tolist()))
    return {"latency_ms": latency_summary(seconds), "recall@10": found / (10 * len(queries))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--share", type=float, default=0.3, help="share of points rewritten")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--module", default=None, help="another qdrant_edge_vectors.py")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    module = edge_adapter(args.module)
    rng = np.random.default_rng(args.seed)
    matrix = _unit(rng, args.size, args.dim)
    queries = _unit(rng, args.queries, args.dim)
    ids = np.arange(args.size)
    steps: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="orrery-churn-") as root:
        index = module.QdrantEdgeVectorIndex(Path(root) / "edge")
        try:
            index.create("g", args.dim)
            for start in range(0, args.size, _BATCH):
                part = slice(start, start + _BATCH)
                index.apply("g", _docs(matrix[part], ids[part], 1), [])
            index.optimize("g")
            search = QdrantEdgeVectorSearch(index.shard_for)
            steps["built"] = _searches(search, queries, matrix)
            steps["built"]["unindexed"] = index.unindexed_count("g")

            churned = rng.choice(args.size, int(args.size * args.share), replace=False)
            matrix[churned] = _unit(rng, len(churned), args.dim)
            for start in range(0, len(churned), _BATCH):
                rows = churned[start : start + _BATCH]
                index.apply("g", _docs(matrix[rows], rows, 2), [])
            info = index.shard_for("g").info()
            steps["churned"] = _searches(search, queries, matrix)
            steps["churned"].update(
                rewritten=len(churned),
                engine_indexed_vectors=info.indexed_vectors_count,
                engine_points=info.points_count,
                unindexed=index.unindexed_count("g"),
                optimize_needed=index.optimize_needed("g"),
            )
            if steps["churned"]["optimize_needed"]:
                started = time.perf_counter()
                index.optimize("g")
                steps["rebuilt"] = _searches(search, queries, matrix)
                steps["rebuilt"]["optimize_s"] = round(time.perf_counter() - started, 2)
                steps["rebuilt"]["unindexed"] = index.unindexed_count("g")
        finally:
            index.close()
    out = {
        "benchmark": "churn",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_facts(),
        "machine": machine_facts(),
        "module": args.module or "this tree",
        "config": {"size": args.size, "dim": args.dim, "share": args.share, "seed": args.seed},
        "loadavg": Path("/proc/loadavg").read_text().strip(),
        "steps": steps,
    }
    print(json.dumps(out["steps"], indent=1))
    if args.out:
        write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
