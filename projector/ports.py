"""Ports of the projector: the log it reads, the indexes it writes, its own state."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from contracts.admin import GenerationRow
from contracts.events import LogEntry
from contracts.generations import EvidenceCheck, GenerationDescriptor, GenerationState, Topology
from contracts.index import IndexDocument
from contracts.index_fields import DEFAULT_TEXT_ANALYZER
from contracts.pacing import Pace, no_pace
from contracts.qualification import QualificationReceipt
from contracts.records import Record

__all__ = [
    "AliasMirror",
    "CanonicalSnapshot",
    "CopyRead",
    "CopyReadback",
    "DeadLetter",
    "DeadLetterBox",
    "EngineReadback",
    "EventLog",
    "EvidenceLog",
    "GenerationContents",
    "GenerationMaintenance",
    "GenerationRegistry",
    "IndexEvidence",
    "LexicalIndex",
    "LogHealth",
    "PointReadback",
    "ProjectionState",
    "ReceiptLog",
    "RegistrySnapshot",
    "RejectedRecord",
    "RingStatistics",
    "SnapshotKeys",
    "Undecodable",
    "VectorCache",
    "VectorIndex",
    "WriterLock",
]


class IndexEvidence(BaseModel):
    """What an engine holds for one generation, read back from the engine itself."""

    model_config = ConfigDict(frozen=True)

    document_count: int
    id_set_digest: str


class LexicalIndex(Protocol):
    """An engine's fielded BM25 indexes, one per generation id.

    Guarantees:
    - `apply` is atomic per call and visible to searches when it returns.
    - An upsert never replaces a newer revision of the same document; a delete at
      revision r removes the document only if its present revision is <= r. Applying the
      same call twice leaves the same state.
    - `evidence` is computed from what the engine returns, not from bookkeeping.
    """

    def create(
        self,
        generation_id: str,
        *,
        text_analyzer: str = DEFAULT_TEXT_ANALYZER,
        shards: int = 1,
        replicas: int = 0,
    ) -> None:
        """Create an empty index for `generation_id` (no-op if it exists) whose text
        fields use `text_analyzer` (`contracts.index_fields`); the index records it, so
        that searches analyze query text the same way. `INVALID_REQUEST` for an unknown
        analyzer, or for `shards`/`replicas` other than 1/0 on an engine that cannot
        spread an index."""

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None:
        """Write upserts and `(document_id, revision)` deletes in one commit."""

    def evidence(self, generation_id: str) -> IndexEvidence: ...

    def drop(self, generation_id: str) -> None:
        """Remove the generation's index and its files (no-op if absent)."""

    def close(self) -> None: ...


class VectorIndex(Protocol):
    """An engine's vector indexes (with filterable payload), one per generation id.

    Same guarantees as `LexicalIndex`; every upserted document carries a vector of the
    generation's dimension, anything else is rejected with `EMBEDDER_MISMATCH`.
    """

    def create(
        self, generation_id: str, dimension: int, *, shards: int = 1, replicas: int = 0
    ) -> None:
        """Create an empty index (no-op if it exists with the same dimension) spread
        over `shards` primaries with `replicas` extra copies each (`INVALID_REQUEST` on
        an engine that cannot spread an index)."""

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None: ...

    def evidence(self, generation_id: str) -> IndexEvidence: ...

    def drop(self, generation_id: str) -> None: ...

    def close(self) -> None: ...


class RingStatistics(Protocol):
    """Per generation, galaxy and ring: the live documents, the sum of their vectors and
    the sum of their unit vectors (a ring's centroid and coherence follow from these).

    Guarantees: `apply` takes what a `VectorIndex.apply` call takes, in one transaction,
    idempotent on `(document_id, revision)` like the engines; a document's contribution
    moves with it (a changed ring or vector, a delete). `drop` forgets a generation.
    """

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None: ...

    def drop(self, generation_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A message on the log that is not a valid `RecordChanged` event, as read.

    `where` locates it on its transport (`kafka:<topic>/<partition>@<offset>`,
    `outbox@<position>`) and is unique per log; `position` is its outbox position where
    the transport itself defines it (an outbox row) and None on Kafka, where the
    position header of a message that failed to decode is not trusted; `key`, `value`
    and `headers` are the raw bytes; `reason` says what failed.
    """

    where: str
    position: int | None
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    reason: str


class EventLog(Protocol):
    """A log of `RecordChanged` events, consumed by one projector (group).

    Guarantees: `fetch` returns entries after the reader's acknowledged position, in
    log order per document (all events of one document keep their relative order);
    entries not acknowledged may be returned again after a restart (at-least-once).
    `LogEntry.position` is the event's outbox position in the canonical store, on
    every transport. A message that cannot be decoded comes back as an `Undecodable`
    in its place — never skipped, never an exception that stalls the reader — and is
    acknowledged like any entry once the caller kept it.
    """

    def fetch(self, limit: int) -> list[LogEntry | Undecodable]:
        """The next entries (at most `limit`); an empty list when none are waiting."""

    def acknowledge(self, entries: Sequence[LogEntry | Undecodable]) -> None:
        """Mark entries consumed; called only after their effects were committed."""

    def reset(self) -> None:
        """Forget unacknowledged fetches: the next `fetch` delivers them again."""

    def high_water(self) -> int:
        """The newest position on the log (0 when empty)."""

    def lag(self) -> int:
        """How many messages on the log are not acknowledged yet by this reader (its
        consumer group, on Kafka: over every partition of every topic it reads, not only
        those this member owns). 0 means everything appended before the call was
        applied. Raises `DependencyUnavailable` when the log cannot be read."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    """A decoded event the projector could not apply, deterministically (a poison record).

    `position` is its log position (unique per log; None for a record a generation build
    loaded from the canonical snapshot, which has none), `record` the revision refused,
    `code` machine-readable (`contracts.admission` problem types such as `vector_zero`,
    or the engine's error code) and `reason` what failed. As a dead letter its `where` is
    `event@<position>`, or `record@<namespace>/<snapshot_kind>/<document_id>@<revision>`
    without a position.
    """

    position: int | None
    record: Record
    code: str
    reason: str

    @property
    def where(self) -> str:
        if self.position is not None:
            return f"event@{self.position}"
        r = self.record
        return f"record@{r.namespace}/{r.snapshot_kind}/{r.doc_id}@{r.revision}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the projector parked instead of applying, and when: an `Undecodable`
    message, or a `RejectedRecord` (then `namespace`, `snapshot_kind`, `document_id` and
    `revision` name it, and `message.value` holds its `RecordChanged` JSON)."""

    seq: int
    consumer: str
    message: Undecodable
    parked_at: datetime
    namespace: str | None = None
    snapshot_kind: str | None = None
    document_id: str | None = None
    revision: int | None = None


class DeadLetterBox(Protocol):
    """Where the projector parks messages it cannot decode and records it cannot apply.

    Guarantees: `park` and `park_rejected` are durable when they return and idempotent
    on `(consumer, where)` (a replayed batch parks nothing twice); `park_rejected` parks
    a record revision (namespace, snapshot kind, document id, revision) once, whoever
    refused it first (the projector or a generation build); parked messages are
    kept, raw bytes included, until `remove` deletes them (an operator's re-drive);
    `dead_letters` lists them oldest first, those of one namespace when it is given.
    """

    def park(self, consumer: str, messages: Sequence[Undecodable]) -> None: ...

    def park_rejected(self, consumer: str, rejected: Sequence[RejectedRecord]) -> None: ...

    def dead_letters(
        self, limit: int = 100, *, namespace: str | None = None
    ) -> list[DeadLetter]: ...

    def dead_letter_count(self) -> int: ...

    def remove(self, seqs: Collection[int]) -> int:
        """Delete the dead letters with these sequence numbers; how many there were."""


class LogHealth(Protocol):
    """The projector's measured log lag, for readiness (read by query workers).

    Guarantees: `record_lag` stores the lag measured while the consumer's committed
    position was `position` (read before the lag); the newest measurement wins.
    """

    def record_lag(self, consumer: str, *, position: int, lag_events: int) -> None: ...


class ProjectionState(Protocol):
    """The projector's own bookkeeping.

    Guarantees: `commit` stores the position and all generations' document revisions in
    one transaction, so a crash replays the batch, never half of it; every writable
    generation is then applied up to `position`, except those in `held` (their writes
    wait elsewhere: they keep their position until they replay the batch themselves).
    `namespaces` (namespace -> the newest position of its events in the batch) is stored
    in the same transaction where the deployment paces writers by it (PostgreSQL: the
    per-namespace backlog of server-mode ingest); positions per namespace only grow.
    `partitions` ((namespace, partition) -> the newest offset of its events in the batch,
    from a partitioned log) is stored in the same transaction; offsets per partition only
    grow. Readiness and pacing count a namespace's unapplied events exactly with them
    (its newest position alone may run ahead of an event on another partition).
    """

    def position(self, consumer: str) -> int: ...

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]: ...

    def commit(
        self,
        consumer: str,
        position: int,
        changes: Mapping[str, Mapping[str, tuple[int, bool]]],
        *,
        held: Collection[str] = (),
        namespaces: Mapping[str, int] | None = None,
        partitions: Mapping[tuple[str, int], int] | None = None,
    ) -> None: ...

    def write_targets(self, namespace: str, snapshot_kind: str) -> list[str]: ...

    def create_generation(
        self,
        namespace: str,
        snapshot_kind: str,
        *,
        embedder_id: str,
        embedder_dim: int,
        lexical_engine: str,
        vector_engine: str,
        schema_digest: str,
        make_live: bool,
        topology: Callable[[str], Topology] | None = None,
    ) -> GenerationDescriptor: ...


class VectorCache(Protocol):
    """Vectors by `text_digest(embedder_id, text)`: each text is embedded once, ever."""

    def cached_vectors(self, keys: Iterable[str]) -> dict[str, tuple[float, ...]]: ...

    def store_vectors(self, vectors: Mapping[str, Sequence[float]]) -> None: ...


# -- generations ---------------------------------------------------------------------------


class EngineReadback(Protocol):
    """Reads back what an engine holds for a generation.

    Guarantees: every `(document_id, revision)` pair comes from the engine itself (a
    scroll or a full search), never from bookkeeping; an id the engine holds twice is
    returned twice; order unspecified; a new list the caller owns (a check empties it,
    paced, once done). An unknown generation raises `NOT_FOUND` or
    `COVERAGE_UNAVAILABLE`. `pace` is called between chunks of the read (pages, batches
    of document reads), never while an engine resource is held.
    """

    def stored_pairs(
        self, generation_id: str, *, pace: Pace = no_pace
    ) -> list[tuple[str, int]]: ...


class PointReadback(Protocol):
    """An engine that also reads back named documents (optional beside `EngineReadback`:
    an evidence check then re-reads only the documents a concurrent batch moved).

    Guarantees: every `(document_id, revision)` pair the engine holds for one of
    `document_ids`, from the engine itself, an id held twice returned twice, an id not
    held absent; order unspecified. An unknown generation raises like `stored_pairs`.
    """

    def pairs_of(
        self, generation_id: str, document_ids: Sequence[str]
    ) -> list[tuple[str, int]]: ...


@dataclass(frozen=True)
class CopyRead:
    """What one copy of one shard holds: its pairs, or None and why it could not be read."""

    shard: int
    copy_index: int
    key: str
    pairs: list[tuple[str, int]] | None
    error: str = ""


class CopyReadback(Protocol):
    """An engine whose shard copies are each addressable (the Qdrant server layout).

    Guarantees: `copy_layout` is the generation's `(shards, copies per shard)`, `(1, 1)`
    when it keeps one copy; `document_shard` is the shard the engine places a document
    in (its own routing rule); `copy_pairs` reads every copy by itself (never through a
    merge of copies), each pair from the engine, in new lists the caller owns; a copy
    that cannot be read is returned with `pairs=None` and the error, never raised, so
    the others still count.
    """

    def copy_layout(self, generation_id: str) -> tuple[int, int]: ...

    def document_shard(self, generation_id: str, document_id: str) -> int: ...

    def copy_pairs(self, generation_id: str, *, pace: Pace = no_pace) -> list[CopyRead]: ...


class AliasMirror(Protocol):
    """A native alias an engine keeps for outside readers (OpenSearch, Qdrant).

    Guarantees: after `mirror_alias` returns, `alias` names this generation's index and
    nothing else; readers of the alias never see zero or two indexes.
    """

    def mirror_alias(self, alias: str, generation_id: str) -> None: ...


class WriterLock(Protocol):
    """Mutual exclusion of everything that writes a generation's indexes and registry rows
    (projector batches, snapshot loads) and of consistent evidence reads.

    Guarantees: while `hold()` is entered no other holder — thread or process of this
    host — is inside it; re-entrant within one thread.
    """

    def hold(self) -> AbstractContextManager[None]: ...


@dataclass(frozen=True, slots=True)
class SnapshotKeys:
    """The canonical store's live documents of one scope at log position `high_water`,
    and its deleted ones (`tombstones`: the revision of each document's delete), which a
    generation built from the snapshot must hold so that an older upsert delivered again
    later cannot bring a deleted document back."""

    high_water: int
    keys: list[tuple[str, int]]
    tombstones: list[tuple[str, int]] = field(default_factory=list)


class CanonicalSnapshot(Protocol):
    """Reads the canonical record store (records, heads, outbox) for builds and checks.

    Guarantees: `snapshot_keys` is one consistent read (every event up to `high_water`
    and none after it); `records` returns exactly the requested revisions (revisions are
    never rewritten); `live_pairs_at(p)` is the scope's live set after applying every
    event with position <= p.
    """

    def snapshot_keys(self, namespace: str, snapshot_kind: str) -> SnapshotKeys: ...

    def records(self, keys: Sequence[tuple[str, int]]) -> list[Record]: ...

    def live_pairs_at(
        self, namespace: str, snapshot_kind: str, position: int
    ) -> list[tuple[str, int]]: ...

    def high_water(self) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """The registry's live `(document_id, revision)` set of one generation, read in one
    transaction with its `applied_position` and `commit_seq`; `pairs` is a new dict the
    caller owns (an eligibility check empties it, paced, once done)."""

    generation_id: str
    state: GenerationState
    pairs: dict[str, int]
    applied_position: int
    commit_seq: int


class GenerationRegistry(Protocol):
    """Generation rows, descriptors and live pointers.

    Guarantees: `save_descriptor` and `switch_live` are compare-and-set (they raise
    `INVALID_STATE` and change nothing when the generation's state, or the scope's live
    generation, is not the expected one); `switch_live` moves the pointer and both
    descriptors in one transaction, so a reader sees the old or the new live generation,
    never none or two.
    """

    def begin_generation(
        self,
        namespace: str,
        snapshot_kind: str,
        *,
        embedder_id: str,
        embedder_dim: int,
        schema_digest: str,
        topology: Callable[[str], Topology],
        at: datetime,
    ) -> GenerationDescriptor:
        """Register a new generation in state `building` (it takes writes at once)."""

    def generation(self, generation_id: str) -> tuple[GenerationRow, GenerationDescriptor]:
        """The row and the stored descriptor; `NOT_FOUND` for an unknown id."""

    def generation_rows(
        self, namespace: str | None = None, snapshot_kind: str | None = None
    ) -> list[tuple[GenerationRow, GenerationDescriptor]]: ...

    def save_descriptor(
        self, descriptor: GenerationDescriptor, *, expect: frozenset[GenerationState]
    ) -> None: ...

    def switch_live(
        self,
        promoted: GenerationDescriptor,
        demoted: GenerationDescriptor | None,
        *,
        expected_live: str | None,
        at: datetime,
    ) -> None:
        """Point the scope at `promoted` (verified → live) if its live generation is still
        `expected_live`, and store `demoted` (that generation, live → verified) — one
        transaction."""


class GenerationContents(Protocol):
    """Per-generation document bookkeeping outside the projector's batches.

    Guarantees: `record_documents` keeps the newer revision per document (a write at an
    older or equal revision changes nothing) and counts as a commit (`commit_seq`
    moves); `mark_applied` never lowers a position; `registry_pairs` is one consistent
    read.
    """

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]: ...

    def record_documents(
        self, generation_id: str, changes: Mapping[str, tuple[int, bool]]
    ) -> None: ...

    def mark_applied(self, generation_id: str, position: int) -> None: ...

    def registry_pairs(self, generation_id: str) -> RegistrySnapshot: ...

    def commit_seq(self, generation_id: str) -> int: ...


class GenerationMaintenance(Protocol):
    """Build heartbeats, orphaned builds and dropped indexes."""

    def heartbeat(self, generation_id: str) -> None: ...

    def fail_orphaned_builds(self, reason: str, *, older_than: datetime | None) -> list[str]:
        """Mark `building` generations failed (all, or those whose last heartbeat is older
        than `older_than`); returns their ids."""

    def mark_indexes_dropped(self, generation_id: str) -> None: ...


class ReceiptLog(Protocol):
    """Qualification receipts per generation (`contracts.qualification`).

    Guarantees: a stored receipt is never changed or removed while its generation is
    registered; storing a receipt again (same `receipt_id`) is a no-op; `receipts`
    lists a generation's receipts newest first.
    """

    def record_receipt(self, receipt: QualificationReceipt) -> None: ...

    def receipts(self, generation_id: str) -> list[QualificationReceipt]: ...


class EvidenceLog(Protocol):
    """Evidence checks per generation, newest last.

    Guarantees: a recorded check is never changed; `checks_since` returns checks in the
    order they were recorded, with their sequence numbers.
    """

    def record_check(self, check: EvidenceCheck) -> None: ...

    def latest_checks(self, generation_id: str, limit: int = 5) -> list[EvidenceCheck]: ...

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]: ...
