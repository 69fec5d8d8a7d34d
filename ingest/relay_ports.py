"""Ports of the outbox relay (server mode): where unpublished events come from, where they go.

Embedded mode needs neither: there the outbox table is the log. In server mode a relay
copies outbox rows to the event log (Kafka) and marks them once the log has them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from contracts.events import outbox_event_json

__all__ = ["EventPublisher", "OutboxRelaySource", "OutboxRow", "Placement"]

# Where a partitioned log (Kafka) put one row: (partition of its topic, offset there).
Placement = tuple[int, int]


class OutboxRow(NamedTuple):
    """One outbox event awaiting publication.

    `event_json` is the `RecordChanged` exactly as the canonical store wrote it; the
    relay forwards it byte for byte and never re-serializes it.
    """

    position: int
    document_id: str
    namespace: str
    event_json: str
    # The W3C `traceparent` of the write (None: it was not traced).
    trace_context: str | None = None
    # The record's vector as float32 bytes, as the canonical store kept them beside its
    # JSON (`contracts.stored_vectors.float32_wire`; None: no vector, or written before
    # the store kept them): published beside the event (`contracts.events.VECTOR_HEADER`).
    vector_f32: bytes | None = None


def claimed_rows(rows: Iterable[Sequence[Any]]) -> list[OutboxRow]:
    """`OutboxRow`s from a relay's claim, one per row of (position, document id,
    namespace, event JSON, record JSON, traceparent, float32 bytes): the event is the
    row's own, or its record row's (`contracts.events.outbox_event_json`)."""
    return [
        OutboxRow(
            int(pos),
            str(doc),
            str(ns),
            str(outbox_event_json(event, record)),
            trace,
            None if vector is None else bytes(vector),
        )
        for pos, doc, ns, event, record, trace, vector in rows
    ]


class OutboxRelaySource(Protocol):
    """The canonical store's outbox, as the relay sees it.

    Guarantees:
    - `unpublished` returns rows not marked yet, oldest first (strictly increasing
      positions); a row is visible only after the transaction that wrote it committed.
    - `mark_published` is idempotent; a marked row is never returned again.
    - Nothing is deleted: a row that was never marked is returned again on every call,
      across restarts, until it is marked.
    """

    def unpublished(self, limit: int) -> list[OutboxRow]:
        """At most `limit` unmarked rows in position order (empty when all are marked)."""

    def mark_published(
        self, positions: Sequence[int], placements: Sequence[Placement] = ()
    ) -> None:
        """Mark rows as acknowledged by the log; unknown or marked positions are ignored.
        `placements` (empty, or one per position, in the same order) records where the
        log holds each row, with the mark: readiness counts a namespace's unapplied
        events per partition by them."""

    def pending(self) -> int:
        """How many rows are not marked yet (the outbox depth), as of one snapshot."""

    def close(self) -> None: ...


class EventPublisher(Protocol):
    """The transport that carries outbox events to the projectors (Kafka in server mode).

    Guarantees:
    - `publish` returns only after the transport durably acknowledged every row it was
      given. Otherwise it raises `DependencyUnavailable`, and the caller treats every
      row of the call as unpublished: some may have been delivered already, so a later
      call delivers them again (at-least-once; consumers dedupe on
      `(document_id, revision)`).
    - Rows of one document keep their relative order on the log (they share a key and
      therefore a partition).
    - Every delivered event carries its outbox position.
    - On a partitioned log `publish` returns each row's `Placement` (partition, offset)
      as the broker acknowledged it, one per row in order; a log without partitions
      returns an empty list.
    """

    def publish(self, rows: Sequence[OutboxRow]) -> list[Placement]:
        """Deliver `rows` (in position order) and wait for the transport's acknowledgement;
        where each row landed (see above)."""

    def close(self) -> None: ...
