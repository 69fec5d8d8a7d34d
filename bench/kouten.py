"""KoutenDB envelope latency over HTTP against `topk_records` on the same corpus and query.

    .venv/bin/python bench/kouten.py [--records 100000] [--rings 1000] [--queries 200]
                                     [--out docs/bench/kouten.json]

Against a fresh `orrery serve` (embedded, own temp data dir):

1. Ingest `--records` synthetic records in `--rings` rings (`t<i>/c<j>`: 50 parents with
   `rings/50` children each), one galaxy. Each ring has a centre vector (384-d) and a few
   words of its own; a record's vector is its ring's centre plus noise, its text its
   ring's words plus shared Zipf-ish words, its payload ~100 bytes (`koutendb.raw.v1`).
   Vectors are given, so nothing is embedded at ingest.
2. Wait until the projector caught up and the qdrant-edge optimizer is quiet (no
   `.optimizing` dir, no child process) and three rounds of probe p50s agree within 20 %.
3. Per query (a ring's words and a vector near its centre; each text unseen before, its
   embedding warmed by one `/plan` call so that no path pays for embedding), interleaved:
   (a) `POST /v1/external/retrieve/topk_records` (`result_limit` 8; a response-cache
       miss, checked), (b) `POST /v1/koutendb/retrieve` global (budget 8, hybrid),
   (c) the envelope scoped to the query's ring, (d) the envelope with `ssNear`
   (top-rings: 73 rings), the four in a rotating order (they share engine caches, so
   none always runs first). Latency is client-side wall time of the whole exchange.

Writes `docs/bench/kouten.json` and prints a table. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/kouten.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    git_facts,
    ingest_env,
    latency_summary,
    machine_facts,
    median,
    poll_readiness,
    serve,
    source_digest,
    utc_now,
    write_json,
)
from bench.topk import optimizer_busy

NAMESPACE = "kbench"
SCOPE_REF = "longterm:objects:current"
DIMENSION = 384
PARENTS = 50
BUDGET = 8
BATCH = 1_000
SHARED_WORDS = tuple(f"w{i}" for i in range(400))
PATHS = ("topk", "envelope_global", "envelope_ring", "envelope_top_rings")
LABELS = {
    "topk": "(a) topk_records",
    "envelope_global": "(b) envelope, global",
    "envelope_ring": "(c) envelope, ring-scoped",
    "envelope_top_rings": "(d) envelope, ssNear top-rings",
}

console = Console(stderr=True)


def ring_names(rings: int) -> list[str]:
    per_parent = max(1, rings // PARENTS)
    return [f"t{i}/c{j}" for i in range(PARENTS) for j in range(per_parent)][:rings]


def unit(vector: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in vector / np.linalg.norm(vector)]


class Corpus:
    """Ring centres and words, a pure function of the seed."""

    def __init__(self, rings: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.rings = ring_names(rings)
        self.centres = self.rng.normal(size=(len(self.rings), DIMENSION))
        self.words = [[f"r{k}x{m}" for m in range(4)] for k in range(len(self.rings))]

    def record(self, n: int) -> dict[str, Any]:
        k = n % len(self.rings)
        rng = random.Random(n)
        vector = self.centres[k] + self.rng.normal(scale=0.8, size=DIMENSION)
        words = [*rng.sample(self.words[k], 2), *rng.choices(SHARED_WORDS, k=6)]
        return {
            "namespace": NAMESPACE,
            "snapshot_kind": "objects",
            "item_id": f"doc-{n}",
            "revision": 1,
            "ring": self.rings[k],
            "payload_schema": "koutendb.raw.v1",
            "payload": {"raw": " ".join(words) + f" #{n:07d} " + "x" * 40},
            "text": {"body": " ".join(words)},
            "vector": unit(vector),
        }

    def query(self, index: int) -> tuple[str, str, list[float]]:
        rng = random.Random(10_000_000 + index)
        k = rng.randrange(len(self.rings))
        text = " ".join([*rng.sample(self.words[k], 2), rng.choice(SHARED_WORDS), f"q{index}"])
        vector = self.centres[k] + self.rng.normal(scale=0.8, size=DIMENSION)
        return self.rings[k], text, unit(vector)


def batches(corpus: Corpus, size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, size, BATCH):
        yield [corpus.record(n) for n in range(start, min(size, start + BATCH))]


def timed(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = client.post(path, json=body)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.text[:500]}")
    out: dict[str, Any] = response.json()
    return elapsed, out


def envelope_body(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "namespace": NAMESPACE,
        "scopeRef": SCOPE_REF,
        "queryText": text,
        "budget": BUDGET,
        "timeoutSeconds": 60,
        **extra,
    }


def settle(
    client: httpx.Client, server: Any, probes: Sequence[str], max_wait_s: float
) -> dict[str, Any]:
    """Probe until the optimizer is quiet and three round p50s agree within 20 %."""
    started = time.perf_counter()
    p50s: list[float] = []
    rounds = 0
    while time.perf_counter() - started < max_wait_s:
        rounds += 1
        busy = optimizer_busy(server) is not None
        seconds = [
            timed(client, "/v1/koutendb/retrieve", envelope_body(text))[0] for text in probes
        ]
        p50s.append(median(seconds))
        last = p50s[-3:]
        if not busy and len(last) == 3 and max(last) - min(last) <= 0.2 * min(last):
            return {
                "stable": True,
                "rounds": rounds,
                "seconds": round(time.perf_counter() - started, 1),
            }
        time.sleep(1.0)
    return {"stable": False, "rounds": rounds, "seconds": round(time.perf_counter() - started, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = Corpus(args.rings, args.seed)
    serve_env = {**ingest_env(BATCH), "ORRERY_OPTIMIZE_INTERVAL_SECONDS": "1"}
    with serve(serve_env) as server, server.client() as client:
        started = time.perf_counter()
        for n, batch in enumerate(batches(corpus, args.records), start=1):
            response = client.post("/v1/records", json=batch)
            if response.status_code != 200:
                raise RuntimeError(response.text[:500])
            if n % 10 == 0:
                console.print(f"posted {n * BATCH} records")

        def caught_up(ready: dict[str, Any]) -> bool:
            scopes = [s for s in ready["scopes"] if s["namespace"] == NAMESPACE]
            return bool(
                scopes
                and ready["ready"]
                and scopes[0]["document_count"] == args.records
                and scopes[0]["applied_position"] >= ready["log_high_water"]
            )

        poll_readiness(server, client, caught_up)
        ingest_s = time.perf_counter() - started
        console.print(f"ingested and projected {args.records} records in {ingest_s:.1f} s")
        settled = settle(
            client, server, [corpus.query(-i - 1)[1] for i in range(10)], args.max_wait
        )
        seconds: dict[str, list[float]] = {path: [] for path in PATHS}
        reduction: dict[str, list[float]] = {path: [] for path in PATHS if path != "topk"}
        scanned: dict[str, list[int]] = {path: [] for path in PATHS if path != "topk"}
        overlap: list[float] = []
        envelopes: dict[str, dict[str, Any]] = {}
        topk: dict[str, Any] = {}
        for i in range(args.queries + args.warmup):
            ring, text, _vector = corpus.query(i)
            timed(client, "/v1/koutendb/plan", envelope_body(text))  # warms the embedding
            measured: dict[str, float] = {}
            # The four calls of one query share engine caches: each path takes each
            # position in turn, so none always runs first (cold) or after the others.
            order = PATHS[i % len(PATHS) :] + PATHS[: i % len(PATHS)]
            for path in order:
                if path == "topk":
                    elapsed, topk = timed(
                        client,
                        "/v1/external/retrieve/topk_records",
                        {
                            "namespace": NAMESPACE,
                            "scope_ref": SCOPE_REF,
                            "query_text": text,
                            "result_limit": BUDGET,
                            "timeout_seconds": 60,
                        },
                    )
                    if topk["query_plan"]["cache"] != "miss":
                        raise RuntimeError(
                            f"topk_records was not a cache miss: {topk['query_plan']}"
                        )
                    measured[path] = elapsed
                    continue
                extra = {
                    "envelope_global": {},
                    "envelope_ring": {"ring": ring},
                    "envelope_top_rings": {"scope": "ssNear"},
                }[path]
                elapsed, answer = timed(
                    client, "/v1/koutendb/retrieve", envelope_body(text, **extra)
                )
                measured[path] = elapsed
                envelopes[path] = answer
                if i >= args.warmup:
                    reduction[path].append(answer["stats"]["candidateReduction"])
                    scanned[path].append(answer["stats"]["scanned"])
            if i >= args.warmup:
                ids = {r["document_id"] for r in topk["results"]}
                same = {c["id"] for c in envelopes["envelope_global"]["chunks"]}
                overlap.append(len(ids & same) / max(1, len(ids)))
            if i >= args.warmup:
                for path, value in measured.items():
                    seconds[path].append(value)
        summary = {path: latency_summary(values) for path, values in seconds.items()}
        ratio = {
            "envelope_global_vs_topk_p50": round(
                summary["envelope_global"]["p50"] / summary["topk"]["p50"], 3
            ),
            "envelope_global_vs_topk_p95": round(
                summary["envelope_global"]["p95"] / summary["topk"]["p95"], 3
            ),
            "envelope_ring_vs_global_p50": round(
                summary["envelope_ring"]["p50"] / summary["envelope_global"]["p50"], 3
            ),
        }
        return {
            "benchmark": "kouten",
            "created_at": utc_now(),
            "command": " ".join(sys.argv),
            "records": args.records,
            "rings": len(corpus.rings),
            "queries": args.queries,
            "budget": BUDGET,
            "ingest_seconds": round(ingest_s, 1),
            "settle": settled,
            "latency_ms": summary,
            "ratios": ratio,
            "target": "envelope retrieve within 1.2x of topk_records (p50/p95)",
            "candidate_reduction_mean": {
                p: round(float(np.mean(v)), 6) for p, v in reduction.items()
            },
            "scanned_mean": {p: round(float(np.mean(v)), 1) for p, v in scanned.items()},
            "global_top8_overlap_with_topk": round(float(np.mean(overlap)), 3),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "machine": machine_facts(),
            "git": git_facts(),
            "source_digest": source_digest(),
        }


def print_table(report: dict[str, Any]) -> None:
    table = Table(
        title=f"KoutenDB envelope, {report['records']} records in {report['rings']} rings"
    )
    for column in ("path", "p50 ms", "p95 ms", "candidateReduction"):
        table.add_column(column)
    for path in PATHS:
        lat = report["latency_ms"][path]
        red = report["candidate_reduction_mean"].get(path)
        table.add_row(
            LABELS[path],
            f"{lat['p50']:.1f}",
            f"{lat['p95']:.1f}",
            "" if red is None else f"{red:.4f}",
        )
    Console().print(table)
    print(json.dumps(report["ratios"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rings", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--max-wait", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/kouten.json"))
    args = parser.parse_args(argv)
    if args.records <= 0 or args.rings <= 0 or not math.isfinite(args.max_wait):
        parser.error("--records and --rings must be positive")
    report = run(args)
    write_json(args.out, report)
    print_table(report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
