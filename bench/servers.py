"""Server mode against embedded mode, in one run: ingest, freshness, top-k, start-up.

    .venv/bin/python bench/servers.py [--size 100000] [--server-size N] [--queries 100]
                                      [--fresh 30] [--out docs/bench/servers.json]
                                      [--skip-startup] [--scaleout [--scaleout-size N]
                                      [--qps-seconds 20] [--qps-clients 4]
                                      [--scaleout-plans sqlite:1:1,postgres:1:1,...]
                                      [--scaleout-ingest-only]]
                                      [--only-scaleout]

Run it under `flock /tmp/orrery-bench.lock` on a shared machine (`make bench-servers`
does). Needs the local harness (`make servers-up`): Kafka, OpenSearch, the Qdrant server
(1.16.3), Redis and PostgreSQL. The lexical-only profile (OpenSearch alone) shows the
server path's own cost next to the hybrid one.

With `--scaleout` (or `--only-scaleout`, which skips 1 and 2) every role also runs as its
own process (`bench/scaleout.py`): ingest records/s with SQLite vs PostgreSQL and with 1
and 2 relays/projectors, freshness lag, `topk_records` through OpenSearch + the Qdrant
server with each stage's share, and queries per second with 1 vs 2 query workers.
Each ingest also reports CPU seconds per 1,000 records of every process (each role, each
harness server, the load generator): with everything on one machine their sum bounds
the throughput. Shared harness servers also count other users' work; a private harness
(`ORRERY_SERVERS_DIR=/tmp/x tests/harness/servers.py up`) gives clean server figures.

1. **Start-up** (skipped with `--skip-startup`): a second harness instance in its own
   state dir (the shared servers hold the default ports, so it gets free ports): `up`
   in a fresh dir (warm artifact cache: no Maven, no javac; Kafka storage formatted),
   `down`, `up` again (restart, empty data dirs again), `up` while running (reuse), then
   `down` — per server the harness's own setup and ready times, and the wall time of
   each `up`. Only that instance is stopped. Cold-cache figures (Maven downloads, javac,
   apt) are not re-measured here: they would download ~190 MiB; see
   `tests/harness/README.md`.
2. For **embedded**, then **servers** (`orrery serve --mode servers`: ingest API, relay,
   projector and query worker in one process, against the harness; unique topic, group,
   index and collection names, dropped afterwards), each on a fresh data dir:
   - **Ingest**: N records of `bench/topk.py`'s corpus with precomputed 384-d vectors
     (nothing is embedded) over `POST /v1/records` in batches, until `/v1/readiness`
     shows the scope with N documents, no outbox lag and a current projector log lag of
     0 (every record indexed, refreshed and committed in the registry). records/s =
     N / (first POST → that). Then the live generation is verified once through the
     admin API (a full read-back; the worker adopts that check), because the scheduled
     re-check is switched off (`ORRERY_ELIGIBILITY_INTERVAL_SECONDS=86400`) so that it
     cannot land inside the measurements. Embedded then waits for the qdrant-edge HNSW
     build as `bench/topk.py` does.
   - **Freshness lag**: `--fresh` times, one new record whose title holds a token found
     nowhere else; the clock starts when `POST /v1/records` returned (the record and its
     outbox row are committed) and stops when a `topk_records` poll for that token
     (lexical-only profile, polled back to back with a 5 ms pause) first returns it.
     The poll's own latency bounds the resolution (reported).
   - **top-k**: `--queries` query texts (every second one filtered on status + galaxy),
     query vectors warmed first, response cache off (`ORRERY_CACHE_RESPONSES=false`) so
     every request ranks in full; timed `topk_records` with the default profile (hybrid)
     and with the lexical-only profile (`weighted@1`, lexical weight 1, others 0: no
     vector search, no embedding), interleaved query by query.

Writes `docs/bench/servers.json` and a PNG next to it and prints a table. Figures are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/servers.py`: put the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    BenchTimeout,
    ServeProcess,
    deadline,
    drop_harness_resources,
    exchange,
    git_facts,
    harness_servers_env,
    ingest_env,
    latency_summary,
    machine_facts,
    poll_readiness,
    publish,
    serve,
    source_digest,
    utc_now,
    write_json,
)
from bench.topk import (
    NAMESPACE,
    OPTIMIZE_INTERVAL_S,
    SNAPSHOT_KIND,
    QuerySpec,
    Vocabulary,
    bench_scopes,
    corpus_batches,
    make_queries,
    topk_body,
    wait_for_vector_index,
)

MODES = ("embedded", "servers")
PROFILES = ("hybrid", "lexical")
PROFILE_LABELS = {
    "hybrid": "default profile (BM25 + vectors)",
    "lexical": "lexical only (BM25 engine alone)",
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
RESULT_LIMIT = 10
ADMIN_KEY = "bench-admin"
REQUEST_TIMEOUT_S = 60.0
FRESH_POLL_PAUSE_S = 0.005
FRESH_TIMEOUT_S = 60.0
QDRANT_NOTE = "Qdrant: the harness's Qdrant server 1.16.3 (ORRERY_QDRANT_URL)"

console = Console(stderr=True)


# -- start-up -------------------------------------------------------------------------------


def measure_startup() -> dict[str, Any]:
    """Fresh / restart / reuse `up` of a second harness instance (see the module doc)."""
    from tests.harness.servers import SERVER_NAMES, start_all, stop_all

    base = Path(tempfile.mkdtemp(prefix="orrery-bench-harness-"))
    phases: dict[str, Any] = {}
    try:
        for phase in ("fresh", "restart", "reuse"):
            if phase == "restart":
                stop_all(base)
            console.print(f"[bold]harness start-up: {phase}[/] ({base})")
            started = time.perf_counter()
            summary = start_all(base, require=True)
            wall = time.perf_counter() - started
            phases[phase] = {
                "wall_seconds": round(wall, 2),
                "servers": {
                    name: {
                        key: summary["servers"][name].get(key)
                        for key in ("version", "setup_seconds", "startup_seconds", "reused")
                    }
                    for name in SERVER_NAMES
                },
            }
        started = time.perf_counter()
        stop_all(base)
        phases["down_seconds"] = round(time.perf_counter() - started, 2)
    finally:
        stop_all(base)  # idempotent; only this instance's pids
        shutil.rmtree(base, ignore_errors=True)
    phases["method"] = (
        "a second harness instance in its own state dir (free ports), warm artifact cache "
        "(~/.cache/orrery: no Maven, no javac); fresh = first `up` in an empty state dir, "
        "restart = `up` after `down` (data dirs empty again), reuse = `up` while running. "
        "setup_seconds = preparation (Kafka storage format, classpath), startup_seconds = "
        "process start until the server answered its probe; all three start in parallel."
    )
    return phases


# -- one mode -------------------------------------------------------------------------------


def _applied(ready: Mapping[str, Any], size: int) -> bool:
    """The scope holds `size` documents, no event waits (outbox lag 0) and the projector's
    own log lag is 0 and current. Eligibility is not part of it (see `make_eligible`)."""
    scopes = bench_scopes(ready)
    log = ready.get("projector_log")
    return (
        len(scopes) == 1
        and scopes[0]["document_count"] == size
        and scopes[0]["lag_events"] == 0
        and (log is None or (log["current"] and log["lag_events"] == 0))
    )


def ingest(
    server: ServeProcess, client: httpx.Client, batches: Sequence[bytes], size: int
) -> dict[str, Any]:
    """POST every batch, then poll readiness until every record is applied (indexed,
    refreshed, registry committed): records/s = N / (first POST → applied)."""
    started = time.perf_counter()
    wall_start = time.time()
    first_s: float | None = None
    with console.status("ingest: POST /v1/records") as status:
        for i, body in enumerate(batches):
            ex = exchange(client, "POST", "/v1/records", content=body)
            if ex.response.status_code != 200:
                raise RuntimeError(f"POST /v1/records: {ex.response.status_code}")
            status.update(f"ingest: POST /v1/records {i + 1}/{len(batches)}")
            if first_s is None:  # one readiness GET per POST until the first is applied
                scopes = client.get("/v1/readiness").json().get("scopes", [])
                if sum(s["document_count"] for s in scopes):
                    first_s = time.perf_counter() - started
    posted_s = time.perf_counter() - started
    with console.status("ingest: projecting") as status:

        def projected(ready: dict[str, Any]) -> bool:
            nonlocal first_s
            count = sum(s["document_count"] for s in ready.get("scopes", []))
            if count and first_s is None:
                first_s = time.perf_counter() - started
            status.update(f"ingest: projecting {count:,}/{size:,}")
            return _applied(ready, size)

        ready = poll_readiness(server, client, projected)
    applied_s = time.perf_counter() - started
    return {
        "records": size,
        "post_seconds": round(posted_s, 3),
        # Server mode: includes the projector's discovery of the new topic (the relay
        # creates it on the first publish; a pattern subscription sees it within
        # metadata_max_age_ms, 30 s by default) and its group join.
        "first_applied_seconds": None if first_s is None else round(first_s, 3),
        "applied_seconds": round(applied_s, 3),
        "records_per_s_after_first": round((size - 1) / max(applied_s - (first_s or 0.0), 1e-9), 1),
        "records_per_s": round(size / applied_s, 1),
        "post_records_per_s": round(size / posted_s, 1),
        "wall_start": wall_start,
        "wall_ready": time.time(),
        "projector_log": ready.get("projector_log"),
    }


def make_eligible(client: httpx.Client, timeout_s: float = 600.0) -> dict[str, Any]:
    """Verify the live generation through the admin API (a full read-back of every
    engine); the query worker adopts the recorded check, so the scope becomes eligible
    without waiting for its scheduled re-check. Returns the verify figures."""
    headers = {"x-admin-key": ADMIN_KEY}
    ready = client.get("/v1/readiness").json()
    (generation_id,) = {s["generation_id"] for s in ready["scopes"]}
    started = time.perf_counter()
    verified = client.post(
        f"/v1/admin/generations/{generation_id}/verify", headers=headers, timeout=timeout_s
    ).json()
    verify_s = time.perf_counter() - started
    while not client.get("/v1/readiness").json()["ready"]:
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"not ready {timeout_s:.0f} s after verify: {verified}")
        time.sleep(0.2)
    return {
        "generation_id": generation_id,
        "verified": verified.get("verified"),
        "verify_seconds": round(verify_s, 3),
        "ready_after_s": round(time.perf_counter() - started, 3),
    }


def _topk(
    client: httpx.Client, query: QuerySpec, profile: str, *, limit: int = RESULT_LIMIT
) -> tuple[float, dict[str, Any]]:
    body = topk_body(query, limit)
    if profile == "lexical":
        body.update(LEXICAL_ONLY)
    ex = exchange(client, "POST", "/v1/external/retrieve/topk_records", body=body)
    if ex.response.status_code != 200:
        raise RuntimeError(f"topk_records: HTTP {ex.response.status_code}: {ex.response.text}")
    answer: dict[str, Any] = ex.json()
    return ex.seconds, answer


def _fresh_record(i: int, token: str) -> dict[str, Any]:
    rng = np.random.default_rng(10_000 + i)
    vector = rng.standard_normal(384)
    vector /= np.linalg.norm(vector)
    return {
        "namespace": NAMESPACE,
        "snapshot_kind": SNAPSHOT_KIND,
        "item_id": f"fresh-{token}",
        "revision": 1,
        "galaxy": "galaxy-0",
        "payload_schema": "bench_object_v1",
        "payload": {"memory_id": f"fresh-{token}", "kind": "object", "summary": token},
        "text": {"title": f"fresh {token}", "body": f"freshness probe {token}"},
        "metadata": {"status": "active", "updated_at": "2026-01-01T00:00:00Z"},
        "vector": np.round(vector, 6).tolist(),
    }


def measure_freshness(server: ServeProcess, client: httpx.Client, count: int) -> dict[str, Any]:
    """Commit → first visible in a `topk_records` poll, `count` times, one at a time."""
    lags: list[float] = []
    polls: list[int] = []
    poll_seconds: list[float] = []
    run = f"{random.Random().getrandbits(40):010x}"
    for i in range(count):
        token = f"zq{run}x{i:04d}"
        query = QuerySpec(token, None)
        _topk(client, query, "lexical", limit=1)  # plan the token once: not the measure
        ex = exchange(client, "POST", "/v1/records", body=[_fresh_record(i, token)])
        committed = time.perf_counter()
        if ex.response.status_code != 200 or ex.json()["accepted"] != 1:
            raise RuntimeError(f"POST /v1/records: {ex.response.status_code} {ex.response.text}")
        tries = 0
        while True:
            tries += 1
            seconds, answer = _topk(client, query, "lexical", limit=1)
            poll_seconds.append(seconds)
            if answer["results"] and answer["results"][0]["item_id"] == f"fresh-{token}":
                lags.append(time.perf_counter() - committed)
                polls.append(tries)
                break
            if time.perf_counter() - committed > FRESH_TIMEOUT_S:
                raise RuntimeError(f"record {token} not visible after {FRESH_TIMEOUT_S:.0f} s")
            if server.process.poll() is not None:
                raise RuntimeError(f"orrery serve died:\n{server.log_text()[-3000:]}")
            time.sleep(FRESH_POLL_PAUSE_S)
    return {
        "lag_ms": latency_summary(lags),
        "polls_per_record_mean": round(float(np.mean(polls)), 1),
        "poll_latency_ms": latency_summary(poll_seconds),
        "method": (
            "clock starts when POST /v1/records returned (record + outbox row committed), "
            "stops when a lexical-only topk_records poll (5 ms pause between polls) first "
            "returns the record; one record at a time"
        ),
    }


def measure_topk(
    client: httpx.Client, queries: Sequence[QuerySpec], warmup: Sequence[QuerySpec]
) -> dict[str, Any]:
    """Hybrid and lexical-only `topk_records`, interleaved query by query."""
    for query in (*warmup, *queries):  # caches every query vector: not measured
        _topk(client, query, "hybrid")
    seconds: dict[str, list[float]] = {p: [] for p in PROFILES}
    filtered: dict[str, list[float]] = {p: [] for p in PROFILES}
    stages: dict[str, list[dict[str, float]]] = {p: [] for p in PROFILES}
    with console.status("top-k queries") as status:
        for i, query in enumerate(queries):
            status.update(f"top-k queries {i + 1}/{len(queries)}")
            for profile in PROFILES:
                took, answer = _topk(client, query, profile)
                seconds[profile].append(took)
                if query.filters is not None:
                    filtered[profile].append(took)
                stages[profile].append(answer["query_plan"]["latency_ms"])
    out: dict[str, Any] = {}
    for profile in PROFILES:
        out[profile] = {
            "latency_ms": latency_summary(seconds[profile]),
            "filtered_latency_ms": latency_summary(filtered[profile]),
            "unfiltered_latency_ms": latency_summary(
                [s for s, q in zip(seconds[profile], queries, strict=True) if q.filters is None]
            ),
            "server_stage_ms_p50": {
                stage: round(float(np.percentile([s[stage] for s in stages[profile]], 50)), 3)
                for stage in stages[profile][0]
            },
        }
    return out


def run_mode(mode: str, size: int, args: argparse.Namespace, vocab: Vocabulary) -> dict[str, Any]:
    console.rule(f"[bold]{mode}: N = {size:,}")
    generated = time.perf_counter()
    batches = list(corpus_batches(size, args.batch_size, args.seed, vocab))
    console.print(f"generated {size:,} records in {time.perf_counter() - generated:.1f} s")
    query_rng = random.Random(args.seed + 1)
    warmup = make_queries(query_rng, vocab, 10)
    queries = make_queries(query_rng, vocab, args.queries)
    env: dict[str, str] = {
        **ingest_env(args.batch_size),
        "ORRERY_CACHE_RESPONSES": "false",
        # The scheduled full read-back of every engine (seconds of CPU at 100k) would
        # land in the middle of the measurements: verified once after ingest instead.
        "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "86400",
        "ORRERY_ADMIN_KEY": ADMIN_KEY,
    }
    if mode == "embedded":
        env["ORRERY_OPTIMIZE_INTERVAL_SECONDS"] = f"{OPTIMIZE_INTERVAL_S:g}"
    else:
        env.update(harness_servers_env("bench"))
    result: dict[str, Any] = {"mode": mode, "size": size, "server_env": dict(env)}
    try:
        with serve(env, startup_s=300) as server, server.client(REQUEST_TIMEOUT_S) as client:
            figures = ingest(server, client, batches, size)
            del batches
            wall_start, wall_ready = figures.pop("wall_start"), figures.pop("wall_ready")
            result["ingest"] = figures
            result["eligibility"] = make_eligible(client)
            if mode == "embedded":
                wait = wait_for_vector_index(
                    server,
                    client,
                    warmup,
                    result_limit=RESULT_LIMIT,
                    start_wall=wall_start,
                    ready_wall=wall_ready,
                    max_wait_s=args.index_wait,
                )
                result["vector_index_wait"] = {
                    k: wait[k]
                    for k in ("stable", "seconds_after_ready", "rounds_with_optimizer_busy")
                }
            result["topk"] = measure_topk(client, queries, warmup)
            result["freshness"] = measure_freshness(server, client, args.fresh)
            result["readiness_after"] = client.get("/v1/readiness").json()
            result["memory_kb_end"] = server.memory_kb()
            result["server_log_problems"] = server.log_problems()
    finally:
        if mode == "servers":
            drop_harness_resources(env)
    return result


# -- output ---------------------------------------------------------------------------------


def _plans(text: str) -> list[tuple[str, int, int]]:
    """`--scaleout-plans`: `backend:relays:projectors,...`."""
    plans = []
    for each in text.split(","):
        backend, relays, projectors = each.split(":")
        if backend not in ("sqlite", "postgres"):
            raise argparse.ArgumentTypeError(f"unknown backend {backend!r}")
        plans.append((backend, int(relays), int(projectors)))
    return plans


def print_scaleout(scaleout: Mapping[str, Any]) -> None:
    table = Table(title=f"scale-out: every role its own process (N = {scaleout['size']:,})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for run in scaleout["ingest"]:
        table.add_row(
            f"ingest records/s, {run['backend']}, {run['relays']} relay(s) / "
            f"{run['projectors']} projector(s)",
            f"{run['records_per_s']:,.0f}",
        )
    if "freshness" in scaleout:
        lag = scaleout["freshness"]["lag_ms"]
        table.add_row("freshness lag p50 / p95 (ms)", f"{lag['p50']:.0f} / {lag['p95']:.0f}")
    if "topk" in scaleout:
        topk = scaleout["topk"]
        table.add_row(
            "topk_records default profile p50 / p95 (ms)",
            f"{topk['latency_ms']['p50']:.1f} / {topk['latency_ms']['p95']:.1f}",
        )
        table.add_row(
            "  stage shares of the server total",
            ", ".join(f"{k} {v:.0%}" for k, v in topk["stage_share_of_server_total"].items()),
        )
    for run in scaleout.get("qps", []):
        table.add_row(
            f"qps with {run['workers']} query worker(s), {run['clients']} clients",
            f"{run['qps']:.1f} (p95 {run['latency_ms']['p95']:.0f} ms)",
        )
    Console(width=140).print(table)


def print_table(report: Mapping[str, Any]) -> None:
    if report.get("scaleout"):
        print_scaleout(report["scaleout"])
    if not report["runs"]:
        return
    runs = {run["mode"]: run for run in report["runs"]}
    table = Table(title="embedded vs servers (one run; ms unless noted)")
    for column in ("figure", *runs):
        table.add_column(column, justify="left" if column == "figure" else "right")
    rows: list[tuple[str, list[str]]] = [
        ("records (N)", [f"{r['size']:,}" for r in runs.values()]),
        (
            "ingest records/s (POST → searchable)",
            [f"{r['ingest']['records_per_s']:,.0f}" for r in runs.values()],
        ),
        (
            "ingest POST-only records/s",
            [f"{r['ingest']['post_records_per_s']:,.0f}" for r in runs.values()],
        ),
        (
            "ingest: first record applied after (s)",
            [f"{r['ingest']['first_applied_seconds'] or 0:.1f}" for r in runs.values()],
        ),
        (
            "ingest records/s after the first",
            [f"{r['ingest']['records_per_s_after_first']:,.0f}" for r in runs.values()],
        ),
        ("freshness lag p50", [f"{r['freshness']['lag_ms']['p50']:.0f}" for r in runs.values()]),
        ("freshness lag p95", [f"{r['freshness']['lag_ms']['p95']:.0f}" for r in runs.values()]),
    ]
    for profile in PROFILES:
        for stat in ("p50", "p95"):
            rows.append(
                (
                    f"topk {PROFILE_LABELS[profile]} {stat}",
                    [f"{r['topk'][profile]['latency_ms'][stat]:.1f}" for r in runs.values()],
                )
            )
        rows.append(
            (
                f"  … filtered / unfiltered p50 ({profile})",
                [
                    f"{r['topk'][profile]['filtered_latency_ms']['p50']:.1f} / "
                    f"{r['topk'][profile]['unfiltered_latency_ms']['p50']:.1f}"
                    for r in runs.values()
                ],
            )
        )
    for profile in PROFILES:
        rows.append(
            (
                f"  server stages p50 ({profile}): index_search / rerank / total",
                [
                    " / ".join(
                        f"{r['topk'][profile]['server_stage_ms_p50'][k]:.1f}"
                        for k in ("index_search", "rerank", "total")
                    )
                    for r in runs.values()
                ],
            )
        )
    for name, values in rows:
        table.add_row(name, *values)
    Console(width=140).print(table)
    startup = report.get("startup")
    if startup:
        table = Table(title="harness start-up (s): setup + ready, per server; wall per `up`")
        table.add_column("phase")
        names = list(startup["fresh"]["servers"])
        for name in names:
            table.add_column(name, justify="right")
        table.add_column("wall", justify="right")
        for phase in ("fresh", "restart", "reuse"):
            cells = []
            for name in names:
                s = startup[phase]["servers"][name]
                cells.append(
                    "reused"
                    if s.get("reused")
                    else f"{s.get('setup_seconds') or 0:.1f} + {s.get('startup_seconds') or 0:.1f}"
                )
            table.add_row(phase, *cells, f"{startup[phase]['wall_seconds']:.1f}")
        Console(width=140).print(table)
    print(QDRANT_NOTE)


def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    if not runs:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    labels = [f"{r['mode']}\n(N={r['size']:,})" for r in runs]
    x = np.arange(len(runs))
    ax = axes[0]
    bars = ax.bar(x, [r["ingest"]["records_per_s"] for r in runs], color=["#4c72b0", "#dd8452"])
    ax.bar_label(bars, labels=[f"{r['ingest']['records_per_s']:,.0f}" for r in runs], fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_title("ingest: records/s, POST → searchable")
    ax = axes[1]
    width = 0.35
    for k, stat in enumerate(("p50", "p95")):
        values = [r["freshness"]["lag_ms"][stat] for r in runs]
        bars = ax.bar(x + (k - 0.5) * width, values, width, label=stat)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_title("freshness lag (ms): commit → visible")
    ax.legend(fontsize=8)
    ax = axes[2]
    series = [(p, s) for p in PROFILES for s in ("p50", "p95")]
    width = 0.8 / len(series)
    for k, (profile, stat) in enumerate(series):
        values = [r["topk"][profile]["latency_ms"][stat] for r in runs]
        bars = ax.bar(
            x + (k - (len(series) - 1) / 2) * width, values, width, label=f"{profile} {stat}"
        )
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x, labels)
    ax.set_title("topk_records latency (ms, log)")
    ax.legend(fontsize=7)
    fig.suptitle(
        "Orrery embedded vs servers (Kafka + OpenSearch + Qdrant server + Redis)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="embedded corpus size")
    parser.add_argument(
        "--server-size", type=int, default=None, help="server-mode corpus size (default --size)"
    )
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--fresh", type=int, default=30, help="freshness samples per mode")
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--index-wait", type=float, default=900.0)
    parser.add_argument("--timeout", type=int, default=7_200, help="global deadline (s)")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--scaleout", action="store_true", help="add bench/scaleout.py's figures")
    parser.add_argument(
        "--only-scaleout", action="store_true", help="only the scale-out figures (no 1, 2)"
    )
    parser.add_argument("--scaleout-size", type=int, default=None, help="default --size")
    parser.add_argument(
        "--scaleout-plans",
        type=_plans,
        default=None,
        help="ingest deployments as backend:relays:projectors,... "
        "(default sqlite:1:1,postgres:1:1,postgres:2:2; query figures on the last)",
    )
    parser.add_argument(
        "--scaleout-ingest-only", action="store_true", help="scale-out ingest figures only"
    )
    parser.add_argument("--qps-seconds", type=float, default=20.0)
    parser.add_argument("--qps-clients", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "servers.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = {"embedded": args.size, "servers": args.server_size or args.size}
    git = git_facts()
    started = utc_now()
    vocab = Vocabulary.build(random.Random(args.seed))
    report: dict[str, Any] = {
        "benchmark": "servers",
        "date": started,
        "git": git,
        "machine": machine_facts(),
        "server_source_sha256": source_digest(),
        "qdrant": QDRANT_NOTE,
        "config": {
            "sizes": sizes,
            "queries": args.queries,
            "fresh": args.fresh,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "result_limit": RESULT_LIMIT,
            "lexical_only_request": LEXICAL_ONLY,
            "filtered_queries": "every second: status any-of + galaxy",
            "command": " ".join(
                ["bench/servers.py", *(argv if argv is not None else sys.argv[1:])]
            ),
        },
        "runs": [],
    }
    try:
        with deadline(args.timeout):
            if not args.skip_startup and not args.only_scaleout:
                try:
                    report["startup"] = measure_startup()
                except Exception as error:  # reported, the rest of the run still counts
                    console.print(f"[red]start-up measurement failed: {error!r}")
                    report["startup_error"] = repr(error)
            for mode in () if args.only_scaleout else MODES:
                report["runs"].append(run_mode(mode, sizes[mode], args, vocab))
                write_json(args.out, {**report, "partial": mode != MODES[-1]})
            if args.scaleout or args.only_scaleout:
                from bench.scaleout import run_scaleout

                report["scaleout"] = run_scaleout(
                    args.scaleout_size or args.size,
                    batch_size=args.batch_size,
                    seed=args.seed,
                    queries=args.queries,
                    fresh=args.fresh,
                    qps_seconds=args.qps_seconds,
                    clients=args.qps_clients,
                    ingest_only=args.scaleout_ingest_only,
                    **({"plans": args.scaleout_plans} if args.scaleout_plans else {}),
                )
    except BenchTimeout as error:
        console.print(f"[red]{error}")
        write_json(args.out, {**report, "partial": True, "error": str(error)})
        return 1
    publish(args.out, report, report, plot, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
