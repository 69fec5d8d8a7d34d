from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from contracts.errors import ErrorCode, OrreryError
from contracts.events import RecordChanged
from contracts.index import Candidate
from contracts.records import Record
from contracts.topk import Ranking
from ingest.model import Decision, decide_revision
from projector.model import plan_batch
from query.model import freshness, fuse_weighted, min_max, resolve_scope_ref

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def _event(item: str, revision: int, deleted: bool = False) -> RecordChanged:
    return RecordChanged(
        record=Record(
            namespace="ns",
            snapshot_kind="objects",
            item_id=item,
            revision=revision,
            deleted=deleted,
        )
    )


def _cand(doc: str, score: float, days_old: float = 0.0, status: str = "active") -> Candidate:
    return Candidate(
        document_id=doc,
        revision=1,
        score=score,
        updated_at=NOW - timedelta(days=days_old),
        status=status,
    )


def test_revision_rules() -> None:
    assert decide_revision(1, None) is Decision.ACCEPTED
    assert decide_revision(3, 2) is Decision.ACCEPTED
    assert decide_revision(2, 2) is Decision.CONFLICT
    assert decide_revision(1, 2) is Decision.CONFLICT


def test_plan_batch_keeps_newest_and_skips_stale() -> None:
    events = [_event("a", 2), _event("a", 1), _event("b", 1), _event("a", 3, deleted=True)]
    doc_a = events[0].document_id
    doc_b = events[2].document_id
    plan = plan_batch(events, current={})
    assert plan.deletes == {doc_a: 3}
    assert set(plan.upserts) == {doc_b}
    assert plan.revisions == {doc_a: (3, True), doc_b: (1, False)}
    assert plan.skipped == 2


def test_plan_batch_is_idempotent_and_order_free() -> None:
    events = [_event("a", 1), _event("a", 2), _event("b", 5)]
    held = {e.document_id: e.revision for e in events}
    replay = plan_batch(events, current=held)
    assert not replay.revisions and replay.skipped == 3
    forward = plan_batch(events, current={})
    backward = plan_batch(list(reversed(events)), current={})
    assert forward.revisions == backward.revisions


def test_tombstone_blocks_older_upsert() -> None:
    event = _event("a", 1)
    plan = plan_batch([event], current={event.document_id: 2})
    assert not plan.revisions


def test_scope_refs() -> None:
    assert resolve_scope_ref("longterm:objects:current") == "objects"
    assert resolve_scope_ref("graph:current") == "graph"
    with pytest.raises(OrreryError) as info:
        resolve_scope_ref("longterm:objects:yesterday")
    assert info.value.code is ErrorCode.UNKNOWN_SCOPE


def test_min_max() -> None:
    assert min_max({}) == {}
    assert min_max({"a": 3.0}) == {"a": 1.0}
    assert min_max({"a": 1.0, "b": 3.0, "c": 2.0}) == {"a": 0.0, "b": 1.0, "c": 0.5}


def test_freshness_half_life() -> None:
    assert freshness(NOW, NOW, 30.0) == pytest.approx(1.0)
    assert freshness(NOW - timedelta(days=30), NOW, 30.0) == pytest.approx(0.5)
    assert freshness(NOW + timedelta(days=1), NOW, 30.0) == pytest.approx(1.0)


def test_fuse_weighted_combines_sources() -> None:
    lexical = [_cand("a", 10.0), _cand("b", 5.0)]
    vector = [_cand("b", 0.9), _cand("c", 0.1)]
    ranking = Ranking(lexical_weight=1, vector_weight=1, freshness_weight=0, metadata_weight=0)
    fused = fuse_weighted(lexical, vector, ranking=ranking, now=NOW)
    by_id = {f.document_id: f for f in fused}
    assert by_id["a"].lexical == 1.0 and by_id["a"].vector == 0.0
    assert by_id["b"].lexical == 0.0 and by_id["b"].vector == 1.0
    assert by_id["a"].score == pytest.approx(0.5)
    assert [f.document_id for f in fused] == ["a", "b", "c"]  # tie a/b broken by id


def test_fuse_weighted_freshness_and_metadata() -> None:
    lexical = [_cand("old", 1.0, days_old=60, status="candidate"), _cand("new", 1.0)]
    ranking = Ranking(lexical_weight=1, vector_weight=0, freshness_weight=1, metadata_weight=1)
    fused = fuse_weighted(lexical, [], ranking=ranking, now=NOW, half_life_days=30)
    assert fused[0].document_id == "new"
    old = fused[1]
    assert old.freshness == pytest.approx(0.25)
    assert old.metadata == pytest.approx(0.6)
    assert old.score == pytest.approx((1.0 + 0.25 + 0.6) / 3)


def test_fuse_weighted_rejects_zero_weights() -> None:
    zero = Ranking(lexical_weight=0, vector_weight=0, freshness_weight=0, metadata_weight=0)
    with pytest.raises(OrreryError) as info:
        fuse_weighted([], [], ranking=zero, now=NOW)
    assert info.value.code is ErrorCode.INVALID_REQUEST
