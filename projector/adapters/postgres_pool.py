"""PostgreSQL connections of the projector: a pool and the error translation.

The same few lines as `ingest.adapters.postgres_db` (the packages share no code); the
schema comes from the migrations, applied by the composition root before anything opens.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from contracts.errors import DependencyUnavailable

__all__ = ["DEPENDENCY", "driver_errors", "open_pool", "redact"]

DEPENDENCY = "postgres"


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


@contextmanager
def driver_errors(what: str) -> Iterator[None]:
    """Translate psycopg (and pool) errors into `DependencyUnavailable` (503)."""
    try:
        yield
    except psycopg.Error as exc:
        raise DependencyUnavailable(DEPENDENCY, f"{what}: {exc}".strip()) from exc


def open_pool(url: str, *, max_size: int = 4, name: str = "orrery-projector") -> ConnectionPool:
    """An open pool of up to `max_size` connections; `DependencyUnavailable` when the
    database does not answer within 10 s."""
    pool: ConnectionPool = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        name=name,
        timeout=30.0,
        open=False,
        kwargs={"connect_timeout": 10, "application_name": name},
    )
    try:
        pool.open(wait=True, timeout=10.0)
    except psycopg.Error as exc:
        pool.close()
        raise DependencyUnavailable(DEPENDENCY, f"cannot connect to {redact(url)}: {exc}") from exc
    return pool
