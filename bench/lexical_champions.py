"""Would champion lists answer the queries `_Pruning` leaves to the whole query? A
measurement, not a feature (session 18: they do not pay; `docs/bench/README.md`).

    .venv/bin/python bench/lexical_champions.py --root DIR --generation g1 [--n 1000 5000]
        [--min-df 100000] [--depth 100] [--out docs/bench/lexical_champions.json]

`--root` as in `bench/lexical_prune.py` (a copy: the adapter may take lock files). For
each (term, field) clause holding at least `--min-df` documents, its champion list is
its top `N` documents by that clause's own tantivy score (a single boosted term query)
and its bound outside the list is the `N`-th score. A query is answered from the union
of its clauses' lists (plus every document of its rarer clauses) by the whole query
restricted to them with a zero constant score (tantivy-py 0.27 has no query on document
addresses: the restriction is a term set on `document_id`), accepted when its `limit`-th
score exceeds the sum of the bounds. Only `bench/topk.py`'s queries (seed, warm-up, 200)
that the pruned search does not answer itself are measured: per query the whole query
and the champion answer, interleaved, by thread CPU time; the accepted answers are
compared with the whole query's (scores, addresses, order). Lists are built untimed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tantivy

if __package__ in (None, ""):  # run as `python bench/lexical_champions.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import query.adapters.tantivy_lexical as query_tantivy
from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.lexical_prune import SEED, search_filter
from bench.topk import WARMUP_QUERIES, Vocabulary, make_queries
from contracts.index import field_boosts
from contracts.index_fields import (
    DOCUMENT_ID,
    DOCUMENT_KEY_HIGH,
    DOCUMENT_KEY_LOW,
    FACETS,
    document_id_of_key,
    has_combined_field,
    hidden_term,
)
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE_ID

_Champions = tuple[float, list[str]]


def _champions(
    searcher: tantivy.Searcher, schema: tantivy.Schema, field: str, term: str, boost: float, n: int
) -> _Champions:
    """The clause's `n`-th best score (0 if it holds fewer) and its top `n` documents' ids."""
    query = tantivy.Query.term_query(schema, field, term, index_option="freq")
    if boost != 1.0:
        query = tantivy.Query.boost_query(query, boost)
    hits = searcher.search(query, n, count=False).hits
    addresses = [address for _score, address in hits]
    highs = searcher.fast_field_values(DOCUMENT_KEY_HIGH, addresses)
    lows = searcher.fast_field_values(DOCUMENT_KEY_LOW, addresses)
    ids = [document_id_of_key(high, low) for high, low in zip(highs, lows, strict=True)]
    return (float(hits[-1][0]) if len(hits) >= n else 0.0), ids


def _ms(values: list[float]) -> dict[str, float]:
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    p50, p95 = np.percentile(ms, [50, 95]) if len(ms) else (0.0, 0.0)
    total = float(ms.sum())
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3), "sum": round(total, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    lexical = TantivyLexicalIndex(args.root)
    index, analyzer_name, analyzer = lexical.searchable(args.generation)
    schema, searcher = index.schema, index.searcher()
    profile = next(p for p in BUILTIN_PROFILES if p.id == DEFAULT_PROFILE_ID)
    boosts = field_boosts(
        profile.lexical_boosts(), combined_field=has_combined_field(analyzer_name)
    )
    vocab = Vocabulary.build(random.Random(SEED))
    rng = random.Random(SEED + 1)
    make_queries(rng, vocab, WARMUP_QUERIES)
    queries = make_queries(rng, vocab, 200)
    hiding = searcher.doc_freq(FACETS, hidden_term("lexical")) > 0
    lists: dict[tuple[int, str, str], _Champions] = {}
    build_s = 0.0
    per_n: dict[int, dict[str, Any]] = {
        n: {"whole": [], "champion": [], "id_set": [], "accepted": 0, "identical": 0}
        for n in args.n
    }
    remaining = 0
    load_before = os.getloadavg()
    for spec in queries:
        terms = list(dict.fromkeys(analyzer.analyze(spec.text)))
        filters: list[tuple[tantivy.Occur, tantivy.Query]] = []
        if hiding:
            filters.append(query_tantivy._hidden(schema))
        restriction = query_tantivy._filter_query(schema, search_filter(spec), analyzer)
        if restriction is not None:
            const = tantivy.Query.const_score_query(restriction, 0.0)
            filters.append((tantivy.Occur.Must, const))
        text_query = query_tantivy._text_query(schema, terms, boosts)
        pruning = query_tantivy._Pruning(searcher, schema, text_query, filters, args.depth)
        if pruning.hits(terms, boosts, query_tantivy.DEFAULT_PRUNE_MIN_POSTINGS) is not None:
            continue
        clauses = [
            (field, term, boost, searcher.doc_freq(field, term))
            for term in terms
            for field, boost in boosts.items()
        ]
        clauses = [clause for clause in clauses if clause[3] > 0]
        if sum(clause[3] for clause in clauses) < query_tantivy.DEFAULT_PRUNE_MIN_POSTINGS:
            continue
        remaining += 1
        whole = (
            tantivy.Query.boolean_query([(tantivy.Occur.Must, text_query), *filters])
            if filters
            else text_query
        )
        for n in args.n:
            ids: set[str] = set()
            bound = 0.0
            rare: list[tantivy.Query] = []
            for field, term, boost, doc_freq in clauses:
                if doc_freq < args.min_df:
                    rare.append(tantivy.Query.term_query(schema, field, term, index_option="basic"))
                    continue
                key = (n, field, term)
                if key not in lists:
                    started = time.perf_counter()
                    lists[key] = _champions(searcher, schema, field, term, boost, n)
                    build_s += time.perf_counter() - started
                bound += lists[key][0]
                ids.update(lists[key][1])
            # Interleaved: whole first on even queries, champion first on odd ones.
            timings: dict[str, float] = {}
            answers: dict[str, list[query_tantivy._Hit]] = {}
            for side in ("whole", "champion") if remaining % 2 else ("champion", "whole"):
                started = time.thread_time()
                if side == "whole":
                    answers[side] = query_tantivy._top_hits(searcher, whole, args.depth)
                else:
                    parts = [tantivy.Query.term_set_query(schema, DOCUMENT_ID, sorted(ids)), *rare]
                    only = (
                        parts[0]
                        if len(parts) == 1
                        else tantivy.Query.boolean_query(
                            [(tantivy.Occur.Should, part) for part in parts]
                        )
                    )
                    query = tantivy.Query.boolean_query(
                        [
                            (tantivy.Occur.Must, text_query),
                            *filters,
                            (tantivy.Occur.Must, tantivy.Query.const_score_query(only, 0.0)),
                        ]
                    )
                    answers[side] = query_tantivy._top_hits(searcher, query, args.depth)
                timings[side] = time.thread_time() - started
            # The restriction alone: the term set on `document_id`, collected bare.
            started = time.thread_time()
            searcher.search(
                tantivy.Query.term_set_query(schema, DOCUMENT_ID, sorted(ids)), 1, count=False
            )
            timings["id_set"] = time.thread_time() - started
            found = answers["champion"]
            accepted = len(found) >= args.depth and found[args.depth - 1][0] > bound * (
                1.0 + query_tantivy._BOUND_SLACK
            )
            row = per_n[n]
            row["whole"].append(timings["whole"])
            row["champion"].append(timings["champion"])
            row["id_set"].append(timings["id_set"])
            row["accepted"] += accepted
            row["identical"] += accepted and [
                (score, address.segment_ord, address.doc) for score, address in found
            ] == [(score, address.segment_ord, address.doc) for score, address in answers["whole"]]
    load_after = os.getloadavg()
    lexical.close()
    return {
        "benchmark": "lexical_champions",
        "date": utc_now(),
        "git": git_facts(),
        "machine": machine_facts(),
        "config": {
            "root": str(args.root),
            "generation": args.generation,
            "documents": searcher.num_docs,
            "depth": args.depth,
            "min_df": args.min_df,
            "field_boosts": boosts,
            "queries": "bench/topk.py's 200 (seed, after the warm-up) the pruned search "
            "leaves to the whole query",
            "restriction": "term set on document_id (union of the lists) OR the rarer clauses",
            "timing": "thread CPU per search, whole and champion interleaved",
        },
        "loadavg_1m": {"before": load_before[0], "after": load_after[0]},
        "queries_measured": remaining,
        "list_build_s": round(build_s, 3),
        "by_n": {
            str(n): {
                "lists": sum(1 for key in lists if key[0] == n),
                "list_entries": sum(len(value[1]) for key, value in lists.items() if key[0] == n),
                "accepted": f"{row['accepted']}/{remaining}",
                "accepted_identical": f"{row['identical']}/{row['accepted']}",
                "whole_cpu_ms": _ms(row["whole"]),
                "champion_cpu_ms": _ms(row["champion"]),
                "id_set_alone_cpu_ms": _ms(row["id_set"]),
            }
            for n, row in per_n.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--generation", default="g1")
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--min-df", type=int, default=100_000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/lexical_champions.json"))
    args = parser.parse_args(argv)
    result = run(args)
    write_json(args.out, result)
    print(result["by_n"], result["loadavg_1m"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
