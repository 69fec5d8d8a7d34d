"""The `StoreMaintenance` port: the SQLite adapter (embedded and single-host layouts) and
the PostgreSQL one, which refuses and names PostgreSQL's tools."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, OrreryError
from contracts.records import Record
from ingest.adapters.postgres_maintenance import PostgresStoreMaintenance
from ingest.adapters.sqlite_maintenance import SqliteStoreMaintenance, sweep_backup_temps
from ingest.adapters.sqlite_store import SqliteRecordStore
from projector.adapters.sqlite_state import SqliteProjectorState


def rec(item: str, revision: int, deleted: bool = False) -> Record:
    return Record(
        namespace="ns",
        snapshot_kind="objects",
        item_id=item,
        revision=revision,
        deleted=deleted,
        payload={} if deleted else {"text": "x" * 2_000, "rev": revision},
    )


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "orrery.sqlite"
    store = SqliteRecordStore(path)
    SqliteProjectorState(path).close()  # the registry shares the file
    store.write([rec("a", 1), rec("b", 1), rec("c", 1)])
    store.write([rec("a", 2)])
    store.write([rec("a", 3), rec("c", 2, deleted=True)])
    store.close()
    yield path


def maintenance(db: Path) -> SqliteStoreMaintenance:
    return SqliteStoreMaintenance(db, db.parent / "backups", exclusive=nothing, log_is_outbox=True)


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return list(conn.execute(sql).fetchall())


def consume_to(db: Path, position: int, pinned: tuple[tuple[str, int], ...] = ()) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "INSERT OR REPLACE INTO projector_positions VALUES ('projector', ?, 'now')",
            (position,),
        )
        for item, revision in pinned:
            doc = rec(item, revision).doc_id
            conn.execute("INSERT INTO generation_documents VALUES ('g1', ?, ?, 0)", (doc, revision))


def test_compact_keeps_heads_listed_revisions_and_tombstones(db: Path) -> None:
    consume_to(db, 10, pinned=(("a", 2),))
    result = maintenance(db).compact()
    left = sorted(
        (item, rev, deleted)
        for item, rev, deleted in rows(db, "SELECT item_id, revision, deleted FROM records")
    )
    # a1 and c1 go; a2 stays (generation g1 lists it); c2 is c's tombstone.
    assert left == [("a", 2, 0), ("a", 3, 0), ("b", 1, 0), ("c", 2, 1)]
    assert (result.items, result.liveItems, result.tombstones) == (4, 2, 1)
    assert result.droppedRevisions == 2
    outbox = sorted(rows(db, "SELECT revision FROM outbox"))
    assert len(outbox) == 3  # the heads' rows: a3, b1, c2
    assert result.afterBytes < result.beforeBytes


def test_compact_keeps_what_the_log_has_not_passed(db: Path) -> None:
    consume_to(db, 3)  # positions 1-3 (a1, b1, c1) passed; a2, a3, c2 not yet
    result = maintenance(db).compact()
    left = sorted(rows(db, "SELECT item_id, revision FROM records"))
    # a2 is superseded but its event is still ahead of the projector: it stays.
    assert left == [("a", 2), ("a", 3), ("b", 1), ("c", 2)]
    assert result.droppedRevisions == 2  # a1, c1
    assert len(rows(db, "SELECT * FROM outbox WHERE position > 3")) == 3


def test_backup_verify_and_a_damaged_backup(db: Path) -> None:
    tool = maintenance(db)
    taken = tool.backup("b1")
    assert (taken.items, taken.liveItems) == (6, 2)
    assert tool.verify("b1").items == taken.items
    with pytest.raises(OrreryError) as exists:
        tool.backup("b1")
    assert exists.value.code is ErrorCode.INVALID_STATE
    copy = db.parent / "backups" / "b1" / "orrery.sqlite"
    data = bytearray(copy.read_bytes())
    data[-100] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(OrreryError) as damaged:
        tool.verify("b1")
    assert damaged.value.code is ErrorCode.INVALID_STATE
    with pytest.raises(OrreryError) as path:
        tool.verify("../b1")
    assert path.value.code is ErrorCode.INVALID_REQUEST


def _held(path: Path) -> int:
    """A directory locked as a running backup (of this or another process) holds it."""
    path.mkdir(parents=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_killed_backups_temp_dir_is_removed_and_a_running_one_is_409(db: Path) -> None:
    backups = db.parent / "backups"
    orphan = backups / ".nightly.tmp-0123456789ab"
    orphan.mkdir(parents=True)
    (orphan / "orrery.sqlite").write_bytes(b"half a copy")
    other_orphan = backups / ".weekly.tmp-ba9876543210"
    other_orphan.mkdir()
    running = _held(backups / ".hourly.tmp-00000000aaaa")
    try:
        # The next backup of any name removes what no backup holds, and leaves a
        # running backup's directory alone.
        assert maintenance(db).backup("nightly").name == "nightly"
        assert sorted(p.name for p in backups.iterdir()) == [".hourly.tmp-00000000aaaa", "nightly"]
        # A name whose backup is under way is 409 at once (was: a full copy, then 503
        # when the second rename hit the first one's directory).
        with pytest.raises(OrreryError) as busy:
            maintenance(db).backup("hourly")
        assert busy.value.code is ErrorCode.INVALID_STATE
        assert busy.value.details["in_progress"] is True
    finally:
        os.close(running)
    # Once its process is gone (the lock is released), it is an orphan: swept at start.
    sweep_backup_temps(backups)
    assert sorted(p.name for p in backups.iterdir()) == ["nightly"]
    assert maintenance(db).backup("hourly").name == "hourly"


def test_concurrent_backups_of_one_name_one_succeeds_the_others_are_409(db: Path) -> None:
    tool = maintenance(db)
    outcomes: list[str] = []

    def take() -> None:
        try:
            tool.backup("same")
            outcomes.append("ok")
        except OrreryError as exc:
            outcomes.append(exc.code.value)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["invalid_state"] * 5 + ["ok"]
    assert [p.name for p in (db.parent / "backups").iterdir()] == ["same"]
    assert tool.verify("same").verified is True


def test_postgres_store_maintenance_refuses_and_names_its_tools() -> None:
    tool = PostgresStoreMaintenance()
    for call in (lambda: tool.backup("x"), lambda: tool.verify("x"), tool.compact):
        with pytest.raises(OrreryError) as refused:
            call()
        assert refused.value.code is ErrorCode.INVALID_STATE
        assert "pg_dump" in refused.value.message
