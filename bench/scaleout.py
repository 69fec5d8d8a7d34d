"""Server mode as separate processes (issue 13), for `bench/servers.py --scaleout`.

Every role is its own `orrery` process on this machine: `ingest-api`, R relays, P
projectors (one Kafka consumer group) and W query workers, against the harness's Kafka,
OpenSearch, **Qdrant server**, Redis and — for the `postgres` backend — PostgreSQL (a
new database per deployment, dropped afterwards). The `sqlite` backend is single-host
server mode: the same roles sharing the SQLite file of one data dir (one relay: the
SQLite outbox reader is not made for several).

Per deployment:
- **ingest**: N records of `bench/topk.py`'s corpus with precomputed vectors (nothing is
  embedded) POSTed in batches; records/s = N / (first POST → readiness shows N applied,
  no outbox lag, a current projector log lag of 0).
Then, on the `postgres` deployment with 2 relays and 2 projectors:
- **freshness lag**: one new record at a time, POST returned → first visible in a
  lexical-only `topk_records` poll;
- **top-k**: `topk_records` with the default profile through OpenSearch + the Qdrant server
  (response cache off, query vectors warmed, after the Qdrant collection is `green`:
  HNSW built), p50/p95 and each stage's share of the server-side total
  (`query_plan.latency_ms`);
- **qps with 1 vs 2 query workers**: C client threads for D seconds each; the load
  generator is the round-robin proxy (each request goes to the next worker's URL, no
  extra hop). Every process shares the machine's CPUs with the servers and the load
  generator, which bounds what a second worker can add.

Figures are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import (
    LOOPBACK,
    REPO_ROOT,
    ServeProcess,
    drop_harness_resources,
    exchange,
    free_port,
    harness_servers_env,
    ingest_env,
    latency_summary,
    stop_processes,
)
from bench.topk import QuerySpec, Vocabulary, bench_scopes, corpus_batches, make_queries, topk_body

__all__ = ["run_scaleout"]

CURSOR_KEYS = "bench:scaleout-bench-secret-0123456789"
REQUEST_TIMEOUT_S = 60.0
FRESH_TIMEOUT_S = 60.0
PLANS = (("sqlite", 1, 1), ("postgres", 1, 1), ("postgres", 2, 2))
STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")


@dataclass
class Deployment:
    """The processes of one deployment; stopped together."""

    root: Path
    env: dict[str, str]
    ingest: ServeProcess
    workers: list[ServeProcess]
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Each relay's and projector's `ORRERY_METRICS_PORT` (role name → metrics URL).
    metrics: dict[str, str] = field(default_factory=dict)


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    child = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    child.update({"ORRERY_HOST": LOOPBACK, "PYTHONUNBUFFERED": "1", **env})
    return child


def _spawn(
    command: str, data_dir: Path, log: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "orrery.cli", command, "--data-dir", str(data_dir)],
            cwd=REPO_ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=_child_env(env),
        )


def _http_role(command: str, data_dir: Path, log: Path, env: Mapping[str, str]) -> ServeProcess:
    port = free_port()
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orrery.cli",
                command,
                "--data-dir",
                str(data_dir),
                "--host",
                LOOPBACK,
                "--port",
                str(port),
            ],
            cwd=REPO_ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=_child_env(env),
        )
    server = ServeProcess(data_dir, port, process, log)
    stop_at = time.monotonic() + 300
    with server.client(timeout_s=5.0) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"orrery {command} exited:\n{server.log_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/healthz").status_code == 200:
                    return server
            if time.monotonic() > stop_at:
                server.stop()
                raise RuntimeError(f"orrery {command} did not start:\n{server.log_text()[-3000:]}")
            time.sleep(0.1)


@contextlib.contextmanager
def _database(enabled: bool) -> Iterator[str | None]:
    """A new PostgreSQL database on the harness (dropped afterwards), or None."""
    if not enabled:
        yield None
        return
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tests.harness.servers import server_urls

    server = str(server_urls()["postgres"])
    name = f"orrery_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield make_conninfo("", **{**conninfo_to_dict(server), "dbname": name})
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@contextlib.contextmanager
def deployed(
    backend: str,
    *,
    relays: int,
    projectors: int,
    workers: int,
    batch_size: int,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Deployment]:
    """Every role its own process on the harness servers; `extra_env` (ORRERY_*
    settings such as ORRERY_KAFKA_CLIENT) is given to every role."""
    from tests.harness.servers import server_urls

    root = Path(tempfile.mkdtemp(prefix="orrery-scaleout-"))
    env: dict[str, str] = {
        **harness_servers_env("scaleout"),
        **ingest_env(batch_size),
        "ORRERY_QDRANT_URL": str(server_urls()["qdrant"]),
        "ORRERY_CURSOR_KEYS": CURSOR_KEYS,
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "86400",
        "ORRERY_ADMIN_KEY": "bench-admin",
        **(extra_env or {}),
    }
    with _database(backend == "postgres") as url:
        if url is not None:
            env["ORRERY_DATABASE_URL"] = url
        shared = root / "data"  # SQLite: every role of the host shares it
        dirs = itertools.count()

        def data_dir() -> Path:
            return shared if url is None else root / f"role{next(dirs)}"

        deployment: Deployment | None = None
        started: list[subprocess.Popen[bytes]] = []
        metrics: dict[str, str] = {}

        def spawn(command: str, name: str) -> subprocess.Popen[bytes]:
            # Its own metrics port: the calls a role made are read from its counters.
            port = free_port()
            metrics[name] = f"http://{LOOPBACK}:{port}/metrics"
            role_env = {**env, "ORRERY_METRICS_PORT": str(port)}
            return _spawn(command, data_dir(), root / f"{name}.log", role_env)

        try:
            ingest = _http_role("ingest-api", data_dir(), root / "ingest.log", env)
            started.append(ingest.process)
            for i in range(relays):
                started.append(spawn("relay", f"relay{i}"))
            for i in range(projectors):
                started.append(spawn("project", f"project{i}"))
            served = []
            for i in range(workers):
                served.append(_http_role("query-worker", data_dir(), root / f"worker{i}.log", env))
                started.append(served[-1].process)
            deployment = Deployment(
                root, env, ingest, served, started[1 : 1 + relays + projectors], metrics
            )
            yield deployment
        finally:
            stop_processes(started)
            drop_harness_resources(env)
            _drop_qdrant(env)


def _drop_qdrant(env: Mapping[str, str]) -> None:
    prefix = env["ORRERY_QDRANT_COLLECTION_PREFIX"]
    with httpx.Client(base_url=env["ORRERY_QDRANT_URL"], timeout=60, trust_env=False) as client:
        listed = client.get("/collections").json()["result"]["collections"]
        for collection in listed:
            if collection["name"].startswith(prefix):
                client.delete(f"/collections/{collection['name']}")


def _applied(ready: Mapping[str, Any], size: int) -> bool:
    scopes = bench_scopes(ready)
    log = ready.get("projector_log")
    return (
        len(scopes) == 1
        and scopes[0]["document_count"] == size
        and scopes[0]["lag_events"] == 0
        and log is not None
        and log["current"]
        and log["lag_events"] == 0
    )


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree_cpu_seconds(pid: int, skip: frozenset[int] = frozenset()) -> float:
    """CPU seconds (user + system) of `pid`, its waited-for children and its live
    descendants but those in `skip` and theirs (PostgreSQL's backends; a JVM's threads
    are in the process itself); 0 for a process that is gone."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        each = int(stat.parent.name)
        parents[each] = int(fields[1])
        # utime, stime, cutime, cstime (fields 14-17 of proc(5); fields[0] is field 3)
        times[each] = sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS
    total, todo = 0.0, [pid]
    while todo:
        each = todo.pop()
        total += times.get(each, 0.0)
        todo.extend(c for c, parent in parents.items() if parent == each and c not in skip)
    return total


def _cpu_roles(deployment: Deployment) -> dict[str, int]:
    """The processes whose CPU an ingest costs: every role of the deployment, each
    harness server (from its servers.json) and this load generator."""
    from tests.harness.servers import server_status

    roles = {"ingest-api": deployment.ingest.process.pid, "bench (load generator)": os.getpid()}
    for process in deployment.others:
        name = "relay" if isinstance(process.args, list) and "relay" in process.args else "project"
        count = sum(1 for k in roles if k.startswith(name))
        roles[f"{name}{count}"] = process.pid
    for i, worker in enumerate(deployment.workers):
        roles[f"query-worker{i}"] = worker.process.pid
    for name, server in server_status().items():
        if server["pid"] is not None:
            roles[name] = server["pid"]
    return roles


def _cpu_snapshot(roles: Mapping[str, int]) -> dict[str, float]:
    pids = frozenset(roles.values())
    return {name: _tree_cpu_seconds(pid, pids) for name, pid in roles.items()}


def measure_ingest(deployment: Deployment, batches: Sequence[bytes], size: int) -> dict[str, Any]:
    """POST every batch to the ingest API, then poll a worker's readiness until all of
    it is applied. Also the CPU seconds per 1,000 records of each process (roles,
    servers, load generator) over that time: with every process on one machine, their
    sum bounds the throughput."""
    worker = deployment.workers[0]
    roles = _cpu_roles(deployment)
    xacts_before = _transactions(deployment)
    counters_before = _role_counters(deployment)
    cpu_before = _cpu_snapshot(roles)
    started = time.perf_counter()
    with deployment.ingest.client(REQUEST_TIMEOUT_S) as ingest:
        for body in batches:
            response = ingest.post(
                "/v1/records", content=body, headers={"content-type": "application/json"}
            )
            if response.status_code != 200:
                raise RuntimeError(f"POST /v1/records: {response.status_code}")
    posted = time.perf_counter() - started
    with worker.client(REQUEST_TIMEOUT_S) as client:
        while not _applied(ready := client.get("/v1/readiness").json(), size):
            for process in deployment.others:
                if process.poll() is not None:
                    raise RuntimeError(f"a role exited: {process.args!r}")
            if time.perf_counter() - started > 3600:
                raise RuntimeError(f"not applied after an hour: {ready}")
            time.sleep(0.1)
    applied = time.perf_counter() - started
    cpu_after = _cpu_snapshot(roles)
    per_1k = {name: round((cpu_after[name] - cpu_before[name]) * 1000 / size, 3) for name in roles}
    calls: dict[str, Any] = {
        "ingest-api": {"posts": len(batches), "per_1k": round(len(batches) * 1000 / size, 2)}
    }
    calls.update(_role_calls(deployment, size, counters_before))
    xacts = _transactions(deployment)
    if xacts is not None and xacts_before is not None:
        # Every role's transactions in the deployment's database (PostgreSQL flushes a
        # backend's counts about once a second: the last second may be missing).
        calls["postgres_transactions_per_1k"] = round((xacts - xacts_before) * 1000 / size, 1)
    return {
        "records": size,
        "post_seconds": round(posted, 3),
        "applied_seconds": round(applied, 3),
        "records_per_s": round(size / applied, 1),
        "post_records_per_s": round(size / posted, 1),
        "cpu_seconds_per_1k_records": per_1k,
        "cpu_seconds_per_1k_records_total": round(sum(per_1k.values()), 3),
        "cpu_utilisation_of_machine": round(
            sum(cpu_after[n] - cpu_before[n] for n in roles) / (applied * (os.cpu_count() or 1)),
            3,
        ),
        "calls": calls,
    }


def _scrape(url: str) -> dict[str, float]:
    """The unlabelled samples of a role's Prometheus text (name → value)."""
    out: dict[str, float] = {}
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(url, timeout=10, trust_env=False).text.splitlines():
            name, _, value = line.partition(" ")
            if line and not line.startswith("#") and "{" not in name:
                out[name] = float(value)
    return out


def _transactions(deployment: Deployment) -> int | None:
    """Committed plus rolled-back transactions of the deployment's database so far."""
    url = deployment.env.get("ORRERY_DATABASE_URL")
    if not url:
        return None
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return None if row is None else int(row[0])


def _percentiles(sizes: Sequence[int]) -> dict[str, float]:
    if not sizes:
        return {}
    return {f"p{q}": round(float(np.percentile(sizes, q)), 1) for q in (5, 50, 95)}


_COUNTERS = (
    "orrery_projector_batch_duration_seconds_count",
    "orrery_projector_events_applied_total",
    "orrery_projector_steps_total",
    "orrery_relay_steps_total",
)


def _role_counters(deployment: Deployment) -> dict[str, float]:
    """`_COUNTERS` summed over the relays and projectors (0 for a counter a tree lacks)."""
    totals = dict.fromkeys(_COUNTERS, 0.0)
    for url in deployment.metrics.values():
        samples = _scrape(url)
        for name in _COUNTERS:
            totals[name] += samples.get(name, 0.0)
    return totals


def _role_calls(
    deployment: Deployment, size: int, before: dict[str, float] | None = None
) -> dict[str, Any]:
    """How many calls each role made for the ingest, per 1k records: the projectors'
    applied batches (their metrics: `orrery_projector_batch_duration_seconds` counts the
    steps that applied events) and the relays' published batches (the outbox rows
    marked by one transaction share their `published_at`, PostgreSQL's transaction
    time), with the batch sizes. Each apply makes the same engine and registry calls
    whatever its size, so these count the per-call costs."""
    out: dict[str, Any] = {}
    after = _role_counters(deployment)
    # Counted over the measured window (from before the first POST) when `before` is given.
    batches, events, steps, relay_steps = (
        after[name] - (before or {}).get(name, 0.0) for name in _COUNTERS
    )
    out["projector"] = {
        "batches": int(batches),
        "events": int(events),
        "mean_batch": round(events / batches, 1) if batches else None,
        "per_1k": round(batches * 1000 / size, 2),
        # Every fetch, empty ones too (each measures the log's lag): a tree without the
        # counter reports 0.
        "steps": int(steps),
        "steps_per_1k": round(steps * 1000 / size, 2),
    }
    database = deployment.env.get("ORRERY_DATABASE_URL")
    if database:
        import psycopg

        with psycopg.connect(database) as conn:
            sizes = [
                int(n)
                for (n,) in conn.execute(
                    "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL "
                    "GROUP BY published_at ORDER BY 1"
                ).fetchall()
            ]
        out["relay"] = {
            # Every step, empty claims too (a tree without the counter reports 0).
            "steps": int(relay_steps),
            "steps_per_1k": round(relay_steps * 1000 / size, 2),
            "batches": len(sizes),
            "mean_batch": round(sum(sizes) / len(sizes), 1) if sizes else None,
            "batch_size": _percentiles(sizes),
            "per_1k": round(len(sizes) * 1000 / size, 2),
        }
    return out


def _verify_live(deployment: Deployment) -> dict[str, Any]:
    """One admin verify (full read-back), adopted by every worker: the scope becomes
    eligible without the scheduled re-check (switched off so it cannot land inside the
    measurements)."""
    worker = deployment.workers[0]
    with worker.client(600) as client:
        ready = client.get("/v1/readiness").json()
        (generation_id,) = {s["generation_id"] for s in bench_scopes(ready)}
        started = time.perf_counter()
        verified = client.post(
            f"/v1/admin/generations/{generation_id}/verify", headers={"x-admin-key": "bench-admin"}
        ).json()
    for each in deployment.workers:
        with each.client(30) as client:
            deadline = time.monotonic() + 120
            while not client.get("/v1/readiness").json()["ready"]:
                if time.monotonic() > deadline:
                    raise RuntimeError("a worker did not adopt the verify")
                time.sleep(0.2)
    return {
        "verified": verified.get("verified"),
        "verify_seconds": round(time.perf_counter() - started, 3),
    }


def _wait_vectors_indexed(deployment: Deployment, timeout_s: float = 1800.0) -> dict[str, Any]:
    """Wait until the Qdrant server finished indexing the live generation (collection
    status `green`: HNSW built, optimizers idle), so that no query is timed against a
    half-built index (at 100k the build outlasts the ingest)."""
    worker = deployment.workers[0]
    with worker.client(30) as client:
        (generation_id,) = {
            s["generation_id"] for s in bench_scopes(client.get("/v1/readiness").json())
        }
    name = f"{deployment.env['ORRERY_QDRANT_COLLECTION_PREFIX']}-{generation_id}"
    started = time.perf_counter()
    with httpx.Client(
        base_url=deployment.env["ORRERY_QDRANT_URL"], timeout=30, trust_env=False
    ) as qdrant:
        while True:
            info = qdrant.get(f"/collections/{name}").json()["result"]
            if info["status"] == "green":
                break
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(
                    f"collection {name} not green after {timeout_s} s: {info['status']}"
                )
            time.sleep(1.0)
    return {
        "status": info["status"],
        "indexed_vectors": info.get("indexed_vectors_count"),
        "points": info.get("points_count"),
        "wait_seconds": round(time.perf_counter() - started, 1),
    }


LEXICAL_ONLY: dict[str, Any] = {
    "profile": "weighted@1",
    "ranking": {
        "lexical_weight": 1.0,
        "vector_weight": 0.0,
        "freshness_weight": 0.0,
        "metadata_weight": 0.0,
    },
}


def measure_freshness(deployment: Deployment, count: int) -> dict[str, Any]:
    from bench.servers import _fresh_record

    worker = deployment.workers[0]
    run = f"{random.Random().getrandbits(40):010x}"
    lags: list[float] = []
    with (
        deployment.ingest.client(REQUEST_TIMEOUT_S) as ingest,
        worker.client(REQUEST_TIMEOUT_S) as client,
    ):
        for i in range(count):
            token = f"zq{run}x{i:04d}"
            body = {**topk_body(QuerySpec(token, None), 1), **LEXICAL_ONLY}
            client.post("/v1/external/retrieve/topk_records", json=body)
            response = ingest.post("/v1/records", json=[_fresh_record(i, token)])
            committed = time.perf_counter()
            if response.status_code != 200:
                raise RuntimeError(f"POST /v1/records: {response.status_code} {response.text}")
            while True:
                answer = client.post("/v1/external/retrieve/topk_records", json=body).json()
                if answer.get("results") and answer["results"][0]["item_id"] == f"fresh-{token}":
                    lags.append(time.perf_counter() - committed)
                    break
                if time.perf_counter() - committed > FRESH_TIMEOUT_S:
                    raise RuntimeError(f"record {token} not visible after {FRESH_TIMEOUT_S} s")
                time.sleep(0.005)
    return {
        "lag_ms": latency_summary(lags),
        "method": "POST returned (record + outbox committed) → first lexical-only topk_records "
        "poll (5 ms pause) that returns it; ingest-api → relay → Kafka → projector → "
        "OpenSearch refresh, each a separate process",
    }


def measure_topk(
    deployment: Deployment, queries: Sequence[QuerySpec], warmup: Sequence[QuerySpec]
) -> dict[str, Any]:
    worker = deployment.workers[0]
    seconds: list[float] = []
    stages: list[dict[str, float]] = []
    engines: list[dict[str, float]] = []
    with worker.client(REQUEST_TIMEOUT_S) as client:
        for query in (*warmup, *queries):  # query vectors cached: not measured
            client.post("/v1/external/retrieve/topk_records", json=topk_body(query, 10))
        for query in queries:
            ex = exchange(
                client, "POST", "/v1/external/retrieve/topk_records", body=topk_body(query, 10)
            )
            if ex.response.status_code != 200:
                raise RuntimeError(f"topk_records: {ex.response.status_code} {ex.response.text}")
            seconds.append(ex.seconds)
            plan = ex.json()["query_plan"]
            stages.append(plan["latency_ms"])
            engines.append(plan.get("engine_ms") or {})
    totals = sum(s["total"] for s in stages)
    engine_keys = sorted({k for e in engines for k in e})
    return {
        "profile": "default (weighted@3: BM25 from OpenSearch + vectors from the Qdrant server)",
        "latency_ms": latency_summary(seconds),
        "server_total_ms": latency_summary([s["total"] / 1000 for s in stages]),
        "stage_share_of_server_total": {
            stage: round(sum(s.get(stage, 0.0) for s in stages) / totals, 3) for stage in STAGES
        },
        "stage_ms_p50": {
            stage: round(float(np.percentile([s.get(stage, 0.0) for s in stages], 50)), 3)
            for stage in STAGES
        },
        # Engine calls as timed in the worker (`opensearch_search`, `qdrant_query`: wall
        # time incl. client library and network) and as the engines report them
        # (`opensearch_took`, `qdrant_time`), summed per query.
        "engine_ms": {
            key: {
                f"p{q}": round(float(np.percentile([e.get(key, 0.0) for e in engines], q)), 3)
                for q in (50, 95)
            }
            for key in engine_keys
        },
    }


def measure_qps(
    deployment: Deployment,
    queries: Sequence[QuerySpec],
    *,
    workers: int,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """`clients` threads send `topk_records` back to back for `seconds`; request i goes
    to worker i mod `workers` (the load generator is the round-robin proxy)."""
    urls = [w.base_url for w in deployment.workers[:workers]]
    turn = itertools.count()
    lock = threading.Lock()
    done: list[float] = []
    errors: list[str] = []
    stop_at = time.perf_counter() + seconds

    def run(seed: int) -> None:
        rng = random.Random(seed)
        pool = [httpx.Client(base_url=u, timeout=REQUEST_TIMEOUT_S, trust_env=False) for u in urls]
        try:
            while time.perf_counter() < stop_at:
                with lock:
                    index = next(turn) % len(pool)
                query = queries[rng.randrange(len(queries))]
                started = time.perf_counter()
                response = pool[index].post(
                    "/v1/external/retrieve/topk_records", json=topk_body(query, 10)
                )
                took = time.perf_counter() - started
                with lock:
                    if response.status_code == 200:
                        done.append(took)
                    else:
                        errors.append(f"{response.status_code}")
        finally:
            for client in pool:
                client.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {
        "workers": workers,
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(done),
        "errors": len(errors),
        "qps": round(len(done) / elapsed, 1),
        "latency_ms": latency_summary(done),
    }


def run_scaleout(
    size: int,
    *,
    batch_size: int,
    seed: int,
    queries: int,
    fresh: int,
    qps_seconds: float,
    clients: int,
    plans: Sequence[tuple[str, int, int]] = PLANS,
    ingest_only: bool = False,
) -> dict[str, Any]:
    """Every scale-out figure of the module doc; prints progress to stderr. `plans` are
    the ingest deployments (backend, relays, projectors); the query figures are taken on
    the last one unless `ingest_only`."""
    vocab = Vocabulary.build(random.Random(seed))
    query_rng = random.Random(seed + 1)
    warmup = make_queries(query_rng, vocab, 10)
    asked = make_queries(query_rng, vocab, queries)
    out: dict[str, Any] = {"size": size, "ingest": []}
    for backend, relays, projectors in plans:
        last = (backend, relays, projectors) == plans[-1] and not ingest_only
        print(
            f"scaleout: {backend} relays={relays} projectors={projectors} N={size}", file=sys.stderr
        )
        batches = list(corpus_batches(size, batch_size, seed, vocab))
        with deployed(
            backend,
            relays=relays,
            projectors=projectors,
            workers=2 if last else 1,
            batch_size=batch_size,
        ) as deployment:
            figures = measure_ingest(deployment, batches, size)
            del batches
            out["ingest"].append(
                {"backend": backend, "relays": relays, "projectors": projectors, **figures}
            )
            print(
                f"  ingest: {figures['records_per_s']} records/s "
                f"(POSTs {figures['post_records_per_s']}/s); CPU s per 1k records: "
                f"{figures['cpu_seconds_per_1k_records']}",
                file=sys.stderr,
            )
            if not last:
                continue
            out["eligibility"] = _verify_live(deployment)
            out["vectors_indexed"] = _wait_vectors_indexed(deployment)
            out["topk"] = measure_topk(deployment, asked, warmup)
            print(f"  topk: {out['topk']['latency_ms']}", file=sys.stderr)
            out["freshness"] = measure_freshness(deployment, fresh)
            print(f"  freshness: {out['freshness']['lag_ms']}", file=sys.stderr)
            out["qps"] = [
                measure_qps(deployment, asked, workers=n, clients=clients, seconds=qps_seconds)
                for n in (1, 2)
            ]
            print(f"  qps: {[q['qps'] for q in out['qps']]}", file=sys.stderr)
    return out
