"""Use cases of ingest: validate and write record batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from contracts.admission import (
    check_record_size,
    problem_dicts,
    record_problems,
    sized_record_json,
)
from contracts.errors import ErrorBody, ErrorCode, OrreryError
from contracts.faults import crash_point
from contracts.ingest_api import WriteItem, WriteResponse
from contracts.records import Record, identity_violation
from contracts.wire import json_key_count, loads_strict, typed_parse_pairs
from ingest.model import Decision
from ingest.ports import RecordStore

__all__ = ["Admitted", "check_batch_size", "parse_batch", "parse_body", "write_records"]


def check_batch_size(size: int, max_batch: int) -> None:
    """`413 batch_too_large` for a batch of more than `max_batch` records."""
    if size > max_batch:
        raise OrreryError(
            ErrorCode.BATCH_TOO_LARGE,
            f"a batch holds at most {max_batch} records, got {size}",
            {"max_batch": max_batch, "size": size},
        )


def parse_batch(
    raw: Any,
    *,
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
    allowed_namespace: str | None,
    allowed_galaxy: str | None = None,
) -> list[Record]:
    """Validate a request body (a list of records, or `{"records": [...]}`).

    Nothing is written when anything is invalid: the error names every bad record and,
    per record, each field wrong (`loc`, `msg`, `type`), including everything an engine
    would refuse (`contracts.admission.record_problems`: a zero or non-finite-in-float32
    vector, one of another dimension than `vector_dimension`, a keyword too long). A
    record outside the key's namespace (or galaxy) is `403` before anything else is
    looked at; a valid record whose stored JSON is over `max_record_bytes` (the
    deployment's `ORRERY_MAX_RECORD_BYTES`) is `413 record_too_large` at once
    (`contracts.admission.check_record_size`).
    """
    items = raw.get("records") if isinstance(raw, dict) and set(raw) == {"records"} else raw
    if not isinstance(items, list):
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            'the body must be a JSON array of records or {"records": [...]}',
        )
    if not items:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "the batch is empty")
    check_batch_size(len(items), max_batch)
    door = _Door(vector_dimension, max_record_bytes, allowed_namespace, allowed_galaxy)
    for index, item in enumerate(items):
        try:
            record = Record.model_validate(item)
        except ValidationError as exc:
            door.problems.append({"index": index, "errors": _errors(exc)})
            continue
        # An id the producer did not send was derived by the rule itself.
        door.admit(index, record, isinstance(item, dict) and item.get("document_id") is not None)
    return door.admitted(len(items)).records


@dataclass(frozen=True, slots=True)
class Admitted:
    """A batch that passed the door: its records and, per record, the JSON every store
    keeps of it (`record.model_dump_json()`, made for the size check; None: the store
    serializes the record itself)."""

    records: list[Record]
    stored_json: list[str | None]


def parse_body(
    raw: bytes,
    *,
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
    allowed_namespace: str | None,
    allowed_galaxy: str | None = None,
) -> Admitted:
    """`parse_batch(loads_strict(raw), ...)`: the same records, or the same error; with
    each record's stored JSON (`Admitted`), serialized once for the size check and the
    store.

    A body `contracts.wire.typed_parse_pairs` lets a typed parse read is validated from
    its bytes in one pass (`validate_json`: no dict per record built and walked again,
    about half the CPU); its records are then admitted as `parse_batch` admits them. Any
    body that pass does not take whole (a duplicate key, an invalid record, a body of
    another shape) is read by `loads_strict` and `parse_batch`, which word its error."""
    pairs = typed_parse_pairs(raw)
    records = None if pairs is None else _typed_records(raw, pairs)
    if records is None:
        strict = parse_batch(
            loads_strict(raw),
            max_batch=max_batch,
            vector_dimension=vector_dimension,
            max_record_bytes=max_record_bytes,
            allowed_namespace=allowed_namespace,
            allowed_galaxy=allowed_galaxy,
        )
        return Admitted(strict, [None] * len(strict))
    if not records:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "the batch is empty")
    check_batch_size(len(records), max_batch)
    door = _Door(
        vector_dimension, max_record_bytes, allowed_namespace, allowed_galaxy, keep_json=True
    )
    for index, record in enumerate(records):
        # Sent as null, the id was derived (and is its own identity).
        door.admit(index, record, "document_id" in record.model_fields_set)
    return door.admitted(len(records))


class _Wrapped(BaseModel):
    """`{"records": [...]}`, the other shape of a batch."""

    model_config = ConfigDict(extra="forbid", strict=True)

    records: list[Record]


_RECORD_LIST: TypeAdapter[list[Record]] = TypeAdapter(list[Record])


def _typed_records(raw: bytes, pairs: int) -> list[Record] | None:
    """The records of `raw` validated from its bytes, or None when they are not all valid
    or hold fewer keys than the text (a duplicate key, dropped by the parser)."""
    try:
        if raw.lstrip()[:1] == b"{":
            records = _Wrapped.model_validate_json(raw).records
            pairs -= 1
        else:
            records = _RECORD_LIST.validate_json(raw)
    except ValidationError:
        return None
    held = 0
    for record in records:
        fields = record.model_fields_set
        held += len(fields)
        if "text" in fields:
            held += len(record.text.model_fields_set)
        if "metadata" in fields:
            held += len(record.metadata.model_fields_set)  # facets included
        if "payload" in fields:
            held += json_key_count(record.payload)
    return records if held == pairs else None


class _Door:
    """The checks after validation, record by record, in `parse_batch`'s order: `403`
    and `413` at once; identity and engine problems collected as 422 entries."""

    def __init__(
        self,
        vector_dimension: int | None,
        max_record_bytes: int,
        allowed_namespace: str | None,
        allowed_galaxy: str | None,
        *,
        keep_json: bool = False,
    ) -> None:
        self._keep_json = keep_json
        self._stored_json: list[str | None] = []
        self._dimension = vector_dimension
        self._max_record_bytes = max_record_bytes
        self._namespace = allowed_namespace
        self._galaxy = allowed_galaxy
        self._admitted: list[Record] = []
        self.problems: list[dict[str, Any]] = []

    def admit(self, index: int, record: Record, sent_id: bool) -> None:
        if self._namespace is not None and record.namespace != self._namespace:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key may not write namespace {record.namespace!r}",
                {"index": index, "namespace": record.namespace},
            )
        if self._galaxy is not None and record.galaxy != self._galaxy:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key may only write galaxy {self._galaxy!r}",
                {"index": index, "galaxy": record.galaxy},
            )
        violation = identity_violation(record) if sent_id else None
        if violation is not None:
            self.problems.append(
                {
                    "index": index,
                    "errors": [{"loc": ["document_id"], "msg": violation, "type": "identity"}],
                }
            )
            return
        refused = record_problems(record, dimension=self._dimension)
        if refused:
            self.problems.append({"index": index, "errors": problem_dicts(refused)})
            return
        if self._keep_json:
            self._stored_json.append(
                sized_record_json(record, max_record_bytes=self._max_record_bytes, index=index)
            )
        else:
            check_record_size(record, max_record_bytes=self._max_record_bytes, index=index)
        self._admitted.append(record)

    def admitted(self, total: int) -> Admitted:
        """The admitted records, or the 422 naming every problem."""
        problems = self.problems
        if problems:
            unknown = any(e.get("type") == "extra_forbidden" for p in problems for e in p["errors"])
            raise OrreryError(
                ErrorCode.UNKNOWN_FIELD if unknown else ErrorCode.INVALID_REQUEST,
                f"{len(problems)} of {total} records are invalid; nothing was written",
                {"records": problems[:50]},
            )
        return Admitted(self._admitted, self._stored_json or [None] * len(self._admitted))


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def write_records(
    records: Sequence[Record],
    *,
    store: RecordStore,
    on_commit: Callable[[], None] | None = None,
    stored_json: Sequence[str | None] | None = None,
) -> WriteResponse:
    """Write a validated batch in one transaction; stale revisions are rejected alone.
    `stored_json`: the records' JSON when the door serialized them (`Admitted`)."""
    outcomes = (
        store.write(records)
        if stored_json is None
        else store.write(records, stored_json=stored_json)
    )
    crash_point("ingest.committed")
    if on_commit is not None and any(o.decision is Decision.ACCEPTED for o in outcomes):
        on_commit()
    items: list[WriteItem] = []
    # Validated: pydantic's constructor checks these few typed values faster than
    # `model_construct` (Python) skips the checks (4 against 8 us an item).
    for outcome in outcomes:
        assert outcome.document_id is not None and outcome.revision is not None
        accepted = outcome.decision is Decision.ACCEPTED
        items.append(
            WriteItem(
                index=outcome.index,
                document_id=outcome.document_id,
                revision=outcome.revision,
                status=201 if accepted else 409,
                position=outcome.position,
                error=None
                if accepted
                else ErrorBody(
                    code=ErrorCode.REVISION_CONFLICT,
                    message=outcome.message,
                    details={"current_revision": outcome.current_revision},
                ),
            )
        )
    accepted_count = sum(1 for item in items if item.status == 201)
    return WriteResponse(
        success=accepted_count == len(items),
        accepted=accepted_count,
        rejected=len(items) - accepted_count,
        # This write's own newest position, not the log's: the log's high water would
        # show every key the write count of every tenant (issue 22).
        high_water=max((o.position for o in outcomes if o.position is not None), default=0),
        items=items,
    )


def all_stale_body(result: WriteResponse) -> dict[str, Any]:
    """The `409 revision_conflict` answer of a write that accepted no record: every
    revision was stale (the response's items in `details`)."""
    return {
        "success": False,
        "error": {
            "code": ErrorCode.REVISION_CONFLICT.value,
            "message": "no record was accepted: every revision is stale",
            "details": result.model_dump(mode="json", exclude={"searchable"}),
        },
    }
