"""Conformance suite for the generation registry ports (`GenerationRegistry`,
`GenerationContents`, `GenerationMaintenance`, `EvidenceLog`) and `CanonicalSnapshot`.

Parametrized over SQLite (embedded, single-host server mode) and PostgreSQL (server mode
with `ORRERY_DATABASE_URL`; marked `servers`): each backend gives the canonical store, the
projector state, the canonical snapshot, the query side's routing and the writer lock,
all on one database.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.generations import EvidenceCheck, GenerationState, Topology
from contracts.records import Record
from contracts.vector_payload import check_generation_id
from ingest.adapters.sqlite_outbox_relay import SqliteOutboxReader
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector import model
from projector.adapters.file_lock import FileWriterLock, OperatorLock
from projector.adapters.sqlite_snapshot import SqliteCanonicalSnapshot
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.generations import DeferredWrites
from projector.model import transition
from query.adapters.sqlite_routing import SqliteRecordReader, SqliteRouting
from tests.conformance.corpus import HOSTILE_NAMESPACES

# The suite's view of one backend's registry: every port the projector state implements.
Registry = Any

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _topology(generation_id: str) -> Topology:
    return Topology(
        lexical_engine="tantivy",
        lexical_index=f"lex/{generation_id}",
        vector_engine="qdrant-edge",
        vector_index=f"vec/{generation_id}",
    )


@dataclass
class Backend:
    """Openers of one backend's adapters on one database (each call: another process's)."""

    name: str
    store: Callable[[], Any]
    state: Callable[[], Registry]
    snapshot: Callable[[], Any]
    routing: Callable[[], Any]
    records: Callable[[], Any]
    writer_lock: Callable[[], Any]
    relay_source: Callable[[], Any]
    backdate_heartbeat: Callable[[Registry, str, datetime], None]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def open(self, opener: Callable[[], Any]) -> Any:
        instance = opener()
        close = getattr(instance, "close", None)
        if close is not None:
            self.closers.append(close)
        return instance


def _sqlite(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    db = tmp / "orrery.sqlite"

    def backdate(registry: Registry, generation_id: str, at: datetime) -> None:
        with registry._transaction() as conn:
            conn.execute(
                "UPDATE generations SET heartbeat_at = ? WHERE generation_id = ?",
                (at.isoformat(), generation_id),
            )

    return Backend(
        "sqlite",
        store=lambda: SqliteRecordStore(db),
        state=lambda: SqliteProjectorState(db),
        snapshot=lambda: SqliteCanonicalSnapshot(db),
        routing=lambda: SqliteRouting(db),
        records=lambda: SqliteRecordReader(db),
        writer_lock=lambda: FileWriterLock(tmp / "w.lock"),
        relay_source=lambda: SqliteOutboxReader(db),
        backdate_heartbeat=backdate,
    )


def _postgres(request: pytest.FixtureRequest, tmp: Path) -> Backend:
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore
    from projector.adapters.postgres_lock import PostgresWriterLock
    from projector.adapters.postgres_migrations import COMPONENT, migrations
    from projector.adapters.postgres_snapshot import PostgresCanonicalSnapshot
    from projector.adapters.postgres_state import PostgresProjectorState
    from query.adapters.postgres_routing import PostgresRecordReader, PostgresRouting, open_reads

    url: str = request.getfixturevalue("postgres_url")
    migrate(url)
    migrate(url, migrations(), component=COMPONENT)

    def reads() -> Any:
        opened = open_reads(url, pool_size=2)
        backend.closers.append(opened.close)
        return opened

    def backdate(registry: Registry, generation_id: str, at: datetime) -> None:
        registry._set_heartbeat(generation_id, at)

    backend = Backend(
        "postgres",
        store=lambda: PostgresRecordStore(url),
        state=lambda: PostgresProjectorState(url),
        snapshot=lambda: PostgresCanonicalSnapshot(url),
        routing=lambda: PostgresRouting(reads()),
        records=lambda: PostgresRecordReader(reads()),
        writer_lock=lambda: PostgresWriterLock(url),
        relay_source=lambda: PostgresOutboxReader(url),
        backdate_heartbeat=backdate,
    )
    return backend


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(FACTORIES)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = FACTORIES[request.param](request, tmp_path)
    yield made
    for close in reversed(made.closers):
        close()


@pytest.fixture
def registry(backend: Backend) -> Registry:
    return backend.open(backend.state)


def _begin(registry: Registry, namespace: str = "ns") -> str:
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


def _live(registry: Registry, namespace: str = "ns") -> str:
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


def _to(registry: Registry, generation_id: str, state: GenerationState) -> None:
    _, current = registry.generation(generation_id)
    registry.save_descriptor(
        transition(current, state, at=NOW, position=0), expect=frozenset({current.state})
    )


def test_begin_registers_a_building_write_target(registry: Registry) -> None:
    generation_id = _begin(registry)
    row, descriptor = registry.generation(generation_id)
    assert row.state is GenerationState.BUILDING and not row.live
    assert descriptor.topology.lexical_index == f"lex/{generation_id}"
    assert descriptor.digest_is_valid() and row.descriptor_digest == descriptor.descriptor_digest
    assert registry.write_targets("ns", "objects") == [generation_id]


def test_sealed_and_verified_take_writes_failed_and_retired_do_not(
    registry: Registry,
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


def test_save_descriptor_is_compare_and_set(registry: Registry) -> None:
    generation_id = _begin(registry)
    _, building = registry.generation(generation_id)
    sealed = transition(building, GenerationState.SEALED, at=NOW, position=1)
    with pytest.raises(OrreryError) as caught:
        registry.save_descriptor(sealed, expect=frozenset({GenerationState.VERIFIED}))
    assert caught.value.code is ErrorCode.INVALID_STATE
    assert registry.generation(generation_id)[0].state is GenerationState.BUILDING
    registry.save_descriptor(sealed, expect=frozenset({GenerationState.BUILDING}))
    assert registry.generation(generation_id)[1] == sealed


def test_save_refuses_a_descriptor_whose_digest_is_wrong(registry: Registry) -> None:
    generation_id = _begin(registry)
    _, building = registry.generation(generation_id)
    forged = transition(building, GenerationState.SEALED, at=NOW, position=1).model_copy(
        update={"document_count": 99}
    )
    with pytest.raises(OrreryError):
        registry.save_descriptor(forged, expect=frozenset({GenerationState.BUILDING}))


def test_switch_live_moves_pointer_and_both_states_at_once(
    registry: Registry,
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


def _applied(registry: Registry, generation_id: str) -> tuple[int, int]:
    row, _ = registry.generation(generation_id)
    return row.applied_position, row.document_count


def test_a_deferred_generation_keeps_its_position_until_it_is_resumed(
    registry: Registry,
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
    registry: Registry,
) -> None:
    live = _live(registry)
    other = _begin(registry)
    registry.commit("projector", 5, {live: {"d1": (1, False)}})
    assert _applied(registry, other) == (5, 0)
    registry.commit("projector", 7, {}, held=[other])
    assert _applied(registry, live) == (7, 1)
    assert _applied(registry, other) == (5, 0)


def test_record_documents_keeps_the_newer_revision(registry: Registry) -> None:
    generation_id = _begin(registry)
    before = registry.commit_seq(generation_id)
    registry.record_documents(generation_id, {"a": (2, False), "b": (1, False)})
    registry.record_documents(generation_id, {"a": (1, False), "b": (3, True)})
    assert registry.revisions(generation_id, ["a", "b"]) == {"a": 2, "b": 3}
    snapshot = registry.registry_pairs(generation_id)
    assert snapshot.pairs == {"a": 2}
    assert snapshot.commit_seq == before + 2
    assert registry.generation(generation_id)[0].document_count == 1


def test_registry_pairs_come_in_id_order(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's pairs come in Python's order of their ids (code points: UTF-8
    bytes in SQLite's key order and PostgreSQL's "C" collation), so an evidence check
    hashes them without a sort (`id_set_digest`), also past the fetch chunk."""
    generation_id = _begin(registry)
    ids = ["b", "a", "B", "\u00e4", "a-1", "a_1", "\u4e2d", "z", "\U0001f600", "~"]
    ids += [f"doc-{i:05d}" for i in range(0, 50_000, 997)]
    registry.record_documents(generation_id, {d: (1, False) for d in ids})
    monkeypatch.setattr(model, "_FETCH_CHUNK", 4)
    pairs = registry.registry_pairs(generation_id).pairs
    assert list(pairs) == sorted(ids)


def test_document_count_follows_upserts_deletes_and_stale_writes(registry: Registry) -> None:
    """`document_count` is the number of live documents after every kind of change, by
    either writer (a projector batch, a build's `record_documents`)."""
    live = _live(registry)

    def counted() -> tuple[int, int]:
        live_now = len(registry.registry_pairs(live).pairs)
        return registry.generation(live)[0].document_count, live_now

    registry.commit("projector", 1, {live: {"a": (1, False), "b": (1, False), "c": (1, False)}})
    assert counted() == (3, 3)
    # A delete, a tombstone for a document never seen, a stale upsert (ignored).
    registry.commit("projector", 2, {live: {"a": (2, True), "z": (1, True), "b": (0, False)}})
    assert counted() == (2, 2)
    # Back from the dead, a stale delete (ignored), a new one; then a repeat (no change).
    registry.record_documents(live, {"a": (3, False), "c": (0, True), "d": (1, False)})
    assert counted() == (4, 4)
    registry.record_documents(live, {"a": (3, False), "d": (1, False)})
    assert counted() == (4, 4)
    registry.commit("projector", 3, {live: {"a": (4, True), "b": (2, True), "c": (2, True)}})
    assert counted() == (1, 1)


# A change: (document, revision, deleted), written by a projector batch or a build.
_CHANGE = st.tuples(st.integers(0, 11), st.integers(0, 4), st.booleans())


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(
        st.tuples(st.booleans(), st.lists(_CHANGE, max_size=8)), min_size=1, max_size=8
    ),
    wide=st.integers(0, 1_300),
)
def test_document_count_is_the_live_documents_after_any_writes(
    registry: Registry, batches: list[tuple[bool, list[tuple[int, int, bool]]]], wide: int
) -> None:
    """Counted from each batch's own documents (not recounted): after any sequence of
    upserts, deletes, stale and repeated writes by either writer, `document_count` is the
    generation's live documents. A first batch of `wide` new documents spans several of
    SQLite's lookups (500 ids each)."""
    live = _live(registry)
    registry.commit("projector", 1, {live: {f"w{i}": (1, i % 7 == 0) for i in range(wide)}})
    for position, (by_projector, changes) in enumerate(batches, start=2):
        docs = {f"d{d}": (revision, deleted) for d, revision, deleted in changes}
        if by_projector:
            registry.commit("projector", position, {live: docs})
        else:
            registry.record_documents(live, docs)
        held = len(registry.registry_pairs(live).pairs)
        assert registry.generation(live)[0].document_count == held


def test_mark_applied_never_lowers(registry: Registry) -> None:
    generation_id = _begin(registry)
    registry.mark_applied(generation_id, 10)
    registry.mark_applied(generation_id, 4)
    assert registry.registry_pairs(generation_id).applied_position == 10


def test_orphaned_builds_fail_by_heartbeat(registry: Registry, backend: Backend) -> None:
    stale, fresh = _begin(registry), _begin(registry)
    registry.heartbeat(fresh)
    cutoff = datetime.now(UTC) - timedelta(seconds=30)
    # An old heartbeat, as after a crash.
    backend.backdate_heartbeat(registry, stale, cutoff - timedelta(minutes=5))
    assert registry.fail_orphaned_builds("gone", older_than=cutoff) == [stale]
    assert registry.generation(stale)[1].history[-1].reason == "gone"
    assert registry.fail_orphaned_builds("all", older_than=None) == [fresh]


def test_evidence_log_keeps_checks_in_order(registry: Registry) -> None:
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


def test_snapshot_keys_and_live_pairs_at_any_position(backend: Backend) -> None:
    store = backend.open(backend.store)
    store.write([_record("a", 1), _record("b", 1), _record("x", 1, kind="other")])  # 1-3
    store.write([_record("a", 2), _record("b", 2, deleted=True)])  # 4-5
    store.write([_record("c", 1), _record("a", 1)])  # 6 (the stale a@1 is refused)
    snapshot = backend.open(backend.snapshot)
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


# -- locks --------------------------------------------------------------------------------


def test_writer_lock_excludes_threads_and_is_reentrant(backend: Backend) -> None:
    lock = backend.open(backend.writer_lock)
    other = backend.open(backend.writer_lock)
    inside = threading.Event()
    entered: list[str] = []

    def contend() -> None:
        with other.hold():
            entered.append("other")

    with lock.hold(), lock.hold():
        thread = threading.Thread(target=contend)
        thread.start()
        inside.wait(0.3)
        assert entered == []  # a second holder (file description, session) waits
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


def test_routing_reads_state_digest_fallbacks_and_lag_age(backend: Backend) -> None:
    store = backend.open(backend.store)
    registry = backend.open(backend.state)
    routing = backend.open(backend.routing)
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


def test_hostile_namespaces_get_their_own_live_generation_and_safe_paths(
    registry: Registry, backend: Backend
) -> None:
    # Generation ids, not namespaces, name directories, indexes and collections.
    live = {ns: _live(registry, ns) for ns in ("ns", *HOSTILE_NAMESPACES)}
    assert len(set(live.values())) == len(live)
    routing = backend.open(backend.routing)
    for ns, generation_id in live.items():
        check_generation_id(generation_id)
        pointer = registry.live_pointer(ns, "objects")
        assert pointer is not None and pointer.generation_id == generation_id
        _, descriptor = registry.generation(generation_id)
        assert descriptor.namespace == ns
        assert ns not in (descriptor.topology.lexical_index, descriptor.topology.vector_index)
        route = routing.route(ns, "objects")
        assert route is not None and route.generation_id == generation_id


def test_concurrent_builders_get_distinct_generation_ids(backend: Backend) -> None:
    # Each thread has its own adapter, as a builder on another machine would.
    registries = [backend.open(backend.state) for _ in range(4)]
    made: list[str] = []
    errors: list[BaseException] = []

    def build(registry: Registry) -> None:
        try:
            for _ in range(5):
                made.append(_begin(registry))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(r,)) for r in registries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(made, key=lambda g: int(g[1:])) == [f"g{i}" for i in range(1, 21)]


@pytest.fixture
def postgres_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = _postgres(request, tmp_path)
    yield made
    for close in reversed(made.closers):
        close()


# PostgreSQL only: a flock is lost only with its process, which then commits nothing.
@pytest.mark.servers
def test_a_lost_writer_lock_fails_the_commit(postgres_backend: Backend) -> None:
    backend = postgres_backend
    import psycopg

    from projector.adapters.postgres_state import PostgresProjectorState

    lock = backend.open(backend.writer_lock)
    url = lock._url
    fenced = backend.open(lambda: PostgresProjectorState(url, fence=lock.assert_held))
    live = _live(fenced)
    with lock.hold():
        fenced.commit("projector", 1, {live: {"d1": (1, False)}})
    assert fenced.position("projector") == 1
    with lock.hold():
        # The lock's session ends (a network cut, a server restart) while held.
        with psycopg.connect(url, autocommit=True) as admin:
            pid = lock.backend_pid()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # The signal is sent at once; the backend (and its locks) go a moment later.
            deadline = time.monotonic() + 10
            while admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone() != (0,):
                assert time.monotonic() < deadline, "the lock's backend did not end"
                time.sleep(0.02)
        with pytest.raises(OrreryError) as caught:
            fenced.commit("projector", 2, {live: {"d2": (1, False)}})
        assert caught.value.code is ErrorCode.DEPENDENCY_UNAVAILABLE
    # Nothing of the batch was committed: it replays.
    assert fenced.position("projector") == 1
    assert fenced.revisions(live, ["d1", "d2"]) == {"d1": 1}
    # The next holder takes the lock again on a new session.
    with lock.hold():
        fenced.commit("projector", 2, {live: {"d2": (1, False)}})
    assert fenced.position("projector") == 2


def test_record_reader_returns_exact_revisions_heads_and_pages(backend: Backend) -> None:
    from contracts.records import payload_sha256

    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    store.write([_record("a", 1), _record("b", 1), _record("c", 1)])
    store.write([_record("a", 2), _record("c", 2, deleted=True)])
    doc = {item: _record(item, 1).doc_id for item in "abc"}
    fetched = reader.fetch([(doc["a"], 1), (doc["a"], 2), (doc["b"], 7)])
    assert sorted(fetched) == sorted([(doc["a"], 1), (doc["a"], 2)])
    assert fetched[(doc["a"], 1)].payload_sha256 == payload_sha256(_record("a", 1).payload)
    assert Record.model_validate_json(fetched[(doc["a"], 2)].record_json).revision == 2
    heads = reader.heads("ns", [doc["a"], doc["b"], doc["c"], "nope"])
    assert sorted((h.document_id, h.revision) for h in heads) == sorted(
        [(doc["a"], 2), (doc["b"], 1)]
    )
    total, first = reader.page("ns", None, 0, 1)
    _, rest = reader.page("ns", None, 1, 5)
    assert total == 2
    assert [r.document_id for r in first + rest] == sorted([doc["a"], doc["b"]])
    assert reader.page("ns", "other-galaxy", 0, 5) == (0, [])


def test_head_keys_list_what_pages_walk_and_draw_the_same_sample(backend: Backend) -> None:
    """`head_keys` is the page walk's `(document_id, revision)` in its order, through
    updates, deletes, other kinds and another namespace; so a qualification sample drawn
    from it holds the same records in the same order as one drawn a `page` per record,
    and leaves the generator in the same state (the phrase slice draws from it next)."""
    from query.qualify import _drawn_records

    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    rng = random.Random(11)
    revisions: dict[tuple[str, str], int] = {}
    for _ in range(6):
        batch = []
        for _ in range(rng.randint(5, 25)):
            namespace = rng.choice(["ns", "ns", "ns", "other"])
            item = f"i{rng.randrange(60)}"
            revision = revisions.get((namespace, item), 0) + 1
            revisions[(namespace, item)] = revision
            batch.append(
                Record(
                    namespace=namespace,
                    snapshot_kind=rng.choice(["objects", "objects", "docs"]),
                    item_id=item,
                    revision=revision,
                    deleted=rng.random() < 0.15,
                    text={"title": f"title {item}"},
                )
            )
        store.write(batch)
    total, rows = reader.page("ns", None, 0, 1_000)
    keys = reader.head_keys("ns")
    assert keys == [(r.document_id, r.revision) for r in rows]
    assert len(keys) == total > 0
    assert reader.head_keys("nobody") == []
    for seed, size in ((1, 3), (2, 10), (3, total), (4, 500)):
        paged, listed = random.Random(seed), random.Random(seed)
        by_page = list(_drawn_records("ns", size, paged, reader, None))
        by_keys = list(_drawn_records("ns", size, listed, reader, reader))
        assert [(r.document_id, r.revision, r.snapshot_kind) for r in by_keys] == [
            (r.document_id, r.revision, r.snapshot_kind) for r in by_page
        ]
        assert [Record.model_validate_json(r.record_json).text.title for r in by_keys] == [
            Record.model_validate_json(r.record_json).text.title for r in by_page
        ]
        assert len(by_keys) == min(total, 2 * size)
        assert paged.getstate() == listed.getstate()


def test_record_reader_fetches_exactly_the_pairs_asked(backend: Backend) -> None:
    """Any mix of stored pairs, other revisions of stored documents and unknown
    documents: exactly the stored pairs asked for come back, each at its revision (a
    lookup over `ids × revisions` must drop the product's other pairs)."""
    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    store.write([_record(item, 1) for item in "abcd"])
    store.write([_record(item, 2) for item in "ab"])
    store.write([_record("a", 3)])
    pairs = (("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1), ("d", 1))
    stored = {(_record(item, revision).doc_id, revision) for item, revision in pairs}
    ids = [*sorted({d for d, _ in stored}), "nope"]
    rng = random.Random(7)
    for _ in range(40):
        keys = [(rng.choice(ids), rng.randint(1, 4)) for _ in range(rng.randint(0, 9))]
        fetched = reader.fetch(keys)
        assert set(fetched) == set(keys) & stored
        for (document_id, revision), record in fetched.items():
            assert (record.document_id, record.revision) == (document_id, revision)


def test_record_reader_pages_every_namespace(backend: Backend) -> None:
    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    store.write(
        [
            _record("a", 1),
            Record(namespace="other", snapshot_kind="objects", item_id="z", revision=1),
        ]
    )
    total, rows = reader.page(None, None, 0, 10)
    assert total == 2 and sorted(r.namespace for r in rows) == ["ns", "other"]
    assert reader.page("other", None, 0, 10)[0] == 1
    other = Record(namespace="other", snapshot_kind="objects", item_id="z", revision=1).doc_id
    assert [h.namespace for h in reader.heads(None, [_record("a", 1).doc_id, other])] in (
        ["ns", "other"],
        ["other", "ns"],
    )
    assert reader.heads("ns", [other]) == []


def test_record_reads_are_bounded_in_bytes_and_kinds_read_no_json(backend: Backend) -> None:
    """Issue 22: `fetch`, `heads` and `page` never load more than `max_answer_bytes` of
    record JSON (413 answer_too_large past it); `head_facts` answers kind, galaxy,
    revision and size without reading a record."""
    store = backend.open(backend.store)
    big = [
        Record(
            namespace="ns",
            snapshot_kind="objects",
            item_id=f"big{n}",
            revision=1,
            galaxy="g1" if n % 2 else "g2",
            payload={"blob": "x" * 30_000},
        )
        for n in range(4)
    ]
    small = _record("small", 1, kind="other")
    outcomes = store.write([*big, small])
    positions = {o.document_id: o.revision for o in outcomes}
    ids = [r.doc_id for r in big]
    records = backend.open(backend.records)
    records._max_answer_bytes = 70_000  # two big records fit, three do not
    facts = {f.document_id: f for f in records.head_facts("ns", [*ids, small.doc_id, "nope"])}
    assert set(facts) == {*ids, small.doc_id}
    assert facts[small.doc_id].snapshot_kind == "other"
    assert {facts[d].galaxy for d in ids} == {"g1", "g2"}
    assert all(30_000 < facts[d].record_bytes < 35_000 for d in ids)
    assert records.head_facts("other-ns", ids) == []
    assert {r.document_id for r in records.heads("ns", ids[:2])} == set(ids[:2])
    assert set(records.fetch([(d, positions[d]) for d in ids[:2]])) == {(d, 1) for d in ids[:2]}
    assert len(records.page("ns", None, 0, 2)[1]) == 2
    for call in (
        lambda: records.heads("ns", ids),
        lambda: records.fetch([(d, 1) for d in ids]),
        lambda: records.page("ns", None, 0, 10),
    ):
        with pytest.raises(OrreryError) as caught:
            call()
        assert caught.value.code is ErrorCode.ANSWER_TOO_LARGE
        assert caught.value.details == {"max_answer_bytes": 70_000}
    # No match is still an empty answer, not a refusal.
    assert records.heads("ns", ["nope"]) == [] and records.fetch([("nope", 1)]) == {}


class _CountingReader:
    """A reader that counts the pairs it was asked for (the rest is the real reader's)."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.asked: list[tuple[str, int]] = []

    def fetch(self, keys: Any) -> Any:
        self.asked.extend(keys)
        return self.reader.fetch(keys)


def test_record_cache_answers_what_the_reader_answers_per_tenant(backend: Backend) -> None:
    """`RecordCache.fetch` returns exactly `reader.fetch` for any mix of kept, stored and
    unknown pairs of two tenants; a pair is read from the store once while kept; a record
    is kept only for the namespace it belongs to; one tenant filling its bound never
    evicts another's records; and the answer bound counts kept records too (413)."""
    from query.record_cache import ENTRY_OVERHEAD_BYTES, RecordCache

    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    records = [
        Record(namespace=namespace, snapshot_kind="objects", item_id=item, revision=revision)
        for namespace in ("ns", "other")
        for item in "abcdef"
        for revision in (1, 2)
    ]
    store.write([r for r in records if r.revision == 1])
    store.write([r for r in records if r.revision == 2])
    pairs: dict[str, list[tuple[str, int]]] = {"ns": [], "other": []}
    for r in records:
        pairs[r.namespace].append((r.doc_id, r.revision))
    size = max(len(reader.fetch([p])[p].record_json) for p in pairs["ns"])
    kept = max(sys.getsizeof(reader.fetch([p])[p].record_json) for p in pairs["ns"])
    # Room for four records of a tenant: the draws below keep evicting.
    cache = RecordCache(max_answer_bytes=1_000_000, max_bytes=4 * (kept + ENTRY_OVERHEAD_BYTES))
    counting = _CountingReader(reader)
    rng = random.Random(5)
    for _ in range(60):
        namespace = rng.choice(["ns", "other"])
        own, foreign = pairs[namespace], pairs["other" if namespace == "ns" else "ns"]
        keys = list(
            dict.fromkeys(
                rng.choice(own + foreign[:2] + [("nope", 1), (own[0][0], 9)])
                for _ in range(rng.randint(0, 6))
            )
        )
        assert cache.fetch(counting, namespace, keys) == reader.fetch(keys)
    # Kept: asked again, a tenant's last pairs are not read from the store again.
    last = pairs["ns"][:3]
    cache.fetch(counting, "ns", last)
    counting.asked.clear()
    assert cache.fetch(counting, "ns", last) == reader.fetch(last)
    assert counting.asked == []
    # Never kept for a tenant it does not belong to (read again each time).
    foreign_pair = pairs["other"][0]
    for _ in range(2):
        counting.asked.clear()
        assert cache.fetch(counting, "ns", [foreign_pair]) == reader.fetch([foreign_pair])
        assert counting.asked == [foreign_pair]
    # "other" fills and churns its own bound: "ns"'s kept records stay.
    for pair in pairs["other"]:
        cache.fetch(counting, "other", [pair])
    counting.asked.clear()
    cache.fetch(counting, "ns", last)
    assert counting.asked == []
    # The answer bound counts kept and read records alike.
    tight = RecordCache(
        max_answer_bytes=2 * size + size // 2, max_bytes=10 * (kept + ENTRY_OVERHEAD_BYTES)
    )
    tight.fetch(reader, "ns", pairs["ns"][:2])
    with pytest.raises(OrreryError) as caught:
        tight.fetch(reader, "ns", pairs["ns"][:3])
    assert caught.value.code is ErrorCode.ANSWER_TOO_LARGE


def _receipt(generation_id: str, digest: str, at: datetime, passed: bool) -> Any:
    from tests.receipts import receipt

    return receipt(
        generation_id=generation_id,
        descriptor_digest=digest,
        position=7,
        profiles={"rrf@2": "d"},
        passed=passed,
        created_at=at,
    )


def test_receipt_log_keeps_receipts_immutable_newest_first(registry: Registry) -> None:
    generation_id = _begin(registry)
    _, descriptor = registry.generation(generation_id)
    older = _receipt(generation_id, descriptor.descriptor_digest, NOW, passed=False)
    newer = _receipt(generation_id, descriptor.descriptor_digest, NOW + timedelta(1), True)
    registry.record_receipt(older)
    registry.record_receipt(newer)
    registry.record_receipt(older)  # content-addressed: a no-op
    stored = registry.receipts(generation_id)
    assert [r.receipt_id for r in stored] == [newer.receipt_id, older.receipt_id]
    assert stored == [newer, older] and all(r.id_is_valid() for r in stored)
    assert registry.receipts(_begin(registry)) == []
    with pytest.raises(ValueError):
        registry.record_receipt(older.model_copy(update={"passed": True}))


def test_record_reader_knows_which_namespaces_and_kinds_it_holds(backend: Backend) -> None:
    store = backend.open(backend.store)
    reader = backend.open(backend.records)
    assert not reader.holds("ns")
    store.write([_record("a", 1), _record("b", 1, deleted=True, kind="graph")])
    assert reader.holds("ns") and reader.holds("ns", "objects")
    # A deleted record still names its scope: the namespace is known, not mistyped.
    assert reader.holds("ns", "graph")
    assert not reader.holds("ns", "midterm")
    assert not reader.holds("nsx") and not reader.holds("other", "objects")


def test_dead_letter_box_parks_a_record_revision_once_whoever_refuses_it(
    registry: Registry,
) -> None:
    """`DeadLetterBox.park_rejected`: the projector parks a record at its log position,
    a generation build at its name (no position); one letter per record revision either
    way, replays included, and another revision is another letter."""
    from projector.ports import RejectedRecord

    namespace = f"dl-{time.monotonic_ns()}"

    def rec(item: str, revision: int = 1) -> Record:
        return Record.model_validate(
            {
                "namespace": namespace,
                "snapshot_kind": "objects",
                "item_id": item,
                "revision": revision,
                "text": {"title": item},
            }
        )

    first, second = rec("first"), rec("second")
    registry.park_rejected("projector", [RejectedRecord(5, first, "vector_zero", "zero")])
    registry.park_rejected("build", [RejectedRecord(None, first, "vector_zero", "zero")])
    registry.park_rejected("build", [RejectedRecord(None, second, "vector_zero", "zero")])
    registry.park_rejected("projector", [RejectedRecord(9, second, "vector_zero", "zero")])
    registry.park_rejected("build", [RejectedRecord(None, second, "vector_zero", "zero")])
    again = rec("first", revision=2)
    registry.park_rejected("build", [RejectedRecord(None, again, "vector_zero", "zero")])
    letters = registry.dead_letters(namespace=namespace)
    assert [(d.consumer, d.message.where, d.message.position) for d in letters] == [
        ("projector", "event@5", 5),
        ("build", f"record@{namespace}/objects/{second.doc_id}@1", None),
        ("build", f"record@{namespace}/objects/{first.doc_id}@2", None),
    ]
    assert [(d.document_id, d.revision) for d in letters] == [
        (first.doc_id, 1),
        (second.doc_id, 1),
        (first.doc_id, 2),
    ]


# --- A namespace's own log on a partitioned log (Kafka): readiness counts by offset ---


def _write(store: Any, namespace: str, items: Sequence[str]) -> list[int]:
    """Write one record per item in `namespace`; their outbox positions, in order."""
    records = [
        Record(namespace=namespace, snapshot_kind="objects", item_id=i, revision=1) for i in items
    ]
    return [int(o.position) for o in store.write(records) if o.position is not None]


def test_a_later_event_applied_on_another_partition_leaves_the_earlier_one_pending(
    backend: Backend,
) -> None:
    """The CI flake of `test_ring_statistics_follow_writes_and_new_generations`: an update
    (position p, partition 0) and a tombstone (p + 1, partition 1) of one POST; the
    projector applied partition 1 first. The namespace's newest applied position is p + 1,
    yet p is not applied: its log must say 1 pending, and a key's readiness not ready."""
    from contracts.auth import ApiKeyGrant
    from query.entrypoints.http import readiness, readiness_for

    store, state = backend.open(backend.store), backend.open(backend.state)
    routing, source = backend.open(backend.routing), backend.open(backend.relay_source)
    ns, other = "split", "busy"
    update, tombstone = _write(store, ns, ["m1", "m2"])
    backlog = _write(store, other, ["o1", "o2", "o3"])  # another tenant's, never applied
    rows = source.unpublished(10)
    assert [r.position for r in rows] == [update, tombstone, *backlog]
    source.mark_published([update, tombstone, *backlog], [(0, 0), (1, 0), (0, 0), (0, 1), (1, 0)])
    # Partition 1 of the namespace's topic applied (the tombstone), partition 0 not yet.
    state.commit("projector", tombstone, {}, namespaces={ns: tombstone}, partitions={(ns, 1): 0})
    state.record_lag("projector", position=tombstone, lag_events=1 + len(backlog))
    own = routing.namespace_log(ns, 2**62)
    assert (own.high_water, own.applied) == (tombstone, tombstone)
    log = routing.namespace_log(ns, own.applied)
    assert log.pending == 1 and log.oldest_pending_at is not None
    body = readiness_for(readiness(routing, None), ApiKeyGrant(namespace=ns), routing.namespace_log)
    assert body["projector_log"]["lag_events"] == 1 and body["ready"] is False
    # Partition 0 applied too: nothing of the namespace waits, whatever the other's backlog.
    state.commit("projector", tombstone, {}, namespaces={ns: update}, partitions={(ns, 0): 0})
    assert routing.namespace_log(ns, own.applied).pending == 0
    body = readiness_for(readiness(routing, None), ApiKeyGrant(namespace=ns), routing.namespace_log)
    assert body["projector_log"]["lag_events"] == 0 and body["ready"] is True
    theirs = readiness_for(
        readiness(routing, None), ApiKeyGrant(namespace=other), routing.namespace_log
    )
    assert theirs["projector_log"]["lag_events"] == len(backlog) and theirs["ready"] is False


def test_an_event_not_yet_published_below_the_applied_position_is_pending(
    backend: Backend,
) -> None:
    """With several relays a later row can be published (and applied) before an earlier
    one is: the unpublished row stays pending until its partition's offset passes it."""
    store, state = backend.open(backend.store), backend.open(backend.state)
    routing, source = backend.open(backend.routing), backend.open(backend.relay_source)
    ns = "relays"
    first, second = _write(store, ns, ["a", "b"])
    source.unpublished(10)
    source.mark_published([second], [(2, 0)])
    state.commit("projector", second, {}, namespaces={ns: second}, partitions={(ns, 2): 0})
    assert routing.namespace_log(ns, second).pending == 1
    source.mark_published([first], [(2, 1)])  # behind the second on the same partition
    assert routing.namespace_log(ns, second).pending == 1
    state.commit("projector", second, {}, namespaces={ns: first}, partitions={(ns, 2): 1})
    assert routing.namespace_log(ns, second).pending == 0
    # A position lower than the newest applied never hides what is after it.
    assert routing.namespace_log(ns, first).pending == 1


def test_a_log_of_one_order_counts_what_is_after_the_applied_position(
    backend: Backend,
) -> None:
    """The embedded outbox log (no relay, no placements): rows are never marked, and the
    namespace's newest applied position is exact, as before."""
    store, state = backend.open(backend.store), backend.open(backend.state)
    routing = backend.open(backend.routing)
    positions = _write(store, "one", ["a", "b", "c"])
    state.commit("projector", positions[1], {}, namespaces={"one": positions[1]})
    assert routing.namespace_log("one", positions[1]).pending == 1
    state.commit("projector", positions[2], {}, namespaces={"one": positions[2]})
    assert routing.namespace_log("one", positions[2]).pending == 0


@st.composite
def _partitioned_runs(draw: st.DrawFn) -> tuple[list[int], list[int], list[tuple[str, int]]]:
    """Events of one namespace: each one's partition, the order the relays publish them
    in (any order: several relays), and a sequence of steps (publish the next one, or
    apply the next published event of one partition)."""
    count = draw(st.integers(1, 8))
    partitions = draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
    order = draw(st.permutations(range(count)))
    steps = draw(
        st.lists(
            st.one_of(st.just(("publish", 0)), st.tuples(st.just("apply"), st.integers(0, 2))),
            max_size=30,
        )
    )
    return partitions, list(order), steps


_RUNS = iter(range(10**6))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run=_partitioned_runs())
def test_pending_is_zero_only_when_every_event_is_applied(
    backend: Backend, run: tuple[list[int], list[int], list[tuple[str, int]]]
) -> None:
    """Whatever order the relays publish in and the partitions are applied in, the
    namespace's pending count (after its newest applied position, as readiness asks) is
    exactly its events not applied yet."""
    partitions, order, steps = run
    store = backend.open(backend.store)
    state, routing = backend.open(backend.state), backend.open(backend.routing)
    source = backend.open(backend.relay_source)
    ns = f"prop-{next(_RUNS)}"
    positions = _write(store, ns, [f"d{i}" for i in range(len(partitions))])
    source.unpublished(100)
    logs: dict[int, list[int]] = {p: [] for p in range(3)}  # per partition: event indexes
    applied_upto = dict.fromkeys(range(3), 0)  # per partition: how many applied
    published = 0
    newest = 0

    def publish() -> None:
        nonlocal published
        index = order[published]
        published += 1
        part = partitions[index]
        logs[part].append(index)
        source.mark_published([positions[index]], [(part, len(logs[part]) - 1)])

    def apply(partition: int) -> None:
        nonlocal newest
        index = logs[partition][applied_upto[partition]]
        applied_upto[partition] += 1
        newest = max(newest, positions[index])
        state.commit(
            "projector",
            newest,
            {},
            namespaces={ns: positions[index]},
            partitions={(ns, partition): applied_upto[partition] - 1},
        )

    def check() -> None:
        applied = sum(applied_upto.values())
        log = routing.namespace_log(ns, routing.namespace_log(ns, 2**62).applied)
        assert log.pending == len(positions) - applied
        assert (log.oldest_pending_at is None) == (applied == len(positions))

    for step, partition in steps:
        if step == "publish" and published < len(order):
            publish()
        elif step == "apply" and applied_upto[partition] < len(logs[partition]):
            apply(partition)
        check()
    while published < len(order):
        publish()
        check()
    for partition in range(3):
        while applied_upto[partition] < len(logs[partition]):
            apply(partition)
            check()
    assert routing.namespace_log(ns, newest).pending == 0
