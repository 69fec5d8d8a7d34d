"""Each namespace's backlog in server mode on PostgreSQL (issue 22): the namespace's
outbox rows the projector has not applied yet, for `ingest.pacing`.

The projector stores, with each batch, the newest position it applied per namespace
(`projector_namespace_positions`, the projector's migration 0005) and, after each batch,
its log lag (`projector_log_status`: a lag of 0 at position P means every event up to P
is applied). A namespace's backlog is the count of its outbox rows above the larger of
the two, plus, on Kafka, its rows at or below it that are not applied yet: a namespace's
partitions are applied side by side, so its newest applied position may run ahead of an
event still queued in another partition. Those are counted exactly by where the relay
published each row (`outbox.kafka_partition` / `kafka_offset`, ingest's migration 0006)
against the newest offset the projector applied per partition
(`projector_partition_offsets`, the projector's migration 0006), or not published yet.
The same count as a tenant's readiness (`contracts.namespace_backlog`, shared with
`query.adapters.sqlite_routing`), each part an index range of pending rows.
Rows published before placements were recorded count as applied up to the bound.
"""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from contracts.namespace_backlog import PARTITION_FLOORS, pending_rows
from ingest.adapters.postgres_db import driver_errors, open_pool

__all__ = ["PostgresBacklog"]

_FLOOR = "(SELECT COALESCE(MAX(position), 0) FROM projector_log_status WHERE lag_events = 0)"

_BOUND = "(SELECT position FROM bound)"
_NAMESPACE_BACKLOG = f"""
WITH RECURSIVE
bound AS (
    SELECT GREATEST(COALESCE((SELECT position FROM projector_namespace_positions
                              WHERE namespace = %(ns)s), 0), {_FLOOR}) AS position
),
{PARTITION_FLOORS.format(ns="%(ns)s")}
SELECT COUNT(*) FROM ({pending_rows(postgres=True, ns="%(ns)s", after=_BOUND, column="1")}
    LIMIT %(limit)s
) AS pending
"""


class PostgresBacklog:
    """`ProjectionProgress` over the canonical store's outbox and the projector's
    positions in one PostgreSQL database.

    Guarantees: `lag(namespace)` counts only that namespace's outbox rows not applied
    yet (exactly, see the module docstring; index ranges of pending rows only), at most
    `count_limit` of them (a bound's check needs no
    more: reading stops there); `applied` is the newest position up to which every event
    is applied (0 before the projector measured a lag of 0). Driver errors are
    `DependencyUnavailable`."""

    def __init__(self, url: str, *, count_limit: int, pool_size: int = 2) -> None:
        self._count_limit = max(1, count_limit)
        self._pool: ConnectionPool = open_pool(url, max_size=pool_size, name="orrery-backlog")

    @property
    def applied(self) -> int:
        with driver_errors("read the projector's position"), self._pool.connection() as conn:
            row = conn.execute(f"SELECT {_FLOOR}").fetchone()
        return 0 if row is None else int(row[0])

    def lag(self, namespace: str | None = None) -> int:
        with driver_errors("read a namespace's backlog"), self._pool.connection() as conn:
            if namespace is None:
                row = conn.execute(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE position > "
                    f"{_FLOOR} LIMIT %s) AS pending",
                    (self._count_limit,),
                ).fetchone()
            else:
                row = conn.execute(
                    _NAMESPACE_BACKLOG, {"ns": namespace, "limit": self._count_limit}
                ).fetchone()
        return 0 if row is None else int(row[0])

    def close(self) -> None:
        self._pool.close()
