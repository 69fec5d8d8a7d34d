"""In-process A/B of the side-by-side sources of a large embedded generation: the vector
search called right away (`QueryPorts.lexical_first` off) or once the pool's lexical
search has let the GIL go (on), or the roles swapped; same engines, data and queries.

    .venv/bin/python bench/lexical_first.py --lexical-root DIR --shard DIR
        [--generation g1] [--queries 200] [--rounds 2] [--search-threads N]
        [--out docs/bench/lexical_first.json]

`--lexical-root` holds the generation's tantivy index directory, a copy of a kept
`bench/topk.py --data-root` run's `<N>/data/generations/lexical` (the projector's adapter
opens it and may take its lock files: never a directory a server uses); `--shard` is
the generation's qdrant-edge shard directory (`<N>/data/generations/vectors/<g>+<n>`),
which no other process may hold open, loaded with the adapter's search pool
(`--search-threads`, default `QdrantEdgeTuning`'s; it is persisted in the copy; 0 keeps
what the shard persisted). The queries are `bench/topk.py`'s (its seed, 20
warm-up queries, then `--queries`; every second one filtered on status any-of and
galaxy), the lexical side under the default profile's field boosts at depth 100, the
vector side with seeded random unit vectors (the HNSW's cost, not its answers, matters
here) at depth 100.

Per query and round the arrangements run in turn (who goes first rotates): the lexical
search started on a one-thread pool (`query.overlap.SourcePool`) as the service starts
it (`query.service._start_lexical_first`, or `SourcePool.start`), the vector search on
this thread, then the lexical result; and, not in the service, the roles swapped
(`vector_on_pool`: the vector search on the pool, the lexical one on this thread, which
needs no hand-off wait: the pool thread gets the GIL when tantivy lets it go). Timed
by wall clock: the whole, when tantivy's search was entered (the first
`contracts.timing.gil_let_go`) and when the vector search began, both after the start,
and the vector search itself. The answers are compared. Figures are reported, never
asserted; the gain needs a free core.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/lexical_first.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import query.adapters.tantivy_lexical as query_tantivy
from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.lexical_prune import search_filter
from bench.topk import WARMUP_QUERIES, QuerySpec, Vocabulary, make_queries
from contracts import timing
from contracts.index import Candidate
from projector.adapters.qdrant_edge_vectors import QdrantEdgeTuning, _load_shard
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.overlap import Pending, SourcePool
from query.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE_ID
from query.service import _start_lexical_first

SEED = 20_260_101
DEPTH = 100
VECTOR_DIMENSION = 384
console = Console(stderr=True)
SIDES = ("vector_first", "lexical_first", "vector_on_pool")
_HOOKED = "gil_let_go"


class _Entered:
    """When tantivy's search was first entered: wraps the adapter's `gil_let_go`."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.inner = timing.gil_let_go

    def __call__(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        self.inner()


def _unit_vectors(count: int, seed: int) -> list[tuple[float, ...]]:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(count, VECTOR_DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [tuple(row.tolist()) for row in vectors]


def _summary(values: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(values, dtype=np.float64)
    p50, p95 = np.percentile(ms, [50, 95])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "mean": round(float(ms.mean()), 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    lexical_index = TantivyLexicalIndex(args.lexical_root)
    # As the adapter loads a generation: the search pool `--search-threads` (persisted).
    shard = _load_shard(args.shard, "load the shard", args.search_threads or None)
    generation = args.generation
    lexical = TantivyLexicalSearch(lexical_index.searchable)
    vectors = QdrantEdgeVectorSearch(lambda _generation: shard)
    profile = next(p for p in BUILTIN_PROFILES if p.id == DEFAULT_PROFILE_ID)
    boosts = profile.lexical_boosts()
    vocab = Vocabulary.build(random.Random(args.seed))
    query_rng = random.Random(args.seed + 1)
    warmup = make_queries(query_rng, vocab, WARMUP_QUERIES)
    queries = make_queries(query_rng, vocab, args.queries)
    query_vectors = _unit_vectors(len(warmup) + len(queries), args.seed)
    pool = SourcePool(workers=1)
    entered = _Entered()
    setattr(query_tantivy, _HOOKED, entered)  # the adapter's `gil_let_go`

    def ask(side: str, query: QuerySpec, vector: tuple[float, ...]) -> dict[str, Any]:
        filter = search_filter(query)

        def search_lexical() -> list[Candidate]:
            return lexical.search(generation, query.text, filter, DEPTH, field_boosts=boosts)

        entered.at = None
        started = time.perf_counter()
        if side == "vector_on_pool":
            times: list[float] = []

            def search_vectors() -> list[Candidate]:
                times.append(time.perf_counter())
                found = vectors.search(generation, vector, filter, DEPTH)
                times.append(time.perf_counter())
                return found

            on_pool = pool.start(search_vectors)
            found_lexical = search_lexical()
            found_vectors = on_pool.result(time.perf_counter() + 60.0)
            vector_started, vector_ended = times
        else:
            pending: Pending[list[Candidate]] = (
                _start_lexical_first(pool, search_lexical)
                if side == "lexical_first"
                else pool.start(search_lexical)
            )
            vector_started = time.perf_counter()
            found_vectors = vectors.search(generation, vector, filter, DEPTH)
            vector_ended = time.perf_counter()
            found_lexical = pending.result(time.perf_counter() + 60.0)
        ended = time.perf_counter()
        return {
            "total_ms": (ended - started) * 1000.0,
            "lexical_entered_ms": ((entered.at or ended) - started) * 1000.0,
            "vector_started_ms": (vector_started - started) * 1000.0,
            "vector_ms": (vector_ended - vector_started) * 1000.0,
            "answer": (found_lexical, found_vectors),
        }

    try:
        for i, query in enumerate(warmup):
            for side in SIDES:
                ask(side, query, query_vectors[i])
        samples: dict[str, dict[str, list[float]]] = {
            side: {
                key: []
                for key in ("total_ms", "lexical_entered_ms", "vector_started_ms", "vector_ms")
            }
            for side in SIDES
        }
        identical = compared = 0
        load_before = os.getloadavg()
        for round_ in range(args.rounds):
            for i, query in enumerate(queries):
                turn = (i + round_) % len(SIDES)
                order = SIDES[turn:] + SIDES[:turn]
                answers = {}
                for side in order:
                    got = ask(side, query, query_vectors[len(warmup) + i])
                    answers[side] = got.pop("answer")
                    for key, value in got.items():
                        samples[side][key].append(value)
                compared += 1
                identical += all(answers[side] == answers[SIDES[0]] for side in SIDES)
        load_after = os.getloadavg()
    finally:
        setattr(query_tantivy, _HOOKED, entered.inner)
        pool.close()
        shard.close()
        lexical_index.close()
    return {
        "benchmark": "lexical_first",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "lexical_root": str(args.lexical_root),
            "shard": str(args.shard),
            "search_threads": args.search_threads or "as the shard persisted",
            "generation": generation,
            "queries": args.queries,
            "warmup_queries": WARMUP_QUERIES,
            "rounds": args.rounds,
            "depth": DEPTH,
            "seed": args.seed,
            "profile": DEFAULT_PROFILE_ID,
            "query_vectors": "seeded random unit vectors",
            "timing": "wall clock per query; the two arrangements interleaved, first alternating",
        },
        "loadavg_1m": {"before": load_before[0], "after": load_after[0]},
        "identical_answers": f"{identical}/{compared}",
        "ms": {
            side: {key: _summary(values) for key, values in samples[side].items()} for side in SIDES
        },
    }


def table(result: dict[str, Any]) -> None:
    out = Table(title="side-by-side sources, ms (p50 / p95)")
    out.add_column("arrangement")
    keys = ("total_ms", "lexical_entered_ms", "vector_started_ms", "vector_ms")
    for key in keys:
        out.add_column(key.removesuffix("_ms").replace("_", " "), justify="right")
    for side in SIDES:
        row = result["ms"][side]
        out.add_row(side, *(f"{row[key]['p50']:.2f} / {row[key]['p95']:.2f}" for key in keys))
    console.print(out)
    console.print(f"identical answers {result['identical_answers']}, load {result['loadavg_1m']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lexical-root", type=Path, required=True)
    parser.add_argument("--shard", type=Path, required=True)
    parser.add_argument("--generation", default="g1")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--search-threads",
        type=int,
        default=QdrantEdgeTuning().max_search_threads or 0,
        help="qdrant-edge's search pool, loaded as the adapter loads it (0: as persisted)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/bench/lexical_first.json"))
    args = parser.parse_args(argv)
    result = run(args)
    write_json(args.out, result)
    table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
