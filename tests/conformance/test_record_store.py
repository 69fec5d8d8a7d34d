"""Conformance suite of the `RecordStore` port (ingest)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts.errors import DependencyUnavailable
from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.model import Decision
from ingest.ports import RecordStore
from tests.conformance.corpus import HOSTILE_NAMESPACES


def _sqlite(request: pytest.FixtureRequest, tmp: Path) -> Callable[[], RecordStore]:
    return lambda: SqliteRecordStore(tmp / "orrery.sqlite")


def _sqlite_handover(request: pytest.FixtureRequest, tmp: Path) -> Callable[[], RecordStore]:
    """The embedded server's store: it hands committed events over and checkpoints its
    WAL itself, after the hand-over."""
    return lambda: SqliteRecordStore(tmp / "orrery.sqlite", on_committed=lambda entries: None)


def _postgres(request: pytest.FixtureRequest, tmp: Path) -> Callable[[], RecordStore]:
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_store import PostgresRecordStore

    url: str = request.getfixturevalue("postgres_url")
    migrate(url)
    return lambda: PostgresRecordStore(url, pool_size=8)


# Each factory returns an opener: every call opens another store on the same database,
# as another process would.
FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Callable[[], RecordStore]]] = {
    "sqlite": _sqlite,
    "sqlite-handover": _sqlite_handover,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(FACTORIES)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], RecordStore]:
    return FACTORIES[request.param](request, tmp_path)


@pytest.fixture
def store(opener: Callable[[], RecordStore]) -> Iterator[RecordStore]:
    instance = opener()
    yield instance
    instance.close()


def rec(item: str, revision: int, deleted: bool = False) -> Record:
    return Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id=item,
        revision=revision,
        deleted=deleted,
        payload={"v": revision},
    )


def test_accepts_new_documents_with_increasing_positions(store: RecordStore) -> None:
    outcomes = store.write([rec("a", 1), rec("b", 1)])
    assert [o.decision for o in outcomes] == [Decision.ACCEPTED, Decision.ACCEPTED]
    positions = [o.position for o in outcomes]
    assert positions[0] is not None and positions[1] is not None
    assert positions[0] < positions[1]
    assert store.high_water() == positions[1]


def test_stale_and_equal_revisions_are_rejected_alone(store: RecordStore) -> None:
    store.write([rec("a", 2)])
    outcomes = store.write([rec("a", 2), rec("a", 1), rec("b", 1), rec("a", 3)])
    assert [o.decision for o in outcomes] == [
        Decision.CONFLICT,
        Decision.CONFLICT,
        Decision.ACCEPTED,
        Decision.ACCEPTED,
    ]
    assert outcomes[0].current_revision == 2


def test_tombstone_is_a_revision(store: RecordStore) -> None:
    store.write([rec("a", 1)])
    assert store.write([rec("a", 2, deleted=True)])[0].decision is Decision.ACCEPTED
    assert store.write([rec("a", 2)])[0].decision is Decision.CONFLICT
    assert store.write([rec("a", 3)])[0].decision is Decision.ACCEPTED


def test_empty_store_high_water_is_zero(store: RecordStore) -> None:
    assert store.high_water() == 0


def test_batch_sees_its_own_earlier_records(store: RecordStore) -> None:
    outcomes = store.write([rec("a", 1), rec("a", 1), rec("a", 3), rec("a", 2)])
    assert [o.decision for o in outcomes] == [
        Decision.ACCEPTED,
        Decision.CONFLICT,
        Decision.ACCEPTED,
        Decision.CONFLICT,
    ]
    assert outcomes[3].current_revision == 3
    assert [o.index for o in outcomes] == [0, 1, 2, 3]
    assert store.write([rec("a", 3)])[0].current_revision == 3


def test_positions_are_gap_free_across_concurrent_writers(
    opener: Callable[[], RecordStore],
) -> None:
    """8 writer threads (two stores, as two processes would) × 100 batches: the accepted
    positions are exactly 1..N, and the high water is N."""
    threads, batches, size = 8, 100, 3
    stores = [opener(), opener()]
    positions: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def writer(worker: int) -> None:
        try:
            for batch in range(batches):
                items = [rec(f"w{worker}-b{batch}-{i}", 1) for i in range(size)]
                # A conflict in every batch: rejected alone, takes no position.
                items.append(rec(f"w{worker}-b{batch}-0", 1))
                outcomes = stores[worker % 2].write(items)
                got = [o.position for o in outcomes if o.decision is Decision.ACCEPTED]
                assert len(got) == size and None not in got
                with guard:
                    positions.extend(p for p in got if p is not None)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    try:
        assert not errors, errors
        total = threads * batches * size
        assert sorted(positions) == list(range(1, total + 1))
        assert stores[0].high_water() == total
    finally:
        for instance in stores:
            instance.close()


@pytest.mark.servers
def test_postgres_unreachable_is_dependency_unavailable() -> None:
    from ingest.adapters.postgres_store import PostgresRecordStore

    with pytest.raises(DependencyUnavailable) as caught:
        PostgresRecordStore("postgresql://postgres@127.0.0.1:1/none")
    assert caught.value.details["dependency"] == "postgres"


def test_heads_name_the_newest_revision_tombstones_included(store: RecordStore) -> None:
    store.write([rec("a", 1), rec("b", 1)])
    store.write([rec("a", 2), rec("b", 2, deleted=True)])
    a, b = rec("a", 1).doc_id, rec("b", 1).doc_id
    heads = {h.document_id: h for h in store.heads([a, b, "unknown"])}
    assert set(heads) == {a, b}
    assert (heads[a].revision, heads[a].deleted) == (2, False)
    assert (heads[b].revision, heads[b].deleted) == (2, True)
    assert heads[a].item_id == "a" and heads[a].snapshot_kind == "objects"
    assert store.heads([]) == []


def test_hostile_namespaces_round_trip(store: RecordStore) -> None:
    records = [
        Record(namespace=ns, snapshot_kind="objects", item_id="same", revision=1)
        for ns in ("ns", *HOSTILE_NAMESPACES)
    ]
    store.write(records)
    heads = {h.document_id: h for h in store.heads([r.doc_id for r in records])}
    assert {r.doc_id: r.namespace for r in records} == {
        doc_id: head.namespace for doc_id, head in heads.items()
    }


def _in(
    item: str, revision: int, *, galaxy: str = "default", kind: str = "objects", **kw: object
) -> Record:
    return Record.model_validate(
        {
            "namespace": "ns",
            "snapshot_kind": kind,
            "galaxy": galaxy,
            "item_id": item,
            "revision": revision,
            "payload": {"v": revision, "item": item},
            **kw,
        }
    )


def test_live_records_are_the_heads_of_one_scope_and_galaxy_in_item_order(
    store: RecordStore,
) -> None:
    store.write(
        [
            _in("b", 1, galaxy="g1", ring="x/y"),
            _in("a", 1, galaxy="g1", vector=[0.5, 0.25]),
            _in("c", 1, galaxy="g1"),
            _in("a", 1, galaxy="g2"),
            _in("a", 1, galaxy="g1", kind="archive"),
            _in("Z", 1, galaxy="g1"),
            _in("é", 1, galaxy="g1"),
        ]
    )
    store.write([_in("b", 2, galaxy="g1", ring="x/z"), _in("c", 2, galaxy="g1", deleted=True)])
    live = list(store.live_records("ns", "objects", "g1"))
    # Byte order of the UTF-8 item ids, in every store.
    assert [r.item_id for r in live] == ["Z", "a", "b", "é"]
    assert [r.revision for r in live] == [1, 1, 2, 1]
    assert live[2].ring == "x/z" and live[2].payload == {"v": 2, "item": "b"}
    assert live[1].vector == [0.5, 0.25]
    assert list(store.live_records("ns", "objects", "nope")) == []


def test_live_records_read_one_snapshot(store: RecordStore) -> None:
    store.write([_in(f"i{n:04d}", 1) for n in range(1_200)])
    reader = store.live_records("ns", "objects", "default")
    first = next(reader)
    # Writes committed while the iterator is open are not seen by it.
    store.write([_in("i0000", 2), _in("zzz", 1)])
    rest = list(reader)
    assert first.item_id == "i0000" and first.revision == 1
    assert len(rest) == 1_199 and all(r.revision == 1 for r in rest)
    assert rest[-1].item_id == "i1199"


def test_a_given_serialization_is_stored_for_its_own_record(store: RecordStore) -> None:
    store.write([rec("a", 2)])
    batch = [rec("a", 1), rec("b", 1), rec("c", 1)]
    # The first is stale: each accepted record still gets its own JSON (by index), and a
    # record without one is serialized by the store.
    stored_json = [batch[0].model_dump_json(), batch[1].model_dump_json(), None]
    outcomes = store.write(batch, stored_json=stored_json)
    assert [o.decision for o in outcomes] == [
        Decision.CONFLICT,
        Decision.ACCEPTED,
        Decision.ACCEPTED,
    ]
    live = {r.item_id: r for r in store.live_records("ns", "objects", "default")}
    assert live["b"] == batch[1] and live["c"] == batch[2]
    assert live["a"].revision == 2
