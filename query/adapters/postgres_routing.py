"""Routing and record reads from PostgreSQL (server mode with `ORRERY_DATABASE_URL`).

Reads the projector's registry tables (`projector/adapters/postgres_migrations`) and
ingest's `records` / `heads` / `outbox` / `outbox_counter`
(`ingest/adapters/postgres_migrations`); the packages share the schema, not code. A
query worker keeps nothing on disk: every read here is a query on a pooled connection.
Driver errors raise `DependencyUnavailable` (503).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from contracts.errors import DependencyUnavailable
from query.adapters.sqlite_routing import (
    DEFAULT_MAX_ANSWER_BYTES,
    namespace_log_sql,
)
from query.ports import (
    HeadFacts,
    NamespaceLog,
    ProjectorLogStatus,
    Route,
    ScopeReadiness,
    StoredRecord,
    answer_too_large,
)

__all__ = ["PostgresReads", "PostgresRecordReader", "PostgresRouting", "open_reads"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAMESPACE_LOG = namespace_log_sql(postgres=True, ns="%(ns)s", after="%(after)s::bigint")
_DEPENDENCY = "postgres"


def _redact(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class PostgresReads:
    """A pool of read connections shared by a worker's routing and record reader."""

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self._pool: ConnectionPool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            name="orrery-query",
            timeout=30.0,
            open=False,
            kwargs={"connect_timeout": 10, "application_name": "orrery-query", "autocommit": True},
        )
        try:
            self._pool.open(wait=True, timeout=10.0)
        except psycopg.Error as exc:
            self._pool.close()
            raise DependencyUnavailable(
                _DEPENDENCY, f"cannot connect to {_redact(url)}: {exc}"
            ) from exc

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise DependencyUnavailable(_DEPENDENCY, f"{what}: {exc}".strip()) from exc

    def query(
        self, sql: str, params: Sequence[object] | Mapping[str, object] = ()
    ) -> list[tuple[Any, ...]]:
        """One statement (autocommit: a consistent read of its own)."""
        with self._errors("read"), self._pool.connection() as conn:
            return list(conn.execute(sql, params).fetchall())

    @contextmanager
    def transaction(self, what: str) -> Iterator[psycopg.Cursor[Any]]:
        """One read-write transaction (the KoutenDB store's writes: profiles, kept
        envelopes, feedback)."""
        with (
            self._errors(what),
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            yield cur

    def close(self) -> None:
        self._pool.close()


def open_reads(url: str, *, pool_size: int = 8) -> PostgresReads:
    return PostgresReads(url, pool_size=pool_size)


class PostgresRouting:
    """`Routing` over the registry tables in PostgreSQL (the same reads as
    `SqliteRouting`; each method is one statement, so it sees one committed state)."""

    _ROUTE_COLUMNS = (
        "g.generation_id, g.applied_position, g.descriptor_json, g.document_count, "
        "g.commit_seq, g.state, g.descriptor_digest"
    )

    def __init__(self, reads: PostgresReads) -> None:
        self._reads = reads

    @property
    def reads(self) -> PostgresReads:
        """The worker's connection pool (shared with the KoutenDB adapters)."""
        return self._reads

    def route(self, namespace: str, snapshot_kind: str) -> Route | None:
        rows = self._reads.query(
            f"SELECT {self._ROUTE_COLUMNS} "
            "FROM live_pointers p JOIN generations g ON g.generation_id = p.generation_id "
            "WHERE p.namespace = %s AND p.snapshot_kind = %s",
            (namespace, snapshot_kind),
        )
        if not rows:
            return None
        return _route(namespace, snapshot_kind, rows[0])[0]

    def generation(self, generation_id: str) -> Route | None:
        rows = self._reads.query(
            f"SELECT g.namespace, g.snapshot_kind, {self._ROUTE_COLUMNS} FROM generations g "
            "WHERE g.generation_id = %s AND NOT g.indexes_dropped",
            (generation_id,),
        )
        if not rows:
            return None
        namespace, snapshot_kind, *row = rows[0]
        return _route(str(namespace), str(snapshot_kind), tuple(row))[0]

    def fallback_routes(self, namespace: str, snapshot_kind: str, exclude: str) -> list[Route]:
        rows = self._reads.query(
            f"SELECT {self._ROUTE_COLUMNS} FROM generations g WHERE g.namespace = %s AND "
            "g.snapshot_kind = %s AND g.state = 'verified' AND g.generation_id != %s "
            "ORDER BY g.seq DESC",
            (namespace, snapshot_kind, exclude),
        )
        routes = [_route(namespace, snapshot_kind, row) for row in rows]
        routes.sort(key=lambda pair: (pair[1] is not None, pair[1] or _EPOCH), reverse=True)
        return [route for route, _ in routes]

    def scopes(self) -> list[ScopeReadiness]:
        rows = self._reads.query(
            "SELECT p.namespace, p.snapshot_kind, g.generation_id, g.state, g.document_count,"
            " g.applied_position, g.descriptor_digest, g.commit_seq, (SELECT COUNT(*) FROM "
            "dead_letters d WHERE d.namespace = p.namespace AND d.snapshot_kind = "
            "p.snapshot_kind) FROM live_pointers p JOIN "
            "generations g ON g.generation_id = p.generation_id "
            "ORDER BY p.namespace, p.snapshot_kind"
        )
        return [
            ScopeReadiness(
                namespace=str(ns),
                snapshot_kind=str(kind),
                generation_id=str(gen),
                state=str(state),
                document_count=int(count),
                applied_position=int(applied),
                descriptor_digest=str(digest or ""),
                commit_seq=int(commit_seq),
                dead_letters=int(dead),
            )
            for ns, kind, gen, state, count, applied, digest, commit_seq, dead in rows
        ]

    def oldest_unapplied_at(self, position: int) -> datetime | None:
        rows = self._reads.query(
            "SELECT created_at FROM outbox WHERE position > %s ORDER BY position LIMIT 1",
            (position,),
        )
        return rows[0][0] if rows else None

    def log_high_water(self) -> int:
        rows = self._reads.query("SELECT position FROM outbox_counter")
        return int(rows[0][0]) if rows else 0

    def namespace_log(self, namespace: str, after: int) -> NamespaceLog:
        """One statement (`sqlite_routing.namespace_log_sql`): exact on a partitioned log."""
        rows = self._reads.query(_NAMESPACE_LOG, {"ns": namespace, "after": after})
        if not rows:
            return NamespaceLog(0, 0, None)
        high, pending, oldest, applied, dead = rows[0]
        return NamespaceLog(int(high), int(pending), oldest, int(applied), int(dead))

    def log_status(self) -> ProjectorLogStatus | None:
        rows = self._reads.query(
            "SELECT consumer, position, lag_events, measured_at, "
            "(SELECT COUNT(*) FROM dead_letters) FROM projector_log_status "
            "ORDER BY measured_at DESC LIMIT 1"
        )
        if not rows:
            return None
        consumer, position, lag, measured_at, dead = rows[0]
        return ProjectorLogStatus(
            consumer=str(consumer),
            position=int(position),
            lag_events=int(lag),
            measured_at=measured_at,
            dead_letters=int(dead),
        )

    def document_ids(self, generation_id: str, galaxy: str | None = None) -> list[str]:
        """Live document ids of a generation, from the registry's document table (only
        those of `galaxy` when given, read from the canonical records)."""
        if galaxy is None:
            rows = self._reads.query(
                "SELECT document_id FROM generation_documents WHERE generation_id = %s "
                "AND NOT deleted ORDER BY document_id",
                (generation_id,),
            )
        else:
            rows = self._reads.query(
                "SELECT g.document_id FROM generation_documents g JOIN records r ON "
                "r.document_id = g.document_id AND r.revision = g.revision WHERE "
                "g.generation_id = %s AND NOT g.deleted AND r.galaxy = %s "
                "ORDER BY g.document_id",
                (generation_id, galaxy),
            )
        return [str(r[0]) for r in rows]

    def dead_letters(
        self, limit: int = 100, *, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """The projector's dead letters (undecodable messages and rejected records),
        oldest first, those of `namespace` when given, JSON-ready (raw key, value and
        header values base64-encoded), as `sqlite_routing.dead_letters`."""
        where, params = ("", ()) if namespace is None else (" WHERE namespace = %s", (namespace,))
        rows = self._reads.query(
            "SELECT seq, consumer, location, position, message_key, message_value, "
            "headers_json, reason, parked_at, namespace, snapshot_kind, document_id, revision "
            f"FROM dead_letters{where} ORDER BY seq LIMIT %s",
            (*params, limit),
        )
        return [
            {
                "seq": int(seq),
                "consumer": consumer,
                "where": where,
                "position": position,
                "reason": reason,
                "parked_at": parked_at.isoformat(),
                "namespace": ns,
                "snapshot_kind": kind,
                "document_id": doc,
                "revision": None if revision is None else int(revision),
                "key_base64": None if key is None else base64.b64encode(key).decode("ascii"),
                "value_base64": base64.b64encode(value).decode("ascii"),
                "headers": json.loads(str(headers)),
            }
            for (
                seq,
                consumer,
                where,
                position,
                key,
                value,
                headers,
                reason,
                parked_at,
                ns,
                kind,
                doc,
                revision,
            ) in rows
        ]


class PostgresRecordReader:
    """`RecordReader` and `HeadListing` over ingest's `records` and `heads` tables (the
    stored JSON is returned as written, vector included). Each read that returns record
    JSON carries a guard the server evaluates first from the sizes alone (`octet_length`
    of a TOASTed value reads no data): past `max_answer_bytes` it returns no rows, and a
    second, size-only query tells that apart from no match (`answer_too_large`)."""

    _COLUMNS = (
        "r.document_id, r.revision, r.item_id, r.namespace, r.snapshot_kind, r.galaxy, "
        "r.deleted, r.payload_sha256, r.record_json"
    )
    _JOIN = (
        "FROM heads h JOIN records r ON r.document_id = h.document_id AND r.revision = h.revision"
    )

    def __init__(
        self, reads: PostgresReads, *, max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    ) -> None:
        self._reads = reads
        self._max_answer_bytes = max_answer_bytes

    def _bounded(
        self,
        rows_sql: str,
        rows_params: Sequence[object],
        size_sql: str,
        size_params: Sequence[object],
    ) -> list[Any]:
        """`rows_sql` (guarded by `(size_sql) <= max_answer_bytes`) when the rows' JSON
        fits, else `answer_too_large`."""
        limit = self._max_answer_bytes
        rows = self._reads.query(rows_sql, rows_params)
        if not rows:
            size = self._reads.query(size_sql, size_params)
            if size and int(size[0][0] or 0) > limit:
                raise answer_too_large(limit)
        return rows

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]:
        if not keys:
            return {}
        source = (
            "FROM records r JOIN unnest(%s::text[], %s::bigint[]) AS k(document_id, revision) "
            "ON r.document_id = k.document_id AND r.revision = k.revision"
        )
        size = f"SELECT sum(octet_length(r.record_json)) {source}"
        ids, revisions = [d for d, _ in keys], [r for _, r in keys]
        rows = self._bounded(
            f"SELECT {self._COLUMNS} {source} WHERE ({size}) <= %s",
            (ids, revisions, ids, revisions, self._max_answer_bytes),
            size,
            (ids, revisions),
        )
        stored = [_stored(row) for row in rows]
        return {(s.document_id, s.revision): s for s in stored}

    _HEADS_WHERE = (
        "WHERE (%s::text IS NULL OR h.namespace = %s) AND NOT h.deleted AND h.document_id = ANY(%s)"
    )

    def heads(self, namespace: str | None, document_ids: Sequence[str]) -> list[StoredRecord]:
        if not document_ids:
            return []
        size = f"SELECT sum(octet_length(r.record_json)) {self._JOIN} {self._HEADS_WHERE}"
        where = (namespace, namespace, list(document_ids))
        rows = self._bounded(
            f"SELECT {self._COLUMNS} {self._JOIN} {self._HEADS_WHERE} AND ({size}) <= %s",
            (*where, *where, self._max_answer_bytes),
            size,
            where,
        )
        return [_stored(row) for row in rows]

    def head_facts(self, namespace: str | None, document_ids: Sequence[str]) -> list[HeadFacts]:
        if not document_ids:
            return []
        rows = self._reads.query(
            "SELECT h.document_id, h.revision, h.snapshot_kind, r.galaxy, "
            f"octet_length(r.record_json) {self._JOIN} {self._HEADS_WHERE}",
            (namespace, namespace, list(document_ids)),
        )
        return [HeadFacts(str(d), int(rev), str(k), str(g), int(n)) for d, rev, k, g, n in rows]

    def page(
        self, namespace: str | None, galaxy: str | None, offset: int, limit: int
    ) -> tuple[int, list[StoredRecord]]:
        where = (
            "NOT h.deleted AND (%s::text IS NULL OR h.namespace = %s) "
            "AND (%s::text IS NULL OR r.galaxy = %s)"
        )
        args: list[object] = [namespace, namespace, galaxy, galaxy]
        total = self._reads.query(f"SELECT COUNT(*) {self._JOIN} WHERE {where}", args)
        window = f"{self._JOIN} WHERE {where} ORDER BY h.document_id LIMIT %s OFFSET %s"
        size = f"SELECT sum(n) FROM (SELECT octet_length(r.record_json) AS n {window}) AS s"
        rows = self._bounded(
            f"SELECT {self._COLUMNS} {self._JOIN} WHERE {where} AND ({size}) <= %s "
            "ORDER BY h.document_id LIMIT %s OFFSET %s",
            [*args, *args, limit, offset, self._max_answer_bytes, limit, offset],
            size,
            [*args, limit, offset],
        )
        return (int(total[0][0]) if total else 0), [_stored(row) for row in rows]

    def head_keys(self, namespace: str) -> list[tuple[str, int]]:
        # Ordered as `page` orders (`h.document_id`, the column's collation).
        rows = self._reads.query(
            "SELECT h.document_id, h.revision FROM heads h "
            "WHERE NOT h.deleted AND h.namespace = %s ORDER BY h.document_id",
            (namespace,),
        )
        return [(str(d), int(r)) for d, r in rows]

    def holds(self, namespace: str, snapshot_kind: str | None = None) -> bool:
        rows = self._reads.query(
            "SELECT 1 FROM heads WHERE namespace = %s "
            "AND (%s::text IS NULL OR snapshot_kind = %s) LIMIT 1",
            (namespace, snapshot_kind, snapshot_kind),
        )
        return bool(rows)


def _route(
    namespace: str, snapshot_kind: str, row: tuple[Any, ...]
) -> tuple[Route, datetime | None]:
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
        applied_position=int(applied),
        commit_seq=int(commit_seq),
        embedder_id=str(descriptor["embedder_id"]),
        document_count=int(count),
        state=str(state),
        descriptor_digest=str(digest or ""),
    )
    return route, live_at


def _stored(row: tuple[Any, ...]) -> StoredRecord:
    doc, rev, item, ns, kind, galaxy, deleted, digest, body = row
    return StoredRecord(
        document_id=str(doc),
        revision=int(rev),
        item_id=str(item),
        namespace=str(ns),
        snapshot_kind=str(kind),
        galaxy=str(galaxy),
        deleted=bool(deleted),
        payload_sha256=str(digest),
        record_json=str(body),
    )
