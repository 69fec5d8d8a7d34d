"""ChonkyDB async bulk jobs in PostgreSQL (server mode): every query worker on the
database sees every job, and finished jobs outlive restarts.

The table comes with the canonical store's migrations (`0003_chonkydb_jobs.sql`). One
connection per call: jobs are one row per async batch and a read per poll, and nothing
stays open for a process to close.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.types.json import Jsonb

from ingest.adapters.postgres_db import driver_errors
from ingest.ports import Job

__all__ = ["PostgresJobStore"]

_COLUMNS = "job_id, tenant, owner, status, items, result_json, error, document_ids, updated_at"
# Serialises `put`s of one tenant (their `seq`); any fixed key space apart from others.
_LOCK_SPACE = 0x6A6F6273  # "jobs"


class PostgresJobStore:
    """`JobStore` on PostgreSQL."""

    def __init__(self, url: str) -> None:
        self._url = url

    @contextmanager
    def _connect(self) -> Iterator[psycopg.Connection]:
        with (
            driver_errors("job store"),
            psycopg.connect(
                self._url, connect_timeout=10, application_name="orrery-jobs", autocommit=True
            ) as conn,
        ):
            yield conn

    def put(self, job: Job, *, history: int) -> None:
        with self._connect() as conn, conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_SPACE, job.tenant)
            )
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM chonkydb_jobs WHERE tenant = %s",
                (job.tenant,),
            ).fetchone()
            seq = int(row[0]) if row is not None else 1
            conn.execute(
                f"INSERT INTO chonkydb_jobs ({_COLUMNS}, seq) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    job.job_id,
                    job.tenant,
                    job.owner,
                    job.status,
                    job.items,
                    None if job.result is None else Jsonb(job.result),
                    job.error,
                    Jsonb(list(job.document_ids)),
                    job.updated_at,
                    seq,
                ),
            )
            conn.execute(
                "DELETE FROM chonkydb_jobs WHERE tenant = %s AND seq <= %s",
                (job.tenant, seq - history),
            )

    def finish(self, job: Job) -> None:
        with self._connect() as conn:
            conn.execute(
                "UPDATE chonkydb_jobs SET status = %s, result_json = %s, error = %s, "
                "document_ids = %s, updated_at = %s WHERE job_id = %s",
                (
                    job.status,
                    None if job.result is None else Jsonb(job.result),
                    job.error,
                    Jsonb(list(job.document_ids)),
                    job.updated_at,
                    job.job_id,
                ),
            )

    def get(self, job_id: str) -> Job | None:
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM chonkydb_jobs WHERE job_id = %s", (job_id,)
            ).fetchone()
        if row is None:
            return None
        job_id, tenant, owner, status, items, result, error, document_ids, updated_at = row
        return Job(
            job_id=str(job_id),
            tenant=str(tenant),
            owner=str(owner),
            status=str(status),
            items=int(items),
            result=None if result is None else _mapping(result),
            error=error,
            document_ids=tuple(str(d) for d in document_ids),
            updated_at=float(updated_at),
        )

    def close(self) -> None:
        """Nothing stays open between calls."""


def _mapping(value: object) -> dict[str, object]:
    loaded = json.loads(value) if isinstance(value, str) else value
    assert isinstance(loaded, dict)
    return loaded
