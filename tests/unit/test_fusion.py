"""Fusion math, profiles, derived ids and the profile registry."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate
from contracts.profiles import ProfileSet, RrfProfile, WeightedProfile
from contracts.topk import Ranking, TopKRequest
from query.bootstrap import profile_registry, query_limits
from query.fusion import (
    Rescored,
    _union,
    competition_ranks,
    fuse,
    fuse_rrf,
    fuse_top,
    fuse_weighted_profile,
    min_max,
    normalize,
    z_score,
)
from query.model import fuse_weighted
from query.profiles import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE_ID,
    ProfileRegistry,
    derive_profile,
    parse_profiles,
)
from query.service import QueryLimits
from query.settings import QuerySettings

NOW = datetime(2026, 11, 1, tzinfo=UTC)
BUILTIN = {p.id: p for p in BUILTIN_PROFILES}


def cand(doc: str, score: float, *, days: float = 0.0, status: str = "active") -> Candidate:
    return Candidate(
        document_id=doc,
        revision=1,
        score=score,
        updated_at=NOW - timedelta(days=days),
        status=status,
    )


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Best first, ties by document id: the order the search ports guarantee."""
    return sorted(candidates, key=lambda c: (-c.score, c.document_id))


def weighted(**fields: object) -> WeightedProfile:
    return WeightedProfile.model_validate({"id": "test@1", **fields})


# --------------------------------------------------------------------------- normalizers


def test_min_max_edge_cases() -> None:
    assert min_max({}) == {}
    assert min_max({"a": -3.5}) == {"a": 1.0}
    assert min_max({"a": 2.0, "b": 2.0}) == {"a": 1.0, "b": 1.0}
    assert min_max({"a": 1.0, "b": 3.0, "c": 2.0}) == {"a": 0.0, "b": 1.0, "c": 0.5}


def test_z_score_edge_cases() -> None:
    assert z_score({}) == {}
    assert z_score({"a": 7.0}) == {"a": 1.0}
    assert z_score({"a": 0.3, "b": 0.3, "c": 0.3}) == dict.fromkeys("abc", 1.0)
    # Symmetric scores: the mean maps to 0.5, one standard deviation to 0.5 ± 1/6.
    scores = z_score({"a": 1.0, "b": 2.0, "c": 3.0})
    assert scores["b"] == pytest.approx(0.5)
    std = (2.0 / 3.0) ** 0.5
    assert scores["c"] == pytest.approx(0.5 + (1.0 / std) / 6.0)
    assert scores["a"] == pytest.approx(1.0 - scores["c"])


def test_z_score_clips_beyond_three_standard_deviations() -> None:
    scores = {f"d{i}": float(i % 5) for i in range(200)} | {"high": 1_000.0}
    out = z_score(scores)
    assert out["high"] == 1.0
    assert all(0.0 < out[f"d{i}"] < 0.6 for i in range(5))
    assert out["d0"] < out["d1"] < out["d4"]


@given(st.dictionaries(st.text(max_size=3), st.floats(-1e6, 1e6), max_size=30))
def test_normalizations_stay_in_unit_interval_and_keep_order(scores: dict[str, float]) -> None:
    for method in ("min_max", "z_score"):
        out = normalize(scores, method)
        assert out.keys() == scores.keys()
        assert all(0.0 <= v <= 1.0 for v in out.values())
        for a in scores:
            for b in scores:
                if scores[a] < scores[b]:
                    assert out[a] <= out[b]


def test_competition_ranks_share_ties_and_keep_full_positions() -> None:
    listed = [cand("a", 3.0), cand("b", 2.0), cand("c", 2.0), cand("d", 1.0), cand("a", 0.5)]
    assert competition_ranks(listed) == {"a": 1, "b": 2, "c": 2, "d": 4}


# --------------------------------------------------------------------------- weighted


def test_weighted_1_is_the_original_formula() -> None:
    lexical = ranked([cand("a", 10.0, days=30), cand("b", 5.0, status="candidate")])
    vector = ranked([cand("b", 0.9, status="candidate"), cand("c", 0.5, status="mystery")])
    fused = {f.document_id: f for f in fuse_weighted(lexical, vector, ranking=Ranking(), now=NOW)}
    # min-max per source; missing -> 0; freshness halves every 30 days; status boosts.
    total = 1.0 + 1.0 + 0.15 + 0.25
    assert fused["a"].score == pytest.approx((1.0 + 0.0 + 0.15 * 0.5 + 0.25 * 1.0) / total)
    assert fused["b"].score == pytest.approx((0.0 + 1.0 + 0.15 + 0.25 * 0.6) / total)
    assert fused["c"].score == pytest.approx((0.0 + 0.0 + 0.15 + 0.25 * 0.3) / total)
    same = fuse(BUILTIN["weighted@1"], lexical, vector, now=NOW, half_life_days=30.0)
    assert [(f.document_id, f.score) for f in same] == [
        (f.document_id, f.score) for f in fuse_weighted(lexical, vector, ranking=Ranking(), now=NOW)
    ]


def test_weighted_single_candidate_and_constant_scores() -> None:
    profile = weighted(lexical_weight=1.0, vector_weight=1.0)
    one = fuse_weighted_profile(profile, [cand("a", 4.2)], [], now=NOW, half_life_days=30)
    assert [(f.document_id, f.lexical, f.vector, f.score) for f in one] == [("a", 1.0, 0.0, 0.5)]
    flat = fuse_weighted_profile(
        profile.model_copy(update={"normalization": "z_score"}),
        ranked([cand("a", 0.0), cand("b", 0.0)]),
        [],
        now=NOW,
        half_life_days=30,
    )
    assert [(f.document_id, f.lexical) for f in flat] == [("a", 1.0), ("b", 1.0)]


def test_weighted_missing_zero_versus_rescore() -> None:
    lexical = ranked([cand("a", 10.0), cand("b", 6.0), cand("c", 2.0)])
    vector = ranked([cand("d", 0.8), cand("a", 0.6), cand("b", 0.4)])
    rescored = Rescored(lexical={}, vector={"c": 0.2})  # d matches no query term
    zero = weighted(missing="zero")
    plain = {
        f.document_id: f
        for f in fuse_weighted_profile(
            zero, lexical, vector, now=NOW, half_life_days=30, rescored=rescored
        )
    }
    assert plain["c"].vector == 0.0 and plain["d"].lexical == 0.0  # rescored is ignored
    assert plain["c"].lexical == 0.0  # min-max over the lexical list: c is its lowest
    exact = {
        f.document_id: f
        for f in fuse_weighted_profile(
            zero.model_copy(update={"missing": "rescore"}),
            lexical,
            vector,
            now=NOW,
            half_life_days=30,
            rescored=rescored,
        )
    }
    # Normalized over the union: lexical {a 10, b 6, c 2, d 0}, vector {d .8, a .6, b .4, c .2}.
    assert exact["d"].lexical == 0.0 and exact["c"].lexical == pytest.approx(0.2)
    assert exact["c"].vector == 0.0 and exact["a"].vector == pytest.approx(2.0 / 3.0)
    assert exact["a"].score == pytest.approx((1.0 + 2.0 / 3.0) / 2.0)


def test_rescore_skips_a_source_that_was_not_searched() -> None:
    profile = weighted(missing="rescore", vector_weight=0.0)
    fused = fuse_weighted_profile(
        profile,
        [cand("a", 2.0), cand("b", 1.0)],
        [],
        now=NOW,
        half_life_days=30,
        rescored=Rescored(),
    )
    assert [(f.document_id, f.lexical, f.vector) for f in fused] == [
        ("a", 1.0, 0.0),
        ("b", 0.0, 0.0),
    ]


def test_weighted_ties_break_on_document_id_and_zero_weights_fail() -> None:
    fused = fuse_weighted_profile(
        weighted(), [cand("b", 1.0), cand("a", 1.0)], [], now=NOW, half_life_days=30
    )
    assert [f.document_id for f in fused] == ["a", "b"]
    zero = weighted(lexical_weight=0, vector_weight=0)
    with pytest.raises(OrreryError) as err:
        fuse_weighted_profile(zero, [], [], now=NOW, half_life_days=30)
    assert err.value.code is ErrorCode.INVALID_REQUEST


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefghij"), st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        max_size=10,
        unique_by=lambda t: t[0],
    ),
    st.sampled_from(sorted(BUILTIN)),
)
def test_fused_order_is_score_descending_then_document_id(
    scored: list[tuple[str, float]], profile_id: str
) -> None:
    # Few distinct scores: most candidates tie, and the tie order is the id order.
    lexical = ranked([cand(doc, score) for doc, score in scored])
    vector = ranked([cand(doc, 1.0 - score) for doc, score in scored[::2]])
    fused = fuse(BUILTIN[profile_id], lexical, vector, now=NOW, half_life_days=30)
    assert fused == sorted(fused, key=lambda f: (-f.score, f.document_id))
    assert sorted(f.document_id for f in fused) == sorted(doc for doc, _ in scored)


def test_profile_half_life_overrides_the_server_default() -> None:
    profile = weighted(lexical_weight=0, freshness_weight=1, freshness_half_life_days=10)
    fused = fuse_weighted_profile(
        profile, [cand("a", 1.0, days=10)], [], now=NOW, half_life_days=99
    )
    assert fused[0].freshness == pytest.approx(0.5)


# --------------------------------------------------------------------------- rrf


def test_rrf_uses_full_ranks_within_the_window() -> None:
    lexical = ranked([cand(f"l{i:03d}", 1000.0 - i) for i in range(150)])
    vector = ranked([cand("l120", 0.9), cand("l000", 0.8)])
    profile = RrfProfile(id="rrf@9", rrf_k=60, rank_window=100)
    fused = {f.document_id: f for f in fuse_rrf(profile, lexical, vector)}
    assert fused["l000"].lexical == pytest.approx(61 / 61)
    assert fused["l000"].vector == pytest.approx(61 / 62)
    assert fused["l099"].lexical == pytest.approx(61 / 160)  # rank 100: inside
    assert fused["l100"].lexical == 0.0  # rank 101: outside the window
    assert fused["l120"].lexical == 0.0 and fused["l120"].vector == 1.0
    assert fused["l000"].score == pytest.approx((1.0 + 61 / 62) / 2)
    assert (fused["l000"].freshness, fused["l000"].metadata) == (0.0, 0.0)


def test_rrf_weights_ties_and_bounds() -> None:
    lexical = ranked([cand("a", 2.0), cand("b", 2.0), cand("c", 1.0)])
    vector = ranked([cand("c", 0.9)])
    profile = RrfProfile(id="rrf@9", rrf_k=10, lexical_weight=3.0, vector_weight=1.0)
    fused = {f.document_id: f for f in fuse_rrf(profile, lexical, vector)}
    assert fused["a"].lexical == fused["b"].lexical == 1.0  # tied -> both rank 1
    assert fused["c"].lexical == pytest.approx(11 / 13)  # rank 3, not 2
    assert fused["c"].score == pytest.approx((3.0 * 11 / 13 + 1.0) / 4.0)
    assert fused["a"].score == pytest.approx(0.75)
    order = [f.document_id for f in fuse_rrf(profile, lexical, vector)]
    assert order == ["c", "a", "b"]
    with pytest.raises(OrreryError):
        fuse_rrf(profile.model_copy(update={"lexical_weight": 0.0, "vector_weight": 0.0}), [], [])


scores = st.floats(0.0, 50.0, allow_nan=False)
docs = st.sampled_from([f"d{i}" for i in range(12)])


@given(
    st.lists(st.tuples(docs, scores), max_size=12, unique_by=lambda t: t[0]),
    st.lists(st.tuples(docs, st.floats(-1.0, 1.0)), max_size=12, unique_by=lambda t: t[0]),
    st.sampled_from(sorted(BUILTIN)),
    st.sampled_from(["min_max", "z_score"]),
)
def test_every_profile_scores_in_unit_interval_best_first(
    lexical_raw: list[tuple[str, float]],
    vector_raw: list[tuple[str, float]],
    profile_id: str,
    normalization: str,
) -> None:
    lexical = ranked([cand(d, s) for d, s in lexical_raw])
    vector = ranked([cand(d, s) for d, s in vector_raw])
    profile = BUILTIN[profile_id]
    if isinstance(profile, WeightedProfile):
        profile = profile.model_copy(update={"normalization": normalization})
    rescored = Rescored(vector={d: 0.0 for d, _ in lexical_raw})
    fused = fuse(profile, lexical, vector, now=NOW, half_life_days=30, rescored=rescored)
    assert {f.document_id for f in fused} == {d for d, _ in lexical_raw + vector_raw}
    assert all(-1e-9 <= f.score <= 1.0 + 1e-9 for f in fused)
    assert fused == sorted(fused, key=lambda f: (-f.score, f.document_id))


# Few distinct values, so the top is full of exact ties (broken by id) and of scores
# that differ in their last bits only; many candidates, past `fuse_top`'s exact path.
tie_scores = st.sampled_from([0.0, 0.1, 0.1 + 1e-16, 0.3, 1 / 3, 0.5, 0.7, 1.0, 7.25, 12.0])
many = st.lists(
    st.tuples(
        st.sampled_from([f"d{i:03d}" for i in range(120)]),
        tie_scores,
        st.sampled_from([0.0, 0.0, 1.5, 40.0, -2.0]),  # days old (future: counts as now)
        st.sampled_from(["active", "archived", "draft"]),
        st.integers(1, 3),
    ),
    max_size=110,
    unique_by=lambda t: (t[0], t[4]),
)


@given(
    many,
    many,
    st.sampled_from(sorted(BUILTIN)),
    st.sampled_from(["min_max", "z_score"]),
    st.sampled_from(["rescore", "zero"]),
    st.integers(0, 40),
    st.booleans(),
)
def test_fuse_top_is_the_top_of_fuse_bit_for_bit(
    lexical_raw: list[tuple[str, float, float, str, int]],
    vector_raw: list[tuple[str, float, float, str, int]],
    profile_id: str,
    normalization: str,
    missing: str,
    limit: int,
    freshness: bool,
) -> None:
    def build(raw: list[tuple[str, float, float, str, int]]) -> list[Candidate]:
        return ranked(
            [
                Candidate(
                    document_id=d,
                    revision=r,
                    score=s,
                    updated_at=NOW - timedelta(days=days),
                    status=status,
                )
                for d, s, days, status, r in raw
            ]
        )

    lexical, vector = build(lexical_raw), build(vector_raw)
    profile = BUILTIN[profile_id]
    if isinstance(profile, WeightedProfile):
        update: dict[str, object] = {"normalization": normalization, "missing": missing}
        if freshness:
            update |= {"freshness_weight": 0.7, "metadata_weight": 0.3}
        profile = profile.model_copy(update=update)
    # Every other lexical candidate's vector score was found, none of its other ids.
    rescored = Rescored(
        lexical={d: s / 2 for d, s, *_ in vector_raw[::3]},
        vector={d: 1.0 - s / 20 for d, s, *_ in lexical_raw[::2]},
    )
    whole = fuse(profile, lexical, vector, now=NOW, half_life_days=30, rescored=rescored)
    top, count = fuse_top(
        profile, lexical, vector, limit=limit, now=NOW, half_life_days=30, rescored=rescored
    )
    assert count == len(whole)
    assert top == whole[:limit]


# Continuous scores and ages: the freshness bound (`fuse_top` ages only the candidates
# that can reach the top) decides on scores that differ by little, seldom by exact ties.
spread = st.lists(
    st.tuples(
        st.sampled_from([f"d{i:03d}" for i in range(150)]),
        st.floats(0.0, 30.0, allow_nan=False),
        st.floats(-3.0, 400.0, allow_nan=False),  # days old
        st.sampled_from(["active", "candidate", "archived", "draft"]),
    ),
    min_size=20,
    max_size=120,
    unique_by=lambda t: t[0],
)


@given(
    spread,
    spread,
    st.integers(1, 30),
    st.floats(0.0, 5.0),
    st.floats(0.0, 2.0),
    st.sampled_from([1.0, 30.0, 365.0]),
)
def test_fuse_top_with_heavy_freshness_is_the_top_of_fuse_bit_for_bit(
    lexical_raw: list[tuple[str, float, float, str]],
    vector_raw: list[tuple[str, float, float, str]],
    limit: int,
    freshness_weight: float,
    metadata_weight: float,
    half_life: float,
) -> None:
    def build(raw: list[tuple[str, float, float, str]], scale: float) -> list[Candidate]:
        return ranked(
            [
                Candidate(d, 1, s * scale, NOW - timedelta(days=days), status)
                for d, s, days, status in raw
            ]
        )

    lexical, vector = build(lexical_raw, 1.0), build(vector_raw, 1 / 30)
    profile = BUILTIN["weighted@3"].model_copy(
        update={"freshness_weight": freshness_weight, "metadata_weight": metadata_weight}
    )
    rescored = Rescored(
        lexical={d: s / 3 for d, s, *_ in vector_raw[::2]},
        vector={d: s / 40 for d, s, *_ in lexical_raw[::2]},
    )
    whole = fuse(profile, lexical, vector, now=NOW, half_life_days=half_life, rescored=rescored)
    top, count = fuse_top(
        profile, lexical, vector, limit=limit, now=NOW, half_life_days=half_life, rescored=rescored
    )
    assert count == len(whole)
    assert top == whole[:limit]


@given(many, many)
def test_the_union_keeps_each_document_once_at_its_highest_revision(
    lexical_raw: list[tuple[str, float, float, str, int]],
    vector_raw: list[tuple[str, float, float, str, int]],
) -> None:
    def build(raw: list[tuple[str, float, float, str, int]]) -> list[Candidate]:
        return [Candidate(d, r, s, NOW - timedelta(days=days), st) for d, s, days, st, r in raw]

    lexical, vector = build(lexical_raw), build(vector_raw)
    # The rule spelled out: first seen (lexical, then vector, each in its order) unless a
    # later one has a higher revision; documents in the order first seen.
    expected: dict[str, Candidate] = {}
    for candidate in [*lexical, *vector]:
        held = expected.get(candidate.document_id)
        if held is None or candidate.revision > held.revision:
            expected[candidate.document_id] = candidate
    union = _union(lexical, vector)
    assert list(union.items()) == list(expected.items())


# --------------------------------------------------------------------------- profiles


def test_builtins_and_default() -> None:
    assert {"weighted@1", "weighted@2", "rrf@1"} <= set(BUILTIN)
    registry = ProfileRegistry()
    assert registry.default_id == DEFAULT_PROFILE_ID
    assert registry.get(None) is registry.get(DEFAULT_PROFILE_ID)
    rrf = registry.get("rrf@1")
    assert isinstance(rrf, RrfProfile) and (rrf.rrf_k, rrf.rank_window) == (60.0, 100)
    assert (rrf.lexical_weight, rrf.vector_weight) == (1.0, 1.0)


def test_published_recipes_never_change() -> None:
    # A profile id names one recipe forever: the combined field came as new versions.
    assert BUILTIN["weighted@1"].field_boosts is None
    assert BUILTIN["weighted@2"].field_boosts == {"title": 1.0}
    assert BUILTIN["rrf@1"].field_boosts is None
    only_text = {"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0}
    weighted3, rrf2 = BUILTIN["weighted@3"], BUILTIN["rrf@2"]
    assert weighted3.lexical_boosts() == only_text and rrf2.lexical_boosts() == only_text
    assert isinstance(weighted3, WeightedProfile) and isinstance(rrf2, RrfProfile)
    same_as_2 = {"field_boosts", "id", "description"}
    assert weighted3.model_dump(exclude=same_as_2) == BUILTIN["weighted@2"].model_dump(
        exclude=same_as_2
    )
    assert rrf2.model_dump(exclude=same_as_2) == BUILTIN["rrf@1"].model_dump(exclude=same_as_2)


def test_the_default_profile_scores_the_combined_field() -> None:
    assert DEFAULT_PROFILE_ID == "weighted@3"
    assert QuerySettings.model_fields["default_profile"].default == DEFAULT_PROFILE_ID
    assert ProfileRegistry().get(None).lexical_boosts() == {
        "title": 0.0,
        "body": 0.0,
        "tags": 0.0,
        "text": 1.0,
    }


def test_operator_profiles_may_boost_the_combined_field() -> None:
    raw = '[{"kind": "rrf", "id": "text-rrf@1", "field_boosts": {"text": 2, "title": 0}}]'
    (profile,) = parse_profiles(raw).profiles
    assert profile.lexical_boosts() == {"text": 2.0, "title": 0.0}
    with pytest.raises(ValueError, match="invalid fusion profiles"):
        parse_profiles('[{"kind": "rrf", "id": "x@1", "field_boosts": {"abstract": 1}}]')


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(OrreryError) as err:
        ProfileRegistry().get("bm42@1")
    assert err.value.code is ErrorCode.UNKNOWN_PROFILE and err.value.http_status == 422
    assert "rrf@1" in err.value.details["known"]


def test_derived_profile_id_is_stable_and_only_counts_changes() -> None:
    base = BUILTIN["weighted@1"]
    assert derive_profile(base, {}) is base
    assert derive_profile(base, {"lexical_weight": 1.0, "metadata_weight": 0.25}) is base
    one = derive_profile(base, {"vector_weight": 0.5, "freshness_weight": 0.0})
    two = derive_profile(base, {"freshness_weight": 0.0, "vector_weight": 0.5, "lexical_weight": 1})
    assert re.fullmatch(r"weighted@1\+w:[0-9a-f]{8}", one.id)
    assert one.id == two.id and one == two
    assert isinstance(one, WeightedProfile)
    assert (one.vector_weight, one.freshness_weight, one.metadata_weight) == (0.5, 0.0, 0.25)
    other = derive_profile(base, {"vector_weight": 0.6})
    assert other.id != one.id
    assert derive_profile(BUILTIN["weighted@2"], {"vector_weight": 0.5}).id.startswith(
        "weighted@2+w:"
    )


def test_rrf_overrides_take_source_weights_only() -> None:
    rrf = BUILTIN["rrf@1"]
    assert derive_profile(rrf, {"freshness_weight": 0.0, "metadata_weight": 0.0}) is rrf
    derived = derive_profile(rrf, {"vector_weight": 2.0})
    assert derived.id.startswith("rrf@1+w:") and derived.vector_weight == 2.0
    with pytest.raises(OrreryError) as err:
        derive_profile(rrf, {"freshness_weight": 0.15})
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_request_overrides_count_only_fields_sent() -> None:
    request = TopKRequest.model_validate(
        {"namespace": "n", "scope_ref": "s", "ranking": {"vector_weight": 0.0}}
    )
    assert request.ranking.overrides() == {"vector_weight": 0.0}
    assert TopKRequest(namespace="n", scope_ref="s").ranking.overrides() == {}
    resolved = ProfileRegistry().resolve("weighted@1", request.ranking)
    assert resolved.id.startswith("weighted@1+w:") and resolved.vector_weight == 0.0


def test_operator_profiles_join_the_builtins() -> None:
    extra = WeightedProfile(id="support@3", normalization="z_score", lexical_weight=2.0)
    registry = ProfileRegistry([extra, BUILTIN["rrf@1"]], default="support@3")
    assert registry.get(None) == extra
    assert "weighted@1" in registry.ids()
    with pytest.raises(ValueError, match="built in"):
        ProfileRegistry([BUILTIN["rrf@1"].model_copy(update={"rrf_k": 10.0})])
    with pytest.raises(ValueError, match="twice"):
        ProfileRegistry([extra, extra])
    with pytest.raises(ValueError, match="default"):
        ProfileRegistry(default="nope@1")


def test_parse_profiles_accepts_object_or_list() -> None:
    assert parse_profiles("  ") == ProfileSet()
    listed = parse_profiles('[{"kind": "rrf", "id": "rrf@7", "rrf_k": 20}]')
    assert listed.profiles[0] == RrfProfile(id="rrf@7", rrf_k=20)
    wrapped = parse_profiles('{"profiles": [{"kind": "weighted", "id": "w@1"}]}')
    assert isinstance(wrapped.profiles[0], WeightedProfile)
    for bad in ("{", '[{"kind": "rrf", "id": "RRF 1"}]', '[{"kind": "x", "id": "a@1"}]'):
        with pytest.raises(ValueError):
            parse_profiles(bad)
    with pytest.raises(ValueError):
        parse_profiles('[{"kind": "rrf", "id": "r@1", "colour": "red"}]')


def test_settings_load_profiles_inline_or_from_a_file(tmp_path: Path) -> None:
    body = [{"kind": "rrf", "id": "deep-rrf@1", "rank_window": 500, "lexical_depth": 600}]
    inline = QuerySettings(profiles=json.dumps(body), default_profile="deep-rrf@1")
    assert profile_registry(inline).default_id == "deep-rrf@1"
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"profiles": body}))
    limits = query_limits(QuerySettings(profiles=str(path), candidate_depth=50))
    assert limits.profiles.get("deep-rrf@1").lexical_depth == 600
    deep = limits.profiles.get("deep-rrf@1")
    assert limits.depths(deep, 10) == {"lexical": 600, "vector": 500}  # the rank window
    with pytest.raises(ValueError, match="cannot read"):
        profile_registry(QuerySettings(profiles=str(tmp_path / "missing.json")))


def test_depths_per_source() -> None:
    limits = QueryLimits(candidate_depth=100, vector_depth=40)
    plain = BUILTIN["weighted@1"]
    assert limits.depths(plain, 10) == {"lexical": 100, "vector": 40}
    assert limits.depths(plain, 60) == {"lexical": 100, "vector": 60}
    deep = plain.model_copy(update={"lexical_depth": 300})
    assert limits.depths(deep, 10) == {"lexical": 300, "vector": 40}
    rrf = BUILTIN["rrf@1"].model_copy(update={"rank_window": 70})
    assert limits.depths(rrf, 10) == {"lexical": 100, "vector": 70}
