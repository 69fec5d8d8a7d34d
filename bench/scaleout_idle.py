"""The roles' CPU with nothing to do: CPU seconds per wall second of each role of
`bench/scaleout.py`'s PostgreSQL deployment (ingest API, relays, projectors), per
process and per thread name (librdkafka's `rdk:*` threads; Python's threads are all
`python`), after one small ingest made the namespace's topic and generation.

    .venv/bin/python -m bench.scaleout_idle --relays 2 --projectors 2 --window 30 \\
        --out docs/bench/scaleout-idle-session28.json

Why: `bench/scaleout.py`'s CPU seconds per 1k records count every second of the run,
so a role's idle cost (its polls, probes and heartbeats) adds `idle rate × wall time /
records`: a run slowed by load pays it for longer, whatever the code. This measures the
rate, to set beside a run's `applied_seconds`. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.scaleout import _cpu_roles, _cpu_snapshot, deployed, measure_ingest
from bench.topk import Vocabulary, corpus_batches

__all__ = ["main"]

_TICKS = os.sysconf("SC_CLK_TCK")
_ROLES = ("ingest", "relay", "project")


def _thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread name of process `pid`, summed."""
    out: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] += (int(fields[11]) + int(fields[12])) / _TICKS
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--projectors", type=int, default=2)
    parser.add_argument("--window", type=float, default=30.0, help="idle seconds measured")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before it")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    batches = list(corpus_batches(2_000, 2_000, 42, Vocabulary.build(random.Random(42))))
    load_before = Path("/proc/loadavg").read_text().strip()
    with deployed(
        "postgres", relays=args.relays, projectors=args.projectors, workers=1, batch_size=2000
    ) as deployment:
        measure_ingest(deployment, batches, 2_000)
        time.sleep(args.settle)
        roles = {k: v for k, v in _cpu_roles(deployment).items() if k.startswith(_ROLES)}
        threads_before = {name: _thread_seconds(pid) for name, pid in roles.items()}
        cpu_before, started = _cpu_snapshot(roles), time.perf_counter()
        time.sleep(args.window)
        cpu_after, wall = _cpu_snapshot(roles), time.perf_counter() - started
        threads_after = {name: _thread_seconds(pid) for name, pid in roles.items()}
    figures: dict[str, Any] = {}
    for name in roles:
        rates = {
            thread: round((seconds - threads_before[name].get(thread, 0.0)) / wall, 4)
            for thread, seconds in threads_after[name].items()
        }
        figures[name] = {
            "cpu_s_per_wall_s": round((cpu_after[name] - cpu_before[name]) / wall, 4),
            "threads": {k: v for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v > 0},
        }
        print(f"{name}: {figures[name]['cpu_s_per_wall_s']} CPU s a second {figures[name]}")
    total = round(sum(f["cpu_s_per_wall_s"] for f in figures.values()), 4)
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"roles together: {total} CPU s a second; load {load_before} -> {load_after}")
    if args.out is not None:
        write_json(
            args.out,
            {
                "benchmark": "scaleout_idle",
                "date": utc_now(),
                "git": git_facts(),
                "machine": machine_facts(),
                "config": {
                    "relays": args.relays,
                    "projectors": args.projectors,
                    "window_s": round(wall, 1),
                    "settle_s": args.settle,
                },
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "roles_cpu_s_per_wall_s": total,
                "roles": figures,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
