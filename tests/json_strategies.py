"""Hypothesis strategies for JSON payloads whose keys and strings look like the
landmarks of the record text cut (`contracts.records.record_json_without_vector`) and of
the vector splice: a payload may hold any of them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["TEXT", "TRICKY", "tricky_json"]

TRICKY = st.sampled_from(
    ["vector", ',"vector":[', "]", '],"deleted":false}', "index_lanes", '"', "\\", "{", "}"]
)
TEXT = st.one_of(TRICKY, st.text(max_size=12))
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)


def tricky_json(max_leaves: int) -> st.SearchStrategy[Any]:
    """JSON values (nested lists and objects) of at most `max_leaves` leaves."""
    return st.recursive(
        _LEAF,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )
