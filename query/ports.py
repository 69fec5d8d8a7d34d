"""Ports of the query worker: candidate sources, the record store, routing, cache."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from contracts.errors import ErrorCode, OrreryError
from contracts.generations import CoverageFallback, EvidenceCheck
from contracts.index import Candidate, SearchFilter
from contracts.pacing import Pace, no_pace

__all__ = [
    "Answered",
    "Cache",
    "EnvelopeLog",
    "EvidenceSource",
    "HeadFacts",
    "HeadListing",
    "KeptEnvelope",
    "LexicalSearch",
    "NamespaceLog",
    "ProjectorLogStatus",
    "QueryObserver",
    "RecordReader",
    "RingStat",
    "RingStatistics",
    "Route",
    "RouteAdmission",
    "Routing",
    "ScopeReadiness",
    "SearchProfiles",
    "StoredProfile",
    "StoredRecord",
    "VectorSearch",
    "answer_too_large",
]


class Answered(NamedTuple):
    """One answered query as its observers see it: milliseconds per stage
    (`query_plan.latency_ms` without `total`) and inside engine calls, the response
    cache's result (hit, miss, unavailable, disabled), and the candidates each source
    returned. The mappings are the query's own and are not changed after it is told."""

    endpoint: str
    stages_ms: Mapping[str, float]
    engine_ms: Mapping[str, float]
    cache: str
    source_counts: Mapping[str, int]


class QueryObserver(Protocol):
    """Told about every answered query (metrics, spans: `orrery.telemetry`).

    Guarantees asked of an implementation: it returns quickly (well under a
    microsecond for metrics, which only queue the answer for the next scrape: it runs
    on the request's thread before the answer leaves) and never raises.
    """

    def answered(self, answer: Answered) -> None:
        """One answer (`Answered`)."""


class LexicalSearch(Protocol):
    """BM25 over one generation's lexical index.

    Guarantees: `filter` restricts before scoring and never changes scores; at most
    `limit` candidates, best first, ties broken by `document_id` ascending; an empty
    `query_text` returns filter matches scored 0.0. `field_boosts` replaces the default
    boost (`contracts.index.DEFAULT_FIELD_BOOSTS`) of each text field it names; a boost
    of 0 leaves that field out.
    """

    def search(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        limit: int,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> list[Candidate]: ...

    def scores(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """The score `search` gives each document `filter` lets through, by document id,
        without building candidates. `filter.document_ids` must be set (it bounds the
        work); documents that match no query term are absent, blank text scores every
        match 0.0."""


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

    def scores(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        *,
        revisions: Mapping[str, int] | None = None,
        tenant: str = "",
    ) -> dict[str, float]:
        """The exact cosine of each document `filter` lets through, by document id: the
        score `search` gives it wherever `search` is exact, without building candidates.
        `filter.document_ids` must be set (it bounds the work).

        `revisions`: the revision the caller found each listed document at, through this
        same `filter` (the re-score's lexical candidates, whose payloads are answered at
        those revisions). An adapter that kept the vector of a document at the revision
        named may score it without asking the engine (equal to the engine's score to
        float32 rounding, and consistent with the revision answered); otherwise the
        document is scored as without `revisions`, at the point the index holds now.

        `tenant`: the namespace asking (the generation's). Vectors an adapter keeps are
        kept per tenant: one tenant's lookups never evict another's; it never changes a
        score."""


class Route(BaseModel):
    """Where a scope's queries go now.

    `state` and `descriptor_digest` are the generation's registry row; `fallback` is set
    when the eligibility gate routed to another generation than the live one.
    """

    model_config = ConfigDict(frozen=True)

    namespace: str
    snapshot_kind: str
    generation_id: str
    applied_position: int
    commit_seq: int
    embedder_id: str
    document_count: int
    state: str = "live"
    descriptor_digest: str = ""
    fallback: CoverageFallback | None = None


class ScopeReadiness(BaseModel):
    """A scope's live generation as the registry shows it (`commit_seq`: its committed
    batches; None when the routing does not say; `dead_letters`: the scope's records
    the projector could not apply and parked, see `orrery project --dead-letters`)."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    snapshot_kind: str
    generation_id: str
    state: str
    document_count: int
    applied_position: int
    descriptor_digest: str = ""
    commit_seq: int | None = None
    dead_letters: int = 0


class ProjectorLogStatus(BaseModel):
    """The projector's last measurement of its event log (see `Routing.log_status`).

    `lag_events` messages on the log were not acknowledged by `consumer` when it had
    committed up to `position`; a measurement with `position` below the log's high
    water predates the newest events, so it cannot vouch for them. `dead_letters` counts
    the undecodable messages parked so far.
    """

    model_config = ConfigDict(frozen=True)

    consumer: str
    position: int
    lag_events: int
    measured_at: datetime
    dead_letters: int = 0


@dataclass(frozen=True, slots=True)
class NamespaceLog:
    """One namespace's events on the log: its newest position (0: none), how many are
    pending after a given position (see `Routing.namespace_log`) and when the oldest of
    those was written; `applied`: the
    newest position of its events the projector applied (0: none yet; stored with each
    batch, `projector_namespace_positions`), `dead_letters`: its records parked."""

    high_water: int
    pending: int
    oldest_pending_at: datetime | None
    applied: int = 0
    dead_letters: int = 0


class Routing(Protocol):
    """The live pointer per `(namespace, snapshot_kind)`, read by query workers.

    Guarantees: `route` reflects one committed pointer (never a half-switched state).
    """

    def route(self, namespace: str, snapshot_kind: str) -> Route | None: ...

    def generation(self, generation_id: str) -> Route | None:
        """The route to one generation in whatever state it is (`state` says which; its
        own `namespace` and `snapshot_kind`), or None when the registry has no such
        generation or its indexes were dropped. Reads one registry row: cheap enough for
        every query (pins, cursors, cached scope resolutions)."""

    def scopes(self) -> list[ScopeReadiness]: ...

    def log_high_water(self) -> int: ...

    def fallback_routes(self, namespace: str, snapshot_kind: str, exclude: str) -> list[Route]:
        """The scope's verified generations other than `exclude`, the one most recently
        live first (then newest first)."""

    def oldest_unapplied_at(self, position: int) -> datetime | None:
        """When the oldest event after `position` was written (None: nothing waits)."""

    def log_status(self) -> ProjectorLogStatus | None:
        """The newest lag measurement of any projector consumer (None: none recorded)."""

    def namespace_log(self, namespace: str, after: int) -> NamespaceLog:
        """One namespace's own view of the log: its newest position, and its pending
        events (how many, when the oldest was written): those after `after`, and on a
        partitioned log also those at or before it the projector has not applied yet
        (not published, or on a partition whose applied offset is below theirs).
        Guarantee: with `after` at or past the projector's newest applied position of
        the namespace, `pending` is 0 only when every event of the namespace written so
        far is applied (published before placements were recorded: up to `after`)."""


class RouteAdmission(Protocol):
    """Replica eligibility on the query path.

    Guarantees: `admit` returns a route to a generation whose evidence matched (the
    given one, or a declared fallback with `fallback` set) or raises
    `coverage_unavailable`; it never returns an ineligible route.
    """

    def admit(self, route: Route, scope_ref: str) -> Route: ...


class EvidenceSource(Protocol):
    """Reads a generation back from its engines and compares it with the registry.

    Guarantees: `check` never reports a match that the engines do not hold (it reads
    them back, consistently with the registry) and records its outcome; `checks_since`
    returns every check recorded after `sequence` (by any process), oldest first. `check`
    calls `pace` between chunks of its engine reads (a background check yields to
    queries through it).
    """

    def check(self, generation_id: str, *, pace: Pace = no_pace) -> EvidenceCheck: ...

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]: ...


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


@dataclass(frozen=True, slots=True)
class HeadFacts:
    """What a current record is, without its JSON: its kind, galaxy, revision and the
    bytes its stored JSON takes."""

    document_id: str
    revision: int
    snapshot_kind: str
    galaxy: str
    record_bytes: int


def answer_too_large(limit: int) -> OrreryError:
    """`413 answer_too_large`: the records one call would load pass `limit` bytes."""
    return OrreryError(
        ErrorCode.ANSWER_TOO_LARGE,
        f"the records asked for are more than {limit} bytes as stored "
        "(ORRERY_MAX_ANSWER_BYTES): ask for fewer ids, a smaller result_limit or a page",
        {"max_answer_bytes": limit},
    )


class RecordReader(Protocol):
    """Reads the authoritative record store.

    Guarantees: `fetch` returns exactly the requested revisions (revisions are never
    rewritten), so a payload always matches the generation that ranked it; its
    `record_json` may leave out the record's `vector` (queries never answer with it).
    Bounded memory: no call of `fetch`, `heads` or `page` loads more than the reader's
    `max_answer_bytes` of record JSON (plus one record) — past it, it raises `413
    answer_too_large` (`answer_too_large`); `head_facts` never reads a record's JSON.
    """

    def fetch(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], StoredRecord]: ...

    def heads(self, namespace: str | None, document_ids: Sequence[str]) -> list[StoredRecord]:
        """The current (non-deleted) revision of each listed document of `namespace`
        (None: of any namespace) that exists."""

    def page(
        self, namespace: str | None, galaxy: str | None, offset: int, limit: int
    ) -> tuple[int, list[StoredRecord]]:
        """The current (non-deleted) records of `namespace` (None: of every namespace;
        of one galaxy, unless None) ordered by document id: how many there are, and
        `limit` of them after `offset`."""

    def head_facts(self, namespace: str | None, document_ids: Sequence[str]) -> list[HeadFacts]:
        """`heads` without the records' JSON: what each current record of the listed
        documents is (its kind, galaxy, revision and stored size)."""

    def holds(self, namespace: str, snapshot_kind: str | None = None) -> bool:
        """Whether any record (current or deleted) of `namespace` (and `snapshot_kind`,
        unless None) was ever stored: an unknown namespace from a scope not indexed yet.
        One index lookup."""


@runtime_checkable
class HeadListing(Protocol):
    """Lists a namespace's current records by key, reading no record JSON (what a
    qualification draws its sample from: one scan instead of one `page` per record).

    Guarantees: `head_keys(namespace)` holds exactly the `(document_id, revision)` of
    the records `RecordReader.page(namespace, None, …)` of the same store pages through,
    in the same order (by document id, as the store's own collation orders it).
    """

    def head_keys(self, namespace: str) -> list[tuple[str, int]]:
        """The current (non-deleted) records of `namespace` as `(document_id, revision)`,
        ordered by document id."""


class Cache(Protocol):
    """A byte cache with TTLs (responses, query embeddings).

    Guarantees: `get` returns exactly what `set` stored under the key for the same
    `tenant` (a namespace; "" for process-wide entries), or None (absent, expired or
    evicted); tenants never share an entry; a cache never makes an answer wrong — keys
    bind everything the value depends on. The in-process cache bounds each tenant apart,
    so one tenant's entries never evict another's (within its tenant bound); Redis
    bounds only its whole memory. Failures raise `DependencyUnavailable`; callers then
    go uncached.
    """

    @property
    def name(self) -> str: ...

    def get(self, key: str, *, tenant: str = "") -> bytes | None: ...

    def set(self, key: str, value: bytes, ttl_seconds: float, *, tenant: str = "") -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RingStat:
    """One ring of one galaxy in one generation: its live documents, the sum of their
    vectors and the sum of their unit vectors (float64, the embedder's dimension)."""

    ring: str
    documents: int
    vector_sum: npt.NDArray[np.float64]
    unit_sum: npt.NDArray[np.float64]


class RingStatistics(Protocol):
    """Ring statistics the projector keeps per generation (`projector.ports`).

    Guarantees: `rings` lists every ring of `galaxy` holding live documents in the
    generation (the empty ring too), as of one committed write; nothing is computed
    from the documents at query time.
    """

    def rings(self, generation_id: str, galaxy: str) -> list[RingStat]: ...


@dataclass(frozen=True, slots=True)
class StoredProfile:
    """A named search profile of a namespace: its three words and a note."""

    name: str
    amount: str
    scope: str
    depth: str
    note: str = ""


class SearchProfiles(Protocol):
    """Named KoutenDB search profiles per namespace, persisted.

    Guarantees: `put` replaces a profile of the same name; what `put` stored is what
    `profiles` lists (ordered by name) until `delete` removes it.
    """

    def profiles(self, namespace: str) -> list[StoredProfile]: ...

    def put(self, namespace: str, profile: StoredProfile) -> None: ...

    def delete(self, namespace: str, name: str) -> bool:
        """Remove a profile; whether it existed."""


@dataclass(frozen=True, slots=True)
class KeptEnvelope:
    """An envelope kept for the utility loop: who asked (namespace, galaxy), which plan
    (base ring, profile, budget), the returned chunk ids and rings in rank order, and the
    feedback (None until posted)."""

    request_id: str
    namespace: str
    galaxy: str
    base_ring: str
    profile: str
    budget: int
    created_at: datetime
    chunk_ids: tuple[str, ...]
    chunk_rings: tuple[str, ...]
    used: tuple[str, ...] | None = None
    ignored: tuple[str, ...] | None = None


class EnvelopeLog(Protocol):
    """Envelopes by (namespace, galaxy, request id) for a limited time (the KoutenDB
    feedback loop).

    Guarantees: an envelope's key is `(namespace, galaxy, request_id)`: `keep` replaces
    only the envelope with the same three (its feedback too), never another namespace's
    or galaxy's with the same request id; each (namespace, galaxy) holds at most the
    adapter's bound (`max_per_galaxy`, oldest dropped first; a few hundred more between
    two prunes), so one tenant's requests never evict another's; `envelopes` and
    `window` never return one kept before `since`; `feedback` replaces earlier feedback
    of exactly one envelope.
    """

    def keep(self, envelope: KeptEnvelope) -> None: ...

    def envelopes(self, namespace: str, request_id: str, since: datetime) -> list[KeptEnvelope]:
        """The namespace's envelopes with this request id kept at or after `since`, one
        per galaxy at most, ordered by galaxy."""

    def feedback(
        self,
        namespace: str,
        galaxy: str,
        request_id: str,
        used: Sequence[str],
        ignored: Sequence[str],
    ) -> None: ...

    def window(self, namespace: str, galaxy: str, since: datetime) -> list[KeptEnvelope]:
        """The envelopes of a namespace and galaxy kept at or after `since`, oldest first."""
