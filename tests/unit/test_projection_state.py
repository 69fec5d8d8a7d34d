"""The projector's bookkeeping over a real SQLite registry: which generations a committed
batch moves forward."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from projector.adapters.sqlite_state import SqliteProjectorState
from projector.generations import DeferredWrites


@pytest.fixture
def state(tmp_path: Path) -> Iterator[SqliteProjectorState]:
    state = SqliteProjectorState(tmp_path / "orrery.sqlite")
    try:
        yield state
    finally:
        state.close()


def _generation(state: SqliteProjectorState, *, live: bool) -> str:
    return state.create_generation(
        "ns",
        "objects",
        embedder_id="e@1",
        embedder_dim=4,
        lexical_engine="tantivy",
        vector_engine="qdrant-edge",
        schema_digest="s",
        make_live=live,
    ).generation_id


def _applied(state: SqliteProjectorState, generation_id: str) -> tuple[int, int]:
    row, _ = state.generation(generation_id)
    return row.applied_position, row.document_count


def test_a_deferred_generation_keeps_its_position_until_it_is_resumed(
    state: SqliteProjectorState,
) -> None:
    live = _generation(state, live=True)
    building = _generation(state, live=False)
    deferred = DeferredWrites()
    projector = deferred.wrap(state)
    assert projector.write_targets("ns", "objects") == [live, building]

    deferred.defer(building)
    assert projector.write_targets("ns", "objects") == [live]
    projector.commit("projector", 10, {live: {"d1": (1, False), "d2": (1, False)}})
    assert _applied(state, live) == (10, 2)
    # It saw none of the batch: it must not claim position 10 (a build's hand-over
    # replays the batch into it later).
    assert _applied(state, building) == (0, 0)
    assert state.position("projector") == 10

    deferred.resume(building)
    projector.commit("projector", 12, {live: {"d3": (1, False)}, building: {"d3": (1, False)}})
    assert _applied(state, live) == (12, 3)
    assert _applied(state, building) == (12, 1)


def test_a_batch_without_events_for_a_generation_still_moves_it_forward(
    state: SqliteProjectorState,
) -> None:
    live = _generation(state, live=True)
    other = _generation(state, live=False)
    state.commit("projector", 5, {live: {"d1": (1, False)}})
    assert _applied(state, other) == (5, 0)
    state.commit("projector", 7, {}, held=[other])
    assert _applied(state, live) == (7, 1)
    assert _applied(state, other) == (5, 0)
