"""`projector.adapters.kafka_wire.DeliveryLedger`, which both Kafka event logs commit by:
a commit never passes a delivery still pending, whatever order acknowledgements come in."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from contracts.events import LogEntry
from contracts.records import Record
from projector.adapters.kafka_wire import Delivered, DeliveryLedger, Partition


def _entry(position: int) -> LogEntry:
    record = Record(namespace="ns", snapshot_kind="objects", item_id=f"i{position}", revision=1)
    return LogEntry.model_validate(
        {"position": position, "event": {"event_type": "record_changed", "record": record}}
    )


@st.composite
def deliveries_and_acks(draw: st.DrawFn) -> tuple[list[Delivered], list[list[int]]]:
    counts = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    delivered = [
        Delivered(_entry(100 * p + o + 1), ("t", p), 10 + o, 0)
        for p, count in enumerate(counts)
        for o in range(count)
    ]
    order = draw(st.permutations(range(len(delivered))))
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=4)))
    bounds = [0, *cuts, len(order)]
    return delivered, [list(order[a:b]) for a, b in itertools.pairwise(bounds)]


@given(deliveries_and_acks())
def test_commits_never_pass_a_pending_delivery_and_end_after_the_last(
    case: tuple[list[Delivered], list[list[int]]],
) -> None:
    delivered, acks = case
    ledger = DeliveryLedger()
    entries = ledger.deliver(delivered)
    assigned = {d.partition for d in delivered}
    committed: dict[Partition, int] = {}
    acked: set[int] = set()
    for batch in acks:
        taken = ledger.take([entries[i] for i in batch])
        assert sorted(id(d.entry) for d in taken) == sorted(id(entries[i]) for i in batch)
        acked |= set(batch)
        for partition, (offset, _) in ledger.commit_offsets(taken, assigned).items():
            assert offset >= committed.get(partition, 0)  # never goes back
            committed[partition] = offset
        for partition, offset in committed.items():
            pending = [
                d.offset
                for i, d in enumerate(delivered)
                if d.partition == partition and i not in acked
            ]
            assert not pending or offset <= min(pending)
    for partition in assigned:
        assert committed[partition] == 1 + max(
            d.offset for d in delivered if d.partition == partition
        )


def test_a_revoked_partition_is_never_committed() -> None:
    ledger = DeliveryLedger()
    mine, revoked = Delivered(_entry(1), ("t", 0), 5, 0), Delivered(_entry(2), ("t", 1), 7, 0)
    entries = ledger.deliver([mine, revoked])
    assert ledger.commit_offsets(ledger.take(entries), {("t", 0)}) == {("t", 0): (6, 0)}
