"""Server mode with `ORRERY_DATABASE_URL`: `orrery db migrate`, and the ingest role on
PostgreSQL (migrated at start, refused when an applied migration was edited)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from contracts.errors import OrreryError
from ingest.adapters.postgres_store import PostgresRecordStore
from orrery.cli import app
from orrery.servers import Role, ServerStack
from query.settings import QuerySettings

pytestmark = pytest.mark.servers


def test_db_migrate_twice_then_refuses_an_edited_migration(postgres_url: str) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["db", "migrate", "--database-url", postgres_url])
    assert first.exit_code == 0, first.output
    for component in ("ingest", "projector", "query"):  # every set, from its first file on
        assert f"{component}: applied migrations [1" in first.output, first.output
    again = runner.invoke(app, ["db", "migrate", "--database-url", postgres_url])
    assert again.exit_code == 0 and "up to date" in again.output
    with psycopg.connect(postgres_url) as conn:  # as if 0001's file had been edited
        conn.execute("UPDATE orrery_migrations SET sha256 = 'edited' WHERE version = 1")
    refused = runner.invoke(app, ["db", "migrate", "--database-url", postgres_url])
    assert refused.exit_code == 1
    assert "was edited after it was applied" in refused.output


def test_ingest_role_writes_to_postgres(postgres_url: str, tmp_path: Path) -> None:
    settings = QuerySettings(mode="servers", data_dir=tmp_path, database_url=postgres_url)
    stack = ServerStack.open(settings, frozenset({Role.INGEST}))
    try:
        assert isinstance(stack.store, PostgresRecordStore)
        assert stack.app is not None
        body = {
            "records": [
                {
                    "namespace": "ns",
                    "snapshot_kind": "objects",
                    "item_id": f"i{i}",
                    "revision": 1,
                    "payload": {"title": f"t{i}"},
                }
                for i in range(3)
            ]
        }
        with TestClient(stack.app) as client:
            response = client.post("/v1/records", json=body)
        assert response.status_code == 200, response.text
        assert stack.store.high_water() == 3
    finally:
        stack.close()
    assert not (tmp_path / "orrery.sqlite").exists(), "no SQLite store beside Postgres"


def test_start_stops_on_an_edited_migration(postgres_url: str, tmp_path: Path) -> None:
    settings = QuerySettings(mode="servers", data_dir=tmp_path, database_url=postgres_url)
    ServerStack.open(settings, frozenset({Role.INGEST})).close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE orrery_migrations SET sha256 = 'edited' WHERE version = 1")
    with pytest.raises(OrreryError, match="edited"):
        ServerStack.open(settings, frozenset({Role.INGEST}))


def test_roles_refuse_settings_that_do_not_work_across_machines(tmp_path: Path) -> None:
    # Checked before anything connects: the database does not even exist.
    url = "postgresql://u@127.0.0.1:1/x"
    no_keys = QuerySettings(
        mode="servers", data_dir=tmp_path, database_url=url, qdrant_url="http://q:6333"
    )
    with pytest.raises(ValueError, match="ORRERY_CURSOR_KEYS"):
        ServerStack.open(no_keys, frozenset({Role.QUERY}))
    no_qdrant = QuerySettings(
        mode="servers",
        data_dir=tmp_path,
        database_url=url,
        qdrant_url=None,
        cursor_keys="k1:0123456789abcdef0123",
    )
    for role in (Role.PROJECTOR, Role.QUERY):
        with pytest.raises(ValueError, match="ORRERY_QDRANT_URL"):
            ServerStack.open(no_qdrant, frozenset({Role.INGEST, role}))
    assert list(tmp_path.iterdir()) == []
