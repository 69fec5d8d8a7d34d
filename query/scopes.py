"""Scope refs: the per-namespace registry, generation pins, and cached resolution.

A scope ref names one snapshot kind of a namespace (`longterm:objects:current` →
`objects`), optionally with fixed filters that every query of that ref also applies.
The five refs of the Twinr seed, and the two more Twinr's client sends
(`longterm:midterm:current`, `longterm:graph_nodes:current`), are built into every
namespace; operators add more with
`ORRERY_SCOPES` (see `parse_scopes`).

**Pinning.** `<scope ref>@<generation id>` reads one generation instead of the live
one: `longterm:objects:current@g42`, or shorter, with the `:current` suffix left out,
`longterm:objects@g42` (`graph@g7`, `midterm@g3`). The `@` is the only separator: scope
refs may not contain it, and generation ids (`g<seq>` in the registry) never do. A pin
routes only to a generation that exists, belongs to the ref's namespace and snapshot
kind, is not building, failed or retired, and passes replica eligibility; otherwise the
answer is `410 generation_unavailable` (or `503 coverage_unavailable` when the
generation is routable but its evidence did not match: a pin never falls back).

**Caching.** `ScopeResolver` remembers which generation a live scope ref routed to (an
in-process LRU, and a shared `Cache` — Redis in server mode — behind it). Every query
still reads that generation's registry row by primary key (its applied position and
commit sequence key the response cache, so they must be fresh), and that row tells
whether the generation is still `live`: a promote or a rollback demotes the old live
generation in the same transaction that flips the pointer, so a cached resolution is
dropped by the first query after the flip, never served stale.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from contracts.digests import sha256_json
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.topk import QueryFilters
from query.ports import Cache, Route, Routing

__all__ = [
    "ALL_NAMESPACES",
    "BUILTIN_SCOPES",
    "PIN_SEPARATOR",
    "ScopeDefinition",
    "ScopeRegistry",
    "ScopeResolver",
    "ScopeTarget",
    "merge_filters",
    "parse_scopes",
    "runtime_kind",
]

log = logging.getLogger("orrery.query")

# Scope refs known to every namespace, each naming one snapshot kind's live generation.
BUILTIN_SCOPES: Mapping[str, str] = {
    "longterm:objects:current": "objects",
    "longterm:conflicts:current": "conflicts",
    "longterm:archive:current": "archive",
    "graph:current": "graph",
    "midterm:current": "midterm",
    # Twinr's client names every collection `longterm:<snapshot kind>:current`.
    "longterm:midterm:current": "midterm",
    "longterm:graph_nodes:current": "graph_nodes",
}
PIN_SEPARATOR = "@"
# `ORRERY_SCOPES` key of refs registered in every namespace.
ALL_NAMESPACES = "*"
_CURRENT_SUFFIX = ":current"
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$")
_GENERATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# States a pin can never route to, whatever the engines hold.
_UNROUTABLE = frozenset({"building", "failed", "retired"})


@dataclass(frozen=True, slots=True)
class ScopeDefinition:
    """One registered scope ref: the snapshot kind it reads and its fixed filters
    (intersected with every request's own; never `galaxy`, which only API keys and
    requests narrow)."""

    ref: str
    snapshot_kind: str
    filters: QueryFilters | None = None


@dataclass(frozen=True, slots=True)
class ScopeTarget:
    """A parsed scope ref: its definition and the generation it pins (None = live)."""

    definition: ScopeDefinition
    pinned_generation: str | None = None

    @property
    def snapshot_kind(self) -> str:
        return self.definition.snapshot_kind


class ScopeRegistry:
    """Scope refs per namespace: the built-in ones everywhere, plus operator refs for
    every namespace (`*`) or one namespace. Immutable; lookups are pure."""

    def __init__(self, extra: Mapping[str, Mapping[str, ScopeDefinition]] | None = None) -> None:
        builtin = {ref: ScopeDefinition(ref, kind) for ref, kind in BUILTIN_SCOPES.items()}
        extra = extra or {}
        self._everywhere = {**builtin, **extra.get(ALL_NAMESPACES, {})}
        self._by_namespace = {
            ns: {**self._everywhere, **refs} for ns, refs in extra.items() if ns != ALL_NAMESPACES
        }

    def refs(self, namespace: str) -> dict[str, ScopeDefinition]:
        """Every scope ref `namespace` knows, by ref."""
        return dict(self._by_namespace.get(namespace, self._everywhere))

    def target(self, namespace: str, scope_ref: str) -> ScopeTarget:
        """Parse `scope_ref` (optionally `…@<generation id>`) for `namespace`.

        Raises `unknown_scope` (404) for a ref the namespace does not know or a
        malformed pin.
        """
        known = self._by_namespace.get(namespace, self._everywhere)
        base, separator, pinned = scope_ref.partition(PIN_SEPARATOR)
        if separator and not _GENERATION_ID.match(pinned):
            raise OrreryError(
                ErrorCode.UNKNOWN_SCOPE,
                f"scope_ref {scope_ref!r}: {pinned!r} after '@' is not a generation id",
                {"scope_ref": scope_ref},
            )
        definition = known.get(base)
        if definition is None and separator:
            definition = known.get(base + _CURRENT_SUFFIX)
        if definition is None:
            raise OrreryError(
                ErrorCode.UNKNOWN_SCOPE,
                f"unknown scope_ref {scope_ref!r} in namespace {namespace!r}",
                {"scope_ref": scope_ref, "namespace": namespace, "known": sorted(known)},
            )
        return ScopeTarget(definition, pinned if separator else None)


def runtime_kind(ref: str) -> str | None:
    """The snapshot kind a runtime ref names (`longterm:<kind>:current` or
    `<kind>:current`), or None for any other ref."""
    parts = ref.split(":")
    if len(parts) == 3 and parts[0] == "longterm" and parts[2] == "current":
        kind = parts[1]
    elif len(parts) == 2 and parts[1] == "current":
        kind = parts[0]
    else:
        return None
    return kind if _KIND.match(kind) else None


def parse_scopes(text: str) -> ScopeRegistry:
    """The registry from operator JSON (`ORRERY_SCOPES`):

    `{"<namespace or *>": {"<scope ref>": "<snapshot kind>" | {"snapshot_kind": ...,
    "filters": {<QueryFilters without galaxy>}}}}`

    Raises `ValueError` (at startup) for malformed JSON, a ref with '@' or odd
    characters, a filter naming `galaxy`, or a ref that redefines a built-in ref.
    """
    if not text.strip():
        return ScopeRegistry()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ORRERY_SCOPES is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError("ORRERY_SCOPES must be an object {namespace: {scope_ref: kind}}")
    extra: dict[str, dict[str, ScopeDefinition]] = {}
    for namespace, refs in raw.items():
        if not isinstance(refs, dict):
            raise ValueError(f"ORRERY_SCOPES[{namespace!r}] must be an object")
        extra[str(namespace)] = {
            str(ref): _definition(str(namespace), str(ref), value) for ref, value in refs.items()
        }
    return ScopeRegistry(extra)


def _definition(namespace: str, ref: str, value: object) -> ScopeDefinition:
    where = f"ORRERY_SCOPES[{namespace!r}][{ref!r}]"
    if not _REF.match(ref):
        raise ValueError(f"{where}: a scope ref is letters, digits and _ . : / - ('@' pins)")
    kind: object
    filters_raw: object
    if isinstance(value, str):
        kind, filters_raw = value, None
    elif isinstance(value, dict) and set(value) <= {"snapshot_kind", "filters"}:
        kind, filters_raw = value.get("snapshot_kind"), value.get("filters")
    else:
        raise ValueError(f"{where}: give a snapshot kind or {{snapshot_kind, filters}}")
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise ValueError(f"{where}: snapshot_kind {kind!r} is not a valid snapshot kind")
    if ref in BUILTIN_SCOPES and BUILTIN_SCOPES[ref] != kind:
        raise ValueError(f"{where}: {ref} is built in (it reads {BUILTIN_SCOPES[ref]!r})")
    filters = None
    if filters_raw is not None:
        try:
            filters = QueryFilters.model_validate(filters_raw)
        except ValidationError as exc:
            raise ValueError(f"{where}: invalid filters: {exc}") from exc
        if filters.galaxy is not None:
            raise ValueError(f"{where}: a scope cannot fix `galaxy` (API keys and requests do)")
    return ScopeDefinition(ref, kind, filters)


def _intersect(request: list[str] | None, fixed: list[str] | None) -> list[str] | None:
    if request is None:
        return fixed
    if fixed is None:
        return request
    allowed = set(fixed)
    return [value for value in request if value in allowed]


def merge_filters(request: QueryFilters, fixed: QueryFilters | None) -> QueryFilters:
    """Both sets of filters at once: any-of lists intersect (an empty one matches
    nothing), time ranges take the narrower bound. `fixed` never holds `galaxy`."""
    if fixed is None:
        return request
    facets = dict(request.facets)
    for key, values in fixed.facets.items():
        facets[key] = _intersect(facets.get(key), values) or []
    after = [t for t in (request.updated_after, fixed.updated_after) if t is not None]
    before = [t for t in (request.updated_before, fixed.updated_before) if t is not None]
    return QueryFilters(
        status=_intersect(request.status, fixed.status),
        visibility=_intersect(request.visibility, fixed.visibility),
        galaxy=request.galaxy,
        updated_after=max(after) if after else None,
        updated_before=min(before) if before else None,
        facets=facets,
    )


class ScopeResolver:
    """Routes scope refs (see the module docstring). Thread-safe.

    Guarantees: `route` returns a route to the live generation of the ref's scope (as
    the registry holds it at the time of the call: a cached resolution is used only
    while its generation is still live), or to the pinned generation when it is
    routable; it raises `scope_not_ready` (no live generation yet) or
    `generation_unavailable` otherwise. A shared-cache failure only costs a lookup.
    """

    def __init__(
        self,
        routing: Routing,
        registry: ScopeRegistry | None = None,
        *,
        capacity: int = 1_024,
        shared: Cache | None = None,
        ttl_seconds: float = 3_600.0,
        holds: Callable[[str, str | None], bool] | None = None,
    ) -> None:
        self._routing = routing
        self.registry = registry or ScopeRegistry()
        # `RecordReader.holds`: tells a mistyped namespace from one not indexed yet.
        self._holds = holds
        # Refs of snapshot kinds no ref names, registered when a generation went live.
        self._runtime: dict[tuple[str, str], ScopeDefinition] = {}
        self._capacity = capacity
        self._shared = shared
        self._ttl = ttl_seconds
        self._items: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def target(self, namespace: str, scope_ref: str) -> ScopeTarget:
        """`ScopeRegistry.target`, plus the runtime refs: `longterm:<kind>:current` (or
        `<kind>:current`) of a snapshot kind no ref names reads that kind once a
        generation of it went live in `namespace` — no `ORRERY_SCOPES`, no restart."""
        try:
            return self.registry.target(namespace, scope_ref)
        except OrreryError as exc:
            if exc.code is not ErrorCode.UNKNOWN_SCOPE:
                raise
            base, separator, pinned = scope_ref.partition(PIN_SEPARATOR)
            definition = self._runtime_definition(namespace, base)
            if definition is None:
                raise
            return ScopeTarget(definition, pinned if separator else None)

    def _runtime_definition(self, namespace: str, base: str) -> ScopeDefinition | None:
        kind = runtime_kind(base)
        if kind is None:
            return None
        ref = f"longterm:{kind}:current"
        with self._lock:
            known = self._runtime.get((namespace, ref))
        if known is not None:
            return known
        if self._routing.route(namespace, kind) is None:
            return None
        definition = ScopeDefinition(ref, kind)
        with self._lock:
            self._runtime[(namespace, ref)] = definition
        log.info(
            "scope %s of namespace %r registered (its first generation is live)", ref, namespace
        )
        return definition

    def listing(self, namespaces: Collection[str] | None = None) -> list[dict[str, object]]:
        """Every queryable scope ref per namespace with a live generation (only
        `namespaces`, unless None): the registry's refs and the runtime ones, each with
        the live generation it reads (`GET /v1/scopes`)."""
        live: dict[str, dict[str, str]] = {}
        for scope in self._routing.scopes():
            if namespaces is not None and scope.namespace not in namespaces:
                continue
            if scope.state == "live":
                live.setdefault(scope.namespace, {})[scope.snapshot_kind] = scope.generation_id
        out: list[dict[str, object]] = []
        for namespace in sorted(live):
            kinds = live[namespace]
            refs = self.registry.refs(namespace)
            named = {d.snapshot_kind for d in refs.values()}
            entries = [
                {
                    "scope_ref": ref,
                    "snapshot_kind": d.snapshot_kind,
                    "source": "builtin" if ref in BUILTIN_SCOPES else "configured",
                    "generation_id": kinds.get(d.snapshot_kind),
                }
                for ref, d in sorted(refs.items())
            ]
            for kind in sorted(set(kinds) - named):
                entries.append(
                    {
                        "scope_ref": f"longterm:{kind}:current",
                        "snapshot_kind": kind,
                        "source": "runtime",
                        "generation_id": kinds[kind],
                    }
                )
            out.append({"namespace": namespace, "scopes": entries})
        return out

    def route(
        self, namespace: str, target: ScopeTarget, *, generation_id: str | None = None
    ) -> Route:
        """The route for `target` in `namespace`; `generation_id` (a cursor's) pins like
        an `@` pin does (a cursor binds its scope ref, so both name the same one)."""
        pinned = generation_id or target.pinned_generation
        if pinned is not None:
            return self._pinned(namespace, target, pinned)
        kind = target.snapshot_kind
        key = (namespace, kind)
        # The in-process entry first; the shared one only when that is absent or stale.
        for lookup in (self._local, self._from_shared):
            cached = lookup(key)
            if cached is None:
                continue
            route = self._routing.generation(cached)
            if (
                route is not None
                and route.state == "live"
                and (route.namespace, route.snapshot_kind) == key
            ):
                self._remember_local(key, cached)
                with self._lock:
                    self.hits += 1
                return route
            self._forget(key)
        with self._lock:
            self.misses += 1
        route = self._routing.route(namespace, kind)
        if route is None:
            raise self._not_ready(namespace, target)
        self._remember(key, route.generation_id)
        return route

    def _not_ready(self, namespace: str, target: ScopeTarget) -> OrreryError:
        """Why a scope has no live generation: a namespace nothing was ever written to
        (`unknown_namespace`, 404: waiting will not help), no record of the scope's kind
        yet, or a first generation still being built (`scope_not_ready`, 503)."""
        ref, kind = target.definition.ref, target.snapshot_kind
        details = {"scope_ref": ref, "namespace": namespace}
        if self._holds is not None and not self._holds(namespace, None):
            return OrreryError(
                ErrorCode.UNKNOWN_NAMESPACE,
                f"namespace {namespace!r} holds no records: nothing was ever written to it "
                "(a typo?)",
                {"namespace": namespace},
            )
        if self._holds is not None and not self._holds(namespace, kind):
            return OrreryError(
                ErrorCode.SCOPE_NOT_READY,
                f"namespace {namespace!r} holds no records of snapshot kind {kind!r} "
                f"(scope {ref!r}): it is ready once one is written and indexed",
                {**details, "snapshot_kind": kind, "reason": "no_records"},
            )
        return OrreryError(
            ErrorCode.SCOPE_NOT_READY,
            f"scope {ref!r} of namespace {namespace!r} has no live generation yet (its "
            "first one is being built; /v1/readiness tells when)",
            {**details, "reason": "building"},
        )

    def _pinned(self, namespace: str, target: ScopeTarget, generation_id: str) -> Route:
        route = self._routing.generation(generation_id)
        details = {
            "namespace": namespace,
            "scope_ref": target.definition.ref,
            "generation_id": generation_id,
        }
        if route is None or (route.namespace, route.snapshot_kind) != (
            namespace,
            target.snapshot_kind,
        ):
            # Another scope's generation is reported like an unknown one: a pin does not
            # reveal what other namespaces hold.
            raise OrreryError(
                ErrorCode.GENERATION_UNAVAILABLE,
                f"generation {generation_id!r} does not exist in scope "
                f"{target.definition.ref!r} of namespace {namespace!r}",
                {**details, "reason": "unknown"},
            )
        if route.state in _UNROUTABLE:
            raise OrreryError(
                ErrorCode.GENERATION_UNAVAILABLE,
                f"generation {generation_id} is {route.state}; start again from the scope's "
                "live generation",
                {**details, "reason": route.state},
            )
        return route

    # -- the two cache levels ------------------------------------------------------------

    @staticmethod
    def _shared_key(key: tuple[str, str]) -> str:
        return "scope:" + sha256_json(list(key))

    def _local(self, key: tuple[str, str]) -> str | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def _from_shared(self, key: tuple[str, str]) -> str | None:
        if self._shared is None:
            return None
        try:
            raw = self._shared.get(self._shared_key(key), tenant=key[0])
        except DependencyUnavailable as exc:
            log.debug("scope cache unavailable: %s", exc.message)
            return None
        return None if raw is None else raw.decode()

    def _remember(self, key: tuple[str, str], generation_id: str) -> None:
        self._remember_local(key, generation_id)
        if self._shared is None:
            return
        try:
            self._shared.set(
                self._shared_key(key), generation_id.encode(), self._ttl, tenant=key[0]
            )
        except DependencyUnavailable as exc:
            log.debug("scope cache unavailable: %s", exc.message)

    def _remember_local(self, key: tuple[str, str], generation_id: str) -> None:
        with self._lock:
            self._items[key] = generation_id
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def _forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._items.pop(key, None)
