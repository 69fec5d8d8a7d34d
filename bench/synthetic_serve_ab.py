"""Interleaved A/B of `bench/versus_qdrant_synthetic.py`'s Orrery side: two `orrery serve`.

    .venv/bin/python bench/synthetic_serve_ab.py --a /work/main --b . \\
        --data-dir /work/syn22-root/data [--data-dir-b OTHER/data] [--rounds 3] \\
        [--queries 300] \\
        [--env-a NAME=VALUE] [--env-b NAME=VALUE] [--out FILE.json]

1. Copies `--data-dir` (the data dir a `versus_qdrant_synthetic.py --data-root R` run
   kept: `R/data`) once per tree and starts `orrery serve` on each copy with that tree's
   code and that bench's server settings (response cache off, the namespace indexed
   english), plus `--env-a` / `--env-b` (one tree against itself under two settings);
   with `--data-dir-b`, B copies that one instead (the same data built two ways, say
   `bench/edge_rekey.py`'s integer and UUID point ids).
2. Waits until each answers the lexical side from its in-memory copy (as the bench
   does), caches every query's vector through `retrieve` (as the bench does), then
   warms each up on the bench's 20 warm-up queries, three times.
3. Sends the bench's timed queries to A and B in turn, alternating who goes first,
   `--rounds` times, with one keep-alive httpx client per server.
4. Reports whether every answer was identical (ids, scores, score breakdowns), of the
   others those with the same ranking and their largest score gap, the client-side and
   the server's stage p50/p95 (`query_plan.latency_ms`), the engines' p50
   (`query_plan.engine_ms`), the B/A ratios, and the machine's load before and after.

Figures are reported, never asserted; under load, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/synthetic_serve_ab.py`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import ServeProcess, ask_topk, ingest_env, print_report, start_serve
from bench.hotpath_ab import _pct
from bench.topk import NAMESPACE, OPTIMIZE_INTERVAL_S, SCOPE_REF
from bench.versus_qdrant import LANGUAGE
from bench.versus_qdrant_synthetic import (
    BATCH,
    TOPK,
    WARMUP_QUERIES,
    queries,
    topk_content,
    wait_for_lexical_copy,
)

SIDES = ("A", "B")


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    """`versus_qdrant_synthetic.py`'s server settings, then `extra`."""
    return {
        **ingest_env(BATCH),
        "ORRERY_CACHE_RESPONSES": "false",
        "ORRERY_NAMESPACE_LANGUAGES": json.dumps({NAMESPACE: LANGUAGE}),
        "ORRERY_OPTIMIZE_INTERVAL_SECONDS": f"{OPTIMIZE_INTERVAL_S:g}",
        **extra,
    }


def _start(
    tree: Path, data_dir: Path, work: Path, name: str, extra: Mapping[str, str]
) -> ServeProcess:
    copy = work / name / "data"
    shutil.copytree(data_dir, copy)
    return start_serve(copy, work / f"{name}.log", _env(extra), 600.0, tree=tree.resolve())


def _warm(client: httpx.Client, texts: Sequence[str]) -> float | None:
    """As the bench: wait for the lexical copy, cache every query vector through
    `retrieve`, then the warm-up queries three times; the seconds waited for the copy."""
    waited = wait_for_lexical_copy(client, texts[0])
    for text in reversed(texts):
        body = {"namespace": NAMESPACE, "scope_ref": SCOPE_REF, "query_text": text, "limit": 1}
        client.post("/v1/external/retrieve", json=body).raise_for_status()
    for text in list(texts[:WARMUP_QUERIES]) * 3:
        client.post(TOPK, content=topk_content(text)).raise_for_status()
    return waited


def _ask(client: httpx.Client, text: str) -> dict[str, Any]:
    ex, answer = ask_topk(client, content=topk_content(text))
    plan = answer["query_plan"]
    return {
        "ms": ex.seconds * 1000.0,
        "stages": plan["latency_ms"],
        "engine": plan.get("engine_ms") or {},
        "results": [
            [r["document_id"], r["score"], r["score_breakdown"]] for r in answer["results"]
        ],
    }


def _gap(a: Sequence[Any], b: Sequence[Any]) -> float:
    """The largest difference between the scores or breakdown values of two answers
    ranking the same documents."""
    gap = 0.0
    for (_, score_a, parts_a), (_, score_b, parts_b) in zip(a, b, strict=True):
        gap = max(gap, abs(score_a - score_b))
        for key in parts_a:
            gap = max(gap, abs(float(parts_a[key]) - float(parts_b[key])))
    return gap


def _side(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def pcts(values: Sequence[float]) -> dict[str, float]:
        return {"p50": round(_pct(values, 50), 3), "p95": round(_pct(values, 95), 3)}

    stages = sorted({k for s in samples for k in s["stages"]})
    engines = sorted({k for s in samples for k in s["engine"]})
    return {
        "client_ms": pcts([s["ms"] for s in samples]),
        "stage_ms": {k: pcts([s["stages"].get(k, 0.0) for s in samples]) for k in stages},
        "engine_ms_p50": {
            k: round(_pct([s["engine"].get(k, 0.0) for s in samples], 50), 3) for k in engines
        },
    }


def compare(
    trees: Mapping[str, Path],
    data_dirs: Mapping[str, Path],
    envs: Mapping[str, Mapping[str, str]],
    count: int,
    rounds: int,
) -> dict[str, Any]:
    texts = [spec.text for spec in queries(count)]
    timed = texts[WARMUP_QUERIES:]
    work = Path(tempfile.mkdtemp(prefix="orrery-synthetic-ab-"))
    servers: dict[str, ServeProcess] = {}
    try:
        for side in SIDES:
            servers[side] = _start(trees[side], data_dirs[side], work, side, envs[side])
        clients = {side: server.client() for side, server in servers.items()}
        waited = {side: _warm(clients[side], texts) for side in SIDES}
        load_before = os.getloadavg()
        samples: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        identical = different = same_ranking = 0
        gap = 0.0
        for round_ in range(rounds):
            for index, text in enumerate(timed):
                order = SIDES if (index + round_) % 2 == 0 else SIDES[::-1]
                answers = {side: _ask(clients[side], text) for side in order}
                for side in order:
                    samples[side].append(answers[side])
                a, b = answers["A"]["results"], answers["B"]["results"]
                if a == b:
                    identical += 1
                    continue
                different += 1
                if [r[0] for r in a] == [r[0] for r in b]:
                    same_ranking += 1
                    gap = max(gap, _gap(a, b))
        load_after = os.getloadavg()
        for client in clients.values():
            client.close()
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    sides = {side: _side(s) for side, s in samples.items()}
    return {
        "benchmark": "synthetic_serve_ab",
        "trees": {side: str(tree) for side, tree in trees.items()},
        "env": {side: dict(env) for side, env in envs.items()},
        "queries": len(timed),
        "rounds": rounds,
        "lexical_copy_wait_s": waited,
        "identical_answers": identical,
        "different_answers": different,
        # Of the different ones: the same documents in the same order.
        "different_answers_same_ranking": same_ranking,
        "largest_score_gap": gap,
        "loadavg": {"before": list(load_before), "after": list(load_after)},
        "sides": sides,
        "b_over_a": _ratios(sides),
    }


def _ratios(sides: Mapping[str, dict[str, Any]]) -> dict[str, float]:
    a, b = sides["A"], sides["B"]
    out = {f"client_{p}": round(b["client_ms"][p] / a["client_ms"][p], 3) for p in ("p50", "p95")}
    total_a, total_b = a["stage_ms"].get("total"), b["stage_ms"].get("total")
    if total_a and total_b:
        out.update({f"total_{p}": round(total_b[p] / total_a[p], 3) for p in ("p50", "p95")})
    return out


def _pairs(values: Sequence[str]) -> dict[str, str]:
    """`NAME=VALUE` arguments as a dict."""
    return dict(value.split("=", 1) for value in values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--a", type=Path, required=True, help="tree A (e.g. /work/main)")
    parser.add_argument("--b", type=Path, required=True, help="tree B")
    parser.add_argument("--data-dir", type=Path, required=True, help="a kept R/data")
    parser.add_argument("--data-dir-b", type=Path, help="B's kept R/data (else --data-dir)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    report = compare(
        {"A": args.a, "B": args.b},
        {"A": args.data_dir, "B": args.data_dir_b or args.data_dir},
        {"A": _pairs(args.env_a), "B": _pairs(args.env_b)},
        args.queries,
        args.rounds,
    )
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
