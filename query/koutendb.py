"""KoutenDB's retrieval envelope on the hybrid query service (issue 12, docs/koutendb.md).

- `RingTable`: one galaxy's rings in one generation, built from the statistics the
  projector keeps (`query.ports.RingStatistics`): documents, centroid direction and
  coherence per ring, the hierarchy with implied parents. Cached per generation state
  (`RingTables`), never computed from documents at query time.
- `make_plan`: the vocabulary, the plan formulas and the ring selection (siblings,
  descendants, pruning by centroid score) — pure.
- The use cases: `retrieve_envelope` (plan, then `query.service.search_rings`: the
  hybrid pipeline restricted to the selected rings before scoring), `plan_request`,
  the search profiles, `atlas`, `post_feedback`, `recommendations`.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from contracts.auth import resolve_galaxy
from contracts.digests import sha256_hex
from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb import (
    AMOUNTS,
    DEFAULT_PROFILE,
    DEFAULT_WORDS,
    Atlas,
    AtlasGalaxy,
    AtlasRing,
    Chunk,
    Envelope,
    EnvelopeQuery,
    EnvelopeSource,
    FeedbackRequest,
    FeedbackResponse,
    KoutenRetrieveRequest,
    Plan,
    PolicyHints,
    ProfileBody,
    ProfileOut,
    ProfileResponse,
    ProfilesResponse,
    Recommendation,
    RecommendationsResponse,
    RingFeature,
    RingUse,
    Stats,
    Trace,
    effective_top_rings,
    estimated_tokens,
    payload_string,
    tuning_of,
)
from query.ports import (
    EnvelopeLog,
    KeptEnvelope,
    RingStat,
    RingStatistics,
    Route,
    SearchProfiles,
    StoredProfile,
)
from query.service import (
    Principal,
    QueryLimits,
    QueryPorts,
    RingSearch,
    admitted_route,
    search_rings,
)

__all__ = [
    "ENVELOPE_RETENTION",
    "Knobs",
    "KoutenPorts",
    "RingTable",
    "RingTables",
    "atlas",
    "delete_profile",
    "knobs_of",
    "list_profiles",
    "make_plan",
    "plan_request",
    "post_feedback",
    "put_profile",
    "recommendations",
    "retrieve_envelope",
    "ring_key",
    "ring_table",
]

Vector = npt.NDArray[np.float64]

# How long envelopes are kept for feedback and recommendations.
ENVELOPE_RETENTION = timedelta(hours=24)
# Envelopes a (base ring, profile) needs before it is recommended for.
MIN_ENVELOPES = 5


def ring_key(ring: str) -> str:
    """A ring's stable key (KoutenDB's is a hash of the name too)."""
    return sha256_hex(ring.encode())[:16]


def _parent(ring: str) -> str:
    return ring.rpartition("/")[0]


# -- ring tables ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RingTable:
    """One galaxy's rings in one generation.

    `names` are the rings holding documents (the empty ring — documents without a ring
    — included, never selected by a plan); `known` adds their implied parents;
    `children` lists each known ring's child rings by name.
    """

    generation_id: str
    names: tuple[str, ...]
    documents: npt.NDArray[np.int64]
    directions: Vector
    coherence: Vector
    index: dict[str, int]
    known: frozenset[str]
    children: dict[str, tuple[str, ...]]

    @property
    def total(self) -> int:
        return int(self.documents.sum())

    def count(self, ring: str) -> int:
        i = self.index.get(ring)
        return 0 if i is None else int(self.documents[i])

    def coherence_of(self, ring: str) -> float:
        i = self.index.get(ring)
        return 0.0 if i is None else float(self.coherence[i])

    def direction(self, ring: str) -> Vector | None:
        i = self.index.get(ring)
        return None if i is None else self.directions[i]

    def scores(self, query: Vector | None) -> dict[str, float]:
        """Each ring's cosine between `query` and its centroid (0.0 without a query,
        for a vector of another dimension, or for a ring without a centroid)."""
        if query is None or not self.names or self.directions.shape[1] != query.shape[0]:
            return dict.fromkeys(self.names, 0.0)
        norm = float(np.linalg.norm(query))
        if norm == 0.0:
            return dict.fromkeys(self.names, 0.0)
        cosines = self.directions @ (query / norm)
        return {name: float(cosines[i]) for i, name in enumerate(self.names)}


def ring_table(generation_id: str, stats: Sequence[RingStat]) -> RingTable:
    """The table of a galaxy's ring statistics: centroid directions (the mean vector's
    direction) and coherence = mean cosine of the ring's vectors to its centroid,
    `(Σ x̂ᵢ)·ĉ / n`, clamped to [0, 1]."""
    rows = [s for s in stats if s.documents > 0]
    names = tuple(s.ring for s in rows)
    dimension = rows[0].vector_sum.shape[0] if rows else 0
    documents = np.array([s.documents for s in rows], dtype=np.int64)
    directions = np.zeros((len(rows), dimension), dtype=np.float64)
    coherence = np.zeros(len(rows), dtype=np.float64)
    for i, s in enumerate(rows):
        if s.vector_sum.shape[0] != dimension:
            continue
        norm = float(np.linalg.norm(s.vector_sum))
        if norm > 0.0:
            directions[i] = s.vector_sum / norm
            mean_cosine = float(s.unit_sum @ directions[i]) / s.documents
            coherence[i] = min(1.0, max(0.0, mean_cosine))
    known: set[str] = set()
    for name in names:
        while name:
            known.add(name)
            name = _parent(name)
    children: dict[str, list[str]] = defaultdict(list)
    for name in sorted(known):
        parent = _parent(name)
        if parent:
            children[parent].append(name)
    return RingTable(
        generation_id=generation_id,
        names=names,
        documents=documents,
        directions=directions,
        coherence=coherence,
        index={name: i for i, name in enumerate(names)},
        known=frozenset(known),
        children={k: tuple(v) for k, v in children.items()},
    )


class RingTables:
    """Ring tables per `(generation, commit_seq, galaxy)`: built once per generation
    state from `RingStatistics`, then shared by every request (bounded LRU)."""

    def __init__(self, stats: RingStatistics, capacity: int = 64) -> None:
        self._stats = stats
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, int, str], RingTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, route: Route, galaxy: str) -> RingTable:
        key = (route.generation_id, route.commit_seq, galaxy)
        with self._lock:
            table = self._items.get(key)
            if table is not None:
                self._items.move_to_end(key)
                return table
        table = ring_table(route.generation_id, self._stats.rings(route.generation_id, galaxy))
        with self._lock:
            self._items[key] = table
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return table


# -- knobs and plans --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Knobs:
    """A request's resolved tuning: the profile's words, overridden by the request's
    words, overridden by its numbers."""

    profile: str
    amount: str
    scope: str
    depth: str
    budget: int
    focus: int
    top_rings: int
    include_children: bool
    max_depth: int
    branch_budget: int


def knobs_of(request: KoutenRetrieveRequest, profile: StoredProfile) -> Knobs:
    amount = request.amount or profile.amount
    scope = request.scope or profile.scope
    depth = request.depth or profile.depth
    tuning = tuning_of(amount, scope, depth)

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return Knobs(
        profile=profile.name,
        amount=amount,
        scope=scope,
        depth=depth,
        budget=pick(request.budget, tuning.budget),
        focus=pick(request.focus, tuning.focus),
        top_rings=pick(request.topRings, tuning.topRings),
        include_children=request.includeChildren or tuning.includeChildren,
        max_depth=pick(request.maxDepth, tuning.maxDepth),
        branch_budget=pick(request.branchBudget, tuning.branchBudget),
    )


def _ranked(rings: Iterable[str], scores: dict[str, float]) -> list[str]:
    """By centroid score descending, then name."""
    return sorted(rings, key=lambda r: (-scores.get(r, 0.0), r))


def _budgeted(
    rings: Iterable[str], scores: dict[str, float], budget: int
) -> tuple[list[str], list[str]]:
    """The best `budget` rings (0: all) and the rest."""
    ranked = _ranked(rings, scores)
    if budget <= 0:
        return ranked, []
    return ranked[:budget], ranked[budget:]


def _descendants(
    root: str, table: RingTable, scores: dict[str, float], knobs: Knobs
) -> tuple[list[str], list[str]]:
    """Breadth-first below `root` to `max_depth`, at most `branch_budget` children per
    ring (0: all), the best by centroid score; the children left out are pruned."""
    kept: list[str] = []
    pruned: list[str] = []
    level = [root]
    for _ in range(knobs.max_depth):
        below: list[str] = []
        for ring in level:
            chosen, dropped = _budgeted(table.children.get(ring, ()), scores, knobs.branch_budget)
            below += chosen
            pruned += dropped
        kept += below
        level = below
    return kept, pruned


def _sibling_budget(scope: str, branch_budget: int) -> int | None:
    """How many siblings a scope adds (0: all; None: none)."""
    return {"ssNear": 2, "ssWide": max(4, branch_budget), "ssAll": 0}.get(scope)


def make_plan(
    knobs: Knobs, ring: str | None, table: RingTable, query: Vector | None
) -> tuple[Plan, tuple[str, ...] | None]:
    """The plan of a request and the rings its search is restricted to (None: the
    whole galaxy). Selection: the base ring; with `include_children` its descendants;
    with `ssNear`/`ssWide`/`ssAll` its siblings (and theirs); candidates beyond a budget
    are pruned. Without a ring, `top-rings` keeps the galaxy's best
    `effectiveTopRings` rings and `global` selects none."""
    effective = effective_top_rings(knobs.focus, knobs.top_rings)
    scores = table.scores(query)
    selected: list[str] = []
    pruned: list[str] = []
    flags: dict[str, tuple[bool, bool, bool]] = {}
    if ring:
        strategy = "hierarchical-ring" if knobs.include_children else "ring-scoped"
        reason = "explicit ring scope"
        selected.append(ring)
        flags[ring] = (True, False, False)
        if knobs.include_children:
            below, dropped = _descendants(ring, table, scores, knobs)
            selected += below
            pruned += dropped
        budget = _sibling_budget(knobs.scope, knobs.branch_budget)
        parent = _parent(ring)
        if budget is not None and parent:
            siblings = [r for r in table.children.get(parent, ()) if r != ring]
            chosen, dropped = _budgeted(siblings, scores, budget)
            pruned += dropped
            for sibling in chosen:
                selected.append(sibling)
                if knobs.include_children:
                    below, dropped = _descendants(sibling, table, scores, knobs)
                    selected += below
                    pruned += dropped
        for name in selected + pruned:
            flags.setdefault(name, (False, _parent(name) == parent, name.startswith(ring + "/")))
        selected = [ring, *_ranked(dict.fromkeys(selected[1:]), scores)]
        pruned = _ranked(dict.fromkeys(r for r in pruned if r not in selected), scores)
        restrict: tuple[str, ...] | None = tuple(selected)
    elif effective > 0:
        strategy, reason = "top-rings", "focus/topRings selected"
        selected = _ranked((r for r in table.names if r), scores)[:effective]
        flags = dict.fromkeys(selected, (False, False, False))
        restrict = tuple(selected)
    else:
        strategy, reason = "global", "no ring scope"
        restrict = None
    features = [
        RingFeature(
            ring=name,
            key=ring_key(name),
            score=round(scores.get(name, 0.0), 6),
            centroidScore=round(scores.get(name, 0.0), 6),
            ringCount=table.count(name),
            utility=round(table.coherence_of(name) * (1.0 - 1.0 / (table.count(name) + 1)), 6),
            isBase=flags[name][0],
            isSibling=flags[name][1],
            isDescendant=flags[name][2],
        )
        for name in [*selected, *pruned]
    ]
    plan = Plan(
        strategy=strategy,
        profile=knobs.profile,
        baseRing=ring or "",
        amount=knobs.amount,
        scope=knobs.scope,
        depth=knobs.depth,
        ringScoped=bool(ring),
        budget=knobs.budget,
        focus=min(knobs.focus, 100),
        topRings=knobs.top_rings,
        effectiveTopRings=effective,
        branchBudget=knobs.branch_budget,
        maxDepth=knobs.max_depth,
        includeChildren=knobs.include_children,
        reason=reason,
        selectedRings=selected,
        prunedRings=pruned,
        ringFeatures=features,
    )
    return plan, restrict


# -- the use cases ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KoutenPorts:
    query: QueryPorts
    limits: QueryLimits
    tables: RingTables
    profiles: SearchProfiles
    envelopes: EnvelopeLog
    backend: Literal["embedded", "servers"]
    new_request_id: Callable[[], str] = field(default=lambda: uuid.uuid4().hex)


def _namespace(namespace: str | None, who: Principal) -> str:
    chosen = namespace or who.namespace
    if chosen is None:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST, "namespace is required (or an API key bound to one)"
        )
    if who.namespace is not None and who.namespace != chosen:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            f"this API key may not read namespace {chosen!r}",
            {"namespace": chosen},
        )
    return chosen


def source_uri(namespace: str, galaxy: str, ring: str, document_id: str) -> str:
    """A chunk's `sourceUri`: `orrery://{namespace}/{galaxy}/{ring}/{id}`, each part
    percent-escaped (RFC 3986) so no namespace or ring can add a segment, a query or a
    fragment: the namespace whole (`:`, `/`, `?`, `#`, `%`, spaces, …), the ring per
    `/`-separated segment. Plain names (`demo`, `s1/ai`) read as before."""
    return (
        f"orrery://{quote(namespace, safe='')}/{quote(galaxy, safe='')}/"
        f"{quote(ring, safe='/')}/{quote(document_id, safe='')}"
    )


def _galaxy(galaxy: str | None, who: Principal) -> str:
    """The one galaxy a request reads: the key's, else the request's, else `default`
    (`contracts.auth.resolve_galaxy`, the rule of every route)."""
    return resolve_galaxy(who.galaxy, galaxy)


_BUILTIN_DEFAULT = StoredProfile(DEFAULT_PROFILE, *DEFAULT_WORDS)


def _profile(namespace: str, name: str, ports: KoutenPorts) -> StoredProfile:
    stored = {p.name: p for p in ports.profiles.profiles(namespace)}
    if name in stored:
        return stored[name]
    if name == DEFAULT_PROFILE:
        return _BUILTIN_DEFAULT
    raise OrreryError(
        ErrorCode.UNKNOWN_SEARCH_PROFILE,
        f"no search profile {name!r} in namespace {namespace!r}",
        {"profile": name},
    )


@dataclass(frozen=True, slots=True)
class _Query:
    mode: str
    text: str
    vector: tuple[float, ...] | None


def _query(request: KoutenRetrieveRequest, ports: KoutenPorts) -> _Query:
    text = request.queryText.strip()
    vector = None if request.queryVector is None else tuple(request.queryVector)
    if not text and vector is None:
        raise OrreryError(ErrorCode.EMPTY_QUERY, "give queryText and/or queryVector")
    mode = request.mode or ("hybrid" if text else "vector")
    if mode in ("hybrid", "lexical") and not text:
        raise OrreryError(ErrorCode.INVALID_REQUEST, f"mode {mode!r} needs queryText")
    if vector is not None:
        dimension = ports.query.query_vectors.dimension
        if len(vector) != dimension:
            raise OrreryError(
                ErrorCode.EMBEDDER_MISMATCH,
                f"queryVector has {len(vector)} dimensions, the embedder "
                f"{ports.query.query_vectors.embedder_id} has {dimension}",
            )
        if not any(vector):
            raise OrreryError(ErrorCode.INVALID_REQUEST, "queryVector must not be all zeros")
    return _Query(mode, text, vector)


def _plan_vector(q: _Query, ports: KoutenPorts, namespace: str) -> Vector | None:
    """The vector rings are ranked by: the given one, else the query text's embedding."""
    if q.vector is not None:
        return np.asarray(q.vector, dtype=np.float64)
    if q.text:
        vector = ports.query.query_vectors.vector(q.text, tenant=namespace)
        return np.asarray(vector, dtype=np.float64)
    return None


def _check_budget(knobs: Knobs, limits: QueryLimits) -> None:
    if knobs.budget > limits.max_result_limit:
        raise OrreryError(
            ErrorCode.RESULT_LIMIT_EXCEEDED,
            f"budget may be at most {limits.max_result_limit}, got {knobs.budget}",
            {"max_result_limit": limits.max_result_limit},
        )


def plan_request(
    request: KoutenRetrieveRequest, *, principal: Principal, ports: KoutenPorts
) -> Plan:
    """The plan `retrieve` would run, from the ring statistics alone: nothing is
    searched (a query, if given, is embedded to rank rings by centroid)."""
    namespace = _namespace(request.namespace, principal)
    galaxy = _galaxy(request.galaxy, principal)
    knobs = knobs_of(request, _profile(namespace, request.profile, ports))
    _check_budget(knobs, ports.limits)
    if request.fusionProfile is not None:
        # What `retrieve` would refuse, the plan refuses (`422 unknown_profile`).
        ports.limits.profiles.get(request.fusionProfile)
    query = None
    if request.queryText.strip() or request.queryVector is not None:
        query = _plan_vector(_query(request, ports), ports, namespace)
    route = admitted_route(namespace, request.scopeRef, principal=principal, ports=ports.query)
    table = ports.tables.get(route, galaxy)
    plan, _ = make_plan(knobs, request.ring, table, query)
    return plan


def retrieve_envelope(
    request: KoutenRetrieveRequest, *, principal: Principal, ports: KoutenPorts
) -> Envelope:
    """Plan from the ring statistics, search the selected rings with the hybrid
    pipeline (restricted before scoring), and answer `koutendb.retrieval.v1`; the
    envelope is kept by request id for the feedback loop."""
    namespace = _namespace(request.namespace, principal)
    galaxy = _galaxy(request.galaxy, principal)
    q = _query(request, ports)
    knobs = knobs_of(request, _profile(namespace, request.profile, ports))
    _check_budget(knobs, ports.limits)
    route = admitted_route(namespace, request.scopeRef, principal=principal, ports=ports.query)
    table = ports.tables.get(route, galaxy)
    plan, rings = make_plan(knobs, request.ring, table, _plan_vector(q, ports, namespace))
    hits = search_rings(
        RingSearch(
            principal=principal,
            namespace=namespace,
            scope_ref=request.scopeRef,
            galaxy=galaxy,
            mode=q.mode,
            limit=knobs.budget,
            generation_id=route.generation_id,
            query_text=q.text,
            query_vector=q.vector if q.mode != "lexical" else None,
            rings=rings,
            profile_id=request.fusionProfile,
            timeout_seconds=request.timeoutSeconds,
        ),
        ports=ports.query,
        limits=ports.limits,
    )
    chunks: list[Chunk] = []
    for hit in hits.hits:
        record: dict[str, Any] = json.loads(hit.record.record_json)
        payload = payload_string(record.get("payload_schema", ""), record.get("payload", {}))
        chunk_ring = str(record.get("ring", ""))
        chunks.append(
            Chunk(
                id=hit.document_id,
                payload=payload,
                score=hit.score,
                estimatedTokens=estimated_tokens(len(payload.encode())),
                ring=chunk_ring,
                sourceUri=source_uri(namespace, galaxy, chunk_ring, hit.document_id),
            )
        )
    total = table.total
    if rings is None:
        scanned = total
        touched = sum(1 for name in table.names if name and table.count(name) > 0)
    else:
        scanned = sum(table.count(name) for name in rings)
        touched = sum(1 for name in rings if table.count(name) > 0)
    payload_bytes = sum(len(c.payload.encode()) for c in chunks)
    fanout = 1 if ports.backend == "embedded" else (2 if q.mode == "hybrid" else 1)
    request_id = request.requestId or ports.new_request_id()
    envelope = Envelope(
        source=EnvelopeSource(
            galaxy=galaxy,
            ring=request.ring or "",
            backend=ports.backend,
            sourceType=request.sourceType,
        ),
        query=EnvelopeQuery(mode=q.mode, budget=knobs.budget, ringScoped=bool(request.ring)),
        plan=plan,
        chunks=chunks,
        stats=Stats(
            totalVectors=total,
            scanned=scanned,
            skippedVectors=max(0, total - scanned),
            returned=len(chunks),
            ringsTouched=touched,
            fanoutNodes=fanout,
            payloadBytes=payload_bytes,
            estimatedTokens=estimated_tokens(payload_bytes),
            candidateReduction=0.0 if total == 0 else round(1.0 - scanned / total, 6),
        ),
        policyHints=PolicyHints(
            resourceScope="topic" if request.ring else "persistent",
            retentionClass=request.retentionClass,
            dataLabel=request.dataLabel,
        ),
        trace=Trace(requestId=request_id, correlationId=request.correlationId),
    )
    ports.envelopes.keep(
        KeptEnvelope(
            request_id=request_id,
            namespace=namespace,
            galaxy=galaxy,
            base_ring=request.ring or "",
            profile=knobs.profile,
            budget=knobs.budget,
            created_at=ports.query.clock(),
            chunk_ids=tuple(c.id for c in chunks),
            chunk_rings=tuple(c.ring for c in chunks),
        )
    )
    return envelope


# -- profiles ---------------------------------------------------------------------------


def _profile_out(profile: StoredProfile) -> ProfileOut:
    return ProfileOut(
        name=profile.name,
        amount=profile.amount,
        scope=profile.scope,
        depth=profile.depth,
        note=profile.note,
        tuning=tuning_of(profile.amount, profile.scope, profile.depth),
    )


def list_profiles(
    namespace: str | None, *, principal: Principal, ports: KoutenPorts
) -> ProfilesResponse:
    """The namespace's profiles by name, `default` always among them."""
    ns = _namespace(namespace, principal)
    stored = {p.name: p for p in ports.profiles.profiles(ns)}
    stored.setdefault(DEFAULT_PROFILE, _BUILTIN_DEFAULT)
    return ProfilesResponse(
        namespace=ns, profiles=[_profile_out(stored[name]) for name in sorted(stored)]
    )


def _writer(principal: Principal) -> None:
    if principal.galaxy is not None:
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            "a galaxy-bound API key may not change the namespace's search profiles",
        )


def put_profile(
    name: str, body: ProfileBody, *, principal: Principal, ports: KoutenPorts
) -> ProfileResponse:
    """Store a profile (words left out are `default`'s built-in words)."""
    _writer(principal)
    ns = _namespace(body.namespace, principal)
    amount, scope, depth = DEFAULT_WORDS
    profile = StoredProfile(
        name=name,
        amount=body.amount or amount,
        scope=body.scope or scope,
        depth=body.depth or depth,
        note=body.note,
    )
    ports.profiles.put(ns, profile)
    return ProfileResponse(**_profile_out(profile).model_dump())


def delete_profile(
    name: str, namespace: str | None, *, principal: Principal, ports: KoutenPorts
) -> ProfilesResponse:
    """Remove a profile (`default`: restore its built-in words); `not_found` for a
    profile the namespace does not have."""
    _writer(principal)
    ns = _namespace(namespace, principal)
    if not ports.profiles.delete(ns, name) and name != DEFAULT_PROFILE:
        raise OrreryError(ErrorCode.NOT_FOUND, f"no search profile {name!r} in {ns!r}")
    return list_profiles(ns, principal=principal, ports=ports)


# -- atlas ------------------------------------------------------------------------------


def atlas(
    namespace: str | None,
    scope_ref: str,
    galaxy: str | None,
    max_centroid_dims: int,
    *,
    principal: Principal,
    ports: KoutenPorts,
) -> Atlas:
    """The galaxy's ring map from the ring statistics: every ring with documents and
    every implied parent, by name."""
    ns = _namespace(namespace, principal)
    chosen = _galaxy(galaxy, principal)
    route = admitted_route(ns, scope_ref, principal=principal, ports=ports.query)
    table = ports.tables.get(route, chosen)
    rings: list[AtlasRing] = []
    for name in sorted(table.known):
        documents = table.count(name)
        coherence = table.coherence_of(name)
        direction = table.direction(name)
        preview = [] if direction is None else direction[:max_centroid_dims].tolist()
        rings.append(
            AtlasRing(
                name=name,
                parent=_parent(name),
                children=list(table.children.get(name, ())),
                depth=name.count("/") + 1,
                documents=documents,
                vectorDocuments=documents,
                coherence=round(coherence, 6),
                massG=round(documents * coherence, 6),
                centroidPreview=[round(float(v), 6) for v in preview],
            )
        )
    return Atlas(
        generationId=route.generation_id,
        galaxyMap=AtlasGalaxy(
            galaxy=chosen,
            mode=ports.backend,
            rings=len(rings),
            documents=table.total,
            vectorDocuments=table.total,
        ),
        ringMap=rings,
    )


# -- the utility loop -------------------------------------------------------------------


def post_feedback(
    body: FeedbackRequest, *, principal: Principal, ports: KoutenPorts
) -> FeedbackResponse:
    """Record which chunks of a kept envelope were used and which ignored (replacing
    earlier feedback). Advisory: nothing else changes."""
    ns = _namespace(body.namespace, principal)
    both = sorted(set(body.usedChunkIds) & set(body.ignoredChunkIds))
    if both:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "a chunk id is both used and ignored",
            {"chunkIds": both[:20]},
        )
    since = ports.query.clock() - ENVELOPE_RETENTION
    kept = _kept(ns, body, principal, ports.envelopes.envelopes(ns, body.requestId, since))
    returned = set(kept.chunk_ids)
    unknown = sorted({*body.usedChunkIds, *body.ignoredChunkIds} - returned)
    if unknown:
        raise OrreryError(
            ErrorCode.UNKNOWN_CHUNK,
            "chunk ids not in that envelope",
            {"chunkIds": unknown[:20]},
        )
    used = list(dict.fromkeys(body.usedChunkIds))
    ignored = list(dict.fromkeys(body.ignoredChunkIds))
    ports.envelopes.feedback(ns, kept.galaxy, body.requestId, used, ignored)
    return FeedbackResponse(requestId=body.requestId, used=len(used), ignored=len(ignored))


def _kept(
    namespace: str, body: FeedbackRequest, principal: Principal, found: list[KeptEnvelope]
) -> KeptEnvelope:
    """The one envelope feedback is for, among the namespace's envelopes with its request
    id: the key's galaxy's, else the named galaxy's, else the only one. Another
    namespace's or galaxy's envelope answers as unknown; a request id used in several
    galaxies needs `galaxy`."""
    galaxy = principal.galaxy
    if galaxy is not None and body.galaxy not in (None, galaxy):
        raise OrreryError(
            ErrorCode.FORBIDDEN,
            f"this API key is limited to galaxy {galaxy!r}",
            {"galaxy": body.galaxy},
        )
    galaxy = galaxy or body.galaxy
    if galaxy is not None:
        found = [e for e in found if e.galaxy == galaxy]
    if not found:
        raise OrreryError(
            ErrorCode.UNKNOWN_REQUEST,
            f"no envelope {body.requestId!r} kept in the last 24 h",
            {"requestId": body.requestId},
        )
    if len(found) > 1:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"request id {body.requestId!r} was used in {len(found)} galaxies of "
            f"{namespace!r}: name the galaxy",
            {"requestId": body.requestId, "galaxies": [e.galaxy for e in found][:20]},
        )
    return found[0]


def _nearest_rank(values: Sequence[int], percentile: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percentile / 100.0 * len(ordered))) - 1]


def _amount_for(budget: int) -> str:
    for word, words_budget in sorted(AMOUNTS.items(), key=lambda item: item[1]):
        if words_budget >= budget:
            return word
    return max(AMOUNTS, key=lambda word: AMOUNTS[word])


def recommendations(
    namespace: str | None,
    galaxy: str | None,
    *,
    principal: Principal,
    ports: KoutenPorts,
) -> RecommendationsResponse:
    """Per (base ring, profile) with at least five envelopes in the last 24 h: how many
    returned chunks were used, and the budget that would have returned 95 % of the used
    ones (nearest-rank percentile of their 1-based ranks). Advisory only."""
    ns = _namespace(namespace, principal)
    chosen = _galaxy(galaxy, principal)
    kept = ports.envelopes.window(ns, chosen, ports.query.clock() - ENVELOPE_RETENTION)
    groups: dict[tuple[str, str], list[KeptEnvelope]] = defaultdict(list)
    for envelope in kept:
        groups[(envelope.base_ring, envelope.profile)].append(envelope)
    profiles = {p.name: p for p in ports.profiles.profiles(ns)}
    out: list[Recommendation] = []
    for (base_ring, profile_name), envelopes in sorted(groups.items()):
        if len(envelopes) < MIN_ENVELOPES:
            continue
        returned = used = ignored = 0
        ranks: list[int] = []
        per_ring: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for envelope in envelopes:
            used_ids = set(envelope.used or ())
            returned += len(envelope.chunk_ids)
            used += len(used_ids)
            ignored += len(envelope.ignored or ())
            for rank, (chunk_id, chunk_ring) in enumerate(
                zip(envelope.chunk_ids, envelope.chunk_rings, strict=True), start=1
            ):
                per_ring[chunk_ring][0] += 1
                if chunk_id in used_ids:
                    per_ring[chunk_ring][1] += 1
                    ranks.append(rank)
        profile = profiles.get(profile_name, _BUILTIN_DEFAULT)
        recommended = _nearest_rank(ranks, 95.0) if ranks else 1
        out.append(
            Recommendation(
                baseRing=base_ring,
                profile=profile_name,
                envelopes=len(envelopes),
                returnedChunks=returned,
                usedChunks=used,
                ignoredChunks=ignored,
                usedRatio=0.0 if returned == 0 else round(used / returned, 6),
                currentBudget=AMOUNTS[profile.amount],
                recommendedBudget=recommended,
                recommendedAmount=_amount_for(recommended),
                rings=[
                    RingUse(ring=name, returned=counts[0], used=counts[1])
                    for name, counts in sorted(per_ring.items())
                ],
            )
        )
    return RecommendationsResponse(namespace=ns, galaxy=chosen, recommendations=out)
