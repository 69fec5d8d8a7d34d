"""Re-drive dead-lettered records after a fix (issue 22).

A record the projector could not apply was parked as a dead letter and its document
left its generations at that revision (`projector.service.PoisonGuard`). Once the cause
is fixed — an engine limit raised, an adapter bug fixed, the door taught a new rule —
`redrive_dead_letters` writes each such record again, unchanged, as the document's next
revision: an ordinary write, so it travels the ordinary way (outbox, log, projector)
on every transport, and the projector applies it like any other (or parks it again, if
it still cannot be applied). It spans the canonical store and the projector's state,
so it lives here, where the packages are composed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contracts.admission import check_record_size, record_problems
from contracts.errors import OrreryError
from contracts.events import RecordChanged
from ingest.ports import RecordStore
from ingest.service import write_records
from projector.ports import DeadLetter, DeadLetterBox

__all__ = ["RedriveOutcome", "redrive_dead_letters"]


@dataclass(frozen=True, slots=True)
class RedriveOutcome:
    """What became of one dead letter.

    - `redriven`: written again as `revision` (the next revision); letter removed.
    - `superseded`: the document has a newer revision (or was deleted) since; the letter
      is removed, nothing written (the newer revision is what counts).
    - `still_refused`: the record still breaks `contracts.admission` (`reason` says how);
      kept, nothing written — the producer must send a corrected revision.
    - `undecodable`: a message that is no record (kept; inspect it with
      `orrery project --dead-letters`).
    """

    seq: int
    outcome: Literal["redriven", "superseded", "still_refused", "undecodable"]
    namespace: str | None = None
    document_id: str | None = None
    revision: int | None = None
    reason: str = ""


def redrive_dead_letters(
    *,
    box: DeadLetterBox,
    store: RecordStore,
    dimension: int | None,
    max_record_bytes: int,
    namespace: str | None = None,
    limit: int = 1_000,
) -> list[RedriveOutcome]:
    """Re-drive the oldest `limit` dead letters (of `namespace`, when given); see the
    module docstring and `RedriveOutcome`. Idempotent: a letter is removed only after
    its record was written (a crash in between leaves the letter, whose next re-drive
    finds the document superseded by the written revision). A record over
    `max_record_bytes` (`ORRERY_MAX_RECORD_BYTES`) is still refused, as at the door."""
    letters = box.dead_letters(limit, namespace=namespace)
    outcomes: list[RedriveOutcome] = []
    done: list[int] = []
    for letter in letters:
        outcome = _redrive_one(letter, store, dimension, max_record_bytes)
        if outcome.outcome in ("redriven", "superseded"):
            done.append(letter.seq)
        outcomes.append(outcome)
    box.remove(done)
    return outcomes


def _redrive_one(
    letter: DeadLetter, store: RecordStore, dimension: int | None, max_record_bytes: int
) -> RedriveOutcome:
    if letter.document_id is None or letter.revision is None:
        return RedriveOutcome(letter.seq, "undecodable", reason=letter.message.reason)
    record = RecordChanged.model_validate_json(letter.message.value).record
    heads = store.heads([letter.document_id])
    head = heads[0] if heads else None
    if head is None or head.revision != letter.revision or head.deleted:
        return RedriveOutcome(
            letter.seq,
            "superseded",
            namespace=letter.namespace,
            document_id=letter.document_id,
            revision=letter.revision,
        )
    problems = record_problems(record, dimension=dimension)
    reason = ""
    if problems:
        first = problems[0]
        reason = f"{'.'.join(map(str, first.loc))}: {first.msg} ({first.type})"
    else:
        try:
            check_record_size(record, max_record_bytes=max_record_bytes)
        except OrreryError as exc:
            reason = f"{exc.message} ({exc.code.value})"
    if reason:
        return RedriveOutcome(
            letter.seq,
            "still_refused",
            revision=letter.revision,
            reason=reason,
            namespace=letter.namespace,
            document_id=letter.document_id,
        )
    again = record.model_copy(update={"revision": letter.revision + 1})
    result = write_records([again], store=store)
    if result.accepted != 1:
        # Written meanwhile by its producer: that newer revision is what counts.
        return RedriveOutcome(
            letter.seq,
            "superseded",
            namespace=letter.namespace,
            document_id=letter.document_id,
            revision=letter.revision,
        )
    return RedriveOutcome(
        letter.seq,
        "redriven",
        namespace=letter.namespace,
        document_id=letter.document_id,
        revision=again.revision,
    )
