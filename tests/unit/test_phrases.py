"""Phrase plans: vocabulary loading, resolution, restriction and diagnostics.

Resolution is pure; the restriction and the report run against a real tantivy index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.errors import HTTP_STATUS, ErrorCode, OrreryError
from contracts.index import SearchFilter
from contracts.phrases import PhraseGroup, PhrasePlan, VocabularySet, normalize_term
from contracts.topk import QueryPlan, RetrieveRequest, TopKRequest
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.bootstrap import query_limits, vocabulary_registry
from query.phrases import (
    MAX_PLAN_PHRASES,
    ResolvedPhrasePlan,
    VocabularyRegistry,
    parse_vocabularies,
)
from query.settings import QuerySettings
from tests.conformance.corpus import doc

VOCABULARIES = {
    "home": {
        "appliances": {
            "Kühlschrank": ["Kühlschrank", "fridge", "refrigerator"],
            "thermos": ["red thermos", "Thermoskanne"],
            "kettle": ["blue kettle"],
        },
        "rooms": {"hall": ["hall cupboard"]},
    },
    "other": {"appliances": {"oven": ["oven"]}},
}


def registry(max_documents: int = 10_000) -> VocabularyRegistry:
    return VocabularyRegistry(
        VocabularySet.model_validate(VOCABULARIES), max_documents=max_documents
    )


def plan(*groups: tuple[list[str], bool], vocabulary: str = "appliances") -> PhrasePlan:
    return PhrasePlan(
        vocabulary=vocabulary,
        groups=[PhraseGroup(alternatives=alts, required=req) for alts, req in groups],
    )


# -- vocabularies -------------------------------------------------------------------


def test_blank_vocabularies_are_none() -> None:
    assert parse_vocabularies("  ").root == {}
    assert registry().vocabularies("home") == ["appliances", "rooms"]
    assert registry().vocabularies("nobody") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid vocabularies"),
        ('{"home": {"v": {"term": []}}}', "1..32 phrases"),
        ('{"home": {"v": {"term": ["!!!"]}}}', "has no word"),
        ('{"home": {"v": {"term": ["' + "x" * 40 + '"]}}}', "40+ bytes"),
        ('{"home": {"v": {"Term": ["a"], " term ": ["b"]}}}', "same term"),
        ('{"home": {"v": {"  ": ["a"]}}}', "blank"),
        ('{"bad/name": {"v": {"t": ["a"]}}}', "bad/name"),
        ('{"home": {"bad name": {"t": ["a"]}}}', "bad name"),
        ('{"home": {"v": {"t": "a"}}}', "list"),
        ('{"home": {"v": {"t": ["a"]' + "".join(f', "t{n}": ["a"]' for n in range(2)) + "}}}", ""),
    ],
)
def test_invalid_vocabularies_are_refused(text: str, message: str) -> None:
    if not message:  # the last case is valid: a control for the others
        assert len(parse_vocabularies(text).root["home"]["v"]) == 3
        return
    with pytest.raises(ValueError, match="invalid vocabularies") as raised:
        parse_vocabularies(text)
    assert message in str(raised.value)


def test_too_many_phrases_per_term_are_refused() -> None:
    with pytest.raises(ValueError, match=r"1\.\.32 phrases"):
        parse_vocabularies(json.dumps({"home": {"v": {"t": [f"p{n}" for n in range(33)]}}}))


def test_terms_normalize_case_width_and_spaces() -> None:
    assert normalize_term("  Kühl\u00adSCHRANK ") != normalize_term("kühlschrank")  # soft hyphen
    assert normalize_term(" Ku\u0308hlSCHRANK ") == normalize_term("kühlschrank")  # NFC
    assert normalize_term("blue \t Kettle") == "blue kettle"


def test_settings_take_inline_json_or_a_file(tmp_path: Path) -> None:
    inline = QuerySettings(vocabularies=json.dumps(VOCABULARIES), phrase_max_documents=7)
    assert vocabulary_registry(inline).vocabularies("home") == ["appliances", "rooms"]
    assert vocabulary_registry(inline).max_documents == 7
    path = tmp_path / "vocabularies.json"
    path.write_text(json.dumps(VOCABULARIES), encoding="utf-8")
    limits = query_limits(QuerySettings(vocabularies=str(path)))
    assert limits.vocabularies.vocabularies("other") == ["appliances"]
    assert query_limits(QuerySettings()).vocabularies.vocabularies("home") == []
    with pytest.raises(ValueError, match="ORRERY_VOCABULARIES: cannot read"):
        vocabulary_registry(QuerySettings(vocabularies=str(tmp_path / "missing.json")))
    with pytest.raises(ValueError, match="invalid vocabularies"):
        vocabulary_registry(QuerySettings(vocabularies='{"home": {"v": {"t": []}}}'))


# -- the request contract -----------------------------------------------------------


def test_requests_carry_a_phrase_plan() -> None:
    body = {"vocabulary": "appliances", "groups": [{"alternatives": ["fridge"]}]}
    request = TopKRequest(namespace="home", scope_ref="longterm:objects:current", phrase_plan=body)
    assert request.phrase_plan is not None and request.phrase_plan.groups[0].required is True
    retrieve = RetrieveRequest(
        namespace="home", scope_ref="longterm:objects:current", phrase_plan=body
    )
    assert retrieve.phrase_plan == request.phrase_plan
    assert "phrase_plan" in QueryPlan.model_fields


@pytest.mark.parametrize(
    "bad",
    [
        {"vocabulary": "", "groups": [{"alternatives": ["a"]}]},
        {"vocabulary": "v", "groups": []},
        {"vocabulary": "v", "groups": [{"alternatives": []}]},
        {"vocabulary": "v", "groups": [{"alternatives": [""]}]},
        {"vocabulary": "v", "groups": [{"alternatives": ["a"], "weight": 2}]},
        {"vocabulary": "v", "groups": [{"alternatives": ["a"]}] * 17},
        {"vocabulary": "v", "groups": [{"alternatives": ["a"] * 33}]},
        {"vocabulary": "v", "groups": [{"alternatives": ["a" * 257]}]},
        {"vocabulary": "v", "groups": [{"alternatives": ["a"]}], "query": "x"},
    ],
)
def test_malformed_plans_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PhrasePlan.model_validate(bad)


def test_error_codes_are_declared() -> None:
    assert HTTP_STATUS[ErrorCode.UNKNOWN_VOCABULARY] == 422
    assert HTTP_STATUS[ErrorCode.PHRASE_SET_TOO_LARGE] == 422


# -- resolution ---------------------------------------------------------------------


def test_no_plan_changes_nothing() -> None:
    resolved = registry().resolve("home", None)
    base = SearchFilter(galaxy="g")
    assert not resolved.active and not resolved.narrows
    assert resolved.restrict(base) is base
    assert resolved.lexical_text("tea") == "tea"
    assert resolved.fingerprint is None


def test_unknown_vocabulary_or_namespace_is_refused() -> None:
    for namespace, vocabulary in [("home", "nope"), ("nobody", "appliances"), ("home", "oven")]:
        with pytest.raises(OrreryError) as raised:
            registry().resolve(namespace, plan((["fridge"], True), vocabulary=vocabulary))
        assert raised.value.code is ErrorCode.UNKNOWN_VOCABULARY
        assert raised.value.details == {"namespace": namespace, "vocabulary": vocabulary}


def test_known_terms_resolve_to_their_phrases() -> None:
    resolved = registry().resolve(
        "home", plan((["KÜHLSCHRANK", "thermos", "kuhlschrank"], True), (["kettle"], True))
    )
    assert resolved.phrases == {
        "Kühlschrank": ("Kühlschrank", "fridge", "refrigerator"),
        "thermos": ("red thermos", "Thermoskanne"),
        "kettle": ("blue kettle",),
    }
    assert resolved.groups[0].terms == ("Kühlschrank", "thermos")
    assert resolved.groups[0].unknown_alternatives == 1  # "kuhlschrank" is no term
    assert resolved.restriction == (
        ("Kühlschrank", "fridge", "refrigerator", "red thermos", "Thermoskanne"),
        ("blue kettle",),
    )
    restricted = resolved.restrict(SearchFilter(galaxy="g"))
    assert restricted.galaxy == "g" and restricted.phrases == resolved.restriction
    assert resolved.narrows and resolved.fallback_words == ()
    assert resolved.lexical_text("tea") == "tea"


def test_optional_groups_do_not_restrict() -> None:
    resolved = registry().resolve("home", plan((["thermos"], False), (["kettle"], True)))
    assert resolved.restriction == (("blue kettle",),)
    only_optional = registry().resolve("home", plan((["thermos"], False)))
    assert only_optional.restriction == () and not only_optional.narrows
    assert "thermos" in only_optional.phrases  # still resolved, for the report


def test_a_group_without_known_terms_takes_the_broad_lexical_fallback() -> None:
    resolved = registry().resolve(
        "home", plan((["thermos"], True), (["Teekanne", "tea pot"], True), (["mug"], False))
    )
    assert resolved.restriction == (("red thermos", "Thermoskanne"),)
    assert [g.known for g in resolved.groups] == [True, False, False]
    assert resolved.fallback_words == ("Teekanne", "tea pot", "mug")
    assert resolved.lexical_text("where is") == "where is Teekanne tea pot mug"
    assert resolved.lexical_text("") == "Teekanne tea pot mug"
    fallback_only = registry().resolve("home", plan((["Teekanne"], True)))
    assert fallback_only.restriction == () and fallback_only.narrows


def test_too_many_phrases_are_refused() -> None:
    terms = {f"t{n}": [f"phrase {n} {m}" for m in range(8)] for n in range(9)}
    many = VocabularyRegistry(VocabularySet.model_validate({"home": {"v": terms}}))
    assert MAX_PLAN_PHRASES < 9 * 8
    with pytest.raises(OrreryError) as raised:
        many.resolve("home", plan((list(terms), True), vocabulary="v"))
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert raised.value.details["max_phrases"] == MAX_PLAN_PHRASES
    assert many.resolve("home", plan((list(terms)[:8], True), vocabulary="v")).active


def test_fingerprint_binds_the_plan_and_the_vocabulary_content() -> None:
    first = registry().resolve("home", plan((["thermos"], True))).fingerprint
    assert first == registry().resolve("home", plan(([" THERMOS "], True))).fingerprint
    assert first != registry().resolve("home", plan((["thermos"], False))).fingerprint
    assert first != registry().resolve("home", plan((["thermos", "x"], True))).fingerprint
    edited = json.loads(json.dumps(VOCABULARIES))
    edited["home"]["appliances"]["thermos"].append("Thermosflasche")
    changed = VocabularyRegistry(VocabularySet.model_validate(edited))
    assert first != changed.resolve("home", plan((["thermos"], True))).fingerprint


# -- restriction of the vector source and the report, over a real index -------------


@pytest.fixture
def lexical(tmp_path: Path) -> Iterator[TantivyLexicalSearch]:
    index = TantivyLexicalIndex(tmp_path / "tantivy")
    index.create("g1")
    index.apply(
        "g1",
        [
            doc("a", title="Red thermos", body="the red thermos is in the hall cupboard"),
            doc("b", body="Die Thermoskanne steht im Kühlschrank"),
            doc("c", body="the blue kettle and the fridge"),
            doc("d", body="a thermos that is red", galaxy="other"),
        ],
        [],
    )
    yield TantivyLexicalSearch(index.searchable)
    index.close()


def test_vector_filter_lists_the_matching_documents(lexical: TantivyLexicalSearch) -> None:
    resolved = registry().resolve("home", plan((["thermos"], True)))
    lexical_filter = resolved.restrict(SearchFilter(galaxy="default"))
    vector_filter = resolved.vector_filter(lexical_filter, "g1", lexical)
    assert vector_filter.phrases == ()
    assert vector_filter.galaxy == "default" and vector_filter.document_ids == ("a", "b")
    assert resolved.phrase_document_count == 2
    # Nothing to resolve: the filter passes through unchanged.
    plain = SearchFilter(galaxy="default")
    assert resolved.vector_filter(plain, "g1", lexical) is plain


def test_vector_filter_never_returns_a_partial_set(lexical: TantivyLexicalSearch) -> None:
    resolved = registry(max_documents=1).resolve("home", plan((["thermos"], True)))
    with pytest.raises(OrreryError) as raised:
        resolved.vector_filter(resolved.restrict(SearchFilter()), "g1", lexical)
    assert raised.value.code is ErrorCode.PHRASE_SET_TOO_LARGE
    assert raised.value.details["max_documents"] == 1
    empty = registry(max_documents=1).resolve("home", plan((["kettle"], True), (["thermos"], True)))
    assert empty.vector_filter(empty.restrict(SearchFilter()), "g1", lexical).document_ids == ()


def test_report_names_resolved_and_matched_terms(lexical: TantivyLexicalSearch) -> None:
    resolved = registry().resolve(
        "home",
        plan((["thermos", "kettle"], True), (["Kühlschrank"], False), (["tea", "pot"], True)),
    )
    report = resolved.report(["a", "c"], "g1", lexical)
    assert report is not None
    assert report.vocabulary == "appliances"
    assert report.resolved_terms == {
        "thermos": ["red thermos", "Thermoskanne"],
        "kettle": ["blue kettle"],
        "Kühlschrank": ["Kühlschrank", "fridge", "refrigerator"],
    }
    assert report.matched_terms == {
        "thermos": ["red thermos"],
        "kettle": ["blue kettle"],
        "Kühlschrank": ["fridge"],
    }
    assert [(g.group, g.restricted, g.matched) for g in report.groups] == [
        (0, True, True),
        (1, False, True),
        (2, False, False),
    ]
    assert report.groups[2].terms == [] and report.groups[2].unknown_alternatives == 2
    assert report.unknown_groups == [2] and report.fallback == "broad_lexical"
    assert report.phrase_document_count is None
    # Only the raw alternatives' count is reported, never their text.
    assert "tea" not in report.model_dump_json()


def test_report_only_counts_candidates(lexical: TantivyLexicalSearch) -> None:
    resolved = registry().resolve("home", plan((["thermos"], True)))
    only_b = resolved.report(["b"], "g1", lexical)
    assert only_b is not None and only_b.matched_terms == {"thermos": ["Thermoskanne"]}
    none = resolved.report([], "g1", lexical)
    assert none is not None and none.matched_terms == {} and none.fallback is None
    assert ResolvedPhrasePlan(None).report(["a"], "g1", lexical) is None


def test_vector_engines_refuse_phrase_groups() -> None:
    from query.adapters.qdrant_edge_vectors import edge_filter
    from query.adapters.qdrant_vectors import qdrant_filter

    with_phrases = SearchFilter(galaxy="g", phrases=(("red thermos",),))
    for translate in (edge_filter, qdrant_filter):
        with pytest.raises(OrreryError) as raised:
            translate(with_phrases)
        assert raised.value.code is ErrorCode.INTERNAL
        assert translate(with_phrases.model_copy(update={"phrases": ()})) is not None


def test_an_empty_phrase_group_matches_nothing() -> None:
    assert SearchFilter(phrases=(("a",), ())).matches_nothing()
    assert not SearchFilter(phrases=(("a",),)).matches_nothing()
