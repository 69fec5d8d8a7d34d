"""Strict types on every request model and query-string parameter (issue 22).

Where the schema says integer, boolean or object, only a JSON integer, boolean or object
is taken: `"result_limit": true` or `"2"`, `"includeChildren": "yes"`, `{"keep": false}`
were coerced before. Each request model is walked from its own JSON Schema, so a field
added later is covered without an edit here; a float field still takes a JSON integer
(`2` is a number).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from contracts.admin import BuildRequest, GcRequest, RollbackRequest
from contracts.chonkydb import BulkRecordsRequest, ChonkyRetrieveRequest, ChonkyTopKRequest
from contracts.ingest_api import WriteRequest
from contracts.koutendb import FeedbackRequest, KoutenRetrieveRequest, ProfileBody
from contracts.koutendb_io import BACKUP_NAME_PATTERN, BackupRequest, backup_name_problem
from contracts.params import query_bool, query_int
from contracts.records import Record
from contracts.topk import RecordsByIdRequest, RetrieveRequest, TopKRequest

RECORD = {"namespace": "demo", "snapshot_kind": "objects", "item_id": "a", "revision": 1}
# A minimal valid body per request model: the base each wrong type is put into.
VALID: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (Record, RECORD),
    (TopKRequest, {"namespace": "demo", "scope_ref": "longterm:objects:current"}),
    (RetrieveRequest, {"namespace": "demo", "scope_ref": "longterm:objects:current"}),
    (RecordsByIdRequest, {"namespace": "demo", "document_ids": ["x"]}),
    (ChonkyTopKRequest, {"scope_ref": "longterm:objects:current"}),
    (ChonkyRetrieveRequest, {"scope_ref": "longterm:objects:current"}),
    (BulkRecordsRequest, {"items": [{"snapshot_kind": "objects", "item_id": "a"}]}),
    (KoutenRetrieveRequest, {}),
    (ProfileBody, {}),
    (FeedbackRequest, {"requestId": "r"}),
    (BuildRequest, {"namespace": "demo", "snapshot_kind": "objects"}),
    (RollbackRequest, {"namespace": "demo", "snapshot_kind": "objects"}),
    (GcRequest, {}),
    (BackupRequest, {"name": "nightly"}),
]
WRONG: dict[str, list[Any]] = {
    "integer": [True, False, "2", 2.5, None, [2], {"v": 2}],
    "boolean": ["yes", "true", 1, 0, None, [True], {"v": True}],
    "number": [True, "2.5", None, [2.5]],
    "string": [2, True, None, ["x"], {"v": "x"}],
    "object": [False, "{}", [], 0],
}


def _types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON types a property's schema admits."""
    if "$ref" in schema:
        return _types(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return set().union(*(_types(s, defs) for s in schema["anyOf"]))
    kind = schema.get("type")
    if kind is None:
        return {"any"}
    kinds = {kind} if isinstance(kind, str) else set(kind)
    # JSON Schema's "number" takes integers: an integer is never a wrong number.
    return kinds | ({"integer"} if "number" in kinds else set())


def _cases() -> list[tuple[type[BaseModel], dict[str, Any], str, Any]]:
    out = []
    for model, base in VALID:
        schema = model.model_json_schema()
        defs = schema.get("$defs", {})
        for name, prop in schema.get("properties", {}).items():
            allowed = _types(prop, defs)
            if "any" in allowed:
                continue
            # Sorted: set order varies with the hash seed, and every xdist worker must
            # collect the same tests in the same order.
            for kind in sorted(allowed - {"null", "array"}):
                for value in WRONG.get(kind, []):
                    if value is None and "null" in allowed:
                        continue
                    if _json_type(value) in allowed:
                        continue
                    out.append((model, base, name, value))
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


CASES = _cases()


@pytest.mark.parametrize(("model", "base"), VALID, ids=[m.__name__ for m, _ in VALID])
def test_every_minimal_body_is_valid(model: type[BaseModel], base: dict[str, Any]) -> None:
    model.model_validate(base)


@pytest.mark.parametrize(
    ("model", "base", "field", "value"),
    CASES,
    ids=[f"{m.__name__}.{f}={v!r}" for m, _, f, v in CASES],
)
def test_a_value_of_another_json_type_is_refused(
    model: type[BaseModel], base: dict[str, Any], field: str, value: Any
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**base, field: value})
    assert any(e["loc"][:1] == (field,) for e in caught.value.errors()), caught.value


def test_every_request_model_has_typed_fields_to_check() -> None:
    checked = {m for m, *_ in CASES}
    assert checked == {m for m, _ in VALID}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({**RECORD, "revision": True}, ("revision",)),
        ({**RECORD, "revision": "1"}, ("revision",)),
        ({**RECORD, "deleted": "true"}, ("deleted",)),
        ({**RECORD, "vector": ["0.5"]}, ("vector", 0)),
        ({**RECORD, "text": {"tags": [1]}}, ("text", "tags", 0)),
        ({**RECORD, "metadata": {"updated_at": 1_700_000_000}}, ("metadata", "updated_at")),
        ({**RECORD, "metadata": {"updated_at": "1700000000"}}, ("metadata", "updated_at")),
        ({**RECORD, "metadata": {"updated_at": "2026-03-19T12:00:00"}}, ("metadata", "updated_at")),
        ({**RECORD, "metadata": {"visibility": "all"}}, ("metadata", "visibility")),
    ],
)
def test_nested_record_fields_are_strict(body: dict[str, Any], where: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        Record.model_validate(body)
    assert any(e["loc"][: len(where)] == where for e in caught.value.errors()), caught.value


@pytest.mark.parametrize(
    ("model", "body", "where"),
    [
        (
            TopKRequest,
            {"namespace": "demo", "scope_ref": "s", "include": {"payload": "yes"}},
            ("include", "payload"),
        ),
        (
            TopKRequest,
            {"namespace": "demo", "scope_ref": "s", "ranking": {"vector_weight": "1"}},
            ("ranking", "vector_weight"),
        ),
        (
            TopKRequest,
            {"namespace": "demo", "scope_ref": "s", "filters": {"updated_after": 0}},
            ("filters", "updated_after"),
        ),
        (
            TopKRequest,
            {
                "namespace": "demo",
                "scope_ref": "s",
                "phrase_plan": {
                    "vocabulary": "v",
                    "groups": [{"alternatives": ["a"], "required": 1}],
                },
            },
            ("phrase_plan", "groups", 0, "required"),
        ),
        (WriteRequest, [{**RECORD, "revision": "1"}], (0, "revision")),
        (WriteRequest, {"records": [{**RECORD, "deleted": 0}]}, ("records", 0, "deleted")),
        (
            BulkRecordsRequest,
            {"items": [{"item_id": "a", "enable_chunking": "no"}]},
            ("items", 0, "enable_chunking"),
        ),
    ],
)
def test_nested_request_fields_are_strict(
    model: type[BaseModel], body: Any, where: tuple[Any, ...]
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    locs = [
        tuple(
            x for x in e["loc"] if not (isinstance(x, str) and ("Record" in x or "WriteBatch" in x))
        )
        for e in caught.value.errors()
    ]
    assert any(loc[: len(where)] == where for loc in locs), caught.value


def test_floats_take_json_integers_and_timestamps_take_rfc3339() -> None:
    body = TopKRequest.model_validate(
        {
            "namespace": "demo",
            "scope_ref": "s",
            "timeout_seconds": 2,
            "ranking": {"vector_weight": 1},
            "filters": {"updated_after": "2026-03-19T12:00:00+01:00"},
        }
    )
    assert body.timeout_seconds == 2.0 and body.ranking.vector_weight == 1.0
    assert body.filters.updated_after is not None
    assert body.filters.updated_after.isoformat() == "2026-03-19T11:00:00+00:00"
    assert Record.model_validate({**RECORD, "vector": [1, 0.5]}).vector == [1.0, 0.5]


@pytest.mark.parametrize("text", ["0", "8", "08", "-1", "4096", "9" * 20])
def test_query_int_takes_decimal_digits(text: str) -> None:
    assert query_int(text) == int(text)


@pytest.mark.parametrize(
    "text", ["", "8.0", "+8", " 8", "8 ", "1_000", "0x8", "٣", "²", "1e3", "true", "9" * 21]
)
def test_query_int_refuses_everything_else(text: str) -> None:
    with pytest.raises(ValueError, match="integer"):
        query_int(text)


@given(st.text(max_size=8))
def test_query_bool_is_exactly_true_or_false(text: str) -> None:
    if text in ("true", "false"):
        assert query_bool(text) is (text == "true")
    else:
        with pytest.raises(ValueError, match="true or false"):
            query_bool(text)


@given(st.text(alphabet="ab09._-/Z ", max_size=12))
def test_the_backup_name_pattern_is_the_rule(name: str) -> None:
    import re

    assert (re.fullmatch(BACKUP_NAME_PATTERN, name) is not None) == (
        backup_name_problem(name) is None
    )


def test_the_served_document_states_the_deployments_bounds() -> None:
    """`contracts.openapi.apply_facts`: the configured result limit is the maximum of
    every limit field (nullable ones too), the profile ids the enum of `profile` (null
    still allowed), the embedder's dimension the exact length of a vector."""
    from contracts.openapi import apply_facts

    facts = {"max_result_limit": 700, "fusion_profiles": ["a@1", "b@2"], "vector_dimension": 3}
    topk = apply_facts(TopKRequest.model_json_schema(), facts)["properties"]
    assert topk["result_limit"]["maximum"] == 700
    page = topk["page_size"]
    assert page["maximum"] == 700
    assert {b.get("maximum") for b in page["anyOf"] if b["type"] == "integer"} == {700}
    branches = {b["type"]: b for b in topk["profile"]["anyOf"]}
    assert branches["string"]["enum"] == ["a@1", "b@2"] and "null" in branches
    vector = apply_facts(Record.model_json_schema(), facts)["properties"]["vector"]
    (array,) = [b for b in vector["anyOf"] if b["type"] == "array"]
    assert (array["minItems"], array["maxItems"]) == (3, 3)
    kouten = apply_facts(KoutenRetrieveRequest.model_json_schema(), facts)["properties"]
    assert kouten["budget"]["maximum"] == 700
    # Without facts, the default deployment's bound stays (what docs/schemas/ say).
    assert (
        apply_facts(TopKRequest.model_json_schema(), {})["properties"]["result_limit"]["maximum"]
        == 500
    )


def test_an_integer_is_a_number_without_a_fraction() -> None:
    """JSON Schema's integer: `2.0` is one (fuzzers and some clients send it), so a
    request valid for the document is not refused for it; `2.5`, `true`, `"2"` are not."""
    assert GcRequest.model_validate({"keep": 3.0}).keep == 3
    assert Record.model_validate({**RECORD, "revision": 2.0}).revision == 2
    for value in (2.5, True, "2"):
        with pytest.raises(ValidationError):
            GcRequest.model_validate({"keep": value})


@given(
    st.text(alphabet=" \t\n\x1c\x85\u3000\ufeffx_", max_size=6)
    | st.sampled_from(["__allowed_doc_ids__", " __allowed_doc_ids__\n", "__allowed_doc_ids__x"])
)
def test_schema_text_rules_are_pythons_strip(text: str) -> None:
    """The JSON Schema patterns for "blank" (KoutenDB's query) and "the by-id query"
    (ChonkyDB's) say what the server's `str.strip` decides."""
    import re

    from contracts.chonkydb import _BY_ID_QUERY_TEXT, BY_ID_QUERY
    from contracts.koutendb import NOT_BLANK

    assert (re.search(NOT_BLANK, text) is not None) == bool(text.strip())
    assert (re.match(_BY_ID_QUERY_TEXT, text) is not None) == (text.strip() in ("", BY_ID_QUERY))


@pytest.mark.parametrize(("model", "base"), VALID, ids=[m.__name__ for m, _ in VALID])
def test_every_bound_is_a_json_schema_keyword(model: type[BaseModel], base: dict[str, Any]) -> None:
    """A bound pydantic writes as `ge`/`le` (inside the union of an optional validated
    integer) is said again as `minimum`/`maximum` where JSON Schema reads it: the
    document is not looser than the server (schemathesis sent `budget: -868`)."""
    del base
    twins = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}

    def walk(node: Any, parent: dict[str, Any]) -> None:
        if isinstance(node, dict):
            for key, twin in twins.items():
                if key in node:
                    assert node.get(twin, parent.get(twin)) == node[key], (model, node)
            for value in node.values():
                walk(value, node)
        elif isinstance(node, list):
            for value in node:
                walk(value, parent)

    walk(model.model_json_schema(), {})
