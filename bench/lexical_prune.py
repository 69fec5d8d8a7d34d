"""In-process A/B of the tantivy lexical search on a built generation: the query as it
was before session 18 (every matching document scored: `WholeQuery`) against today's
adapter (a pruned search, `query.adapters.tantivy_lexical._Pruning`, where it can prove
its answer; else the whole query, as a bare union when nothing needs excluding), same
index, same queries, one thread.

    .venv/bin/python bench/lexical_prune.py --root DIR --generation g1 [--queries 200]
        [--rounds 3] [--depth 100] [--out docs/bench/lexical_prune.json]

`--root` holds the generation's tantivy index directory, e.g. a copy of a kept
`bench/topk.py --data-root` run's `<N>/data/generations/lexical` (the projector's
adapter opens it and may take its lock files: never point it at a data dir a server
uses). The queries are `bench/topk.py`'s (its seed, 20 warm-up queries, then
`--queries`; every second one filtered on status any-of and galaxy), searched under the
default profile's field boosts at the lexical candidate depth, as the one-shot's lexical
source does.

Per round and query, both adapters answer in turn (who goes first alternates). Each call
is timed by the calling thread's CPU time (tantivy searches on the calling thread, so
the figure hardly moves when other processes compete for the CPUs) and by wall clock;
the two answers are compared (ids, revisions, float32 scores, order). Separately, not
timed, it counts the queries the pruned path answered itself (the rest ran the whole
query) and compares `--sweep` more queries (another seed) at limits 10, `--depth` and
5 x `--depth` under three sets of field boosts. Writes JSON and prints a table; figures
are reported, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tantivy
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/lexical_prune.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import query.adapters.tantivy_lexical as query_tantivy
from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.topk import WARMUP_QUERIES, QuerySpec, Vocabulary, make_queries
from contracts.index import Candidate, SearchFilter, field_boosts
from contracts.index_fields import has_combined_field
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE_ID

SEED = 20_260_101
console = Console(stderr=True)


def search_filter(query: QuerySpec) -> SearchFilter:
    """The filter the server searches `query` with (the bench scope adds none)."""
    if query.filters is None:
        return SearchFilter()
    return SearchFilter(galaxy=query.filters["galaxy"], status=tuple(query.filters["status"]))


def _timed(call: Callable[[], list[Candidate]]) -> tuple[float, float, list[Candidate]]:
    cpu, wall = time.thread_time(), time.perf_counter()
    found = call()
    return time.thread_time() - cpu, time.perf_counter() - wall, found


def _summary(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    p50, p95 = np.percentile(ms, [50, 95])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "mean": round(float(ms.mean()), 3),
    }


class WholeQuery:
    """The search before session 18, rebuilt from the adapter's own parts: the text
    query inside a boolean query with the hidden-document exclusion and the filters,
    every matching document scored (`query.adapters.tantivy_lexical` as of 897fcbf)."""

    def __init__(self, lexical: TantivyLexicalIndex) -> None:
        self._lexical = lexical
        self._statuses = query_tantivy._StatusNames()

    def search(
        self,
        generation: str,
        text: str,
        filter: SearchFilter,
        limit: int,
        *,
        field_boosts: dict[str, float] | None = None,
    ) -> list[Candidate]:
        index, analyzer_name, analyzer = self._lexical.searchable(generation)
        schema = index.schema
        boosts = query_tantivy._boosts(
            field_boosts, combined_field=has_combined_field(analyzer_name)
        )
        terms = list(dict.fromkeys(analyzer.analyze(text)))
        restriction = query_tantivy._filter_query(schema, filter, analyzer)
        searcher = index.searcher()
        read = query_tantivy._HitReader(searcher, generation, self._statuses)
        clauses = [
            (tantivy.Occur.Must, query_tantivy._text_query(schema, terms, boosts)),
            query_tantivy._hidden(schema),
        ]
        if restriction is not None:
            const = tantivy.Query.const_score_query(restriction, 0.0)
            clauses.append((tantivy.Occur.Must, const))
        query = tantivy.Query.boolean_query(clauses)
        fetch = limit + 1  # widened past the boundary's ties, one more pass each time
        while True:
            hits = searcher.search(query, fetch, count=False).hits
            if len(hits) < fetch or hits[-1][0] < hits[limit - 1][0]:
                break
            fetch *= 2
        if len(hits) > limit:
            boundary = hits[limit - 1][0]
            hits = [hit for hit in hits if hit[0] >= boundary]
        return query_tantivy._best(hits, limit, read)


def _pruned_answers(
    lexical: TantivyLexicalIndex,
    generation: str,
    queries: Sequence[QuerySpec],
    boosts: dict[str, float] | None,
    depth: int,
    min_postings: int,
) -> int:
    """How many of `queries` the pruned path answers itself."""
    index, analyzer_name, analyzer = lexical.searchable(generation)
    schema = index.schema
    effective = field_boosts(boosts, combined_field=has_combined_field(analyzer_name))
    answered = 0
    for query in queries:
        searcher = index.searcher()
        terms = list(dict.fromkeys(analyzer.analyze(query.text)))
        filters = [query_tantivy._hidden(schema)]
        restriction = query_tantivy._filter_query(schema, search_filter(query), analyzer)
        if restriction is not None:
            const = tantivy.Query.const_score_query(restriction, 0.0)
            filters.append((tantivy.Occur.Must, const))
        text_query = query_tantivy._text_query(schema, terms, effective)
        pruning = query_tantivy._Pruning(searcher, schema, text_query, filters, depth)
        found = pruning.hits(terms, effective, min_postings)
        answered += found is not None
    return answered


# The sweep's field boosts: `weighted@3`'s, the default (title x2, body, tags), and one
# spread over three fields with boosts other than 1.
SWEEP_BOOSTS: tuple[dict[str, float] | None, ...] = (
    {"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0},
    None,
    {"title": 0.5, "body": 3.0, "text": 0.25},
)


def sweep(
    sides: dict[str, WholeQuery | TantivyLexicalSearch],
    generation: str,
    vocab: Vocabulary,
    count: int,
    seed: int,
    depth: int,
) -> dict[str, Any]:
    """Untimed: `count` more queries of the same generator (another seed), each at a
    limit of 10, `depth` or 5 x `depth` under one of `SWEEP_BOOSTS`; how many answers
    are identical."""
    queries = make_queries(random.Random(seed), vocab, count)
    identical = 0
    for i, query in enumerate(queries):
        limit = (10, depth, 5 * depth)[i % 3]
        boosts = SWEEP_BOOSTS[(i // 3) % 3]
        filter = search_filter(query)
        answers = [
            side.search(generation, query.text, filter, limit, field_boosts=boosts)
            for side in sides.values()
        ]
        identical += answers[0] == answers[1]
    return {
        "queries": count,
        "seed": seed,
        "limits": [10, depth, 5 * depth],
        "field_boosts": list(SWEEP_BOOSTS),
        "identical_answers": f"{identical}/{count}",
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    lexical = TantivyLexicalIndex(args.root)
    generation = args.generation
    profile = next(p for p in BUILTIN_PROFILES if p.id == DEFAULT_PROFILE_ID)
    boosts = profile.lexical_boosts()
    sides: dict[str, WholeQuery | TantivyLexicalSearch] = {
        "whole": WholeQuery(lexical),
        "pruned": TantivyLexicalSearch(lexical.searchable, prune_min_postings=args.min_postings),
    }
    vocab = Vocabulary.build(random.Random(args.seed))
    query_rng = random.Random(args.seed + 1)
    warmup = make_queries(query_rng, vocab, WARMUP_QUERIES)
    queries = make_queries(query_rng, vocab, args.queries)
    documents = lexical.searchable(generation)[0].searcher().num_docs

    def ask(side: WholeQuery | TantivyLexicalSearch, query: QuerySpec) -> list[Candidate]:
        filter = search_filter(query)
        return side.search(generation, query.text, filter, args.depth, field_boosts=boosts)

    for query in warmup:
        for side in sides.values():
            ask(side, query)
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    wall: dict[str, list[float]] = {name: [] for name in sides}
    identical = compared = 0
    load_before = os.getloadavg()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("whole / pruned, interleaved", total=args.rounds * len(queries))
        for round_ in range(args.rounds):
            for i, query in enumerate(queries):
                order = ("whole", "pruned") if (i + round_) % 2 == 0 else ("pruned", "whole")
                answers: dict[str, list[Candidate]] = {}
                for name in order:
                    spent_cpu, spent_wall, answers[name] = _timed(
                        functools.partial(ask, sides[name], query)
                    )
                    cpu[name].append(spent_cpu)
                    wall[name].append(spent_wall)
                compared += 1
                identical += answers["whole"] == answers["pruned"]
                progress.advance(task)
    load_after = os.getloadavg()
    answered = _pruned_answers(lexical, generation, queries, boosts, args.depth, args.min_postings)
    swept = sweep(sides, generation, vocab, args.sweep, args.seed + 2, args.depth)
    lexical.close()
    result: dict[str, Any] = {
        "benchmark": "lexical_prune",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "root": str(args.root),
            "generation": generation,
            "documents": documents,
            "queries": args.queries,
            "warmup_queries": WARMUP_QUERIES,
            "rounds": args.rounds,
            "depth": args.depth,
            "seed": args.seed,
            "profile": DEFAULT_PROFILE_ID,
            "field_boosts": boosts,
            "prune_min_postings": args.min_postings,
            "filtered_queries": "every second: status any-of + galaxy (bench/topk.py)",
            "timing": "per call: the calling thread's CPU time (tantivy searches on it) "
            "and wall clock; the two sides interleaved query by query, first side "
            "alternating",
        },
        "loadavg_1m": {"before": load_before[0], "after": load_after[0]},
        "identical_answers": f"{identical}/{compared}",
        "answered_pruned": f"{answered}/{len(queries)}",
        "sweep": swept,
        "cpu_ms": {name: _summary(values) for name, values in cpu.items()},
        "wall_ms": {name: _summary(values) for name, values in wall.items()},
    }
    result["ratios_pruned_over_whole"] = {
        f"{clock}_{stat}": round(
            result[f"{clock}_ms"]["pruned"][stat] / result[f"{clock}_ms"]["whole"][stat], 3
        )
        for clock in ("cpu", "wall")
        for stat in ("p50", "p95", "mean")
    }
    return result


def table(result: dict[str, Any]) -> None:
    out = Table(title=f"tantivy search, {result['config']['documents']:,} documents (ms)")
    out.add_column("side")
    for column in ("cpu p50", "cpu p95", "cpu mean", "wall p50", "wall p95"):
        out.add_column(column, justify="right")
    for name in ("whole", "pruned"):
        cpu, wall = result["cpu_ms"][name], result["wall_ms"][name]
        out.add_row(
            name,
            *(f"{cpu[s]:.2f}" for s in ("p50", "p95", "mean")),
            *(f"{wall[s]:.2f}" for s in ("p50", "p95")),
        )
    console.print(out)
    console.print(
        f"identical answers {result['identical_answers']} (sweep "
        f"{result['sweep']['identical_answers']}), answered pruned "
        f"{result['answered_pruned']}, load {result['loadavg_1m']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--generation", default="g1")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--sweep", type=int, default=600, help="untimed queries compared")
    parser.add_argument(
        "--min-postings", type=int, default=query_tantivy.DEFAULT_PRUNE_MIN_POSTINGS
    )
    parser.add_argument("--out", type=Path, default=Path("docs/bench/lexical_prune.json"))
    args = parser.parse_args(argv)
    result = run(args)
    write_json(args.out, result)
    table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
