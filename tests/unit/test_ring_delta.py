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


def _add_rows_before(
    vectors: list[np.ndarray], signs: list[int]
) -> tuple[int, np.ndarray, np.ndarray] | None:
    """`RingDelta.add_rows` as it was before session 28 (every value tested for
    finiteness, both sums through a product by the signs): the reference."""
    if not vectors:
        return None
    matrix = np.asarray(vectors, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
    keep = np.isfinite(matrix).all(axis=1) & np.isfinite(norms)
    if not keep.all():
        matrix, norms = matrix[keep], norms[keep]
        signs = [s for s, k in zip(signs, keep.tolist(), strict=True) if k]
    if not signs:
        return None
    signed = np.asarray(signs, dtype=np.float64)[:, None]
    units = np.divide(matrix, norms[:, None], out=matrix.copy(), where=norms[:, None] > 0.0)
    return int(sum(signs)), (signed * matrix).sum(axis=0), (signed * units).sum(axis=0)


@settings(max_examples=300, deadline=None)
@given(
    rows=ROWS,
    float32=st.booleans(),
    positive=st.booleans(),
    wide=st.booleans(),
)
def test_add_rows_is_bit_for_bit_what_it_was(
    rows: list[tuple[list[float], int]],
    float32: bool,
    positive: bool,
    wide: bool,
) -> None:
    """The session-28 shortcuts (finiteness read from the norms, no products by +1, an
    in-place division) change no bit of either sum, whatever the signs and values."""
    dtype = np.float32 if float32 else np.float64
    with np.errstate(over="ignore"):
        vectors = [np.asarray(values, dtype=dtype) for values, _ in rows]
    if wide:  # the embedder's 384 values a row (each drawn row 48 times over)
        vectors = [np.tile(vector, 48) for vector in vectors]
    signs = [1 if positive else sign for _, sign in rows]
    copies = [v.copy() for v in vectors]
    expected = _add_rows_before(vectors, signs)
    delta = RingDelta()
    delta.add_rows(vectors, signs)
    for vector, copy in zip(vectors, copies, strict=True):
        np.testing.assert_array_equal(vector, copy)  # the caller's arrays untouched
    if expected is None:
        assert delta.vector_sum is None and delta.unit_sum is None and delta.documents == 0
        return
    assert delta.vector_sum is not None and delta.unit_sum is not None
    assert delta.documents == expected[0]
    assert delta.vector_sum.tobytes() == expected[1].tobytes()
    assert delta.unit_sum.tobytes() == expected[2].tobytes()
