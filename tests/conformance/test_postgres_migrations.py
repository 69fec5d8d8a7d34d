"""The PostgreSQL migration ledger (`ingest.adapters.postgres_db.migrate`).

PostgreSQL only: SQLite creates its schema with `CREATE … IF NOT EXISTS` at open.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from contracts.errors import DependencyUnavailable
from ingest.adapters.postgres_db import (
    Migration,
    MigrationMismatch,
    MigrationReport,
    load_migrations,
    migrate,
)

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[2]


def ledger(url: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT component, version, sha256 FROM orrery_migrations ORDER BY 1, 2"
        ).fetchall()
    return [(str(c), int(v), str(s)) for c, v, s in rows]


def test_files_are_numbered_and_loaded_in_order() -> None:
    files = load_migrations()
    assert [m.version for m in files] == list(range(1, len(files) + 1))
    assert files[0].name == "canonical_store"


def test_migrate_twice_is_a_no_op(postgres_url: str) -> None:
    first = migrate(postgres_url)
    assert first.applied == tuple(m.version for m in load_migrations())
    before = ledger(postgres_url)
    second = migrate(postgres_url)
    assert second == MigrationReport(applied=(), already=first.applied)
    assert ledger(postgres_url) == before


def test_two_concurrent_migrators_apply_once(postgres_url: str) -> None:
    """Two processes at once: the advisory lock makes the second wait and find it done."""
    script = (
        "import sys; from ingest.adapters.postgres_db import migrate; "
        "print(len(migrate(sys.argv[1]).applied))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, postgres_url],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
        for _ in range(2)
    ]
    counts = sorted(int(proc.communicate(timeout=60)[0]) for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert counts == [0, len(load_migrations())]
    assert len(ledger(postgres_url)) == len(load_migrations())


def test_concurrent_threads_apply_once(postgres_url: str) -> None:
    reports: list[MigrationReport] = []
    threads = [
        threading.Thread(target=lambda: reports.append(migrate(postgres_url))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(len(r.applied) for r in reports) == len(load_migrations())


def test_an_edited_applied_migration_stops_everything(postgres_url: str) -> None:
    files = [Migration(1, "one", "CREATE TABLE t1 (x int)")]
    migrate(postgres_url, files, component="test")
    edited = [
        Migration(1, "one", "CREATE TABLE t1 (x bigint)"),
        Migration(2, "two", "CREATE TABLE t2 (x int)"),
    ]
    with pytest.raises(MigrationMismatch) as caught:
        migrate(postgres_url, edited, component="test")
    assert caught.value.details["version"] == 1
    assert "edited" in caught.value.message
    with pytest.raises(MigrationMismatch, match="missing"):
        migrate(postgres_url, [], component="test")
    with psycopg.connect(postgres_url) as conn:  # nothing of migration 2 was applied
        assert conn.execute("SELECT to_regclass('t2')").fetchone() == (None,)


def test_a_failing_migration_leaves_nothing_behind(postgres_url: str) -> None:
    files = [
        Migration(1, "one", "CREATE TABLE t1 (x int)"),
        Migration(2, "two", "CREATE TABLE t2 (x int); SELECT no_such_function()"),
    ]
    with pytest.raises(DependencyUnavailable):
        migrate(postgres_url, files, component="test")
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('t1')").fetchone() == (None,)
    assert migrate(postgres_url, files[:1], component="test").applied == (1,)


def test_each_package_keeps_its_own_migration_set_in_one_ledger(postgres_url: str) -> None:
    from projector.adapters.postgres_migrations import COMPONENT, migrations

    projector_files = migrations()
    assert [m.version for m in projector_files] == list(range(1, len(projector_files) + 1))
    migrate(postgres_url)
    first = migrate(postgres_url, projector_files, component=COMPONENT)
    assert first.applied == tuple(m.version for m in projector_files)
    # The ingest set is untouched by the projector's, and both are no-ops the second time.
    assert migrate(postgres_url).applied == ()
    assert migrate(postgres_url, projector_files, component=COMPONENT).applied == ()
    components = {c for c, _, _ in ledger(postgres_url)}
    assert components == {"ingest", COMPONENT}


def test_a_server_start_migrates_every_set_including_the_query_workers(postgres_url: str) -> None:
    """`migrate_all` (every start, `orrery db migrate`): ingest, the projector (registry
    and ring statistics) and the query workers (the KoutenDB store), each its own
    component in the ledger."""
    from orrery.servers import migrate_all
    from projector.adapters.postgres_migrations import migrations as projector_files
    from query.adapters.postgres_migrations import migrations as query_files

    first = migrate_all(postgres_url)
    assert first["projector"] == (tuple(m.version for m in projector_files()), ())
    assert first["query"] == (tuple(m.version for m in query_files()), ())
    assert all(applied == () for applied, _ in migrate_all(postgres_url).values())
    assert {c for c, _, _ in ledger(postgres_url)} == {"ingest", "projector", "query"}
    with psycopg.connect(postgres_url) as conn:
        for table in ("ring_members", "ring_stats", "kouten_profiles", "kouten_envelopes"):
            assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (table,)


def test_record_json_is_lz4_compressed(postgres_url: str) -> None:
    """Migration 0002: the two columns that hold every record's JSON use lz4 (cheaper to
    write than pglz) on a server built with it, as the harness's Debian PostgreSQL is."""
    migrate(postgres_url)
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT attrelid::regclass::text, attname, attcompression FROM pg_attribute "
            "WHERE (attrelid, attname) IN (('records'::regclass, 'record_json'), "
            "('outbox'::regclass, 'own_event_json')) ORDER BY 1"
        ).fetchall()
    # 0007 renamed the outbox's column; its compression stays.
    assert rows == [("outbox", "own_event_json", "l"), ("records", "record_json", "l")]


def test_the_outbox_pointer_migration_keeps_the_rows_it_finds(postgres_url: str) -> None:
    """Migration 0007 on an outbox with rows in it: a row written before holds its whole
    event and is relayed as written, beside a row written after (which points at its
    record row); a relay or ingest API from before the migration fails closed (its
    column is gone) instead of publishing an empty event."""
    from contracts.events import RecordChanged
    from contracts.records import Record
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore
    from ingest.model import stored_columns

    files = load_migrations()
    assert files[6].name == "outbox_event_is_record"
    migrate(postgres_url, files[:6])
    old = Record(namespace="ns", snapshot_kind="objects", item_id="old", revision=1)
    body = old.model_dump_json()
    event = RecordChanged(record=old).model_dump_json()
    with psycopg.connect(postgres_url) as conn:  # what the store wrote before 0007
        conn.execute(
            "INSERT INTO records VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s, now())",
            (*stored_columns(old), body),
        )
        conn.execute(
            "INSERT INTO outbox (position, document_id, revision, namespace, snapshot_kind, "
            "event_json, created_at) VALUES (1, %s, 1, 'ns', 'objects', %s, now())",
            (old.doc_id, event),
        )
        conn.execute("UPDATE outbox_counter SET position = 1")
    assert migrate(postgres_url, files[:7]).applied == (7,)
    assert migrate(postgres_url).applied == tuple(m.version for m in files[7:])
    store, reader = PostgresRecordStore(postgres_url), PostgresOutboxReader(postgres_url)
    try:
        new = Record(namespace="ns", snapshot_kind="objects", item_id="new", revision=1)
        assert [o.position for o in store.write([new])] == [2]
        rows = reader.unpublished(10)
        assert [(r.position, r.event_json) for r in rows] == [
            (1, event),
            (2, RecordChanged(record=new).model_dump_json()),
        ]
        reader.mark_published([1, 2])
    finally:
        store.close()
        reader.close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(
            "SELECT position, own_event_json FROM outbox ORDER BY position"
        ).fetchall() == [(1, event), (2, "")]
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT event_json FROM outbox")


def test_the_vector_bytes_migration_keeps_the_rows_it_finds(postgres_url: str) -> None:
    """Migration 0008 on a store with rows in it: a record written before has no float32
    bytes and its event is relayed without them (the projector decodes its decimals, the
    same event); a record written after carries them; the column is never compressed."""
    from contracts.events import RecordChanged, decode_record_changed
    from contracts.records import Record
    from contracts.stored_vectors import PackedVector, StoredVector, float32_wire
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader
    from ingest.adapters.postgres_store import PostgresRecordStore
    from ingest.model import stored_columns

    files = load_migrations()
    assert files[7].name == "record_vector_f32"
    migrate(postgres_url, files[:7])
    old = Record(
        namespace="ns", snapshot_kind="objects", item_id="old", revision=1, vector=[0.5, -0.25]
    )
    with psycopg.connect(postgres_url) as conn:  # what the store wrote before 0008
        conn.execute(
            "INSERT INTO records VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s, now())",
            (*stored_columns(old), old.model_dump_json()),
        )
        conn.execute(
            "INSERT INTO outbox (position, document_id, revision, namespace, snapshot_kind, "
            "own_event_json, created_at) VALUES (1, %s, 1, 'ns', 'objects', '', now())",
            (old.doc_id,),
        )
        conn.execute("UPDATE outbox_counter SET position = 1")
    assert migrate(postgres_url, files[:8]).applied == (8,)
    assert migrate(postgres_url).applied == tuple(range(9, len(files) + 1))  # the later ones
    store, reader = PostgresRecordStore(postgres_url), PostgresOutboxReader(postgres_url)
    try:
        new = Record(
            namespace="ns", snapshot_kind="objects", item_id="new", revision=1, vector=[1.0, 2.0]
        )
        assert [o.position for o in store.write([new])] == [2]
        rows = reader.unpublished(10)
        assert [(r.position, r.vector_f32) for r in rows] == [
            (1, None),
            (2, float32_wire([1.0, 2.0])),
        ]
        decoded = [decode_record_changed(r.event_json.encode(), r.vector_f32) for r in rows]
        assert decoded == [RecordChanged(record=old), RecordChanged(record=new)]
        assert isinstance(decoded[0].record.vector, StoredVector)
        assert isinstance(decoded[1].record.vector, PackedVector)
        reader.mark_published([1, 2])
    finally:
        store.close()
        reader.close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = 'records'::regclass "
            "AND attname = 'vector_f32'"
        ).fetchone() == ("e",)
