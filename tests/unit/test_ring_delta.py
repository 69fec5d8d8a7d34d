"""`RingDelta.add_rows` (one matrix per ring and batch) against `RingDelta.add` (one
vector at a time), the rule it replaces on the projector's write path."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from projector.ring_stats import RingDelta

DIMENSION = 8
VALUES = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
    st.sampled_from([0.0, float("inf"), float("-inf"), float("nan"), 3e38]),
)
ROWS = st.lists(
    st.tuples(st.lists(VALUES, min_size=DIMENSION, max_size=DIMENSION), st.sampled_from([1, -1])),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, float32=st.booleans())
def test_add_rows_counts_and_sums_like_add_one_by_one(
    rows: list[tuple[list[float], int]], float32: bool
) -> None:
    dtype = np.float32 if float32 else np.float64
    with np.errstate(over="ignore"):
        vectors = [np.asarray(values, dtype=dtype) for values, _ in rows]
    one_by_one, batched = RingDelta(), RingDelta()
    for vector, (_, sign) in zip(vectors, rows, strict=True):
        one_by_one.add(vector.astype(np.float64), sign)
    batched.add_rows(vectors, [sign for _, sign in rows])
    assert batched.documents == one_by_one.documents
    if one_by_one.vector_sum is None or one_by_one.unit_sum is None:
        assert batched.vector_sum is None and batched.unit_sum is None
        return
    assert batched.vector_sum is not None and batched.unit_sum is not None
    np.testing.assert_array_equal(batched.vector_sum, one_by_one.vector_sum)
    np.testing.assert_allclose(batched.unit_sum, one_by_one.unit_sum, rtol=0, atol=1e-12)


def test_add_rows_adds_to_what_the_delta_holds() -> None:
    first, second = np.ones(DIMENSION), np.arange(DIMENSION, dtype=np.float64)
    delta = RingDelta()
    delta.add(first, 1)
    delta.add_rows([second, first], [1, -1])
    assert delta.documents == 1
    assert delta.vector_sum is not None
    np.testing.assert_array_equal(delta.vector_sum, second)
