"""The server-mode projector's per-record CPU by stage, in process and without I/O: the
Kafka value decoded, the admission check, the index documents, the Qdrant REST body, the
OpenSearch bulk body, the ring statistics' moves — for `bench/topk.py`'s records (384-d
vectors, ~1 KB payloads), as the projector runs them on a batch. The values are decoded
with their vector's float32 header, as the relay ships them (session 21 on; before
session 23 this bench decoded the decimals: ~30 µs a record more than the projector
spends).

    .venv/bin/python -m bench.projector_stages --records 2000 --rounds 7 \\
        --out docs/bench/projector-stages-session17.json

Run it with a tree as working directory to measure that tree (`python -m` puts it
first on `sys.path`; a tree from before `decode_record_changed` and `_body_json`,
session 17, takes their predecessors: copy this file there to compare). The CPU time
(`time.process_time`) of each stage is divided by the records, the median of the rounds
reported. Figures are reported, never asserted.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from pydantic import TypeAdapter
from pydantic_core import to_json

import contracts.events
from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.topk import stage_bench_batch
from contracts.admission import record_problems
from contracts.events import RecordChanged, record_changed_json
from contracts.index import IndexDocument, to_index_document
from contracts.records import Record
from contracts.vector_payload import check_vector, point_key
from projector.adapters import opensearch_lexical, qdrant_vectors
from projector.ring_stats import ring_moves
from projector.service import embed_records

__all__ = ["main"]

DIMENSION = 384


# This tree's, or (an older tree) what came before them.
_decode: Callable[..., RecordChanged] = getattr(
    contracts.events, "decode_record_changed", RecordChanged.model_validate_json
)
# Since session 21 the relay ships the vector's float32 bytes in a header and the
# projector reads them instead of the decimals: decoded here as the projector does, when
# the tree's `decode_record_changed` takes them.
_WITH_FLOAT32 = "float32" in inspect.signature(_decode).parameters
_body_json: Callable[[dict[str, Any]], bytes] = getattr(
    qdrant_vectors,
    "_body_json",
    lambda body: to_json(body, fallback=qdrant_vectors._number),
)


def _bulk_lines(index: str, operations: Sequence[IndexDocument], combined: bool) -> bytes:
    """The OpenSearch bulk body as built before session 27 (each NDJSON line's dict
    serialized by itself): the stage on a tree without `_bulk_body`."""
    lines: list[dict[str, Any]] = []
    for document in operations:
        meta = {
            "_index": index,
            "_id": opensearch_lexical._engine_id(document.document_id),
            "version": document.revision,
            "version_type": "external",
        }
        lines.append({"index": meta})
        lines.append(opensearch_lexical._source(document, combined))
    return b"\n".join([to_json(line) for line in lines]) + b"\n"


_bulk_body: Callable[[str, Sequence[IndexDocument], bool], bytes] = getattr(
    opensearch_lexical, "_bulk_body", _bulk_lines
)


def _float32(values: Sequence[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


class _NoCache:
    """A vector cache that holds nothing: every record here carries its vector."""

    def cached_vectors(self, keys: set[str]) -> dict[str, tuple[float, ...]]:
        return {}

    def store_vectors(self, vectors: dict[str, tuple[float, ...]]) -> None:
        return None


def _stages(values: Sequence[tuple[bytes, bytes]]) -> dict[str, float]:
    """CPU seconds of each stage for one batch."""
    spent: dict[str, float] = {}

    def timed(name: str, work: Callable[[], Any]) -> Any:
        started = time.process_time()
        result = work()
        spent[name] = time.process_time() - started
        return result

    events: list[RecordChanged] = timed(
        "decode",
        lambda: (
            [_decode(v, f) for v, f in values] if _WITH_FLOAT32 else [_decode(v) for v, _ in values]
        ),
    )
    records = [e.record for e in events]
    timed("admission", lambda: [record_problems(r, dimension=DIMENSION) for r in records])

    def documents() -> list[IndexDocument]:
        vectors, _ = embed_records(records, embedder=None, cache=_NoCache())  # type: ignore[arg-type]
        docs = [to_index_document(r, vectors[r.doc_id]) for r in records]
        for doc in docs:
            check_vector(doc, DIMENSION)
        return docs

    docs: list[IndexDocument] = timed("index_documents", documents)
    writes = {point_key(d.document_id): d for d in docs}
    timed("qdrant_body", lambda: _body_json({"operations": qdrant_vectors._upsert_json(writes)}))
    timed("opensearch_body", lambda: _bulk_body("orrery-lexical-g1", docs, True))
    timed("ring_moves", lambda: ring_moves({d.document_id: (d.revision, d) for d in docs}, {}))
    return spent


def main(argv: Sequence[str] | None = None) -> int:
    args, body = stage_bench_batch(__doc__.split("\n\n")[0], argv)
    records = TypeAdapter(list[Record]).validate_json(body)
    # The Kafka values the relay publishes: the outbox's `RecordChanged` JSON, and the
    # vector's float32 header (`contracts.events.VECTOR_HEADER`).
    values = [
        (record_changed_json(r.model_dump_json()).encode(), _float32(r.vector or []))
        for r in records
    ]
    rounds = [_stages(values) for _ in range(args.rounds)]
    per_record_us = {
        name: round(median(r[name] for r in rounds) / len(values) * 1e6, 1) for name in rounds[0]
    }
    per_record_us["total"] = round(sum(per_record_us.values()), 1)
    print(per_record_us)
    if args.out is not None:
        write_json(
            args.out,
            {
                "benchmark": "projector_stages",
                "date": utc_now(),
                "git": git_facts(),
                "machine": machine_facts(),
                "loadavg": Path("/proc/loadavg").read_text().strip(),
                "config": {"records": len(values), "rounds": args.rounds},
                "cpu_us_per_record_median": per_record_us,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
