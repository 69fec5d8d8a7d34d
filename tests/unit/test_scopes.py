"""Scope refs: the per-namespace registry, generation pins, fixed filters, and the
cached resolution over the real SQLite registry (invalidated by a promote)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, OrreryError
from contracts.generations import GenerationState
from contracts.topk import QueryFilters
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.model import transition
from query.adapters.memory_cache import MemoryCache
from query.adapters.sqlite_routing import SqliteRouting
from query.bootstrap import scope_registry
from query.model import resolve_scope_ref
from query.scopes import BUILTIN_SCOPES, ScopeRegistry, ScopeResolver, merge_filters, parse_scopes
from query.settings import QuerySettings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def code_of(call: object) -> ErrorCode:
    with pytest.raises(OrreryError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code


# -- the registry ---------------------------------------------------------------------------


def test_builtin_refs_exist_in_every_namespace() -> None:
    registry = ScopeRegistry()
    for ref, kind in BUILTIN_SCOPES.items():
        assert registry.target("any-ns", ref).snapshot_kind == kind
        assert registry.target("any-ns", ref).pinned_generation is None
    assert code_of(lambda: registry.target("ns", "longterm:objects:yesterday")) is (
        ErrorCode.UNKNOWN_SCOPE
    )
    assert resolve_scope_ref("graph:current") == "graph"


def test_pins_long_and_short_form() -> None:
    registry = ScopeRegistry()
    for ref in ("longterm:objects:current@g42", "longterm:objects@g42"):
        target = registry.target("ns", ref)
        assert (target.snapshot_kind, target.pinned_generation) == ("objects", "g42")
    assert registry.target("ns", "graph@g7").definition.ref == "graph:current"
    for bad in ("longterm:objects@", "longterm:objects@g 4", "longterm:objects@g4@g5"):
        assert code_of(lambda b=bad: registry.target("ns", b)) is ErrorCode.UNKNOWN_SCOPE  # type: ignore[misc]
    # Without a pin the short form is not a ref.
    assert code_of(lambda: registry.target("ns", "longterm:objects")) is ErrorCode.UNKNOWN_SCOPE


def test_operator_refs_per_namespace_and_everywhere() -> None:
    registry = parse_scopes(
        json.dumps(
            {
                "notes-ns": {
                    "notes:current": "notes",
                    "notes:active": {"snapshot_kind": "notes", "filters": {"status": ["active"]}},
                },
                "*": {"journal:current": "journal"},
            }
        )
    )
    assert registry.target("notes-ns", "notes:current").snapshot_kind == "notes"
    assert registry.target("notes-ns", "notes@g3").pinned_generation == "g3"
    active = registry.target("notes-ns", "notes:active").definition
    assert active.filters == QueryFilters(status=["active"])
    assert registry.target("other", "journal:current").snapshot_kind == "journal"
    assert registry.target("notes-ns", "journal:current").snapshot_kind == "journal"
    assert registry.target("notes-ns", "graph:current").snapshot_kind == "graph"
    assert code_of(lambda: registry.target("other", "notes:current")) is ErrorCode.UNKNOWN_SCOPE


@pytest.mark.parametrize(
    "bad",
    [
        "{",
        "[]",
        '{"ns": ["x"]}',
        '{"ns": {"a@b": "notes"}}',
        '{"ns": {"notes:current": "no spaces"}}',
        '{"ns": {"graph:current": "notes"}}',
        '{"ns": {"x:current": {"snapshot_kind": "notes", "filters": {"galaxy": "g"}}}}',
        '{"ns": {"x:current": {"snapshot_kind": "notes", "filters": {"colour": ["r"]}}}}',
        '{"ns": {"x:current": {"kind": "notes"}}}',
    ],
)
def test_invalid_operator_scopes_fail_at_startup(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_scopes(bad)


def test_settings_take_inline_json_or_a_file(tmp_path: Path) -> None:
    body = {"ns": {"notes:current": "notes"}}
    inline = scope_registry(QuerySettings(scopes=json.dumps(body)))
    assert inline.target("ns", "notes:current").snapshot_kind == "notes"
    path = tmp_path / "scopes.json"
    path.write_text(json.dumps(body))
    assert scope_registry(QuerySettings(scopes=str(path))).refs("ns")["notes:current"]
    with pytest.raises(ValueError, match="cannot read"):
        scope_registry(QuerySettings(scopes=str(tmp_path / "missing.json")))


def test_fixed_filters_intersect_request_filters() -> None:
    fixed = QueryFilters(
        status=["active", "candidate"],
        updated_after=datetime(2026, 1, 1, tzinfo=UTC),
        facets={"room": ["hall", "kitchen"]},
    )
    request = QueryFilters(
        status=["candidate", "superseded"],
        galaxy="anna",
        updated_after=datetime(2025, 1, 1, tzinfo=UTC),
        updated_before=datetime(2026, 6, 1, tzinfo=UTC),
        facets={"room": ["attic"], "owner": ["me"]},
    )
    merged = merge_filters(request, fixed)
    assert merged.status == ["candidate"]
    assert merged.galaxy == "anna"
    assert merged.updated_after == datetime(2026, 1, 1, tzinfo=UTC)
    assert merged.updated_before == datetime(2026, 6, 1, tzinfo=UTC)
    assert merged.facets == {"room": [], "owner": ["me"]}  # disjoint any-of: nothing
    assert merge_filters(QueryFilters(), fixed).status == ["active", "candidate"]
    assert merge_filters(request, None) is request


# -- resolution over the real registry ------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[SqliteProjectorState, SqliteRouting]]:
    db = tmp_path / "orrery.sqlite"
    state = SqliteProjectorState(db)
    try:
        yield state, SqliteRouting(db)
    finally:
        state.close()


def _generation(state: SqliteProjectorState, namespace: str, live: bool) -> str:
    return state.create_generation(
        namespace,
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


def _promote(state: SqliteProjectorState, generation_id: str, live: str) -> None:
    _, promoted = state.generation(generation_id)
    _, demoted = state.generation(live)
    state.switch_live(
        transition(promoted, GenerationState.LIVE, at=NOW, position=0),
        transition(demoted, GenerationState.VERIFIED, at=NOW, position=0),
        expected_live=live,
        at=NOW,
    )


def test_live_resolution_is_cached_and_dropped_by_a_promote(
    registry: tuple[SqliteProjectorState, SqliteRouting],
) -> None:
    state, routing = registry
    shared = MemoryCache()
    resolver = ScopeResolver(routing, shared=shared)
    other_worker = ScopeResolver(routing, shared=shared)
    target = resolver.target("ns", "longterm:objects:current")
    assert code_of(lambda: resolver.route("ns", target)) is ErrorCode.SCOPE_NOT_READY
    first = _generation(state, "ns", live=True)
    assert resolver.route("ns", target).generation_id == first
    assert (resolver.hits, resolver.misses) == (0, 2)
    assert resolver.route("ns", target).generation_id == first
    assert resolver.hits == 1
    # Another worker takes the resolution from the shared cache.
    assert other_worker.route("ns", target).generation_id == first
    assert (other_worker.hits, other_worker.misses) == (1, 0)

    second = _generation(state, "ns", live=False)
    for step in (GenerationState.SEALED, GenerationState.VERIFIED):
        _to(state, second, step)
    _promote(state, second, first)
    # The cached generation is no longer live: both workers re-resolve at once.
    assert resolver.route("ns", target).generation_id == second
    assert other_worker.route("ns", target).generation_id == second
    assert other_worker.misses == 0  # it found the fresh entry the first worker shared
    assert resolver.route("ns", target).state == "live"


def test_pins_route_only_to_routable_generations_of_the_scope(
    registry: tuple[SqliteProjectorState, SqliteRouting],
) -> None:
    state, routing = registry
    resolver = ScopeResolver(routing)
    live = _generation(state, "ns", live=True)
    standby = _generation(state, "ns", live=False)
    foreign = _generation(state, "other", live=True)

    def pin(generation_id: str, namespace: str = "ns") -> object:
        return resolver.route(
            namespace, resolver.target(namespace, f"longterm:objects@{generation_id}")
        )

    assert pin(live).generation_id == live  # type: ignore[attr-defined]
    with pytest.raises(OrreryError) as caught:
        pin(standby)
    assert caught.value.code is ErrorCode.GENERATION_UNAVAILABLE
    assert caught.value.http_status == 410 and caught.value.details["reason"] == "building"
    for step in (GenerationState.SEALED, GenerationState.VERIFIED):
        _to(state, standby, step)
    route = pin(standby)
    assert route.generation_id == standby and route.state == "verified"  # type: ignore[attr-defined]
    _to(state, standby, GenerationState.RETIRED)
    assert code_of(lambda: pin(standby)) is ErrorCode.GENERATION_UNAVAILABLE
    with pytest.raises(OrreryError) as caught:
        pin(foreign)  # another namespace's generation looks unknown
    assert caught.value.details["reason"] == "unknown"
    assert code_of(lambda: pin("g999")) is ErrorCode.GENERATION_UNAVAILABLE
    assert code_of(lambda: resolver.route("ns", resolver.target("ns", "graph@" + live))) is (
        ErrorCode.GENERATION_UNAVAILABLE
    )
    # A cursor's generation pins like an `@` pin.
    target = resolver.target("ns", "longterm:objects:current")
    assert resolver.route("ns", target, generation_id=live).generation_id == live
