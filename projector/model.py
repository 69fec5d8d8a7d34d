"""Pure projection logic: which events of a batch change a generation, and how."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from contracts.events import RecordChanged
from contracts.records import Record

__all__ = ["BatchPlan", "plan_batch"]


@dataclass(slots=True)
class BatchPlan:
    """The effect of a batch on one generation.

    `upserts` and `deletes` hold only the newest revision per document, and only when it
    is newer than what the generation holds; `revisions` is the generation's new
    `(revision, deleted)` per touched document; `skipped` counts stale or duplicate events.
    """

    upserts: dict[str, Record] = field(default_factory=dict)
    deletes: dict[str, int] = field(default_factory=dict)
    revisions: dict[str, tuple[int, bool]] = field(default_factory=dict)
    skipped: int = 0


def plan_batch(events: Sequence[RecordChanged], current: Mapping[str, int]) -> BatchPlan:
    """Apply events idempotently on `(document_id, revision)`.

    `current` maps document ids to the revision the generation holds (live or
    tombstoned). An event whose revision is not newer is skipped, so duplicates and
    out-of-order delivery converge to the same end state.
    """
    plan = BatchPlan()
    newest: dict[str, Record] = {}
    for event in events:
        record = event.record
        doc_id = record.doc_id
        best = newest.get(doc_id)
        held = current.get(doc_id)
        if (held is not None and record.revision <= held) or (
            best is not None and record.revision <= best.revision
        ):
            plan.skipped += 1
            continue
        if best is not None:
            plan.skipped += 1
        newest[doc_id] = record
    for doc_id, record in newest.items():
        if record.deleted:
            plan.deletes[doc_id] = record.revision
        else:
            plan.upserts[doc_id] = record
        plan.revisions[doc_id] = (record.revision, record.deleted)
    return plan
