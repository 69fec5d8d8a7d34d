"""What reopening a live shard gives back: the serving process's memory of the points it
wrote, in RSS and PSS, beside the next build's child; and what the reopen costs.

    nice -n 10 .venv/bin/python bench/reopen_memory.py --size 120000 --indexed 0.4 \
        --data-root DIR [--no-reopen] [--max-child-s 240] [--out run.json]

Builds once, kept under `--data-root/<size>-<indexed>/base`, a qdrant-edge generation of
the first `indexed`·size random 384-d points (`bench/optimize_schedule.py`'s payload),
optimized (HNSW) by the adapter's own optimize. Each run copies it and opens the copy with
`QdrantEdgeVectorIndex` (a loaded shard, as the serving process holds after an optimize
swap), then writes the rest of the points in process in 1,000-point `apply` calls: the
points a server wrote since its last swap (at 1M, session 26: 774k copied in by the
catch-up of the third build, then 1,933 s of the last build beside them). Then:

1. `written`: this process's memory (`/proc/self/status` and `smaps_rollup`) after 50
   searches, as the writes left it (no `malloc_trim`: what the server holds then);
2. unless `--no-reopen`: `trimmed` (after `malloc_trim(0)` alone), then `reopened`
   (`QdrantEdgeVectorIndex.reopen`, then the same 50 searches, which must answer exactly
   as before it); meanwhile a thread ticking every 1 ms records the longest gap it saw
   (the GIL held) and another searches without pause and counts wrong or failed answers;
3. the next build (`optimize`) with a `bench/memory.TreeSampler` of this process and its
   child (every 1 s, PSS every 5 s) until the child ends or `--max-child-s` (then the
   index is closed, which kills the child): the tree's peak RSS and PSS, this process's
   part of each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_edge import Query, QueryRequest

from bench.memory import TreeSampler, describe
from bench.optimize_schedule import _docs
from contracts.malloc import trim
from projector.adapters.qdrant_edge_vectors import VECTOR_NAME, QdrantEdgeVectorIndex

_BATCH = 1_000
_SEARCHES = 50


def _memory() -> dict[str, int]:
    """MiB of this process: RSS and PSS, anonymous and file-backed."""
    held: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                held[key] = int(line.split()[1]) // 1024
    with open("/proc/self/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            key = line.split(":", 1)[0]
            if key in ("Pss", "Pss_Anon", "Pss_File"):
                held[key] = int(line.split()[1]) // 1024
    return held


def _build(base: Path, size: int, dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = QdrantEdgeVectorIndex(base)
    index.create("g", dim)
    for start in range(0, size, _BATCH):
        vectors = rng.standard_normal((min(_BATCH, size - start), dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index.apply("g", _docs(vectors, start, rng), [])
    index.optimize("g")
    index.close()


def _requests(dim: int) -> list[QueryRequest]:
    rng = np.random.default_rng(7)
    return [
        QueryRequest(
            query=Query.Nearest(
                rng.standard_normal(dim).astype(np.float32).tolist(), using=VECTOR_NAME
            ),
            limit=10,
            with_payload=False,
        )
        for _ in range(_SEARCHES)
    ]


def _answers(index: QdrantEdgeVectorIndex, requests: list[QueryRequest]) -> list[list[Any]]:
    return [[(p.id, round(p.score, 5)) for p in index.shard_for("g").query(r)] for r in requests]


class _Ticker(threading.Thread):
    """Sleeps 1 ms at a time; the longest gap between two wake-ups (the GIL held)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.longest = 0.0

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now


def run(args: argparse.Namespace) -> dict[str, Any]:
    indexed = int(args.size * args.indexed)
    base = args.data_root / f"{args.size}-{args.indexed}" / "base"
    if not (base.parent / "built").exists():
        shutil.rmtree(base.parent, ignore_errors=True)
        _build(base, indexed, args.dim, args.seed)
        (base.parent / "built").touch()
    root = args.data_root / f"{args.size}-{args.indexed}" / f"run-{args.label}-{os.getpid()}"
    shutil.copytree(base, root)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report: dict[str, Any] = {
        "label": args.label,
        "size": args.size,
        "indexed": indexed,
        "written_in_process": args.size - indexed,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    index = QdrantEdgeVectorIndex(root, reopen_min_points=0)
    try:
        rng = np.random.default_rng(args.seed + 1)
        requests = _requests(args.dim)
        report["loaded"] = _memory()
        started = time.perf_counter()
        for start in range(indexed, args.size, _BATCH):
            count = min(_BATCH, args.size - start)
            vectors = rng.standard_normal((count, args.dim), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            index.apply("g", _docs(vectors, start, rng), [])
        report["write_s"] = round(time.perf_counter() - started, 1)
        before = _answers(index, requests)
        report["written"] = _memory()
        if args.reopen:
            trim()
            report["trimmed"] = _memory()
            ticker, stop, counts = _Ticker(), threading.Event(), {"searches": 0, "wrong": 0}

            def keep_searching() -> None:
                at = 0
                while not stop.is_set():
                    try:
                        got = _answers(index, [requests[at]])[0]
                    except Exception:  # counted: the reopen must fail none
                        got = None
                    counts["searches"] += 1
                    counts["wrong"] += got != before[at]
                    at = (at + 1) % len(requests)

            searcher = threading.Thread(target=keep_searching, daemon=True)
            ticker.start()
            searcher.start()
            time.sleep(0.5)
            started = time.perf_counter()
            reopened = index.reopen("g")
            wall = time.perf_counter() - started
            time.sleep(0.5)
            stop.set()
            ticker.stop.set()
            searcher.join()
            ticker.join()
            report["reopen"] = {
                "done": reopened,
                "wall_s": round(wall, 3),
                "longest_tick_gap_s": round(ticker.longest, 3),
                "searches_during": counts["searches"],
                "searches_wrong_or_failed": counts["wrong"],
            }
            report["answers_unchanged"] = _answers(index, requests) == before
            report["reopened"] = _memory()
        with TreeSampler(os.getpid(), interval_s=1.0, pss_every_s=5.0) as sampler:
            optimizer = threading.Thread(target=_optimize, args=(index,), daemon=True)
            optimizer.start()
            optimizer.join(args.max_child_s)
            stopped = optimizer.is_alive()
            if stopped:
                index.close()
                optimizer.join()
        report["build"] = {"stopped_after_s": args.max_child_s if stopped else None}
        report["tree"] = sampler.report()
        report["tree_line"] = describe(report["tree"])
    finally:
        index.close()
        shutil.rmtree(root, ignore_errors=True)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return report


def _optimize(index: QdrantEdgeVectorIndex) -> None:
    try:
        index.optimize("g")
    except Exception as error:  # closed under it when stopped: reported by the caller
        logging.getLogger(__name__).info("optimize ended: %s", error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=120_000)
    parser.add_argument("--indexed", type=float, default=0.4)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--no-reopen", dest="reopen", action="store_false")
    parser.add_argument("--label", default="run")
    parser.add_argument("--max-child-s", type=float, default=240.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
