"""How long creating a new qdrant-edge generation stalls the other threads of the process,
two trees interleaved: `QdrantEdgeVectorIndex.create` (the shard and its payload indexes;
engine file I/O with the GIL held) as the embedded server's projector calls it.

    python bench/generation_create_ab.py --baseline /path/to/other/tree [--creates 4]
        [--rounds 4] [--out docs/bench/generation_create_ab.json]

Each round runs one child process per tree (alternating which goes first) with the tree
as working directory and first on `PYTHONPATH`. The child opens an index (with
`spare_dimension=384` where the tree's index takes it, and waits up to `--spare-wait`
seconds for its spare before each create, as a server has between new generations),
then creates `--creates` 384-d generations. Meanwhile a ticker thread wakes every
millisecond: its longest gap during a `create` call is the longest time every other
thread of the process (searches, writes) could not run, and its gaps past 2 ms added up
(less the 1 ms it sleeps) the time they were held up in all. Reported per tree: the
median over creates of the call's wall ms, its thread CPU ms, the ticker's longest gap
(`stall_ms`) and its time held up (`blocked_ms`), and how many creates had a spare
ready. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO_ROOT, git_facts, machine_facts, utc_now, write_json

_CHILD = r"""
import inspect, json, sys, tempfile, threading, time
from pathlib import Path
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex

creates, spare_wait = int(sys.argv[1]), float(sys.argv[2])
ticks = []
stop = threading.Event()

def tick():
    while not stop.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)

def spare_ready(root):
    return any(p.name.startswith(".spare-") and not p.name.endswith(".tmp")
               for p in Path(root).iterdir()) if Path(root).is_dir() else False

spares = "spare_dimension" in inspect.signature(QdrantEdgeVectorIndex).parameters
ticker = threading.Thread(target=tick, daemon=True)
ticker.start()
rows = []
with tempfile.TemporaryDirectory(prefix="orrery-gen-create-", dir=sys.argv[3]) as root:
    kwargs = {"spare_dimension": 384} if spares else {}
    index = QdrantEdgeVectorIndex(root, **kwargs)
    for n in range(creates):
        ready = False
        if spares:
            deadline = time.monotonic() + spare_wait
            while not (ready := spare_ready(root)) and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.05)
        began, cpu = time.perf_counter(), time.thread_time()
        index.create(f"g{n}", 384)
        ended, cpu = time.perf_counter(), time.thread_time() - cpu
        inside = [began] + [t for t in list(ticks) if began <= t <= ended] + [ended]
        gaps = [b - a for a, b in zip(inside, inside[1:])]
        rows.append({"wall_ms": (ended - began) * 1e3, "cpu_ms": cpu * 1e3,
                     "stall_ms": max(gaps) * 1e3,
                     "blocked_ms": sum(g - 0.001 for g in gaps if g > 0.002) * 1e3,
                     "spare_ready": ready})
    index.close()
stop.set()
print(json.dumps(rows))
"""


def _run(tree: Path, creates: int, spare_wait: float, scratch: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(creates), str(spare_wait), str(scratch)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "creates": len(rows),
        "spare_ready": sum(1 for r in rows if r["spare_ready"]),
        **{
            f"median_{key}": round(statistics.median(r[key] for r in rows), 1)
            for key in ("wall_ms", "cpu_ms", "stall_ms", "blocked_ms")
        },
        "max_stall_ms": round(max(r["stall_ms"] for r in rows), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--creates", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--spare-wait", type=float, default=20.0)
    parser.add_argument("--scratch", type=Path, default=None, help="where the roots go")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs/bench/generation_create_ab.json"
    )
    args = parser.parse_args()
    trees = {"this": REPO_ROOT, "baseline": args.baseline.resolve()}
    scratch = (args.scratch or Path(os.environ.get("TMPDIR", "/tmp"))).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    rounds: list[dict[str, Any]] = []
    rows: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    for round_ in range(args.rounds):
        order = ["this", "baseline"] if round_ % 2 == 0 else ["baseline", "this"]
        entry: dict[str, Any] = {"load": round(os.getloadavg()[0], 2)}
        for side in order:
            got = _run(trees[side], args.creates, args.spare_wait, scratch)
            rows[side].extend(got)
            entry[side] = _summary(got)
        rounds.append(entry)
        print(f"round {round_ + 1}: {json.dumps(entry)}", file=sys.stderr)
    summary = {side: _summary(rows[side]) for side in ("this", "baseline")}
    report = {
        "benchmark": "generation_create_ab",
        "date": started,
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "creates": args.creates,
            "rounds": args.rounds,
            "spare_wait_s": args.spare_wait,
            "trees": {k: str(v) for k, v in trees.items()},
        },
        "rounds": rounds,
        "summary": summary,
    }
    write_json(args.out, report)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
