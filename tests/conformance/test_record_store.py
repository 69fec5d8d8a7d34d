"""Conformance suite of the `RecordStore` port (ingest)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts.records import Record
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.model import Decision
from ingest.ports import RecordStore

FACTORIES: dict[str, Callable[[Path], RecordStore]] = {
    "sqlite": lambda tmp: SqliteRecordStore(tmp / "orrery.sqlite"),
}


@pytest.fixture(params=sorted(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordStore]:
    instance = FACTORIES[request.param](tmp_path)
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
