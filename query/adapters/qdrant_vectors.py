"""Nearest-neighbour search over the Qdrant server collections the projector writes.

Collection `f"{collection_prefix}-{generation_id}"`, named dense vector `"dense"`
(cosine), payload as in `contracts.vector_payload` (written by
`projector.adapters.qdrant_vectors`). It searches through a client it is handed: the
composition root opens one (`projector.adapters.qdrant_vectors.open_qdrant_client`, a
server or qdrant-client's local mode) and shares it with the projector, since local
mode allows one client per path.

Local mode is exact brute force in Python and ignores `SearchParams`; it is not sent
there (qdrant-client would warn on every process's first query).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import urllib3
from qdrant_client import QdrantClient, models
from qdrant_client.common.client_exceptions import QdrantException
from qdrant_client.http.exceptions import ApiException

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import Candidate, SearchFilter, id_lookup_size
from contracts.index_fields import (
    DOCUMENT_ID,
    FACETS,
    GALAXY,
    RING,
    RING_PATH,
    STATUS,
    UPDATED_AT,
    VISIBILITY,
    hidden_term,
)
from contracts.qdrant_rest import RETRY_ONCE, RestTarget, rest_target
from contracts.shards import copy_key, report_shards
from contracts.timing import engine_call, engine_reported
from contracts.vector_payload import (
    DEFAULT_HNSW_EF,
    DEFAULT_SPREAD_ACORN_SELECTIVITY,
    DEFAULT_SPREAD_EF_FACTOR,
    RETURNED_FIELDS,
    VECTOR_NAME,
    best_first,
    candidate_of,
    check_collection_prefix,
    check_generation_id,
    check_query_vector,
    cosine_score,
    facet_terms,
    hnsw_search_ef,
    utc_instant,
)

__all__ = ["DEPENDENCY", "QdrantServerVectorSearch", "qdrant_filter"]

DEPENDENCY = "qdrant"


class _RestError(Exception):
    """A query the server answered with an error status (its body is the message)."""


# What a client from `open_qdrant_client` (REST or local mode) raises: `ApiException` for
# HTTP answers and transport failures (it wraps httpx's), `QdrantException` for rate
# limits, in local mode plain `ValueError` / `RuntimeError` / `KeyError` / `OSError`, and
# `_RestError` from the REST query path.
_DRIVER_ERRORS = (
    ApiException,
    QdrantException,
    ValueError,
    RuntimeError,
    KeyError,
    OSError,
    _RestError,
)
# A copy that failed a search is skipped for this long before it is tried again.
_DOWN_SECONDS = 10.0
# `QueryPlan.engine_ms` keys: a query call's wall time in the worker (client library,
# network and engine) and the server's own `time` for it (REST path only).
ENGINE_QUERY = "qdrant_query"
ENGINE_TIME = "qdrant_time"
# qdrant-client's REST timeout when the client was given none (seconds).
# Connections the REST path keeps alive (opened only as concurrent calls need them): at
# least every thread that can call at once (request threads and the source pool), so
# none is opened and dropped per call under load.
_REST_CONNECTIONS = 64
# A scored point as the adapter reads it: (score, payload).
_Point = tuple[float, dict[str, Any]]
# Collection metadata of a spread generation (written by the projector's adapter).
_SHARDS_META = "orrery_shards"
_COPIES_META = "orrery_copies"

# What the eligibility gate knows of a generation's copies: key -> eligible (None: no
# per-copy verdict yet, every copy is a candidate).
CopyVerdicts = Callable[[str], Mapping[str, bool] | None]


class QdrantServerVectorSearch:
    """Cosine nearest neighbours over one generation's Qdrant collection.

    Construct with a `QdrantClient` (taken over: `close` closes it).

    Guarantees (those of `query.ports.VectorSearch`):
    - The filter is part of the engine request (`query_filter`, served by payload
      indexes), never applied afterwards, so `limit` results come back whenever that
      many documents match. It restricts and never changes scores. A filter with an
      empty list returns [].
    - At most `limit` candidates, best first, ties broken by `document_id` ascending
      (also across the `limit` boundary); scores are cosine similarities clamped to
      [-1, 1].
    - Exact in local mode and on segments a server has not indexed yet; on HNSW
      segments approximate with `ef = max(hnsw_ef, limit + 1)`, and for a spread
      generation (more than one shard or copy) at least `spread_ef_factor * (limit + 1)`
      per shard key (`contracts.vector_payload.hnsw_search_ef`; the ef is reported in
      `query_plan.shards.vector.hnsw_ef`); exact everywhere with `exact=True` (the
      global reference of a qualification receipt).
    - A spread generation's filtered searches (any condition beyond the hidden-lane
      exclusion) let Qdrant walk the graph with ACORN when its estimate of the share of
      a segment's points the filter keeps is at most `spread_acorn_selectivity` (0: never;
      reported as `query_plan.shards.vector.acorn_max_selectivity`). Qdrant's own planner
      still searches small selections exactly through the payload index.

    Errors: unknown generation -> `COVERAGE_UNAVAILABLE`; a query vector of the wrong
    dimension -> `EMBEDDER_MISMATCH`; non-finite or zero vector, naive datetime bounds,
    unsafe generation id -> `INVALID_REQUEST`; any other failure -> `DependencyUnavailable`.
    """

    def __init__(
        self,
        client: QdrantClient,
        *,
        collection_prefix: str = "orrery",
        hnsw_ef: int = DEFAULT_HNSW_EF,
        spread_ef_factor: int = DEFAULT_SPREAD_EF_FACTOR,
        spread_acorn_selectivity: float = DEFAULT_SPREAD_ACORN_SELECTIVITY,
        exact: bool = False,
    ) -> None:
        check_collection_prefix(collection_prefix)
        self._client = client
        # Exact search everywhere: a qualification's global vector reference.
        self._exact = exact
        options = self._client.init_options
        self._local = options.get("location") == ":memory:" or options.get("path") is not None
        self._prefix = collection_prefix
        self._hnsw_ef = hnsw_ef
        self._spread_ef_factor = spread_ef_factor
        self._acorn = (
            models.AcornSearchParams(enable=True, max_selectivity=spread_acorn_selectivity)
            if spread_acorn_selectivity > 0
            else None
        )
        self._copy_verdicts: CopyVerdicts = lambda _generation_id: None
        self._lock = threading.Lock()
        self._layouts: dict[str, tuple[int, int]] = {}
        # Generations spread by Qdrant's automatic sharding (a standalone server).
        self._auto_spread: set[str] = set()
        self._down: dict[tuple[str, str], float] = {}
        self._rest = None if self._local else _RestQuery.of(client)

    def use_copy_verdicts(self, verdicts: CopyVerdicts) -> None:
        """Take per-copy eligibility from `verdicts` (the eligibility gate's evidence):
        a copy whose read-back did not match the registry is never searched."""
        self._copy_verdicts = verdicts

    def search(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        limit: int,
    ) -> list[Candidate]:
        query_vector = check_query_vector(vector)
        engine_filter = qdrant_filter(filter)
        if limit <= 0 or filter.matches_nothing():
            return []
        check_generation_id(generation_id)
        collection = f"{self._prefix}-{generation_id}"

        def run(keys: list[str] | None) -> list[_Point]:
            spread = keys is not None or self._spread(generation_id)
            return self._top(
                collection, generation_id, query_vector, engine_filter, limit, keys, spread
            )

        points = self._over_copies(collection, generation_id, limit, run)
        return best_first((candidate_of(payload, score) for score, payload in points), limit)

    def scores(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        *,
        revisions: Mapping[str, int] | None = None,
        tenant: str = "",
    ) -> dict[str, float]:
        """`VectorSearch.scores`: one exact request (`SearchParams(exact=True)`; local mode
        is exact anyway) over the listed ids, returning only `document_id` of each point.
        `revisions` and `tenant` are not used: the server holds the vectors."""
        query_vector = check_query_vector(vector)
        engine_filter = qdrant_filter(filter)
        size = id_lookup_size(filter, DEPENDENCY)
        if size == 0 or filter.matches_nothing():
            return {}
        check_generation_id(generation_id)
        collection = f"{self._prefix}-{generation_id}"

        def run(keys: list[str] | None) -> list[_Point]:
            params = None if self._local else models.SearchParams(exact=True)
            return self._query(
                collection,
                generation_id,
                query_vector,
                engine_filter,
                size,
                [DOCUMENT_ID],
                params,
                keys,
            )

        points = self._over_copies(collection, generation_id, size, run, report=False)
        return {str(payload[DOCUMENT_ID]): cosine_score(score) for score, payload in points}

    # -- copies ------------------------------------------------------------------------

    def _layout(self, collection: str, generation_id: str) -> tuple[int, int]:
        """`(shards, copies per shard)`: `(1, 1)` unless the collection's metadata says it
        keeps one shard key per copy (immutable per generation, so cached)."""
        with self._lock:
            known = self._layouts.get(generation_id)
        if known is not None:
            return known
        if self._local:
            return (1, 1)
        try:
            collection_info = self._client.get_collection(collection)
            metadata = collection_info.config.metadata or {}
        except _DRIVER_ERRORS as error:
            raise self._diagnose(error, collection, generation_id, 0) from error
        layout = (
            (int(metadata[_SHARDS_META]), int(metadata[_COPIES_META]))
            if _SHARDS_META in metadata
            else (1, 1)
        )
        with self._lock:
            self._layouts[generation_id] = layout
            if layout == (1, 1) and _auto_spread(collection_info):
                self._auto_spread.add(generation_id)
        return layout

    def _spread(self, generation_id: str) -> bool:
        """Whether a generation with one shard key is spread all the same (automatic
        sharding, where a standalone server keeps a spread generation): it is searched
        at the spread ef too, as its receipt says. Known once `_layout` ran."""
        with self._lock:
            return generation_id in self._auto_spread

    def _over_copies(
        self,
        collection: str,
        generation_id: str,
        cap: int,
        run: Callable[[list[str] | None], list[_Point]],
        *,
        report: bool = True,
    ) -> list[_Point]:
        """`run` over one eligible copy of every shard (Qdrant merges their exact
        scores into one global top-k); a copy that fails is probed, set aside for
        `_DOWN_SECONDS`, and its shard's next eligible copy taken. A shard left with no
        eligible copy is `COVERAGE_UNAVAILABLE` naming it — never fewer results."""
        shards, copies = self._layout(collection, generation_id)
        if (shards, copies) == (1, 1):
            return run(None)
        verdicts = self._copy_verdicts(generation_id) or {}
        bypassed: dict[str, str] = {}
        for shard in range(shards):
            for copy in range(copies):
                key = copy_key(shard, copy)
                if verdicts.get(key, True) is False:
                    bypassed[key] = "ineligible: its read-back did not match the registry"
        for _attempt in range(copies + 1):
            now = time.monotonic()
            with self._lock:
                for (generation, key), until in list(self._down.items()):
                    if until <= now:
                        del self._down[(generation, key)]
                    elif generation == generation_id:
                        bypassed.setdefault(key, "unavailable: a search on it failed")
            chosen: list[str] = []
            for shard in range(shards):
                keys = [copy_key(shard, c) for c in range(copies)]
                usable = [k for k in keys if k not in bypassed]
                if not usable:
                    raise _shard_uncovered(generation_id, shard, {k: bypassed[k] for k in keys})
                chosen.append(usable[0])
            try:
                points = run(chosen)
            except DependencyUnavailable:
                failing = self._probe(collection, chosen)
                if not failing:
                    raise
                with self._lock:
                    for key in failing:
                        self._down[(generation_id, key)] = time.monotonic() + _DOWN_SECONDS
                continue
            if report:
                report_shards(
                    "vector",
                    {
                        "shards": shards,
                        "copies": copies,
                        "cap": cap,
                        # What each shard key's HNSW search ran with (None: exact).
                        "hnsw_ef": None if self._exact else self.ef(cap + 1, spread=True),
                        "acorn_max_selectivity": (
                            None
                            if self._exact or self._acorn is None
                            else self._acorn.max_selectivity
                        ),
                        "searched": chosen,
                        "bypassed": [{"copy": k, "reason": r} for k, r in sorted(bypassed.items())],
                    },
                )
            return points
        raise DependencyUnavailable(DEPENDENCY, f"query {generation_id}: copies keep failing")

    def _probe(self, collection: str, keys: list[str]) -> list[str]:
        """The copies among `keys` that do not answer a count by themselves."""
        failing = []
        for key in keys:
            try:
                self._client.count(collection, exact=False, shard_key_selector=key)
            except _DRIVER_ERRORS:
                failing.append(key)
        return failing

    def searched_ef(self, generation_id: str, limit: int) -> int | None:
        """The HNSW ef a search of `limit` candidates in the generation runs with on
        each shard key (None: exact, or local mode, where no ef is sent)."""
        if self._exact or self._local:
            return None
        check_generation_id(generation_id)
        layout = self._layout(f"{self._prefix}-{generation_id}", generation_id)
        spread = layout != (1, 1) or self._spread(generation_id)
        return self.ef(limit + 1, spread=spread)

    def ef(self, fetch: int, *, spread: bool) -> int:
        """The HNSW `ef` of a search asking each shard key for `fetch` points."""
        return hnsw_search_ef(
            fetch, floor=self._hnsw_ef, spread_factor=self._spread_ef_factor, spread=spread
        )

    def close(self) -> None:
        """Close the client (shared with a projector index in local mode: close once)."""
        if self._rest is not None:
            self._rest.close()
        self._client.close()

    def _query(
        self,
        collection: str,
        generation_id: str,
        vector: list[float],
        engine_filter: models.Filter | None,
        limit: int,
        with_payload: list[str],
        params: models.SearchParams | None,
        keys: list[str] | None,
    ) -> list[_Point]:
        """One query request: `(score, payload)` of each point, best first."""
        try:
            with engine_call(ENGINE_QUERY):
                if self._rest is not None:
                    return self._rest.query(
                        collection, vector, engine_filter, limit, with_payload, params, keys
                    )
                response = self._client.query_points(
                    collection,
                    query=vector,
                    using=VECTOR_NAME,
                    query_filter=engine_filter,
                    limit=limit,
                    with_payload=with_payload,
                    with_vectors=False,
                    search_params=params,
                    shard_key_selector=cast(Any, keys),
                )
        except _DRIVER_ERRORS as error:
            raise self._diagnose(error, collection, generation_id, len(vector)) from error
        return [(p.score, p.payload or {}) for p in response.points]

    def _top(
        self,
        collection: str,
        generation_id: str,
        vector: list[float],
        engine_filter: models.Filter | None,
        limit: int,
        keys: list[str] | None = None,
        spread: bool = False,
    ) -> list[_Point]:
        """The best points, including every point tied with the `limit`-th one.

        The engine orders ties arbitrarily, so one extra point is fetched: if it ties
        with the last one kept, the tie group may continue and the fetch doubles.

        A filtered HNSW walk can stop short of `limit` although more points match (it
        skips those the filter refuses; `query.adapters.qdrant_edge_vectors` measured 1
        of 10 for a 5 % filter): then the matches are counted and, if there are more,
        searched exactly.
        """
        fetch = limit + 1
        exact = self._exact
        while True:
            params = None
            if exact and not self._local:
                params = models.SearchParams(exact=True)
            elif not self._local:
                params = models.SearchParams(
                    hnsw_ef=self.ef(fetch, spread=spread),
                    # Only with conditions to walk by: the hidden-lane exclusion alone
                    # keeps nearly every point, and ACORN would never be chosen for it.
                    acorn=self._acorn if spread and engine_filter and engine_filter.must else None,
                )
            points = self._query(
                collection, generation_id, vector, engine_filter, fetch, _RETURNED, params, keys
            )
            if len(points) < limit and not exact and not self._local:
                matches = self._count(collection, generation_id, len(vector), engine_filter, keys)
                if matches > len(points):
                    exact = True
                    continue
            if len(points) < fetch or points[-1][0] != points[limit - 1][0]:
                return points
            fetch *= 2

    def _count(
        self,
        collection: str,
        generation_id: str,
        dimension: int,
        engine_filter: models.Filter | None,
        keys: list[str] | None,
    ) -> int:
        """The points `engine_filter` matches (an exact count)."""
        try:
            with engine_call(ENGINE_QUERY):
                return self._client.count(
                    collection,
                    count_filter=engine_filter,
                    exact=True,
                    shard_key_selector=cast(Any, keys),
                ).count
        except _DRIVER_ERRORS as error:
            raise self._diagnose(error, collection, generation_id, dimension) from error

    def _diagnose(
        self, error: BaseException, collection: str, generation_id: str, dimension: int
    ) -> OrreryError:
        """The `contracts.errors` form of a failed query.

        A server names a dimension mismatch; local mode fails inside numpy instead, so on
        any other error the collection is looked up (missing: `COVERAGE_UNAVAILABLE`) and
        its dimension read back and compared. Asking the engine spares parsing each
        transport's way of saying "not found".
        """
        message = str(error)
        if "dimension error" not in message.lower():
            try:
                if not self._client.collection_exists(collection):
                    return _coverage_unavailable(generation_id)
                vectors = self._client.get_collection(collection).config.params.vectors
            except _DRIVER_ERRORS:
                return DependencyUnavailable(DEPENDENCY, f"query {generation_id}: {message}")
            params = vectors.get(VECTOR_NAME) if isinstance(vectors, Mapping) else None
            if params is None or params.size == dimension:
                return DependencyUnavailable(DEPENDENCY, f"query {generation_id}: {message}")
        return OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"query vector does not fit generation {generation_id!r}: {message}",
            {"generation_id": generation_id, "got_dimension": dimension},
        )


_RETURNED = list(RETURNED_FIELDS)


class _RestQuery:
    """`POST /collections/{name}/points/query` of a server client, over urllib3 with
    kept-alive connections and the answer read as plain JSON.

    Why not through qdrant-client: it closes every connection to a server on
    127.0.0.1/localhost after one request (`max_keepalive_connections=0`), and builds
    and validates pydantic models for the request and every returned point; measured on
    a 20k collection, 201 points with 4 payload fields, one call's CPU in the worker:
    2.85 ms through the client, 1.33 ms this way (session 15, `bench/servers_topk.py
    clients`). The request is the one the client would send (filter and search params
    serialized by the client's own models); scores are the same JSON numbers. Only for
    a client made with a `url` and nothing this path does not reproduce (a token
    provider, gRPC, extra headers): otherwise `of` returns None and the client is used.
    """

    def __init__(self, rest_uri: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self._pool = urllib3.connection_from_url(
            rest_uri,
            maxsize=_REST_CONNECTIONS,
            timeout=urllib3.Timeout(total=timeout_s),
            retries=urllib3.Retry(**RETRY_ONCE),
        )
        self._prefix = RestTarget(rest_uri, headers, timeout_s).prefix
        self._headers = {"content-type": "application/json", **headers}

    @classmethod
    def of(cls, client: QdrantClient) -> _RestQuery | None:
        target = rest_target(client)
        return None if target is None else cls(target.uri, target.headers, target.timeout_s)

    def query(
        self,
        collection: str,
        vector: list[float],
        engine_filter: models.Filter | None,
        limit: int,
        with_payload: list[str],
        params: models.SearchParams | None,
        keys: list[str] | None,
    ) -> list[_Point]:
        body: dict[str, Any] = {
            "query": vector,
            "using": VECTOR_NAME,
            "limit": limit,
            "with_payload": with_payload,
            "with_vector": False,
        }
        if engine_filter is not None:
            body["filter"] = _encoded(engine_filter)
        if params is not None:
            body["params"] = _encoded(params)
        if keys is not None:
            body["shard_key"] = keys
        try:
            response = self._pool.urlopen(
                "POST",
                f"{self._prefix}/collections/{quote(collection, safe='')}/points/query",
                body=json.dumps(body, separators=(",", ":")),
                headers=self._headers,
            )
        except urllib3.exceptions.HTTPError as error:
            raise _RestError(f"qdrant unreachable: {error}") from error
        if response.status != 200:
            raise _RestError(f"{response.status}: {response.data.decode('utf-8', 'replace')}")
        try:
            answer = json.loads(response.data)
            points = answer["result"]["points"]
            took = answer.get("time")
        except (ValueError, KeyError, TypeError) as error:
            raise _RestError(f"unexpected answer: {error}") from error
        if isinstance(took, int | float):
            engine_reported(ENGINE_TIME, took * 1000.0)
        return [(point["score"], point.get("payload") or {}) for point in points]

    def close(self) -> None:
        self._pool.close()


def _encoded(model: models.Filter | models.SearchParams) -> Any:
    """The JSON form qdrant-client sends for `model` (fields set, nulls left out)."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)


def qdrant_filter(filter: SearchFilter) -> models.Filter | None:
    """The engine filter equivalent to `filter`, less the documents hidden from the
    vector lane (never None: that exclusion always applies).

    Every clause is a `must`; any-of lists are `MatchAny` on keyword indexes, facets are
    matched as `"name=value"` strings, time bounds are inclusive datetime ranges in UTC
    (naive bounds are `INVALID_REQUEST`). Phrase groups are refused (`INTERNAL`): the
    query worker resolves them to ids.
    """
    if filter.phrases:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "vector search cannot apply phrase filters; resolve them to document_ids first",
            {"engine": "qdrant"},
        )
    must: list[models.Condition] = []
    if filter.galaxy is not None:
        must.append(models.FieldCondition(key=GALAXY, match=models.MatchValue(value=filter.galaxy)))
    if filter.status is not None:
        must.append(_any_of(STATUS, list(filter.status)))
    if filter.visibility is not None:
        must.append(_any_of(VISIBILITY, list(filter.visibility)))
    if filter.updated_after is not None or filter.updated_before is not None:
        after, before = filter.updated_after, filter.updated_before
        must.append(
            models.FieldCondition(
                key=UPDATED_AT,
                range=models.DatetimeRange(
                    gte=None if after is None else utc_instant(after),
                    lte=None if before is None else utc_instant(before),
                ),
            )
        )
    for name, values in sorted(filter.facets.items()):
        must.append(_any_of(FACETS, facet_terms(name, values)))
    if filter.document_ids is not None:
        must.append(_any_of(DOCUMENT_ID, list(filter.document_ids)))
    if filter.rings is not None:
        must.append(_any_of(RING, list(filter.rings)))
    if filter.ring_trees is not None:
        must.append(_any_of(RING_PATH, list(filter.ring_trees)))
    return models.Filter(must=must, must_not=[_HIDDEN])


# Documents hidden from the vector lane (`Record.index_lanes`) are never a hit.
_HIDDEN = models.FieldCondition(key=FACETS, match=models.MatchValue(value=hidden_term("vector")))


def _any_of(field: str, values: list[str]) -> models.FieldCondition:
    return models.FieldCondition(key=field, match=models.MatchAny(any=values))


def _auto_spread(info: models.CollectionInfo) -> bool:
    """More than one shard or copy by Qdrant's automatic sharding."""
    params = info.config.params
    return (params.shard_number or 1) > 1 or (params.replication_factor or 1) > 1


def _shard_uncovered(generation_id: str, shard: int, why: Mapping[str, str]) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"shard {shard} of generation {generation_id!r} has no eligible copy: "
        + "; ".join(f"{k} {r}" for k, r in sorted(why.items())),
        {"engine": DEPENDENCY, "generation_id": generation_id, "shard": shard, "copies": dict(why)},
    )


def _coverage_unavailable(generation_id: str) -> OrreryError:
    return OrreryError(
        ErrorCode.COVERAGE_UNAVAILABLE,
        f"no vector index for generation {generation_id!r}",
        {"generation_id": generation_id},
    )
