"""The canonical record: what producers write and what every index is projected from."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    model_validator,
)

from contracts.digests import sha256_json
from contracts.names import Namespace
from contracts.wire import JsonInt

__all__ = [
    "DEFAULT_GALAXY",
    "DOCUMENT_ID_NAMESPACE",
    "RECORD_BODY",
    "Record",
    "RecordMetadata",
    "RecordText",
    "check_name",
    "derive_document_id",
    "identity_violation",
    "payload_sha256",
    "record_json_without_vector",
    "vector_json",
    "vector_span",
    "vector_text",
]

# A fixed UUID namespace: document ids derived from it are stable across processes,
# machines and releases. Changing it would re-key every index.
DOCUMENT_ID_NAMESPACE = uuid.UUID("0f5c7a52-6c53-4a8e-9a3e-3d0e6f0b9e42")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(value: str) -> str:
    """`value` if it is a name (a snapshot kind, a galaxy), else `ValueError` saying the
    rule."""
    if not _NAME.fullmatch(value):
        raise ValueError(
            "must be 1-128 characters of letters, digits, '_', '.', '-', starting with a "
            "letter or digit"
        )
    return value


def _check_ring(value: str) -> str:
    if value and any(not part for part in value.split("/")):
        raise ValueError("ring is a '/'-separated path without empty segments")
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# `_CONTROL` as JSON Schema says it.
_ITEM_ID_PATTERN = r"^[^\u0000-\u001f\u007f]*$"


def _check_item_id(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("item_id must not contain control characters (NUL, newline, …)")
    return value


# RFC 3339 with its offset, the one spelling of a timestamp on the wire (JSON has no
# datetime type to be strict about: no number of seconds, no offset-less local time).
_TIMESTAMP_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2})$"
)
_TIMESTAMP = re.compile(_TIMESTAMP_PATTERN)
# A record's `updated_at`: written in a year from 1678 to 2261 (what JSON Schema says),
# and in UTC (how it is stored and read back) from 1678-01-01 to before 2262-01-01 —
# inside every engine's range (tantivy: nanoseconds since the epoch in an i64, from
# 1677-09-21 to 2262-04-11). The two differ only for the hours of an offset at either
# end (`1678-01-01T00:00:00+01:00` is 1677 in UTC).
UPDATED_AT_FIRST_YEAR = 1678
UPDATED_AT_LAST_YEAR = 2261
UPDATED_AT_EARLIEST = datetime(UPDATED_AT_FIRST_YEAR, 1, 1, tzinfo=UTC)
UPDATED_AT_LATEST = datetime(UPDATED_AT_LAST_YEAR + 1, 1, 1, tzinfo=UTC)
_INDEXABLE_YEAR = r"(?:167[89]|16[89][0-9]|1[7-9][0-9]{2}|2[01][0-9]{2}|22[0-5][0-9]|226[01])"


def _timestamp_text(value: object) -> object:
    # A `datetime` passes (Python callers); text must be RFC 3339 with an offset.
    if isinstance(value, datetime) or (isinstance(value, str) and _TIMESTAMP.fullmatch(value)):
        return value
    raise ValueError("a timestamp is RFC 3339 text with its offset (e.g. '2026-03-19T12:00:00Z')")


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamps must carry a timezone (e.g. '2026-03-19T12:00:00Z')")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 has no UTC instant in `datetime`
        raise ValueError("the timestamp is out of range in UTC") from None


def _range_error() -> ValueError:
    return ValueError(
        f"updated_at must be from {UPDATED_AT_EARLIEST.date()} to before "
        f"{UPDATED_AT_LATEST.date()} (UTC), written in a year from {UPDATED_AT_FIRST_YEAR} "
        f"to {UPDATED_AT_LAST_YEAR}"
    )


def _written_year(value: datetime) -> datetime:
    # Checked here, not by the projector: a write acknowledged with a time no lexical
    # engine can index would stop the projector for every write after it.
    if not UPDATED_AT_FIRST_YEAR <= value.year <= UPDATED_AT_LAST_YEAR:
        raise _range_error()
    return value


def _utc_range(value: datetime) -> datetime:
    if not UPDATED_AT_EARLIEST <= value < UPDATED_AT_LATEST:
        raise _range_error()
    return value


Name = Annotated[
    str,
    AfterValidator(check_name),
    # The rule above, as JSON Schema says it (OpenAPI clients and fuzzers see it).
    WithJsonSchema({"type": "string", "pattern": _NAME.pattern}),
]
AwareDatetime = Annotated[
    datetime,
    Strict(False),
    BeforeValidator(_timestamp_text),
    AfterValidator(_aware_utc),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": _TIMESTAMP_PATTERN}),
]
# A record's `updated_at`: an `AwareDatetime` written in a year every engine indexes.
IndexableDatetime = Annotated[
    datetime,
    Strict(False),
    BeforeValidator(_timestamp_text),
    AfterValidator(_written_year),
    AfterValidator(_aware_utc),
    AfterValidator(_utc_range),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "pattern": "^" + _INDEXABLE_YEAR + _TIMESTAMP_PATTERN.removeprefix("^[0-9]{4}"),
        }
    ),
]


DEFAULT_GALAXY = "default"
# The embedder's dimension, as the served OpenAPI document says it
# (`contracts.openapi.DEPLOYMENT`).
VECTOR_FACT: dict[str, Any] = {"x-orrery-deployment": "vector_dimension"}


def derive_document_id(
    namespace: str, snapshot_kind: str, item_id: str, galaxy: str = DEFAULT_GALAXY
) -> str:
    """The identity rule: a document is `(namespace, galaxy, snapshot_kind, item_id)`, and
    its id is a UUIDv5 of exactly that, so ids never collide across a boundary an API key
    can be bound to. The same `item_id` in two namespaces or two galaxies names two
    documents; no write can move a document to another namespace, galaxy or snapshot
    kind (a write there is a different document). Every store and engine keys documents
    by this id. The default galaxy keeps the three-part form (ids derived before galaxies
    were part of the identity stay valid)."""
    parts = [namespace, snapshot_kind, item_id]
    if galaxy != DEFAULT_GALAXY:
        parts.append(galaxy)
    return _uuid5_text("\x1f".join(parts))


_NAMESPACE_BYTES = DOCUMENT_ID_NAMESPACE.bytes


def _uuid5_text(name: str) -> str:
    """`str(uuid.uuid5(DOCUMENT_ID_NAMESPACE, name))`, without building `UUID` objects
    (a third of the cost; ingest derives one id per record)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def identity_violation(record: Record) -> str | None:
    """Why a record written through the API breaks the identity rule, or None.

    A producer may send `document_id`, but only the one derived from the record's own
    namespace, galaxy, snapshot kind and item id: any other value could name (and so
    overwrite, or probe for) a document in a namespace or galaxy the writer cannot see.
    """
    expected = derive_document_id(
        record.namespace, record.snapshot_kind, record.item_id, record.galaxy
    )
    if record.document_id == expected:
        return None
    return (
        f"document_id {record.document_id!r} is not the id of this record: ids are derived "
        f"from namespace, galaxy, snapshot_kind and item_id ({expected!r}); omit it"
    )


def payload_sha256(payload: dict[str, Any]) -> str:
    """Digest of a payload as stored: sha256 over its canonical JSON."""
    return sha256_json(payload)


class RecordText(BaseModel):
    """Lexical fields. `title` is boosted over `body` and `tags` at query time."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    title: str = Field(default="", max_length=4_096)
    body: str = Field(default="", max_length=200_000)
    tags: list[str] = Field(default_factory=list, max_length=256)


class RecordMetadata(BaseModel):
    """Filterable metadata. Extra keys are free facets (string, number or bool values)."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        strict=True,
        # `_facets_are_scalars` as JSON Schema says it.
        json_schema_extra={
            "propertyNames": {"pattern": _NAME.pattern},
            "additionalProperties": {
                "anyOf": [
                    {"type": ["string", "number", "boolean"]},
                    {"type": "array", "items": {"type": ["string", "number", "boolean"]}},
                ]
            },
        },
    )

    status: str = Field(default="active", max_length=64)
    updated_at: IndexableDatetime = Field(
        default_factory=lambda: datetime.now(UTC),
        description="Written in a year from 1678 to 2261 (engines index nanoseconds in 64 bits).",
    )
    visibility: list[str] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _facets_are_scalars(self) -> RecordMetadata:
        for key, value in (self.model_extra or {}).items():
            if not _NAME.fullmatch(key):
                raise ValueError(f"facet name {key!r} is not a valid name")
            values = value if isinstance(value, list) else [value]
            if not all(isinstance(v, str | int | float | bool) for v in values):
                raise ValueError(f"facet {key!r} must be a scalar or a list of scalars")
        return self

    def facets(self) -> dict[str, list[str]]:
        """Free facets as lists of strings (how every index stores them)."""
        extra = self.model_extra
        if not extra:
            return {}  # most records: the projector asks for each one
        out: dict[str, list[str]] = {}
        for key, value in sorted(extra.items()):
            values = value if isinstance(value, list) else [value]
            out[key] = [_facet_string(v) for v in values]
        return out


def _facet_string(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Record(BaseModel):
    """One revision of one document, as a producer writes it.

    Guarantees: `document_id` is set (derived when absent, see `derive_document_id`) and
    stable for `(namespace, galaxy, snapshot_kind, item_id)`; `revision` is a positive
    integer; `payload` is returned to query clients exactly as given. Types are strict
    (a JSON `true` or `"2"` is no revision); timestamps are ISO 8601 strings.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    namespace: Namespace
    snapshot_kind: Name
    item_id: Annotated[str, AfterValidator(_check_item_id)] = Field(
        min_length=1, max_length=512, json_schema_extra={"pattern": _ITEM_ID_PATTERN}
    )
    revision: JsonInt = Field(ge=1, le=2**62)
    document_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        # Derived by the server; a writer may send only the derived value (any other is
        # `422`, `identity_violation`), which no schema can say: omit it.
        json_schema_extra={"readOnly": True},
        description="Derived from namespace, galaxy, snapshot_kind and item_id; omit it "
        "(a value other than the derived one is refused)",
    )
    galaxy: Name = DEFAULT_GALAXY
    ring: Annotated[str, AfterValidator(_check_ring)] = Field(
        default="", max_length=512, json_schema_extra={"pattern": "^([^/]+(/[^/]+)*)?$"}
    )
    payload_schema: str = Field(default="", max_length=256)
    payload: dict[str, Any] = Field(default_factory=dict)
    text: RecordText = Field(default_factory=RecordText)
    metadata: RecordMetadata = Field(default_factory=RecordMetadata)
    vector: list[float] | None = Field(
        default=None,
        min_length=1,
        max_length=4_096,
        description="The embedder's dimension (the served document says it); none: the "
        "embedder computes it from the text",
        json_schema_extra=VECTOR_FACT,
    )
    index_lanes: list[Literal["lexical", "vector"]] | None = Field(
        default=None,
        max_length=2,
        description="The search lanes that index this record; None = all of them. A lane "
        "left out never returns the record as a hit (`[]`: stored and readable by id, "
        "never a search hit); the record is still in every index, hidden.",
    )
    deleted: bool = False

    @model_validator(mode="after")
    def _derive_id(self) -> Record:
        if self.document_id is None:
            derived = derive_document_id(
                self.namespace, self.snapshot_kind, self.item_id, self.galaxy
            )
            if "document_id" in self.model_fields_set:  # sent as null
                self.document_id = derived
            else:
                # Not marked as set: `model_fields_set` names exactly the fields the
                # producer sent (the write path counts them against the body's keys).
                self.__dict__["document_id"] = derived
        return self

    @property
    def doc_id(self) -> str:
        """`document_id`, typed as always present (it is, after validation)."""
        assert self.document_id is not None
        return self.document_id


# The canonical store's column holding each record's JSON without its vector
# (`record_json_without_vector`), beside the whole JSON: what queries read.
RECORD_BODY = "record_body"

# What follows a stored record's vector in `Record.model_dump_json` (`vector` is its last
# field but `index_lanes` and `deleted`, which hold no user text), up to the record's
# closing brace, the end of the text.
_AFTER_VECTOR = re.compile(
    r'((?:,"index_lanes":(?:null|\[[a-z",]*\]))?(?:,"deleted":(?:true|false))?)\}'
)


def _vector_cut(record_json: str) -> tuple[int, int, str] | None:
    """Where `Record.model_dump_json`'s layout puts the record's own top-level vector:
    `(start of ',"vector":', end of its value, the text after it up to the closing brace)`,
    or None for another layout (see `record_json_without_vector`)."""
    at = record_json.rfind(',"vector":')
    if at > 0:
        value = at + 10
        end = 0
        if record_json.startswith("null", value):
            end = value + 4
        elif record_json.startswith("[", value):
            end = record_json.find("]", value) + 1
        tail = _AFTER_VECTOR.fullmatch(record_json, end) if end > 0 else None
        if tail is not None:
            return at, end, tail.group(1)
    return None


def record_json_without_vector(record_json: str) -> str:
    """A record's JSON without its top-level `vector` (the same value as SQLite's
    `json_remove(record_json, '$.vector')`): what a query answers from a stored record,
    which never includes the vector (three quarters of a 384-d record's JSON).

    `Record.model_dump_json`'s layout is cut as text (~2 us for a SciFact record, where
    parsing it cost ~47): the last `,"vector":` (structure: inside a string a quote is
    escaped), its value null or a list up to the first `]`, then exactly `_AFTER_VECTOR` to
    the end of the text. In valid JSON that tail can only follow the record's own vector
    when the list closed there: a `]` inside a string or a nested list, or a `vector` key
    nested in the payload, leaves more of the record to come. Any other layout is parsed
    and rendered again."""
    cut = _vector_cut(record_json)
    if cut is not None:
        at, _, tail = cut
        return f"{record_json[:at]}{tail}}}"
    parsed = json.loads(record_json)
    if isinstance(parsed, dict):
        parsed.pop("vector", None)
    return json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))


# `_AFTER_VECTOR` for UTF-8 bytes (`vector_json`).
_AFTER_VECTOR_BYTES = re.compile(_AFTER_VECTOR.pattern.encode("ascii"))


def vector_span(text: bytes, start: int, stop: int) -> tuple[int, int, int] | None:
    """Where `vector_json` cuts: `(start of ',"vector":', start of its list, end of the
    list)` in `text`, or None where `vector_json` is None."""
    at = text.rfind(b',"vector":', start, stop)
    if at <= start:
        return None
    value = at + 10
    if not text.startswith(b"[", value, stop):
        return None
    close = text.find(b"]", value, stop)
    if close < 0 or _AFTER_VECTOR_BYTES.fullmatch(text, close + 1, stop) is None:
        return None
    return at, value, close + 1


def vector_json(text: bytes, start: int, stop: int) -> bytes | None:
    """`vector_text(text[start:stop].decode())` as UTF-8 bytes, read in place: the
    record's JSON is `text[start:stop]` (e.g. inside an event's), and nothing of it is
    decoded or copied but the vector's text. The same cut: structure is ASCII, and no
    byte of a multi-byte UTF-8 character is."""
    span = vector_span(text, start, stop)
    return None if span is None else text[span[1] : span[2]]


def vector_text(record_json: str) -> str | None:
    """The text of the record's own top-level vector when the record is in
    `Record.model_dump_json`'s layout with a list as its vector (the cut of
    `record_json_without_vector`), else None."""
    cut = _vector_cut(record_json)
    if cut is None:
        return None
    at, end, _ = cut
    if record_json[end - 1] != "]":
        return None
    return record_json[at + 10 : end]
