"""The embedded lexical search and score lookup, before and after compacting tantivy.

    .venv/bin/python bench/lexical_compaction.py --data-dir DIR [--corpus scifact|topk]
        [--rounds 5] [--out FILE.json]

Works on a copy of `DIR` (a data dir `bench/hotpath_ab.py --data-dir` keeps). For each
generation: keeps a copy of its tantivy index as it is, compacts the generation
(`EmbeddedProjector.compact_lexical`, timed), then times (thread CPU)
`TantivyLexicalSearch.search` (top 100, no filter) and `scores` (the 70 ids the same
query ranks 101-170: candidates the vector side brings that the text matches) for every
query on the old copy and the compacted index in turn (`--rounds` rounds, the order
alternating), and reports the segment counts, the p50/p95 CPU per call of each, whether
every answer (ids and scores) is identical, and whether `evidence` (count and id-set
digest) is unchanged.
The load average is recorded before and after. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/lexical_compaction.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_report
from bench.hotpath_ab import SEED, _queries, _scifact_env, _scifact_queries, _stack

LIMIT = 100
LOOKUP_IDS = 70


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _cpu_ms(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.thread_time_ns()
    result = call()
    return (time.thread_time_ns() - started) / 1e6, result


def _fixed(searchable: tuple[Any, str, Any], _generation_id: str) -> tuple[Any, str, Any]:
    return searchable


def _lookup_ids(search: Any, generation_id: str, texts: list[str]) -> list[tuple[str, ...]]:
    from contracts.index import SearchFilter

    ranked = (search.search(generation_id, t, SearchFilter(), LIMIT + LOOKUP_IDS) for t in texts)
    return [tuple(c.document_id for c in hits[LIMIT:]) for hits in ranked]


def _measure(
    searches: dict[str, Any], generation_id: str, texts: list[str], rounds: int
) -> dict[str, Any]:
    """CPU per call of each side's `search` and `scores`, the sides interleaved (their
    order alternating per round), and each side's answers."""
    from contracts.index import SearchFilter

    lookups = _lookup_ids(next(iter(searches.values())), generation_id, texts)
    times: dict[str, dict[str, list[float]]] = {
        side: {"search": [], "lookup": []} for side in searches
    }
    answers: dict[str, list[Any]] = {side: [] for side in searches}
    sides = list(searches)
    for round_ in range(rounds):
        for side in sides if round_ % 2 == 0 else sides[::-1]:
            search = searches[side]
            for text, ids in zip(texts, lookups, strict=True):
                ms, hits = _cpu_ms(
                    functools.partial(search.search, generation_id, text, SearchFilter(), LIMIT)
                )
                times[side]["search"].append(ms)
                lookup_filter = SearchFilter(document_ids=ids)
                ms, scores = _cpu_ms(
                    functools.partial(search.scores, generation_id, text, lookup_filter)
                )
                times[side]["lookup"].append(ms)
                if round_ == 0:
                    answers[side].append(
                        [[(c.document_id, c.score) for c in hits], sorted(scores.items())]
                    )
    return {
        side: {
            f"{kind}_cpu_ms": {"p50": _pct(values, 50), "p95": _pct(values, 95)}
            for kind, values in kinds.items()
        }
        | {"answers": answers[side]}
        for side, kinds in times.items()
    }


def run(data_dir: Path, scratch: Path, corpus: str, rounds: int) -> dict[str, Any]:
    import tantivy

    from query.adapters.tantivy_lexical import TantivyLexicalSearch

    texts = _scifact_queries() if corpus == "scifact" else [q.text for q in _queries(300) if q.text]
    stack = _stack(data_dir, fixed_clock=False)
    report: dict[str, Any] = {"corpus": corpus, "queries": len(texts), "rounds": rounds}
    try:
        projector = stack.projector
        lexical = projector.lexical
        generations = []
        for generation_id, _namespace, _kind, _state in projector.state.generations():
            before_segments = lexical.segment_count(generation_id)
            before_evidence = lexical.evidence(generation_id)
            # The index as it was, opened from a copy, searched beside the compacted one.
            _index, name, analyzer = lexical.searchable(generation_id)
            kept = scratch / f"before-{generation_id}"
            shutil.copytree(data_dir / "generations" / "lexical" / generation_id, kept)
            old = tantivy.Index.open(str(kept))
            old.register_tokenizer(name, analyzer)
            wall = time.perf_counter()
            cpu = time.process_time()
            compacted = projector.compact_lexical(generation_id)
            compact_s = {
                "wall": time.perf_counter() - wall,
                "process_cpu": time.process_time() - cpu,
            }
            after_evidence = lexical.evidence(generation_id)
            searches = {
                "before": TantivyLexicalSearch(functools.partial(_fixed, (old, name, analyzer))),
                "after": TantivyLexicalSearch(lexical.searchable),
            }
            sides = _measure(searches, generation_id, texts, rounds)
            identical = sides["before"].pop("answers") == sides["after"].pop("answers")
            generations.append(
                {
                    "generation_id": generation_id,
                    "documents": before_evidence.document_count,
                    "segments": {
                        "before": before_segments,
                        "after": lexical.segment_count(generation_id),
                    },
                    "compacted": compacted,
                    "compact_s": compact_s,
                    **sides,
                    "answers_identical": identical,
                    "evidence_unchanged": before_evidence == after_evidence,
                }
            )
        report["generations"] = generations
    finally:
        stack.close()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, required=True, help="built data dir (copied)")
    parser.add_argument("--corpus", choices=("topk", "scifact"), default="scifact")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args(argv)
    if args.corpus == "scifact":
        _scifact_env()
    random.seed(SEED)
    scratch = Path(tempfile.mkdtemp(prefix="orrery-compact-"))
    try:
        copy = scratch / "data"
        shutil.copytree(args.data_dir, copy)
        load_before = os.getloadavg()
        report = run(copy, scratch, args.corpus, args.rounds)
        report["loadavg"] = {"before": load_before, "after": os.getloadavg()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
