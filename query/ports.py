"""Ports of the query worker: candidate sources, the record store, routing, cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from contracts.index import Candidate, SearchFilter

__all__ = [
    "Cache",
    "LexicalSearch",
    "RecordReader",
    "Route",
    "Routing",
    "ScopeReadiness",
    "StoredRecord",
    "VectorSearch",
]


class LexicalSearch(Protocol):
    """BM25 over one generation's lexical index.

    Guarantees: `filter` restricts before scoring and never changes scores; at most
    `limit` candidates, best first, ties broken by `document_id` ascending; an empty
    `query_text` returns filter matches scored 0.0.
    """

    def search(
        self, generation_id: str, query_text: str, filter: SearchFilter, limit: int
    ) -> list[Candidate]: ...


class VectorSearch(Protocol):
    """Nearest neighbours (cosine) over one generation's vector index.

    Guarantees: `filter` restricts before scoring; at most `limit` candidates, best
    first; scores are cosine similarities in [-1, 1].
    """

    def search(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        limit: int,
    ) -> list[Candidate]: ...


class Route(BaseModel):
    """Where a scope's queries go now."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    snapshot_kind: str
    generation_id: str
    applied_position: int
    commit_seq: int
    embedder_id: str
    document_count: int


class ScopeReadiness(BaseModel):
    model_config = ConfigDict(frozen=True)

    namespace: str
    snapshot_kind: str
    generation_id: str
    state: str
    document_count: int
    applied_position: int


class Routing(Protocol):
    """The live pointer per `(namespace, snapshot_kind)`, read by query workers.

    Guarantees: `route` reflects one committed pointer (never a half-switched state).
    """

    def route(self, namespace: str, snapshot_kind: str) -> Route | None: ...

    def scopes(self) -> list[ScopeReadiness]: ...

    def log_high_water(self) -> int: ...


class StoredRecord(BaseModel):
    """One stored revision as the canonical store holds it."""

    model_config = ConfigDict(frozen=True)

    document_id: str
    revision: int
    item_id: str
    namespace: str
    snapshot_kind: str
    galaxy: str
    deleted: bool
    payload_sha256: str
    record_json: str


class RecordReader(Protocol):
    """Reads the authoritative record store.

    Guarantees: `fetch` returns exactly the requested revisions (revisions are never
    rewritten), so a payload always matches the generation that ranked it.
    """

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]: ...

    def heads(self, namespace: str, document_ids: Sequence[str]) -> list[StoredRecord]:
        """The current (non-deleted) revision of each listed document that exists."""


class Cache(Protocol):
    """A byte cache with TTLs (responses, query embeddings).

    Guarantees: `get` returns exactly what `set` stored under the key, or None (absent,
    expired or evicted); a cache never makes an answer wrong — keys bind everything the
    value depends on. Failures raise `DependencyUnavailable`; callers then go uncached.
    """

    @property
    def name(self) -> str: ...

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl_seconds: float) -> None: ...

    def close(self) -> None: ...
