"""The background optimizer's schedule (`QdrantEdgeVectorIndex._schedule`, `_built`,
`deferral_limit`) driven by a fake clock: an ingest's writes and the optimizer's rounds
are simulated in time order, builds take a modelled time, nothing is written to a shard.

What is checked: the deferral of a generation that keeps taking writes is bounded
(`_MAX_DEFERRAL_S`, or `_MAX_OUTRUN_DEFERRAL_S` for writes faster than a build keeps up
with), a flow of writes of any length ends in at most one build after it stops, a
trickle that never stops is still built, a bulk ingest that outlasts `_MIN_DEFERRAL_S`
(100k at 1,250 rec/s: session 27's slow hour) gets one build where the fixed 60 s
deferral gave it two, and a build started while writes flow journals at most
`_MAX_JOURNAL_SHARE` of its points (the catch-up) unless the flow outlasted the cap.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projector.adapters import qdrant_edge_vectors as edge_module
from projector.adapters.qdrant_edge_vectors import (
    QdrantEdgeVectorIndex,
    deferral_limit,
    optimize_threshold,
)

_INTERVAL_S = 1.0
_MIN_UNINDEXED = 1_000
_GROWTH = 0.25
_SHARE = 0.5
# qdrant-edge leaves fewer vectors than its indexing threshold (10 MB) unindexed:
# `optimize_needed` asks for that many too (384-d).
_INDEXING_POINTS = 10_000 * 1024 // (384 * 4)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[QdrantEdgeVectorIndex]:
    made = QdrantEdgeVectorIndex(tmp_path / "edge")
    try:
        yield made
    finally:
        made.close()


@dataclass
class _Run:
    """What the simulated optimizer did: (start, end, points) of each build, and the
    longest time a generation was put off while writes flowed."""

    builds: list[tuple[float, float, int]] = field(default_factory=list)
    longest_deferral: float = 0.0
    indexed: int = 0
    # Points written during each build (its journal, caught up after it).
    journaled: list[int] = field(default_factory=list)


def _simulate(
    index: QdrantEdgeVectorIndex,
    writes: Sequence[tuple[float, int]],
    build_s_per_point: float,
    *,
    tail_s: float = 3_600.0,
    applies: dict[int, float] | None = None,
    indexed: int = 0,
) -> _Run:
    """Runs the optimizer's rounds every `_INTERVAL_S` against `writes` ((time, points)
    in time order: when each `apply` ended) until `tail_s` after the last one. An
    `apply` takes no time but those in `applies` (write index -> seconds it was under
    way before it ended). A build of a shard of n points takes n * `build_s_per_point`
    and indexes the points the shard held at its start; the loop does nothing else
    meanwhile, as the real one (it waits for its child). `indexed`: points the shard
    holds with a graph before the first write."""
    run = _Run(indexed=indexed)
    written = indexed
    pending = list(enumerate(writes))
    under_way = dict(applies or {})
    end = (writes[-1][0] if writes else 0.0) + tail_s
    now = 0.0

    def note_until(until: float) -> int:
        nonlocal written
        before = written
        index._writing.pop("g", None)
        while pending:
            i, (at, points) = pending[0]
            if at > until:
                if at - under_way.get(i, 0.0) <= until:
                    index._writing["g"] = 1  # this apply has started, not ended
                break
            pending.pop(0)
            written += points
            index._note_write("g", at, points)
        return written - before

    while now <= end:
        now += _INTERVAL_S
        note_until(now)
        quiet = index._schedule(
            "g", _INTERVAL_S, now, counts=lambda: (run.indexed, written - run.indexed)
        )
        since = index._deferred_since.get("g")
        if since is not None:
            run.longest_deferral = max(run.longest_deferral, now - since)
        if quiet is None:
            continue
        threshold = optimize_threshold(
            run.indexed, min_unindexed=_MIN_UNINDEXED, growth=0.0 if quiet else _GROWTH
        )
        if written - run.indexed < max(threshold, _INDEXING_POINTS):
            continue
        took = written * build_s_per_point
        run.builds.append((now, now + took, written))
        run.indexed = written
        index._built("g", now, now + took, written, True, _SHARE)
        now += took
        run.journaled.append(note_until(now))
    return run


def _flow(gaps: Sequence[float], batch: int) -> list[tuple[float, int]]:
    at = 0.0
    writes = []
    for gap in gaps:
        at += gap
        writes.append((at, batch))
    return writes


def test_deferral_limit_follows_the_expected_build_time() -> None:
    assert deferral_limit(10_000, 1.5e-3, floor_s=60.0, cap_s=600.0) == 60.0
    assert deferral_limit(100_000, 1.5e-3, floor_s=60.0, cap_s=600.0) == pytest.approx(150.0)
    assert deferral_limit(1_000_000, 1.5e-3, floor_s=60.0, cap_s=600.0) == 600.0
    assert deferral_limit(100_000, -1.0, floor_s=60.0, cap_s=600.0) == 60.0  # clock step


@given(
    points=st.integers(0, 10_000_000),
    per_point=st.floats(0.0, 1.0),
    floor_s=st.floats(0.0, 1_000.0),
    cap_s=st.floats(0.0, 1_000.0),
)
def test_deferral_limit_is_bounded(
    points: int, per_point: float, floor_s: float, cap_s: float
) -> None:
    limit = deferral_limit(points, per_point, floor_s=floor_s, cap_s=cap_s)
    assert limit <= cap_s
    assert limit >= min(floor_s, cap_s)


def test_a_100k_ingest_longer_than_a_minute_gets_one_build(
    index: QdrantEdgeVectorIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Session 27's slow hour: 100k points at 1,250 rec/s in batches of 2,000 (80 s),
    # a build ~1.5 ms a point of the shard.
    writes = _flow([1.6] * 50, 2_000)
    run = _simulate(index, writes, 1.5e-3)
    assert [points for *_, points in run.builds] == [100_000]
    assert run.builds[0][0] > writes[-1][0]  # after the ingest
    # The fixed 60 s deferral of before built ~75k points during it, then all of them.
    monkeypatch.setattr(edge_module, "_MAX_DEFERRAL_S", 60.0)
    monkeypatch.setattr(edge_module, "_MAX_JOURNAL_SHARE", float("inf"))
    index.drop("g")
    before = _simulate(index, writes, 1.5e-3)
    assert len(before.builds) == 2
    assert before.builds[0][2] < 100_000 <= before.builds[1][2]


def test_a_long_flow_a_build_keeps_up_with_is_built_once_its_points_without_a_graph_reach_the_cap(
    index: QdrantEdgeVectorIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shard of 400k points with a graph takes 400 rec/s for 25 min (2,000 every 5 s),
    # a build 1 ms a point (learned): the wait by build time alone would run ~550 s with
    # ~220k points searched by brute force; the points without a graph end it at the
    # cap of those instead (375 s). The build (550k points, 550 s) journals 220k points,
    # 0.4 of its own: under the share, so it is not put off for the flow.
    index._built("g", 0.0, 100.0, 100_000, True, _SHARE)
    index.drop("g")
    writes = _flow([5.0] * 300, 2_000)
    cap = edge_module._MAX_DEFERRED_POINTS
    run = _simulate(index, writes, 1e-3, tail_s=0.0, indexed=400_000)
    start, _, points = run.builds[0]
    assert cap <= points - 400_000 <= cap + 2_000
    assert start < edge_module._MAX_DEFERRAL_S
    assert run.journaled[0] <= edge_module._MAX_JOURNAL_SHARE * points
    monkeypatch.setattr(edge_module, "_MAX_DEFERRED_POINTS", 10_000_000)
    index.drop("g")
    uncapped = _simulate(index, writes, 1e-3, tail_s=0.0, indexed=400_000)
    assert uncapped.builds[0][0] >= edge_module._MAX_DEFERRAL_S
    assert uncapped.builds[0][2] - 400_000 > 1.3 * cap


def test_a_bulk_ingest_faster_than_a_build_is_built_once_after_it(
    index: QdrantEdgeVectorIndex,
) -> None:
    # Session 28's late 1M probe: 1M points at ~716 rec/s (2,000 every 2.8 s), a build
    # ~5 ms a point beside the ingest. Built at 150k points, the build's ~13 min let
    # ~560k more points into its journal and the catch-up replayed them for 12+ min;
    # now the flow is left alone until it stops: one build, nothing journaled.
    writes = _flow([2.8] * 500, 2_000)
    run = _simulate(index, writes, 5e-3, tail_s=120.0)
    assert [points for *_, points in run.builds] == [1_000_000]
    assert run.builds[0][0] > writes[-1][0]
    assert run.journaled == [0]


def test_writes_faster_than_a_build_that_never_stop_are_still_built(
    index: QdrantEdgeVectorIndex,
) -> None:
    # 1,000 points a second for two hours, a build 5 ms a point: built once the
    # outrun cap runs out, though the build is outrun.
    writes = _flow([2.0] * 3_600, 2_000)
    run = _simulate(index, writes, 5e-3, tail_s=0.0)
    assert run.builds
    assert run.builds[0][0] <= writes[0][0] + edge_module._MAX_OUTRUN_DEFERRAL_S + 3 * _INTERVAL_S
    assert run.longest_deferral <= edge_module._MAX_OUTRUN_DEFERRAL_S + _INTERVAL_S


def test_the_write_rate_is_taken_over_the_last_writes(index: QdrantEdgeVectorIndex) -> None:
    assert index._write_rate("g") == 0.0
    index._note_write("g", 10.0, 500)
    assert index._write_rate("g") == 0.0  # one write: no span yet
    for at in range(1, 40):
        index._note_write("g", 10.0 + 2.0 * at, 1_000)
    assert index._write_rate("g") == pytest.approx(500.0)
    index._build_s_per_point = 1e-3
    assert not index._outrun("g")  # 0.5 of the shard journaled: the share, not over it
    index._build_s_per_point = 1.1e-3
    assert index._outrun("g")


def test_a_slow_apply_is_no_end_of_the_writes(index: QdrantEdgeVectorIndex) -> None:
    # One batch of the 100k ingest under way for 5 s (a loaded machine): more than
    # twice the gap between batches, yet no end of the ingest.
    writes = _flow([1.6] * 20 + [5.0] + [1.6] * 29, 2_000)
    run = _simulate(index, writes, 1.5e-3, applies={20: 5.0})
    assert [points for *_, points in run.builds] == [100_000]


def test_quiet_waits_for_twice_the_longest_recent_gap(index: QdrantEdgeVectorIndex) -> None:
    for at in (0.0, 1.0, 2.0, 10.0, 11.0, 12.0):
        index._note_write("g", at)
    assert not index._quiet("g", 1.0, 12.0 + 15.9)  # the 8 s gap, not the last 1 s
    assert index._quiet("g", 1.0, 12.0 + 16.0)
    for at in range(13, 13 + edge_module._QUIET_GAPS):
        index._note_write("g", float(at))
    last = 12.0 + edge_module._QUIET_GAPS
    assert index._quiet("g", 1.0, last + 2.0)  # the 8 s gap has left the window
    index._writing["g"] = 1  # an apply under way
    assert not index._quiet("g", 1.0, last + 1_000.0)


def test_a_trickle_that_never_stops_is_still_built(index: QdrantEdgeVectorIndex) -> None:
    # 20 points every 0.5 s for an hour: never quiet, built once the cap runs out and
    # again as the threshold grows.
    writes = _flow([0.5] * 7_200, 20)
    run = _simulate(index, writes, 1.5e-3, tail_s=0.0)
    assert run.builds
    assert run.builds[0][0] <= edge_module._MAX_DEFERRAL_S + 2 * _INTERVAL_S
    assert len(run.builds) >= 2


@settings(max_examples=150, deadline=None)
@given(
    gaps=st.lists(st.floats(0.05, 8.0), min_size=1, max_size=400),
    batch=st.integers(1, 5_000),
    build_s_per_point=st.floats(1e-5, 5e-3),
)
def test_a_flow_of_writes_ends_in_at_most_one_build_after_it_stops(
    tmp_path_factory: pytest.TempPathFactory,
    gaps: list[float],
    batch: int,
    build_s_per_point: float,
) -> None:
    index = QdrantEdgeVectorIndex(tmp_path_factory.mktemp("edge"))
    try:
        writes = _flow(gaps, batch)
        run = _simulate(index, writes, build_s_per_point)
    finally:
        index.close()
    last_write = writes[-1][0]
    # The deferral is bounded, whatever the flow and the build speed.
    assert run.longest_deferral <= edge_module._MAX_OUTRUN_DEFERRAL_S + _INTERVAL_S
    # Once the writes stop: at most one build starts, and it leaves nothing unindexed
    # that is worth a build.
    after = [b for b in run.builds if b[0] > last_write]
    assert len(after) <= 1
    total = sum(points for _, points in writes)
    assert total - run.indexed < max(_MIN_UNINDEXED, _INDEXING_POINTS)


@settings(max_examples=150, deadline=None)
@given(
    gap=st.floats(0.05, 8.0),
    batch=st.integers(1, 5_000),
    count=st.integers(1, 600),
    build_s_per_point=st.floats(1e-5, 5e-3),
)
def test_a_build_while_a_steady_flow_goes_on_journals_at_most_the_share(
    tmp_path_factory: pytest.TempPathFactory,
    gap: float,
    batch: int,
    count: int,
    build_s_per_point: float,
) -> None:
    # A steady flow (the rate the optimizer measures is the flow's), a build time at
    # most the prior's (5 ms a point): every build that starts while writes still come
    # journals at most `_MAX_JOURNAL_SHARE` of its points, give or take a batch, unless
    # it started once the outrun cap ran out.
    index = QdrantEdgeVectorIndex(tmp_path_factory.mktemp("edge"))
    try:
        writes = _flow([gap] * count, batch)
        run = _simulate(index, writes, build_s_per_point, tail_s=0.0)
    finally:
        index.close()
    last_write = writes[-1][0]
    for (start, _, points), journaled in zip(run.builds, run.journaled, strict=True):
        if start >= last_write or start >= edge_module._MAX_OUTRUN_DEFERRAL_S:
            continue
        assert journaled <= edge_module._MAX_JOURNAL_SHARE * points + batch


def test_the_deferral_learns_the_last_build_time(index: QdrantEdgeVectorIndex) -> None:
    index._built("g", 100.0, 300.0, 100_000, True, _SHARE)  # 2 ms a point
    assert index._build_s_per_point == pytest.approx(2e-3)
    assert index._paused_until["g"] == pytest.approx(500.0)  # optimize_pause at 0.5
    index._built("g", 400.0, 401.0, 100_000, False, _SHARE)  # built nothing: not learned
    assert index._build_s_per_point == pytest.approx(2e-3)
    # Writes flowing since t=0 with 100k points: put off until 200 s, then built.
    for at in range(0, 200):
        index._note_write("h", float(at))
        assert index._writes_flowing("h", 1.0, float(at) + 0.5, counts=lambda: (0, 100_000))
    index._note_write("h", 200.0)
    assert not index._writes_flowing("h", 1.0, 200.5, counts=lambda: (0, 100_000))


def test_a_fast_flow_is_quiet_only_after_the_outrun_gap(index: QdrantEdgeVectorIndex) -> None:
    # 1,000 points a second in 2,000-point writes every 2 s (5 ms a point: outrun): a
    # stall of twice the gaps is no end of it; `_OUTRUN_QUIET_S` without a write is.
    for at in range(20):
        index._note_write("g", 2.0 * at, 2_000)
    last = 38.0
    assert index._outrun("g")
    big = lambda: (0, 1_000_000)  # noqa: E731
    assert not index._quiet("g", 1.0, last + 6.0, big)
    assert index._quiet("g", 1.0, last + edge_module._OUTRUN_QUIET_S, big)
    # A small shard's build costs little: a tenth of it (4,000 points: 2 s) is enough.
    small = lambda: (0, 4_000)  # noqa: E731
    assert not index._quiet("g", 1.0, last + 1.9, small)
    assert index._quiet("g", 1.0, last + 4.0, small)
    # A slow flow (50 points a second): quiet after twice its gaps, as before.
    for at in range(20):
        index._note_write("h", 2.0 * at, 100)
    assert not index._outrun("h")
    assert index._quiet("h", 1.0, last + 4.0)


def test_a_backlog_of_writes_is_no_end_of_the_flow(index: QdrantEdgeVectorIndex) -> None:
    waiting = [True]
    index.start_background_optimizer(3_600.0, backlog=lambda: waiting[0])
    for at in range(10):
        index._note_write("g", float(at), 10)
    last = 9.0
    assert not index._quiet("g", 1.0, last + 5.0)  # the projector has writes to apply
    # A backlog that never drains holds the generation for `_MIN_DEFERRAL_S` at most.
    assert index._quiet("g", 1.0, last + edge_module._MIN_DEFERRAL_S)
    waiting[0] = False
    assert index._quiet("g", 1.0, last + 5.0)
    assert index._quiet("never-written", 1.0, 0.0)


def test_a_build_hands_malloc_free_pages_back_once_the_process_grew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Anonymous RSS (KiB) at each look; a trim drops it to 1.2 GiB.
    anon = [1_200_000]
    trims: list[int] = []

    def trim() -> None:
        trims.append(anon[0])
        anon[0] = 1_200_000

    monkeypatch.setattr(edge_module, "_rss_kb", lambda part, pid=None: anon[0])
    monkeypatch.setattr(edge_module, "trim_malloc", trim)
    report = edge_module._OptimizeReport()
    trimmer = edge_module._GrowthTrim(report)
    start = time.monotonic()
    every = edge_module._CHILD_TRIM_S
    anon[0] = 1_200_000 + edge_module._TRIM_GROWTH_KB + 1_000
    trimmer.poll(start + every / 2)  # too soon: nothing
    assert trims == []
    trimmer.poll(start + every + 1)
    assert trims == [1_200_000 + edge_module._TRIM_GROWTH_KB + 1_000]
    anon[0] = 1_300_000  # grew less than the threshold since: left alone
    trimmer.poll(start + 2 * every + 2)
    assert len(trims) == 1
    assert report.trims_during == 1
    assert report.trimmed_during_kb == edge_module._TRIM_GROWTH_KB + 1_000
    assert "in 1 trims" in str(report)
