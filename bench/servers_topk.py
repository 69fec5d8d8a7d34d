"""Server-mode `topk_records` at scale, per stage, with the engines' own time (issue 24).

    .venv/bin/python bench/servers_topk.py build --size 100000 --state /tmp/topk-100k.json
    .venv/bin/python bench/servers_topk.py measure --state /tmp/topk-100k.json \
        [--queries 300] [--base-tree DIR] [--out docs/bench/servers-topk-100k-session15.json]
    .venv/bin/python bench/servers_topk.py clients --state /tmp/topk-100k.json [--queries 200]
    .venv/bin/python bench/servers_topk.py drop --state /tmp/topk-100k.json

`build` deploys server mode on the harness as separate processes (`ingest-api`, one
relay, one projector, one query worker; PostgreSQL canonical store, Kafka, OpenSearch,
the Qdrant server), ingests N records of `bench/topk.py`'s corpus (precomputed vectors),
verifies the live generation once, waits until the Qdrant collection is green (HNSW
built), stops the processes and **keeps** the database, the Kafka topic, the OpenSearch
index and the Qdrant collection; `--state` names them. `drop` deletes them.

`measure` starts query workers against the kept data (nothing on disk: routing and
payloads from PostgreSQL), response cache off, query vectors warmed (Redis), and sends
`--queries` `topk_records` (default profile; every second one filtered on status +
galaxy) one after the other. With `--base-tree DIR` a second worker runs the code of DIR
(e.g. a `git archive` of the base commit) and the two are asked the same query in turn
(A/B paired query by query, the order alternating), and their answers compared: ids,
order and scores of every result. Per worker: client latency, each stage of
`query_plan.latency_ms`, `query_plan.engine_ms` (the engine calls as timed inside the
worker and, where the code reports them, the engines' own `took` / `time`), and the CPU
the worker and every harness server used per query (from /proc, over the timed loop).

`clients` sends each query's two search requests (BM25 top 201 with its filters; a
random unit vector's HNSW top 201 with them) straight at OpenSearch and the Qdrant
server, per library: opensearch-py (what the lexical adapter uses) and raw `httpx`;
qdrant-client as the worker opened it before session 15 (no keep-alive to 127.0.0.1)
and the vector adapter's own REST path (urllib3, kept-alive, plain JSON). Wall time and
this thread's CPU per call, beside the engines' own `took` / `time`.

Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

if __package__ in (None, ""):  # run as `python bench/servers_topk.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    LOOPBACK,
    REPO_ROOT,
    ServeProcess,
    drop_harness_resources,
    exchange,
    free_port,
    git_facts,
    harness_servers_env,
    ingest_env,
    latency_summary,
    machine_facts,
    stop_processes,
    utc_now,
    write_json,
)
from bench.scaleout import (
    CURSOR_KEYS,
    Deployment,
    _cpu_snapshot,
    _drop_qdrant,
    _http_role,
    _spawn,
    _verify_live,
    _wait_vectors_indexed,
    measure_ingest,
)
from bench.topk import Vocabulary, corpus_batches, make_queries, topk_body

STAGES = ("scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize")
TOPK = "/v1/external/retrieve/topk_records"
REQUEST_TIMEOUT_S = 60.0


def _loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


# -- build / drop -----------------------------------------------------------------------


def build(size: int, state: Path, *, batch_size: int, seed: int) -> dict[str, Any]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tests.harness.servers import server_urls

    server = str(server_urls()["postgres"])
    name = f"orrery_topk_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    env: dict[str, str] = {
        **harness_servers_env("topk"),
        **ingest_env(batch_size),
        "ORRERY_CURSOR_KEYS": CURSOR_KEYS,
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "86400",
        "ORRERY_ADMIN_KEY": "bench-admin",
        "ORRERY_DATABASE_URL": make_conninfo("", **{**conninfo_to_dict(server), "dbname": name}),
    }
    root = state.with_suffix(".d")
    root.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"size": size, "seed": seed, "env": env, "database": name}
    state.write_text(json.dumps(facts, indent=2))  # written first: `drop` works after a crash
    started: list[subprocess.Popen[bytes]] = []
    try:
        ingest = _http_role("ingest-api", root / "ingest", root / "ingest.log", env)
        started.append(ingest.process)
        started.append(_spawn("relay", root / "relay", root / "relay.log", env))
        started.append(_spawn("project", root / "project", root / "project.log", env))
        worker = _http_role("query-worker", root / "worker", root / "worker.log", env)
        started.append(worker.process)
        deployment = Deployment(root, env, ingest, [worker], started[1:3])
        vocab = Vocabulary.build(random.Random(seed))
        batches = list(corpus_batches(size, batch_size, seed, vocab))
        facts["ingest"] = measure_ingest(deployment, batches, size)
        print(f"ingest: {facts['ingest']['records_per_s']} records/s", file=sys.stderr)
        facts["eligibility"] = _verify_live(deployment)
        facts["vectors_indexed"] = _wait_vectors_indexed(deployment)
        print(f"vectors: {facts['vectors_indexed']}", file=sys.stderr)
    finally:
        stop_processes(started)
    state.write_text(json.dumps(facts, indent=2))
    return facts


def drop(state: Path) -> None:
    import psycopg

    from tests.harness.servers import server_urls

    facts = json.loads(state.read_text())
    drop_harness_resources(facts["env"])
    _drop_qdrant(facts["env"])
    with psycopg.connect(str(server_urls()["postgres"]), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{facts["database"]}" WITH (FORCE)'.encode())


# -- measure ----------------------------------------------------------------------------


@contextlib.contextmanager
def _worker(tree: Path, env: Mapping[str, str], root: Path, label: str) -> Iterator[ServeProcess]:
    """A query worker running the code of `tree` (`python -m` puts the cwd first)."""
    port = free_port()
    data_dir = root / f"measure-{label}"
    log = root / f"measure-{label}.log"
    child = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    child.update({"ORRERY_HOST": LOOPBACK, "PYTHONUNBUFFERED": "1", **env})
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "orrery.cli", "query-worker", "--data-dir", str(data_dir),
             "--host", LOOPBACK, "--port", str(port)],
            cwd=tree, stdout=handle, stderr=subprocess.STDOUT, env=child,
        )  # fmt: skip
    server = ServeProcess(data_dir, port, process, log)
    try:
        with server.client(timeout_s=30.0) as client:
            stop_at = time.monotonic() + 300
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"worker {label} exited:\n{server.log_text()[-3000:]}")
                with contextlib.suppress(httpx.TransportError):
                    ready = client.get("/v1/readiness")
                    if ready.status_code == 200 and ready.json().get("ready"):
                        break
                if time.monotonic() > stop_at:
                    raise RuntimeError(f"worker {label} not ready:\n{server.log_text()[-3000:]}")
                time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _answer(body: Mapping[str, Any]) -> list[tuple[str, int, float, dict[str, Any]]]:
    return [
        (r["document_id"], r["revision"] if "revision" in r else r["metadata"].get("revision"),
         r["score"], r.get("score_breakdown") or {})
        for r in body["results"]
    ]  # fmt: skip


def _pct(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3),
            "mean": round(float(statistics.fmean(values)), 3)}  # fmt: skip


def _summary(samples: list[dict[str, Any]], cpu: Mapping[str, float]) -> dict[str, Any]:
    n = len(samples)
    engine_keys = sorted({k for s in samples for k in s["engine_ms"]})
    return {
        "latency_ms": latency_summary([s["seconds"] for s in samples]),
        "server_total_ms": _pct([s["stages"]["total"] for s in samples]),
        "stage_ms": {
            stage: _pct([s["stages"].get(stage, 0.0) for s in samples]) for stage in STAGES
        },
        "engine_ms": {k: _pct([s["engine_ms"].get(k, 0.0) for s in samples]) for k in engine_keys},
        "worker_cpu_ms_per_query": round(cpu["worker"] * 1000 / n, 3),
        "rescored_count_mean": round(statistics.fmean(s["rescored"] for s in samples), 1),
    }


def measure(
    state: Path, *, queries: int, trees: Mapping[str, Path], seed_offset: int = 1
) -> dict[str, Any]:
    facts = json.loads(state.read_text())
    env = facts["env"]
    vocab = Vocabulary.build(random.Random(facts["seed"]))
    query_rng = random.Random(facts["seed"] + seed_offset)
    warmup = make_queries(query_rng, vocab, 10)
    asked = make_queries(query_rng, vocab, queries)
    root = state.with_suffix(".d")
    from tests.harness.servers import server_status

    servers = {n: s["pid"] for n, s in server_status().items() if s["pid"] is not None}
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    cpu: dict[str, dict[str, float]] = {}
    load_before = _loadavg()
    with contextlib.ExitStack() as stack:
        workers = {
            label: stack.enter_context(_worker(tree, env, root, label))
            for label, tree in trees.items()
        }
        clients = {
            label: stack.enter_context(w.client(REQUEST_TIMEOUT_S)) for label, w in workers.items()
        }
        for query in (*warmup, *asked):  # query vectors into Redis; connections warm
            for client in clients.values():
                client.post(TOPK, json=topk_body(query, 10))
        roles = {**servers, **{f"worker:{label}": w.process.pid for label, w in workers.items()}}
        before = _cpu_snapshot(roles)
        labels = list(trees)
        for i, query in enumerate(asked):
            order = labels if i % 2 == 0 else labels[::-1]
            for label in order:
                ex = exchange(clients[label], "POST", TOPK, body=topk_body(query, 10))
                if ex.response.status_code != 200:
                    raise RuntimeError(f"{label}: {ex.response.status_code} {ex.response.text}")
                body = ex.json()
                plan = body["query_plan"]
                samples[label].append({
                    "seconds": ex.seconds,
                    "stages": plan["latency_ms"],
                    "engine_ms": plan.get("engine_ms") or {},
                    "rescored": plan.get("rescored_count") or 0,
                    "answer": _answer(body),
                })  # fmt: skip
        after = _cpu_snapshot(roles)
    load_after = _loadavg()
    total_queries = queries * len(trees)
    servers_cpu = {
        name: round((after[name] - before[name]) * 1000 / total_queries, 3) for name in servers
    }
    out: dict[str, Any] = {
        "size": facts["size"],
        "queries": queries,
        "load_before": load_before,
        "load_after": load_after,
        "servers_cpu_ms_per_query": servers_cpu,
        "variants": {},
    }
    for label in trees:
        key = f"worker:{label}"
        cpu[label] = {"worker": after[key] - before[key]}
        out["variants"][label] = {"tree": str(trees[label]), **_summary(samples[label], cpu[label])}
    if len(trees) == 2:
        a, b = labels
        same = sum(
            [(d, r, s) for d, r, s, _ in x["answer"]] == [(d, r, s) for d, r, s, _ in y["answer"]]
            for x, y in zip(samples[a], samples[b], strict=True)
        )
        breakdowns = sum(
            [bd for *_, bd in x["answer"]] == [bd for *_, bd in y["answer"]]
            for x, y in zip(samples[a], samples[b], strict=True)
        )
        out["identical_answers"] = {"queries": queries, "ids_order_scores": same,
                                    "score_breakdowns": breakdowns}  # fmt: skip
    return out


# -- client libraries -------------------------------------------------------------------


def _timed(call: Any) -> tuple[Any, float, float]:
    """`call()`, its wall time and this thread's CPU time, in milliseconds."""
    wall, cpu = time.perf_counter(), time.thread_time()
    value = call()
    return value, (time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000


def clients(state: Path, *, queries: int) -> dict[str, Any]:
    """Each query's two search requests (BM25 top 201 with the query's filters; a random
    unit vector's HNSW top 201 with them), replayed per library (module doc): wall time
    and this thread's CPU per call, beside the engine's own `took` / `time`."""
    from opensearchpy import OpenSearch
    from qdrant_client import QdrantClient, models

    from contracts.index import SearchFilter
    from contracts.vector_payload import RETURNED_FIELDS, VECTOR_NAME
    from query.adapters.opensearch_lexical import _FILTER_PATH, _body, _filter_clauses, _text_query
    from query.adapters.qdrant_vectors import _RestQuery, qdrant_filter

    facts = json.loads(state.read_text())
    env = facts["env"]
    vocab = Vocabulary.build(random.Random(facts["seed"]))
    query_rng = random.Random(facts["seed"] + 1)
    make_queries(query_rng, vocab, 10)
    asked = make_queries(query_rng, vocab, queries)
    os_url, qd_url = env["ORRERY_OPENSEARCH_URL"], env["ORRERY_QDRANT_URL"]
    raw = httpx.Client(timeout=30, trust_env=False)
    index = f"{env['ORRERY_OPENSEARCH_INDEX_PREFIX']}-g1"
    collection = f"{env['ORRERY_QDRANT_COLLECTION_PREFIX']}-g1"
    osc = OpenSearch(hosts=[os_url], timeout=10)
    qdc = QdrantClient(url=qd_url, check_compatibility=False)  # as the worker opens it
    rest = _RestQuery.of(qdc)
    assert rest is not None
    rng = np.random.default_rng(7)
    rows: dict[str, list[float]] = {}
    params = {"filter_path": _FILTER_PATH, "search_type": "dfs_query_then_fetch"}
    returned = list(RETURNED_FIELDS)
    fields = ["document_id", "revision", "updated_at_us", "status"]
    for round_ in range(2):  # the first round warms connections and caches
        for query in asked:
            f = query.filters or {}
            status = tuple(f["status"]) if "status" in f else None
            sf = SearchFilter(galaxy=f.get("galaxy"), status=status)
            body = _body(_text_query(query.text, _filter_clauses(sf), ["text"]), 201, fields)
            encoded = json.dumps(body)
            unit = rng.standard_normal(384)
            vector = (unit / np.linalg.norm(unit)).tolist()
            qf = qdrant_filter(sf)
            ef = models.SearchParams(hnsw_ef=201)
            calls = {
                "opensearch_py": partial(osc.search, index=index, body=body, **params),
                "opensearch_httpx": partial(
                    raw.post, f"{os_url}/{index}/_search", params=params, content=encoded,
                    headers={"content-type": "application/json"},
                ),
                "qdrant_client": partial(
                    qdc.query_points, collection, query=vector, using=VECTOR_NAME,
                    query_filter=qf, limit=201, with_payload=returned, with_vectors=False,
                    search_params=ef,
                ),
                "qdrant_rest_urllib3": partial(
                    rest.query, collection, vector, qf, 201, returned, ef, None
                ),
            }  # fmt: skip
            for name, call in calls.items():
                value, wall, cpu = _timed(call)
                if round_ == 0:
                    continue
                rows.setdefault(f"{name}_ms", []).append(wall)
                rows.setdefault(f"{name}_cpu_ms", []).append(cpu)
                if name == "opensearch_httpx":
                    took = float(value.json()["took"])
                    rows.setdefault("opensearch_took_ms", []).append(took)
    # The server's own time of the same vector requests, as raw REST reports it.
    for _ in range(queries):
        unit = rng.standard_normal(384)
        answer = raw.post(
            f"{qd_url}/collections/{collection}/points/query",
            json={"query": (unit / np.linalg.norm(unit)).tolist(), "using": VECTOR_NAME,
                  "limit": 201, "with_payload": returned, "params": {"hnsw_ef": 201}},
        ).json()  # fmt: skip
        rows.setdefault("qdrant_time_ms", []).append(float(answer["time"]) * 1000)
    raw.close()
    osc.close()
    qdc.close()
    rest.close()
    return {"queries": queries, "load": _loadavg(), **{k: _pct(v) for k, v in rows.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--size", type=int, default=100_000)
    b.add_argument("--batch-size", type=int, default=2_000)
    b.add_argument("--seed", type=int, default=42)
    m = sub.add_parser("measure")
    m.add_argument("--queries", type=int, default=300)
    m.add_argument("--base-tree", type=Path)
    m.add_argument("--tree", type=Path, default=REPO_ROOT)
    m.add_argument("--out", type=Path)
    c = sub.add_parser("clients")
    c.add_argument("--queries", type=int, default=200)
    c.add_argument("--out", type=Path)
    d = sub.add_parser("drop")
    for each in (b, m, c, d):
        each.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.size, args.state, batch_size=args.batch_size, seed=args.seed)
    elif args.command == "drop":
        drop(args.state)
        return 0
    elif args.command == "clients":
        result = clients(args.state, queries=args.queries)
    else:
        trees = {"new": args.tree}
        if args.base_tree is not None:
            trees = {"base": args.base_tree, "new": args.tree}
        result = {
            "bench": "servers_topk",
            "utc": utc_now(),
            "git": git_facts(),
            "machine": machine_facts(),
            **measure(args.state, queries=args.queries, trees=trees),
        }
    print(json.dumps(result, indent=2))
    if getattr(args, "out", None):
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
