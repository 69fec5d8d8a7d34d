"""KoutenDB search profiles and kept envelopes in PostgreSQL (server mode with
`ORRERY_DATABASE_URL`).

The tables `kouten_profiles` and `kouten_envelopes` of the query workers' migration set
(`query/adapters/postgres_migrations`, component `query`): every query worker of the
deployment shares profiles and envelopes, whichever machine it runs on, and keeps
nothing on disk (docs/koutendb.md). Driver errors raise `DependencyUnavailable` (503).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from query.adapters.postgres_routing import PostgresReads
from query.adapters.sqlite_koutendb import PRUNE_EVERY
from query.ports import KeptEnvelope, StoredProfile

__all__ = ["PostgresKoutenStore"]

_COLUMNS = (
    "request_id, namespace, galaxy, base_ring, profile, budget, created_at, chunks_json, "
    "used_json, ignored_json"
)


class PostgresKoutenStore:
    """`SearchProfiles` and `EnvelopeLog` on the worker's PostgreSQL connections (the
    `PostgresReads` pool, closed with the worker's other ports; `close` here is a no-op).

    As `SqliteKoutenStore`: envelopes older than the retention (a day) are deleted
    whenever one is kept, so the table holds about one day of requests; each (namespace,
    galaxy) holds at most `max_per_galaxy` of them (plus at most `PRUNE_EVERY` per worker
    between two prunes)."""

    def __init__(
        self,
        reads: PostgresReads,
        *,
        retention_seconds: float = 86_400.0,
        max_per_galaxy: int = 100_000,
    ) -> None:
        self._reads = reads
        self._retention = retention_seconds
        self._max_per_galaxy = max_per_galaxy
        self._since_prune: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # -- SearchProfiles ----------------------------------------------------------------
    def profiles(self, namespace: str) -> list[StoredProfile]:
        rows = self._reads.query(
            "SELECT name, amount, scope, depth, note FROM kouten_profiles "
            "WHERE namespace = %s ORDER BY name",
            (namespace,),
        )
        return [StoredProfile(*(str(v) for v in row)) for row in rows]

    def put(self, namespace: str, profile: StoredProfile) -> None:
        with self._reads.transaction("store a search profile") as cur:
            cur.execute(
                "INSERT INTO kouten_profiles VALUES (%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (namespace, name) DO UPDATE SET amount = excluded.amount, "
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
        with self._reads.transaction("delete a search profile") as cur:
            cur.execute(
                "DELETE FROM kouten_profiles WHERE namespace = %s AND name = %s",
                (namespace, name),
            )
            return cur.rowcount > 0

    # -- EnvelopeLog -------------------------------------------------------------------
    def keep(self, envelope: KeptEnvelope) -> None:
        chunks = json.dumps([list(envelope.chunk_ids), list(envelope.chunk_rings)])
        horizon = envelope.created_at - timedelta(seconds=self._retention)
        tenant = (envelope.namespace, envelope.galaxy)
        with self._lock:
            count = self._since_prune.get(tenant, PRUNE_EVERY) + 1
            prune = count >= PRUNE_EVERY
            self._since_prune[tenant] = 0 if prune else count
        with self._reads.transaction("keep an envelope") as cur:
            cur.execute("DELETE FROM kouten_envelopes WHERE created_at < %s", (horizon,))
            cur.execute(
                f"INSERT INTO kouten_envelopes ({_COLUMNS}) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,NULL,NULL) "
                "ON CONFLICT (namespace, galaxy, request_id) DO UPDATE SET "
                "base_ring = excluded.base_ring, "
                "profile = excluded.profile, budget = excluded.budget, "
                "created_at = excluded.created_at, chunks_json = excluded.chunks_json, "
                "used_json = NULL, ignored_json = NULL",
                (
                    envelope.request_id,
                    envelope.namespace,
                    envelope.galaxy,
                    envelope.base_ring,
                    envelope.profile,
                    envelope.budget,
                    envelope.created_at,
                    chunks,
                ),
            )
            if prune:
                # Past the bound, oldest first (the (namespace, galaxy, created_at) index).
                cur.execute(
                    "DELETE FROM kouten_envelopes WHERE (namespace, galaxy, request_id) IN "
                    "(SELECT namespace, galaxy, request_id FROM kouten_envelopes "
                    "WHERE namespace = %s AND galaxy = %s "
                    "ORDER BY created_at DESC, request_id DESC OFFSET %s)",
                    (*tenant, self._max_per_galaxy),
                )

    def envelopes(self, namespace: str, request_id: str, since: datetime) -> list[KeptEnvelope]:
        rows = self._reads.query(
            f"SELECT {_COLUMNS} FROM kouten_envelopes WHERE namespace = %s "
            "AND request_id = %s AND created_at >= %s ORDER BY galaxy",
            (namespace, request_id, since),
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
        with self._reads.transaction("record feedback") as cur:
            cur.execute(
                "UPDATE kouten_envelopes SET used_json = %s, ignored_json = %s "
                "WHERE namespace = %s AND galaxy = %s AND request_id = %s",
                (json.dumps(list(used)), json.dumps(list(ignored)), namespace, galaxy, request_id),
            )

    def window(self, namespace: str, galaxy: str, since: datetime) -> list[KeptEnvelope]:
        rows = self._reads.query(
            f"SELECT {_COLUMNS} FROM kouten_envelopes WHERE namespace = %s AND galaxy = %s "
            "AND created_at >= %s ORDER BY created_at, request_id",
            (namespace, galaxy, since),
        )
        return [_envelope(row) for row in rows]

    def close(self) -> None:
        """Nothing of its own to close: the pool is the worker's."""


def _envelope(row: tuple[Any, ...]) -> KeptEnvelope:
    ids, rings = json.loads(str(row[7]))
    used = None if row[8] is None else tuple(json.loads(str(row[8])))
    ignored = None if row[9] is None else tuple(json.loads(str(row[9])))
    created_at = row[6]
    if not isinstance(created_at, datetime):
        raise TypeError("kouten_envelopes.created_at is a TIMESTAMPTZ")
    return KeptEnvelope(
        request_id=str(row[0]),
        namespace=str(row[1]),
        galaxy=str(row[2]),
        base_ring=str(row[3]),
        profile=str(row[4]),
        budget=int(row[5]),
        created_at=created_at,
        chunk_ids=tuple(ids),
        chunk_rings=tuple(rings),
        used=used,
        ignored=ignored,
    )
