"""Ports of ingest: the canonical record store with its transactional outbox."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from contracts.koutendb_io import BackupResponse, CompactResponse
from contracts.records import Record
from ingest.model import Outcome

__all__ = ["Head", "Job", "JobStore", "ProjectionProgress", "RecordStore", "StoreMaintenance"]


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

    def write(
        self, records: Sequence[Record], *, stored_json: Sequence[str | None] | None = None
    ) -> list[Outcome]:
        """`stored_json[i]`, when given and not None, is `records[i].model_dump_json()`
        (the caller serialized it already, `contracts.admission.sized_record_json`):
        stored as is instead of serializing the record again."""

    def heads(self, document_ids: Sequence[str]) -> list[Head]:
        """The newest revision of each listed document that was ever written (deleted
        ones included, so a writer can pick the next revision); unknown ids are left
        out. Callers filter by namespace and galaxy."""

    def high_water(self) -> int:
        """The position of the newest outbox event (0 when empty)."""

    def live_records(self, namespace: str, snapshot_kind: str, galaxy: str) -> Iterator[Record]:
        """The head revision of every live (not deleted) document of one scope and galaxy,
        in `item_id` order, all from one consistent snapshot of the store (writes that
        commit meanwhile are not seen). Read lazily; close the iterator (or exhaust it)
        to release the snapshot."""

    def close(self) -> None: ...


class StoreMaintenance(Protocol):
    """Backups and compaction of the canonical store (with the generation registry when
    it shares the store's database).

    Guarantees:
    - `backup` writes a consistent snapshot under `name` or nothing: a backup that fails
      at any point leaves nothing visible under its name;
    - `verify` re-reads a backup and answers the same counts `backup` answered, or
      `409 invalid_state` naming what differs;
    - `compact` keeps every live document's head revision, every revision a generation
      lists and every outbox row a reader has not passed; live data stays retrievable.
    A store that cannot do one of them raises a `4xx` `OrreryError` saying what to use.
    """

    def backup(self, name: str) -> BackupResponse: ...

    def verify(self, name: str) -> BackupResponse: ...

    def compact(self) -> CompactResponse: ...


class ProjectionProgress(Protocol):
    """How far the indexes of this process are behind its store's log (the embedded
    deployment: `contracts.progress.LogProgress`).

    Guarantees: `applied` only grows, and every event at or below it is searchable;
    `lag()` counts the committed events above it, `lag(namespace)` those of one
    namespace.
    """

    @property
    def applied(self) -> int: ...

    def lag(self, namespace: str | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class Job:
    """One async bulk write (ChonkyDB's `records/bulk` with `execution_mode: async`).

    `tenant`: the namespace the job wrote to (the unit its history is bounded in; `""`
    for a batch over several namespaces, possible only without API keys); `owner`: who
    may read it (`contracts.auth` reach of the key, `""` for an open instance);
    `result`: the sync answer's JSON once done; `updated_at`: seconds since the epoch
    of the last state change."""

    job_id: str
    tenant: str
    owner: str
    status: str
    items: int
    result: dict[str, object] | None = None
    error: str | None = None
    document_ids: tuple[str, ...] = ()
    updated_at: float = 0.0


class JobStore(Protocol):
    """Async bulk jobs, shared by every worker on the same database and kept across
    restarts.

    Guarantees: a job `put` by one worker is `get`-able by any other as soon as `put`
    returns; `finish` replaces its state atomically; each tenant keeps at most
    `history` jobs (its oldest dropped first, never another tenant's)."""

    def put(self, job: Job, *, history: int) -> None: ...

    def finish(self, job: Job) -> None:
        """Record a job's new state (`running`, `done`, `failed`) and its outcome."""
        ...

    def get(self, job_id: str) -> Job | None: ...

    def close(self) -> None: ...
