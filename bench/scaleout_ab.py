"""Server-mode ingest CPU of two code trees (or of one tree in two configurations),
paired: `bench/scaleout.py`'s ingest deployment (every role its own process on the
harness servers) run for side A and side B in turn, alternating which goes first per
round.

    .venv/bin/python bench/scaleout_ab.py --a /path/to/base --b . --size 20000 --rounds 2 \\
        --out docs/bench/scaleout-ab-20k-session16.json
    .venv/bin/python bench/scaleout_ab.py --a . --b . --env-a ORRERY_KAFKA_CLIENT=kafka-python \\
        --env-b ORRERY_KAFKA_CLIENT=confluent --size 20000 --rounds 4 --out ...

`--env-a` / `--env-b` (KEY=VALUE, repeatable) are given to every role of that side.

Each run is one fresh PostgreSQL deployment with R relays and P projectors (default
2/2, the `postgres:2:2` plan of `bench/servers.py --scaleout-plans`): the same corpus
(`bench/topk.py`'s, precomputed vectors) POSTed in batches of 2,000, then polled until
applied; the figures are `bench.scaleout.measure_ingest`'s, taken by each tree's own
copy of it (CPU seconds per 1k records of every role, server and the load generator),
with the load average before and after. The tree's roles run with that tree on
`sys.path` first (`python -c` with the tree as working directory). Figures are
reported, never asserted; the load of a shared machine hits both trees alike only on
average, hence the alternation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench.common import git_facts, machine_facts, utc_now, write_json

__all__ = ["main"]

# Run in the tree under test: its own bench.scaleout deploys and measures.
_CHILD = """
import json, random, sys
from pathlib import Path
from bench.scaleout import deployed, measure_ingest
from bench.topk import Vocabulary, corpus_batches
size, relays, projectors = (int(a) for a in sys.argv[1:4])
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
post = int(extra.pop("post_batch", 2000))
batches = list(corpus_batches(size, post, 42, Vocabulary.build(random.Random(42))))
before = Path("/proc/loadavg").read_text().strip()
fresh = int(extra.pop("fresh", 0))
with deployed(
    "postgres", relays=relays, projectors=projectors, workers=1, batch_size=2000, **extra
) as d:
    figures = measure_ingest(d, batches, size)
    if fresh:
        from bench.scaleout import _verify_live, measure_freshness
        _verify_live(d)
        figures["freshness"] = measure_freshness(d, fresh)
figures["loadavg_before"] = before
figures["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
print("FIGURES " + json.dumps(figures))
"""

ROLES = ("ingest-api", "relay", "project")


def _run(
    tree: Path,
    size: int,
    relays: int,
    projectors: int,
    env: dict[str, str],
    fresh: int = 0,
    post_batch: int = 2000,
) -> dict[str, Any]:
    # Only given when set: a base tree's `deployed` may not take `extra_env`.
    options: dict[str, Any] = {"extra_env": env} if env else {}
    if fresh:
        options["fresh"] = fresh
    if post_batch != 2000:
        options["post_batch"] = post_batch
    extra = [json.dumps(options)] if options else []
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size), str(relays), str(projectors), *extra],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("FIGURES "):
            figures: dict[str, Any] = json.loads(line.removeprefix("FIGURES "))
            return figures
    raise RuntimeError(f"run in {tree} failed:\n{done.stderr[-3000:]}")


def orrery_cpu(figures: dict[str, Any]) -> dict[str, float]:
    """Orrery's own roles' CPU s per 1k records: each role kind summed, and the total."""
    per = figures["cpu_seconds_per_1k_records"]
    out = {kind: round(sum(v for k, v in per.items() if k.startswith(kind)), 3) for kind in ROLES}
    out["total"] = round(sum(out.values()), 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="tree A (e.g. the base)")
    parser.add_argument("--b", type=Path, required=True, help="tree B (e.g. this branch)")
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--projectors", type=int, default=2)
    parser.add_argument(
        "--fresh",
        type=int,
        default=0,
        help="after the ingest, this many single-record freshness lags (POST returned → "
        "first visible in a lexical-only topk_records), as bench/scaleout.py's",
    )
    parser.add_argument(
        "--post-batch",
        type=int,
        default=2000,
        help="records a POST (at most 2,000, the deployment's ORRERY_MAX_BATCH)",
    )
    parser.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    envs = {
        side: dict(item.split("=", 1) for item in items)
        for side, items in (("a", args.env_a), ("b", args.env_b))
    }
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for side in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
            figures = _run(
                trees[side],
                args.size,
                args.relays,
                args.projectors,
                envs[side],
                args.fresh,
                args.post_batch,
            )
            runs.append({"tree": side, "round": round_, **figures, "orrery": orrery_cpu(figures)})
            lag = figures.get("freshness", {}).get("lag_ms", {})
            print(
                side,
                runs[-1]["orrery"],
                figures["loadavg_after"],
                figures.get("calls", ""),
                {k: lag[k] for k in ("p50", "p95") if k in lag},
                file=sys.stderr,
            )
    summary = {
        side: {
            key: round(median(r["orrery"][key] for r in runs if r["tree"] == side), 3)
            for key in (*ROLES, "total")
        }
        for side in trees
    }
    for side in trees:
        lags = [r["freshness"]["lag_ms"] for r in runs if r["tree"] == side and "freshness" in r]
        if lags:
            summary[side]["freshness_p50_ms"] = round(median(x["p50"] for x in lags), 1)
            summary[side]["freshness_p95_ms"] = round(median(x["p95"] for x in lags), 1)
    report = {
        "benchmark": "scaleout_ab",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "trees": {k: str(v) for k, v in trees.items()},
            "env": envs,
            "size": args.size,
            "rounds": args.rounds,
            "relays": args.relays,
            "projectors": args.projectors,
            "fresh": args.fresh,
            "post_batch": args.post_batch,
            "command": " ".join(["bench/scaleout_ab.py", *(argv or sys.argv[1:])]),
        },
        "orrery_cpu_seconds_per_1k_records_median": summary,
        "runs": runs,
    }
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
