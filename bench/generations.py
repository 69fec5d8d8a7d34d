"""Generations over HTTP: rebuild, verify and promote against a real `orrery serve`.

    .venv/bin/python bench/generations.py [--mode embedded|servers] [--size N]
        [--queries 300] [--flips 20] [--out docs/bench/generations[-servers].json]

Against a fresh `orrery serve` on 127.0.0.1 (own temp data dir, response cache off so
every query ranks in full). `--mode embedded` (default, N = 100,000): tantivy and
qdrant-edge; a build bulk-loads in a niced child process that also builds the new
shard's HNSW graph. `--mode servers` (default N = 10,000): the local harness's Kafka,
OpenSearch and Redis with names unique to the run (dropped afterwards), Qdrant through
qdrant-client's local mode — exact brute force in Python, so queries cost ~15 ms
unfiltered and ~130 ms filtered per 10k points and a 100k corpus would measure that,
not the lifecycle; the build runs in the server process (OpenSearch and Qdrant take
concurrent writers, so the projector dual-writes into it).

1. Ingest N synthetic records with precomputed 384-d vectors (the corpus of
   `bench/topk.py`: nothing is embedded but query texts) and wait for the projection
   (embedded: and for the qdrant-edge HNSW build of the live generation to settle).
2. Idle: `topk_records` latency of Q queries, one client, sequentially (query vectors
   warmed first, so the embedder is not measured).
3. Rebuild: `POST /v1/admin/generations/build`; the same query loop runs for the whole
   build; rebuild time (request to sealed), the build receipt's phases (embedded:
   `optimize` is the child's HNSW build) and the load rate. The query p95 during the
   rebuild is compared with idle.
4. Verify: `POST …/{id}/verify` (every engine read back, coverage checked).
5. Promote latency: `--flips` alternating promote / rollback; p50 of the pointer flip
   (the one registry write, `flip_ms`) and of the whole HTTP call.
6. `--idle-rebuild` (default): one more rebuild with no query running, to separate the
   build's own cost from what the query loop takes of the two cores.
7. The eligibility re-check a query worker runs on a schedule (its recorded duration).

Writes the JSON and a PNG next to it and prints a table. Figures are reported, never
asserted; the targets of issue 4 are printed next to them.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/generations.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    BenchTimeout,
    ServeProcess,
    deadline,
    draw_chart,
    drop_harness_resources,
    git_facts,
    harness_servers_env,
    latency_summary,
    machine_facts,
    median,
    serve,
    utc_now,
    write_json,
)
from bench.topk import (
    NAMESPACE,
    SCOPE_REF,
    SNAPSHOT_KIND,
    QuerySpec,
    Vocabulary,
    corpus_batches,
    ingest,
    make_queries,
    wait_for_vector_index,
)

ADMIN_KEY = "bench-admin-key"
ADMIN = "/v1/admin/generations"
RESULT_LIMIT = 10
TARGETS = {"rebuild_100k_s": 180.0, "flip_ms": 50.0, "p95_ratio": 2.0}

console = Console(stderr=True)


def _admin(client: httpx.Client, method: str, path: str, body: Any = None) -> dict[str, Any]:
    response = client.request(
        method, ADMIN + path, json=body, headers={"x-admin-key": ADMIN_KEY}, timeout=600
    )
    if response.is_error:
        raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
    return dict(response.json())


def _query(client: httpx.Client, query: QuerySpec) -> float:
    body: dict[str, Any] = {
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
        "query_text": query.text,
        "result_limit": RESULT_LIMIT,
        "timeout_seconds": 60,
    }
    if query.filters:
        body["filters"] = query.filters
    started = time.perf_counter()
    response = client.post("/v1/external/retrieve/topk_records", json=body)
    seconds = time.perf_counter() - started
    if response.status_code != 200 or not response.json()["results"]:
        raise RuntimeError(f"query failed: {response.status_code} {response.text[:300]}")
    return seconds


class QueryLoop:
    """Queries in a thread until stopped; keeps every latency."""

    def __init__(self, server: ServeProcess, queries: Sequence[QuerySpec]) -> None:
        self._server = server
        self._queries = queries
        self._stop = threading.Event()
        self.seconds: list[float] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._server.client(timeout_s=120) as client:
            i = 0
            while not self._stop.is_set():
                try:
                    self.seconds.append(_query(client, self._queries[i % len(self._queries)]))
                except (RuntimeError, httpx.HTTPError) as exc:
                    self.errors.append(str(exc)[:300])
                i += 1

    def __enter__(self) -> QueryLoop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(120)


def _build(client: httpx.Client) -> tuple[str, float, dict[str, Any]]:
    """Build a generation of the bench scope; its id, seconds to sealed and receipt."""
    started = time.perf_counter()
    scope = {"namespace": NAMESPACE, "snapshot_kind": SNAPSHOT_KIND}
    built = _admin(client, "POST", "/build", scope)
    generation_id = built["row"]["generation_id"]
    while True:
        view = _admin(client, "GET", f"/{generation_id}")
        if view["row"]["state"] != "building":
            break
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    if view["row"]["state"] != "sealed":
        raise RuntimeError(f"build ended {view['row']['state']}: {view['descriptor']}")
    return generation_id, seconds, view["descriptor"]["build_receipt"]


def run(args: argparse.Namespace, server_env: dict[str, str]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    vocab = Vocabulary.build(rng)
    queries = make_queries(rng, vocab, args.queries)
    env = {
        **server_env,
        "ORRERY_ADMIN_KEY": ADMIN_KEY,
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_MAX_BATCH": "2000",
        # 2,000 records with 384-d vectors are ~8 MB: over the default body limit.
        "ORRERY_MAX_BODY_BYTES": str(64 * 1024 * 1024),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": str(args.optimize_interval),
        "ORRERY_GEN_BUILD_BATCH_SIZE": str(args.build_batch),
        "ORRERY_GEN_BUILD_PAUSE_SECONDS": str(args.build_pause),
    }
    if args.child_nice is not None:
        env["ORRERY_GEN_BUILD_CHILD_NICE"] = str(args.child_nice)
    result: dict[str, Any] = {"size": args.size}
    with serve(env, startup_s=180) as server, server.client(timeout_s=600) as client:
        batches = list(corpus_batches(args.size, 2_000, args.seed, vocab))
        result["ingest"] = ingest(server, client, batches, args.size)
        result["ingest"].pop("projector", None)
        start_wall = result["ingest"].pop("wall_start")
        ready_wall = result["ingest"].pop("wall_ready")
        if args.mode == "embedded":
            result["vector_index_wait"] = {
                k: v
                for k, v in wait_for_vector_index(
                    server,
                    client,
                    queries[:20],
                    result_limit=RESULT_LIMIT,
                    start_wall=start_wall,
                    ready_wall=ready_wall,
                    max_wait_s=args.max_wait,
                ).items()
                if k in ("stable", "seconds_after_ready", "optimizes_ended_s_after_first_post")
            }
        live = _admin(client, "GET", "")["generations"][0]["generation_id"]
        for query in queries:  # warm the query-vector cache: the embedder is not measured
            _query(client, query)

        console.print("[bold]idle queries")
        idle = [_query(client, q) for q in queries]

        console.print("[bold]rebuild under query load")
        with QueryLoop(server, queries) as loop:
            generation_id, rebuild_s, receipt = _build(client)
        during = loop.seconds

        console.print("[bold]verify")
        started = time.perf_counter()
        verified = _admin(client, "POST", f"/{generation_id}/verify")
        verify_s = time.perf_counter() - started
        if not verified["verified"]:
            raise RuntimeError(f"verify failed: {verified['check']['reason']}")

        console.print("[bold]promote / rollback")
        flips: list[float] = []
        calls: list[float] = []
        for i in range(args.flips):
            started = time.perf_counter()
            if i % 2 == 0:
                report = _admin(client, "POST", f"/{generation_id}/promote")["report"]
            else:
                report = _admin(
                    client,
                    "POST",
                    "/rollback",
                    {"namespace": NAMESPACE, "snapshot_kind": SNAPSHOT_KIND},
                )["report"]
            calls.append(time.perf_counter() - started)
            flips.append(float(report["flip_ms"]))
        if args.idle_rebuild:
            console.print("[bold]rebuild without query load")
            idle_id, idle_s, idle_receipt = _build(client)
            result["rebuild_idle"] = {
                "generation_id": idle_id,
                "seconds": round(idle_s, 3),
                "records_per_s": round(args.size / idle_s, 1),
                "receipt": idle_receipt,
            }
        checks = [
            c
            for g in (live, generation_id)
            for c in _admin(client, "GET", f"/{g}")["checks"]
            if c["kind"] == "eligibility" and c["ok"]
        ]
        result["memory_kb"] = server.memory_kb()

    idle_summary = latency_summary(idle)
    during_summary = latency_summary(during)
    durations = receipt["durations_s"]
    load_s = durations["load"] + durations.get("snapshot", 0.0)
    result.update(
        {
            "idle_topk_ms": idle_summary,
            "rebuild": {
                "generation_id": generation_id,
                "seconds": round(rebuild_s, 3),
                "records_per_s": round(args.size / rebuild_s, 1),
                "load_records_per_s": round(receipt["snapshot_documents"] / load_s, 1),
                "where": "child process (niced)" if "optimize" in durations else "server process",
                "receipt": receipt,
            },
            "during_rebuild_topk_ms": during_summary,
            "during_rebuild_errors": len(loop.errors),
            "p95_ratio": round(during_summary["p95"] / idle_summary["p95"], 2),
            "verify": {
                "seconds": round(verify_s, 3),
                "check_seconds": verified["check"]["seconds"],
                "documents": verified["check"]["expected_count"],
            },
            "promote": {
                "flip_ms_p50": round(median(flips), 3),
                "flip_ms_max": round(max(flips), 3),
                "http_ms_p50": round(median(calls) * 1000, 3),
                "http_ms_max": round(max(calls) * 1000, 3),
                "flips": len(flips),
            },
            "eligibility_check_s": round(median([c["seconds"] for c in checks]), 3)
            if checks
            else None,
        }
    )
    return result


def print_table(result: dict[str, Any]) -> None:
    table = Table(title=f"generations at {result['size']:,} records ({result['mode']})")
    table.add_column("what")
    table.add_column("figure", justify="right")
    table.add_column("target", justify="right")
    rebuild = result["rebuild"]
    scaled = rebuild["seconds"] * 100_000 / result["size"]
    table.add_row("rebuild (request → sealed)", f"{rebuild['seconds']:.1f} s", "100k ≤ 180 s")
    if "rebuild_idle" in result:
        idle_rebuild = result["rebuild_idle"]
        durations = idle_rebuild["receipt"]["durations_s"]
        phases = ", ".join(f"{k} {v:.1f}" for k, v in durations.items() if k != "total")
        table.add_row(
            "rebuild without query load", f"{idle_rebuild['seconds']:.1f} s", f"s: {phases}"
        )
    table.add_row("  scaled to 100k (linear)", f"{scaled:.0f} s", "")
    table.add_row("  load rate", f"{rebuild['load_records_per_s']:,.0f} rec/s", "")
    for phase, seconds in rebuild["receipt"]["durations_s"].items():
        table.add_row(f"  {phase}", f"{seconds:.2f} s", "")
    table.add_row("verify (2 engines + coverage)", f"{result['verify']['seconds']:.2f} s", "")
    table.add_row("eligibility re-check", f"{result['eligibility_check_s']} s", "")
    promote = result["promote"]
    table.add_row("flip p50 (registry write)", f"{promote['flip_ms_p50']:.2f} ms", "≤ 50 ms")
    table.add_row("promote/rollback HTTP p50", f"{promote['http_ms_p50']:.1f} ms", "")
    idle, during = result["idle_topk_ms"], result["during_rebuild_topk_ms"]
    table.add_row("topk p50 / p95 idle", f"{idle['p50']:.1f} / {idle['p95']:.1f} ms", "")
    table.add_row(
        "topk p50 / p95 during rebuild", f"{during['p50']:.1f} / {during['p95']:.1f} ms", ""
    )
    table.add_row("p95 ratio rebuild / idle", f"{result['p95_ratio']:.2f}×", "≤ 2×")
    Console().print(table)


def plot(result: dict[str, Any], idle: Sequence[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    phases = result["rebuild"]["receipt"]["durations_s"]
    names = [p for p in ("snapshot", "load", "optimize", "catch_up", "seal") if p in phases]
    left.barh(names, [phases[p] for p in names], color="#4c72b0")
    left.set_xlabel("seconds")
    left.set_title(
        f"rebuild of {result['size']:,} records: {result['rebuild']['seconds']:.1f} s "
        f"({result['rebuild']['load_records_per_s']:,.0f} rec/s load)"
    )
    left.invert_yaxis()
    labels = ["idle", "during rebuild"]
    summaries = [result["idle_topk_ms"], result["during_rebuild_topk_ms"]]
    xs = range(len(labels))
    right.bar([x - 0.2 for x in xs], [s["p50"] for s in summaries], 0.4, label="p50")
    right.bar([x + 0.2 for x in xs], [s["p95"] for s in summaries], 0.4, label="p95")
    right.set_xticks(list(xs), labels)
    right.set_ylabel("topk_records latency (ms)")
    right.set_title(
        f"p95 ×{result['p95_ratio']:.2f}; flip p50 {result['promote']['flip_ms_p50']:.2f} ms"
    )
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _ = idle


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("embedded", "servers"), default="embedded")
    parser.add_argument(
        "--size", type=int, default=None, help="records (100,000 embedded, 10,000 servers)"
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--build-batch", type=int, default=1_000, help="snapshot batch")
    parser.add_argument("--build-pause", type=float, default=0.0, help="pause per batch (s)")
    parser.add_argument(
        "--optimize-interval", type=float, default=1.0, help="qdrant-edge optimizer (s)"
    )
    parser.add_argument(
        "--child-nice", type=int, default=None, help="ORRERY_GEN_BUILD_CHILD_NICE (default 10)"
    )
    parser.add_argument(
        "--idle-rebuild",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time a rebuild with no query load (after the promote flips)",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-wait", type=float, default=600.0)
    parser.add_argument("--timeout", type=int, default=3_600, help="global deadline (s)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = 100_000 if args.mode == "embedded" else 10_000
    if args.out is None:
        name = "generations.json" if args.mode == "embedded" else "generations-servers.json"
        args.out = REPO_ROOT / "docs/bench" / name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_env = harness_servers_env("generations") if args.mode == "servers" else {}
    try:
        with deadline(args.timeout):
            result = run(args, server_env)
    except BenchTimeout as exc:
        console.print(f"[red]{exc}")
        return 2
    finally:
        if server_env:
            drop_harness_resources(server_env)
    result["mode"] = args.mode
    document = {
        "benchmark": "generations",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "mode": args.mode,
            "size": args.size,
            "queries": args.queries,
            "flips": args.flips,
            "build_batch": args.build_batch,
            "build_pause_s": args.build_pause,
            "child_nice": args.child_nice,
            "optimize_interval_s": args.optimize_interval,
            "seed": args.seed,
            "response_cache": False,
        },
        "targets": TARGETS,
        "result": result,
    }
    write_json(args.out, document)
    draw_chart(plot, result, [], args.out.with_suffix(".png"))
    print_table(result)
    console.print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
