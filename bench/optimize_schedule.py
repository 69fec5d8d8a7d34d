"""What the background optimizer's schedule costs an ingest: builds, time to HNSW, memory.

    nice -n 19 .venv/bin/python bench/optimize_schedule.py --size 100000 [--share 0.5]
        [--module path/to/qdrant_edge_vectors.py] [--label base] [--out run.json]

Writes `--size` random 384-d points (payload as `bench/optimize_swap.py`) into one
generation of `QdrantEdgeVectorIndex` as fast as one writer thread can (or at `--rate`
records a second, as an HTTP ingest's projector batches arrive), in batches of
`--batch`, while the adapter's background optimizer runs (`--interval` 1 s, `--growth`,
`--share`, as `orrery serve` runs it). A prober searches every 0.2 s (latency) and, every
2 s, compares the top 10 with the exact top 10 over what was written (numpy), holding the
writer off meanwhile so both see the same points (recall@10 during the ingest). After the
last write it waits until no build runs or is due (fewer unindexed points than the
indexing threshold stay unindexed, searched exactly).

Reported: the ingest's seconds, the seconds from the last write to fully indexed (the
tail) and from the first write (the build time), each build's log line (its phases and
the points it replayed), the CPU seconds of this process and of the optimizer children
(`RUSAGE_CHILDREN`: the build work, robust to the machine's load, unlike wall times),
the peak RSS of each, search p50/p95 and recall@10 during the ingest, and the load
average. `--module` runs another revision of the adapter (`git show <rev>:projector/
adapters/qdrant_edge_vectors.py > base.py`) for a paired A/B: run both at the same time
so they share the machine's load.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import resource
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/optimize_schedule.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench.common import edge_adapter
from contracts.index import IndexDocument, SearchFilter
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch

_UPDATED = datetime(2026, 3, 19, 12, 0, tzinfo=UTC)
_PROBE_S = 0.2
_RECALL_EVERY_S = 2.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "optimiz" in message and not message.startswith("optimize phase"):
            self.lines.append((time.perf_counter(), message))


def _docs(vectors: np.ndarray, start: int, rng: np.random.Generator) -> list[IndexDocument]:
    galaxies = rng.integers(0, 8, len(vectors))
    kinds = rng.integers(0, 5, len(vectors))
    return [
        IndexDocument(
            document_id=f"d{start + i:08d}",
            revision=1,
            item_id=f"item:d{start + i:08d}",
            galaxy=f"t{galaxies[i]}",
            ring="",
            status="active",
            updated_at=_UPDATED,
            facets={"kind": (f"k{kinds[i]}",)},
            vector=tuple(float(x) for x in vector),
        )
        for i, vector in enumerate(vectors)
    ]


def _pct(values: list[float], q: float) -> float | None:
    return None if not values else round(float(np.percentile(values, q)) * 1000, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    module = edge_adapter(args.module)
    lines = _Lines()
    logging.getLogger(module.__name__).addHandler(lines)
    logging.getLogger(module.__name__).setLevel(logging.INFO)
    rng = np.random.default_rng(args.seed)
    vectors = rng.standard_normal((args.size, args.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((64, args.dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    written = 0
    gate = threading.Lock()  # the recall probe holds the writer off
    stop = threading.Event()
    latencies: list[float] = []
    recalls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="optimize-schedule-", dir=args.tmp) as root:
        index = module.QdrantEdgeVectorIndex(Path(root) / "edge")
        index.create("g", args.dim)
        search = QdrantEdgeVectorSearch(index.shard_for)
        kwargs: dict[str, Any] = {"growth": args.growth}
        if "share" in inspect.signature(index.start_background_optimizer).parameters:
            kwargs["share"] = args.share
        index.start_background_optimizer(args.interval, **kwargs)

        def probe() -> None:
            next_recall = time.perf_counter() + _RECALL_EVERY_S
            i = 0
            while not stop.wait(_PROBE_S):
                query = queries[i % len(queries)]
                i += 1
                if written == 0:
                    continue
                check = time.perf_counter() >= next_recall
                with gate if check else _Nothing():
                    at = time.perf_counter()
                    hits = search.search("g", tuple(float(x) for x in query), SearchFilter(), 10)
                    latencies.append(time.perf_counter() - at)
                    if check:
                        seen = vectors[:written]
                        exact = np.argsort(-(seen @ query))[:10]
                        want = {f"d{j:08d}" for j in exact}
                        got = {hit.document_id for hit in hits}
                        recalls.append(len(want & got) / len(want))
                        next_recall = time.perf_counter() + _RECALL_EVERY_S

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        started = time.perf_counter()
        for start in range(0, args.size, args.batch):
            if args.rate:  # a batch every batch / rate s, as the projector's arrive
                time.sleep(max(0.0, started + start / args.rate - time.perf_counter()))
            docs = _docs(vectors[start : start + args.batch], start, rng)
            with gate:
                index.apply("g", docs, [])
                written = start + len(docs)
        ingested = time.perf_counter()
        stop.set()
        prober.join()
        builds_during_ingest = len(lines.lines)
        # Done once no build runs or is due (qdrant-edge leaves fewer unindexed vectors
        # than its indexing threshold unindexed, searched exactly) for 3 rounds.
        deadline = ingested + args.wait
        idle_since: float | None = None
        while time.perf_counter() < deadline:
            if _building(index) or index.optimize_needed("g", growth=0.0):
                idle_since = None
            elif idle_since is None:
                idle_since = time.perf_counter()
            elif time.perf_counter() - idle_since >= 3 * args.interval:
                break
            time.sleep(0.2)
        done = idle_since if idle_since is not None else time.perf_counter()
        unindexed = index.unindexed_count("g")
        self_usage = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        index.close()
    return {
        "label": args.label,
        "module": args.module or "projector/adapters/qdrant_edge_vectors.py",
        "size": args.size,
        "config": {
            "batch": args.batch,
            "rate": args.rate,
            "interval_s": args.interval,
            "growth": args.growth,
            "share": kwargs.get("share"),
        },
        "ingest_s": round(ingested - started, 1),
        "records_per_s": round(args.size / (ingested - started), 1),
        "tail_s": round(done - ingested, 1),
        "build_s": round(done - started, 1),
        "unindexed_at_end": unindexed,
        "builds": len(lines.lines),
        "builds_during_ingest": builds_during_ingest,
        "build_log": [
            {"ended_s": round(at - started, 1), "line": line} for at, line in lines.lines
        ],
        "cpu_s": {
            "process": round(self_usage.ru_utime + self_usage.ru_stime, 1),
            "optimizer_children": round(children.ru_utime + children.ru_stime, 1),
        },
        "peak_rss_kb": {"process": self_usage.ru_maxrss, "children": children.ru_maxrss},
        "search_during_ingest": {
            "probes": len(latencies),
            "p50_ms": _pct(latencies, 50),
            "p95_ms": _pct(latencies, 95),
            "recall_at_10_checks": len(recalls),
            "recall_at_10_mean": None if not recalls else round(float(np.mean(recalls)), 4),
            "recall_at_10_min": None if not recalls else round(min(recalls), 4),
        },
        "loadavg_end": list(os.getloadavg()),
    }


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _building(index: Any) -> bool:
    """Whether an optimize holds a generation's lock (a build or its catch-up runs)."""
    generations = getattr(index, "_generations", {})
    return any(g.optimize_lock.locked() for g in generations.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--rate", type=float, default=0.0, help="records/s at most (0: flat out)")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--growth", type=float, default=0.25)
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wait", type=float, default=3_600.0, help="max s for the tail")
    parser.add_argument("--module")
    parser.add_argument("--label", default="")
    parser.add_argument("--tmp", default=None, help="parent of the temp data dir")
    parser.add_argument("--out")
    args = parser.parse_args()
    result = {
        "benchmark": "optimize_schedule",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_start": list(os.getloadavg()),
        **run(args),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    summary = {k: result[k] for k in ("label", "ingest_s", "tail_s", "build_s", "builds")}
    print(json.dumps({**summary, "cpu_s": result["cpu_s"], "peak": result["peak_rss_kb"]}))


if __name__ == "__main__":
    main()
