"""ChonkyDB async bulk jobs in a SQLite file (embedded, and server mode on one host).

Every worker of the host opens the same file, so a job accepted by one is answered by
any; the file outlives restarts. One connection per call: jobs are few (one row per
async batch, a read per poll) and nothing stays open between them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.errors import DependencyUnavailable
from ingest.ports import Job

__all__ = ["SqliteJobStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chonkydb_jobs (
    job_id       TEXT PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    owner        TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    items        INTEGER NOT NULL,
    result_json  TEXT,
    error        TEXT,
    document_ids TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    updated_at   REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS chonkydb_jobs_tenant ON chonkydb_jobs (tenant, seq);
"""
_COLUMNS = "job_id, tenant, owner, status, items, result_json, error, document_ids, updated_at"


class SqliteJobStore:
    """`JobStore` on a SQLite file (WAL, busy timeout: several processes share it)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self._path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"job store: {exc}") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            yield conn
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"job store: {exc}") from exc
        finally:
            conn.close()

    def put(self, job: Job, *, history: int) -> None:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            seq = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM chonkydb_jobs WHERE tenant = ?",
                (job.tenant,),
            ).fetchone()[0]
            conn.execute(
                f"INSERT INTO chonkydb_jobs ({_COLUMNS}, seq) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (*_row(job), seq),
            )
            conn.execute(
                "DELETE FROM chonkydb_jobs WHERE tenant = ? AND seq <= ?",
                (job.tenant, seq - history),
            )
            conn.execute("COMMIT")

    def finish(self, job: Job) -> None:
        with self._connect() as conn:
            conn.execute(
                "UPDATE chonkydb_jobs SET status = ?, result_json = ?, error = ?, "
                "document_ids = ?, updated_at = ? WHERE job_id = ?",
                _outcome(job),
            )

    def get(self, job_id: str) -> Job | None:
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM chonkydb_jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
        return None if row is None else _job(row)

    def close(self) -> None:
        """Nothing stays open between calls."""


def _row(job: Job) -> tuple[object, ...]:
    return (
        job.job_id,
        job.tenant,
        job.owner,
        job.status,
        job.items,
        None if job.result is None else json.dumps(job.result),
        job.error,
        json.dumps(list(job.document_ids)),
        job.updated_at,
    )


def _outcome(job: Job) -> tuple[object, ...]:
    return (
        job.status,
        None if job.result is None else json.dumps(job.result),
        job.error,
        json.dumps(list(job.document_ids)),
        job.updated_at,
        job.job_id,
    )


def _job(row: tuple[object, ...]) -> Job:
    job_id, tenant, owner, status, items, result_json, error, document_ids, updated_at = row
    return Job(
        job_id=str(job_id),
        tenant=str(tenant),
        owner=str(owner),
        status=str(status),
        items=int(str(items)),
        result=None if result_json is None else json.loads(str(result_json)),
        error=None if error is None else str(error),
        document_ids=tuple(json.loads(str(document_ids))),
        updated_at=float(str(updated_at)),
    )
