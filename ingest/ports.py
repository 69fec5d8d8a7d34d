"""Ports of ingest: the canonical record store with its transactional outbox."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from contracts.records import Record
from ingest.model import Outcome

__all__ = ["RecordStore"]


class RecordStore(Protocol):
    """The authoritative store of record revisions, with an outbox.

    Guarantees:
    - `write` stores each accepted record and its outbox event in the same transaction;
      a record whose revision is not newer than the stored head is rejected alone, and
      nothing else in the batch is lost. Every revision ever accepted stays readable.
    - Outbox positions strictly increase in commit order.
    """

    def write(self, records: Sequence[Record]) -> list[Outcome]: ...

    def high_water(self) -> int:
        """The position of the newest outbox event (0 when empty)."""

    def close(self) -> None: ...
