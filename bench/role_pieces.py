"""Server mode's per-record pieces, paired in process: CPU µs a record of each piece of a
base tree against this tree's, and of the alternatives issue 24 named for the event
validation and the JSON work (one `TypeAdapter(list[RecordChanged])` over a batch,
orjson against pydantic-core), on `bench/topk.py`'s corpus (seed 42, 384-d vectors).

    .venv/bin/python -m bench.role_pieces --base /path/to/base/tree --records 2000 \\
        --reps 21 --out docs/bench/role-pieces-session28.json

Each pair runs A then B, or B then A (alternating), in the same process, so load hits
both alike; the medians of A, of B and of the paired differences are reported with every
pair, and the load average before and after. The base tree's `contracts/stored_vectors.py`
and `projector/ring_stats.py` are loaded from its files under other module names (their
own imports resolve to this tree's `contracts`, whose interfaces they use). orjson is
not a dependency: its pairs are left out when it is not importable. Figures are
reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from types import ModuleType
from typing import Any

import numpy as np
from pydantic import TypeAdapter
from pydantic_core import from_json, to_json

from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.topk import Vocabulary, corpus_batches
from contracts.events import RecordChanged, decode_record_changed, record_changed_json
from contracts.index import IndexDocument, to_index_document
from contracts.records import Record, vector_span
from contracts.stored_vectors import is_encoded

__all__ = ["main"]

Piece = tuple[Callable[[], object], Callable[[], object]]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _paired(
    a: Callable[[], object], b: Callable[[], object], count: int, reps: int
) -> dict[str, Any]:
    pairs: list[tuple[float, float]] = []
    for rep in range(reps):
        spent: dict[str, float] = {}
        order = [("a", a), ("b", b)] if rep % 2 == 0 else [("b", b), ("a", a)]
        for side, work in order:
            started = time.process_time()
            work()
            spent[side] = (time.process_time() - started) / count * 1e6
        pairs.append((round(spent["a"], 2), round(spent["b"], 2)))
    return {
        "a_median": round(median(p[0] for p in pairs), 2),
        "b_median": round(median(p[1] for p in pairs), 2),
        "paired_difference_median": round(median(p[1] - p[0] for p in pairs), 2),
        "pairs": pairs,
    }


def _pieces(base: Path, body: bytes) -> dict[str, Piece]:
    import contracts.stored_vectors as stored_vectors
    import projector.ring_stats as ring_stats

    base_vectors = _load("base_stored_vectors", base / "contracts" / "stored_vectors.py")
    base_rings = _load("base_ring_stats", base / "projector" / "ring_stats.py")
    records = TypeAdapter(list[Record]).validate_json(body)
    # The Kafka values and float32 headers the relay ships.
    values = [
        (
            record_changed_json(r.model_dump_json()).encode(),
            np.asarray(r.vector, dtype="<f4").tobytes(),
        )
        for r in records
    ]
    spans = [vector_span(v, 41, len(v) - 1) for v, _ in values]
    texts = [v[s[1] : s[2]] for (v, _), s in zip(values, spans, strict=True) if s is not None]
    rests = [v[: s[0]] + v[s[2] :] for (v, _), s in zip(values, spans, strict=True) if s]
    wires = [f for _, f in values]
    events = [decode_record_changed(v, f) for v, f in values]
    documents = [to_index_document(e.record, e.record.vector) for e in events]
    changes: dict[str, tuple[int, IndexDocument | None]] = {
        d.document_id: (d.revision, d) for d in documents
    }
    float32 = [np.asarray(d.vector.float32) for d in documents if is_encoded(d.vector)]
    signs = [1] * len(float32)
    listed = b"[" + b",".join(rests) + b"]"
    event_list = TypeAdapter(list[RecordChanged])
    pieces: dict[str, Piece] = {
        "packed_vector (base | this tree)": (
            lambda: [base_vectors.packed_vector(w, t) for w, t in zip(wires, texts, strict=True)],
            lambda: [stored_vectors.packed_vector(w, t) for w, t in zip(wires, texts, strict=True)],
        ),
        "RingDelta.add_rows, a batch of new documents (base | this tree)": (
            lambda: base_rings.RingDelta().add_rows(float32, signs),
            lambda: ring_stats.RingDelta().add_rows(float32, signs),
        ),
        "ring_moves, a batch of new documents (base | this tree)": (
            lambda: base_rings.ring_moves(changes, {}),
            lambda: ring_stats.ring_moves(changes, {}),
        ),
        "decode_record_changed with the float32 header (this tree | this tree)": (
            lambda: [decode_record_changed(v, f) for v, f in values],
            lambda: [decode_record_changed(v, f) for v, f in values],
        ),
        "event validation without its vector: each event | TypeAdapter(list) per batch": (
            lambda: [RecordChanged.model_validate_json(r) for r in rests],
            lambda: event_list.validate_json(listed),
        ),
    }
    try:
        orjson: Any = importlib.import_module("orjson")
    except ImportError:
        return pieces
    floats = TypeAdapter(list[float])
    vectors = [r.vector for r in records if r.vector is not None]
    vector_texts = [to_json(v) for v in vectors]
    pieces.update(
        {
            "event without its vector, parse only: from_json | orjson.loads": (
                lambda: [from_json(r) for r in rests],
                lambda: [orjson.loads(r) for r in rests],
            ),
            "request body parse (the batch): from_json | orjson.loads": (
                lambda: from_json(body),
                lambda: orjson.loads(body),
            ),
            "384-d vector text: strict list[float] validate_json | orjson.loads (no check)": (
                lambda: [floats.validate_json(t, strict=True) for t in vector_texts],
                lambda: [orjson.loads(t) for t in vector_texts],
            ),
            "stored JSON: model_dump_json | orjson.dumps(model_dump(mode='json'))": (
                lambda: [r.__pydantic_serializer__.to_json(r) for r in records],
                lambda: [orjson.dumps(r.model_dump(mode="json")) for r in records],
            ),
            "384-d vector: to_json | orjson.dumps": (
                lambda: [to_json(v) for v in vectors],
                lambda: [orjson.dumps(v) for v in vectors],
            ),
        }
    )
    return pieces


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the base tree")
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    vocab = Vocabulary.build(random.Random(42))
    body = next(iter(corpus_batches(args.records, args.records, 42, vocab)))
    load_before = Path("/proc/loadavg").read_text().strip()
    figures: dict[str, Any] = {}
    for name, (a, b) in _pieces(args.base, body).items():
        figures[name] = _paired(a, b, args.records, args.reps)
        f = figures[name]
        difference = f["paired_difference_median"]
        print(f"{name}: {f['a_median']} | {f['b_median']} µs (paired {difference:+})")
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"load {load_before} -> {load_after}")
    if args.out is not None:
        write_json(
            args.out,
            {
                "benchmark": "role_pieces",
                "date": utc_now(),
                "git": git_facts(),
                "machine": machine_facts(),
                "config": {"base": str(args.base), "records": args.records, "reps": args.reps},
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "cpu_us_per_record": figures,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
