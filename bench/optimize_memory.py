"""What an optimize's child process holds in memory, and the serving side's shard.

    nice -n 19 .venv/bin/python bench/optimize_memory.py --size 200000 \
        --data-root /work/x [--indexed 0.4] [--module path/to/qdrant_edge_vectors.py] \
        [--label base] [--max-child-s 600] [--out run.json]

Builds (once, kept under `--data-root/<size>`) a qdrant-edge generation of `--size`
random 384-d points with `bench/optimize_schedule.py`'s payload through
`QdrantEdgeVectorIndex.apply`; with `--indexed f` the first f·size points are optimized
(HNSW) before the rest is written, the shape the last build of an ingest sees (one
indexed segment + plain ones). Then, as `optimize` does, the shard is copied to a staging
directory and the adapter's `_OPTIMIZE_SCRIPT` (this tree's, or `--module`'s, for an
A/B) runs on it in a child; this process samples the child's `/proc/<pid>/smaps` every
`--interval` s and reports the peak of its RSS with, at that sample, its anonymous part
and its file pages split into the segments the copy held before the build (input) and
those the build wrote (output), the child's `VmHWM` (`ru_maxrss`), and CPU seconds.
Afterwards the optimized copy is loaded in this process and searched (as the server does
after the swap): the RSS it adds, anonymous and file. Everything per point too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/optimize_memory.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench.common import edge_adapter
from bench.optimize_schedule import _docs

_BATCH = 1_000


def _build(module: Any, edge: Path, size: int, dim: int, indexed: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = module.QdrantEdgeVectorIndex(edge)
    index.create("g", dim)
    first = int(size * indexed)
    for start in range(0, size, _BATCH):
        if first and start == first:
            index.optimize("g")
        vectors = rng.standard_normal((min(_BATCH, size - start), dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index.apply("g", _docs(vectors, start, rng), [])
    index.close()


def _live(edge: Path) -> Path:
    pointer = edge / "g+live"
    if pointer.exists():
        return edge / pointer.read_text(encoding="utf-8").strip()
    return edge / "g"


def _smaps(pid: int, staging: str, inputs: set[str]) -> dict[str, int] | None:
    """KiB resident: total, anon, input and output file pages of the copy, other files;
    and (a part of input) the input's vector chunks in their writable mappings, which
    qdrant-edge maps a second time read-only (a page resident in both is counted twice,
    and `MADV_PAGEOUT` passes over it)."""
    parts = {"rss": 0, "anon": 0, "input": 0, "output": 0, "other_file": 0, "input_rw_chunks": 0}
    writable_chunk = False
    try:
        with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
            where = "anon"
            for line in smaps:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    fields = line.split(maxsplit=5)
                    name = fields[5].strip() if len(fields) == 6 else ""
                    writable_chunk = "w" in fields[1] and "/chunk_" in name
                    if name.startswith(staging):
                        segment = Path(name).relative_to(staging).parts[:3]
                        where = "input" if "/".join(segment) in inputs else "output"
                    elif name.startswith("/"):
                        where = "other_file"
                    else:
                        where = "anon"
                elif head == "Rss:":
                    kib = int(line.split()[1])
                    parts["rss"] += kib
                    parts[where] += kib
                    if where == "input" and writable_chunk:
                        parts["input_rw_chunks"] += kib
    except (OSError, ValueError):
        return None
    return parts


def _segments(shard: Path) -> set[str]:
    """`segments/<name>` entries (and other top-level files) of a shard directory, as
    paths relative to it, three parts deep (`segments/<uuid>/<file or dir>`)."""
    names = set()
    for path in shard.rglob("*"):
        parts = path.relative_to(shard).parts[:3]
        names.add("/".join(parts))
    return names


def _run_child(
    module: Any,
    staging: Path,
    interval: float,
    page_out_s: float | None,
    max_child_s: float | None = None,
    first_page_out_s: float = 0.0,
) -> dict[str, Any]:
    inputs = _segments(staging)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", module._OPTIMIZE_SCRIPT, str(staging)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak: dict[str, int] = {"rss": 0}
    read_mib = [0]  # what the child read from disk (page cache misses), last seen
    series: list[list[float]] = []
    done = threading.Event()

    def sample() -> None:
        prefix = f"{os.path.realpath(staging)}/"
        while not done.is_set():
            parts = _smaps(process.pid, prefix, inputs)
            with (
                contextlib.suppress(OSError, ValueError, StopIteration),
                open(f"/proc/{process.pid}/io", encoding="ascii") as io,
            ):
                line = next(x for x in io if x.startswith("read_bytes:"))
                read_mib[0] = int(line.split()[1]) >> 20
            if parts is not None:
                if parts["rss"] > peak["rss"]:
                    peak.clear()
                    peak.update(parts)
                elapsed = round(time.perf_counter() - started, 1)
                series.append([elapsed, *(round(v / 1024) for v in parts.values())])
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # As `_optimize_in_child` runs it (a revision without a pager runs the child alone).
    pager = module._ChildPager(process.pid, staging) if hasattr(module, "_ChildPager") else None
    if page_out_s is None:
        page_out_s = getattr(module, "_CHILD_PAGE_OUT_S", 1.0)
    stopped = False
    next_round = started + first_page_out_s
    while True:
        try:
            stdout, stderr = process.communicate(timeout=module._CHILD_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if max_child_s is not None and time.perf_counter() - started > max_child_s:
                process.kill()  # a partial run: the peak of its first `max_child_s`
                stdout, stderr = process.communicate()
                stopped = True
                break
            if pager is not None and time.perf_counter() >= next_round:
                pager.page_out()
                next_round = time.perf_counter() + page_out_s
    if pager is not None:
        pager.close()
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0 and not stopped:
        raise RuntimeError(f"child failed: {stderr[-2000:]}")
    return {
        "outcome": "stopped" if stopped else stdout.strip().rsplit("\n", 1)[-1],
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "hwm_mib": round(after.ru_maxrss / 1024),  # the largest child's so far
        "read_from_disk_mib": read_mib[0],
        "page_out_every_s": page_out_s if pager is not None else None,
        "first_page_out_s": first_page_out_s if pager is not None else None,
        "peak_mib": {k: round(v / 1024) for k, v in peak.items()},
        "series_mib": {
            "columns": ["s", "rss", "anon", "input", "output", "other_file", "input_rw_chunks"],
            "rows": series[:: max(1, len(series) // 60)],
        },
        "pager": None
        if pager is None
        else {
            "rounds": pager.rounds,
            "reclaimed_mib": round(pager.reclaimed_kb / 1024),
            "refused": pager.refused,
        },
        "stderr_tail": stderr.strip()[-500:],
    }


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise KeyError(field)


def _serve(module: Any, staging: Path, dim: int) -> dict[str, int]:
    """RSS the optimized copy adds to this process once loaded and searched."""
    from qdrant_edge import EdgeShard, Query, QueryRequest

    anon, file = _status_kib("RssAnon"), _status_kib("RssFile")
    shard = EdgeShard.load(str(staging))
    loaded = _status_kib("RssAnon") - anon, _status_kib("RssFile") - file
    rng = np.random.default_rng(7)
    for _ in range(50):
        vector = rng.standard_normal(dim).astype(np.float32)
        shard.query(
            QueryRequest(
                query=Query.Nearest(vector.tolist(), using=module.VECTOR_NAME),
                limit=10,
                with_payload=False,
            )
        )
    searched = _status_kib("RssAnon") - anon, _status_kib("RssFile") - file
    shard.close()
    return {
        "load_anon_mib": round(loaded[0] / 1024),
        "load_file_mib": round(loaded[1] / 1024),
        "searched_anon_mib": round(searched[0] / 1024),
        "searched_file_mib": round(searched[1] / 1024),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--indexed", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--module", default=None)
    parser.add_argument("--label", default="tree")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument(
        "--page-out-s", type=float, default=None, help="the pager's period (the module's)"
    )
    parser.add_argument(
        "--max-child-s",
        type=float,
        default=None,
        help="stop the child after this long (its load and copy phase, part of its graph "
        "build): the figures are those of that window, and nothing is served",
    )
    parser.add_argument(
        "--first-page-out-s",
        type=float,
        default=0.0,
        help="the pager's first round this long after the child starts (default: at once)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    module = edge_adapter(args.module)
    base = args.data_root / f"{args.size}-{args.indexed}"
    edge = base / "edge"
    if not (base / "built").exists():
        shutil.rmtree(base, ignore_errors=True)
        started = time.perf_counter()
        _build(edge_adapter(None), edge, args.size, args.dim, args.indexed, args.seed)
        (base / "built").write_text(f"{time.perf_counter() - started:.0f}\n")
    staging = base / f".staging-{args.label}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(_live(edge), staging, copy_function=module._copy_file_keeping_holes)
    load = os.getloadavg()
    try:
        report: dict[str, Any] = {
            "label": args.label,
            "size": args.size,
            "indexed": args.indexed,
            "child": _run_child(
                module,
                staging,
                args.interval,
                args.page_out_s,
                args.max_child_s,
                args.first_page_out_s,
            ),
        }
        if not args.no_serve and report["child"]["outcome"] != "stopped":
            report["serve"] = _serve(module, staging, args.dim)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    peak = report["child"]["peak_mib"]
    report["child_bytes_per_point"] = {k: round(v * 1048576 / args.size) for k, v in peak.items()}
    report["load_before"] = [round(x, 2) for x in load]
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
