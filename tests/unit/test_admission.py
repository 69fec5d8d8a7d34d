"""`contracts.admission`: what every write route refuses, and that the vector engines'
check agrees with the door (issue 22)."""

from __future__ import annotations

import math
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.admission import (
    FLOAT32_MAX,
    KEYWORD_MAX_BYTES,
    MAX_FACET_VALUES,
    MAX_RECORD_BYTES,
    check_record_size,
    record_bytes,
    record_problems,
    vector_problem,
)
from contracts.errors import ErrorCode, OrreryError
from contracts.index import to_index_document
from contracts.records import Record
from contracts.vector_payload import check_vector

DIM = 8


def record(**fields: Any) -> Record:
    return Record.model_validate(
        {"namespace": "ns", "snapshot_kind": "objects", "item_id": "a", "revision": 1, **fields}
    )


def unit(i: int = 0) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(DIM)]


@pytest.mark.parametrize(
    ("vector", "kind"),
    [
        ([0.0] * DIM, "vector_zero"),
        ([1e-46] * DIM, "vector_zero"),  # underflows to 0 as float32
        ([1e-30] * DIM, "vector_zero"),  # length below float32's epsilon
        ([1e39, *[0.0] * (DIM - 1)], "vector_not_finite"),  # overflows float32
        ([-1e39, *[1.0] * (DIM - 1)], "vector_not_finite"),
        ([3e38] * DIM, "vector_not_finite"),  # finite, but its squared length is not
        ([float("nan"), *[1.0] * (DIM - 1)], "vector_not_finite"),
        ([float("inf"), *[1.0] * (DIM - 1)], "vector_not_finite"),
        ([1.0] * (DIM - 1), "embedder_mismatch"),
    ],
)
def test_vectors_no_engine_can_store_are_refused_naming_the_field(
    vector: list[float], kind: str
) -> None:
    problem = vector_problem(vector, DIM)
    assert problem is not None and problem.type == kind and problem.loc == ("vector",)
    problems = record_problems(record(vector=vector), dimension=DIM)
    assert [(p.loc, p.type) for p in problems] == [(("vector",), kind)]
    # The vector engines refuse the same vectors (as `EMBEDDER_MISMATCH`).
    with pytest.raises(OrreryError) as raised:
        check_vector(to_index_document(record(vector=vector), tuple(vector)), DIM)
    assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH


@pytest.mark.parametrize(
    "vector", [unit(3), [0.1] * DIM, [1e-3, *[0.0] * (DIM - 1)], [1e18, *[0.0] * (DIM - 1)]]
)
def test_ordinary_vectors_pass(vector: list[float]) -> None:
    assert vector_problem(vector, DIM) is None
    assert record_problems(record(vector=vector), dimension=DIM) == []
    check_vector(to_index_document(record(vector=vector), tuple(vector)), DIM)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=16))
@settings(max_examples=300, deadline=None)
def test_a_vector_passes_exactly_when_float32_can_hold_and_normalize_it(
    vector: list[float],
) -> None:
    """The rule, said with numpy's float32 as the engines compute it."""
    import numpy as np

    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        stored = np.asarray(vector, dtype=np.float64).astype(np.float32)
        squares = float(np.sum(stored.astype(np.float64) ** 2))
    storable = bool(
        np.isfinite(stored).all()
        and squares <= FLOAT32_MAX
        and stored.any()
        and squares**0.5 >= np.finfo(np.float32).eps
    )
    assert (vector_problem(vector, None) is None) is storable


def test_keywords_past_what_engines_index_are_refused_with_their_field() -> None:
    long = "x" * (KEYWORD_MAX_BYTES + 1)
    problems = record_problems(
        record(metadata={"visibility": ["ok", long], "topic": ["fine", long]}), dimension=None
    )
    assert sorted((p.loc, p.type) for p in problems) == sorted(
        [
            (("metadata", "visibility", 1), "keyword_too_long"),
            (("metadata", "topic", 1), "keyword_too_long"),
        ]
    )
    # Exactly at the bound (with the facet's `name=` prefix) is fine.
    fits = "y" * (KEYWORD_MAX_BYTES - len("topic="))
    assert record_problems(record(metadata={"topic": fits}), dimension=None) == []


def test_too_many_facet_values_and_lone_surrogates_are_refused() -> None:
    many = record(metadata={"tag": [str(i) for i in range(MAX_FACET_VALUES + 1)]})
    assert [p.type for p in record_problems(many, dimension=None)] == ["too_many_facets"]
    # Typed string fields refuse lone surrogates already; free facets are checked here.
    broken = record(metadata={"topic": ["fine", "a\udfff"]})
    assert [(p.loc, p.type) for p in record_problems(broken, dimension=None)] == [
        (("metadata", "topic", 1), "not_unicode")
    ]


def test_a_tombstone_has_no_problem() -> None:
    assert record_problems(record(deleted=True, vector=[0.0] * DIM), dimension=DIM) == []


def test_float32_max_is_the_largest_finite_float32() -> None:
    assert array("f", [FLOAT32_MAX])[0] == FLOAT32_MAX
    assert array("f", [FLOAT32_MAX * 1.0000001])[0] == math.inf
    # Finite as float32, but too long to normalize; past it, not finite at all.
    assert vector_problem([FLOAT32_MAX, 0.0], None).msg.startswith("vector is too long")  # type: ignore[union-attr]
    assert "NaN, an infinity" in vector_problem([FLOAT32_MAX * 1.0000001, 0.0], None).msg  # type: ignore[union-attr]


def too_large(rec: Record, bound: int = MAX_RECORD_BYTES) -> dict[str, Any] | None:
    try:
        check_record_size(rec, max_record_bytes=bound, index=3)
    except OrreryError as exc:
        assert (exc.code, exc.http_status) == (ErrorCode.RECORD_TOO_LARGE, 413)
        return exc.details
    return None


def test_a_record_larger_than_the_bound_is_413_naming_its_largest_field() -> None:
    big = record(payload={"blob": "p" * (MAX_RECORD_BYTES + 10)})
    details = too_large(big)
    assert details is not None
    assert (details["index"], details["field"]) == (3, "payload")
    assert details["max_record_bytes"] == MAX_RECORD_BYTES
    assert details["record_bytes"] == record_bytes(big) > MAX_RECORD_BYTES
    # Not one of the 422 problems: the projector reads it back without refusing it.
    assert record_problems(big, dimension=None) == []
    # No field alone is over the bound, together they are (the body: ~380 KB as UTF-8).
    wide = record(
        text={"body": "\u00e9" * 190_000}, payload={"blob": "q" * (MAX_RECORD_BYTES - 300_000)}
    )
    assert too_large(wide) is not None
    near = record(payload={"blob": "r" * (MAX_RECORD_BYTES - 2_000)})
    assert too_large(near) is None


@settings(max_examples=60, deadline=None)
@given(
    body=st.text(max_size=300),
    blob=st.text(max_size=300),
    dims=st.integers(min_value=0, max_value=40),
    scale=st.floats(min_value=1e-30, max_value=1e30),
    slack=st.integers(min_value=-3, max_value=3),
)
def test_the_bound_is_exact_in_stored_json_bytes(
    body: str, blob: str, dims: int, scale: float, slack: int
) -> None:
    """A record of exactly the bound passes, one byte over is refused, whatever its text
    (multi-byte, escaped) and its vector (the cheap estimate never decides wrongly)."""
    vector = [scale * (i + 1) / 7 for i in range(dims)] or None
    try:
        rec = record(text={"body": body}, payload={"blob": blob}, vector=vector)
        size = record_bytes(rec)
    except (ValueError, UnicodeEncodeError):
        return  # lone surrogates: refused by validation or as not_unicode
    assert size == len(rec.model_dump_json().encode("utf-8"))
    bound = size + slack
    if bound < 1:
        return
    assert (too_large(rec, bound) is None) == (size <= bound)
