"""Embedded ingest A/B: the same corpus POSTed into `orrery serve` of two source trees,
alternating, on fresh data dirs: end-to-end records/s (POST -> searchable), POST-only
records/s, freshness lag per POST, and the server's CPU per record (robust to a busy
machine, unlike the rates), also per thread: the projector's and the POST handling's
(`/proc` per thread, named by `py-spy dump`).

    python bench/ingest_ab.py --baseline /path/to/other/tree [--size 20000] [--rounds 2]
        [--modes commit,searchable]

Each run starts `orrery serve` with `PYTHONPATH=<tree>` and the working directory in
that tree (`python -m` imports the tree's code), POSTs the corpus of `bench/topk.py`
(384-d vectors, `--batch-size` records a POST) and waits until the projector applied
everything. `commit` POSTs answer on commit (paced by the projector's backlog where the
tree has the bound); `searchable` POSTs ask `?wait=searchable` (this tree only).
Writes `docs/bench/ingest_ab.json`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    git_facts,
    ingest_env,
    machine_facts,
    start_serve,
    utc_now,
    write_json,
)
from bench.topk import SpooledCorpus, Vocabulary, corpus_batches, ingest

console = Console(stderr=True)


def one_run(tree: Path, mode: str, corpus: SpooledCorpus, size: int, batch: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="orrery-ingest-ab-"))
    env = {**ingest_env(batch), "PYTHONPATH": str(tree)}
    load_before = os.getloadavg()
    server = start_serve(root / "data", root / "serve.log", env, tree=tree)
    try:
        names = server.thread_names()
        threads_before = server.thread_cpu_seconds()
        cpu_before = server.cpu_seconds()
        workers_before = server.worker_cpu_seconds()
        with server.client(timeout_s=120.0) as client:
            result = ingest(server, client, corpus, size, None if mode == "commit" else mode)
        cpu = server.cpu_seconds() - cpu_before
        workers = server.worker_cpu_seconds() - workers_before
        threads_after = server.thread_cpu_seconds()
        names.update(server.thread_names())
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    lag = result["freshness"].get("lag_ms", {})
    return {
        "tree": str(tree),
        "mode": mode,
        "records_per_s": result["records_per_s"],
        "post_records_per_s": result["post_records_per_s"],
        "ready_seconds": result["ready_seconds"],
        "freshness_lag_ms": {k: lag.get(k) for k in ("p50", "p95", "max")},
        "answered_before_searchable": result.get("answered_before_searchable"),
        "server_cpu_us_per_record": round(cpu / size * 1e6, 1),
        # The write workers' processes (ORRERY_INGEST_WORKERS), not counted above.
        "write_workers_cpu_us_per_record": round(workers / size * 1e6, 1),
        # Per Python thread name: `orrery-projector` is the projector, `AnyIO worker
        # thread` the POST handling off the event loop (parse, admission, store write),
        # `MainThread` the event loop (HTTP, readiness polls); `?` native threads
        # (engines) and threads that ended are left out of the named figures.
        "server_cpu_us_per_record_by_thread": _by_thread(
            names, threads_before, threads_after, size
        ),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _by_thread(
    names: dict[int, str], before: dict[int, float], after: dict[int, float], size: int
) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid, "?")
        seconds[name] = seconds.get(name, 0.0) + cpu - before.get(tid, 0.0)
    return {name: round(s / size * 1e6, 1) for name, s in sorted(seconds.items())}


def print_table(runs: list[dict[str, Any]]) -> None:
    table = Table(title="embedded ingest A/B (POST -> searchable)")
    for column in (
        "tree",
        "mode",
        "rec/s",
        "POST rec/s",
        "lag p50 ms",
        "lag p95 ms",
        "CPU us/rec",
        "projector",
        "POST",
        "workers",
        "load",
    ):
        table.add_column(column)
    for run in runs:
        lag = run["freshness_lag_ms"]
        table.add_row(
            Path(run["tree"]).name,
            run["mode"],
            f"{run['records_per_s']:,.0f}",
            f"{run['post_records_per_s']:,.0f}",
            "-" if lag["p50"] is None else f"{lag['p50']:,.0f}",
            "-" if lag["p95"] is None else f"{lag['p95']:,.0f}",
            f"{run['server_cpu_us_per_record']:,.0f}",
            _thread_cell(run, "orrery-projector"),
            _thread_cell(run, "AnyIO worker thread"),
            f"{run.get('write_workers_cpu_us_per_record', 0.0):,.0f}",
            f"{run['load_before'][0]:.1f}",
        )
    console.print(table)


def _thread_cell(run: dict[str, Any], name: str) -> str:
    value = run.get("server_cpu_us_per_record_by_thread", {}).get(name)
    return "-" if value is None else f"{value:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other source tree")
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument("--modes", default="commit,searchable")
    parser.add_argument("--seed", type=int, default=20_260_101)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "ingest_ab.json")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    trees = [REPO_ROOT, args.baseline.resolve()]
    started = utc_now()
    vocab = Vocabulary.build(random.Random(args.seed))
    corpus = SpooledCorpus(corpus_batches(args.size, args.batch_size, args.seed, vocab))
    runs: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for mode in modes:
                for tree in trees if round_ % 2 == 0 else trees[::-1]:
                    if mode != "commit" and tree != REPO_ROOT:
                        continue  # the baseline may not know the parameter (ignored)
                    console.rule(f"round {round_ + 1}: {tree.name} ({mode})")
                    try:
                        runs.append(one_run(tree, mode, corpus, args.size, args.batch_size))
                    except RuntimeError as error:  # e.g. a tree without ?wait=searchable
                        console.print(f"[red]{tree.name} ({mode}) failed: {error}")
    finally:
        corpus.close()
    report = {
        "benchmark": "ingest_ab",
        "date": started,
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "size": args.size,
            "rounds": args.rounds,
            "batch_size": args.batch_size,
            "modes": modes,
            "seed": args.seed,
            "trees": [str(t) for t in trees],
        },
        "runs": runs,
    }
    write_json(args.out, report)
    print_table(runs)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
