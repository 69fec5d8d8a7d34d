"""What metrics, tracing and the access log cost per request.

    .venv/bin/python bench/metrics_overhead.py [--micro 20000] [--queries 300]
                                               [--out docs/bench/metrics_overhead.json]

1. Micro: `orrery.telemetry.RequestTelemetry` around a bare ASGI app that answers at
   once, called directly (no socket), with nothing / metrics / metrics + JSON access log
   / metrics + access log + spans, interleaved call by call; plus one
   `Metrics.answered` (a query's stage, engine, cache and candidate observations).
   Per-call medians in microseconds.
2. End to end: two `orrery serve --sample` processes on loopback, one with metrics,
   tracing and the access log off, one with all three on; the same `topk_records`
   requests (response-cache misses: each text once per server; then hits: the same
   texts again) alternate between them request by request over keep-alive clients.
   p50/p95 per server and the overhead of "on" at p50.

Prints a table and writes JSON. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/external/retrieve/topk_records",
        "headers": [(b"content-type", b"application/json"), (b"x-api-key", b"k")],
        "route": type("R", (), {"path": "/v1/external/retrieve/topk_records"})(),
    }


async def _bare(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _noop_send(message: Any) -> None:
    return None


async def _receive() -> Any:
    return {"type": "http.request", "body": b""}


def micro(calls: int) -> dict[str, float]:
    from orrery.telemetry import Metrics, Observability, RequestTelemetry
    from orrery.tracing import open_tracing

    logging.getLogger("orrery.access").propagate = False
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    from orrery.logs import JsonFormatter, RequestContextFilter

    sink.setFormatter(JsonFormatter())
    sink.addFilter(RequestContextFilter("bench"))
    logging.getLogger("orrery.access").addHandler(sink)
    logging.getLogger("orrery.access").setLevel(logging.INFO)
    metrics = Metrics(["bench"])
    tracing = open_tracing(None, service="bench", roles=["bench"])
    apps: dict[str, Any] = {
        "bare": _bare,
        "metrics": RequestTelemetry(_bare, observability=Observability(metrics=metrics)),
        "metrics+log": RequestTelemetry(
            _bare, observability=Observability(metrics=metrics, access_log=True)
        ),
        "metrics+log+spans": RequestTelemetry(
            _bare,
            observability=Observability(metrics=metrics, access_log=True, tracing=tracing),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in apps}
    # CPU time of this thread too: on a loaded machine the wall time of a call mostly
    # measures waiting for a core, its CPU time what the call itself costs.
    cpu: dict[str, list[float]] = {name: [] for name in apps}

    async def run() -> None:
        for _ in range(calls):
            for name, app in apps.items():
                scope = _scope()
                started = time.perf_counter_ns()
                started_cpu = time.thread_time_ns()
                await app(scope, _receive, _noop_send)
                cpu[name].append((time.thread_time_ns() - started_cpu) / 1000.0)
                times[name].append((time.perf_counter_ns() - started) / 1000.0)

    asyncio.run(run())
    out = {f"{name}_us": round(statistics.median(t), 2) for name, t in times.items()}
    out.update({f"{name}_cpu_us": round(statistics.median(t), 2) for name, t in cpu.items()})
    stages = {"scope_resolve": 0.1, "candidate_fetch": 0.5, "index_search": 1.2,
              "rerank": 0.3, "payload_materialize": 0.2}  # fmt: skip
    engine = {"tantivy_search": 0.8, "qdrant_edge_query": 0.4}
    answered: list[float] = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        metrics.answered("topk", stages, engine, "miss", {"lexical": 100, "vector": 100})
        answered.append((time.perf_counter_ns() - started) / 1000.0)
    out["answered_us"] = round(statistics.median(answered), 2)
    spans: list[float] = []
    for _ in range(min(calls, 5_000)):
        started = time.perf_counter_ns()
        tracing.answered("topk", stages, engine, "miss", {"lexical": 100, "vector": 100})
        spans.append((time.perf_counter_ns() - started) / 1000.0)
    out["stage_spans_us"] = round(statistics.median(spans), 2)
    tracing.close()
    return out


def _start(data_dir: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log = (data_dir.parent / f"serve-{port}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "orrery.cli", "serve", "--sample", "--data-dir", str(data_dir),
         "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
    )  # fmt: skip


def _wait(client: httpx.Client, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            body = client.get("/v1/readiness").json()
            if body.get("ready") and body.get("scopes"):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become ready")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def end_to_end(queries: int) -> dict[str, Any]:
    from ingest.sample import SAMPLE_NAMESPACE, sample_queries

    configs = {
        "off": {"ORRERY_METRICS": "false", "ORRERY_TRACING": "false", "ORRERY_ACCESS_LOG": "false"},
        "on": {"ORRERY_METRICS": "true", "ORRERY_TRACING": "true", "ORRERY_ACCESS_LOG": "true",
               "ORRERY_LOG_FORMAT": "json"},
    }  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="orrery-metrics-bench-"))
    procs, clients = {}, {}
    try:
        for name, env in configs.items():
            port = _free_port()
            procs[name] = _start(root / name / "data", port, env)
            clients[name] = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        deadline = time.monotonic() + 300
        for client in clients.values():
            _wait(client, deadline)
        examples = sample_queries()
        texts = [f"{examples[i % len(examples)]['query_text']} {i}" for i in range(queries)]
        scope_ref = examples[0]["scope_ref"]
        times: dict[str, dict[str, list[float]]] = {
            name: {"miss": [], "hit": []} for name in configs
        }
        for kind in ("miss", "hit"):
            for i, text in enumerate(texts):
                order = list(configs) if i % 2 == 0 else list(reversed(configs))
                for name in order:
                    body = {"namespace": SAMPLE_NAMESPACE, "scope_ref": scope_ref,
                            "query_text": text, "result_limit": 3}  # fmt: skip
                    started = time.perf_counter()
                    response = clients[name].post("/v1/external/retrieve/topk_records", json=body)
                    times[name][kind].append((time.perf_counter() - started) * 1000.0)
                    assert response.status_code == 200, response.text
        out: dict[str, Any] = {}
        for kind in ("miss", "hit"):
            row: dict[str, Any] = {}
            for name in configs:
                values = sorted(times[name][kind])
                row[name] = {
                    "p50_ms": round(statistics.median(values), 3),
                    "p95_ms": round(values[int(len(values) * 0.95) - 1], 3),
                }
            row["overhead_p50_pct"] = round(
                (row["on"]["p50_ms"] / row["off"]["p50_ms"] - 1.0) * 100.0, 2
            )
            out[kind] = row
        return out
    finally:
        for client in clients.values():
            client.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro", type=int, default=20_000, help="calls per variant")
    parser.add_argument("--queries", type=int, default=300, help="texts per server and kind")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "metrics_overhead.json"
    )
    args = parser.parse_args(argv)
    load: Callable[[], str] = lambda: Path("/proc/loadavg").read_text().strip()  # noqa: E731
    result: dict[str, Any] = {"loadavg_before": load()}
    result["micro"] = micro(args.micro)
    print("micro (median us per call):", json.dumps(result["micro"]))
    result["end_to_end"] = end_to_end(args.queries)
    result["loadavg_after"] = load()
    for kind, row in result["end_to_end"].items():
        print(
            f"{kind:5} off p50 {row['off']['p50_ms']:.3f} ms p95 {row['off']['p95_ms']:.3f} | "
            f"on p50 {row['on']['p50_ms']:.3f} ms p95 {row['on']['p95_ms']:.3f} | "
            f"overhead p50 {row['overhead_p50_pct']:+.2f} %"
        )
    print("loadavg", result["loadavg_before"], "->", result["loadavg_after"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
