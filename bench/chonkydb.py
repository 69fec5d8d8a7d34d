"""The ChonkyDB dialect's overhead: the same `topk_records` query in Orrery's own request
shape and in ChonkyDB's (Twinr's field set), interleaved on one running server.

    .venv/bin/python bench/chonkydb.py [--size 10000] [--queries 300]
                                       [--out docs/bench/chonkydb.json]

Against a fresh `orrery serve` on 127.0.0.1 (own temp data dir, embedded deployment,
default configuration: response cache on): ingest N synthetic records and wait for the
HNSW build exactly as `bench/topk.py` does (same corpus, same queries: 2-5 words, every
second one filtered on status and galaxy). Then, query by query:

1. warm the query's vector (`POST /v1/external/retrieve`, never response-cached);
2. **miss pair**: one native and one dialect request of that query, each a response-
   cache miss, in alternating order (native first for even queries). To miss, each
   request carries its own never-repeated `updated_before` bound far in the future
   (native: `filters.updated_before`; dialect: `temporal_end`, Twinr's field), which
   every record passes, so both do the same full search, fusion and materialization;
3. **hit pair**: one untimed native request fills the response cache, then a native and
   a dialect request of the plain query, alternating order; both must report
   `query_plan.cache == "hit"` (the dialect maps onto the same cache key), so the pair
   isolates what the dialect itself costs (parse, translate, rename, serialize).

The native body is Orrery's `topk_records` shape (`namespace`, `scope_ref`,
`query_text`, `result_limit`, `filters`, `timeout_seconds`); the dialect body is what
Twinr's `ChonkyDBTopKRecordsRequest.to_payload()` sends for a scope query (`mode`,
`query_text`, `result_limit`, `include_content`, `include_metadata`, `timeout_seconds`,
`filters`, `namespace`, `scope_ref`). Both ask for the same parts (payload, metadata,
score breakdown, query plan; no content). Every pair's ranked document ids and scores
are compared. Latency is client-side, request sent to body read, over one keep-alive
client. Writes `docs/bench/chonkydb.json` and prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/chonkydb.py`: put the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO_ROOT,
    BenchTimeout,
    deadline,
    exchange,
    git_facts,
    ingest_env,
    latency_summary,
    machine_facts,
    serve,
    source_digest,
    utc_now,
    write_json,
)
from bench.topk import (
    NAMESPACE,
    OPTIMIZE_INTERVAL_S,
    REQUEST_TIMEOUT_S,
    SCOPE_REF,
    WARMUP_QUERIES,
    QuerySpec,
    Vocabulary,
    _progress,
    corpus_batches,
    ingest,
    make_queries,
    retrieve,
    topk_body,
    wait_for_vector_index,
)

console = Console()
TOPK = "/v1/external/retrieve/topk_records"
# Bounds no record reaches (the corpus is dated 2025), one per request, never repeated.
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
PAIRS = ("miss", "hit")


def dialect_body(query: QuerySpec, result_limit: int) -> dict[str, Any]:
    """What Twinr's client sends for a scope query (its `to_payload`, Nones dropped)."""
    body: dict[str, Any] = {
        "mode": "advanced",
        "query_text": query.text,
        "result_limit": result_limit,
        "include_content": False,
        "include_metadata": True,
        "timeout_seconds": REQUEST_TIMEOUT_S,
        "namespace": NAMESPACE,
        "scope_ref": SCOPE_REF,
    }
    if query.filters is not None:
        body["filters"] = dict(query.filters)
    return body


def _bound(counter: list[int]) -> str:
    counter[0] += 1
    return (FAR_FUTURE + timedelta(seconds=counter[0])).strftime("%Y-%m-%dT%H:%M:%SZ")


def _post(client: httpx.Client, body: dict[str, Any], want_cache: str) -> tuple[float, Any]:
    ex = exchange(client, "POST", TOPK, body=body)
    if ex.response.status_code != 200:
        raise RuntimeError(
            f"topk_records: HTTP {ex.response.status_code}: {ex.response.text[:500]}"
        )
    out = ex.json()
    cache = out["query_plan"]["cache"]
    if cache != want_cache:
        raise RuntimeError(f"expected a response-cache {want_cache}, got {cache}: {body}")
    return ex.seconds, out


def _ranking(out: dict[str, Any], id_field: str) -> list[tuple[str, float]]:
    return [(r[id_field], r["score"]) for r in out["results"]]


def measure(
    client: httpx.Client, warmup: Sequence[QuerySpec], queries: Sequence[QuerySpec], limit: int
) -> dict[str, Any]:
    seconds: dict[str, dict[str, list[float]]] = {p: {"native": [], "dialect": []} for p in PAIRS}
    server_total: dict[str, dict[str, list[float]]] = {
        p: {"native": [], "dialect": []} for p in PAIRS
    }
    differing = {p: 0 for p in PAIRS}
    counter = [0]

    def one(i: int, query: QuerySpec, timed: bool) -> None:
        retrieve(client, query, limit)  # the query's vector cached, no response cached
        for pair in PAIRS:
            native = topk_body(query, limit)
            dialect = dialect_body(query, limit)
            if pair == "miss":
                native.setdefault("filters", {})
                native["filters"] = {**native["filters"], "updated_before": _bound(counter)}
                dialect["temporal_end"] = _bound(counter)
            else:
                _post(client, topk_body(query, limit), "miss")  # fills the cache
            order = ("native", "dialect") if i % 2 == 0 else ("dialect", "native")
            answers: dict[str, Any] = {}
            for shape in order:
                took, out = _post(client, native if shape == "native" else dialect, pair)
                answers[shape] = out
                if timed:
                    seconds[pair][shape].append(took)
                    server_total[pair][shape].append(out["query_plan"]["latency_ms"]["total"])
            same = _ranking(answers["native"], "document_id") == _ranking(
                answers["dialect"], "payload_id"
            )
            if timed and not same:
                differing[pair] += 1

    with _progress() as progress:
        task = progress.add_task("warm-up pairs", total=len(warmup), note="")
        for i, query in enumerate(warmup):
            one(i, query, timed=False)
            progress.advance(task)
        task = progress.add_task("timed pairs", total=len(queries), note="")
        for i, query in enumerate(queries):
            one(i, query, timed=True)
            progress.advance(task)

    out: dict[str, Any] = {}
    for pair in PAIRS:
        native = latency_summary(seconds[pair]["native"])
        dialect = latency_summary(seconds[pair]["dialect"])
        deltas = sorted(
            d - n for d, n in zip(seconds[pair]["dialect"], seconds[pair]["native"], strict=True)
        )
        out[pair] = {
            "native_ms": native,
            "dialect_ms": dialect,
            "p50_difference_ms": round(dialect["p50"] - native["p50"], 3),
            "p95_difference_ms": round(dialect["p95"] - native["p95"], 3),
            "paired_difference_median_ms": round(deltas[len(deltas) // 2] * 1000.0, 3),
            "server_total_p50_ms": {
                shape: round(sorted(v)[len(v) // 2], 3) for shape, v in server_total[pair].items()
            },
            "rankings_differing": differing[pair],
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    vocab = Vocabulary.build(random.Random(args.seed))
    batches = list(corpus_batches(args.size, args.batch_size, args.seed, vocab))
    query_rng = random.Random(args.seed + 1)
    warmup = make_queries(query_rng, vocab, WARMUP_QUERIES)
    queries = make_queries(query_rng, vocab, args.queries)
    env = {
        **ingest_env(args.batch_size),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
        "ORRERY_MAX_RESULT_LIMIT": str(max(args.result_limit, 100)),
    }
    result: dict[str, Any] = {"size": args.size, "server_source_sha256": source_digest()}
    with serve(env) as server, server.client() as client:
        result["ingest"] = ingest(server, client, batches, args.size)
        del batches
        result["vector_index_wait_stable"] = wait_for_vector_index(
            server,
            client,
            warmup,
            result_limit=args.result_limit,
            start_wall=result["ingest"]["wall_start"],
            ready_wall=result["ingest"]["wall_ready"],
            max_wait_s=args.index_wait,
        )["stable"]
        for key in ("wall_start", "wall_ready"):
            result["ingest"].pop(key)
        result["loadavg_before"] = Path("/proc/loadavg").read_text().strip()
        started = time.perf_counter()
        result["pairs"] = measure(client, warmup, queries, args.result_limit)
        result["measure_seconds"] = round(time.perf_counter() - started, 1)
        result["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
        result["server_log_problems"] = server.log_problems()
    return result


def print_table(result: dict[str, Any]) -> None:
    table = Table(title=f"ChonkyDB dialect vs native topk_records, N = {result['size']:,}")
    for column in (
        "pair",
        "native p50/p95 ms",
        "dialect p50/p95 ms",
        "p50 diff ms",
        "paired median diff ms",
        "server total p50 ms (native/dialect)",
        "rankings differing",
    ):
        table.add_column(column)
    for pair in PAIRS:
        r = result["pairs"][pair]
        table.add_row(
            pair,
            f"{r['native_ms']['p50']:.2f} / {r['native_ms']['p95']:.2f}",
            f"{r['dialect_ms']['p50']:.2f} / {r['dialect_ms']['p95']:.2f}",
            f"{r['p50_difference_ms']:+.3f}",
            f"{r['paired_difference_median_ms']:+.3f}",
            "{native:.2f} / {dialect:.2f}".format(**r["server_total_p50_ms"]),
            str(r["rankings_differing"]),
        )
    console.print(table)
    console.print(f"loadavg before: {result['loadavg_before']}  after: {result['loadavg_after']}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=10_000, help="corpus size")
    parser.add_argument("--queries", type=int, default=300, help="timed pairs of each kind")
    parser.add_argument("--result-limit", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=2_000, help="records per POST")
    parser.add_argument("--seed", type=int, default=20_260_101)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "bench" / "chonkydb.json")
    parser.add_argument("--index-wait", type=float, default=900.0, help="max s to wait for HNSW")
    parser.add_argument("--timeout", type=int, default=3_600, help="global timeout in s")
    args = parser.parse_args(argv)
    if args.queries < 1 or args.size < 1:
        parser.error("need a corpus and at least one query")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    git = git_facts()
    started = utc_now()
    try:
        with deadline(args.timeout):
            result = run(args)
    except BenchTimeout as error:
        console.print(f"[red]{error}")
        return 1
    report = {
        "benchmark": "chonkydb",
        "date": started,
        "command": "python bench/chonkydb.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "git": git,
        "machine": {**machine_facts(), "pid": os.getpid()},
        "config": {
            "size": args.size,
            "queries": args.queries,
            "warmup_queries": WARMUP_QUERIES,
            "result_limit": args.result_limit,
            "seed": args.seed,
            "filtered_queries": "every second: status any-of + galaxy",
            "miss_pair": "each request its own far-future updated_before (native: "
            "filters.updated_before, dialect: temporal_end): a response-cache miss",
            "hit_pair": "plain query after an untimed native fill: both response-cache hits",
            "order": "native first on even queries, dialect first on odd ones",
        },
        "result": result,
    }
    write_json(args.out, report)
    print_table(result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
