"""`contracts.trusted.trusted_constructor`: the same instances as `model_construct`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from contracts.topk import ScoreBreakdown, TopKResult
from contracts.trusted import trusted_constructor

scores = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | scores | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
breakdowns = st.fixed_dictionaries(
    {"lexical": scores, "vector": scores, "freshness": scores, "metadata": scores}
)


def _same(made: BaseModel, reference: BaseModel) -> None:
    assert made == reference
    assert type(made) is type(reference)
    assert made.model_fields_set == reference.model_fields_set
    assert list(made) == list(reference)  # field order too
    assert made.model_dump_json() == reference.model_dump_json()
    assert made.model_dump() == reference.model_dump()


@given(breakdowns)
def test_a_breakdown_is_model_constructs(drawn: dict[str, float]) -> None:
    values = {name: drawn[name] for name in ScoreBreakdown.model_fields}  # declared order
    _same(trusted_constructor(ScoreBreakdown)(**values), ScoreBreakdown.model_construct(**values))


@given(
    st.integers(1, 500),
    st.text(max_size=30),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5) | st.none(),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5) | st.none(),
    scores,
    breakdowns | st.none(),
)
def test_a_result_is_model_constructs(
    rank: int,
    text: str,
    payload: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
    score: float,
    breakdown: dict[str, float] | None,
) -> None:
    parts = None if breakdown is None else ScoreBreakdown.model_construct(**breakdown)
    values = {
        "rank": rank,
        "document_id": text,
        "item_id": text[::-1],
        "payload_schema": "s",
        "payload": payload,
        "metadata": metadata,
        "content": None,
        "score": score,
        "score_breakdown": parts,
    }
    _same(trusted_constructor(TopKResult)(**values), TopKResult.model_construct(**values))


def test_a_call_without_every_field_takes_the_defaults_as_model_construct_does() -> None:
    values = {"rank": 1, "document_id": "d", "item_id": "i", "payload_schema": "s", "score": 0.5}
    made = trusted_constructor(TopKResult)(**values)
    _same(made, TopKResult.model_construct(**values))
    assert made.payload is None and made.model_fields_set == set(values)


class _Aliased(BaseModel):
    value: int = Field(alias="v")


class _Private(BaseModel):
    value: int
    _note: str = PrivateAttr(default="")


class _Extra(BaseModel):
    model_config = ConfigDict(extra="allow")
    value: int


class _PostInit(BaseModel):
    value: int

    def model_post_init(self, context: Any, /) -> None:
        pass


@pytest.mark.parametrize("model", [_Aliased, _Private, _Extra, _PostInit])
def test_a_model_whose_construction_does_more_is_refused(model: type[BaseModel]) -> None:
    with pytest.raises(ValueError, match="needs pydantic's model_construct"):
        trusted_constructor(model)
