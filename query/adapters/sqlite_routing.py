"""Routing and record reads from the embedded SQLite database.

Reads the projector's `live_pointers` / `generations` tables and ingest's `records` /
`heads` / `outbox` tables (the embedded on-disk format). Each thread has its own
read connection: WAL readers never block the writer.

Route lookups, read on every query, are remembered per thread for as long as the
database's `PRAGMA data_version` on that thread's connection stays the same: SQLite
moves it whenever another connection (any process's) commits, and these connections
are read-only, so an unchanged version means the registry rows read before are still
the committed ones.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contracts.errors import DependencyUnavailable
from query.ports import ProjectorLogStatus, Route, ScopeReadiness, StoredRecord

__all__ = ["SqliteRecordReader", "SqliteRouting", "dead_letters", "generation_document_ids"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Reader:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.local()

    def _unchanged_since(self) -> dict[object, Any]:
        """This thread's memo of lookups, emptied whenever another connection committed
        since it was filled (`PRAGMA data_version`)."""
        local = self._local
        version = self._query("PRAGMA data_version")[0][0]
        memo: dict[object, Any] | None = getattr(local, "memo", None)
        if memo is None or local.memo_version != version:
            memo = local.memo = {}
            local.memo_version = version
        return memo

    @property
    def path(self) -> Path:
        """The database file read."""
        return self._path

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    f"file:{self._path}?mode=ro", uri=True, timeout=30.0, isolation_level=None
                )
            except sqlite3.Error as exc:
                raise DependencyUnavailable("sqlite", f"cannot open {self._path}: {exc}") from exc
            self._local.conn = conn
        return conn

    def _query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        try:
            return list(self._conn().execute(sql, params).fetchall())
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc


class SqliteRouting(_Reader):
    """`Routing` over the embedded registry tables."""

    _ROUTE_COLUMNS = (
        "g.generation_id, g.applied_position, g.descriptor_json, g.document_count, "
        "g.commit_seq, g.state, g.descriptor_digest"
    )

    def route(self, namespace: str, snapshot_kind: str) -> Route | None:
        memo = self._unchanged_since()
        key = ("route", namespace, snapshot_kind)
        if key in memo:
            cached: Route | None = memo[key]
            return cached
        memo[key] = found = self._route_now(namespace, snapshot_kind)
        return found

    def _route_now(self, namespace: str, snapshot_kind: str) -> Route | None:
        rows = self._query(
            f"SELECT {self._ROUTE_COLUMNS} "
            "FROM live_pointers p JOIN generations g ON g.generation_id = p.generation_id "
            "WHERE p.namespace = ? AND p.snapshot_kind = ?",
            (namespace, snapshot_kind),
        )
        if not rows:
            return None
        return _route(namespace, snapshot_kind, rows[0])[0]

    def generation(self, generation_id: str) -> Route | None:
        memo = self._unchanged_since()
        key = ("generation", generation_id)
        if key in memo:
            cached: Route | None = memo[key]
            return cached
        memo[key] = found = self._generation_now(generation_id)
        return found

    def _generation_now(self, generation_id: str) -> Route | None:
        rows = self._query(
            f"SELECT g.namespace, g.snapshot_kind, {self._ROUTE_COLUMNS} FROM generations g "
            "WHERE g.generation_id = ? AND g.indexes_dropped = 0",
            (generation_id,),
        )
        if not rows:
            return None
        namespace, snapshot_kind, *row = rows[0]
        return _route(str(namespace), str(snapshot_kind), tuple(row))[0]

    def fallback_routes(self, namespace: str, snapshot_kind: str, exclude: str) -> list[Route]:
        rows = self._query(
            f"SELECT {self._ROUTE_COLUMNS} FROM generations g WHERE g.namespace = ? AND "
            "g.snapshot_kind = ? AND g.state = 'verified' AND g.generation_id != ? "
            "ORDER BY g.seq DESC",
            (namespace, snapshot_kind, exclude),
        )
        routes = [_route(namespace, snapshot_kind, row) for row in rows]
        # Most recently live first, then never-live ones newest first (a stable sort).
        routes.sort(key=lambda pair: (pair[1] is not None, pair[1] or _EPOCH), reverse=True)
        return [route for route, _ in routes]

    def scopes(self) -> list[ScopeReadiness]:
        rows = self._query(
            "SELECT p.namespace, p.snapshot_kind, g.generation_id, g.state, g.document_count,"
            " g.applied_position, g.descriptor_digest, g.commit_seq FROM live_pointers p JOIN "
            "generations g ON g.generation_id = p.generation_id "
            "ORDER BY p.namespace, p.snapshot_kind"
        )
        return [
            ScopeReadiness(
                namespace=str(ns),
                snapshot_kind=str(kind),
                generation_id=str(gen),
                state=str(state),
                document_count=int(str(count)),
                applied_position=int(str(applied)),
                descriptor_digest=str(digest or ""),
                commit_seq=int(str(commit_seq)),
            )
            for ns, kind, gen, state, count, applied, digest, commit_seq in rows
        ]

    def oldest_unapplied_at(self, position: int) -> datetime | None:
        rows = self._query(
            "SELECT created_at FROM outbox WHERE position > ? ORDER BY position LIMIT 1",
            (position,),
        )
        return datetime.fromisoformat(str(rows[0][0])) if rows else None

    def log_high_water(self) -> int:
        rows = self._query("SELECT COALESCE(MAX(position), 0) FROM outbox")
        return int(str(rows[0][0])) if rows else 0

    def log_status(self) -> ProjectorLogStatus | None:
        """From the projector's `projector_log_status` and `dead_letters` tables."""
        rows = self._query(
            "SELECT consumer, position, lag_events, measured_at, "
            "(SELECT COUNT(*) FROM dead_letters) FROM projector_log_status "
            "ORDER BY measured_at DESC LIMIT 1"
        )
        if not rows:
            return None
        consumer, position, lag, measured_at, dead = rows[0]
        return ProjectorLogStatus(
            consumer=str(consumer),
            position=int(str(position)),
            lag_events=int(str(lag)),
            measured_at=datetime.fromisoformat(str(measured_at)),
            dead_letters=int(str(dead)),
        )

    def document_ids(self, generation_id: str, galaxy: str | None = None) -> list[str]:
        """See `generation_document_ids`."""
        return generation_document_ids(self, generation_id, galaxy)

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """See the module's `dead_letters`."""
        return dead_letters(self, limit)


class SqliteRecordReader(_Reader):
    """`RecordReader` over ingest's `records` and `heads` tables."""

    _COLUMNS = (
        "document_id, revision, item_id, namespace, snapshot_kind, galaxy, deleted, "
        "payload_sha256, record_json"
    )
    _FETCH_COLUMNS = _COLUMNS.replace("record_json", "json_remove(record_json, '$.vector')")

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]:
        # One primary-key lookup per key: an OR of compound conditions makes SQLite scan
        # the whole table (measured: 20 ms for 10 keys at 100k records).
        # SQLite drops the vector (three quarters of a record's JSON, never answered by a
        # query) before Python parses the rest: 470 -> 300 us for 10 records.
        out: dict[tuple[str, int], StoredRecord] = {}
        sql = f"SELECT {self._FETCH_COLUMNS} FROM records WHERE document_id = ? AND revision = ?"
        for key in keys:
            for row in self._query(sql, key):
                out[key] = _stored(row)
        return out

    def heads(self, namespace: str | None, document_ids: Sequence[str]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        # Document ids hash their namespace in, so without one the ids alone select.
        in_namespace = "" if namespace is None else "+h.namespace = ? AND "
        scope: list[object] = [] if namespace is None else [namespace]
        for start in range(0, len(document_ids), 500):
            chunk = list(document_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            cols = ", ".join(f"r.{c.strip()}" for c in self._COLUMNS.split(","))
            # `+h.namespace` keeps SQLite on the primary key: planned on the scope index
            # it walks every head of the namespace (61 ms for 10 ids at 100k).
            rows = self._query(
                f"SELECT {cols} FROM heads h JOIN records r ON r.document_id = h.document_id "
                f"AND r.revision = h.revision WHERE {in_namespace}h.deleted = 0 "
                f"AND h.document_id IN ({marks})",
                [*scope, *chunk],
            )
            out.extend(_stored(row) for row in rows)
        return out

    def page(
        self, namespace: str | None, galaxy: str | None, offset: int, limit: int
    ) -> tuple[int, list[StoredRecord]]:
        cols = ", ".join(f"r.{c.strip()}" for c in self._COLUMNS.split(","))
        where = "h.deleted = 0"
        args: list[object] = []
        if namespace is not None:
            where += " AND h.namespace = ?"
            args.append(namespace)
        if galaxy is not None:
            where += " AND r.galaxy = ?"
            args.append(galaxy)
        join = (
            "FROM heads h JOIN records r ON r.document_id = h.document_id "
            "AND r.revision = h.revision"
        )
        total = self._query(f"SELECT COUNT(*) {join} WHERE {where}", args)
        rows = self._query(
            f"SELECT {cols} {join} WHERE {where} ORDER BY h.document_id LIMIT ? OFFSET ?",
            [*args, limit, offset],
        )
        return (int(str(total[0][0])) if total else 0), [_stored(row) for row in rows]


def _route(
    namespace: str, snapshot_kind: str, row: tuple[object, ...]
) -> tuple[Route, datetime | None]:
    """The route of a generations row, and when it last became live (None if never)."""
    generation_id, applied, descriptor_json, count, commit_seq, state, digest = row
    descriptor: dict[str, Any] = json.loads(str(descriptor_json))
    live_at = max(
        (
            datetime.fromisoformat(str(c["at"]))
            for c in descriptor.get("history", ())
            if c.get("state") == "live"
        ),
        default=None,
    )
    route = Route(
        namespace=namespace,
        snapshot_kind=snapshot_kind,
        generation_id=str(generation_id),
        applied_position=int(str(applied)),
        commit_seq=int(str(commit_seq)),
        embedder_id=str(descriptor["embedder_id"]),
        document_count=int(str(count)),
        state=str(state),
        descriptor_digest=str(digest or ""),
    )
    return route, live_at


def _stored(row: tuple[object, ...]) -> StoredRecord:
    doc, rev, item, ns, kind, galaxy, deleted, digest, body = row
    return StoredRecord(
        document_id=str(doc),
        revision=int(str(rev)),
        item_id=str(item),
        namespace=str(ns),
        snapshot_kind=str(kind),
        galaxy=str(galaxy),
        deleted=bool(deleted),
        payload_sha256=str(digest),
        record_json=str(body),
    )


def generation_document_ids(
    routing: SqliteRouting, generation_id: str, galaxy: str | None = None
) -> list[str]:
    """Live document ids of a generation, from the projector's registry table (only
    those of `galaxy` when given, read from the canonical records)."""
    if galaxy is None:
        rows = routing._query(
            "SELECT document_id FROM generation_documents WHERE generation_id = ? "
            "AND deleted = 0 ORDER BY document_id",
            (generation_id,),
        )
    else:
        rows = routing._query(
            "SELECT g.document_id FROM generation_documents g JOIN records r ON "
            "r.document_id = g.document_id AND r.revision = g.revision WHERE "
            "g.generation_id = ? AND g.deleted = 0 AND r.galaxy = ? ORDER BY g.document_id",
            (generation_id, galaxy),
        )
    return [str(r[0]) for r in rows]


def dead_letters(routing: SqliteRouting, limit: int = 100) -> list[dict[str, Any]]:
    """The projector's parked undecodable messages, oldest first, as JSON-ready dicts
    (raw key, value and header values base64-encoded)."""
    rows = routing._query(
        "SELECT seq, consumer, location, position, message_key, message_value, "
        "headers_json, reason, parked_at FROM dead_letters ORDER BY seq LIMIT ?",
        (limit,),
    )
    out: list[dict[str, Any]] = []
    for seq, consumer, where, position, key, value, headers, reason, parked_at in rows:
        out.append(
            {
                "seq": seq,
                "consumer": consumer,
                "where": where,
                "position": position,
                "reason": reason,
                "parked_at": parked_at,
                "key_base64": None if key is None else _b64(key),
                "value_base64": _b64(value),
                "headers": json.loads(str(headers)),
            }
        )
    return out


def _b64(raw: object) -> str:
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    return base64.b64encode(data).decode("ascii")
