"""What one qdrant-edge optimize costs the process serving searches and writes.

    nice -n 10 .venv/bin/python bench/optimize_swap.py [--size 20000] [--dim 384]
        [--module path/to/qdrant_edge_vectors.py] [--label after]
        [--out docs/bench/optimize_swap-session17.json]

Loads `--size` points into one generation of `QdrantEdgeVectorIndex`, then optimizes it
(`optimize`: copy, child build, catch-up, swap) while three threads run in the same
process: searches one after another (1 ms apart), writes (`apply` of 200 new points and
20 rewritten ones, 20 ms apart) and a 1 ms heartbeat. Reported: the optimizer's own log
line (its phases, `writes_blocked`, `searches paused`), the longest gap between two
completed searches and between two heartbeats (a stall of the whole interpreter: a
qdrant-edge call holds the GIL), the slowest `apply`, and whether the generation holds
exactly what was written afterwards (every write acknowledged during the optimize).

Memory: the process's peak RSS during the optimize (`VmHWM`, reset through
`/proc/self/clear_refs` just before it; anonymous and file-backed pages sampled every
20 ms, `rss_samples`, with the phase ends beside them), its RSS before, and the optimizer
child's peak (`ru_maxrss` of the waited-for children). `--preoptimize` optimizes once
before the measured run and writes `--extra` more points, so the measured swap replaces
an HNSW-indexed shard, as the later swaps of a large ingest do.

`--module` runs the same load against another revision of the adapter (a file from
`git show <rev>:projector/adapters/qdrant_edge_vectors.py`) for a paired A/B run. Wall
times depend on the machine's load: record `cat /proc/loadavg` beside them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import resource
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run as `python bench/optimize_swap.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import edge_adapter
from contracts.index import IndexDocument, SearchFilter
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch

_UPDATED = datetime(2026, 3, 19, 12, 0, tzinfo=UTC)


class _Corpus:
    """Random unit vectors and the documents written so far (one writer thread)."""

    def __init__(self, dim: int, seed: int) -> None:
        self._dim = dim
        self._rng = random.Random(seed)
        self._next = 0
        self.docs: dict[str, IndexDocument] = {}

    def vector(self) -> tuple[float, ...]:
        values = [self._rng.gauss(0.0, 1.0) for _ in range(self._dim)]
        norm = sum(v * v for v in values) ** 0.5
        return tuple(v / norm for v in values)

    def new(self, count: int) -> list[IndexDocument]:
        out = []
        for _ in range(count):
            self._next += 1
            out.append(self._doc(f"d{self._next:08d}", 1))
        return out

    def rewrites(self, count: int) -> list[IndexDocument]:
        ids = self._rng.sample(sorted(self.docs), count)
        return [self._doc(i, self.docs[i].revision + 1) for i in ids]

    def keep(self, docs: list[IndexDocument]) -> None:
        for document in docs:
            self.docs[document.document_id] = document

    def _doc(self, document_id: str, revision: int) -> IndexDocument:
        return IndexDocument(
            document_id=document_id,
            revision=revision,
            item_id=f"item:{document_id}",
            galaxy=f"t{self._rng.randrange(8)}",
            ring="",
            status="active",
            updated_at=_UPDATED,
            facets={"kind": (f"k{self._rng.randrange(5)}",)},
            vector=self.vector(),
        )


class _OptimizeLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

        # (perf_counter at emit, message) of each phase's end (the adapter's debug lines).
        self.phases: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("optimize phase"):
            self.phases.append((time.perf_counter(), message.removeprefix("optimize phase ")))
        elif "optimiz" in message:
            self.lines.append(message)


def _memory_kb() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of this process, in KiB."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); whether it worked."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _children_peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def run(
    size: int,
    dim: int,
    module: ModuleType,
    seed: int,
    *,
    preoptimize: bool = False,
    extra: int = 0,
) -> dict[str, Any]:
    lines = _OptimizeLines()
    logging.getLogger(module.__name__).addHandler(lines)
    logging.getLogger(module.__name__).setLevel(logging.DEBUG)
    corpus = _Corpus(dim, seed)
    with tempfile.TemporaryDirectory(prefix="optimize-swap-") as root:
        index = module.QdrantEdgeVectorIndex(Path(root) / "edge")
        try:
            index.create("g", dim)
            started = time.perf_counter()
            for start in range(0, size, 1_000):
                docs = corpus.new(min(1_000, size - start))
                index.apply("g", docs, [])
                corpus.keep(docs)
            pre: dict[str, Any] = {}
            if preoptimize:
                pre_started = time.perf_counter()
                pre["changed"] = index.optimize("g")
                pre["seconds"] = round(time.perf_counter() - pre_started, 1)
                pre["child_peak_rss_kb"] = _children_peak_kb()
                for start in range(0, extra, 1_000):
                    docs = corpus.new(min(1_000, extra - start))
                    index.apply("g", docs, [])
                    corpus.keep(docs)
                lines.lines.clear()
                lines.phases.clear()
            load_s = time.perf_counter() - started
            search = QdrantEdgeVectorSearch(index.shard_for)
            queries = [corpus.vector() for _ in range(50)]
            stop = threading.Event()
            errors: list[str] = []
            searched: list[tuple[float, float]] = []
            applied: list[tuple[float, float]] = []
            beats: list[tuple[float, float]] = []

            def keep_searching() -> None:
                for query in itertools.cycle(queries):
                    if stop.is_set():
                        return
                    at = time.perf_counter()
                    try:
                        search.search("g", query, SearchFilter(), 10)
                    except Exception as error:  # a failed search is a figure too
                        errors.append(f"search: {error}")
                    searched.append((at, time.perf_counter()))
                    time.sleep(0.001)

            def keep_writing() -> None:
                while not stop.is_set():
                    docs = corpus.new(200) + corpus.rewrites(20)
                    at = time.perf_counter()
                    try:
                        index.apply("g", docs, [])
                    except Exception as error:
                        errors.append(f"apply: {error}")
                        return
                    corpus.keep(docs)
                    applied.append((at, time.perf_counter()))
                    time.sleep(0.02)

            rss_samples: list[tuple[float, dict[str, int]]] = []

            def sample_memory() -> None:
                while not stop.is_set():
                    rss_samples.append((time.perf_counter(), _memory_kb()))
                    time.sleep(0.02)

            def heartbeat() -> None:
                last = time.perf_counter()
                while not stop.is_set():
                    time.sleep(0.001)
                    now = time.perf_counter()
                    beats.append((last, now))
                    last = now

            workers = [
                threading.Thread(target=f)
                for f in (keep_searching, keep_writing, heartbeat, sample_memory)
            ]
            for worker in workers:
                worker.start()
            time.sleep(1.0)
            memory_before = _memory_kb()
            peak_reset = _reset_peak()
            children_before = _children_peak_kb()
            began = time.perf_counter()
            try:
                changed = index.optimize("g")
            finally:
                ended = time.perf_counter()
                memory_after = _memory_kb()
                time.sleep(0.5)
                stop.set()
                for worker in workers:
                    worker.join()

            def during(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
                return [(a, b) for a, b in spans if began <= b and a <= ended]

            done = [b for _, b in during(searched)]
            held = [b - a for a, b in during(applied)]
            lat = sorted(b - a for a, b in during(searched))
            exact = index.evidence("g").document_count == len(corpus.docs)
            gaps = sorted(((b - a, a) for a, b in during(beats)), reverse=True)[:3]
            # Searches from the child's end to the optimize's end: the old shard serves
            # them while the copy loads and catches up, then the copy does.
            child_end = next(
                (at for at, phase in lines.phases if phase.startswith("child ")), ended
            )
            swap_lat = sorted(b - a for a, b in searched if child_end <= a and b <= ended)
            return {
                "size": size,
                "dim": dim,
                "load_s": round(load_s, 1),
                "optimize_s": round(ended - began, 2),
                "changed": changed,
                "optimizer_log": lines.lines,
                "searches_during": len(lat),
                "search_p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
                "search_max_ms": round(lat[-1] * 1000, 1) if lat else None,
                "searches_after_child": {
                    "n": len(swap_lat),
                    "p50_ms": round(swap_lat[len(swap_lat) // 2] * 1000, 2) if swap_lat else None,
                    "p95_ms": (
                        round(swap_lat[int(len(swap_lat) * 0.95)] * 1000, 2) if swap_lat else None
                    ),
                    "max_ms": round(swap_lat[-1] * 1000, 1) if swap_lat else None,
                },
                "search_stall_max_ms": round(
                    max((b - a for a, b in itertools.pairwise(done)), default=0.0) * 1000, 1
                ),
                "heartbeat_max_gap_ms": round(
                    max((b - a for a, b in during(beats)), default=0.0) * 1000, 1
                ),
                # The longest heartbeat gaps, from their start (s after the optimize
                # began), beside the end of each optimizer phase: which call stalled.
                "longest_gaps": [
                    {"at_s": round(a - began, 3), "ms": round(gap * 1000, 1)} for gap, a in gaps
                ],
                "phase_ends": [
                    {"at_s": round(at - began, 3), "phase": phase} for at, phase in lines.phases
                ],
                "applies_during": len(held),
                "apply_max_ms": round(max(held, default=0.0) * 1000, 1),
                "documents": len(corpus.docs),
                "evidence_matches": exact,
                "errors": errors[:5],
                "preoptimize": pre or None,
                "memory_kb_before": memory_before,
                "memory_kb_after": memory_after,
                "peak_rss_kb_during": memory_after["VmHWM"] if peak_reset else None,
                "peak_rss_over_before_kb": (
                    memory_after["VmHWM"] - memory_before["VmRSS"] if peak_reset else None
                ),
                # ru_maxrss is the largest child so far: a figure of this optimize's child
                # only if it outgrew every earlier one (`preoptimize`'s is reported there).
                "optimizer_child_peak_rss_kb": _children_peak_kb(),
                "children_peak_rss_kb_before": children_before,
                "rss_samples": [
                    {"at_s": round(at - began, 2), **kb}
                    for at, kb in rss_samples[::5]
                    if began - 0.5 <= at <= ended + 0.5
                ],
            }
        finally:
            index.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--module", default=None)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--preoptimize", action="store_true")
    parser.add_argument("--extra", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = run(
        args.size,
        args.dim,
        edge_adapter(args.module),
        args.seed,
        preoptimize=args.preoptimize,
        extra=args.extra,
    )
    figures["label"] = args.label
    figures["loadavg"] = Path("/proc/loadavg").read_text().strip()
    figures["nice"] = os.nice(0)
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        runs = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*runs, figures], indent=2) + "\n")


if __name__ == "__main__":
    main()
