"""Embedded ingest A/B: the same corpus POSTed into `orrery serve` of two source trees,
alternating, on fresh data dirs: end-to-end records/s (POST -> searchable), POST-only
records/s, freshness lag per POST, and the server's CPU per record (robust to a busy
machine, unlike the rates), also per thread: the projector's and the POST handling's
(`/proc` per thread, named by `py-spy dump`).

    python bench/ingest_ab.py --baseline /path/to/other/tree [--size 20000] [--rounds 2]
        [--modes commit,searchable] [--env ORRERY_X=1] [--baseline-env ORRERY_X=2]
        [--py-spy DIR]

`--env`/`--baseline-env` set a server setting of one side (with `--baseline .` an A/B
of settings on one tree); `--py-spy DIR` samples each server's GIL-held stacks during
its ingest.

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
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
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
    py_spy_path,
    start_serve,
    utc_now,
    write_json,
)
from bench.topk import SpooledCorpus, Vocabulary, corpus_batches, ingest

console = Console(stderr=True)


def one_run(
    tree: Path,
    mode: str,
    corpus: SpooledCorpus,
    size: int,
    batch: int,
    settings: Mapping[str, str],
    py_spy: Path | None = None,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="orrery-ingest-ab-"))
    env = {**ingest_env(batch), **settings, "PYTHONPATH": str(tree)}
    load_before = os.getloadavg()
    server = start_serve(root / "data", root / "serve.log", env, tree=tree)
    spy: subprocess.Popen[bytes] | None = None
    try:
        names = server.thread_names()
        threads_before = server.thread_cpu_seconds()
        cpu_before = server.cpu_seconds()
        workers_before = server.worker_cpu_seconds()
        if py_spy is not None:
            spy = _start_py_spy(server.pid, py_spy)
        with server.client(timeout_s=120.0) as client:
            result = ingest(server, client, corpus, size, None if mode == "commit" else mode)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
            spy.wait(timeout=120)
        cpu = server.cpu_seconds() - cpu_before
        workers = server.worker_cpu_seconds() - workers_before
        threads_after = server.thread_cpu_seconds()
        names.update(server.thread_names())
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    lag = result["freshness"].get("lag_ms", {})
    return {
        "tree": str(tree),
        "settings": dict(settings),
        "py_spy": None if py_spy is None else str(py_spy),
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


def _start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """`py-spy record --gil` of the server into `out` (collapsed stacks, one line per
    stack with its sample count), until SIGINT: only samples holding the GIL, which is
    what serializes the POST handling and the projector in one interpreter."""
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = py_spy_path()
    if spy is None:
        raise SystemExit("--py-spy: no py-spy beside this interpreter or on PATH")
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "--gil",
            "--nonblocking",
            "--threads",
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(out),
            "--pid",
            str(pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _settings(pairs: list[str]) -> dict[str, str]:
    settings = dict(pair.split("=", 1) for pair in pairs)
    bad = [name for name in settings if not name.startswith("ORRERY_")]
    if bad:
        raise SystemExit(f"not an ORRERY_ setting: {bad}")
    return settings


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
        "side",
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
            run.get("side", "-"),
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
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="ORRERY_NAME=VALUE",
        help="a setting of this tree's server (repeatable)",
    )
    parser.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="ORRERY_NAME=VALUE",
        help="a setting of the baseline's server (repeatable); with `--baseline .` an "
        "A/B of settings on one tree",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample each server's GIL-held stacks during the ingest into "
        "DIR/<round>-<side>-<mode>.txt (py-spy raw format)",
    )
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    trees = [REPO_ROOT, args.baseline.resolve()]
    # Each side is its position: the baseline may be this very tree with other settings.
    settings = [_settings(args.env), _settings(args.baseline_env)]
    started = utc_now()
    vocab = Vocabulary.build(random.Random(args.seed))
    corpus = SpooledCorpus(corpus_batches(args.size, args.batch_size, args.seed, vocab))
    runs: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for mode in modes:
                for side in (0, 1) if round_ % 2 == 0 else (1, 0):
                    tree = trees[side]
                    if mode != "commit" and side == 1:
                        continue  # the baseline may not know the parameter (ignored)
                    label = "this" if side == 0 else "baseline"
                    console.rule(f"round {round_ + 1}: {tree.name} [{label}] ({mode})")
                    spy = (
                        None
                        if args.py_spy is None
                        else args.py_spy / f"{round_ + 1}-{label}-{mode}.txt"
                    )
                    try:
                        run = one_run(
                            tree, mode, corpus, args.size, args.batch_size, settings[side], spy
                        )
                        runs.append({"side": label, **run})
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
            "settings": settings,
        },
        "runs": runs,
    }
    write_json(args.out, report)
    print_table(runs)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
