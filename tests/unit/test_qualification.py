"""Qualification receipts, thresholds, index topology settings and the promote gate's
pure parts (the real-cluster flow: tests/e2e/test_shards.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.admin import BuildRequest
from contracts.digests import sha256_json
from contracts.errors import ErrorCode, OrreryError
from contracts.generations import IndexConfig, Topology
from contracts.qualification import (
    ProfileFigures,
    QualificationThresholds,
    SliceFigures,
    SourceFigures,
    receipt_failures,
)
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.generations import config_schema_digest
from query.settings import QuerySettings
from tests.receipts import receipt as make_receipt

NOW = datetime(2026, 12, 2, tzinfo=UTC)


def _slice(
    lexical: float = 1.0,
    vector_mean: float = 1.0,
    vector_min: float = 1.0,
    overlap: float = 1.0,
    order: float = 1.0,
) -> SliceFigures:
    return SliceFigures(
        slice="unfiltered",
        queries=5,
        sources={
            "lexical": SourceFigures(
                cap=100, queries=5, inclusion_mean=lexical, inclusion_min=lexical
            ),
            "vector": SourceFigures(
                cap=100, queries=5, inclusion_mean=vector_mean, inclusion_min=vector_min
            ),
        },
        profiles={
            "rrf@2": ProfileFigures(
                queries=5,
                overlap_mean=overlap,
                overlap_min=overlap,
                order_agreement_mean=order,
                order_agreement_min=order,
            )
        },
    )


def test_a_receipt_is_named_by_the_digest_of_its_canonical_json() -> None:
    receipt = make_receipt(sample_size=5, slices=(_slice(),))
    body = receipt.model_dump(mode="json")
    del body["receipt_id"]
    assert receipt.receipt_id == sha256_json(body)
    assert receipt.id_is_valid()
    assert not receipt.model_copy(update={"passed": False}).id_is_valid()


def test_every_threshold_is_checked() -> None:
    thresholds = QualificationThresholds()
    assert receipt_failures((_slice(),), thresholds) == ()
    assert "lexical inclusion" in receipt_failures((_slice(lexical=0.99),), thresholds)[0]
    assert "vector inclusion mean" in receipt_failures((_slice(vector_mean=0.98),), thresholds)[0]
    assert "vector inclusion min" in receipt_failures((_slice(vector_min=0.9),), thresholds)[0]
    assert "overlap" in receipt_failures((_slice(overlap=0.9),), thresholds)[0]
    assert "order agreement" in receipt_failures((_slice(order=0.9),), thresholds)[0]
    # HNSW may miss a little: within the vector thresholds passes.
    assert receipt_failures((_slice(vector_mean=0.995, vector_min=0.96),), thresholds) == ()
    assert receipt_failures((), thresholds) == ("the sample ran no query",)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_receipt_fails_exactly_when_a_figure_is_below_its_threshold(
    figure: float, threshold: float
) -> None:
    thresholds = QualificationThresholds(lexical_inclusion=threshold)
    failed = bool(receipt_failures((_slice(lexical=figure),), thresholds))
    assert failed == (figure < threshold)


@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.sampled_from(["all", "complete"]))
def test_order_agreement_is_judged_over_the_queries_the_setting_names(
    every: float, complete: float, over: str
) -> None:
    figures = _slice().model_copy(
        update={
            "profiles": {
                "rrf@2": ProfileFigures(
                    queries=5,
                    overlap_mean=1.0,
                    overlap_min=1.0,
                    order_agreement_mean=every,
                    order_agreement_min=min(every, complete),
                    complete_queries=3,
                    complete_order_agreement_min=complete,
                )
            }
        }
    )
    thresholds = QualificationThresholds(order_agreement_over=over)
    judged = complete if over == "complete" else min(every, complete)
    assert bool(receipt_failures((figures,), thresholds)) == (judged < 1.0)


def test_an_incomplete_query_counts_in_order_agreement_but_not_among_the_complete() -> None:
    from query.qualify import _compare, _figures, _Tally

    tally = _Tally(queries=2)
    exact = [(f"d{i}", 1.0 - i / 10) for i in range(10)]
    # HNSW missed a candidate: another document took rank 3, the rest moved down one.
    shifted = [*exact[:3], ("x", 0.75), *exact[3:9]]
    _compare("weighted@3", exact, exact, tally, complete=True)
    _compare("weighted@3", shifted, exact, tally, complete=False)
    figures = _figures("unfiltered", tally, {"lexical": 100, "vector": 100}, skipped="")
    profile = figures.profiles["weighted@3"]
    assert profile.order_agreement_min == 0.3 and profile.overlap_min == 0.9
    assert profile.complete_queries == 1 and profile.complete_order_agreement_min == 1.0
    assert receipt_failures((figures,), QualificationThresholds(order_agreement_over="complete"))
    assert not any(
        "order agreement" in failure
        for failure in receipt_failures(
            (figures,), QualificationThresholds(order_agreement_over="complete")
        )
    )
    assert any(
        "order agreement" in failure
        for failure in receipt_failures((figures,), QualificationThresholds())
    )
    assert QuerySettings().qualification_thresholds().order_agreement_over == "complete"


def test_topology_per_scope_and_its_digest() -> None:
    settings = QuerySettings(
        index_shards=2,
        index_replicas=1,
        index_topology='{"big": {"shards": 4}, "big/docs": {"shards": 8, "replicas": 0}}',
    )
    assert settings.index_shape("other", "objects") == (2, 1)
    assert settings.index_shape("big", "objects") == (4, 1)
    assert settings.index_shape("big", "docs") == (8, 0)
    one = IndexConfig()
    three = one.model_copy(update={"shards": 3})
    assert config_schema_digest("s", one) != config_schema_digest("s", three)
    hnsw = one.model_copy(update={"hnsw_m": 32})
    assert config_schema_digest("s", one) != config_schema_digest("s", hnsw)
    assert (
        Topology(lexical_engine="a", lexical_index="a", vector_engine="b", vector_index="b").spread
        is False
    )
    with pytest.raises(ValueError, match="ORRERY_INDEX_TOPOLOGY"):
        QuerySettings(index_topology='{"x": {"shards": 0}}')


def test_embedded_mode_refuses_shards() -> None:
    with pytest.raises(ValueError, match="embedded mode keeps every generation in one shard"):
        QuerySettings(index_shards=3).check_embedded_topology()
    QuerySettings().check_embedded_topology()
    with pytest.raises(ValueError, match="one shard"):
        QuerySettings(index_topology='{"ns": {"replicas": 1}}').check_embedded_topology()


def test_embedded_engines_refuse_a_spread_index(tmp_path: object) -> None:
    from pathlib import Path

    index = TantivyLexicalIndex(Path(str(tmp_path)))
    try:
        with pytest.raises(OrreryError) as raised:
            index.create("g1", shards=3)
        assert raised.value.code is ErrorCode.INVALID_REQUEST
        assert "tantivy" in raised.value.message
    finally:
        index.close()
    assert BuildRequest(namespace="ns", snapshot_kind="objects", shards=3).shards == 3


class _CountingSource:
    """A source that answers every search with a fresh list and counts the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def search(self, generation_id: str, query: object, filter: object, limit: int) -> list[str]:
        self.calls.append((generation_id, query))
        return [f"{generation_id}:{limit}:{len(self.calls)}"]


@given(
    vector=st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=8),
    limits=st.lists(st.sampled_from([10, 50, 100]), min_size=1, max_size=6),
)
def test_a_recording_source_asks_the_engine_once_per_distinct_search(
    vector: list[float], limits: list[int]
) -> None:
    """The same search asked again within one query gets the first answer (no second
    engine call); any differing argument — the limit, or the vector by value — is asked;
    `last` is the first search's list and the generation is renamed before asking."""
    import numpy as np

    from contracts.index import SearchFilter
    from query.qualify import _Recording

    inner = _CountingSource()
    source = _Recording(inner, {"g1": "g1.qref"})
    answers = [source.search("g1", np.asarray(vector), SearchFilter(), limit) for limit in limits]
    assert len(inner.calls) == len(set(limits))
    assert all(call[0] == "g1.qref" for call in inner.calls)
    for limit, answer in zip(limits, answers, strict=True):
        assert answer == source.search("g1", list(vector), SearchFilter(), limit)
    assert source.last == answers[0]
    source.search("g1", [v + 1.0 for v in vector], SearchFilter(), limits[0])
    assert len(inner.calls) == len(set(limits)) + 1


def test_a_receipt_vouches_only_for_the_search_settings_it_was_made_with() -> None:
    made = {**QuerySettings().vector_search(), "vector_ef": 1010}
    receipt = make_receipt(replicas=0, search=made, sample_size=5, slices=(_slice(),))
    now = QuerySettings().vector_search()
    assert receipt.vouches_for(now)
    assert receipt.vouches_for({})
    assert not receipt.vouches_for({**now, "vector_spread_ef_factor": 1})
    assert not receipt.vouches_for({**now, "vector_hnsw_ef": 256})
    assert not receipt.vouches_for({**now, "vector_spread_acorn_permille": 0})
    # The ACORN share is recorded in thousandths, and searched with exactly that.
    acorn = QuerySettings(vector_spread_acorn_selectivity=0.3333)
    assert acorn.vector_spread_acorn_selectivity == 0.333
    assert acorn.vector_search()["vector_spread_acorn_permille"] == 333
    # Made before receipts recorded the search (or by a source that says nothing).
    assert not receipt.model_copy(update={"search": {}}).vouches_for(now)
    # The search is part of the receipt's identity.
    assert receipt.model_copy(update={"search": {**made, "vector_ef": 128}}).computed_id() != (
        receipt.receipt_id
    )


@given(
    st.integers(1, 10_000),
    st.integers(1, 4_096),
    st.integers(1, 64),
    st.booleans(),
)
def test_the_hnsw_ef_covers_what_is_asked_and_only_spread_generations_scale_it(
    fetch: int, floor: int, factor: int, spread: bool
) -> None:
    from contracts.vector_payload import hnsw_search_ef

    ef = hnsw_search_ef(fetch, floor=floor, spread_factor=factor, spread=spread)
    assert ef >= max(floor, fetch)
    assert ef == (max(floor, fetch, factor * fetch) if spread else max(floor, fetch))
