"""What the projector writes into an index and what a query asks of one.

The same `IndexDocument`, `SearchFilter` and `Candidate` are used by every lexical and
vector engine (tantivy, qdrant-edge, OpenSearch, Qdrant), so that filter semantics can be
proven identical by one conformance suite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.errors import ErrorCode, OrreryError
from contracts.index_fields import BODY, HIDDEN_FACET, SOURCE_TEXT_FIELDS, TAGS, TEXT, TITLE
from contracts.records import AwareDatetime, Record
from contracts.stored_vectors import is_encoded
from contracts.trusted import trusted_constructor

__all__ = [
    "DEFAULT_FIELD_BOOSTS",
    "TITLE_BOOST",
    "Candidate",
    "IndexDocument",
    "SearchFilter",
    "field_boosts",
    "id_lookup_size",
    "is_unicode",
    "to_index_document",
]

# Title matches count this many times a body match (BM25 field boost).
TITLE_BOOST = 2.0
# Tags count like the body by default.
TAGS_BOOST = 1.0
# The boost of each text field when a query names none (a fusion profile may). The
# combined field `text` (title + body + tags) is not scored unless a profile boosts it.
DEFAULT_FIELD_BOOSTS: Mapping[str, float] = MappingProxyType(
    {TITLE: TITLE_BOOST, BODY: 1.0, TAGS: TAGS_BOOST, TEXT: 0.0}
)


def field_boosts(
    overrides: Mapping[str, float] | None, *, combined_field: bool = True
) -> dict[str, float]:
    """The boost of every text field: the defaults with `overrides` applied. Fields
    boosted 0 are left out; an unknown field name raises `ValueError`.

    For an index without the combined field (`combined_field=False`: analyzer version 1),
    a `text` boost is added to the boost of each field it combines, so that a profile
    scoring `text` still finds what such an index holds.
    """
    boosts = dict(DEFAULT_FIELD_BOOSTS)
    for name, boost in (overrides or {}).items():
        if name not in boosts:
            raise ValueError(f"unknown text field {name!r}")
        boosts[name] = float(boost)
    if not combined_field:
        spread = boosts.pop(TEXT)
        for name in SOURCE_TEXT_FIELDS:
            boosts[name] += spread
    return {name: boost for name, boost in boosts.items() if boost > 0.0}


class IndexDocument(BaseModel):
    """The projection of one live record revision into an index.

    Filter fields: `galaxy`, `ring`, `status`, `visibility` (multi-valued),
    `updated_at`, `facets` (`name -> values`). Text fields: `title`, `body`, `tags`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    document_id: str
    revision: int
    item_id: str
    galaxy: str
    ring: str
    status: str
    updated_at: AwareDatetime
    visibility: tuple[str, ...] = ()
    facets: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    title: str = ""
    body: str = ""
    tags: tuple[str, ...] = ()
    # A tuple, or a `contracts.stored_vectors.StoredVector` or `PackedVector` (a decoded
    # event's: its float32 array and JSON text ride along to the engines).
    vector: Sequence[float] | None = None


def is_unicode(value: str) -> bool:
    """False for strings with lone surrogates (stdlib `json` lets `"\\ud800"` through): no
    engine stores such a keyword, so no filter value of that kind can match."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_INDEX_DOCUMENT = trusted_constructor(IndexDocument)
_LANES = ("lexical", "vector")


def _facets(record: Record) -> dict[str, tuple[str, ...]]:
    metadata = record.metadata
    facets = {k: tuple(v) for k, v in metadata.facets().items()} if metadata.model_extra else {}
    if record.index_lanes is not None:
        hidden = tuple(lane for lane in _LANES if lane not in record.index_lanes)
        if hidden:
            facets[HIDDEN_FACET] = hidden
    return facets


def to_index_document(record: Record, vector: Sequence[float] | None) -> IndexDocument:
    """Project a (non-deleted) record revision into its index form.

    A lane the record's `index_lanes` leaves out is named in the facet `HIDDEN_FACET`,
    which every search of that lane excludes. Built without validation: every value
    comes from a validated `Record` (its `updated_at` is already aware UTC) and has the
    field's type, and validating the vector again cost more than the rest of the
    projection (the projector builds one per record). `contracts.trusted`: pydantic's
    `model_construct` walked the 13 fields per call (~10 us a record)."""
    return _INDEX_DOCUMENT(
        document_id=record.doc_id,
        revision=record.revision,
        item_id=record.item_id,
        galaxy=record.galaxy,
        ring=record.ring,
        status=record.metadata.status,
        updated_at=record.metadata.updated_at,
        visibility=tuple(record.metadata.visibility),
        facets=_facets(record),
        title=record.text.title,
        body=record.text.body,
        tags=tuple(record.text.tags),
        # `tuple` of a tuple is the tuple itself: free for the embedders' vectors.
        vector=None if vector is None else vector if is_encoded(vector) else tuple(vector),
    )


class SearchFilter(BaseModel):
    """Restrictions applied before scoring, with the same meaning in every engine.

    - `galaxy`: exact match (always set by the query worker from the caller's key).
    - `status`: the record's status is one of these.
    - `visibility`: the record carries at least one of these labels.
    - `updated_after` / `updated_before`: inclusive bounds on `updated_at`.
    - `facets`: for every name, the record has at least one of the listed values.
    - `document_ids`: the record is one of these (the generic API's `allowed_doc_ids`).
    - `rings`: the record's ring is exactly one of these (non-empty ring names).
    - `ring_trees`: the record's ring is one of these or below one of them (`a/b` takes
      `a/b` and `a/b/c`, never `a/bc`): one keyword match on the ring path
      (`contracts.index_fields.RING_PATH`).
    - `phrases`: all-of groups, any-of phrases per group: for every group, one of its
      phrases occurs in a source text field (title, body, a tag) as a phrase — its tokens,
      analyzed like indexed text, adjacent and in order (slop 0) within one value. Lexical
      engines only: a vector engine given phrases raises (resolve them to
      `document_ids` first, see `query.phrases`).

    A field left as `None` (or an empty `facets` / `phrases`) does not restrict. An empty
    list (or an empty phrase group) matches nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    galaxy: str | None = None
    status: tuple[str, ...] | None = None
    visibility: tuple[str, ...] | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    facets: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    document_ids: tuple[str, ...] | None = None
    rings: tuple[str, ...] | None = None
    ring_trees: tuple[str, ...] | None = None
    phrases: tuple[tuple[str, ...], ...] = ()

    @field_validator("rings", "ring_trees")
    @classmethod
    def _ring_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and any(not ring or "" in ring.split("/") for ring in value):
            raise ValueError("ring filters name rings: '/'-separated, no empty segment")
        return value

    def matches_nothing(self) -> bool:
        lists = [
            self.status,
            self.visibility,
            self.document_ids,
            self.rings,
            self.ring_trees,
            *self.facets.values(),
            *self.phrases,
        ]
        return any(values is not None and len(values) == 0 for values in lists)

    def with_ids(self, document_ids: tuple[str, ...], *, phrases: bool = True) -> SearchFilter:
        """This filter restricted to exactly `document_ids` (and without its phrase groups
        when `phrases` is False): the model `model_copy(update=...)` makes (the same
        fields, the same fields set), built directly. A score lookup by id makes one or
        two of these per query; pydantic's copy (a generic `__copy__` of four attributes
        through `copy.copy`) cost three times as much."""
        values = dict(self.__dict__)
        values["document_ids"] = document_ids
        named = {"document_ids"}
        if not phrases:
            values["phrases"] = ()
            named.add("phrases")
        new = object.__new__(SearchFilter)
        setattr_ = object.__setattr__
        setattr_(new, "__dict__", values)
        setattr_(new, "__pydantic_fields_set__", self.__pydantic_fields_set__ | named)
        setattr_(new, "__pydantic_extra__", None)
        setattr_(new, "__pydantic_private__", None)
        return new


def id_lookup_size(filter: SearchFilter, engine: str) -> int:
    """How many documents a score lookup by id (the ports' `scores`) can return: the
    distinct ids `filter.document_ids` lists. A filter without ids is refused
    (`INTERNAL`): lookups are bounded by their ids, never a scan."""
    if filter.document_ids is None:
        raise OrreryError(
            ErrorCode.INTERNAL,
            "a score lookup needs a filter with document_ids",
            {"engine": engine},
        )
    return len(set(filter.document_ids))


class Candidate(NamedTuple):
    """A scored hit from one source. Higher `score` is better within one source only.

    A named tuple, not a pydantic model nor a frozen dataclass: engines build one per
    hit on the query hot path (hundreds per request), their adapters already hand over
    typed values, and a named tuple is as immutable and built in a quarter of a frozen
    dataclass's time (positionally; by keyword in half).
    """

    document_id: str
    revision: int
    score: float
    updated_at: datetime
    status: str
