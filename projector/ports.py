"""Ports of the projector: the log it reads, the indexes it writes, its own state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from contracts.events import LogEntry
from contracts.generations import GenerationDescriptor
from contracts.index import IndexDocument

__all__ = [
    "EventLog",
    "IndexEvidence",
    "LexicalIndex",
    "ProjectionState",
    "VectorCache",
    "VectorIndex",
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

    def create(self, generation_id: str) -> None:
        """Create an empty index for `generation_id` (no-op if it exists)."""

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

    def create(self, generation_id: str, dimension: int) -> None: ...

    def apply(
        self,
        generation_id: str,
        upserts: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
    ) -> None: ...

    def evidence(self, generation_id: str) -> IndexEvidence: ...

    def drop(self, generation_id: str) -> None: ...

    def close(self) -> None: ...


class EventLog(Protocol):
    """A log of `RecordChanged` events, consumed by one projector (group).

    Guarantees: `fetch` returns entries after the reader's acknowledged position, in
    log order per document (all events of one document keep their relative order);
    entries not acknowledged may be returned again after a restart (at-least-once).
    `LogEntry.position` is the event's outbox position in the canonical store, on
    every transport.
    """

    def fetch(self, limit: int) -> list[LogEntry]:
        """The next entries (at most `limit`); an empty list when none are waiting."""

    def acknowledge(self, entries: Sequence[LogEntry]) -> None:
        """Mark entries consumed; called only after their effects were committed."""

    def reset(self) -> None:
        """Forget unacknowledged fetches: the next `fetch` delivers them again."""

    def high_water(self) -> int:
        """The newest position on the log (0 when empty)."""

    def close(self) -> None: ...


class ProjectionState(Protocol):
    """The projector's own bookkeeping.

    Guarantees: `commit` stores the position and all generations' document revisions in
    one transaction, so a crash replays the batch, never half of it.
    """

    def position(self, consumer: str) -> int: ...

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]: ...

    def commit(
        self,
        consumer: str,
        position: int,
        changes: Mapping[str, Mapping[str, tuple[int, bool]]],
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
    ) -> GenerationDescriptor: ...


class VectorCache(Protocol):
    """Vectors by `text_digest(embedder_id, text)`: each text is embedded once, ever."""

    def cached_vectors(self, keys: Iterable[str]) -> dict[str, tuple[float, ...]]: ...

    def store_vectors(self, vectors: Mapping[str, Sequence[float]]) -> None: ...
