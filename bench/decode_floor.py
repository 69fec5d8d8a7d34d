"""How far below pydantic a record's validation could go in Python: CPU µs per record of
the server-mode roles' per-record decoding, next to the floors under it.

    .venv/bin/python -m bench.decode_floor --records 2000 --rounds 7 \\
        --out docs/bench/decode-floor-session23.json

`bench/topk.py`'s records (384-d vectors, ~1 KB payloads), in process, no I/O. Projector
side, per Kafka value as the relay publishes it (the `RecordChanged` JSON and the
vector's float32 header): the whole `decode_record_changed`, and its pieces — the vector
cut, `packed_vector` (the float32 bytes checked against the vector's text), and the
validation of the event without its vector (`RecordChanged.model_validate_json`) beside
what it could cost at best:
- `lean`: the same core schema with every Python field validator (`check_namespace`,
  `check_name`, `_check_item_id`, `_check_ring`, `_json_integer`, the timestamp chain,
  `_facets_are_scalars`) replaced by pydantic-core's own constraints (Rust regexes,
  strict int, one `astimezone` left) — what an exact fast path inside pydantic could
  reach; checked here to build the same events;
- `no_python`: that schema without any Python call (not exact: `updated_at` keeps
  pydantic's own tzinfo) — the floor of pydantic's model validation;
- `any`: `TypeAdapter(Any).validate_json` (the JSON as Python values, no model);
- `from_json`: `pydantic_core.from_json` (the parse alone).
Ingest side, per record of one 2,000-record body: `parse_body` whole, its
`typed_parse_pairs`, the body's `validate_json` with and without the vectors, and
`model_dump_json` of a record with and without its vector.

Each figure is the median of `--rounds` rounds of CPU time (`time.process_time`) divided
by the records. Figures are reported, never asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import SchemaValidator, from_json
from pydantic_core import core_schema as cs

from bench.common import git_facts, machine_facts, utc_now, write_json
from bench.topk import stage_bench_batch
from contracts import records as rec
from contracts.events import _EVENT_HEAD_BYTES, RecordChanged, decode_record_changed
from contracts.names import NAMESPACE_PATTERN, check_namespace
from contracts.records import Record, vector_span
from contracts.stored_vectors import float32_wire, packed_vector
from contracts.wire import _json_integer, typed_parse_pairs
from ingest.service import parse_body

__all__ = ["lean_schema", "main"]

_INDEXABLE_Z = (
    "^" + rec._INDEXABLE_YEAR + r"-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z$"
)
_PATTERNS: dict[Any, str] = {
    check_namespace: NAMESPACE_PATTERN,
    rec.check_name: rec._NAME.pattern,
    rec._check_item_id: rec._ITEM_ID_PATTERN,
    rec._check_ring: r"^(?:[^/]+(?:/[^/]+)*)?$",
}


def _function(schema: dict[str, Any]) -> Any:
    return schema.get("function", {}).get("function")


def lean_schema(schema: Any, *, python: bool = True) -> Any:
    """`schema` (a core schema) with the Python field validators of `Record` replaced by
    pydantic-core constraints accepting a subset of what they accept; `python=False`
    drops every Python call left (the `astimezone`, the model validators)."""
    if isinstance(schema, list):
        return [lean_schema(s, python=python) for s in schema]
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    function = _function(schema) if kind in ("function-after", "function-before") else None
    if kind == "function-after" and function in _PATTERNS:
        inner = dict(schema["schema"])
        inner.update(pattern=_PATTERNS[function], strict=True)
        return inner
    if kind == "function-before" and function is _json_integer:
        return {**schema["schema"], "strict": True}
    if kind == "function-after" and function is rec._utc_range:
        parsed = schema["schema"]["schema"]["schema"]["schema"]  # the datetime schema
        chain = cs.chain_schema([cs.str_schema(pattern=_INDEXABLE_Z, strict=True), dict(parsed)])
        return cs.no_info_after_validator_function(rec._aware_utc, chain) if python else chain
    if kind == "function-after" and (
        getattr(function, "__name__", "") == "_facets_are_scalars" or not python
    ):
        inner = lean_schema(schema["schema"], python=python)
        if "ref" in schema:
            inner["ref"] = schema["ref"]
        if getattr(function, "__name__", "") == "_facets_are_scalars":
            # No facet at all: an impossible string for any extra value.
            inner["schema"]["extras_schema"] = cs.str_schema(min_length=2, max_length=1)
        return inner
    return {key: lean_schema(value, python=python) for key, value in schema.items()}


def _per_record(work: Callable[[], Any], count: int, rounds: int) -> float:
    spent = []
    for _ in range(rounds):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return round(median(spent) / count * 1e6, 2)


def main(argv: Sequence[str] | None = None) -> int:
    args, body = stage_bench_batch(__doc__.split("\n\n")[0], argv)
    admitted = parse_body(
        body,
        max_batch=args.records,
        vector_dimension=384,
        max_record_bytes=960 * 1024,
        allowed_namespace=None,
    )
    records = admitted.records
    stored = [
        j if j is not None else r.model_dump_json()
        for r, j in zip(records, admitted.stored_json, strict=True)
    ]
    values = [('{"event_type":"record_changed","record":' + j + "}").encode() for j in stored]
    wires = [float32_wire(r.vector or []) for r in records]
    cuts = []
    for value in values:
        span = vector_span(value, len(_EVENT_HEAD_BYTES), len(value) - 1)
        assert span is not None
        cuts.append(span)
    stripped = [v[:at] + v[end:] for v, (at, _, end) in zip(values, cuts, strict=True)]
    texts = [v[start:end] for v, (_, start, end) in zip(values, cuts, strict=True)]
    lean = SchemaValidator(lean_schema(RecordChanged.__pydantic_core_schema__))
    bare = SchemaValidator(lean_schema(RecordChanged.__pydantic_core_schema__, python=False))
    for raw in stripped:  # the lean schema builds the very event pydantic builds
        ours, theirs = lean.validate_json(raw), RecordChanged.model_validate_json(raw)
        assert ours == theirs and repr(ours) == repr(theirs)
        assert ours.record.model_fields_set == theirs.record.model_fields_set
    any_value: TypeAdapter[Any] = TypeAdapter(Any)
    n, rounds = len(values), args.rounds
    body_without = (
        b"[" + b",".join(r.model_dump_json(exclude={"vector"}).encode() for r in records) + b"]"
    )
    records_list: TypeAdapter[list[Record]] = TypeAdapter(list[Record])
    projector = {
        "decode_record_changed": _per_record(
            lambda: [decode_record_changed(v, w) for v, w in zip(values, wires, strict=True)],
            n,
            rounds,
        ),
        "vector_span": _per_record(
            lambda: [vector_span(v, len(_EVENT_HEAD_BYTES), len(v) - 1) for v in values],
            n,
            rounds,
        ),
        "packed_vector": _per_record(
            lambda: [packed_vector(w, t) for w, t in zip(wires, texts, strict=True)], n, rounds
        ),
        "model_validate_json": _per_record(
            lambda: [RecordChanged.model_validate_json(s) for s in stripped], n, rounds
        ),
        "lean": _per_record(lambda: [lean.validate_json(s) for s in stripped], n, rounds),
        "no_python": _per_record(lambda: [bare.validate_json(s) for s in stripped], n, rounds),
        "any": _per_record(lambda: [any_value.validate_json(s) for s in stripped], n, rounds),
        "from_json": _per_record(lambda: [from_json(s) for s in stripped], n, rounds),
    }
    ingest = {
        "parse_body": _per_record(
            lambda: parse_body(
                body,
                max_batch=args.records,
                vector_dimension=384,
                max_record_bytes=960 * 1024,
                allowed_namespace=None,
            ),
            n,
            rounds,
        ),
        "typed_parse_pairs": _per_record(lambda: typed_parse_pairs(body), n, rounds),
        "validate_json": _per_record(lambda: records_list.validate_json(body), n, rounds),
        "validate_json_without_vectors": _per_record(
            lambda: records_list.validate_json(body_without), n, rounds
        ),
        "model_dump_json": _per_record(lambda: [r.model_dump_json() for r in records], n, rounds),
        "model_dump_json_without_vector": _per_record(
            lambda: [r.model_dump_json(exclude={"vector"}) for r in records], n, rounds
        ),
    }
    print({"projector": projector, "ingest": ingest})
    if args.out is not None:
        write_json(
            args.out,
            {
                "benchmark": "decode_floor",
                "date": utc_now(),
                "git": git_facts(),
                "machine": machine_facts(),
                "config": {"records": n, "rounds": rounds},
                "loadavg": Path("/proc/loadavg").read_text().strip(),
                "us_per_record": {"projector": projector, "ingest": ingest},
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
