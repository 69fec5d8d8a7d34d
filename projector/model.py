"""Pure projection logic: which events of a batch change a generation, and how; the
generation lifecycle; comparing read-back evidence with what is expected."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.events import RecordChanged
from contracts.generations import (
    EngineEvidence,
    GenerationDescriptor,
    GenerationState,
    StateChange,
    Topology,
)
from contracts.index import IndexDocument, is_unicode
from contracts.index_fields import FACET_SEPARATOR
from contracts.pacing import Pace, no_pace
from contracts.records import Record

__all__ = [
    "ALLOWED_TRANSITIONS",
    "WRITABLE_STATES",
    "BatchPlan",
    "IndexOperation",
    "PairDiff",
    "check_keywords",
    "check_single_copy",
    "diff_pairs",
    "engine_evidence",
    "gc_plan",
    "last_live_at",
    "mismatch_reason",
    "newest_operations",
    "plan_batch",
    "rollback_target",
    "transition",
]


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


# -- generations -------------------------------------------------------------------------

# Which state may follow which. `live → verified` is the demotion of the old live
# generation by a promote or rollback; `failed` is reachable from every state that still
# takes writes (a failed verify, an aborted or crashed build).
ALLOWED_TRANSITIONS: Mapping[GenerationState, frozenset[GenerationState]] = {
    GenerationState.BUILDING: frozenset({GenerationState.SEALED, GenerationState.FAILED}),
    GenerationState.SEALED: frozenset(
        {GenerationState.VERIFIED, GenerationState.FAILED, GenerationState.RETIRED}
    ),
    GenerationState.VERIFIED: frozenset(
        {GenerationState.LIVE, GenerationState.FAILED, GenerationState.RETIRED}
    ),
    GenerationState.LIVE: frozenset({GenerationState.VERIFIED, GenerationState.FAILED}),
    GenerationState.FAILED: frozenset({GenerationState.RETIRED}),
    GenerationState.RETIRED: frozenset(),
}

# States whose generations receive the log's writes (the projector's write targets).
WRITABLE_STATES: frozenset[GenerationState] = frozenset(
    {
        GenerationState.BUILDING,
        GenerationState.SEALED,
        GenerationState.VERIFIED,
        GenerationState.LIVE,
    }
)

# How many differing ids a check reports per kind of difference.
DIFF_SAMPLE = 20


def check_single_copy(engine: str, generation_id: str, shards: int, replicas: int) -> None:
    """Refuse a spread index on an engine that keeps one copy in one place (the embedded
    engines): `INVALID_REQUEST` naming the engine."""
    if shards != 1 or replicas != 0:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"{engine} keeps a generation in one shard with one copy: shards={shards}, "
            f"replicas={replicas} needs server mode (ORRERY_MODE=servers)",
            {
                "engine": engine,
                "generation_id": generation_id,
                "shards": shards,
                "replicas": replicas,
            },
        )


def engine_named_topology(lexical_engine: str, vector_engine: str) -> Callable[[str], Topology]:
    """The default topology of a new generation: both engine indexes named like it."""

    def topology(generation_id: str) -> Topology:
        return Topology(
            lexical_engine=lexical_engine,
            lexical_index=generation_id,
            vector_engine=vector_engine,
            vector_index=generation_id,
        )

    return topology


def new_generation(
    seq: int,
    namespace: str,
    snapshot_kind: str,
    *,
    state: GenerationState,
    reason: str,
    at: datetime,
    embedder_id: str,
    embedder_dim: int,
    schema_digest: str,
    topology: Callable[[str], Topology],
) -> GenerationDescriptor:
    """The descriptor of the registry's `seq`-th generation (`g{seq}`), digest included."""
    generation_id = f"g{seq}"
    return GenerationDescriptor(
        generation_id=generation_id,
        namespace=namespace,
        snapshot_kind=snapshot_kind,
        state=state,
        created_at=at,
        embedder_id=embedder_id,
        embedder_dim=embedder_dim,
        topology=topology(generation_id),
        schema_digest=schema_digest,
        history=(StateChange(state=state, at=at, reason=reason),),
    ).with_digest()


def transition(
    descriptor: GenerationDescriptor,
    to: GenerationState,
    *,
    at: datetime,
    position: int,
    reason: str = "",
    **updates: Any,
) -> GenerationDescriptor:
    """The descriptor after moving to `to`: state, one history entry, `updates`, and a
    new content digest. Raises `INVALID_STATE` for a move `ALLOWED_TRANSITIONS` forbids."""
    if to not in ALLOWED_TRANSITIONS[descriptor.state]:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"generation {descriptor.generation_id} is {descriptor.state.value}; it cannot "
            f"become {to.value}",
            {
                "generation_id": descriptor.generation_id,
                "state": descriptor.state.value,
                "requested": to.value,
            },
        )
    entry = StateChange(state=to, at=at, position=position, reason=reason)
    changed = descriptor.model_copy(
        update={**updates, "state": to, "history": (*descriptor.history, entry)}
    )
    # Round-trip so nested models in `updates` are validated like stored ones.
    return GenerationDescriptor.model_validate(changed.model_dump()).with_digest()


@dataclass(frozen=True, slots=True)
class PairDiff:
    """How an observed `(document_id, revision)` multiset differs from an expected set."""

    count: int
    digest: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    stale: tuple[str, ...]
    missing_count: int
    unexpected_count: int
    stale_count: int
    duplicates: int

    @property
    def matches(self) -> bool:
        return not (
            self.missing_count or self.unexpected_count or self.stale_count or self.duplicates
        )


def diff_pairs(
    expected: Mapping[str, int],
    observed: Iterable[tuple[str, int]],
    *,
    sample: int = DIFF_SAMPLE,
    expected_digest: str | None = None,
    pace: Pace = no_pace,
) -> PairDiff:
    """Compare what an engine (or the canonical store) holds with what is expected.

    `count` and `digest` describe `observed` itself (the digest over its distinct ids,
    keeping the highest revision of a duplicated id). Samples are the smallest ids.
    `expected_digest` (the `id_set_digest` of `expected`, when the caller has it) is
    reused when the sets are equal instead of hashing the same set again. `pace` is
    called between chunks of the comparison of equal sets (`_equal_pairs`).
    """
    listed = observed if isinstance(observed, list) else list(observed)
    if _equal_pairs(expected, listed, pace):
        # The common case, every periodic eligibility check of a healthy generation: no
        # duplicate and the same pairs, compared in C (no per-pair loop, no sorting).
        return PairDiff(
            count=len(listed),
            digest=expected_digest or id_set_digest(listed, pace=pace),
            missing=(),
            unexpected=(),
            stale=(),
            missing_count=0,
            unexpected_count=0,
            stale_count=0,
            duplicates=0,
        )
    seen: dict[str, int] = {}
    duplicates = 0
    for document_id, revision in listed:
        held = seen.get(document_id)
        if held is not None:
            duplicates += 1
            revision = max(revision, held)
        seen[document_id] = revision
    missing = sorted(d for d in expected if d not in seen)
    unexpected = sorted(d for d in seen if d not in expected)
    stale = sorted(d for d, r in seen.items() if d in expected and expected[d] != r)
    equal = not (missing or unexpected or stale)
    return PairDiff(
        count=len(seen) + duplicates,
        digest=expected_digest if equal and expected_digest else id_set_digest(seen.items()),
        missing=tuple(missing[:sample]),
        unexpected=tuple(unexpected[:sample]),
        stale=tuple(stale[:sample]),
        missing_count=len(missing),
        unexpected_count=len(unexpected),
        stale_count=len(stale),
        duplicates=duplicates,
    )


# Rows turned into pairs per call of `fetched_pairs` (a few ms in C).
_FETCH_CHUNK = 5_000


def fetched_pairs(fetchmany: Callable[[int], Sequence[Sequence[Any]]]) -> dict[str, int]:
    """A registry's `(document_id, revision)` rows (TEXT and INTEGER: `str` and `int`
    as the driver returns them) as a dict, in row order, fetched and built a chunk at a
    time: one `dict(fetchall())` over 1M rows held the interpreter ~0.4 s in one call
    (session 33), a stall for every query sharing it."""
    pairs: dict[str, int] = {}
    while rows := fetchmany(_FETCH_CHUNK):
        pairs.update(rows)  # type: ignore[arg-type]  # two-column rows
    return pairs


# Pairs compared between two `pace` calls of `_equal_pairs` (a few ms in C).
_COMPARE_CHUNK = 2_000


def _equal_pairs(expected: Mapping[str, int], listed: list[tuple[str, int]], pace: Pace) -> bool:
    """Whether `listed` holds exactly `expected`'s pairs, each id once: compared in C a
    chunk at a time (one `dict(listed)` and one `==` over 1M pairs held the interpreter
    ~0.4 s and ~0.1 s, session 33), `pace` called between chunks."""
    if len(listed) != len(expected):
        return False
    seen: set[str] = set()
    held = expected.items()
    for start in range(0, len(listed), _COMPARE_CHUNK):
        if start:
            pace()
        chunk = dict(listed[start : start + _COMPARE_CHUNK])
        if not chunk.items() <= held:
            return False
        seen.update(chunk)
    # Every pair is expected's; as many distinct ids as expected holds: the same set.
    return len(seen) == len(expected)


def engine_evidence(engine: str, diff: PairDiff) -> EngineEvidence:
    return EngineEvidence(
        engine=engine,
        document_count=diff.count,
        id_set_digest=diff.digest,
        matches=diff.matches,
        missing_count=diff.missing_count,
        unexpected_count=diff.unexpected_count,
        stale_count=diff.stale_count,
        duplicates=diff.duplicates,
        missing=diff.missing,
        unexpected=diff.unexpected,
        stale=diff.stale,
    )


def mismatch_reason(evidence: Sequence[EngineEvidence]) -> str:
    """One line naming every engine that did not match, and how."""
    parts = []
    for item in evidence:
        if item.matches:
            continue
        what = [
            f"{n} {label}"
            for n, label in (
                (item.missing_count, "missing"),
                (item.unexpected_count, "unexpected"),
                (item.stale_count, "at another revision"),
                (item.duplicates, "duplicated"),
            )
            if n
        ]
        shards = {c.shard for c in item.copies}
        uncovered = sorted(shards - {c.shard for c in item.copies if c.eligible})
        what += [f"shard {s} has no eligible copy" for s in uncovered]
        parts.append(f"{item.engine}: {', '.join(what)}")
    return "; ".join(parts)


def last_live_at(descriptor: GenerationDescriptor) -> datetime | None:
    """When the generation last became live (None if it never was)."""
    times = [c.at for c in descriptor.history if c.state is GenerationState.LIVE]
    return max(times) if times else None


def rollback_target(
    candidates: Sequence[GenerationDescriptor], live_generation_id: str | None
) -> GenerationDescriptor | None:
    """The generation a rollback returns to: among the scope's verified generations
    other than the live one, the one that was live most recently; else the newest."""
    verified = [
        d
        for d in candidates
        if d.state is GenerationState.VERIFIED and d.generation_id != live_generation_id
    ]
    if not verified:
        return None
    return max(
        verified,
        key=lambda d: (last_live_at(d) is not None, last_live_at(d) or d.created_at, d.created_at),
    )


def gc_plan(
    generations: Sequence[tuple[GenerationDescriptor, bool]], keep: int
) -> tuple[list[str], list[str]]:
    """`(drop, keep)` generation ids for `gc --keep N`.

    `generations` are `(descriptor, indexes already dropped)`. Per scope, the `keep`
    newest retired generations keep their engine indexes; older retired and all failed
    generations lose them. Nothing that still takes writes is touched.
    """
    drop: list[str] = []
    kept: list[str] = []
    by_scope: dict[tuple[str, str], list[GenerationDescriptor]] = {}
    for descriptor, dropped in generations:
        if dropped:
            continue
        if descriptor.state is GenerationState.FAILED:
            drop.append(descriptor.generation_id)
        elif descriptor.state is GenerationState.RETIRED:
            key = (descriptor.namespace, descriptor.snapshot_kind)
            by_scope.setdefault(key, []).append(descriptor)
    for retired in by_scope.values():
        retired.sort(key=lambda d: d.created_at, reverse=True)
        kept.extend(d.generation_id for d in retired[:keep])
        drop.extend(d.generation_id for d in retired[keep:])
    return sorted(drop), sorted(kept)


# A pending operation of an index batch on one document: the revision to write, or the
# revision deleted.
IndexOperation = IndexDocument | int


def newest_operations(
    upserts: Sequence[IndexDocument], deletes: Sequence[tuple[str, int]]
) -> dict[str, IndexOperation]:
    """The one operation per document that wins by revision; a delete wins a tie."""
    operations: dict[str, IndexOperation] = {}
    for document in upserts:
        current = operations.get(document.document_id)
        if current is None or _operation_revision(current) < document.revision:
            operations[document.document_id] = document
    for document_id, revision in deletes:
        current = operations.get(document_id)
        if current is None or _operation_revision(current) <= revision:
            operations[document_id] = revision
    return operations


def _operation_revision(operation: IndexOperation) -> int:
    return operation.revision if isinstance(operation, IndexDocument) else operation


def check_keywords(upserts: Iterable[IndexDocument], deletes: Iterable[tuple[str, int]]) -> None:
    """Reject exact-match values no lexical index can hold (`INVALID_REQUEST`): facet
    names containing `FACET_SEPARATOR`, keywords that are not valid Unicode. Called
    before anything is written."""
    for document in upserts:
        for name in document.facets:
            if FACET_SEPARATOR in name:
                raise OrreryError(
                    ErrorCode.INVALID_REQUEST,
                    f"facet name must not contain {FACET_SEPARATOR!r}",
                    {"document_id": document.document_id, "facet": name},
                )
        keywords = [
            document.document_id,
            document.item_id,
            document.galaxy,
            document.ring,
            document.status,
            *document.visibility,
            *(f"{name}{value}" for name, values in document.facets.items() for value in values),
        ]
        if not all(is_unicode(value) for value in keywords):
            raise _not_unicode(document.document_id)
    for document_id, _revision in deletes:
        if not is_unicode(document_id):
            raise _not_unicode(document_id)


def _not_unicode(document_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.INVALID_REQUEST,
        "keyword values must be valid Unicode (no lone surrogates)",
        {"document_id": document_id.encode("utf-8", "backslashreplace").decode("utf-8")},
    )
