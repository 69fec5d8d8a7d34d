"""What a qdrant-edge search's hits cost to read with UUID point ids versus u64 ones.

    .venv/bin/python -m bench.edge_point_ids [--size 20000] [--queries 50] [--rounds 20] \\
        [--limit 101] [--dir DIR] [--out docs/bench/edge-point-ids-session26.json]

Point ids are UUIDs today (`contracts.vector_payload.point_id`); qdrant-edge also takes
unsigned 64-bit integers. qdrant-edge-py builds a new `uuid.UUID` (`uuid.UUID(int=...)`,
in Python) every time `ScoredPoint.id` of a UUID point is read, and a plain `int` for an
integer point. This builds two shards of the same `--size` random 384-d vectors with the
project's shard settings (`QdrantEdgeTuning().edge_config`), one keyed by uuid5 ids and
one by 63-bit integers (`int_point_id`), builds their HNSW (`optimize`), and then,
interleaved per round (alternating which shard goes first), times for `--queries` random
query vectors:

- `query`: `shard.query` of `--limit` nearest points, ids and scores only (as
  `query.adapters.qdrant_edge_vectors` asks a generation that has a point table);
- `read`: reading each hit's `id` and `score` once (what any reader pays);
- `hits`: `PointTable.hits` of those hits (read + table lookups + `Candidate`s): a
  table keyed by `uuid.UUID.int` for the UUID shard, by the id itself
  (`integer_ids=True`, since session 27) for the integer one.

Reported: p50/p95 per query of each, per side, and the differences. The engine call
itself should not differ (the id is only mapped at the end); the read should. Figures
are reported, never asserted; the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median, quantiles
from typing import Any

import numpy as np
from qdrant_edge import EdgeShard, Point, Query, QueryRequest, SearchParams, UpdateOperation

from bench.common import git_facts, machine_facts, utc_now, write_json
from contracts.point_ids import int_point_id
from contracts.point_table import PointTable
from contracts.vector_payload import VECTOR_NAME
from projector.adapters.qdrant_edge_vectors import QdrantEdgeTuning

DIMENSION = 384
SEED = 20_261_206


def _int_id(i: int) -> int:
    """The integer point id of document `doc-{i}` (`contracts.point_ids.int_point_id`)."""
    return int_point_id(f"doc-{i}")


def _uuid_id(i: int) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_OID, str(i))


def _key(pid: uuid.UUID | int) -> int:
    """The point table's key of a point id (`uuid.UUID.int` for a UUID, as the adapter)."""
    return pid.int if isinstance(pid, uuid.UUID) else pid


def _payload(i: int) -> dict[str, Any]:
    return {
        "document_id": f"doc-{i}",
        "revision": 1,
        "updated_at": "2026-01-15T00:00:00.000000Z",
        "status": "active",
    }


def _build(path: Path, vectors: np.ndarray, ids: list[Any]) -> EdgeShard:
    shutil.rmtree(path, ignore_errors=True)
    shard = EdgeShard.create(str(path), QdrantEdgeTuning().edge_config(DIMENSION))
    for start in range(0, len(ids), 1000):
        points = [
            Point(ids[i], {VECTOR_NAME: vectors[i].tolist()}, _payload(i))
            for i in range(start, min(len(ids), start + 1000))
        ]
        shard.update(UpdateOperation.upsert_points(points))
    shard.optimize()
    return shard


def _summary(values: list[int]) -> dict[str, float]:
    cuts = quantiles(values, n=20)
    return {"p50_us": round(median(values) / 1e3, 2), "p95_us": round(cuts[18] / 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--limit", type=int, default=101)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rng = np.random.default_rng(SEED)
    vectors = rng.standard_normal((args.size, DIMENSION)).astype(np.float32)
    base = Path(tempfile.mkdtemp(prefix="edge-point-ids-", dir=args.dir))
    sides: dict[str, tuple[EdgeShard, PointTable]] = {}
    try:
        for side in ("uuid", "int"):
            ids: list[Any] = [
                (_uuid_id if side == "uuid" else _int_id)(i) for i in range(args.size)
            ]
            started = time.perf_counter()
            shard = _build(base / side, vectors, ids)
            print(f"{side}: built {args.size} points in {time.perf_counter() - started:.1f} s")
            table = PointTable(integer_ids=side == "int")
            with table.writing():
                table.put((_key(pid), _payload(i)) for i, pid in enumerate(ids))
            sides[side] = (shard, table)
        queries = [
            rng.standard_normal(DIMENSION).astype(np.float32).tolist() for _ in range(args.queries)
        ]
        times: dict[str, dict[str, list[int]]] = {
            side: {"query": [], "read": [], "hits": []} for side in sides
        }
        answers_equal = True
        for round_ in range(args.rounds):
            order = ("uuid", "int") if round_ % 2 else ("int", "uuid")
            for side in order:
                shard, table = sides[side]
                for vector in queries:
                    request = QueryRequest(
                        limit=args.limit,
                        query=Query.Nearest(vector, using=VECTOR_NAME),
                        with_payload=False,
                        with_vector=False,
                        params=SearchParams(hnsw_ef=max(128, args.limit)),
                    )
                    t0 = time.perf_counter_ns()
                    points = shard.query(request)
                    t1 = time.perf_counter_ns()
                    read = [(p.id, p.score) for p in points]
                    t2 = time.perf_counter_ns()
                    stamp = table.stamp()
                    assert stamp is not None
                    found = table.hits(points, stamp)
                    t3 = time.perf_counter_ns()
                    if found is None or len(found) != len(read):
                        answers_equal = False
                    times[side]["query"].append(t1 - t0)
                    times[side]["read"].append(t2 - t1)
                    times[side]["hits"].append(t3 - t2)
        summary = {
            side: {k: _summary(v) for k, v in parts.items()} for side, parts in times.items()
        }
        saved = {
            part: round(summary["uuid"][part]["p50_us"] - summary["int"][part]["p50_us"], 2)
            for part in ("query", "read", "hits")
        }
        report = {
            "bench": "edge_point_ids",
            "at": utc_now(),
            "git": git_facts(),
            "machine": machine_facts(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "size": args.size,
            "queries": args.queries,
            "rounds": args.rounds,
            "limit": args.limit,
            "every_hit_found": answers_equal,
            "per_query": summary,
            "uuid_minus_int_p50_us": saved,
        }
        for side, parts in summary.items():
            print(side, parts)
        print("uuid - int, p50 us:", saved, "load", load_before, "->", report["load_after"])
        if args.out is not None:
            write_json(args.out, report)
    finally:
        for shard, _ in sides.values():
            shard.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
