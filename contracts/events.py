"""Events on the log between the canonical store and the projectors."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from contracts.names import namespace_token
from contracts.records import Record, vector_json, vector_span, vector_text
from contracts.stored_vectors import packed_vector, stored_vector

__all__ = [
    "KAFKA_MAX_RECORD_BYTES",
    "OUTBOX_EVENT_IS_RECORD",
    "POSITION_HEADER",
    "TRACE_HEADER",
    "VECTOR_HEADER",
    "LogEntry",
    "RecordChanged",
    "decode_record_changed",
    "outbox_event_json",
    "record_changed_json",
    "topic_for",
    "topic_pattern",
]


class RecordChanged(BaseModel):
    """One accepted revision of one record (an upsert, or a tombstone when `deleted`).

    Guarantees: emitted exactly once per accepted revision into the outbox, in the same
    transaction as the record; delivered at least once, possibly out of order across
    documents. Consumers apply it idempotently on `(document_id, revision)`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_type: str = Field(default="record_changed", pattern="^record_changed$")
    record: Record

    @property
    def document_id(self) -> str:
        return self.record.doc_id

    @property
    def revision(self) -> int:
        return self.record.revision


def record_changed_json(record_json: str) -> str:
    """`RecordChanged(record=r).model_dump_json()` from `r.model_dump_json()`, without
    serializing the record (and its vector) a second time: the same bytes."""
    return '{"event_type":"record_changed","record":' + record_json + "}"


_EVENT_HEAD = '{"event_type":"record_changed","record":'
_EVENT_HEAD_BYTES = _EVENT_HEAD.encode("ascii")


def decode_record_changed(raw: str | bytes, float32: bytes | None = None) -> RecordChanged:
    """`RecordChanged.model_validate_json(raw)` (the same event, or the same error), with
    an upsert's vector as a `StoredVector` when `raw` is in `record_changed_json`'s
    layout around `Record.model_dump_json`'s: the same float64 values, plus their
    float32 array and the vector's JSON text, cut from `raw` (`vector_text`; in place
    from bytes, `vector_json`: a Kafka value is neither decoded nor copied). The
    projector then sends Qdrant that text and the ring statistics that array, and
    neither formats nor converts a float of it again (issue 24: ~30 us a 384-d record).

    `float32`: the vector's float32 bytes as the canonical store kept them
    (`VECTOR_HEADER`, `contracts.stored_vectors.float32_wire`). With them an upsert in
    that layout is validated without its vector's text, which becomes a `PackedVector`
    of those bytes: no float of it is parsed (~20-27 us a 384-d record). Whatever that
    path does not take whole (another layout, bytes that do not match the text, a
    tombstone, an error) is decoded as without them, so every refusal is the same."""
    if float32 is not None and isinstance(raw, bytes):
        event = _decode_packed(raw, float32)
        if event is not None:
            return event
    event = RecordChanged.model_validate_json(raw)
    record = event.record
    values = record.vector
    if values is None or record.deleted:
        return event
    cut: bytes | None
    if isinstance(raw, bytes):
        if not raw.startswith(_EVENT_HEAD_BYTES) or raw[-1:] != b"}":
            return event
        cut = vector_json(raw, len(_EVENT_HEAD_BYTES), len(raw) - 1)
    else:
        if not raw.startswith(_EVENT_HEAD) or raw[-1:] != "}":
            return event
        text = vector_text(raw[len(_EVENT_HEAD) : -1])
        cut = None if text is None else text.encode("ascii", "replace")
    if cut is None:
        return event
    vector = stored_vector(values, cut)
    if vector is not None:
        record.vector = vector
    return event


def _decode_packed(raw: bytes, float32: bytes) -> RecordChanged | None:
    """`decode_record_changed`'s event of `raw` with its vector read from `float32`, or
    None (decode as without them)."""
    if not raw.startswith(_EVENT_HEAD_BYTES) or raw[-1:] != b"}":
        return None
    span = vector_span(raw, len(_EVENT_HEAD_BYTES), len(raw) - 1)
    if span is None:
        return None
    at, value, end = span
    vector = packed_vector(float32, raw[value:end])
    if vector is None:
        return None
    try:
        # The event without `,"vector":[...]`: `vector` is its record's last field but
        # `index_lanes` and `deleted` (the cut checked what follows it).
        event = RecordChanged.model_validate_json(raw[:at] + raw[end:])
    except ValueError:
        return None  # decoded whole again: the same error as without the bytes
    record = event.record
    if record.deleted or record.vector is not None:
        return None  # a tombstone keeps its values; a second `vector` key is parsed whole
    record.vector = vector  # type: ignore[assignment]
    return event


# The `event_json` of an outbox row (SQLite or PostgreSQL) whose event is the
# `RecordChanged` of its record row (`records` with the same `document_id` and `revision`,
# written in the same transaction, never changed): the canonical store keeps a record's
# JSON once.
OUTBOX_EVENT_IS_RECORD = ""


def outbox_event_json(event_json: str | bytes, record_json: str | None) -> str | bytes:
    """The event of an outbox row, from its `event_json` and its record row's
    `record_json` (None when there is none: the event is then empty, undecodable)."""
    if event_json != OUTBOX_EVENT_IS_RECORD:
        return event_json
    return "" if record_json is None else record_changed_json(record_json)


class LogEntry(BaseModel):
    """An event and its position on the log. Positions strictly increase on one log."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    position: int = Field(ge=1)
    event: RecordChanged
    # The W3C `traceparent` of the request that wrote the event (None: not traced).
    trace_context: str | None = None
    # Where a partitioned log (Kafka) holds the event: its partition of the namespace's
    # topic and its offset there (None: a log of one order, the embedded outbox). Offsets
    # strictly increase within a partition, whichever relay published the event.
    partition: int | None = Field(default=None, ge=0)
    offset: int | None = Field(default=None, ge=0)


# The Kafka wire format of the event log (server mode): one topic per namespace, the
# document id as key (so a document's events keep their order), the `RecordChanged`
# JSON as value, and the outbox position in this header as ASCII digits.
POSITION_HEADER = "orrery-position"
# The largest record (as stored) whose event fits one Kafka message: the producer's and
# broker's default limit is 1 MiB, and the event wraps the record's JSON. Server mode
# refuses larger records at the door (`413 record_too_large`): one that could never be
# published would stop the relay for every tenant behind it.
KAFKA_MAX_RECORD_BYTES = 960 * 1024

# The W3C trace context of the write, when it was traced (`LogEntry.trace_context`).
TRACE_HEADER = "traceparent"

# The float32 bytes, little-endian (`contracts.stored_vectors.float32_wire`), of the
# event's record's vector, as the canonical store kept them beside its JSON (at most
# 16 KiB: with `KAFKA_MAX_RECORD_BYTES` within the 1 MiB message): the projector reads
# them instead of the vector's decimals (`decode_record_changed`). Absent from events
# written before, and from records without a vector.
VECTOR_HEADER = "orrery-vector-f32"


def topic_for(topic_prefix: str, namespace: str) -> str:
    """The topic that carries a namespace's events: `{prefix}.{namespace_token(ns)}`,
    within Kafka's topic alphabet and length (249) for any namespace."""
    return f"{topic_prefix}.{namespace_token(namespace)}"


def topic_pattern(topic_prefix: str) -> str:
    """A regular expression matching every namespace topic under `topic_prefix`."""
    return "^" + re.escape(topic_prefix) + r"\..+"
