"""What sharding costs and what global statistics buy, at the lexical adapter (issue 23).

    .venv/bin/python bench/shards.py [--documents 20000] [--queries 200]
        [--shards 1,2,4] [--out docs/bench/shards.json]

One synthetic corpus (seeded: titles of 3 words and bodies of 5-40 words from a
500-word vocabulary with a Zipf-like spread, so term statistics differ from shard to
shard) is written by the projector's `OpenSearchLexicalIndex` into one index per shard
count N on the harness's OpenSearch (`ORRERY_OPENSEARCH_URL`, one node: every shard on
it). The same queries (titles of sampled documents) then run through the query side's
`OpenSearchLexicalSearch` (limit 100, the default candidate depth), interleaved
query by query over every index, once with `dfs_query_then_fetch` (Orrery's default)
and once with `query_then_fetch`. Reported per N and search type: latency p50/p95 (ms)
and, against the N = 1 index, candidate inclusion (|top-100 ∩ reference top-100| / 100),
top-10 overlap and top-10 order agreement (the same document at the same rank). The
indexes are deleted at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    git_facts,
    latency_summary,
    machine_facts,
    utc_now,
    write_json,
)
from contracts.index import SearchFilter, to_index_document  # noqa: E402
from contracts.records import Record  # noqa: E402
from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex  # noqa: E402
from query.adapters.opensearch_lexical import OpenSearchLexicalSearch  # noqa: E402
from tests.harness.servers import server_urls  # noqa: E402

CAP = 100
TOP = 10


def corpus(size: int, seed: int = 23) -> list[Record]:
    rng = random.Random(seed)
    vocabulary = [f"w{i:03d}" for i in range(500)]
    weights = [1.0 / (i + 1) for i in range(len(vocabulary))]
    now = datetime(2026, 6, 1, tzinfo=UTC)
    out = []
    for i in range(size):
        title = " ".join(rng.choices(vocabulary, weights, k=3))
        body = " ".join(rng.choices(vocabulary, weights, k=rng.randint(5, 40)))
        out.append(
            Record.model_validate(
                {
                    "namespace": "bench",
                    "snapshot_kind": "objects",
                    "item_id": f"doc-{i}",
                    "revision": 1,
                    "text": {"title": title, "body": body},
                    "metadata": {"updated_at": now},
                }
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "shards.json")
    args = parser.parse_args()
    url = os.environ.get("ORRERY_OPENSEARCH_URL") or server_urls().get("opensearch")
    if not url:
        print("no OpenSearch: start the harness (make servers-up)", file=sys.stderr)
        return 1
    counts = [int(n) for n in args.shards.split(",")]
    if counts[0] != 1:
        print("--shards must start with 1 (the reference)", file=sys.stderr)
        return 2
    prefix = f"orrery-bench-shards-{uuid.uuid4().hex[:8]}"
    writer = OpenSearchLexicalIndex(url, index_prefix=prefix, refresh="true")
    reader = {
        kind: OpenSearchLexicalSearch(url, index_prefix=prefix, search_type=kind)
        for kind in ("dfs_query_then_fetch", "query_then_fetch")
    }
    records = corpus(args.documents)
    docs = [to_index_document(r, None) for r in records]
    queries = [r.text.title for r in random.Random(5).sample(records, args.queries)]
    load_s: dict[int, float] = {}
    try:
        for n in counts:
            started = time.perf_counter()
            writer.create(f"n{n}", shards=n)
            for start in range(0, len(docs), 2_000):
                writer.apply(f"n{n}", docs[start : start + 2_000], [])
            load_s[n] = round(time.perf_counter() - started, 2)
            print(f"N={n}: {len(docs)} documents loaded in {load_s[n]} s", flush=True)
        for search in reader.values():  # warm-up
            for n in counts:
                for text in queries[:20]:
                    search.search(f"n{n}", text, SearchFilter(), CAP)
        seconds: dict[tuple[int, str], list[float]] = {(n, k): [] for n in counts for k in reader}
        ranked: dict[tuple[int, str], list[list[str]]] = {
            (n, k): [] for n in counts for k in reader
        }
        order = [(n, k) for n in counts for k in reader]
        for i, text in enumerate(queries):
            rotated = order[i % len(order) :] + order[: i % len(order)]
            for n, kind in rotated:
                started = time.perf_counter()
                found = reader[kind].search(f"n{n}", text, SearchFilter(), CAP)
                seconds[(n, kind)].append(time.perf_counter() - started)
                ranked[(n, kind)].append([c.document_id for c in found])
        reference = ranked[(1, "dfs_query_then_fetch")]
        results: list[dict[str, Any]] = []
        for (n, kind), lists in ranked.items():
            inclusion, overlap, agreement = [], [], []
            for made, exact in zip(lists, reference, strict=True):
                if not exact:
                    continue
                inclusion.append(len(set(made) & set(exact)) / len(exact))
                top_made, top_exact = made[:TOP], exact[:TOP]
                overlap.append(len(set(top_made) & set(top_exact)) / len(top_exact))
                same = sum(
                    1 for r, d in enumerate(top_exact) if r < len(top_made) and top_made[r] == d
                )
                agreement.append(same / len(top_exact))
            results.append(
                {
                    "shards": n,
                    "search_type": kind,
                    "latency_ms": latency_summary(seconds[(n, kind)]),
                    "inclusion_mean": round(sum(inclusion) / len(inclusion), 6),
                    "inclusion_min": round(min(inclusion), 6),
                    "top10_overlap_mean": round(sum(overlap) / len(overlap), 6),
                    "top10_order_agreement_mean": round(sum(agreement) / len(agreement), 6),
                    "top10_order_agreement_min": round(min(agreement), 6),
                }
            )
    finally:
        for n in counts:
            writer.drop(f"n{n}")
        writer.close()
        for search in reader.values():
            search.close()
    report = {
        "benchmark": "shards",
        "created_at": utc_now(),
        "documents": args.documents,
        "queries": args.queries,
        "cap": CAP,
        "opensearch": "harness, one node (every shard on one node: the fan-out's price "
        "without the network)",
        "load_seconds": load_s,
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "results": results,
        "machine": machine_facts(),
        "git": git_facts(),
    }
    write_json(args.out, report)
    for row in results:
        lat = row["latency_ms"]
        print(
            f"N={row['shards']} {row['search_type']:<21} p50 {lat['p50']:7.2f} ms "
            f"p95 {lat['p95']:7.2f} ms  inclusion {row['inclusion_mean']:.4f} "
            f"(min {row['inclusion_min']:.2f})  top-10 overlap {row['top10_overlap_mean']:.4f} "
            f"order {row['top10_order_agreement_mean']:.4f} "
            f"(min {row['top10_order_agreement_min']:.2f})"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
