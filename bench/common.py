"""Shared helpers of the benchmarks: a real `orrery serve` on loopback, wire metering,
latency summaries, machine facts and a global deadline.

Benchmarks only ever talk to 127.0.0.1: the server is started here on a free loopback
port, and every client is built with `trust_env=False` so no proxy variable can route a
request elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import httpx
import numpy as np

__all__ = [
    "LOOPBACK",
    "REPO_ROOT",
    "WRITE_WORKER_MODULE",
    "BenchTimeout",
    "Exchange",
    "ServeProcess",
    "child_processes",
    "deadline",
    "drop_harness_resources",
    "exchange",
    "free_port",
    "git_facts",
    "harness_servers_env",
    "ingest_env",
    "latency_summary",
    "machine_facts",
    "median",
    "poll_readiness",
    "post_records",
    "publish",
    "serve",
    "source_digest",
    "utc_now",
    "write_json",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
# The embedded server's write worker processes (`ORRERY_INGEST_WORKERS`), by command line.
WRITE_WORKER_MODULE = "ingest.entrypoints.write_worker"
LOOPBACK = "127.0.0.1"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Unavailable)\b")
_SOURCE_PACKAGES = ("contracts", "ingest", "orrery", "projector", "query")
_PACKAGES = ("qdrant-edge-py", "tantivy", "onnxruntime", "fastapi", "uvicorn", "httpx")


class BenchTimeout(Exception):
    """The benchmark's global deadline passed."""


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise `BenchTimeout` in the main thread after `seconds` (SIGALRM), even while a
    socket read blocks, so `finally` blocks still stop servers and delete temp dirs."""

    def _expired(_signum: int, _frame: FrameType | None) -> None:
        raise BenchTimeout(f"the benchmark exceeded its global timeout of {seconds} s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServeProcess:
    """One `orrery serve` child process on a loopback port, logging into `log_path`."""

    data_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self, timeout_s: float = 120.0) -> httpx.Client:
        """A keep-alive client bound to this server; proxies from the environment ignored."""
        return httpx.Client(base_url=self.base_url, timeout=timeout_s, trust_env=False)

    def memory_kb(self) -> dict[str, int]:
        """Current (`VmRSS`) and peak (`VmHWM`) resident set size from /proc, in KiB."""
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process (all its threads) used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def reaped_children_cpu_seconds(self) -> float:
        """User + system CPU time of the server's children that ended and were waited for
        (`cutime` + `cstime`: e.g. the embedded optimizer's build children)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def worker_cpu_seconds(self, module: str = WRITE_WORKER_MODULE) -> float:
        """User + system CPU time of the server's live child processes running `module`
        (the embedded write workers, `ORRERY_INGEST_WORKERS`), summed; 0.0 without."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for child in child_processes(self.pid):
            if module not in child["command"]:
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{child['pid']}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def thread_cpu_seconds(self) -> dict[int, float]:
        """User + system CPU time of each live thread of the server (native id -> s)."""
        out: dict[int, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                stat = Path(f"/proc/{self.pid}/task/{tid}/stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            fields = stat.rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def thread_names(self) -> dict[int, str]:
        """Python's name of each Python thread of the server (native id -> name), from
        `py-spy dump` (the OS names them all alike); {} without py-spy."""
        spy = py_spy_path()
        if spy is None:
            return {}
        dump = subprocess.run(
            [str(spy), "dump", "--pid", str(self.pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        return {
            int(tid, 0): name
            for tid, name in re.findall(r'Thread (\S+) \([^)]*\): "([^"]*)"', dump)
        }

    def log_problems(self, limit: int = 20) -> list[str]:
        """The last `limit` ERROR lines and exception lines of the server log."""
        lines = [
            line
            for line in self.log_text().splitlines()
            if " ERROR " in line or _EXCEPTION_LINE.match(line)
        ]
        return lines[-limit:]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if needed; returns the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return self.process.returncode


def start_serve(
    data_dir: Path,
    log_path: Path,
    env: Mapping[str, str],
    startup_s: float = 180.0,
    tree: Path = REPO_ROOT,
) -> ServeProcess:
    """`orrery serve` on `data_dir` (created or reused) and a free loopback port, with
    `env` over this environment minus its `ORRERY_*` variables; returns once `/healthz`
    answers. Raises `RuntimeError` with the log tail when it exits or never answers."""
    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    child_env.update({"ORRERY_HOST": LOOPBACK, "PYTHONUNBUFFERED": "1", **env})
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orrery.cli",
                "serve",
                "--data-dir",
                str(data_dir),
                "--host",
                LOOPBACK,
                "--port",
                str(port),
            ],
            # `python -m` imports the code of its working directory first: `tree`.
            cwd=tree,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
        )
    server = ServeProcess(data_dir, port, process, log_path)
    stop_at = time.monotonic() + startup_s
    with server.client(timeout_s=5.0) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"orrery serve exited at startup:\n{server.log_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/healthz").status_code == 200:
                    return server
            if time.monotonic() > stop_at:
                server.stop()
                raise RuntimeError(f"orrery serve did not start:\n{server.log_text()[-3000:]}")
            time.sleep(0.1)


@contextlib.contextmanager
def serve(
    env: Mapping[str, str],
    *,
    keep_data: bool = False,
    startup_s: float = 120.0,
    root: Path | None = None,
) -> Iterator[ServeProcess]:
    """A fresh `orrery serve` on a fresh temp data dir; stopped and deleted on exit.

    With `root`, the server runs on `root/data` (created or reused) and `root` is kept."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        keep_data = True
    else:
        root = Path(tempfile.mkdtemp(prefix="orrery-bench-"))
    server: ServeProcess | None = None
    try:
        server = start_serve(root / "data", root / "serve.log", env, startup_s)
        yield server
    except BaseException:
        if server is not None:
            print(f"--- server log (tail) ---\n{server.log_text()[-6000:]}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.stop()
        if keep_data:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def stop_processes(processes: Sequence[subprocess.Popen[Any]], timeout_s: float = 60.0) -> None:
    """Terminate every process still running, wait for each, kill what does not stop."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()


def py_spy_path() -> Path | None:
    """The `py-spy` beside this interpreter, else the one on PATH (e.g. installed with
    `pip install --target DIR py-spy`, DIR/bin on PATH); None if there is none."""
    spy = Path(sys.executable).with_name("py-spy")
    if spy.exists():
        return spy
    found = shutil.which("py-spy")
    return None if found is None else Path(found)


def ingest_env(batch_size: int) -> dict[str, str]:
    """`orrery serve` environment for a corpus POSTed `batch_size` records at a time."""
    return {
        "ORRERY_MAX_BATCH": str(batch_size),
        # Batches with 384-d vectors (up to ~8 KB of JSON a record) exceed the default
        # body limit: allow 16 KB a record.
        "ORRERY_MAX_BODY_BYTES": str(max(4, batch_size * 16 // 1024) * 1024 * 1024),
    }


def poll_readiness(
    server: ServeProcess, client: httpx.Client, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """`GET /v1/readiness` every 0.1 s until `done(readiness)` (which may also show
    progress); returns that readiness. `RuntimeError` with the log tail if the server
    exits meanwhile."""
    while True:
        ready: dict[str, Any] = client.get("/v1/readiness").json()
        if done(ready):
            return ready
        if server.process.poll() is not None:
            raise RuntimeError(f"orrery serve died:\n{server.log_text()[-3000:]}")
        time.sleep(0.1)


def child_processes(pid: int) -> list[dict[str, Any]]:
    """Live child processes of `pid` (from /proc): pid, command line, peak RSS in KiB."""
    out: list[dict[str, Any]] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            child = int(stat.parent.name)
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        peak = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")),
            0,
        )
        out.append({"pid": child, "command": command[:120], "VmHWM_kb": peak})
    return out


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request/response pair as seen by the client.

    Byte counts are HTTP/1.1 as framed on the wire: bodies exactly (`request.content`,
    `response.content`; the server sends no content-encoding), headers rebuilt from the
    request line / status line and `Name: value` lines (exact for HTTP/1.1 without
    chunked encoding, which these JSON responses never use).
    """

    seconds: float
    response: httpx.Response
    sent_body: int
    sent_headers: int
    received_body: int
    received_headers: int

    @property
    def sent(self) -> int:
        return self.sent_body + self.sent_headers

    @property
    def received(self) -> int:
        return self.received_body + self.received_headers

    def json(self) -> Any:
        return self.response.json()


def exchange(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    body: Any = None,
    content: bytes | None = None,
    params: Mapping[str, str] | None = None,
) -> Exchange:
    """Send one request and time it until the whole response body has been read.

    JSON bodies are encoded before the clock starts, so client-side encoding of large
    requests is excluded from the latency; response decoding happens after it stops.
    """
    headers: dict[str, str] = {}
    if body is not None:
        content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    if content is not None:
        headers["content-type"] = "application/json"
    request = client.build_request(method, url, content=content, params=params, headers=headers)
    started = time.perf_counter()
    response = client.send(request)
    seconds = time.perf_counter() - started
    if response.headers.get("content-encoding"):
        raise RuntimeError("unexpected content-encoding: byte counts would be off")
    return Exchange(
        seconds=seconds,
        response=response,
        sent_body=len(request.content),
        sent_headers=_request_head_bytes(request),
        received_body=len(response.content),
        received_headers=_response_head_bytes(response),
    )


def ask_topk(
    client: httpx.Client, *, body: Any = None, content: bytes | None = None
) -> tuple[Exchange, dict[str, Any]]:
    """One timed `topk_records` request (`exchange`) and its decoded answer; any status
    but 200 raises."""
    ex = exchange(client, "POST", "/v1/external/retrieve/topk_records", body=body, content=content)
    if ex.response.status_code != 200:
        raise RuntimeError(
            f"topk_records: HTTP {ex.response.status_code}: {ex.response.text[:300]}"
        )
    answer: dict[str, Any] = ex.json()
    return ex, answer


def post_records(
    client: httpx.Client, records: Any, *, max_wait_s: float = 900.0
) -> httpx.Response:
    """`POST /v1/records` as a well-behaved producer: a `503 ingest_backlog` (the
    embedded projector is too far behind; nothing was written) is sent again after its
    `Retry-After`, for at most `max_wait_s`. Any other answer is returned as it is.
    `records`: the records, or their JSON already encoded (bytes)."""
    deadline_at = time.monotonic() + max_wait_s
    while True:
        if isinstance(records, bytes):
            response = client.post(
                "/v1/records", content=records, headers={"content-type": "application/json"}
            )
        else:
            response = client.post("/v1/records", json=records)
        backlog = response.status_code == 503 and (
            response.json().get("error", {}).get("code") == "ingest_backlog"
        )
        if not backlog or time.monotonic() >= deadline_at:
            return response
        time.sleep(float(response.headers.get("retry-after", "1")))


def _request_head_bytes(request: httpx.Request) -> int:
    line = len(request.method) + 1 + len(request.url.raw_path) + len(" HTTP/1.1\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in request.headers.raw) + 2


def _response_head_bytes(response: httpx.Response) -> int:
    line = len(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in response.headers.raw) + 2


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if values else float("nan")


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 / mean / min / max in milliseconds (linear-interpolated percentiles)."""
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(ms.mean()), 3),
        "min": round(float(ms.min()), 3),
        "max": round(float(ms.max()), 3),
        "n": int(ms.size),
    }


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    versions: dict[str, str] = {}
    for package in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "packages": versions,
    }


def interpreter_speed(trials: int = 7) -> dict[str, float]:
    """How fast this VM runs two fixed workloads now, the median and the best ms of
    `trials` runs each: one interpreter loop (`loop_*`, ~16 ms on the `polyglot` machine)
    and 2M random reads from a 256 MiB array (`memory_*`, bound by memory latency as a
    1M index's searches are). The same code's server CPU per query moved 18 -> 50 ms
    within two hours (session 34) with nothing else running and no steal time reported,
    while the loop moved by a tenth: record both beside every measurement, and compare
    runs whose figures agree."""
    loops: list[float] = []
    for _ in range(trials):
        started = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        loops.append((time.perf_counter() - started) * 1000)
    table = np.arange(32 * 1024 * 1024, dtype=np.int64)
    picks = np.random.default_rng(7).integers(0, len(table), 2_000_000)
    reads: list[float] = []
    for _ in range(trials):
        started = time.perf_counter()
        table.take(picks).sum()
        reads.append((time.perf_counter() - started) * 1000)
    loops.sort()
    reads.sort()
    return {
        "loop_median_ms": round(loops[len(loops) // 2], 2),
        "loop_best_ms": round(loops[0], 2),
        "memory_median_ms": round(reads[len(reads) // 2], 2),
        "memory_best_ms": round(reads[0], 2),
    }


def git_facts() -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        return result.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def source_digest() -> str:
    """sha256 over the server's Python sources as they are on disk now (the tree may be
    edited between runs; this names exactly what a server started now imports)."""
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def publish(
    out: Path,
    report: Any,
    figures: Any,
    plot: Callable[[Any, Path], None],
    table: Callable[[Any], None],
) -> None:
    """Write `report` to `out`, then `plot(figures, <out>.png)` (with matplotlib) and
    `table(figures)`."""
    png = out.with_suffix(".png")
    write_json(out, report)
    draw_chart(plot, figures, png)
    table(figures)
    print(f"wrote {out} and {png}")


def harness_servers_env(label: str = "bench") -> dict[str, str]:
    """`orrery serve` environment for server mode on the local harness
    (`tests/harness/servers.py`): its Kafka, OpenSearch, Qdrant server and Redis, with
    Kafka topics and group, OpenSearch indexes and Qdrant collections named uniquely for
    this run.

    Raises `SystemExit` naming the harness servers that are not running."""
    from tests.harness.servers import server_urls

    urls = server_urls()
    missing = [name for name, url in urls.items() if not url]
    if missing:
        raise SystemExit(f"harness servers not running: {missing} (make servers-up)")
    tag = f"orrery-{label}-{uuid.uuid4().hex[:8]}"
    return {
        "ORRERY_MODE": "servers",
        "ORRERY_KAFKA_BOOTSTRAP": str(urls["kafka"]),
        "ORRERY_OPENSEARCH_URL": str(urls["opensearch"]),
        "ORRERY_REDIS_URL": str(urls["redis"]),
        "ORRERY_QDRANT_URL": str(urls["qdrant"]),
        "ORRERY_KAFKA_TOPIC_PREFIX": f"{tag}.records",
        "ORRERY_KAFKA_GROUP": tag,
        "ORRERY_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "ORRERY_OPENSEARCH_INDEX_PREFIX": tag,
        "ORRERY_QDRANT_COLLECTION_PREFIX": tag,
    }


def drop_harness_resources(env: Mapping[str, str]) -> None:
    """Delete the OpenSearch indexes, Kafka topics and consumer group that
    `harness_servers_env` named for this run (Redis entries expire by themselves)."""
    prefix = env["ORRERY_OPENSEARCH_INDEX_PREFIX"]
    with httpx.Client(base_url=env["ORRERY_OPENSEARCH_URL"], timeout=60, trust_env=False) as os_:
        listed = os_.get(f"/_cat/indices/{prefix}-*", params={"format": "json", "h": "index"})
        for row in listed.json() if listed.status_code == 200 else []:
            os_.delete(f"/{row['index']}")
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=env["ORRERY_KAFKA_BOOTSTRAP"])
    try:
        topic_prefix = env["ORRERY_KAFKA_TOPIC_PREFIX"]
        topics = [t for t in admin.list_topics() if t.startswith(topic_prefix)]
        if topics:
            admin.delete_topics(topics)
        with contextlib.suppress(Exception):  # absent when no consumer ever joined
            admin.delete_groups([env["ORRERY_KAFKA_GROUP"]])
    finally:
        admin.close()


def draw_chart(draw: Callable[..., None], *args: Any) -> bool:
    """Call a chart function (`matplotlib` is an optional extra of the benchmarks): without
    matplotlib print how to get the PNG and return False, after the JSON was written."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        print("matplotlib is not installed: no PNG written (pip install matplotlib, or .[dev])")
        return False
    draw(*args)
    return True


def run_and_publish(
    benchmark: str,
    run: Callable[[], Mapping[str, Any]],
    *,
    timeout_s: int,
    out: Path,
    plot: Callable[[Any, Path], None],
    table: Callable[[Any], None],
) -> int:
    """A bench's `main`: `run()` under `deadline(timeout_s)`, then its figures under the
    common header (benchmark, date, git, machine) published to `out` (JSON, PNG, table).
    Answers the process exit code: 1 when the deadline stopped the run."""
    git = git_facts()  # before the run: others may edit the tree meanwhile
    started_at = utc_now()
    try:
        with deadline(timeout_s):
            figures = run()
    except BenchTimeout as error:
        print(f"{error}", file=sys.stderr)
        return 1
    report = {
        "benchmark": benchmark,
        "date": started_at,
        "git": git,
        "machine": machine_facts(),
        **figures,
    }
    publish(out, report, report, plot, table)
    return 0


def latency_bars(
    report: Mapping[str, Any],
    path: Path,
    *,
    label: Callable[[str, Mapping[str, Any]], str],
    title: str,
    figsize: tuple[float, float] = (10, 4.6),
) -> None:
    """Grouped bars of p50/p95/p99 per path of `report["paths"]` (each with
    `latency_ms`), written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["paths"])
    stats = ("p50", "p95", "p99")
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.8 / len(names)
    x = np.arange(len(stats))
    for k, name in enumerate(names):
        figures = report["paths"][name]
        values = [figures["latency_ms"][s] for s in stats]
        bars = ax.bar(
            x + (k - (len(names) - 1) / 2) * width, values, width, label=label(name, figures)
        )
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=7, padding=2)
    ax.set_xticks(x, stats)
    ax.set_ylabel("ms per query, client-side")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def edge_adapter(path: str | None) -> ModuleType:
    """The embedded projector's qdrant-edge adapter module: this tree's, or the file at
    `path` (another tree's `projector/adapters/qdrant_edge_vectors.py`, for an A/B of
    two versions in one process)."""
    if path is None:
        from projector.adapters import qdrant_edge_vectors

        return qdrant_edge_vectors
    spec = importlib.util.spec_from_file_location("edge_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["edge_under_test"] = module
    spec.loader.exec_module(module)
    return module


def print_report(report: Mapping[str, Any], out: Path | None) -> None:
    """An A/B bench's report as indented JSON on stdout, and in `out` if given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
