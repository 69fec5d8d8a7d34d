"""One namespace's events not applied yet, as SQL over the shared schema (issue 22, exact
on a partitioned log since session 19).

Read by a tenant's readiness (`query.adapters.sqlite_routing` / `postgres_routing`) and by
server-mode pacing (`ingest.adapters.postgres_backlog`): both read the outbox (ingest's
tables) and the projector's positions, so the count is written once, here.

A namespace's pending events: those after `after` (the newest position applied for it,
or a floor every event below is applied up to), and, on a partitioned log (Kafka: the
relay recorded a row's partition and offset, or the projector applied an offset of the
namespace), those at or before `after` that are not applied yet — not published yet,
or published to a partition whose applied offset (`projector_partition_offsets`) is
below the row's. A namespace's partitions are applied side by side, so the newest
position applied may run ahead of an event another partition still holds; offsets
strictly increase within a partition whichever relay published, so an offset is an
exact test. Every part reads an index range of pending rows only
(`outbox_by_namespace`, `outbox_unpublished_by_namespace`, `outbox_by_placement`, one
probe per partition), so a poll costs what the namespace's backlog holds, not its
history. Rows published before the relay recorded placements count as applied up to
`after`.

The templates take `{ns}` / `{after}` (the driver's parameters or a subquery) and
`{column}` (what each pending row yields) through `str.format`.
"""

from __future__ import annotations

__all__ = ["PARTITION_FLOORS", "pending_rows"]

# `floors`: each partition the namespace's rows were published to (0 ..
# the highest recorded) with the newest offset applied there (-1: none yet);
# `partitioned`: whether the namespace's log is partitioned at all. Needs `WITH RECURSIVE`.
PARTITION_FLOORS = """
applied_offsets AS (
    SELECT kafka_partition AS part, kafka_offset AS off
    FROM projector_partition_offsets WHERE namespace = {ns}
),
top_partition AS (
    SELECT MAX(kafka_partition) AS part FROM outbox
    WHERE namespace = {ns} AND kafka_partition IS NOT NULL
),
partitioned AS (
    SELECT (EXISTS (SELECT 1 FROM applied_offsets)
            OR (SELECT part FROM top_partition) IS NOT NULL) AS yes
),
parts(part) AS (
    SELECT 0 WHERE (SELECT part FROM top_partition) IS NOT NULL
    UNION ALL
    SELECT part + 1 FROM parts WHERE part < (SELECT part FROM top_partition)
),
floors AS (
    SELECT part, COALESCE((SELECT off FROM applied_offsets a WHERE a.part = parts.part), -1)
        AS off
    FROM parts
)"""

_AFTER_OR_UNPUBLISHED = """
    SELECT {column} FROM outbox WHERE namespace = {ns} AND position > {after}
    UNION ALL
    SELECT {column} FROM outbox
    WHERE namespace = {ns} AND published_at IS NULL AND position <= {after}
      AND (SELECT yes FROM partitioned)
    UNION ALL"""

# SQLite's planner loops over `floors` and probes `outbox_by_placement` for each.
_PLACED_SQLITE = """
    SELECT {column} FROM floors f JOIN outbox o
      ON o.namespace = {ns} AND o.kafka_partition = f.part AND o.kafka_offset > f.off
    WHERE o.kafka_partition IS NOT NULL AND o.position <= {after}"""

# PostgreSQL hash-joins the plain join (reading every placed row of the namespace): a
# lateral subquery (`OFFSET 0`: never pulled up into a join) reads one index range per
# partition.
_PLACED_POSTGRES = """
    SELECT o.pending FROM floors f CROSS JOIN LATERAL (
        SELECT {column} AS pending FROM outbox
        WHERE namespace = {ns} AND kafka_partition = f.part AND kafka_offset > f.off
          AND kafka_partition IS NOT NULL AND position <= {after}
        OFFSET 0
    ) o"""


def pending_rows(*, postgres: bool, ns: str, after: str, column: str) -> str:
    """The `UNION ALL` of the namespace's pending rows, each yielding `column` (to follow
    `PARTITION_FLOORS` in the same `WITH RECURSIVE`)."""
    placed = _PLACED_POSTGRES if postgres else _PLACED_SQLITE
    return (_AFTER_OR_UNPUBLISHED + placed).format(ns=ns, after=after, column=column)
