"""Ports of ingest: the canonical record store with its transactional outbox."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from contracts.records import Record
from ingest.model import Outcome

__all__ = ["Head", "RecordStore"]


@dataclass(frozen=True, slots=True)
class Head:
    """A document's newest stored revision (a tombstone too) and its identity."""

    document_id: str
    namespace: str
    galaxy: str
    snapshot_kind: str
    item_id: str
    revision: int
    deleted: bool


class RecordStore(Protocol):
    """The authoritative store of record revisions, with an outbox.

    Guarantees:
    - `write` stores each accepted record and its outbox event in the same transaction;
      a record whose revision is not newer than the stored head is rejected alone, and
      nothing else in the batch is lost. Every revision ever accepted stays readable.
    - Outbox positions strictly increase in commit order.
    """

    def write(self, records: Sequence[Record]) -> list[Outcome]: ...

    def heads(self, document_ids: Sequence[str]) -> list[Head]:
        """The newest revision of each listed document that was ever written (deleted
        ones included, so a writer can pick the next revision); unknown ids are left
        out. Callers filter by namespace and galaxy."""

    def high_water(self) -> int:
        """The position of the newest outbox event (0 when empty)."""

    def close(self) -> None: ...
