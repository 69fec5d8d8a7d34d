"""Qualification of a generation: its production search path against a global reference.

The sample: `sample_size` documents of the generation's scope drawn with a generator
seeded by the generation id (the same generation always gets the same sample); each
gives a query (its title, or the next of the operator's `queries`) and the values of its
slice's filters (its galaxy for `tenant`, its status and visibility for
`status_visibility`, a vocabulary term for `phrase`). Queries go to the slices round
robin; a slice the namespace cannot have (no vocabulary: no phrase plan) is left out.

Every query runs twice through `query.service.topk_records` — the production path, the
same use case a client's request takes — pinned to the generation: once over the
production ports, once over the reference (a 1-shard copy of the lexical index with the
same mapping, and exact vector search), both with the response cache off and one fixed
clock. The candidate lists each source returned are recorded *before* fusion (candidate
inclusion), and each profile's top k after it (overlap, order agreement, scores), with
whether that profile's candidate lists held the reference's whole lists (a *complete*
query: the order agreement `order_agreement_over=complete` judges).
`contracts.qualification` says what the figures mean and what passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contracts.digests import sha256_json
from contracts.generations import GenerationDescriptor
from contracts.index import Candidate
from contracts.phrases import PhraseGroup, PhrasePlan
from contracts.profiles import FusionProfile, RrfProfile
from contracts.qualification import (
    SLICES,
    ProfileFigures,
    QualificationReceipt,
    QualificationThresholds,
    QualifyRequest,
    SliceFigures,
    SourceFigures,
    receipt_failures,
)
from contracts.records import Record
from contracts.topk import Include, QueryFilters, TopKRequest
from contracts.vector_payload import hnsw_search_ef
from query.ports import HeadListing, LexicalSearch, RecordReader, StoredRecord, VectorSearch
from query.service import Principal, QueryLimits, QueryPorts, topk_records

__all__ = ["QualifySetup", "qualify_generation"]

# Results compared per profile (top-k overlap and order agreement).
TOP_K = 10
# A qualification query's deadline: it measures agreement, not latency.
_TIMEOUT_S = 60.0
# Sampled records fetched per call (record JSON without vectors: well under the reader's
# answer bound).
_DRAW_CHUNK = 50


@dataclass(frozen=True, slots=True)
class QualifySetup:
    """What a qualification runs with.

    `production`: the query worker's ports; `reference_lexical` searches the reference
    copy, whose generation id is `reference_id`; `reference_vectors` searches exactly;
    `profiles`: profile ids to compare (resolved by `limits.profiles`); `workers`:
    queries run side by side; `method`: how production and reference search, recorded in
    the receipt; `search`: the production path's search-time settings
    (`QuerySettings.vector_search`), recorded in the receipt with the HNSW ef they give at
    its vector cap; `heads`: lists the store's current records by key (the sample is drawn
    from it; without it, one `production.records.page` call per drawn record — the same
    sample, slower).
    """

    production: QueryPorts
    reference_lexical: LexicalSearch
    reference_vectors: VectorSearch
    reference_id: str
    limits: QueryLimits
    profiles: Sequence[str]
    thresholds: QualificationThresholds
    sample_size: int = 200
    workers: int = 4
    method: Mapping[str, str] = field(default_factory=dict)
    search: Mapping[str, int] = field(default_factory=dict)
    heads: HeadListing | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


class _Recording:
    """A source that remembers the candidate list of its first `search` since `last` was
    reset (the list fusion receives: the candidate search runs before a phrase plan's
    lookups) and passes everything through — once: a call with the same arguments as an
    earlier one of this query (the next profile asks the same source the same thing)
    gets the earlier answer, not a second engine round trip."""

    def __init__(self, inner: Any, rename: Mapping[str, str] | None = None) -> None:
        self._inner = inner
        self._rename = dict(rename or {})
        self._answers: dict[tuple[Any, ...], Any] = {}
        self.last: list[Candidate] | None = None

    def _call(self, method: str, generation_id: str, args: Any, kwargs: Any) -> Any:
        key = (method, generation_id, _key(args), _key(kwargs))
        if key not in self._answers:
            inner = getattr(self._inner, method)
            self._answers[key] = inner(
                self._rename.get(generation_id, generation_id), *args, **kwargs
            )
        return self._answers[key]

    def search(self, generation_id: str, *args: Any, **kwargs: Any) -> list[Candidate]:
        found = list(self._call("search", generation_id, args, kwargs))
        if self.last is None:
            self.last = found
        return found

    def scores(self, generation_id: str, *args: Any, **kwargs: Any) -> dict[str, float]:
        return dict(self._call("scores", generation_id, args, kwargs))


def _key(value: Any) -> Any:
    """A hashable stand-in for call arguments that equals another's exactly when the
    arguments are equal (vectors element by element, mappings by their items)."""
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), _key(v)) for k, v in value.items())))
    if isinstance(value, str | bytes | int | float | bool | type(None)):
        return value
    if isinstance(value, Sequence) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else value
        return ("seq", tuple(_key(v) for v in items))
    return ("obj", type(value).__qualname__, repr(value))


@dataclass(slots=True)
class _Query:
    slice: str
    text: str
    filters: QueryFilters
    phrase_plan: PhrasePlan | None = None


@dataclass(slots=True)
class _Tally:
    inclusion: dict[str, list[float]] = field(default_factory=lambda: {"lexical": [], "vector": []})
    overlap: dict[str, list[float]] = field(default_factory=dict)
    order: dict[str, list[float]] = field(default_factory=dict)
    # Order agreement of the queries whose candidates held the reference's whole top D.
    complete_order: dict[str, list[float]] = field(default_factory=dict)
    score_diff: dict[str, float] = field(default_factory=dict)
    queries: int = 0


def qualify_generation(
    descriptor: GenerationDescriptor,
    position: int,
    request: QualifyRequest,
    *,
    setup: QualifySetup,
) -> QualificationReceipt:
    """Run the sample over the generation and its reference; the receipt (with its id).

    Raises what `topk_records` raises for a query that cannot be answered (a shard with
    no eligible copy: `coverage_unavailable`) — a receipt is never made from a partial
    run.
    """
    started = time.perf_counter()
    namespace, kind = descriptor.namespace, descriptor.snapshot_kind
    scope_ref = _scope_ref(setup.production, namespace, kind)
    size = request.sample_size or setup.sample_size
    queries = _sample(descriptor.generation_id, namespace, kind, size, request, setup)
    fixed = setup.clock()
    resolved = [setup.limits.profiles.get(p) for p in setup.profiles]

    def run(query: _Query) -> _Outcome:
        return _run_query(query, descriptor, scope_ref, resolved, setup, fixed)

    tallies: dict[str, _Tally] = {name: _Tally() for name in SLICES}
    # Queries run side by side (each waits on engines most of its time); their
    # outcomes are tallied in sample order, so the receipt is the same at any width.
    with ThreadPoolExecutor(max_workers=max(1, setup.workers)) as pool:
        for query, outcome in zip(queries, pool.map(run, queries), strict=True):
            tally = tallies[query.slice]
            tally.queries += 1
            for name, value in outcome.inclusion.items():
                tally.inclusion[name].append(value)
            for profile_id, made, exact, complete in outcome.answers:
                _compare(profile_id, made, exact, tally, complete=complete)
    depths = setup.limits.depths(resolved[0], TOP_K)
    slices = tuple(
        _figures(name, tallies[name], depths, skipped=_skipped(name, queries)) for name in SLICES
    )
    failures = receipt_failures(slices, setup.thresholds)
    receipt = QualificationReceipt(
        generation_id=descriptor.generation_id,
        namespace=namespace,
        snapshot_kind=kind,
        descriptor_digest=descriptor.descriptor_digest,
        position=position,
        shards=descriptor.topology.shards,
        replicas=descriptor.topology.replicas,
        caps={"lexical": depths["lexical"], "vector": depths["vector"], "top_k": TOP_K},
        profiles={p.id: sha256_json(p.model_dump(mode="json")) for p in resolved},
        rrf_k={p.id: int(p.rrf_k) for p in resolved if isinstance(p, RrfProfile)},
        method=dict(setup.method),
        search=_search(setup.search, depths["vector"], descriptor.topology.spread),
        sample_digest=sha256_json(
            [[q.slice, q.text, q.filters.model_dump(mode="json"), _plan_json(q)] for q in queries]
        ),
        sample_size=len(queries),
        slices=slices,
        thresholds=setup.thresholds,
        passed=not failures,
        failures=failures,
        created_at=setup.clock(),
        seconds=round(time.perf_counter() - started, 3),
    )
    return receipt.with_id()


def _search(settings: Mapping[str, int], cap: int, spread: bool) -> dict[str, int]:
    """The settings, and the HNSW ef a shard key is searched with at `cap` (if they
    name the ef rule's inputs)."""
    out = dict(settings)
    if "vector_hnsw_ef" in out:
        out["vector_ef"] = hnsw_search_ef(
            cap + 1,
            floor=out["vector_hnsw_ef"],
            spread_factor=out.get("vector_spread_ef_factor", 1),
            spread=spread,
        )
    return out


@dataclass(slots=True)
class _Outcome:
    """One query's figures: each source's inclusion (profile 1's candidate lists) and
    each profile's production and reference answers, and whether that profile's
    candidate lists held the reference's whole lists (complete)."""

    inclusion: dict[str, float] = field(default_factory=dict)
    answers: list[tuple[str, list[tuple[str, float]], list[tuple[str, float]], bool]] = field(
        default_factory=list
    )


def _run_query(
    query: _Query,
    descriptor: GenerationDescriptor,
    scope_ref: str,
    profiles: Sequence[FusionProfile],
    setup: QualifySetup,
    now: datetime,
) -> _Outcome:
    """Every profile of one query through `topk_records`, production then reference,
    each side over sources recording the candidate lists fusion receives."""
    production = (
        _Recording(setup.production.lexical),
        _Recording(setup.production.vectors),
    )
    reference = (
        _Recording(setup.reference_lexical, {descriptor.generation_id: setup.reference_id}),
        _Recording(setup.reference_vectors),
    )
    sides = {
        "production": (production, _ports(setup.production, production, now)),
        "reference": (reference, _ports(setup.production, reference, now)),
    }
    outcome = _Outcome()
    for index, profile in enumerate(profiles):
        answers = {}
        for side, (sources, side_ports) in sides.items():
            topk = TopKRequest(
                namespace=descriptor.namespace,
                scope_ref=f"{scope_ref}@{descriptor.generation_id}",
                query_text=query.text,
                result_limit=TOP_K,
                filters=query.filters,
                profile=profile.id,
                phrase_plan=query.phrase_plan,
                include=Include(
                    payload=False, metadata=False, score_breakdown=False, query_plan=False
                ),
                timeout_seconds=_TIMEOUT_S,
            )
            # Each side's recordings start empty: a source a profile does not search
            # leaves None (no inclusion figure for it).
            for source in sources:
                source.last = None
            response = topk_records(
                topk, principal=Principal(), ports=side_ports, limits=setup.limits
            )
            answers[side] = [(r.document_id, r.score) for r in response.results]
        shares = {}
        for name, made, exact in (
            ("lexical", production[0].last, reference[0].last),
            ("vector", production[1].last, reference[1].last),
        ):
            if made is not None and exact:
                shares[name] = _inclusion(made, exact)
        if index == 0:
            outcome.inclusion.update(shares)
        complete = all(share == 1.0 for share in shares.values())
        outcome.answers.append((profile.id, answers["production"], answers["reference"], complete))
    return outcome


def _ports(base: QueryPorts, sources: tuple[_Recording, _Recording], now: datetime) -> QueryPorts:
    # No response cache (every answer is computed), no eligibility gate (the receipt
    # measures the indexes), sources one after the other (rankings are the same), one
    # clock for both sides (freshness).
    return dataclasses.replace(
        base,
        lexical=sources[0],
        vectors=sources[1],
        responses=None,
        eligibility=None,
        overlap=None,
        clock=lambda: now,
    )


def _scope_ref(ports: QueryPorts, namespace: str, kind: str) -> str:
    """A scope ref of the namespace that reads `kind` with no fixed filters."""
    if ports.scopes is not None:
        for ref, definition in sorted(ports.scopes.registry.refs(namespace).items()):
            if definition.snapshot_kind == kind and definition.filters is None:
                return ref
    raise ValueError(f"no scope ref of {namespace!r} reads {kind!r} unfiltered")


def _sample(
    generation_id: str,
    namespace: str,
    kind: str,
    size: int,
    request: QualifyRequest,
    setup: QualifySetup,
) -> list[_Query]:
    """`size` documents of the scope, drawn by a generator seeded with the generation
    id, turned into queries spread over the slices the namespace can have."""
    seed = int(hashlib.sha256(generation_id.encode()).hexdigest()[:16], 16)
    rng = random.Random(seed)
    drawn: list[Record] = []
    for stored in _drawn_records(namespace, size, rng, setup.production.records, setup.heads):
        if len(drawn) >= size:
            break
        record = Record.model_validate_json(stored.record_json)
        if record.snapshot_kind == kind and (request.queries or record.text.title.strip()):
            drawn.append(record)
    vocabularies = setup.limits.vocabularies.vocabularies(namespace)
    terms = setup.limits.vocabularies.terms(namespace, vocabularies[0]) if vocabularies else []
    slices = [s for s in SLICES if s != "phrase" or terms]
    queries: list[_Query] = []
    for index, record in enumerate(drawn):
        text = request.queries[index % len(request.queries)] if request.queries else ""
        text = text or record.text.title
        name = slices[index % len(slices)]
        query = _Query(name, text, QueryFilters())
        if name == "tenant":
            query.filters = QueryFilters(galaxy=record.galaxy)
        elif name == "status_visibility":
            query.filters = QueryFilters(
                status=[record.metadata.status],
                visibility=list(record.metadata.visibility) or None,
            )
        elif name == "phrase":
            term = terms[rng.randrange(len(terms))]
            query.phrase_plan = PhrasePlan(
                vocabulary=vocabularies[0], groups=[PhraseGroup(alternatives=[term])]
            )
        queries.append(query)
    return queries


def _drawn_records(
    namespace: str,
    size: int,
    rng: random.Random,
    records: RecordReader,
    heads: HeadListing | None,
) -> Iterator[StoredRecord]:
    """The current records of `namespace` at `2 * size` offsets (in document-id order)
    drawn by `rng`, in the order drawn, lazily (the caller stops once it has enough).

    With `heads`, the keys are listed once and the records fetched by key a chunk at a
    time; without, each offset is one `page` call (a sort of every head per call). Both
    yield the same records — the store's heads in the same order — and draw the same
    offsets from `rng`, so the sample and its digest do not depend on which ran.
    """
    if heads is None:
        total, _ = records.page(namespace, None, 0, 1)
    else:
        keys = heads.head_keys(namespace)
        total = len(keys)
    offsets = rng.sample(range(total), min(total, size * 2)) if total else []
    if heads is None:
        for offset in offsets:
            yield from records.page(namespace, None, offset, 1)[1]
        return
    for start in range(0, len(offsets), _DRAW_CHUNK):
        wanted = [keys[offset] for offset in offsets[start : start + _DRAW_CHUNK]]
        found = records.fetch(wanted)
        yield from (found[key] for key in wanted if key in found)


def _plan_json(query: _Query) -> Any:
    return None if query.phrase_plan is None else query.phrase_plan.model_dump(mode="json")


def _skipped(name: str, queries: Sequence[_Query]) -> str:
    if any(q.slice == name for q in queries):
        return ""
    if name == "phrase":
        return "the namespace has no phrase-plan vocabulary"
    return "the sample drew no query for it"


def _inclusion(made: Sequence[Candidate], exact: Sequence[Candidate]) -> float:
    """|candidates ∩ reference top-D| / |reference top-D| (D = the reference's length:
    both searched with the same cap)."""
    wanted = {c.document_id for c in exact}
    return len(wanted & {c.document_id for c in made}) / len(wanted)


def _compare(
    profile: str,
    made: Sequence[tuple[str, float]],
    exact: Sequence[tuple[str, float]],
    tally: _Tally,
    *,
    complete: bool,
) -> None:
    if not exact:
        if made:  # The reference found nothing, production did: nothing agrees.
            tally.overlap.setdefault(profile, []).append(0.0)
            tally.order.setdefault(profile, []).append(0.0)
            if complete:
                tally.complete_order.setdefault(profile, []).append(0.0)
        return
    made_ids = [d for d, _ in made]
    exact_ids = [d for d, _ in exact]
    tally.overlap.setdefault(profile, []).append(
        len(set(made_ids) & set(exact_ids)) / len(exact_ids)
    )
    same = sum(1 for i, d in enumerate(exact_ids) if i < len(made_ids) and made_ids[i] == d)
    tally.order.setdefault(profile, []).append(same / len(exact_ids))
    if complete:
        tally.complete_order.setdefault(profile, []).append(same / len(exact_ids))
    scores = dict(made)
    worst = tally.score_diff.get(profile, 0.0)
    for document_id, score in exact:
        if document_id in scores:
            diff = abs(scores[document_id] - score) / max(abs(score), 1e-12)
            worst = max(worst, diff)
    tally.score_diff[profile] = worst


def _figures(name: str, tally: _Tally, depths: Mapping[str, int], *, skipped: str) -> SliceFigures:
    sources = {
        source: SourceFigures(
            cap=depths[source],
            queries=len(values),
            inclusion_mean=_mean(values),
            inclusion_min=min(values) if values else None,
        )
        for source, values in tally.inclusion.items()
    }
    profiles = {
        profile: ProfileFigures(
            queries=len(tally.overlap[profile]),
            overlap_mean=_mean(tally.overlap[profile]),
            overlap_min=min(tally.overlap[profile]),
            order_agreement_mean=_mean(tally.order[profile]),
            order_agreement_min=min(tally.order[profile]),
            score_max_rel_diff=tally.score_diff.get(profile, 0.0),
            complete_queries=len(tally.complete_order.get(profile, [])),
            complete_order_agreement_min=_least(tally.complete_order.get(profile, [])),
        )
        for profile in sorted(tally.overlap)
    }
    return SliceFigures(
        slice=name, queries=tally.queries, skipped=skipped, sources=sources, profiles=profiles
    )


def _least(values: Sequence[float]) -> float | None:
    return min(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 6) if values else None
