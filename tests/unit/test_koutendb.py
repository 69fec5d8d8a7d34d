"""KoutenDB's vocabulary, plan formulas, ring selection and envelope validator
(`contracts.koutendb`, `query.koutendb`), against the issue's numbers."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from contracts.errors import OrreryError
from contracts.koutendb import (
    AMOUNTS,
    DEPTHS,
    SCOPES,
    KoutenRetrieveRequest,
    clamp_top_rings,
    effective_top_rings,
    estimated_tokens,
    focus_to_top_rings,
    payload_string,
    retrieval_envelope_validation_errors,
    tuning_of,
)
from contracts.wire import validate_strict
from query.koutendb import Knobs, knobs_of, make_plan, ring_table
from query.ports import RingStat, StoredProfile

DEFAULT = StoredProfile("default", "raNormal", "ssTight", "sdNormal")


def test_vocabulary_maps_words_to_numbers() -> None:
    assert dict(AMOUNTS) == {"raFew": 3, "raNormal": 8, "raMany": 16, "raAllUseful": 32}
    assert dict(SCOPES) == {"ssTight": 0, "ssNear": 15, "ssWide": 45, "ssAll": 90}
    assert dict(DEPTHS) == {
        "sdShallow": (False, 0, 0),
        "sdNormal": (False, 0, 0),
        "sdDeep": (True, 2, 4),
        "sdVeryDeep": (True, 4, 8),
    }
    t = tuning_of("raMany", "ssWide", "sdDeep")
    assert (t.budget, t.focus, t.includeChildren, t.maxDepth, t.branchBudget) == (
        16,
        45,
        True,
        2,
        4,
    )
    with pytest.raises(KeyError):
        tuning_of("raLots", "ssTight", "sdNormal")


def test_effective_top_rings_formula() -> None:
    assert [focus_to_top_rings(f) for f in (1, 15, 45, 90, 100, 999, -5)] == [
        2,
        73,
        224,
        450,
        500,
        500,
        2,
    ]
    # The formula itself, for every focus: 2 + ceil-ish scaling of 1..100 onto 2..500.
    for focus in range(1, 101):
        assert focus_to_top_rings(focus) == max(2, min(500, 2 + ((focus - 1) * 498 + 98) // 99))
    assert [clamp_top_rings(t) for t in (-1, 0, 1, 2, 499, 501)] == [0, 0, 2, 2, 499, 500]
    assert effective_top_rings(0, 7) == 7 and effective_top_rings(1, 7) == 2
    assert effective_top_rings(0, 0) == 0


def test_tokens_and_payload_strings() -> None:
    assert [estimated_tokens(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert payload_string("koutendb.raw.v1", {"raw": "héllo"}) == "héllo"
    assert payload_string("other", {"raw": "x"}) == '{"raw":"x"}'
    assert payload_string("koutendb.raw.v1", {"raw": 3}) == '{"raw":3}'
    assert payload_string("", {"a": [1, {"b": "ü"}]}) == '{"a":[1,{"b":"ü"}]}'


def request(**fields: Any) -> KoutenRetrieveRequest:
    return validate_strict(fields, KoutenRetrieveRequest)


def test_words_override_the_profile_and_numbers_override_words() -> None:
    wide = StoredProfile("wide", "raMany", "ssWide", "sdDeep")
    k = knobs_of(request(), wide)
    assert (k.profile, k.budget, k.focus, k.include_children, k.max_depth) == (
        "wide",
        16,
        45,
        True,
        2,
    )
    k = knobs_of(request(amount="raFew", depth="sdShallow"), wide)
    assert (k.budget, k.include_children, k.max_depth, k.scope) == (3, False, 0, "ssWide")
    k = knobs_of(request(amount="raFew", budget=5, focus=0, maxDepth=7, branchBudget=0), wide)
    assert (k.budget, k.focus, k.max_depth, k.branch_budget) == (5, 0, 7, 0)
    # includeChildren is ORed with the depth's.
    assert knobs_of(request(includeChildren=True), DEFAULT).include_children
    assert knobs_of(request(includeChildren=False), wide).include_children


@pytest.mark.parametrize(
    "fields",
    [
        {"budget": 0},
        {"focus": -1},
        {"topRings": -1},
        {"maxDepth": 1.5},
        {"ring": ""},
        {"ring": "a//b"},
        {"ring": "/a"},
        {"amount": "raLots"},
        {"scope": "ssTIGHT"},
        {"depth": "deep"},
        {"mode": "exact"},
    ],
)
def test_bad_requests_are_invalid(fields: dict[str, Any]) -> None:
    with pytest.raises(OrreryError) as caught:
        request(**fields)
    assert caught.value.code == "invalid_request"


def test_unknown_fields_are_named() -> None:
    with pytest.raises(OrreryError) as caught:
        request(query_text="snake_case is not KoutenDB's")
    assert caught.value.code == "unknown_field"


def stat(ring: str, documents: int, *vectors: tuple[float, float]) -> RingStat:
    arr = np.array(vectors, dtype=np.float64)
    units = arr / np.linalg.norm(arr, axis=1, keepdims=True)
    return RingStat(ring, documents, arr.sum(axis=0), units.sum(axis=0))


TABLE = ring_table(
    "g1",
    [
        stat("japan/tokyo", 1, (1.0, 0.0)),
        stat("japan/osaka", 1, (0.9, 0.1)),
        stat("japan/history", 1, (0.7, 0.3)),
        stat("japan/food", 1, (0.0, 1.0)),
        stat("japan/tokyo/shibuya", 2, (1.0, 0.0), (0.8, 0.2)),
        stat("japan/tokyo/ueno", 1, (0.0, 1.0)),
        stat("korea/seoul", 1, (0.95, 0.05)),
        stat("", 3, (1.0, 1.0), (1.0, 0.0), (0.0, 1.0)),
    ],
)
Q = np.array([1.0, 0.0])


def knobs(**fields: Any) -> Knobs:
    return knobs_of(request(**fields), DEFAULT)


def test_ring_table_centroids_coherence_and_hierarchy() -> None:
    assert TABLE.total == 11
    assert "japan" in TABLE.known and TABLE.count("japan") == 0
    assert TABLE.children["japan"] == (
        "japan/food",
        "japan/history",
        "japan/osaka",
        "japan/tokyo",
    )
    # Coherence = mean cosine to the centroid: 1 for one vector, less for a spread ring.
    assert TABLE.coherence_of("japan/tokyo") == pytest.approx(1.0)
    shibuya = TABLE.coherence_of("japan/tokyo/shibuya")
    c = np.array([1.8, 0.2]) / np.linalg.norm([1.8, 0.2])
    x2 = np.array([0.8, 0.2]) / np.linalg.norm([0.8, 0.2])
    assert shibuya == pytest.approx((c[0] + x2 @ c) / 2)
    scores = TABLE.scores(Q)
    assert scores["japan/tokyo"] == pytest.approx(1.0)
    assert scores["japan/food"] == pytest.approx(0.0)
    assert TABLE.scores(None)["japan/tokyo"] == 0.0


def test_ring_scoped_plan_selects_the_base_only() -> None:
    plan, rings = make_plan(knobs(), "japan/tokyo", TABLE, Q)
    assert (plan.strategy, plan.reason) == ("ring-scoped", "explicit ring scope")
    assert rings == ("japan/tokyo",) and plan.prunedRings == []
    (feature,) = plan.ringFeatures
    assert feature.isBase and feature.ringCount == 1
    assert feature.utility == pytest.approx(1.0 * (1 - 1 / 2))


def test_near_scope_adds_the_two_best_siblings_and_prunes_the_rest() -> None:
    plan, rings = make_plan(knobs(scope="ssNear"), "japan/tokyo", TABLE, Q)
    assert rings == ("japan/tokyo", "japan/osaka", "japan/history")
    assert plan.prunedRings == ["japan/food"]
    assert [f.ring for f in plan.ringFeatures] == [*rings, "japan/food"]
    assert all(f.isSibling for f in plan.ringFeatures[1:])
    # Wide: max(4, branchBudget) siblings; all: every sibling.
    _, wide = make_plan(knobs(scope="ssWide"), "japan/tokyo", TABLE, Q)
    assert wide is not None and len(wide) == 4
    _, everything = make_plan(knobs(scope="ssAll"), "japan/tokyo", TABLE, Q)
    assert everything is not None and set(everything) == {
        "japan/tokyo",
        "japan/osaka",
        "japan/history",
        "japan/food",
    }
    # A root ring has no siblings (another parent's rings are never added).
    _, root = make_plan(knobs(scope="ssAll"), "korea/seoul", TABLE, Q)
    assert root == ("korea/seoul",)


def test_depth_descends_with_a_branch_budget() -> None:
    plan, rings = make_plan(knobs(depth="sdDeep"), "japan", TABLE, Q)
    assert plan.strategy == "hierarchical-ring"
    assert rings is not None and rings[0] == "japan"
    assert set(rings) == {
        "japan",
        "japan/tokyo",
        "japan/osaka",
        "japan/history",
        "japan/food",
        "japan/tokyo/shibuya",
        "japan/tokyo/ueno",
    }
    # One child per ring: the best by centroid score; the others are pruned.
    plan, rings = make_plan(knobs(depth="sdDeep", branchBudget=1), "japan", TABLE, Q)
    assert rings == ("japan", "japan/tokyo", "japan/tokyo/shibuya")
    # Pruned rings rank like candidates: centroid score, then name (food and ueno: 0).
    assert plan.prunedRings == ["japan/osaka", "japan/history", "japan/food", "japan/tokyo/ueno"]
    # maxDepth 1 stops below the children.
    _, rings = make_plan(knobs(depth="sdDeep", maxDepth=1), "japan", TABLE, Q)
    assert rings is not None and "japan/tokyo/shibuya" not in rings
    flags = {f.ring: (f.isBase, f.isSibling, f.isDescendant) for f in plan.ringFeatures}
    assert flags["japan"] == (True, False, False)
    assert flags["japan/tokyo/shibuya"] == (False, False, True)


def test_siblings_with_children_bring_their_descendants() -> None:
    _, rings = make_plan(knobs(scope="ssAll", depth="sdDeep"), "japan/osaka", TABLE, Q)
    assert rings is not None and "japan/tokyo/shibuya" in rings


def test_top_rings_and_global() -> None:
    plan, rings = make_plan(knobs(focus=1), None, TABLE, Q)
    assert plan.strategy == "top-rings" and plan.effectiveTopRings == 2
    assert rings == ("japan/tokyo", "korea/seoul")  # cosines 1.0, 0.9986 (shibuya 0.9939)
    plan, rings = make_plan(knobs(), None, TABLE, Q)
    assert (plan.strategy, plan.reason, rings, plan.selectedRings) == (
        "global",
        "no ring scope",
        None,
        [],
    )
    plan, _ = make_plan(knobs(focus=999, topRings=1), None, TABLE, None)
    assert (plan.focus, plan.topRings, plan.effectiveTopRings) == (100, 1, 500)
    # Without a query every centroid score is 0: rings rank by name.
    _, rings = make_plan(knobs(topRings=2), None, TABLE, None)
    assert rings == ("japan/food", "japan/history")


VALID: dict[str, Any] = {
    "schema": "koutendb.retrieval.v1",
    "version": 1,
    "source": {"provider": "orrery", "galaxy": "", "ring": "", "backend": "x", "sourceType": "d"},
    "query": {"mode": "vector", "budget": 0, "ringScoped": False},
    "plan": {
        "strategy": "global",
        "reason": "r",
        "amount": "raNormal",
        "scope": "ssTight",
        "depth": "sdNormal",
        "budget": 8,
        "focus": 0,
        "effectiveTopRings": 0,
        "branchBudget": 0,
        "maxDepth": 0,
        "ringScoped": False,
        "includeChildren": False,
    },
    "chunks": [
        {"id": "1", "payload": "p", "ring": "", "sourceUri": "u", "score": 1, "estimatedTokens": 0}
    ],
    "stats": {
        "totalVectors": 0,
        "scanned": 0,
        "skippedVectors": 0,
        "returned": 0,
        "ringsTouched": 0,
        "fanoutNodes": 1,
        "payloadBytes": 0,
        "estimatedTokens": 0,
        "candidateReduction": 0,
    },
    "policyHints": {
        "resourceKind": "rag",
        "resourceScope": "persistent",
        "retentionClass": "normal",
        "contextReusable": True,
    },
}


def broken(path: str, value: Any) -> dict[str, Any]:
    env = copy.deepcopy(VALID)
    node = env
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return env


DELETE = object()


def test_validator_accepts_a_minimal_envelope() -> None:
    assert retrieval_envelope_validation_errors(VALID) == []


def test_validator_messages_for_an_empty_object_and_non_objects() -> None:
    assert retrieval_envelope_validation_errors({}) == [
        "schema must be koutendb.retrieval.v1",
        "version must be 1",
        "source must be an object",
        "query must be an object",
        "plan must be an object",
        "chunks must be an array",
        "stats must be an object",
        "policyHints must be an object",
    ]
    for value in ([], "x", 1, None, True):
        assert retrieval_envelope_validation_errors(value) == ["envelope must be a JSON object"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("version", 1.0, "version must be 1"),
        ("version", True, "version must be 1"),
        ("source.provider", "", "source.provider must be a non-empty string"),
        ("source.backend", 3, "source.backend must be a non-empty string"),
        ("query.budget", -1, "query.budget must be >= 0"),
        ("query.budget", 2.0, "query.budget must be >= 0"),
        ("query.ringScoped", 1, "query.ringScoped must be a boolean"),
        ("plan.reason", DELETE, "plan.reason must be a non-empty string"),
        ("plan.maxDepth", False, "plan.maxDepth must be >= 0"),
        ("plan.includeChildren", "no", "plan.includeChildren must be a boolean"),
        ("chunks.0.payload", {"a": 1}, "chunks[0].payload must be a string"),
        ("chunks.0.score", "1", "chunks[0].score must be numeric"),
        ("chunks.0.score", True, "chunks[0].score must be numeric"),
        ("chunks.0.estimatedTokens", -2, "chunks[0].estimatedTokens must be >= 0"),
        ("chunks.0", "x", "chunks[0] must be an object"),
        ("stats.fanoutNodes", DELETE, "stats.fanoutNodes must be >= 0"),
        ("stats.candidateReduction", None, "stats.candidateReduction must be numeric"),
        ("policyHints.retentionClass", "", "policyHints.retentionClass must be a non-empty string"),
        ("policyHints.contextReusable", 0, "policyHints.contextReusable must be a boolean"),
        ("plan", [], "plan must be an object"),
        ("chunks", {}, "chunks must be an array"),
    ],
)
def test_validator_names_each_broken_field(path: str, value: Any, message: str) -> None:
    assert retrieval_envelope_validation_errors(broken(path, value)) == [message]


def test_validator_keeps_koutendbs_order() -> None:
    env = broken("policyHints.resourceKind", "")
    env["schema"] = "bad"
    env["chunks"].append(7)
    env["query"]["mode"] = ""
    assert retrieval_envelope_validation_errors(env) == [
        "schema must be koutendb.retrieval.v1",
        "query.mode must be a non-empty string",
        "chunks[1] must be an object",
        "policyHints.resourceKind must be a non-empty string",
    ]
