"""Use case of the outbox relay: copy unpublished outbox events to the event log."""

from __future__ import annotations

from contracts.faults import crash_point
from ingest.relay_ports import EventPublisher, OutboxRelaySource

__all__ = ["relay_outbox"]


def relay_outbox(
    *,
    source: OutboxRelaySource,
    publisher: EventPublisher,
    batch_size: int,
    max_batches: int | None = None,
) -> int:
    """Publish unpublished outbox rows in position order; return how many were published.

    Each batch is read, published, and marked only after the publisher returned (the
    log acknowledged every row), with where the log holds each row (its placement).
    When publishing fails the error propagates and the batch stays unmarked, so the
    next call publishes it again: nothing is lost, and a row may reach the log more
    than once. Stops when a batch comes back short (the
    outbox is drained) or after `max_batches` batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    published = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        rows = source.unpublished(batch_size)
        if not rows:
            break
        placements = publisher.publish(rows)
        crash_point("relay.published")
        source.mark_published([row.position for row in rows], placements)
        published += len(rows)
        batches += 1
        if len(rows) < batch_size:
            break
    return published
