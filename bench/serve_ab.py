"""Interleaved A/B of the one-shot query's fixed cost over real HTTP: two `orrery serve`.

    .venv/bin/python bench/serve_ab.py --a /work/main --b . --data-dir DIR
        [--corpus topk|scifact] [--queries 200] [--env-a NAME=VALUE] [--env-b NAME=VALUE]
        [--out FILE.json]

1. Copies `--data-dir` (an embedded data dir of `bench/topk.py`'s corpus, e.g. the one
   `bench/hotpath_ab.py --data-dir` built; `--corpus scifact`: the SciFact one
   `hotpath_ab.py --corpus scifact --data-dir` built) once per tree and starts `orrery
   serve` on each copy with that tree's code (`PYTHONPATH=<tree>`) and its `--env-a` /
   `--env-b` variables (one tree against itself under two settings), response cache on
   (the default configuration).
2. Warms each server up (50 queries) and caches every timed query's vector through
   `retrieve` (no response is cached by it). SciFact: its test queries as
   `bench/versus_qdrant.py` sends them, each once (`--queries` at most 250).
3. Query by query, alternating which side goes first: `topk_records` once (a response
   cache miss, checked via `query_plan.cache`) and once more (a hit), then `GET
   /healthz` (the HTTP floor), on A and on B, with one keep-alive httpx client per
   server. With `--env-a ORRERY_CACHE_RESPONSES=false --env-b ...` (as
   `versus_qdrant.py` serves) both calls are ranked: "miss" is the first, "hit" the
   second look at the same query (its records then kept by the record cache).
4. Reports whether A and B returned the same ids and `payload_sha256` (scores carry
   freshness, which moves with the wall clock between the two calls), the client-side
   p50/p95/p99 of misses, hits and `/healthz`, the server's `latency_ms.total`, the difference
   (client minus server: what is spent outside the service), the server process's CPU
   time per query (all its threads, from /proc) and the B/A ratios.

Figures are reported, never asserted; under load, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/serve_ab.py`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import ServeProcess, ask_topk, exchange, print_report, start_serve
from bench.hotpath_ab import WARMUP, _pct, _queries, _scifact_queries
from bench.topk import retrieve, topk_body
from bench.versus_qdrant import orrery_body, warm_query_vector

TOPK = "/v1/external/retrieve/topk_records"
_PCTS = (("p50", 50), ("p95", 95), ("p99", 99))


def _start(
    tree: Path, data_dir: Path, work: Path, name: str, extra: Mapping[str, str]
) -> ServeProcess:
    copy = work / name
    shutil.copytree(data_dir, copy)
    env = {**extra, "PYTHONPATH": str(tree.resolve())}
    # `python -m` imports its working directory's code before PYTHONPATH's: run in `tree`
    # (before session 21 both servers ran the bench's own tree, whatever `--a` said).
    return start_serve(copy, work / f"{name}.log", env, tree=tree.resolve())


def _ask(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    ex, answer = ask_topk(client, body=body)
    plan = answer["query_plan"]
    return {
        "ms": ex.seconds * 1000.0,
        "total": plan["latency_ms"]["total"],
        "cache": plan["cache"],
        "answer": [[r["document_id"], r["metadata"]["payload_sha256"]] for r in answer["results"]],
    }


def _summary(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    client = [s["ms"] for s in samples]
    total = [s["total"] for s in samples]
    outside = [s["ms"] - s["total"] for s in samples]
    return {
        "client_ms": {
            p: round(_pct(client, q), 3) for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
        },
        "server_total_ms": {p: round(_pct(total, q), 3) for p, q in (("p50", 50), ("p95", 95))},
        "outside_service_ms_p50": round(_pct(outside, 50), 3),
    }


def _healthz(client: httpx.Client) -> float:
    ex = exchange(client, "GET", "/healthz")
    if ex.response.status_code != 200:
        raise RuntimeError(f"/healthz: HTTP {ex.response.status_code}")
    return ex.seconds * 1000.0


def _corpus(
    corpus: str, count: int
) -> tuple[list[dict[str, Any]], Callable[[httpx.Client, dict[str, Any]], None]]:
    """`count` one-shot bodies of `corpus` (the first `WARMUP` for the warm-up) and how
    to have a server cache one's query vector without caching its answer."""
    if corpus == "scifact":
        # SciFact's test queries as `versus_qdrant.py` sends them (each one once: a
        # second time would be a response-cache hit).
        texts = _scifact_queries()
        if count > len(texts):
            raise ValueError(f"SciFact has {len(texts)} queries: at most {len(texts) - WARMUP}")
        bodies = [orrery_body(text) for text in texts[:count]]
        return bodies, lambda client, body: warm_query_vector(client, body["query_text"])
    pairs = [(topk_body(query, 10), query) for query in _queries(count)]
    specs = {id(body): query for body, query in pairs}

    def cache_vector(client: httpx.Client, body: dict[str, Any]) -> None:
        retrieve(client, specs[id(body)], 10)

    return [body for body, _ in pairs], cache_vector


def compare(
    a: Path,
    b: Path,
    data_dir: Path,
    count: int,
    envs: Mapping[str, Mapping[str, str]] | None = None,
    corpus: str = "topk",
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="orrery-serve-ab-"))
    servers: dict[str, ServeProcess] = {}
    try:
        for side, tree in (("A", a), ("B", b)):
            servers[side] = _start(tree, data_dir, work, side, (envs or {}).get(side, {}))
        clients = {side: s.client() for side, s in servers.items()}
        bodies, cache_vector = _corpus(corpus, count + WARMUP)
        warm, timed = bodies[:WARMUP], bodies[WARMUP:]
        for side, client in clients.items():
            for body in warm:
                _ask(client, body)
            for body in timed:
                cache_vector(client, body)
            print(f"{side} warm", file=sys.stderr)
        load_before = Path("/proc/loadavg").read_text().strip()
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {
            side: {"miss": [], "hit": []} for side in clients
        }
        # Server CPU seconds (all its threads) while answering, by side and path: /proc's
        # clock ticks are coarse, their sum over every query is not.
        cpu_s = {side: {"miss": 0.0, "hit": 0.0} for side in clients}
        healthz: dict[str, list[float]] = {side: [] for side in clients}
        same = different = 0
        for index, body in enumerate(timed):
            order = ("A", "B") if index % 2 == 0 else ("B", "A")
            answers = {}
            for side in order:
                cpu = servers[side].cpu_seconds
                before = cpu()
                miss = _ask(clients[side], body)
                between = cpu()
                hit = _ask(clients[side], body)
                cpu_s[side]["miss"] += between - before
                cpu_s[side]["hit"] += cpu() - between
                # Response cache off on a side (`ORRERY_CACHE_RESPONSES=false`): both calls
                # are ranked, the second as a second look at the same query.
                if (miss["cache"], hit["cache"]) not in (("miss", "hit"), ("disabled",) * 2):
                    raise RuntimeError(f"{side}: cache states {miss['cache']}, {hit['cache']}")
                if miss["answer"] != hit["answer"]:
                    raise RuntimeError(f"{side}: a cache hit answered differently")
                healthz[side].append(_healthz(clients[side]))
                samples[side]["miss"].append(miss)
                samples[side]["hit"].append(hit)
                answers[side] = miss["answer"]
            if answers["A"] == answers["B"]:
                same += 1
            else:
                different += 1
        load_after = Path("/proc/loadavg").read_text().strip()
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    sides = {
        side: {path: _summary(s) for path, s in by_path.items()}
        for side, by_path in samples.items()
    }
    for side, paths in cpu_s.items():
        for path, seconds in paths.items():
            sides[side][path]["server_cpu_ms_per_query"] = round(seconds * 1000.0 / count, 3)
        sides[side]["healthz_ms"] = {p: round(_pct(healthz[side], q), 3) for p, q in _PCTS}
    return {
        "benchmark": "serve_ab",
        "trees": {"A": str(a), "B": str(b)},
        "env": {side: dict(e) for side, e in (envs or {}).items()},
        "corpus": corpus,
        "queries": count,
        "same_answers": same,
        "different_answers": different,
        "loadavg": {"before": load_before, "after": load_after},
        "sides": sides,
        "b_over_a": {
            f"{path}_{what}_{p}": round(sides["B"][path][what][p] / sides["A"][path][what][p], 3)
            for path in ("miss", "hit")
            for what in ("client_ms", "server_total_ms")
            for p in ("p50", "p95")
        }
        | {
            f"{path}_server_cpu_per_query": round(
                sides["B"][path]["server_cpu_ms_per_query"]
                / sides["A"][path]["server_cpu_ms_per_query"],
                3,
            )
            for path in ("miss", "hit")
        }
        | {
            f"healthz_{p}": round(sides["B"]["healthz_ms"][p] / sides["A"]["healthz_ms"][p], 3)
            for p in ("p50", "p95")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--a", type=Path, required=True, help="tree A (e.g. /work/main)")
    parser.add_argument("--b", type=Path, required=True, help="tree B")
    parser.add_argument("--data-dir", type=Path, required=True, help="a ready data dir")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--corpus",
        choices=("topk", "scifact"),
        default="topk",
        help="the data dir's corpus: bench/topk.py's (default) or SciFact's (hotpath_ab.py "
        "--corpus scifact --data-dir DIR), queried as versus_qdrant.py queries it",
    )
    for side in ("a", "b"):
        parser.add_argument(
            f"--env-{side}",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"an environment variable for tree {side.upper()}'s server (repeatable)",
        )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    if not (args.data_dir / "orrery.sqlite").exists():
        parser.error(f"{args.data_dir} holds no orrery.sqlite")
    os.environ.pop("ORRERY_DATA_DIR", None)
    envs = {
        side: dict(item.split("=", 1) for item in getattr(args, f"env_{side.lower()}"))
        for side in ("A", "B")
    }
    if args.corpus == "scifact":
        # The namespace language `versus_qdrant.py` gives SciFact (the servers start
        # without this environment's ORRERY_* variables).
        from bench.quality import NAMESPACE

        language = json.dumps({NAMESPACE: "english"})
        for env in envs.values():
            env.setdefault("ORRERY_NAMESPACE_LANGUAGES", language)
    report = compare(args.a, args.b, args.data_dir, args.queries, envs, args.corpus)
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
