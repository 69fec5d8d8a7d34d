"""The `JobStore` port (ChonkyDB's async bulk jobs), one suite for every adapter: SQLite
(embedded, one host) and PostgreSQL (server mode). Each test opens a second store on the
same database, as another worker (or a restarted one) would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.adapters.sqlite_jobs import SqliteJobStore
from ingest.entrypoints.chonkydb_http import JOB_HISTORY
from ingest.ports import Job, JobStore


def _sqlite(request: pytest.FixtureRequest, tmp: Path) -> Callable[[], JobStore]:
    return lambda: SqliteJobStore(tmp / "chonkydb_jobs.sqlite")


def _postgres(request: pytest.FixtureRequest, tmp: Path) -> Callable[[], JobStore]:
    from ingest.adapters.postgres_db import migrate
    from ingest.adapters.postgres_jobs import PostgresJobStore

    url: str = request.getfixturevalue("postgres_url")
    migrate(url)
    return lambda: PostgresJobStore(url)


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Callable[[], JobStore]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(FACTORIES)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], JobStore]:
    return FACTORIES[request.param](request, tmp_path)


def job(job_id: str, tenant: str = "tenant-a", **fields: object) -> Job:
    values: dict[str, object] = {
        "job_id": job_id,
        "tenant": tenant,
        "owner": f"{tenant}\x1f",
        "status": "accepted",
        "items": 2,
        "updated_at": 1_000.0,
    }
    values.update(fields)
    return Job(**values)  # type: ignore[arg-type]


def test_a_job_put_by_one_worker_is_read_and_finished_by_another(
    opener: Callable[[], JobStore],
) -> None:
    first, second = opener(), opener()
    first.put(job("job-1"), history=JOB_HISTORY)
    assert second.get("job-1") == job("job-1")
    result = {"success": True, "items": [{"document_id": "d1"}, {"document_id": "d2"}]}
    done = job("job-1", status="done", result=result, document_ids=("d1", "d2"), updated_at=1_001.5)
    second.finish(done)
    assert first.get("job-1") == done
    failed = job("job-1", status="failed", error="invalid_request: no", updated_at=1_002.0)
    first.finish(failed)
    assert second.get("job-1") == failed
    assert first.get("job-unknown") is None
    first.close()
    second.close()


def test_finished_jobs_outlive_a_restart(opener: Callable[[], JobStore]) -> None:
    store = opener()
    store.put(job("job-r"), history=JOB_HISTORY)
    store.finish(job("job-r", status="done", document_ids=("d9",), result={"count": 1}))
    store.close()
    again = opener()
    out = again.get("job-r")
    assert out is not None and out.status == "done" and out.document_ids == ("d9",)
    again.close()


def test_history_is_bounded_per_tenant_and_never_evicts_another(
    opener: Callable[[], JobStore],
) -> None:
    store = opener()
    store.put(job("job-b", tenant="tenant-b"), history=JOB_HISTORY)
    for n in range(JOB_HISTORY + 1):
        store.put(job(f"job-a-{n}"), history=JOB_HISTORY)
    # Tenant a's oldest went, its newest 1,024 stay; tenant b's one job is untouched.
    assert store.get("job-a-0") is None
    assert store.get("job-a-1") is not None
    assert store.get(f"job-a-{JOB_HISTORY}") is not None
    assert store.get("job-b") == job("job-b", tenant="tenant-b")
    store.close()
