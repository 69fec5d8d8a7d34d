"""ChonkyDB async bulk jobs across workers: two `orrery ingest-api` processes on one
PostgreSQL (server mode). A job accepted by one is answered by the other, survives the
accepting worker's restart, and stays its tenant's: another key gets `404 unknown_job`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.records import derive_document_id
from tests.conftest import run_tag
from tests.e2e.conftest import start_server
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow, pytest.mark.servers]

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


def _item(namespace: str, memory_id: str) -> dict[str, Any]:
    return {
        "payload": {"memory_id": memory_id, "summary": f"note {memory_id}"},
        "metadata": {"twinr_namespace": namespace, "twinr_snapshot_kind": "objects"},
        "content": f"note {memory_id}",
    }


def _done(client: httpx.Client, job_id: str, key: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        answer = client.get(f"/v1/external/jobs/{job_id}", headers={"x-api-key": key})
        assert answer.status_code == 200, answer.text
        job: dict[str, Any] = answer.json()
        if job["status"] not in ("accepted", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def test_a_job_accepted_by_one_worker_is_answered_by_another(tmp_path: Path) -> None:
    env = server_env(run_tag(), ORRERY_API_KEYS=",".join(f"{k}={n}" for k, n in KEYS.items()))
    for worker in ("a", "b"):
        (tmp_path / worker).mkdir()
    first = start_server(tmp_path / "a" / "data", env=env, command="ingest-api")
    second = start_server(tmp_path / "b" / "data", env=env, command="ingest-api")
    try:
        accepted = first.client.post(
            "/v1/external/records/bulk",
            json={
                "execution_mode": "async",
                "items": [_item("tenant-a", "fact:one"), _item("tenant-a", "fact:two")],
            },
            headers={"x-api-key": "key-a"},
        )
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]

        job = _done(second.client, job_id, "key-a")
        assert job["status"] == "done", job
        assert job["document_ids"] == [
            derive_document_id("tenant-a", "objects", "fact:one"),
            derive_document_id("tenant-a", "objects", "fact:two"),
        ]
        assert job["result"]["succeeded"] == 2

        # Another tenant's key: as unknown as a job that never was.
        other = second.client.get(f"/v1/external/jobs/{job_id}", headers={"x-api-key": "key-b"})
        assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_job"

        # The accepting worker restarts: the finished job is still answered, by both.
        first.stop()
        first = start_server(tmp_path / "a" / "data", env=env, command="ingest-api")
        for worker in (first, second):
            again = worker.client.get(f"/v1/external/jobs/{job_id}", headers={"x-api-key": "key-a"})
            assert again.status_code == 200 and again.json()["status"] == "done"
    finally:
        first.stop()
        second.stop()
