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
from contracts.namespace_backlog import PARTITION_FLOORS, pending_rows
from contracts.records import RECORD_BODY, record_json_without_vector
from contracts.trusted import trusted_constructor
from query.ports import (
    HeadFacts,
    NamespaceLog,
    ProjectorLogStatus,
    Route,
    ScopeReadiness,
    StoredRecord,
    answer_too_large,
)

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "SqliteRecordReader",
    "SqliteRouting",
    "dead_letters",
    "generation_document_ids",
    "namespace_log_sql",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# The most record JSON one read loads by default (`ORRERY_MAX_ANSWER_BYTES`).
DEFAULT_MAX_ANSWER_BYTES = 32 * 1024 * 1024


def namespace_log_sql(*, postgres: bool, ns: str, after: str) -> str:
    """One namespace's view of the log (`Routing.namespace_log`) as one statement, for
    SQLite and PostgreSQL (`ns` / `after`: the driver's parameters): its high water, its
    pending events (`contracts.namespace_backlog`: exact on a partitioned log) and the
    oldest one's time, its newest applied position and its dead letters."""
    floors = PARTITION_FLOORS.format(ns=ns)
    held = pending_rows(postgres=postgres, ns=ns, after=after, column="created_at")
    return f"""
WITH RECURSIVE
{floors},
held AS ({held}
)
SELECT
    (SELECT COALESCE(MAX(position), 0) FROM outbox WHERE namespace = {ns}),
    (SELECT COUNT(*) FROM held),
    (SELECT MIN(created_at) FROM held),
    (SELECT COALESCE(MAX(position), 0) FROM projector_namespace_positions
     WHERE namespace = {ns}),
    (SELECT COUNT(*) FROM dead_letters WHERE namespace = {ns})
"""


_NAMESPACE_LOG = namespace_log_sql(postgres=False, ns=":ns", after=":after")


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
                document_count=int(str(count)),
                applied_position=int(str(applied)),
                descriptor_digest=str(digest or ""),
                commit_seq=int(str(commit_seq)),
                dead_letters=int(str(dead)),
            )
            for ns, kind, gen, state, count, applied, digest, commit_seq, dead in rows
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

    def namespace_log(self, namespace: str, after: int) -> NamespaceLog:
        """See `namespace_log_sql`. A database the writers have not opened since
        placements were recorded (no `kafka_partition` column, no
        `projector_partition_offsets` table: the writers add them) is read as a log of
        one order, as before."""
        try:
            rows = list(
                self._conn().execute(_NAMESPACE_LOG, {"ns": namespace, "after": after}).fetchall()
            )
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc) and "no such column" not in str(exc):
                raise DependencyUnavailable("sqlite", str(exc)) from exc
            rows = self._one_order_log(namespace, after)
        if not rows:
            return NamespaceLog(0, 0, None)
        high, pending, oldest, applied, dead = rows[0]
        return NamespaceLog(
            int(str(high)),
            int(str(pending)),
            None if oldest is None else datetime.fromisoformat(str(oldest)),
            int(str(applied)),
            int(str(dead)),
        )

    def _one_order_log(self, namespace: str, after: int) -> list[tuple[object, ...]]:
        return self._query(
            "SELECT (SELECT COALESCE(MAX(position), 0) FROM outbox WHERE namespace = ?), "
            "(SELECT COUNT(*) FROM outbox WHERE namespace = ? AND position > ?), "
            "(SELECT created_at FROM outbox WHERE namespace = ? AND position > ? "
            "ORDER BY position LIMIT 1), "
            "(SELECT COALESCE(MAX(position), 0) FROM projector_namespace_positions "
            "WHERE namespace = ?), "
            "(SELECT COUNT(*) FROM dead_letters WHERE namespace = ?)",
            (namespace, namespace, after, namespace, after, namespace, namespace),
        )

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

    def dead_letters(
        self, limit: int = 100, *, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """See the module's `dead_letters`."""
        return dead_letters(self, limit, namespace=namespace)


class SqliteRecordReader(_Reader):
    """`RecordReader` and `HeadListing` over ingest's `records` and `heads` tables. Rows
    are read one at a time and their JSON counted as they come: a call past
    `max_answer_bytes` stops and raises `answer_too_large` holding at most that much plus
    one record."""

    _COLUMNS = (
        "document_id, revision, item_id, namespace, snapshot_kind, galaxy, deleted, "
        "payload_sha256, record_json"
    )

    def __init__(self, path: Path, *, max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        super().__init__(path)
        self._max_answer_bytes = max_answer_bytes
        self._with_body: bool | None = None

    def _fetch_columns(self) -> str:
        """`_COLUMNS` with the record's vector-free JSON where the row has one, then
        whether it has none (`_records(strip=True)` cuts those)."""
        if not self._with_body:
            # Asked until the store has the column (a reader may open a database its
            # writer has not migrated yet); once it has, it keeps it.
            columns = {str(row[1]) for row in self._query("PRAGMA table_info(records)")}
            self._with_body = RECORD_BODY in columns
        if self._with_body:
            return self._COLUMNS.replace(
                "record_json", f"COALESCE({RECORD_BODY}, record_json), {RECORD_BODY} IS NULL"
            )
        return f"{self._COLUMNS}, 1"

    def _records(
        self,
        sql: str,
        params: Sequence[object],
        budget: list[int],
        *,
        keep: set[tuple[str, int]] | None = None,
        strip: bool = False,
    ) -> list[StoredRecord]:
        """The rows of `sql` (`document_id, revision` first, record JSON last) as records,
        taking their JSON's bytes from `budget[0]`; `answer_too_large` once it runs out.
        `keep`: only rows whose `(document_id, revision)` it holds (the others neither
        returned nor counted); `strip`: `sql` selects `_fetch_columns`, the record JSON is
        returned (and counted) without its vector."""
        out: list[StoredRecord] = []
        try:
            for row in self._conn().execute(sql, params):
                if keep is not None and (row[0], row[1]) not in keep:
                    continue
                if strip:
                    body = str(row[8])
                    # `_fetch_columns`' last column: whether the row holds no vector-free
                    # copy.
                    if row[9]:
                        body = record_json_without_vector(body)
                else:
                    body = str(row[8])
                budget[0] -= len(body)
                if budget[0] < 0:
                    raise answer_too_large(self._max_answer_bytes)
                out.append(_stored(row, body))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise DependencyUnavailable("sqlite", str(exc)) from exc
        return out

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]:
        # One statement over the primary key's product `ids × revisions` (index probes,
        # no scan), the pairs not asked for dropped here: an OR of compound conditions
        # makes SQLite scan the whole table (20 ms for 10 keys at 100k records), and so
        # does a row-value `IN (VALUES ...)` in SQLite 3.40; one statement per key cost
        # 0.81 ms for 10 keys against 0.53 (SciFact, CPU, busy machine).
        # The vector (three quarters of a record's JSON, never answered by a query) is not
        # read: the store keeps each record's JSON without it too (`record_body`, before
        # the whole JSON in the row, so its overflow pages are not walked). 10 SciFact
        # records: 70 us, against 285 with SQLite's `json_remove` (which parses and
        # renders each record again) and ~470 for Python to parse them whole. A row
        # written before that column existed is cut here (`record_json_without_vector`).
        out: dict[tuple[str, int], StoredRecord] = {}
        wanted = set(keys)
        budget = [self._max_answer_bytes]
        for start in range(0, len(keys), 200):
            chunk = keys[start : start + 200]
            ids = sorted({document_id for document_id, _revision in chunk})
            revisions = sorted({revision for _document_id, revision in chunk})
            sql = (
                f"SELECT {self._fetch_columns()} FROM records WHERE document_id IN "
                f"({','.join('?' * len(ids))}) AND revision IN ({','.join('?' * len(revisions))})"
            )
            for record in self._records(sql, [*ids, *revisions], budget, keep=wanted, strip=True):
                out[(record.document_id, record.revision)] = record
        return out

    def heads(self, namespace: str | None, document_ids: Sequence[str]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        # Document ids hash their namespace in, so without one the ids alone select.
        in_namespace = "" if namespace is None else "+h.namespace = ? AND "
        scope: list[object] = [] if namespace is None else [namespace]
        budget = [self._max_answer_bytes]
        for start in range(0, len(document_ids), 500):
            chunk = list(document_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            cols = ", ".join(f"r.{c.strip()}" for c in self._COLUMNS.split(","))
            # `+h.namespace` keeps SQLite on the primary key: planned on the scope index
            # it walks every head of the namespace (61 ms for 10 ids at 100k).
            out.extend(
                self._records(
                    f"SELECT {cols} FROM heads h JOIN records r ON r.document_id = "
                    f"h.document_id AND r.revision = h.revision WHERE {in_namespace}"
                    f"h.deleted = 0 AND h.document_id IN ({marks})",
                    [*scope, *chunk],
                    budget,
                )
            )
        return out

    def head_facts(self, namespace: str | None, document_ids: Sequence[str]) -> list[HeadFacts]:
        out: list[HeadFacts] = []
        in_namespace = "" if namespace is None else "+h.namespace = ? AND "
        scope: list[object] = [] if namespace is None else [namespace]
        for start in range(0, len(document_ids), 500):
            chunk = list(document_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            # No record JSON leaves SQLite: its size is read as a blob's length.
            rows = self._query(
                "SELECT h.document_id, h.revision, h.snapshot_kind, r.galaxy, "
                "length(CAST(r.record_json AS BLOB)) FROM heads h JOIN records r ON "
                "r.document_id = h.document_id AND r.revision = h.revision WHERE "
                f"{in_namespace}h.deleted = 0 AND h.document_id IN ({marks})",
                [*scope, *chunk],
            )
            out.extend(
                HeadFacts(str(d), int(str(rev)), str(k), str(g), int(str(n)))
                for d, rev, k, g, n in rows
            )
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
        if galaxy is None:
            # Counted and skipped on the narrow heads table, records joined for the
            # page alone: the join walked every record's JSON up to the offset (17 s at
            # offset 99,000 of 100k records with vectors).
            total = self._query(f"SELECT COUNT(*) FROM heads h WHERE {where}", args)
            rows = self._records(
                f"SELECT {cols} FROM (SELECT document_id, revision FROM heads h WHERE "
                f"{where} ORDER BY h.document_id LIMIT ? OFFSET ?) p JOIN records r ON "
                "r.document_id = p.document_id AND r.revision = p.revision "
                "ORDER BY r.document_id",
                [*args, limit, offset],
                [self._max_answer_bytes],
            )
            return (int(str(total[0][0])) if total else 0), rows
        join = (
            "FROM heads h JOIN records r ON r.document_id = h.document_id "
            "AND r.revision = h.revision"
        )
        total = self._query(f"SELECT COUNT(*) {join} WHERE {where}", args)
        rows = self._records(
            f"SELECT {cols} {join} WHERE {where} ORDER BY h.document_id LIMIT ? OFFSET ?",
            [*args, limit, offset],
            [self._max_answer_bytes],
        )
        return (int(str(total[0][0])) if total else 0), rows

    def head_keys(self, namespace: str) -> list[tuple[str, int]]:
        # `page`'s own inner query without its window: the namespace's heads through
        # the scope index, sorted once (40 ms at 50k heads against ~90 ms per `page`
        # call, which sorts them again for every offset).
        rows = self._query(
            "SELECT document_id, revision FROM heads h WHERE h.deleted = 0 AND "
            "h.namespace = ? ORDER BY h.document_id",
            [namespace],
        )
        return [(str(d), int(str(r))) for d, r in rows]

    def holds(self, namespace: str, snapshot_kind: str | None = None) -> bool:
        if snapshot_kind is None:
            rows = self._query("SELECT 1 FROM heads WHERE namespace = ? LIMIT 1", [namespace])
        else:
            rows = self._query(
                "SELECT 1 FROM heads WHERE namespace = ? AND snapshot_kind = ? LIMIT 1",
                [namespace, snapshot_kind],
            )
        return bool(rows)


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


_STORED_RECORD = trusted_constructor(StoredRecord)


def _stored(row: tuple[Any, ...], body: str) -> StoredRecord:
    """`_COLUMNS`' first eight values of `row` and the record JSON `body` as a record."""
    doc, rev, item, ns, kind, galaxy, deleted, digest = row[:8]
    # Every value converted to its field's type here: not validated again (~0.5 us of
    # ~3.5 a record, `contracts.trusted`).
    return _STORED_RECORD(
        document_id=str(doc),
        revision=int(rev),
        item_id=str(item),
        namespace=str(ns),
        snapshot_kind=str(kind),
        galaxy=str(galaxy),
        deleted=bool(deleted),
        payload_sha256=str(digest),
        record_json=body,
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


def dead_letters(
    routing: SqliteRouting, limit: int = 100, *, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The projector's dead letters (undecodable messages, and records it could not
    apply: those name their namespace, snapshot kind, document id and revision), oldest
    first, those of `namespace` when given, as JSON-ready dicts (raw key, value and
    header values base64-encoded)."""
    where, params = ("", ()) if namespace is None else (" WHERE namespace = ?", (namespace,))
    rows = routing._query(
        "SELECT seq, consumer, location, position, message_key, message_value, "
        "headers_json, reason, parked_at, namespace, snapshot_kind, document_id, revision "
        f"FROM dead_letters{where} ORDER BY seq LIMIT ?",
        (*params, limit),
    )
    out: list[dict[str, Any]] = []
    for row in rows:
        seq, consumer, location, position, key, value, headers, reason, parked_at = row[:9]
        ns, kind, doc, revision = row[9:]
        out.append(
            {
                "seq": seq,
                "consumer": consumer,
                "where": location,
                "position": position,
                "reason": reason,
                "parked_at": parked_at,
                "namespace": ns,
                "snapshot_kind": kind,
                "document_id": doc,
                "revision": revision,
                "key_base64": None if key is None else _b64(key),
                "value_base64": _b64(value),
                "headers": json.loads(str(headers)),
            }
        )
    return out


def _b64(raw: object) -> str:
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    return base64.b64encode(data).decode("ascii")
