"""KoutenDB search profiles and kept envelopes in SQLite (`DATA_DIR/koutendb.sqlite`).

Its own file, not the registry: query workers write here (profiles, envelopes,
feedback), and the registry is the projector's. One file per host: the query workers
of a host share profiles and envelopes through it (docs/koutendb.md).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from contracts.errors import DependencyUnavailable
from query.ports import KeptEnvelope, StoredProfile

__all__ = ["PRUNE_EVERY", "SqliteKoutenStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kouten_profiles (
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    amount    TEXT NOT NULL,
    scope     TEXT NOT NULL,
    depth     TEXT NOT NULL,
    note      TEXT NOT NULL,
    PRIMARY KEY (namespace, name)
);
"""
# Envelopes are keyed per tenant: the same request id in two namespaces (or two galaxies
# of one) names two envelopes. Files written before that had `request_id` alone as the
# key; `_migrate_envelopes` rebuilds their table in this layout, rows kept.
_ENVELOPES = """
CREATE TABLE IF NOT EXISTS kouten_envelopes (
    namespace   TEXT NOT NULL,
    galaxy      TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    base_ring   TEXT NOT NULL,
    profile     TEXT NOT NULL,
    budget      INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    chunks_json TEXT NOT NULL,
    used_json   TEXT,
    ignored_json TEXT,
    PRIMARY KEY (namespace, galaxy, request_id)
);
CREATE INDEX IF NOT EXISTS kouten_envelopes_by_galaxy
    ON kouten_envelopes (namespace, galaxy, created_at);
CREATE INDEX IF NOT EXISTS kouten_envelopes_by_age ON kouten_envelopes (created_at);
CREATE INDEX IF NOT EXISTS kouten_envelopes_by_request ON kouten_envelopes (namespace, request_id);
"""
# Keeps between two prunes of one (namespace, galaxy) down to its bound: a prune walks
# the bound's worth of index entries, so it runs once per this many keeps.
PRUNE_EVERY = 256

_COLUMNS = (
    "request_id, namespace, galaxy, base_ring, profile, budget, created_at, chunks_json, "
    "used_json, ignored_json"
)


class SqliteKoutenStore:
    """`SearchProfiles` and `EnvelopeLog` in one SQLite file (WAL; thread-safe).

    Envelopes older than a day are deleted whenever one is kept, so the table holds
    about one day of requests; each (namespace, galaxy) holds at most `max_per_galaxy`
    of them (plus at most `PRUNE_EVERY` per process between two prunes)."""

    def __init__(
        self,
        path: Path,
        *,
        retention_seconds: float = 86_400.0,
        max_per_galaxy: int = 100_000,
    ) -> None:
        self._lock = threading.RLock()
        self._retention = retention_seconds
        self._max_per_galaxy = max_per_galaxy
        self._since_prune: dict[tuple[str, str], int] = {}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            # No fsync per kept envelope (one per request): WAL with NORMAL survives a
            # process crash; a power loss may lose the last envelopes, which are advisory.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
            _migrate_envelopes(self._conn)
            self._conn.executescript(_ENVELOPES)
        except sqlite3.Error as exc:
            raise DependencyUnavailable("sqlite", f"cannot open {path}: {exc}") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", str(exc)) from exc

    def _rows(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        with self._lock:
            try:
                return list(self._conn.execute(sql, params).fetchall())
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", str(exc)) from exc

    # -- SearchProfiles ----------------------------------------------------------------
    def profiles(self, namespace: str) -> list[StoredProfile]:
        rows = self._rows(
            "SELECT name, amount, scope, depth, note FROM kouten_profiles "
            "WHERE namespace = ? ORDER BY name",
            (namespace,),
        )
        return [StoredProfile(*(str(v) for v in row)) for row in rows]

    def put(self, namespace: str, profile: StoredProfile) -> None:
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO kouten_profiles VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(namespace, name) DO UPDATE SET amount = excluded.amount, "
                "scope = excluded.scope, depth = excluded.depth, note = excluded.note",
                (
                    namespace,
                    profile.name,
                    profile.amount,
                    profile.scope,
                    profile.depth,
                    profile.note,
                ),
            )

    def delete(self, namespace: str, name: str) -> bool:
        with self._transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM kouten_profiles WHERE namespace = ? AND name = ?", (namespace, name)
            )
            return cursor.rowcount > 0

    # -- EnvelopeLog -------------------------------------------------------------------
    def keep(self, envelope: KeptEnvelope) -> None:
        chunks = json.dumps([list(envelope.chunk_ids), list(envelope.chunk_rings)])
        horizon = envelope.created_at - timedelta(seconds=self._retention)
        tenant = (envelope.namespace, envelope.galaxy)
        with self._transaction() as conn:
            conn.execute(
                "DELETE FROM kouten_envelopes WHERE created_at < ?",
                (horizon.isoformat(),),
            )
            conn.execute(
                f"INSERT OR REPLACE INTO kouten_envelopes ({_COLUMNS}) "
                "VALUES (?,?,?,?,?,?,?,?,NULL,NULL)",
                (
                    envelope.request_id,
                    envelope.namespace,
                    envelope.galaxy,
                    envelope.base_ring,
                    envelope.profile,
                    envelope.budget,
                    envelope.created_at.isoformat(),
                    chunks,
                ),
            )
            count = self._since_prune.get(tenant, PRUNE_EVERY) + 1
            if count >= PRUNE_EVERY:
                count = 0
                self._prune(conn, *tenant)
            self._since_prune[tenant] = count

    def _prune(self, conn: sqlite3.Connection, namespace: str, galaxy: str) -> None:
        """Drop the (namespace, galaxy)'s envelopes past its bound, oldest first."""
        conn.execute(
            "DELETE FROM kouten_envelopes WHERE rowid IN (SELECT rowid FROM kouten_envelopes "
            "WHERE namespace = ? AND galaxy = ? ORDER BY created_at DESC, request_id DESC "
            "LIMIT -1 OFFSET ?)",
            (namespace, galaxy, self._max_per_galaxy),
        )

    def envelopes(self, namespace: str, request_id: str, since: datetime) -> list[KeptEnvelope]:
        rows = self._rows(
            f"SELECT {_COLUMNS} FROM kouten_envelopes WHERE namespace = ? AND request_id = ? "
            "AND created_at >= ? ORDER BY galaxy",
            (namespace, request_id, since.isoformat()),
        )
        return [_envelope(row) for row in rows]

    def feedback(
        self,
        namespace: str,
        galaxy: str,
        request_id: str,
        used: Sequence[str],
        ignored: Sequence[str],
    ) -> None:
        with self._transaction() as conn:
            conn.execute(
                "UPDATE kouten_envelopes SET used_json = ?, ignored_json = ? "
                "WHERE namespace = ? AND galaxy = ? AND request_id = ?",
                (json.dumps(list(used)), json.dumps(list(ignored)), namespace, galaxy, request_id),
            )

    def window(self, namespace: str, galaxy: str, since: datetime) -> list[KeptEnvelope]:
        rows = self._rows(
            f"SELECT {_COLUMNS} FROM kouten_envelopes WHERE namespace = ? AND galaxy = ? "
            "AND created_at >= ? ORDER BY created_at, request_id",
            (namespace, galaxy, since.isoformat()),
        )
        return [_envelope(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _migrate_envelopes(conn: sqlite3.Connection) -> None:
    """Rebuild a `kouten_envelopes` keyed by `request_id` alone (files written before
    envelopes were keyed per tenant) in the per-tenant layout, every row kept, in one
    transaction."""
    key = [str(row[1]) for row in conn.execute("PRAGMA table_info(kouten_envelopes)") if row[5]]
    if key != ["request_id"]:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE kouten_envelopes RENAME TO kouten_envelopes_v1")
        conn.execute("DROP INDEX IF EXISTS kouten_envelopes_by_galaxy")
        # One statement at a time: `executescript` would commit the transaction first.
        for statement in _ENVELOPES.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            f"INSERT INTO kouten_envelopes ({_COLUMNS}) SELECT {_COLUMNS} FROM kouten_envelopes_v1"
        )
        conn.execute("DROP TABLE kouten_envelopes_v1")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _envelope(row: tuple[object, ...]) -> KeptEnvelope:
    ids, rings = json.loads(str(row[7]))
    used = None if row[8] is None else tuple(json.loads(str(row[8])))
    ignored = None if row[9] is None else tuple(json.loads(str(row[9])))
    return KeptEnvelope(
        request_id=str(row[0]),
        namespace=str(row[1]),
        galaxy=str(row[2]),
        base_ring=str(row[3]),
        profile=str(row[4]),
        budget=int(str(row[5])),
        created_at=datetime.fromisoformat(str(row[6])),
        chunk_ids=tuple(ids),
        chunk_rings=tuple(rings),
        used=used,
        ignored=ignored,
    )
