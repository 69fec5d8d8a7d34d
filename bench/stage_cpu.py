"""Where the synthetic 100k one-shot's time goes, in process: CPU per piece and the
engine call's GIL.

    .venv/bin/python bench/stage_cpu.py --data-dir R/data [--queries 300] [--rounds 1]
        [--record-cache] [--in-place] [--out FILE.json]

1. Copies `--data-dir` (the data dir a `bench/versus_qdrant_synthetic.py --data-root R`
   run kept: `R/data`; `--in-place` reads it where it is) and opens the embedded stack
   on it as `bench/hotpath_ab.py`'s worker does (the query clock fixed, response cache
   off, the optimizer held off), with the record cache off unless `--record-cache`: the
   versus bench asks each query once, so its payload reads miss. Builds the in-memory
   lexical copy and the point table, as the server's compactor and first search would.
2. Caches every query's vector through `retrieve` and warms up as the bench does, then
   sends its timed `topk_records` bodies `--rounds` times straight into the ASGI app (no
   sockets, no test client: one asyncio loop on this thread).
3. Each piece below is wrapped for the timed queries: the CPU of the calling thread
   (`time.thread_time`; robust to the machine's load, unlike wall time) and its wall
   time, p50 per call and mean per query. The wrappers themselves cost a few µs a call
   (two `thread_time` reads).
4. The GIL probe: the bench's query vectors searched once each through the vector port,
   while a second Python thread counts as fast as it can; a call that let the GIL go
   lets it count. Reports the call's wall, its thread's CPU, the process's CPU and the
   counter's progress in milliseconds of its solo rate.

Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/stage_cpu.py`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import print_report

TOPK = "/v1/external/retrieve/topk_records"
RETRIEVE = "/v1/external/retrieve"

# (module, attribute path, label): the pieces timed. A name another module imported by
# value is wrapped where the caller reads it (`query.entrypoints.http`'s `_json`).
PIECES: tuple[tuple[str, str, str], ...] = (
    ("query.entrypoints.http", "loads_strict", "loads_strict"),
    ("query.entrypoints.http", "validate_strict", "validate_strict"),
    ("query.service", "_resolve", "_resolve"),
    ("query.service", "_search_sources", "_search_sources"),
    ("query.adapters.qdrant_edge_vectors", "QdrantEdgeVectorSearch.search", "vectors.search"),
    ("query.adapters.tantivy_lexical", "TantivyLexicalSearch.search", "lexical.search"),
    ("query.service", "_fuse_and_page", "_fuse_and_page"),
    ("query.service", "_rescore", "_rescore"),
    ("query.adapters.tantivy_lexical", "TantivyLexicalSearch.scores", "lexical.scores"),
    ("query.adapters.qdrant_edge_vectors", "QdrantEdgeVectorSearch.scores", "vectors.scores"),
    ("query.service", "fuse_top", "fuse_top"),
    ("query.service", "_materialize", "_materialize"),
    ("query.adapters.sqlite_routing", "SqliteRecordReader.fetch", "records.fetch"),
    ("query.service", "from_json", "from_json"),
    ("query.entrypoints.http", "_json", "_json"),
)


class Pieces:
    """Thread CPU and wall time per call of each wrapped piece, while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.wall: dict[str, list[float]] = defaultdict(list)

    def wrap(self, module: str, path: str, label: str) -> None:
        import importlib

        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        inner: Callable[..., Any] = getattr(owner, name)
        pieces = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not pieces.on:
                return inner(*args, **kwargs)
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                pieces.wall[label].append((time.perf_counter() - wall) * 1e6)
                pieces.cpu[label].append((time.thread_time() - cpu) * 1e6)

        setattr(owner, name, timed)

    def report(self, requests: int) -> dict[str, dict[str, float]]:
        return {
            label: {
                "calls_per_query": round(len(values) / requests, 2),
                "cpu_us_per_query_mean": round(sum(values) / requests, 1),
                "cpu_us_per_call_p50": round(statistics.median(values), 1),
                "wall_us_per_call_p50": round(statistics.median(self.wall[label]), 1),
            }
            for label, values in sorted(self.cpu.items(), key=lambda kv: -sum(kv[1]))
        }


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    """One `POST path` with `body` through the ASGI app: status and response body."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never: the app reads one body
        return {"type": "http.disconnect"}

    status = 0
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    await app(scope, receive, send)
    return status, b"".join(chunks)


def gil_probe(
    search: Callable[[Sequence[float]], object], vectors: Sequence[Sequence[float]]
) -> dict[str, float]:
    """p50 over `vectors` of one `search` each: wall, the calling thread's CPU, the
    process's CPU, and how far a counting thread got meanwhile (ms of its solo rate;
    0 when the call kept the GIL throughout)."""
    count = 0
    stop = False

    def spin() -> None:
        nonlocal count
        while not stop:
            count += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    time.sleep(0.1)
    start, started = count, time.perf_counter()
    time.sleep(0.5)
    rate = (count - start) / (time.perf_counter() - started)
    rows: list[tuple[float, float, float, float]] = []
    for vector in vectors:
        start = count
        wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
        search(vector)
        rows.append(
            (
                (time.perf_counter() - wall) * 1e3,
                (time.thread_time() - cpu) * 1e3,
                (time.process_time() - process) * 1e3,
                (count - start) / rate * 1e3,
            )
        )
    stop = True
    spinner.join()
    names = ("wall_ms", "thread_cpu_ms", "process_cpu_ms_with_counter", "counter_ran_ms")
    return {n: round(statistics.median(r[i] for r in rows), 3) for i, n in enumerate(names)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.topk import NAMESPACE, SCOPE_REF
    from bench.versus_qdrant import LANGUAGE

    os.environ["ORRERY_NAMESPACE_LANGUAGES"] = json.dumps({NAMESPACE: LANGUAGE})
    os.environ["ORRERY_OPTIMIZE_INTERVAL_SECONDS"] = "1000000"
    if not args.record_cache:
        os.environ["ORRERY_RECORD_CACHE_BYTES"] = "0"

    import orrery.embedded as embedded
    from bench.hotpath_ab import _stack
    from bench.versus_qdrant_synthetic import WARMUP_QUERIES, queries, topk_content
    from contracts.index import SearchFilter

    # The stack builds its query ports through this name (as `hotpath_ab` fixes the
    # clock): kept here for the GIL probe.
    module: Any = embedded
    captured: list[Any] = []
    ports_of = module.embedded_query_ports

    def keep_ports(*a: Any, **k: Any) -> Any:
        ports = ports_of(*a, **k)
        captured.append(ports)
        return ports

    module.embedded_query_ports = keep_ports
    work = Path(tempfile.mkdtemp(prefix="orrery-stage-cpu-"))
    try:
        data_dir = args.data_dir
        if not args.in_place:
            data_dir = work / "data"
            shutil.copytree(args.data_dir, data_dir)
        stack = _stack(data_dir, fixed_clock=True)
        try:
            for generation_id, _ns, _kind, _state in stack.projector.state.generations():
                stack.projector.build_lexical_flat(generation_id)
                stack.projector.vectors.build_points(generation_id)
            ports = captured[-1]
            pieces = Pieces()
            for module_name, path, label in PIECES:
                pieces.wrap(module_name, path, label)
            loop = asyncio.new_event_loop()

            def post(path: str, body: bytes) -> bytes:
                status, out = loop.run_until_complete(asgi_post(stack.app, path, body))
                if status != 200:
                    raise RuntimeError(f"{path}: {status} {out[:300]!r}")
                return out

            texts = [q.text for q in queries(args.queries)]
            for text in reversed(texts):
                warm = {"namespace": NAMESPACE, "scope_ref": SCOPE_REF, "query_text": text,
                        "limit": 1, "timeout_seconds": 60}  # fmt: skip
                post(RETRIEVE, json.dumps(warm).encode())
            for text in texts[:WARMUP_QUERIES] * 3:
                post(TOPK, topk_content(text))
            timed = texts[WARMUP_QUERIES:]
            load_before = os.getloadavg()
            cpu: list[float] = []
            wall: list[float] = []
            stages: dict[str, list[float]] = defaultdict(list)
            pieces.on = True
            for _round in range(args.rounds):
                for text in timed:
                    body = topk_content(text)
                    started, thread = time.perf_counter(), time.thread_time()
                    out = post(TOPK, body)
                    cpu.append((time.thread_time() - thread) * 1e6)
                    wall.append((time.perf_counter() - started) * 1e6)
                    for stage, ms in json.loads(out)["query_plan"]["latency_ms"].items():
                        stages[stage].append(ms)
            pieces.on = False
            load_after = os.getloadavg()
            vectors = [ports.query_vectors.vector(t, tenant=NAMESPACE) for t in timed]
            generation_id = json.loads(out)["generation_id"]
            probe = gil_probe(
                lambda v: ports.vectors.search(generation_id, v, SearchFilter(), 100), vectors
            )
        finally:
            stack.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = statistics.median
    return {
        "benchmark": "stage_cpu",
        "data_dir": str(args.data_dir),
        "queries": len(timed),
        "rounds": args.rounds,
        "record_cache": args.record_cache,
        "loadavg": {"before": list(load_before), "after": list(load_after)},
        "request_thread_cpu_us_p50": round(median(cpu), 1),
        "request_wall_us_p50": round(median(wall), 1),
        "stage_ms_p50": {k: round(median(v), 3) for k, v in stages.items()},
        "pieces": pieces.report(len(cpu)),
        "vector_search_gil_probe": probe,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a kept R/data")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--record-cache", action="store_true", help="the server's default")
    parser.add_argument("--in-place", action="store_true", help="open --data-dir, no copy")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print_report(run(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
