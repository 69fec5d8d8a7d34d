"""How a document is stored as a point in a Qdrant-family engine, and read back.

The contract between the projector's vector adapters (which write points) and the query's
vector adapters (which filter on and read their payload), for every Qdrant engine
(qdrant-edge, a Qdrant server, qdrant-client's local mode). Keeping it in one place is
what makes a generation written by one adapter readable by the others' query side, and
makes their filter semantics the same. Pure: stdlib and pydantic only, no I/O.

Point id: `point_id(document_id)`. One named dense vector, `VECTOR_NAME`, cosine.

Payload of a point (`payload_of`):

| field         | value                                   | payload index (`PAYLOAD_INDEXES`) |
|---------------|-----------------------------------------|-----------------------------------|
| `document_id` | the document id                         | keyword                           |
| `revision`    | int                                     | integer                           |
| `galaxy`      | str                                     | keyword (tenant)                  |
| `ring`        | str                                     | keyword                           |
| `ring_path`   | the ring and its ancestors (`ring_path`) | keyword                          |
| `status`      | str                                     | keyword                           |
| `visibility`  | list of labels                          | keyword                           |
| `facets`      | sorted list of `"name=value"` strings   | keyword                           |
| `updated_at`  | RFC 3339 UTC with microseconds (`…Z`)¹  | datetime¹                         |

¹ qdrant-edge generations since session 26: integer microseconds, integer range index.

A field whose value is empty (`ring` "", an empty list) is left out of the payload: a
missing field matches no filter, as an empty one does. Points written by index schema
version 5 and older also hold `item_id` (never read) and the empty values.

A list of one value (`ring_path` of a top-level ring, one `visibility` label, one
`facets` term) may be stored as that value alone (`payload_of(..., singletons=True)`:
qdrant-edge points since session 25). Every filter matches it exactly as it matches the
list: Qdrant matches a keyword condition on an array when any element matches, on a
string when the string does, and indexes both alike. A reader of those fields takes
either form (`listed`). The binding converts a list as a value of its own (~7 us a
point in qdrant-edge-py 0.9, on top of its strings), with the GIL held.

`updated_at` is compared as a datetime: Qdrant keeps datetimes as integer microseconds
since the epoch, the resolution of Python's `datetime`, so inclusive range bounds written
with `utc_timestamp` are exact (a float epoch would round at microsecond scale).
qdrant-edge generations created since session 26 store it as those integer microseconds
themselves (`payload_of(..., micros=True)`, `utc_micros`) under an integer range index:
the binding converts an int without the three failed conversions a string costs, and the
index does not parse text. Their range filter is the query adapter's (`_micros_range`);
`candidate_of` reads either form.
"""

from __future__ import annotations

import hashlib
import math
import operator
import re
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from contracts.admission import vector_problem
from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate, IndexDocument
from contracts.index_fields import (
    DOCUMENT_ID,
    FACET_SEPARATOR,
    FACETS,
    GALAXY,
    REVISION,
    RING,
    RING_PATH,
    STATUS,
    UPDATED_AT,
    VISIBILITY,
    is_canonical_uuid,
    ring_path,
)

__all__ = [
    "DEFAULT_HNSW_EF",
    "DEFAULT_SPREAD_ACORN_SELECTIVITY",
    "DEFAULT_SPREAD_EF_FACTOR",
    "GRAPH_FIELDS",
    "PAYLOAD_INDEXES",
    "POINT_ID_NAMESPACE",
    "RETURNED_FIELDS",
    "TENANT_FIELD",
    "VECTOR_NAME",
    "PayloadIndexKind",
    "best_first",
    "candidate_of",
    "check_collection_prefix",
    "check_generation_id",
    "check_query_vector",
    "check_vector",
    "cosine_score",
    "facet_terms",
    "hnsw_search_ef",
    "listed",
    "payload_of",
    "point_id",
    "point_key",
    "utc_instant",
    "utc_micros",
    "utc_timestamp",
    "with_id",
]

VECTOR_NAME = "dense"
"""The name of the one dense (cosine) vector of every point."""

POINT_ID_NAMESPACE = uuid.UUID("5b0f2a71-3c4e-4d38-9f0e-6a1d2c7e8b90")
"""Maps non-UUID document ids to point ids. Fixed forever: changing it re-keys every
collection and shard built before the change."""

PayloadIndexKind = Literal["keyword", "integer", "datetime"]

DEFAULT_HNSW_EF = 128
"""`ORRERY_VECTOR_HNSW_EF`: the least HNSW `ef` of an approximate search."""

DEFAULT_SPREAD_EF_FACTOR = 10
"""`ORRERY_VECTOR_SPREAD_EF_FACTOR`: a spread generation's HNSW `ef` per points asked."""

DEFAULT_SPREAD_ACORN_SELECTIVITY = 0.4
"""`ORRERY_VECTOR_SPREAD_ACORN_SELECTIVITY`: a spread generation's filtered HNSW searches
let Qdrant use ACORN (Qdrant >= 1.16: the graph walk also steps over neighbours the filter
rejects) when the filter keeps at most this share of a segment's points (Qdrant's own
estimate and default); 0 turns it off. Without it, a filter combining conditions on two
fields (status + visibility) walks a graph whose matching points are too sparsely linked
to reach them all, and no `ef` makes up for it (docs/deploy.md: at 100k, inclusion of the
exact top 100 mean 0.984, min 0.71 at ef 1,010)."""

PAYLOAD_INDEXES: Mapping[str, PayloadIndexKind] = {
    GALAXY: "keyword",
    STATUS: "keyword",
    VISIBILITY: "keyword",
    FACETS: "keyword",
    RING: "keyword",
    RING_PATH: "keyword",
    DOCUMENT_ID: "keyword",
    REVISION: "integer",
    UPDATED_AT: "datetime",
}
"""The payload fields queries filter on and the kind of index each one gets."""

GRAPH_FIELDS: frozenset[str] = frozenset({GALAXY, STATUS, VISIBILITY, FACETS})
"""The indexed fields whose values get their own HNSW links (Qdrant's payload-aware
graph, `enable_hnsw`): the equality / any-of filters of most queries, whose mid-size
selections (a tenant, a status) a plain graph walk serves worst. Not `document_id`
(phrase-plan id sets are small: searched exactly through the payload index), `revision`
(never a query filter) or `updated_at` (time ranges). Each such field adds about one
graph build over the points it covers: at 100k points linking all seven fields made a
build 1.7x slower than these four (171 s vs 103 s) for +0.01 recall@10 of filtered
searches; linking none drops tenant-filtered recall@10 to 0.14 (`bench/hnsw_payload.py`)."""

TENANT_FIELD = GALAXY
"""The keyword field that isolates tenants (engines that can co-locate by tenant do)."""

RETURNED_FIELDS: tuple[str, ...] = (DOCUMENT_ID, REVISION, STATUS, UPDATED_AT)
"""The payload fields a search reads back to build a `Candidate`."""

# Generation ids and collection prefixes: safe as directory names and within what
# Qdrant accepts as a collection name.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_generation_id(generation_id: str) -> None:
    """Reject generation ids unsafe as a directory or collection name (`INVALID_REQUEST`)."""
    if not _SAFE_NAME.fullmatch(generation_id):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "generation ids are 1-128 letters, digits, '_', '.', '-', starting with a letter "
            "or digit",
            {"generation_id": generation_id},
        )


def check_collection_prefix(collection_prefix: str) -> None:
    """Reject a prefix of Qdrant collection names (`f"{prefix}-{generation_id}"`) that is
    not 1-128 letters, digits, '_', '.', '-' (`INVALID_REQUEST`)."""
    if not _SAFE_NAME.fullmatch(collection_prefix):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "collection_prefix must be 1-128 letters, digits, '_', '.', '-'",
            {"collection_prefix": collection_prefix},
        )


def point_id(document_id: str) -> uuid.UUID:
    """The point id of a document: its UUID if it is a canonical UUID string, else uuid5.

    Only the canonical lowercase form is taken as is, so that two distinct strings (say
    upper- and lowercase spellings) can never share a point.
    """
    try:
        parsed = uuid.UUID(document_id)
    except ValueError:
        return uuid.uuid5(POINT_ID_NAMESPACE, document_id)
    if str(parsed) == document_id:
        return parsed
    return uuid.uuid5(POINT_ID_NAMESPACE, document_id)


_NAMESPACE_BYTES = POINT_ID_NAMESPACE.bytes


def point_key(document_id: str) -> str:
    """`str(point_id(document_id))`, without building UUID objects (the projector's
    Qdrant writes key their points by this text: `point_id` and the UUID's text cost
    ~9 µs a document, this ~3). A canonical UUID string (`is_canonical_uuid`: exactly
    what `point_id` takes as is) is its own key; any other id is `uuid.uuid5`'s text,
    computed as `uuid5` does: SHA-1 of the namespace's bytes and the id's UTF-8 (a
    lone surrogate raises `UnicodeEncodeError` as there), its first 16 bytes with the
    version (5) and the RFC 4122 variant set."""
    if is_canonical_uuid(document_id):
        return document_id
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + document_id.encode("utf-8")).digest())
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utc_instant(value: datetime) -> datetime:
    """`value` in UTC; a naive datetime is rejected with `INVALID_REQUEST` (no instant)."""
    if value.tzinfo is None:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            "timestamps must carry a timezone",
            {"value": value.isoformat()},
        )
    return value.astimezone(UTC)


def utc_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the form `updated_at` is stored and compared in.

    A naive datetime is rejected with `INVALID_REQUEST`.
    """
    instant = utc_instant(value)
    # `isoformat` of a UTC instant is this text with "+00:00" for "Z", always with a
    # four-digit year (`strftime`'s `%Y` leaves a year before 1000 unpadded here, a text
    # that sorts wrong against every other and that `candidate_of` cannot read back).
    return instant.isoformat(timespec="microseconds")[:-6] + "Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def utc_micros(value: datetime) -> int:
    """Microseconds since the epoch of `value` (exact: the resolution of `datetime`); the
    form qdrant-edge generations created since session 26 store `updated_at` in.

    A naive datetime is rejected with `INVALID_REQUEST`.
    """
    return (utc_instant(value) - _EPOCH) // _MICROSECOND


def _instant(value: Any) -> datetime:
    """A stored `updated_at` as a UTC datetime: integer microseconds (`utc_micros`) or
    RFC 3339 text (`utc_timestamp`)."""
    if type(value) is int:
        return _EPOCH + timedelta(microseconds=value)
    return datetime.fromisoformat(str(value))


def facet_terms(name: str, values: Iterable[str]) -> list[str]:
    """The `facets` payload strings of one facet name's values."""
    return [f"{name}{FACET_SEPARATOR}{value}" for value in values]


def payload_of(
    document: IndexDocument,
    *,
    singletons: bool = False,
    micros: bool = False,
    implied_id: bool = False,
) -> dict[str, Any]:
    """The payload stored with a document's point (see the module docstring).

    Empty values are left out (`ring` "", and `ring_path`, `visibility`, `facets` []):
    every filter on those fields asks for one of some non-empty values, which a missing
    field matches exactly as little as an empty one, and the engines' Python bindings
    convert each payload value by trying every JSON type in turn (qdrant-edge: ~2 us a
    string, ~4.5 us an empty list). `item_id` is written by index schema version 5 and
    older only (no query reads it from a point). With `singletons`, a list of one value
    is stored as that value (the module docstring says why every filter matches alike).
    With `micros`, `updated_at` is integer microseconds since the epoch (`utc_micros`).
    With `implied_id`, a `document_id` that is its own point id (a canonical UUID, as
    every derived id is) is left out: readers take it from the point id (`with_id`).
    """
    payload: dict[str, Any] = {
        DOCUMENT_ID: document.document_id,
        REVISION: document.revision,
        GALAXY: document.galaxy,
        STATUS: document.status,
        UPDATED_AT: (utc_micros if micros else utc_timestamp)(document.updated_at),
    }
    if implied_id and is_canonical_uuid(document.document_id):
        del payload[DOCUMENT_ID]
    if document.ring:
        payload[RING] = document.ring
        path = ring_path(document.ring)
        payload[RING_PATH] = path[0] if singletons and len(path) == 1 else list(path)
    if document.visibility:
        labels = document.visibility
        payload[VISIBILITY] = labels[0] if singletons and len(labels) == 1 else list(labels)
    if document.facets:
        terms = sorted(
            term for name, values in document.facets.items() for term in facet_terms(name, values)
        )
        if terms:
            payload[FACETS] = terms[0] if singletons and len(terms) == 1 else terms
    return payload


def with_id(payload: Mapping[str, Any], point: object) -> Mapping[str, Any]:
    """`payload` of the point whose id is `point` (a `uuid.UUID`), with its `document_id`:
    as stored, or, where `payload_of(implied_id=True)` left it out, the point id's
    canonical text (such a document id is its own point id, `point_id`)."""
    if DOCUMENT_ID in payload:
        return payload
    return {**payload, DOCUMENT_ID: str(point)}


def listed(value: Any) -> list[Any]:
    """A payload field's values as a list, whichever form it was stored in: a list as it
    is, a single value (a list of one stored as its value, `payload_of(singletons=True)`)
    as a list of it, a missing field (None) as []."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def check_vector(document: IndexDocument, dimension: int | None) -> None:
    """Reject a document whose vector cannot be stored: `EMBEDDER_MISMATCH`.

    Missing, or refused by `contracts.admission.vector_problem` (another dimension than
    `dimension`, unchecked when None; a value non-finite in float32; all zeros or too
    short or long to normalize in float32): the rule the write routes apply at the door.
    """
    vector = document.vector
    problem: str | None = None
    if vector is None:
        problem = "has no vector"
    else:
        refused = vector_problem(vector, dimension)
        if refused is not None:
            problem = f"cannot be stored: {refused.msg} ({refused.type})"
    if problem is not None:
        raise OrreryError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"document {document.document_id!r} {problem}",
            {
                "document_id": document.document_id,
                "expected_dimension": dimension,
                "got_dimension": None if vector is None else len(vector),
            },
        )


def check_query_vector(vector: Sequence[float]) -> list[float]:
    """The query vector as floats; empty, non-finite or all-zero is `INVALID_REQUEST`.

    A query's vector search and its re-score's lookup check the same tuple: the last
    tuple checked on this thread is remembered by identity (a tuple never changes)."""
    last: tuple[Sequence[float], list[float]] | None = getattr(_CHECKED, "last", None)
    if last is not None and last[0] is vector:
        return last[1]
    values = _checked(vector)
    if isinstance(vector, tuple):
        _CHECKED.last = (vector, values)
    return values


# Per thread: `(tuple, its checked values)` of the last `check_query_vector` of a tuple.
_CHECKED = threading.local()


def _checked(vector: Sequence[float]) -> list[float]:
    values = list(map(float, vector))
    # A finite sum proves every value finite (an inf or a nan makes the sum inf or nan);
    # only a non-finite sum (or an overflowing one) needs the per-value check.
    if not values or (not math.isfinite(sum(values)) and not all(map(math.isfinite, values))):
        raise OrreryError(ErrorCode.INVALID_REQUEST, "query vector must be finite numbers")
    if not any(values):
        raise OrreryError(ErrorCode.INVALID_REQUEST, "query vector is all zeros")
    return values


def cosine_score(score: float) -> float:
    """An engine's cosine clamped to [-1, 1] (engines compute it in float32, which can
    land a hair outside the range)."""
    return min(1.0, max(-1.0, float(score)))


def candidate_of(payload: Mapping[str, Any], score: float) -> Candidate:
    """The candidate of a scored point; the score is clamped to [-1, 1].

    Engines compute cosine in float32, which can land a hair outside the range.
    """
    # Positional: `candidate_of` runs once per returned point of every query.
    return Candidate(
        str(payload[DOCUMENT_ID]),
        int(payload[REVISION]),
        min(1.0, max(-1.0, float(score))),  # `cosine_score`, inlined
        _instant(payload[UPDATED_AT]),
        str(payload[STATUS]),
    )


def hnsw_search_ef(fetch: int, *, floor: int, spread_factor: int, spread: bool) -> int:
    """The HNSW `ef` of an approximate search asking each segment (each shard key of a
    spread generation) for `fetch` points: at least `floor` and `fetch`; for a spread
    generation — more than one shard or copy, the ones a qualification receipt must
    vouch for before promote — at least `spread_factor * fetch` (docs/deploy.md says why:
    at cap 100 over three keys, ef 128 found 0.94-0.97 of the exact top 100, the
    receipt asks for 0.99)."""
    ef = max(floor, fetch)
    return max(ef, spread_factor * fetch) if spread else ef


def best_first(candidates: Iterable[Candidate], limit: int) -> list[Candidate]:
    """The best `limit` candidates: score descending, ties by `document_id` ascending.

    An engine hands its hits best first already: when the scores strictly decrease, that
    order is the only one the sort could give (no two keys tie), so it is kept as it is
    (one C-level pass over the scores instead of a sort with a key per candidate, ~1/4
    of its time at 101 hits); any tie, NaN or disorder is sorted."""
    found = candidates if isinstance(candidates, list) else list(candidates)
    scores = list(map(_SCORE, found))
    if all(map(operator.gt, scores, scores[1:])):
        return found[: max(0, limit)]
    return sorted(found, key=lambda c: (-c.score, c.document_id))[: max(0, limit)]


_SCORE = operator.itemgetter(2)  # `Candidate.score`
