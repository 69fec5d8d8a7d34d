"""Route lookups remembered while the database's `data_version` stays the same."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.generations import GenerationState
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.model import transition
from query.adapters.sqlite_routing import SqliteRouting

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[SqliteProjectorState, SqliteRouting]]:
    db = tmp_path / "orrery.sqlite"
    state = SqliteProjectorState(db)
    try:
        yield state, SqliteRouting(db)
    finally:
        state.close()


def _generation(state: SqliteProjectorState, live: bool) -> str:
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


def _to(state: SqliteProjectorState, generation_id: str, target: GenerationState) -> None:
    _, current = state.generation(generation_id)
    state.save_descriptor(
        transition(current, target, at=NOW, position=0), expect=frozenset({current.state})
    )


def test_a_lookup_is_reused_until_another_connection_commits(
    registry: tuple[SqliteProjectorState, SqliteRouting],
) -> None:
    state, routing = registry
    assert routing.route("ns", "objects") is None
    live = _generation(state, live=True)
    # The commit above is seen: a remembered "no route" is not served.
    route = routing.route("ns", "objects")
    assert route is not None and route.generation_id == live
    assert routing.route("ns", "objects") is route  # nothing committed since
    assert routing.generation(live) is routing.generation(live)

    other = _generation(state, live=False)
    assert routing.generation(other) is not None
    before = routing.generation(other)
    assert before is not None and before.state == "building"
    _to(state, other, GenerationState.SEALED)
    after = routing.generation(other)
    assert after is not None and after.state == "sealed"
    assert routing.generation("g-unknown") is None


def test_each_thread_remembers_on_its_own_connection(
    registry: tuple[SqliteProjectorState, SqliteRouting],
) -> None:
    state, routing = registry
    live = _generation(state, live=True)
    seen: list[object] = []
    mine = routing.generation(live)

    def read() -> None:
        seen.append(routing.generation(live))

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    assert seen[0] == mine and seen[0] is not mine
