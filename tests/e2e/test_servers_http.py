"""End to end in server mode: real Kafka, OpenSearch, Qdrant and Redis (local harness).

The same corpus gives the same answers as the embedded deployment.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.digests import id_set_digest
from tests.conftest import require_server, run_tag, session_database
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_embedded_http import CORPUS, NS, SCOPE, rec

pytestmark = [pytest.mark.servers, pytest.mark.slow]

QUERIES: list[dict[str, Any]] = [
    {"query_text": "Reading glasses"},
    {"query_text": "Wo stand früher meine rote Thermoskanne?"},
    {"query_text": "where are the spare house keys"},
    {"query_text": "umbrella car boot", "filters": {"status": ["active", "candidate"]}},
    {"query_text": "garden hose", "filters": {"galaxy": "anna"}},
    {"query_text": "", "filters": {"status": ["candidate", "superseded"]}},
]


# Every server-mode query worker on PostgreSQL must verify the others' cursors.
CURSOR_KEYS = "e2e:server-mode-e2e-secret-01"


def server_env(tag: str, *, database: bool = True, **overrides: str) -> dict[str, str]:
    """Environment of a server-mode process: harness URLs, names unique to this run, and
    (unless `database` is False: the single-host SQLite file under data_dir) a PostgreSQL
    database of its own that lives until the session ends."""
    env = {
        "ORRERY_MODE": "servers",
        "ORRERY_KAFKA_BOOTSTRAP": require_server("kafka"),
        "ORRERY_OPENSEARCH_URL": require_server("opensearch"),
        "ORRERY_QDRANT_URL": require_server("qdrant"),
        "ORRERY_REDIS_URL": require_server("redis"),
        "ORRERY_KAFKA_TOPIC_PREFIX": f"orrery-test-{tag}.records",
        "ORRERY_KAFKA_GROUP": f"orrery-test-{tag}",
        "ORRERY_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "ORRERY_KAFKA_JOIN_TIMEOUT_MS": "20000",
        "ORRERY_OPENSEARCH_INDEX_PREFIX": f"orrery-test-{tag}",
        "ORRERY_QDRANT_COLLECTION_PREFIX": f"orrery-test-{tag}",
        "ORRERY_OPENSEARCH_REFRESH_INTERVAL": "100ms",
    }
    if database:
        env["ORRERY_DATABASE_URL"] = session_database()
        env["ORRERY_CURSOR_KEYS"] = CURSOR_KEYS
    env.update(overrides)
    return env


def top_ids(server: Server, **query: Any) -> list[str]:
    response = server.topk(namespace=NS, scope_ref=SCOPE, result_limit=3, **query)
    assert response.status_code == 200, response.text
    return [r["item_id"] for r in response.json()["results"]]


EXPECTED = {(NS, "objects"): len(CORPUS)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    tag = run_tag()
    servers = start_server(tmp_path_factory.mktemp("servers") / "data", env=server_env(tag))
    embedded = start_server(tmp_path_factory.mktemp("embedded") / "data")
    try:
        for srv in (servers, embedded):
            assert srv.post_records(CORPUS).status_code == 200
        for srv in (servers, embedded):
            srv.wait_projected(timeout=120, documents=EXPECTED)
        yield servers, embedded
    finally:
        servers.stop()
        embedded.stop()


def test_same_answers_as_embedded(pair: tuple[Server, Server]) -> None:
    servers, embedded = pair
    for query in QUERIES:
        assert top_ids(servers, **query) == top_ids(embedded, **query), query


def test_plan_names_server_indexes_and_redis_cache(pair: tuple[Server, Server]) -> None:
    servers, _ = pair
    body = {
        "namespace": NS,
        "scope_ref": SCOPE,
        "query_text": "blue case nightstand",
        "result_limit": 2,
    }
    first = servers.topk(**body).json()
    second = servers.topk(**body).json()
    assert first["query_plan"]["cache"] in {"miss", "hit"}
    assert second["query_plan"]["cache"] == "hit"
    assert second["results"] == first["results"]
    ready = servers.client.get("/v1/readiness").json()
    assert ready["mode"] == "servers"
    assert ready["projector"]["running"] and ready["relay"]["running"]


def test_writes_flow_through_kafka(pair: tuple[Server, Server]) -> None:
    servers, _ = pair
    assert (
        servers.post_records(
            [
                rec(
                    "fact:kafka-flow",
                    title="Bicycle pump",
                    body="The bicycle pump hangs in the garage.",
                )
            ]
        ).status_code
        == 200
    )
    servers.wait_projected(timeout=60, documents={(NS, "objects"): len(CORPUS) + 1})
    assert top_ids(servers, query_text="bicycle pump garage")[0] == "fact:kafka-flow"


def test_redis_down_answers_uncached(tmp_path: Path) -> None:
    tag = run_tag()
    srv = start_server(
        tmp_path / "data", env=server_env(tag, ORRERY_REDIS_URL="redis://127.0.0.1:1/0")
    )
    try:
        assert srv.post_records(CORPUS).status_code == 200
        srv.wait_projected(timeout=120, documents=EXPECTED)
        for _ in range(2):
            body = srv.topk(namespace=NS, scope_ref=SCOPE, query_text="house keys").json()
            assert body["results"][0]["item_id"] == "fact:keys"
            assert body["query_plan"]["cache"] == "unavailable"
    finally:
        srv.stop()


def _spawn(
    command: list[str], data_dir: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "orrery.cli", *command, "--data-dir", str(data_dir)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )


def _canonical_digest(data_dir: Path) -> tuple[int, str]:
    with sqlite3.connect(data_dir / "orrery.sqlite") as conn:
        rows = conn.execute(
            "SELECT document_id, revision FROM heads WHERE namespace = ? AND "
            "snapshot_kind = 'objects' AND deleted = 0",
            (NS,),
        ).fetchall()
    return len(rows), id_set_digest((str(d), int(r)) for d, r in rows)


def test_separate_processes_and_projector_crash(tmp_path: Path) -> None:
    """ingest-api, relay and projector+query as separate processes of one host sharing
    the SQLite file under data_dir (server mode without ORRERY_DATABASE_URL); SIGKILL the
    projector mid-stream, restart it, and the engines' ID sets equal the store's."""
    tag = run_tag()
    env = server_env(tag, database=False, ORRERY_PROJECTOR_BATCH_SIZE="50")
    data_dir = tmp_path / "data"
    ingest = start_server(data_dir, env=env, command="ingest-api")
    relay = _spawn(["relay"], data_dir, env, tmp_path / "relay.log")
    worker = start_server(data_dir, "--roles", "projector,query", env=env)
    try:
        batch = [
            rec(f"fact:bulk-{i}", title=f"bulk item {i}", body=f"bulk body number {i}")
            for i in range(600)
        ]
        for start in range(0, len(batch), 200):
            assert ingest.post_records(batch[start : start + 200]).status_code == 200
        deletes = []
        for i in range(0, 600, 7):
            tombstone = rec(f"fact:bulk-{i}", 2, title="")
            tombstone["deleted"] = True
            deletes.append(tombstone)
        assert ingest.post_records(deletes).status_code == 200
        time.sleep(1.5)  # let the projector get part of the way, then kill it hard
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(timeout=30)
        worker.client.close()
        expected_count, expected_digest = _canonical_digest(data_dir)
        worker = start_server(data_dir, "--roles", "projector,query", env=env)
        worker.wait_projected(timeout=180, documents={(NS, "objects"): expected_count})
        result = top_ids(worker, query_text="bulk item 1")
        assert result and all(r.startswith("fact:bulk-") for r in result)
        generation = worker.client.get("/v1/readiness").json()["scopes"][0]["generation_id"]
        worker.stop()
        from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
        from projector.adapters.qdrant_vectors import QdrantServerVectorIndex

        lexical = OpenSearchLexicalIndex(
            require_server("opensearch"), index_prefix=f"orrery-test-{tag}"
        )
        vectors = QdrantServerVectorIndex(
            url=require_server("qdrant"), collection_prefix=f"orrery-test-{tag}"
        )
        try:
            for evidence in (lexical.evidence(generation), vectors.evidence(generation)):
                assert evidence.document_count == expected_count
                assert evidence.id_set_digest == expected_digest
        finally:
            lexical.drop(generation)
            lexical.close()
            vectors.close()
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        ingest.stop()
        if worker.process.poll() is None:
            worker.stop()
