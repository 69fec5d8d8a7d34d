"""PostgreSQL plumbing of the canonical store: connection pools, error translation and
versioned migrations with a checksummed ledger.

Migrations are the files `postgres_migrations/NNNN_name.sql` next to this module, applied
in version order. The ledger `orrery_migrations` records each applied file's version,
name and sha256 per `component` (this package's is `ingest`; other packages keep their
own component and files, so they never import each other). `migrate` runs in one
transaction under a transaction-level advisory lock: concurrent migrators apply each
file once, and a failed file leaves nothing behind (PostgreSQL DDL is transactional).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.migrations import Migration, migrations_from

__all__ = [
    "COMPONENT",
    "Migration",
    "MigrationMismatch",
    "MigrationReport",
    "PostgresListener",
    "driver_errors",
    "load_migrations",
    "migrate",
    "open_pool",
    "redact",
]

log = logging.getLogger("orrery.ingest")

COMPONENT = "ingest"
DEPENDENCY = "postgres"
# Key of the advisory lock every migrator takes (any fixed bigint; "orrery-m" in ASCII).
MIGRATION_LOCK_KEY = 0x6F72726572792D6D

LEDGER = """
CREATE TABLE IF NOT EXISTS orrery_migrations (
    component  TEXT        NOT NULL,
    version    INTEGER     NOT NULL,
    name       TEXT        NOT NULL,
    sha256     TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)
"""


class MigrationMismatch(OrreryError):
    """An applied migration's file changed (or vanished) since it was applied.

    Fatal by design: the process must not run against a schema its files no longer
    describe. Add a new migration instead of editing an applied one.
    """

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(ErrorCode.INTERNAL, message, details)


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What one `migrate` call did: the versions it applied and those already there."""

    applied: tuple[int, ...]
    already: tuple[int, ...]


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


def open_pool(url: str, *, max_size: int = 4, name: str = "orrery") -> ConnectionPool:
    """An open pool of `max_size` connections; raises `DependencyUnavailable` when the
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


def load_migrations(package: str = f"{__package__}.postgres_migrations") -> list[Migration]:
    """The migration files of `package`, in version order (versions must be unique)."""
    return migrations_from(resources.files(package).iterdir(), where=package)


def migrate(
    url: str, migrations: list[Migration] | None = None, *, component: str = COMPONENT
) -> MigrationReport:
    """Apply the pending migrations of `component`; verify the applied ones.

    Guarantees: one transaction under an advisory lock, so concurrent callers apply each
    migration exactly once and the later ones see it applied; calling it again is a
    no-op. Raises `MigrationMismatch` when an applied migration's checksum differs from
    its file (or the file is gone), before applying anything.
    """
    files = load_migrations() if migrations is None else migrations
    with (
        driver_errors(f"migrate {redact(url)}"),
        psycopg.connect(url, connect_timeout=10, application_name="orrery-migrate") as conn,
        conn.transaction(),
    ):
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(LEDGER)
        applied = {
            int(version): (str(name), str(digest))
            for version, name, digest in conn.execute(
                "SELECT version, name, sha256 FROM orrery_migrations WHERE component = %s",
                (component,),
            ).fetchall()
        }
        by_version = {m.version: m for m in files}
        for version, (name, digest) in sorted(applied.items()):
            current = by_version.get(version)
            if current is None or current.sha256 != digest:
                raise MigrationMismatch(
                    f"applied migration {component}/{version:04d}_{name} "
                    + ("is missing" if current is None else "was edited after it was applied")
                    + ": refusing to run (add a new migration instead)",
                    {
                        "component": component,
                        "version": version,
                        "applied_sha256": digest,
                        "file_sha256": None if current is None else current.sha256,
                    },
                )
        done: list[int] = []
        for migration in files:
            if migration.version in applied:
                continue
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO orrery_migrations (component, version, name, sha256) "
                "VALUES (%s, %s, %s, %s)",
                (component, migration.version, migration.name, migration.sha256),
            )
            done.append(migration.version)
    return MigrationReport(applied=tuple(done), already=tuple(sorted(applied)))


class PostgresListener:
    """Calls `on_notify()` for the notifications of one channel, from a daemon thread
    holding a connection of its own (`LISTEN channel`).

    Guarantees: while the connection holds, every committed transaction that notified
    `channel` is followed by at least one `on_notify()` call (PostgreSQL delivers a
    transaction's notifications after its commit, equal ones folded into one).
    Notifications sent while the thread is not connected are lost, so `on_notify()` is
    also called once after every (re)connection and once after a lost connection; a
    failed connection is retried after `retry_seconds`. `close()` stops the thread
    (within about `wait_seconds`) and closes its connection."""

    def __init__(
        self,
        url: str,
        channel: str,
        on_notify: Callable[[], None],
        *,
        name: str,
        wait_seconds: float = 0.5,
        retry_seconds: float = 1.0,
    ) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", channel):
            raise ValueError(f"not a plain channel name: {channel!r}")
        self._url = url
        self._channel = channel
        self._on_notify = on_notify
        self._name = name
        self._wait = wait_seconds
        self._retry = retry_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._wait + 5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._url, autocommit=True, connect_timeout=10, application_name=self._name
                ) as conn:
                    conn.execute(f"LISTEN {self._channel}".encode())
                    self._on_notify()  # whatever was committed before the LISTEN
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self._wait):
                            self._on_notify()
            except psycopg.Error as exc:
                log.warning(
                    "listening on channel %s failed (%s): polling meanwhile; retrying in %.1fs",
                    self._channel,
                    exc,
                    self._retry,
                )
                self._on_notify()
                self._stop.wait(self._retry)
