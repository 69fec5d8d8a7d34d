"""Which of the embedded projector's engine calls let the GIL go: each call timed beside a
Python thread that spins, counting, the whole time.

    .venv/bin/python -m bench.gil_release --records 2000 --rounds 5 \\
        --out docs/bench/gil-release-session18.json

For one batch of `bench/topk.py`'s records (384-d vectors, ~1 KB payloads), as the
embedded projector writes it (`QdrantEdgeVectorIndex.apply`, `TantivyLexicalIndex.apply`),
each stage is run on the main thread while a spinner thread increments a counter. A
stage's *spinner share* is the counts the spinner made during the stage over the counts
it makes in the same wall time with the main thread asleep: ~0 means the call held the
GIL all along (nothing else in the interpreter ran), ~1 means it let the GIL go (another
Python thread ran at full speed beside it, on another core). Also per stage: wall time
and the calling thread's CPU time per record (`time.thread_time`; the engines' own
threads are not counted), and the process's CPU time per record (all threads).

On a shared machine the share reads lower than it is when the other core is busy; the
load average is recorded. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import tantivy
from pydantic import TypeAdapter
from qdrant_edge import EdgeShard, Point, UpdateOperation

from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.topk import Vocabulary, corpus_batches
from contracts.index import IndexDocument, to_index_document
from contracts.index_fields import DEFAULT_TEXT_ANALYZER
from contracts.records import Record
from contracts.vector_payload import VECTOR_NAME, payload_of, point_id
from projector.adapters import tantivy_lexical
from projector.adapters.qdrant_edge_vectors import QdrantEdgeTuning
from projector.service import embed_records

__all__ = ["main"]

DIMENSION = 384


class _Spinner:
    """A thread that counts as fast as the GIL lets it."""

    def __init__(self) -> None:
        self.count = 0
        self.paused = False
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop:
            if self.paused:
                time.sleep(0.001)  # lets the GIL go; the alone runs see no contention
                continue
            self.count += 1

    def __enter__(self) -> _Spinner:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop = True
        self._thread.join()

    def rate_alone(self, seconds: float = 0.3) -> float:
        """Counts a second while the main thread sleeps (holds no GIL)."""
        before, started = self.count, time.perf_counter()
        time.sleep(seconds)
        return (self.count - before) / (time.perf_counter() - started)


class _NoCache:
    def cached_vectors(self, keys: set[str]) -> dict[str, tuple[float, ...]]:
        return {}

    def store_vectors(self, vectors: dict[str, tuple[float, ...]]) -> None:
        return None


def _documents(records: int, seed: int) -> list[IndexDocument]:
    body = next(iter(corpus_batches(records, records, seed, Vocabulary.build(random.Random(seed)))))
    parsed = TypeAdapter(list[Record]).validate_json(body)
    vectors, _ = embed_records(parsed, embedder=None, cache=_NoCache())  # type: ignore[arg-type]
    return [to_index_document(r, vectors[r.doc_id]) for r in parsed]


def _round(documents: list[IndexDocument], root: Path, spinner: _Spinner) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    n = len(documents)

    def stage(name: str, work: Callable[[], Any], prepare: Callable[[], Any] | None = None) -> Any:
        # Alone first (wall and CPU as the projector sees them), then again beside the
        # spinner for the share, each run after `prepare` (untimed, spinner paused): a
        # flush or a commit then has a batch of fresh writes to make durable both times.
        # A second upsert of the same points, or adding the same documents again, is
        # like work.
        spinner.paused = True
        if prepare is not None:
            prepare()
        wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
        result = work()
        wall = time.perf_counter() - wall0
        thread_cpu, process_cpu = time.thread_time() - thread0, time.process_time() - process0
        if prepare is not None:
            prepare()
        spinner.paused = False
        alone = spinner.rate_alone(0.2)
        count0, shared0 = spinner.count, time.perf_counter()
        work()
        shared_wall = time.perf_counter() - shared0
        spun = spinner.count - count0
        spinner.paused = True
        figures[name] = {
            "wall_us_per_record": wall / n * 1e6,
            "caller_cpu_us_per_record": thread_cpu / n * 1e6,
            "process_cpu_us_per_record": process_cpu / n * 1e6,
            "wall_beside_spinner_us_per_record": shared_wall / n * 1e6,
            "spinner_share": spun / (alone * shared_wall) if alone > 0 and shared_wall else None,
        }
        return result

    shard = EdgeShard.create(str(root / f"shard-{uuid.uuid4().hex[:6]}"), _edge_config())
    try:
        points = stage(
            "qdrant_point_objects",
            lambda: [
                Point(
                    point_id(d.document_id),
                    {VECTOR_NAME: list(d.vector or ())},
                    payload_of(d),
                )
                for d in documents
            ],
        )
        operation = stage("qdrant_upsert_operation", lambda: UpdateOperation.upsert_points(points))
        stage("qdrant_update", lambda: shard.update(operation))
        ids: list[Any] = [p.id for p in points]
        stage(
            "qdrant_retrieve_revisions",
            lambda: shard.retrieve(ids, with_payload=["revision"], with_vector=False),
        )
        stage("qdrant_flush", shard.flush, prepare=lambda: shard.update(operation))
    finally:
        shard.close()

    schema = tantivy_lexical._build_schema(DEFAULT_TEXT_ANALYZER)
    index = tantivy.Index(schema, path=str(_mkdir(root / f"tantivy-{uuid.uuid4().hex[:6]}")))
    index.register_tokenizer(
        DEFAULT_TEXT_ANALYZER, tantivy_lexical._text_analyzer(DEFAULT_TEXT_ANALYZER)
    )
    # The projector's writer (`TantivyLexicalIndex` defaults).
    writer = index.writer(
        heap_size=tantivy_lexical.DEFAULT_WRITER_HEAP_BYTES,
        num_threads=tantivy_lexical.DEFAULT_WRITER_THREADS,
    )
    docs = stage(
        "tantivy_documents",
        lambda: [tantivy_lexical._to_document(d, True, True) for d in documents],
    )

    def add_all() -> None:
        for document in docs:
            writer.add_document(document)

    stage("tantivy_add_document", add_all)
    stage("tantivy_commit", writer.commit, prepare=add_all)

    def add_and_commit() -> None:
        add_all()
        writer.commit()

    stage("tantivy_reload", index.reload, prepare=add_and_commit)
    writer.wait_merging_threads()
    return figures


def _edge_config() -> Any:
    return QdrantEdgeTuning().edge_config(DIMENSION)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    documents = _documents(args.records, args.seed)
    load_before = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="orrery-gil-") as tmp, _Spinner() as spinner:
        rounds = [_round(documents, Path(tmp), spinner) for _ in range(args.rounds)]
    load_after = Path("/proc/loadavg").read_text().strip()
    summary = {
        name: {
            key: None
            if any(r[name][key] is None for r in rounds)
            else round(median(r[name][key] for r in rounds), 3)
            for key in rounds[0][name]
        }
        for name in rounds[0]
    }
    print(
        f"{'stage':28} {'wall us/rec':>11} {'caller cpu':>10} {'proc cpu':>9}"
        f" {'wall+spin':>9} {'spinner':>8}"
    )
    for name, row in summary.items():
        print(
            f"{name:28} {row['wall_us_per_record']:11.1f} {row['caller_cpu_us_per_record']:10.1f}"
            f" {row['process_cpu_us_per_record']:9.1f}"
            f" {row['wall_beside_spinner_us_per_record']:9.1f} {row['spinner_share']:8.2f}"
        )
    print(f"load {load_before} -> {load_after}")
    if args.out is not None:
        write_json(
            args.out,
            {
                "benchmark": "gil_release",
                "date": utc_now(),
                "git": git_facts(),
                "machine": machine_facts(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "config": {"records": args.records, "rounds": args.rounds, "seed": args.seed},
                "median_per_stage": summary,
                "rounds": rounds,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
