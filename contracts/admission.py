"""What a record must be for every engine to take it: the checks every write route runs.

A write is acknowledged only if the projector can apply it. Anything an engine or the
projector would refuse *deterministically* — the same record failing the same way on
every attempt — is refused here instead, at the door, with the field that is wrong
(issue 22: one all-zero vector acknowledged with 200 stopped indexing for every tenant).
`POST /v1/records`, the ChonkyDB bulk and single-record routes, the KoutenDB import and
`orrery ingest` all call `record_problems` and `check_record_size`; the projector calls
`record_problems` again on what it reads (a record that reached the log another way is
dead-lettered, never retried forever), and the vector engines' `check_vector` applies
`vector_problem`.

The limits, and where they come from:

- a vector is stored as float32 by every vector engine (qdrant-edge, Qdrant) and by the
  ring statistics: each component must be finite *as a float32* (`1e39` overflows to
  infinity), the vector must not be all zeros as a float32 (`1e-46` underflows to 0;
  cosine is undefined), and its length, which the engines compute in float32 to
  normalize it for cosine, must be at least float32's epsilon (below it Qdrant stores
  the vector unnormalized) and its square finite in float32 (else the normalized vector
  is all zeros);
- a vector has the embedder's dimension (every generation holds one dimension);
- an exact-match keyword (visibility label, facet `name=value`) is at most
  `KEYWORD_MAX_BYTES` UTF-8 bytes: Lucene (OpenSearch) refuses a document holding a term
  over 32,766 bytes ("immense term"), tantivy silently drops terms over 65,530 bytes
  (the filter then never matches); the bound keeps both engines equal, with room;
- at most `MAX_FACET_VALUES` facet values per record: every value is a keyword term and
  a payload entry of the record's vector point (Qdrant's request size is bounded);
- keywords are valid Unicode (no lone surrogate): no engine stores one
  (`projector.model.check_keywords`);
- a record's stored JSON is at most the deployment's `ORRERY_MAX_RECORD_BYTES`
  (`check_record_size`, `413 record_too_large`): the embedded store takes at most
  `MAX_RECORD_BYTES` (it bounds the memory of every read that loads records); in server
  mode each record travels as one Kafka message, and a Kafka producer refuses a message
  over its `max_request_size` (1 MiB by default, as the broker's `message.max.bytes`) on
  every attempt — one such record would stop the relay, and every tenant's writes
  behind it (`contracts.events.KAFKA_MAX_RECORD_BYTES`).

Pure functions of the record (and the deployment's dimension and bound); no I/O.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import ErrorCode, OrreryError
from contracts.index_fields import FACET_SEPARATOR
from contracts.records import Record
from contracts.stored_vectors import PackedVector, StoredVector

__all__ = [
    "FLOAT32_EPSILON",
    "FLOAT32_MAX",
    "KEYWORD_MAX_BYTES",
    "MAX_FACET_VALUES",
    "MAX_RECORD_BYTES",
    "Problem",
    "check_record",
    "check_record_size",
    "problem_dicts",
    "record_bytes",
    "record_problems",
    "sized_record_json",
    "vector_problem",
]

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_EPSILON = 1.1920928955078125e-07
# The longest vector whose squared length float32 holds.
_FLOAT32_MAX_LENGTH = math.sqrt(FLOAT32_MAX)
KEYWORD_MAX_BYTES = 8_192
MAX_FACET_VALUES = 1_024
# The largest record (its stored JSON) any deployment stores: the embedded deployment's
# default and ceiling of `ORRERY_MAX_RECORD_BYTES` (server mode's is one Kafka message,
# `contracts.events.KAFKA_MAX_RECORD_BYTES`).
MAX_RECORD_BYTES = 4 * 1024 * 1024
# The most bytes one vector component takes in JSON (`-1.2345678901234567e-308,`).
_VECTOR_COMPONENT_BYTES = 25


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a record cannot be applied: the field (`loc`, as pydantic names it), a human
    message and a machine-readable `type` (`vector_not_finite`, `vector_zero`,
    `embedder_mismatch` for a wrong dimension, `keyword_too_long`, `too_many_facets`,
    `not_unicode`)."""

    loc: tuple[str | int, ...]
    msg: str
    type: str


def vector_problem(vector: Sequence[float], dimension: int | None) -> Problem | None:
    """Why `vector` cannot be stored by a vector engine of `dimension` (unchecked when
    None), or None. See the module docstring for the rules."""
    if dimension is not None and len(vector) != dimension:
        return Problem(
            ("vector",),
            f"vector has {len(vector)} dimensions, the embedder produces {dimension}",
            ErrorCode.EMBEDDER_MISMATCH.value,
        )
    try:
        if type(vector) is PackedVector:
            # Its float32 values, measured by numpy in float64 (no Python float built);
            # near a bound, by `math.hypot` as below (the same length as the decimals').
            length = vector.length
            if not 4 * FLOAT32_EPSILON <= length <= _FLOAT32_MAX_LENGTH / 4:
                length = math.hypot(*vector.float32.tolist())
        else:
            # The length of the float64 values first (no copy): far from every bound,
            # the float32 values (within 1e-7 of them) are far from it too.
            # A decoded event's vector was measured when it was decoded (the same hypot).
            length = vector.length if type(vector) is StoredVector else math.hypot(*vector)
            if not 2 * FLOAT32_EPSILON <= length <= _FLOAT32_MAX_LENGTH / 2:
                # Rounded to float32 in C exactly as numpy and the engines round (a value
                # past float32's range becomes an infinity), then measured again.
                length = math.hypot(*array("f", vector))
    except (TypeError, OverflowError):
        return Problem(("vector",), "vector must be a list of numbers", "vector_not_finite")
    if not math.isfinite(length):
        return Problem(
            ("vector",),
            f"vector holds NaN, an infinity or a value outside float32's range "
            f"(|x| > {FLOAT32_MAX:.7g})",
            "vector_not_finite",
        )
    if length > _FLOAT32_MAX_LENGTH:
        return Problem(
            ("vector",),
            "vector is too long to normalize in float32 (its squared length overflows)",
            "vector_not_finite",
        )
    if length < FLOAT32_EPSILON:
        return Problem(
            ("vector",),
            "vector is all zeros, or too short to normalize in float32 (cosine is undefined)",
            "vector_zero",
        )
    return None


def _keyword_problem(loc: tuple[str | int, ...], value: str) -> Problem | None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return Problem(loc, "must be valid Unicode (no lone surrogates)", "not_unicode")
    if size > KEYWORD_MAX_BYTES:
        return Problem(
            loc,
            f"is {size} UTF-8 bytes, an exact-match value holds at most {KEYWORD_MAX_BYTES}",
            "keyword_too_long",
        )
    return None


def record_problems(record: Record, *, dimension: int | None, vector: bool = True) -> list[Problem]:
    """Every reason a (validated) record cannot be applied by the projector and every
    engine; empty when it can. A tombstone has none (nothing of it is indexed).
    `dimension` is the embedder's (None: unchecked); `vector=False` leaves the vector
    out (a caller that checked it with `vector_problem` already). The record's size is
    `check_record_size`'s (a 413, not one of these 422 problems)."""
    if record.deleted:
        return []
    problems: list[Problem] = []
    if vector and record.vector is not None:
        problem = vector_problem(record.vector, dimension)
        if problem is not None:
            problems.append(problem)
    # `item_id`, `ring` and `status` are typed strings of at most 512 characters
    # (pydantic refuses lone surrogates in typed strings): at most 2,048 bytes, within
    # the bound. Visibility labels are typed but unbounded; facet values are neither.
    for i, label in enumerate(record.metadata.visibility):
        if 4 * len(label) > KEYWORD_MAX_BYTES:
            problem = _keyword_problem(("metadata", "visibility", i), label)
            if problem is not None:
                problems.append(problem)
    extra = record.metadata.model_extra
    if extra:
        count = 0
        for name, values in record.metadata.facets().items():
            count += len(values)
            for i, value in enumerate(values):
                problem = _keyword_problem(("metadata", name, i), f"{name}{FACET_SEPARATOR}{value}")
                if problem is not None:
                    problems.append(problem)
        if count > MAX_FACET_VALUES:
            problems.append(
                Problem(
                    ("metadata",),
                    f"{count} facet values, a record holds at most {MAX_FACET_VALUES}",
                    "too_many_facets",
                )
            )
    return problems


def record_bytes(record: Record) -> int:
    """The size of `record` as every store keeps it: its JSON (`model_dump_json`) in
    UTF-8 bytes."""
    return len(record.__pydantic_serializer__.to_json(record))


def check_record_size(record: Record, *, max_record_bytes: int, index: int = 0) -> None:
    """`413 record_too_large` (details: `index`, `document_id`, `record_bytes`,
    `max_record_bytes`, and `field`, the largest one) when `record`'s stored JSON is over
    `max_record_bytes` (the deployment's `ORRERY_MAX_RECORD_BYTES`); a record of exactly
    `max_record_bytes` passes. A tombstone is checked too: it is stored and travels."""
    dims = 0 if record.vector is None else len(record.vector)
    try:
        # Without its vector first (serializing floats is most of a record's cost), the
        # vector counted at the most a component takes: exact only when that is not
        # enough to decide.
        if dims:
            rest = len(record.__pydantic_serializer__.to_json(record, exclude={"vector"}))
            # `,"vector":[…]` around the components.
            if rest + 12 + dims * _VECTOR_COMPONENT_BYTES <= max_record_bytes:
                return
        size = record_bytes(record)
    except (UnicodeEncodeError, ValueError):
        return  # a lone surrogate: reported as `not_unicode` (or refused by validation)
    if size > max_record_bytes:
        raise _too_large(record, size, max_record_bytes, index)


def sized_record_json(record: Record, *, max_record_bytes: int, index: int = 0) -> str | None:
    """`record.model_dump_json()`, the JSON every store keeps, after `check_record_size`'s
    check on it (the same `413`): for a caller that stores the record next, which then
    serializes it once, not twice. None when it cannot be serialized (a lone surrogate:
    reported as `not_unicode`, or refused by validation)."""
    try:
        data = record.__pydantic_serializer__.to_json(record)
    except (UnicodeEncodeError, ValueError):
        return None
    if len(data) > max_record_bytes:
        raise _too_large(record, len(data), max_record_bytes, index)
    return data.decode("utf-8")


def _too_large(record: Record, size: int, max_record_bytes: int, index: int) -> OrreryError:
    dims = 0 if record.vector is None else len(record.vector)
    text = record.text
    parts = {
        "payload": len(json.dumps(record.payload, ensure_ascii=False)),
        "text.body": len(text.body),
        "text.title": len(text.title),
        "text.tags": sum(map(len, text.tags)),
        "metadata": len(record.metadata.model_dump_json()),
        "vector": dims * _VECTOR_COMPONENT_BYTES,
    }
    largest = max(parts, key=lambda name: parts[name])
    return OrreryError(
        ErrorCode.RECORD_TOO_LARGE,
        f"the record is {size} bytes as stored JSON, more than {max_record_bytes} "
        f"(ORRERY_MAX_RECORD_BYTES); its largest field is {largest}",
        {
            "index": index,
            "document_id": record.doc_id,
            "field": largest,
            "record_bytes": size,
            "max_record_bytes": max_record_bytes,
        },
    )


def problem_dicts(problems: Sequence[Problem]) -> list[dict[str, object]]:
    """`problems` as the `errors` entries of a 422 (pydantic's shape: loc, msg, type)."""
    return [{"loc": list(p.loc), "msg": p.msg, "type": p.type} for p in problems]


def check_record(record: Record, *, dimension: int | None) -> None:
    """`OrreryError(INVALID_REQUEST)` naming every problem of `record` (see
    `record_problems`); nothing when it can be applied."""
    problems = record_problems(record, dimension=dimension)
    if problems:
        first = problems[0]
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"{'.'.join(map(str, first.loc))}: {first.msg}",
            {"document_id": record.doc_id, "errors": problem_dicts(problems)},
        )
