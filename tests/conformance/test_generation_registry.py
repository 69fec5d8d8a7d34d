"""Conformance suite for the generation registry ports (`GenerationRegistry`,
`GenerationContents`, `GenerationMaintenance`, `EvidenceLog`) and `CanonicalSnapshot`.

Both have one adapter each (SQLite: the registry lives in the canonical database in both
deployments), so the suite runs once; a second backend would add a factory.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.generations import EvidenceCheck, GenerationState, Topology
from contracts.records import Record
from contracts.vector_payload import check_generation_id
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.adapters.file_lock import FileWriterLock, OperatorLock
from projector.adapters.sqlite_snapshot import SqliteCanonicalSnapshot
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.generations import DeferredWrites
from projector.model import transition
from query.adapters.sqlite_routing import SqliteRouting
from tests.conformance.corpus import HOSTILE_NAMESPACES

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _topology(generation_id: str) -> Topology:
    return Topology(
        lexical_engine="tantivy",
        lexical_index=f"lex/{generation_id}",
        vector_engine="qdrant-edge",
        vector_index=f"vec/{generation_id}",
    )


@pytest.fixture
def registry(tmp_path: Path) -> SqliteProjectorState:
    return SqliteProjectorState(tmp_path / "orrery.sqlite")


def _begin(registry: SqliteProjectorState, namespace: str = "ns") -> str:
    descriptor = registry.begin_generation(
        namespace,
        "objects",
        embedder_id="e@1",
        embedder_dim=4,
        schema_digest="s",
        topology=_topology,
        at=NOW,
    )
    return descriptor.generation_id


def _live(registry: SqliteProjectorState, namespace: str = "ns") -> str:
    """A scope's first generation, created live as the projector creates it."""
    return registry.create_generation(
        namespace,
        "objects",
        embedder_id="e@1",
        embedder_dim=4,
        lexical_engine="tantivy",
        vector_engine="qdrant-edge",
        schema_digest="s",
        make_live=True,
    ).generation_id


def _to(registry: SqliteProjectorState, generation_id: str, state: GenerationState) -> None:
    _, current = registry.generation(generation_id)
    registry.save_descriptor(
        transition(current, state, at=NOW, position=0), expect=frozenset({current.state})
    )


def test_begin_registers_a_building_write_target(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    row, descriptor = registry.generation(generation_id)
    assert row.state is GenerationState.BUILDING and not row.live
    assert descriptor.topology.lexical_index == f"lex/{generation_id}"
    assert descriptor.digest_is_valid() and row.descriptor_digest == descriptor.descriptor_digest
    assert registry.write_targets("ns", "objects") == [generation_id]


def test_sealed_and_verified_take_writes_failed_and_retired_do_not(
    registry: SqliteProjectorState,
) -> None:
    sealed, verified, failed, retired = (_begin(registry) for _ in range(4))
    _to(registry, sealed, GenerationState.SEALED)
    for generation_id in (verified, retired):
        _to(registry, generation_id, GenerationState.SEALED)
    _to(registry, verified, GenerationState.VERIFIED)
    _to(registry, failed, GenerationState.FAILED)
    _to(registry, retired, GenerationState.RETIRED)
    assert registry.write_targets("ns", "objects") == [sealed, verified]
    registry.commit("projector", 7, {})
    assert registry.generation(sealed)[0].applied_position == 7
    assert registry.generation(failed)[0].applied_position == 0


def test_save_descriptor_is_compare_and_set(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    _, building = registry.generation(generation_id)
    sealed = transition(building, GenerationState.SEALED, at=NOW, position=1)
    with pytest.raises(OrreryError) as caught:
        registry.save_descriptor(sealed, expect=frozenset({GenerationState.VERIFIED}))
    assert caught.value.code is ErrorCode.INVALID_STATE
    assert registry.generation(generation_id)[0].state is GenerationState.BUILDING
    registry.save_descriptor(sealed, expect=frozenset({GenerationState.BUILDING}))
    assert registry.generation(generation_id)[1] == sealed


def test_save_refuses_a_descriptor_whose_digest_is_wrong(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    _, building = registry.generation(generation_id)
    forged = transition(building, GenerationState.SEALED, at=NOW, position=1).model_copy(
        update={"document_count": 99}
    )
    with pytest.raises(OrreryError):
        registry.save_descriptor(forged, expect=frozenset({GenerationState.BUILDING}))


def test_switch_live_moves_pointer_and_both_states_at_once(
    registry: SqliteProjectorState,
) -> None:
    old = _live(registry)
    new = _begin(registry)
    _to(registry, new, GenerationState.SEALED)
    _to(registry, new, GenerationState.VERIFIED)
    _, old_descriptor = registry.generation(old)
    _, new_descriptor = registry.generation(new)
    promoted = transition(new_descriptor, GenerationState.LIVE, at=NOW, position=0)
    demoted = transition(old_descriptor, GenerationState.VERIFIED, at=NOW, position=0)
    with pytest.raises(OrreryError) as caught:
        registry.switch_live(promoted, demoted, expected_live="g99", at=NOW)
    assert caught.value.code is ErrorCode.INVALID_STATE
    pointer = registry.live_pointer("ns", "objects")
    assert pointer is not None and pointer.generation_id == old
    registry.switch_live(promoted, demoted, expected_live=old, at=NOW)
    pointer = registry.live_pointer("ns", "objects")
    assert pointer is not None and pointer.generation_id == new
    assert registry.generation(new)[0].live and registry.generation(new)[0].state == "live"
    assert registry.generation(old)[0].state is GenerationState.VERIFIED


def _applied(registry: SqliteProjectorState, generation_id: str) -> tuple[int, int]:
    row, _ = registry.generation(generation_id)
    return row.applied_position, row.document_count


def test_a_deferred_generation_keeps_its_position_until_it_is_resumed(
    registry: SqliteProjectorState,
) -> None:
    live = _live(registry)
    building = _begin(registry)
    deferred = DeferredWrites()
    projector = deferred.wrap(registry)
    assert projector.write_targets("ns", "objects") == [live, building]

    deferred.defer(building)
    assert projector.write_targets("ns", "objects") == [live]
    projector.commit("projector", 10, {live: {"d1": (1, False), "d2": (1, False)}})
    assert _applied(registry, live) == (10, 2)
    # It saw none of the batch: it must not claim position 10 (a build's hand-over
    # replays the batch into it later).
    assert _applied(registry, building) == (0, 0)
    assert registry.position("projector") == 10

    deferred.resume(building)
    projector.commit("projector", 12, {live: {"d3": (1, False)}, building: {"d3": (1, False)}})
    assert _applied(registry, live) == (12, 3)
    assert _applied(registry, building) == (12, 1)


def test_a_batch_moves_every_writable_generation_forward_but_the_held(
    registry: SqliteProjectorState,
) -> None:
    live = _live(registry)
    other = _begin(registry)
    registry.commit("projector", 5, {live: {"d1": (1, False)}})
    assert _applied(registry, other) == (5, 0)
    registry.commit("projector", 7, {}, held=[other])
    assert _applied(registry, live) == (7, 1)
    assert _applied(registry, other) == (5, 0)


def test_record_documents_keeps_the_newer_revision(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    before = registry.commit_seq(generation_id)
    registry.record_documents(generation_id, {"a": (2, False), "b": (1, False)})
    registry.record_documents(generation_id, {"a": (1, False), "b": (3, True)})
    assert registry.revisions(generation_id, ["a", "b"]) == {"a": 2, "b": 3}
    snapshot = registry.registry_pairs(generation_id)
    assert snapshot.pairs == {"a": 2}
    assert snapshot.commit_seq == before + 2
    assert registry.generation(generation_id)[0].document_count == 1


def test_mark_applied_never_lowers(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    registry.mark_applied(generation_id, 10)
    registry.mark_applied(generation_id, 4)
    assert registry.registry_pairs(generation_id).applied_position == 10


def test_orphaned_builds_fail_by_heartbeat(registry: SqliteProjectorState) -> None:
    stale, fresh = _begin(registry), _begin(registry)
    registry.heartbeat(fresh)
    cutoff = datetime.now(UTC) - timedelta(seconds=30)
    with registry._transaction() as conn:  # an old heartbeat, as after a crash
        conn.execute(
            "UPDATE generations SET heartbeat_at = ? WHERE generation_id = ?",
            ((cutoff - timedelta(minutes=5)).isoformat(), stale),
        )
    assert registry.fail_orphaned_builds("gone", older_than=cutoff) == [stale]
    assert registry.generation(stale)[1].history[-1].reason == "gone"
    assert registry.fail_orphaned_builds("all", older_than=None) == [fresh]


def test_evidence_log_keeps_checks_in_order(registry: SqliteProjectorState) -> None:
    generation_id = _begin(registry)
    checks = [
        EvidenceCheck(
            generation_id=generation_id,
            kind="eligibility",
            checked_at=NOW + timedelta(seconds=i),
            state=GenerationState.LIVE,
            applied_position=i,
            commit_seq=i,
            expected_count=0,
            expected_digest="",
            engines=(),
            ok=i % 2 == 0,
        )
        for i in range(3)
    ]
    for check in checks:
        registry.record_check(check)
    assert registry.latest_checks(generation_id, 2) == [checks[2], checks[1]]
    recorded = registry.checks_since(0)
    assert [c for _, c in recorded] == checks
    assert registry.checks_since(recorded[1][0]) == [recorded[2]]


# -- canonical snapshot -------------------------------------------------------------------


def _record(item: str, revision: int, *, deleted: bool = False, kind: str = "objects") -> Record:
    return Record(
        namespace="ns", snapshot_kind=kind, item_id=item, revision=revision, deleted=deleted
    )


def test_snapshot_keys_and_live_pairs_at_any_position(tmp_path: Path) -> None:
    store = SqliteRecordStore(tmp_path / "orrery.sqlite")
    store.write([_record("a", 1), _record("b", 1), _record("x", 1, kind="other")])  # 1-3
    store.write([_record("a", 2), _record("b", 2, deleted=True)])  # 4-5
    store.write([_record("c", 1), _record("a", 1)])  # 6 (the stale a@1 is refused)
    snapshot = SqliteCanonicalSnapshot(tmp_path / "orrery.sqlite")
    try:
        doc = {item: _record(item, 1).doc_id for item in "abc"}
        keys = snapshot.snapshot_keys("ns", "objects")
        assert keys.high_water == 6 == snapshot.high_water()
        assert sorted(keys.keys) == sorted([(doc["a"], 2), (doc["c"], 1)])
        assert sorted(snapshot.live_pairs_at("ns", "objects", 3)) == sorted(
            [(doc["a"], 1), (doc["b"], 1)]
        )
        assert sorted(snapshot.live_pairs_at("ns", "objects", 6)) == sorted(keys.keys)
        records = snapshot.records(keys.keys)
        assert [(r.doc_id, r.revision) for r in records] == keys.keys
        assert id_set_digest(keys.keys) == id_set_digest(snapshot.live_pairs_at("ns", "objects", 6))
        with pytest.raises(OrreryError):
            snapshot.records([(doc["a"], 9)])
    finally:
        snapshot.close()
        store.close()


# -- locks --------------------------------------------------------------------------------


def test_writer_lock_excludes_threads_and_is_reentrant(tmp_path: Path) -> None:
    lock = FileWriterLock(tmp_path / "w.lock")
    other = FileWriterLock(tmp_path / "w.lock")
    inside = threading.Event()
    entered: list[str] = []

    def contend() -> None:
        with other.hold():
            entered.append("other")

    with lock.hold(), lock.hold():
        thread = threading.Thread(target=contend)
        thread.start()
        inside.wait(0.3)
        assert entered == []  # a second description of the same file waits (flock)
    thread.join(5)
    assert entered == ["other"]


def test_operator_lock_admits_one_holder(tmp_path: Path) -> None:
    first, second = OperatorLock(tmp_path / "op.lock"), OperatorLock(tmp_path / "op.lock")
    first.acquire()
    with pytest.raises(OrreryError) as caught:
        second.acquire()
    assert caught.value.code is ErrorCode.INVALID_STATE
    first.release()
    second.acquire()
    second.release()


# -- the query side's reads of the registry -----------------------------------------------


def test_routing_reads_state_digest_fallbacks_and_lag_age(tmp_path: Path) -> None:
    from query.adapters.sqlite_routing import SqliteRouting

    db = tmp_path / "orrery.sqlite"
    store = SqliteRecordStore(db)
    registry = SqliteProjectorState(db)
    routing = SqliteRouting(db)
    try:
        store.write([_record("a", 1), _record("b", 1)])
        first = _live(registry)
        registry.commit("projector", 1, {})
        never_live, was_live = _begin(registry), _begin(registry)
        for generation_id in (never_live, was_live):
            _to(registry, generation_id, GenerationState.SEALED)
            _to(registry, generation_id, GenerationState.VERIFIED)
        # `was_live` was live once (promoted, then demoted again by a rollback).
        _, first_descriptor = registry.generation(first)
        _, descriptor = registry.generation(was_live)
        promoted = transition(descriptor, GenerationState.LIVE, at=NOW, position=1)
        demoted = transition(first_descriptor, GenerationState.VERIFIED, at=NOW, position=1)
        registry.switch_live(promoted, demoted, expected_live=first, at=NOW)
        _, live = registry.generation(was_live)
        _, standby = registry.generation(first)
        later = NOW + timedelta(minutes=1)
        registry.switch_live(
            transition(standby, GenerationState.LIVE, at=later, position=1),
            transition(live, GenerationState.VERIFIED, at=later, position=1),
            expected_live=was_live,
            at=later,
        )
        route = routing.route("ns", "objects")
        assert route is not None and route.generation_id == first and route.state == "live"
        assert route.descriptor_digest == registry.generation(first)[0].descriptor_digest
        fallbacks = routing.fallback_routes("ns", "objects", exclude=first)
        assert [r.generation_id for r in fallbacks] == [was_live, never_live]
        assert all(r.state == "verified" for r in fallbacks)
        assert routing.oldest_unapplied_at(2) is None
        oldest = routing.oldest_unapplied_at(1)
        assert oldest is not None and oldest <= datetime.now(UTC)
    finally:
        registry.close()
        store.close()


def test_hostile_namespaces_get_their_own_live_generation_and_safe_paths(
    registry: SqliteProjectorState, tmp_path: Path
) -> None:
    # Generation ids, not namespaces, name directories, indexes and collections.
    live = {ns: _live(registry, ns) for ns in ("ns", *HOSTILE_NAMESPACES)}
    assert len(set(live.values())) == len(live)
    routing = SqliteRouting(tmp_path / "orrery.sqlite")
    for ns, generation_id in live.items():
        check_generation_id(generation_id)
        pointer = registry.live_pointer(ns, "objects")
        assert pointer is not None and pointer.generation_id == generation_id
        _, descriptor = registry.generation(generation_id)
        assert descriptor.namespace == ns
        assert ns not in (descriptor.topology.lexical_index, descriptor.topology.vector_index)
        route = routing.route(ns, "objects")
        assert route is not None and route.generation_id == generation_id
