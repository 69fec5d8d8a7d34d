"""What metrics, tracing and the access log cost per one-shot query, interleaved A/B.

    .venv/bin/python bench/metrics_overhead.py [--micro 20000] [--queries 300]
                                               [--out docs/bench/metrics_overhead.json]

1. Micro (in process, no socket): `orrery.telemetry.RequestTelemetry` around an ASGI
   app that tells the query observer one answer (what `topk_records` tells it: five
   stages, two engine calls, the cache result, two sources) and answers at once.
   Variants, interleaved call by call in a new seeded order each round: `bare` (no
   middleware), `off` and `off-b` (the middleware with everything off: request id and
   context only; the same variant twice, so their difference is the noise floor),
   `metrics`, `metrics+log` (JSON access line into /dev/null), `metrics+tracing`
   (`ORRERY_TRACING=true` without an exporter: ids only, no spans), `metrics+spans`
   (every request sampled, the default ratio 1.0: its spans made and exported over
   OTLP/HTTP by the exporter child, `orrery.span_exporter`, to a receiver in a process
   of its own), `metrics+spans@0.01` (the same, head-sampled at
   `ORRERY_TRACING_SAMPLE_RATIO=0.01`). Medians of the wall time and of the CPU time of
   the request's thread, in microseconds, and the wall time until the response's body
   was sent (log work runs after it); plus what is spent off the request thread: a
   scrape's CPU per request folding the queue in, the process's CPU per access line
   made and written by the writer thread, the process's CPU per sampled request beyond
   its own thread's (the shipper pickling and writing batches to the child) and the
   exporter child's CPU per sampled request.
2. End to end: one `orrery serve --sample` per variant (`off`, `off-b`, `metrics`,
   `metrics+log`, `metrics+tracing`, `metrics+spans`: `ORRERY_OTLP_ENDPOINT` set, every
   request sampled at the default ratio 1.0 and exported over OTLP/HTTP to a receiver
   in this process that decodes and counts the spans), all on copies of one prepared
   data dir, running
   at once on loopback. The same `topk_records` request goes to every server in turn,
   in a new seeded order for each text, over keep-alive clients: first each text once
   (response-cache misses), then the same texts again (hits). p50/p95 per variant, the
   overhead of each at p50 against `off`, the paired median difference per text with a
   bootstrap 95 % interval, and `off-b` against `off` as the noise floor. Every 50
   texts the servers with metrics are scraped (`GET /metrics`, untimed), as Prometheus
   would: their queued observations are folded in then, not on the timed requests.
   And per kind, the CPU of each server process per request (user + system from
   /proc: the figure a loaded machine hurts least) and of its children (the exporter
   child).

Prints a table, writes JSON and a PNG. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    child_processes,
    draw_chart,
    free_port,
    git_facts,
    machine_facts,
    utc_now,
    write_json,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPK = "/v1/external/retrieve/topk_records"

# --- micro ------------------------------------------------------------------------------


class _Route:
    path = TOPK


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": TOPK,
        "headers": [(b"content-type", b"application/json"), (b"x-api-key", b"k")],
        "route": _Route(),
    }


def _answer() -> Any:
    from query.ports import Answered

    stages = {"scope_resolve": 0.1, "candidate_fetch": 0.5, "index_search": 1.2,
              "rerank": 0.3, "payload_materialize": 0.2}  # fmt: skip
    return Answered("topk", stages, {"tantivy_search": 0.8, "qdrant_edge_query": 0.4}, "miss",
                    {"lexical": 100, "vector": 100})  # fmt: skip


def _app(observer: Any) -> Any:
    """A one-shot route's shape: tell the observer (when there is one) the answer the
    query made anyway, answer."""
    answer = _answer()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if observer is not None:
            observer.answered(answer)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


_RESPONDED = [0]


async def _noop_send(message: Any) -> None:
    if message["type"] == "http.response.body":
        _RESPONDED[0] = time.perf_counter_ns()


async def _receive() -> Any:
    return {"type": "http.request", "body": b""}


def micro(calls: int) -> dict[str, Any]:
    from orrery.logs import JsonFormatter, RequestContextFilter
    from orrery.telemetry import (
        ACCESS_LOG,
        Metrics,
        Observability,
        RequestTelemetry,
        query_observer,
    )
    from orrery.tracing import open_tracing

    access = logging.getLogger("orrery.access")
    access.propagate = False
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    sink.setFormatter(JsonFormatter())
    sink.addFilter(RequestContextFilter("bench"))
    access.addHandler(sink)
    access.setLevel(logging.INFO)
    metrics = Metrics(["bench"])
    ids_only = open_tracing(None, service="bench", roles=["bench"])
    # The spans go to an OTLP receiver in a process of its own (its decoding is not
    # this process's CPU), through the exporter child, as in a server.
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.otlp"], cwd=REPO_ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None and receiver.stdin is not None
    endpoint = receiver.stdout.readline().strip()
    spans = open_tracing(endpoint, service="bench", roles=["bench"], sample_ratio=1.0)
    sampled = open_tracing(endpoint, service="bench", roles=["bench"], sample_ratio=0.01)
    observabilities = {
        "off": Observability(),
        "off-b": Observability(),
        "metrics": Observability(metrics=metrics),
        "metrics+log": Observability(metrics=metrics, access_log=True),
        "metrics+tracing": Observability(metrics=metrics, tracing=ids_only),
        "metrics+spans": Observability(metrics=metrics, tracing=spans),
        "metrics+spans@0.01": Observability(metrics=metrics, tracing=sampled),
    }
    apps: dict[str, Any] = {"bare": _app(None)}
    for name, observability in observabilities.items():
        inner = _app(query_observer(observability))
        apps[name] = RequestTelemetry(inner, observability=observability)
    wall: dict[str, list[float]] = {name: [] for name in apps}
    # CPU time of this thread too: on a loaded machine the wall time of a call mostly
    # measures waiting for a core, its CPU time what the call itself costs.
    cpu: dict[str, list[float]] = {name: [] for name in apps}
    # Wall time until the response's body was sent: what the client waits for (the
    # rest of a call runs after the response has left).
    to_response: dict[str, list[float]] = {name: [] for name in apps}
    flush_us: list[float] = []

    order = random.Random(25)

    async def run() -> None:
        names = list(apps)
        for i in range(calls):
            # A new order each round (seeded): a fixed rotation gave every variant the same
            # predecessor, and the first middleware call after `bare` ran ~2 us slower
            # (cold caches), which showed as a difference between `off` and `off-b`.
            order.shuffle(names)
            for name in names:
                app, scope = apps[name], _scope()
                started = time.perf_counter_ns()
                started_cpu = time.thread_time_ns()
                await app(scope, _receive, _noop_send)
                cpu[name].append((time.thread_time_ns() - started_cpu) / 1000.0)
                wall[name].append((time.perf_counter_ns() - started) / 1000.0)
                to_response[name].append((_RESPONDED[0] - started) / 1000.0)
                if name == "metrics+log":
                    # Its line is written by the writer thread: let it finish before the
                    # next call, whose wall time it would otherwise take (in a server it
                    # runs while the event loop waits for the network).
                    ACCESS_LOG.flush()
                # The spans' shipper wakes once per 200 ms whatever the calls: its work
                # falls on whichever call runs then, of any variant.
            if i % 1000 == 999:
                spans.flush()
                sampled.flush()
                # What a scrape does first: fold the queue in (off the request thread).
                queued = len(metrics._requests)
                started = time.thread_time_ns()
                metrics.flush()
                flush_us.append((time.thread_time_ns() - started) / 1000.0 / max(queued, 1))

    asyncio.run(run())

    async def span_export_cost(n: int) -> tuple[float, float]:
        # The process's CPU per sampled request beyond the request thread's own: what
        # the shipper thread spends (pickling its batches, writing them to the pipe);
        # and the exporter child's CPU per request (making and exporting the spans).
        app = apps["metrics+spans"]
        spans.flush()
        child = _cpu_ns(_pid(spans))
        started_cpu, started_thread = time.process_time_ns(), time.thread_time_ns()
        for _ in range(n):
            await app(_scope(), _receive, _noop_send)
        own = time.thread_time_ns() - started_thread
        spans.flush(timeout=120)
        ours = (time.process_time_ns() - started_cpu - own) / 1000.0 / n
        return ours, (_cpu_ns(_pid(spans)) - child) / 1000.0 / n

    shipper_us, child_us = asyncio.run(span_export_cost(min(calls, 5_000)))
    spans.close()
    sampled.close()
    ids_only.close()
    receiver.stdin.write("\n")
    receiver.stdin.flush()
    received = int(receiver.stdout.readline())
    receiver.stdin.close()
    receiver.wait(timeout=60)
    # The access line's cost on the writer thread: CPU of the whole process per line,
    # lines queued by this thread and written by the writer.
    lines = min(calls, 5_000)
    started_cpu = time.process_time_ns()
    for i in range(lines):
        ACCESS_LOG.line("POST", TOPK, TOPK, 200, 0.002, (f"r{i}", None, "demo"), None)
    ACCESS_LOG.flush(timeout=120)
    writer_us = (time.process_time_ns() - started_cpu) / 1000.0 / lines
    wall_us = {name: round(statistics.median(t), 2) for name, t in wall.items()}
    cpu_us = {name: round(statistics.median(t), 2) for name, t in cpu.items()}
    return {
        "calls_per_variant": calls,
        "wall_us": wall_us,
        "cpu_us": cpu_us,
        "over_off_cpu_us": {n: round(v - cpu_us["off"], 2) for n, v in cpu_us.items()},
        "to_response_us": {n: round(statistics.median(t), 2) for n, t in to_response.items()},
        "scrape_fold_us_per_request": round(statistics.median(flush_us), 2) if flush_us else None,
        "access_line_process_cpu_us": round(writer_us, 2),
        "span_shipper_process_cpu_us": round(shipper_us, 2),
        "span_child_cpu_us": round(child_us, 2),
        "otlp_spans_received": received,
    }


def _pid(tracing: Any) -> int:
    pid = tracing.spans.pid
    assert pid is not None, "the exporter child is not running"
    return int(pid)


def _oncpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of the threads of `pid` alive now (/proc schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return total


def _cpu_ns(pid: int) -> int:
    """User + system CPU of process `pid` so far (its own, not its waited children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


# --- end to end -------------------------------------------------------------------------

VARIANTS: dict[str, dict[str, str]] = {
    "off": {"ORRERY_METRICS": "false", "ORRERY_TRACING": "false", "ORRERY_ACCESS_LOG": "false"},
    "off-b": {"ORRERY_METRICS": "false", "ORRERY_TRACING": "false", "ORRERY_ACCESS_LOG": "false"},
    "metrics": {"ORRERY_METRICS": "true", "ORRERY_TRACING": "false", "ORRERY_ACCESS_LOG": "false"},
    "metrics+log": {"ORRERY_METRICS": "true", "ORRERY_TRACING": "false",
                    "ORRERY_ACCESS_LOG": "true"},
    "metrics+tracing": {"ORRERY_METRICS": "true", "ORRERY_TRACING": "true",
                        "ORRERY_ACCESS_LOG": "false"},
    # ORRERY_OTLP_ENDPOINT is added by `end_to_end` (the receiver's port).
    "metrics+spans": {"ORRERY_METRICS": "true", "ORRERY_TRACING": "true",
                      "ORRERY_ACCESS_LOG": "false", "ORRERY_TRACING_SAMPLE_RATIO": "1.0"},
}  # fmt: skip


def _start(data_dir: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (data_dir.parent / "serve.log").open("ab")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    child_env.update({"ORRERY_LOG_FORMAT": "json", **env})
    return subprocess.Popen(
        [sys.executable, "-m", "orrery.cli", "serve", "--sample", "--data-dir", str(data_dir),
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env,
    )  # fmt: skip


def _wait(client: httpx.Client, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            body = client.get("/v1/readiness").json()
            if body.get("ready") and body.get("scopes"):
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit("server did not become ready")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _paired(diffs: Sequence[float], rng: np.random.Generator) -> dict[str, Any]:
    """Median of per-text differences (ms) with a bootstrap 95 % interval."""
    values = np.asarray(diffs)
    boots = np.median(rng.choice(values, size=(2000, values.size), replace=True), axis=1)
    low, high = np.percentile(boots, [2.5, 97.5])
    return {"median_ms": round(float(np.median(values)), 4),
            "ci95_ms": [round(float(low), 4), round(float(high), 4)]}  # fmt: skip


def end_to_end(queries: int, warmup: int) -> dict[str, Any]:
    from ingest.sample import SAMPLE_NAMESPACE, sample_queries

    root = Path(tempfile.mkdtemp(prefix="orrery-metrics-bench-"))
    from tests.harness.otlp import OtlpReceiver

    receiver = OtlpReceiver()
    variants = {name: dict(env) for name, env in VARIANTS.items()}
    variants["metrics+spans"]["ORRERY_OTLP_ENDPOINT"] = receiver.endpoint
    procs: dict[str, subprocess.Popen[bytes]] = {}
    clients: dict[str, httpx.Client] = {}
    try:
        # One data dir prepared (the sample corpus embedded and indexed once), copied for
        # every variant: the servers start from the same generations.
        seed = root / "seed"
        seed.mkdir()
        port = free_port()
        proc = _start(seed / "data", port, VARIANTS["off"])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as c:
            _wait(c, proc, time.monotonic() + 900)
        _stop(proc)
        for name, env in variants.items():
            (root / name).mkdir()
            shutil.copytree(seed / "data", root / name / "data")
            (root / name / "data" / "operator.lock").unlink(missing_ok=True)
            port = free_port()
            procs[name] = _start(root / name / "data", port, env)
            clients[name] = httpx.Client(
                base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False
            )
        deadline = time.monotonic() + 900
        for name, client in clients.items():
            _wait(client, procs[name], deadline)
        examples = sample_queries()
        scope_ref = examples[0]["scope_ref"]

        def body(text: str) -> dict[str, Any]:
            return {"namespace": SAMPLE_NAMESPACE, "scope_ref": scope_ref,
                    "query_text": text, "result_limit": 3}  # fmt: skip

        names = list(VARIANTS)
        shuffle = random.Random(25)
        for i in range(warmup):
            for name in names:
                clients[name].post(TOPK, json=body(f"warm {i}"))
        texts = [f"{examples[i % len(examples)]['query_text']} {i}" for i in range(queries)]
        times: dict[str, dict[str, list[float]]] = {n: {"miss": [], "hit": []} for n in names}
        # CPU of each server process (the figure a loaded machine hurts least), and of
        # its children (the exporter child of `metrics+spans`), over the timed requests
        # and the scrapes between them.
        children = {n: [c["pid"] for c in child_processes(procs[n].pid)] for n in names}
        cpu_at: dict[str, dict[str, int]] = {}
        children_at: dict[str, dict[str, int]] = {}
        oncpu_at: dict[str, dict[str, int]] = {}
        scrape_oncpu = {k: dict.fromkeys(names, 0) for k in ("miss", "hit")}
        load_during = []
        scrapes: dict[str, list[float]] = {n: [] for n in names}
        for kind in ("miss", "hit"):
            cpu_at[kind] = {n: _cpu_ns(procs[n].pid) for n in names}
            oncpu_at[kind] = {n: _oncpu_ns(procs[n].pid) for n in names}
            children_at[kind] = {n: sum(_cpu_ns(c) for c in children[n]) for n in names}
            for i, text in enumerate(texts):
                shuffle.shuffle(names)
                for name in names:
                    started = time.perf_counter()
                    response = clients[name].post(TOPK, json=body(text))
                    times[name][kind].append((time.perf_counter() - started) * 1000.0)
                    if response.status_code != 200:
                        raise SystemExit(f"{name}: {response.status_code} {response.text}")
                if i % 50 == 49:
                    load_during.append(os.getloadavg()[0])
                    # Prometheus' visit, untimed: the servers with metrics fold their
                    # queue in here, off the timed requests (as they would in service).
                    for name in names:
                        if VARIANTS[name]["ORRERY_METRICS"] == "true":
                            started = time.perf_counter()
                            before = _oncpu_ns(procs[name].pid)
                            scraped = clients[name].get("/metrics")
                            scrapes[name].append((time.perf_counter() - started) * 1000.0)
                            scrape_oncpu[kind][name] += _oncpu_ns(procs[name].pid) - before
                            if scraped.status_code != 200:
                                raise SystemExit(f"{name}: /metrics {scraped.status_code}")
        cpu_at["end"] = {n: _cpu_ns(procs[n].pid) for n in names}
        oncpu_at["end"] = {n: _oncpu_ns(procs[n].pid) for n in names}
        oncpu: dict[str, dict[str, float]] = {}
        children_at["end"] = {n: sum(_cpu_ns(c) for c in children[n]) for n in names}
        server_cpu: dict[str, dict[str, float]] = {}
        children_cpu: dict[str, dict[str, float]] = {}
        for kind, after in (("miss", "hit"), ("hit", "end")):
            server_cpu[kind] = {
                n: round((cpu_at[after][n] - cpu_at[kind][n]) / 1000.0 / len(texts), 1)
                for n in names
            }
            oncpu[kind] = {
                n: round(
                    (oncpu_at[after][n] - oncpu_at[kind][n] - scrape_oncpu[kind][n])
                    / 1000.0
                    / len(texts),
                    1,
                )
                for n in names
            }
            children_cpu[kind] = {
                n: round((children_at[after][n] - children_at[kind][n]) / 1000.0 / len(texts), 1)
                for n in names
                if children[n]
            }
        rng = np.random.default_rng(25)
        _stop(procs.pop("metrics+spans"))  # its exporter child exports what it holds
        out: dict[str, Any] = {
            "load1_during": [round(x, 2) for x in load_during],
            "otlp_spans_received": len(receiver.received()),
            "server_cpu_us_per_request": server_cpu,
            "server_cpu_over_off_pct": {
                kind: {n: round((v / row["off"] - 1) * 100, 2) for n, v in row.items()}
                for kind, row in server_cpu.items()
            },
            "children_cpu_us_per_request": children_cpu,
            # Nanosecond on-CPU time of the server's live threads (schedstat), the
            # scrapes' own time taken out: finer than the clock ticks above.
            "server_oncpu_us_per_request_without_scrapes": oncpu,
            "server_oncpu_over_off_pct": {
                kind: {n: round((v / row["off"] - 1) * 100, 2) for n, v in row.items()}
                for kind, row in oncpu.items()
            },
            "scrape_every_texts": 50,
            "scrape_p50_ms": {n: round(statistics.median(v), 2) for n, v in scrapes.items() if v},
        }
        for kind in ("miss", "hit"):
            row: dict[str, Any] = {}
            base = times["off"][kind]
            base_p50 = float(np.percentile(base, 50))
            for name in names:
                values = times[name][kind]
                p50, p95 = np.percentile(values, [50, 95])
                row[name] = {"p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3)}
                if name != "off":
                    row[name]["overhead_p50_pct"] = round((float(p50) / base_p50 - 1) * 100, 2)
                    row[name]["paired"] = _paired(
                        [a - b for a, b in zip(values, base, strict=True)], rng
                    )
            out[kind] = row
        return out
    finally:
        for client in clients.values():
            client.close()
        for proc in procs.values():
            _stop(proc)
        receiver.close()
        shutil.rmtree(root, ignore_errors=True)


# --- report -----------------------------------------------------------------------------


def _plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    micro_cpu = result["micro"]["over_off_cpu_us"]
    names = [n for n in micro_cpu if n not in ("off",)]
    bars = left.bar(names, [micro_cpu[n] for n in names], color="#4c72b0")
    left.bar_label(bars, fmt="%+.1f", fontsize=8)
    left.set_yscale("symlog", linthresh=10)
    left.set_ylabel("µs of the request's thread over `off` (CPU, median)")
    left.set_title("In process: cost per one-shot request")
    left.tick_params(axis="x", rotation=30)
    e2e = result.get("end_to_end")
    if e2e:
        variants = [n for n in VARIANTS if n != "off"]
        width = 0.38
        xs = np.arange(len(variants))
        for k, (kind, color) in enumerate((("miss", "#dd8452"), ("hit", "#55a868"))):
            label = f"{kind} (off p50 {e2e[kind]['off']['p50_ms']:.2f} ms)"
            heights = [e2e[kind][n]["overhead_p50_pct"] for n in variants]
            right.bar(xs + (k - 0.5) * width, heights, width, label=label, color=color)
        right.axhline(3.0, color="red", linestyle="--", linewidth=1, label="3 % target")
        right.axhline(-3.0, color="red", linestyle="--", linewidth=1)
        right.axhline(0.0, color="black", linewidth=0.5)
        right.set_xticks(xs, variants, rotation=30)
        right.set_ylabel("p50 over `off` (%)")
        during = e2e["load1_during"]
        right.set_title(f"HTTP one-shot, interleaved (load {min(during)}-{max(during)})")
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--micro", type=int, default=20_000, help="calls per variant")
    parser.add_argument("--queries", type=int, default=300, help="texts per server and kind")
    parser.add_argument("--warmup", type=int, default=30, help="requests per server first")
    parser.add_argument("--skip-e2e", action="store_true", help="the micro part only")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "metrics_overhead.json"
    )
    args = parser.parse_args(argv)
    load: Callable[[], str] = lambda: Path("/proc/loadavg").read_text().strip()  # noqa: E731
    result: dict[str, Any] = {
        "bench": "metrics_overhead",
        "when": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "nice": os.nice(0),
        "loadavg_before": load(),
    }
    result["micro"] = micro(args.micro)
    micro_ = result["micro"]
    print("micro, median us per request (wall | CPU of the request thread | CPU over off | "
          "wall until the response left):")  # fmt: skip
    for name in micro_["wall_us"]:
        print(f"  {name:18} {micro_['wall_us'][name]:8.2f} | {micro_['cpu_us'][name]:8.2f} | "
              f"{micro_['over_off_cpu_us'][name]:+8.2f} | "
              f"{micro_['to_response_us'][name]:8.2f}")  # fmt: skip
    print(f"  off the request thread: a scrape folds {micro_['scrape_fold_us_per_request']} us "
          f"per request, an access line costs {micro_['access_line_process_cpu_us']} us of "
          f"the process, the span shipper {micro_['span_shipper_process_cpu_us']} us of "
          f"the process and the exporter child {micro_['span_child_cpu_us']} us per "
          "sampled request")  # fmt: skip
    if not args.skip_e2e:
        result["end_to_end"] = end_to_end(args.queries, args.warmup)
        for kind in ("miss", "hit"):
            row = result["end_to_end"][kind]
            for name in VARIANTS:
                cell = row[name]
                extra = ""
                if name != "off":
                    paired = cell["paired"]
                    extra = (f" | p50 {cell['overhead_p50_pct']:+6.2f} % | paired median "
                             f"{paired['median_ms']:+.3f} ms {paired['ci95_ms']}")  # fmt: skip
                print(f"{kind:4} {name:16} p50 {cell['p50_ms']:8.3f} ms p95 "
                      f"{cell['p95_ms']:8.3f}{extra}")  # fmt: skip
        print("scrape p50 ms (untimed, every 50 texts):", result["end_to_end"]["scrape_p50_ms"])
        print("spans received over OTLP:", result["end_to_end"]["otlp_spans_received"])
        e2e = result["end_to_end"]
        print("server process CPU us per request:", e2e["server_cpu_us_per_request"])
        print("  over off (%):", e2e["server_cpu_over_off_pct"])
        print("  its children's:", e2e["children_cpu_us_per_request"])
        print("on-CPU us per request without scrapes (schedstat):",
              e2e["server_oncpu_us_per_request_without_scrapes"])  # fmt: skip
        print("  over off (%):", e2e["server_oncpu_over_off_pct"])
    result["loadavg_after"] = load()
    print("loadavg", result["loadavg_before"], "->", result["loadavg_after"])
    write_json(args.out, result)
    draw_chart(_plot, result, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
