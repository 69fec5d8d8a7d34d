"""What an eligibility check of a large embedded generation costs, in process.

    python bench/evidence_check.py --build N --data-dir DIR     # make DIR once
    python bench/evidence_check.py --data-dir DIR [--repeat 3] [--profile] [--out F.json]

`--build N` ingests `N` records of `bench/topk.py`'s corpus (384-d vectors, seed of
`bench/hotpath_ab.py`) into a new data dir through the app in process, streamed (a 1M
corpus is ~5 GB of request bodies: never held at once), and waits for zero lag. Neither
an HNSW build nor a lexical compaction runs (nothing is started but the projector
loop): the check reads what an ingest leaves, tantivy's segments as written.

Then (or on a kept dir) it opens the embedded stack on `DIR` without starting it (no
eligibility gate, optimizer or compactor running beside) and takes `--repeat` evidence
checks of every generation (`GenerationAdmin.check`: what the gate's first check and
each periodic re-check run, flat out), reporting each one's wall time, the process's CPU
and the time in Python's garbage collector. The first check of a generation also loads
its qdrant-edge shard. `--profile` adds cProfile's top functions of the last check.
`--paced SHARE` then takes one more check of each generation paced as the gate's
periodic re-checks are (`DutyCycle(SHARE)`) beside a probe thread that sleeps 1 ms in a
loop: how long it waited for the interpreter past its sleep is the stall a query beside
the re-check would see (the longest, the 99th percentile, how many over 10 ms; session
33).

Figures are reported, never asserted (docs/bench/README.md, session 31).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/evidence_check.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import git_facts, machine_facts, print_report


class _GcClock:
    """Seconds spent in each generation's collections while installed."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = int(info["generation"])
        self.seconds[generation] += time.perf_counter() - self._started
        self.collections[generation] += 1

    def reset(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]


def build(data_dir: Path, size: int) -> dict[str, Any]:
    """`size` records into a new `data_dir`, through the app, until zero lag."""
    from bench.hotpath_ab import SEED, _stack, post_until_applied
    from bench.topk import Vocabulary, corpus_batches

    if data_dir.exists():
        raise SystemExit(f"{data_dir} exists: --build makes a new data dir")
    batches: Iterator[bytes] = corpus_batches(
        size, 2_000, SEED, Vocabulary.build(random.Random(SEED))
    )
    stack = _stack(data_dir, fixed_clock=False)
    stack.loop.start()
    started = time.perf_counter()
    try:
        post_until_applied(stack, batches, size)
    finally:
        stack.close()
    return {"records": size, "seconds": round(time.perf_counter() - started, 1)}


def check(data_dir: Path, repeat: int, profile: bool) -> dict[str, Any]:
    from bench.hotpath_ab import _stack

    clock = _GcClock()
    gc.callbacks.append(clock)
    opened = time.perf_counter()
    stack = _stack(data_dir, fixed_clock=False)
    out: dict[str, Any] = {"open_seconds": round(time.perf_counter() - opened, 2), "checks": []}
    try:
        generations = [g for g, *_ in stack.projector.state.generations()]
        for generation_id in generations:
            for attempt in range(repeat):
                profiler = cProfile.Profile() if profile and attempt == repeat - 1 else None
                clock.reset()
                cpu, wall = time.process_time(), time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                result = stack.admin.check(generation_id)
                if profiler is not None:
                    profiler.disable()
                row: dict[str, Any] = {
                    "generation_id": generation_id,
                    "attempt": attempt,
                    "documents": result.expected_count,
                    "ok": result.ok,
                    "wall_s": round(time.perf_counter() - wall, 3),
                    "cpu_s": round(time.process_time() - cpu, 3),
                    "gc_s": [round(s, 3) for s in clock.seconds],
                    "gc_collections": list(clock.collections),
                }
                if profiler is not None:
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
                    row["profile_top_tottime"] = text.getvalue().splitlines()
                out["checks"].append(row)
                print(
                    f"{generation_id} #{attempt}: {row['documents']:,} documents, "
                    f"ok={row['ok']}, wall {row['wall_s']} s, CPU {row['cpu_s']} s, "
                    f"gc {sum(row['gc_s']):.3f} s",
                    file=sys.stderr,
                )
    finally:
        stack.close()
        gc.callbacks.remove(clock)
    return out


def _probe(stop: Any, waits: list[float]) -> None:
    """Sleep 1 ms until `stop`; append how much longer than that each sleep took."""
    while not stop.is_set():
        started = time.perf_counter()
        time.sleep(0.001)
        waits.append(time.perf_counter() - started - 0.001)


def paced(data_dir: Path, share: float) -> list[dict[str, Any]]:
    """One check of each generation paced at `share`, beside a 1 ms sleeper (above)."""
    import threading

    from bench.hotpath_ab import _stack
    from contracts.pacing import DutyCycle

    stack = _stack(data_dir, fixed_clock=False)
    rows: list[dict[str, Any]] = []
    try:
        for generation_id, *_ in stack.projector.state.generations():
            stack.admin.check(generation_id)  # loads the shard: not what is measured
            waits: list[float] = []
            stop = threading.Event()
            sleeper = threading.Thread(target=_probe, args=(stop, waits), daemon=True)
            sleeper.start()
            pace = DutyCycle(share)
            cpu, wall = time.process_time(), time.perf_counter()
            result = stack.admin.check(generation_id, pace=pace)
            row: dict[str, Any] = {
                "generation_id": generation_id,
                "ok": result.ok,
                "share": share,
                "wall_s": round(time.perf_counter() - wall, 2),
                "cpu_s": round(time.process_time() - cpu, 2),
                "slept_s": round(pace.slept_seconds, 2),
            }
            stop.set()
            sleeper.join()
            ordered = sorted(waits)
            row["probe_stall_ms"] = {
                "n": len(ordered),
                "p99": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
                "max": round(1000 * ordered[-1], 2),
                "over_10ms": sum(1 for w in ordered if w > 0.01),
                "over_10ms_sum_s": round(sum(w for w in ordered if w > 0.01), 2),
            }
            rows.append(row)
            print(f"{generation_id} paced at {share}: {row}", file=sys.stderr)
    finally:
        stack.close()
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--build", type=int, help="first ingest this many records into it")
    parser.add_argument("--repeat", type=int, default=3, help="checks per generation")
    parser.add_argument("--profile", action="store_true", help="cProfile the last check")
    parser.add_argument("--paced", type=float, help="then one check paced at this share")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {
        "benchmark": "evidence_check",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_facts(),
        "machine": machine_facts(),
        "data_dir": str(args.data_dir),
    }
    if args.build:
        report["build"] = build(args.data_dir, args.build)
    report.update(check(args.data_dir, args.repeat, args.profile))
    if args.paced:
        report["paced"] = paced(args.data_dir, args.paced)
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
