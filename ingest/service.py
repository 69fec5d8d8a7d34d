"""Use cases of ingest: validate and write record batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from contracts.admission import check_record_size, problem_dicts, record_problems
from contracts.errors import ErrorBody, ErrorCode, OrreryError
from contracts.faults import crash_point
from contracts.ingest_api import WriteItem, WriteResponse
from contracts.records import Record, identity_violation
from ingest.model import Decision
from ingest.ports import RecordStore

__all__ = ["check_batch_size", "parse_batch", "write_records"]


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
    records: list[Record] = []
    problems: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        try:
            record = Record.model_validate(item)
        except ValidationError as exc:
            problems.append({"index": index, "errors": _errors(exc)})
            continue
        if allowed_namespace is not None and record.namespace != allowed_namespace:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key may not write namespace {record.namespace!r}",
                {"index": index, "namespace": record.namespace},
            )
        if allowed_galaxy is not None and record.galaxy != allowed_galaxy:
            raise OrreryError(
                ErrorCode.FORBIDDEN,
                f"this API key may only write galaxy {allowed_galaxy!r}",
                {"index": index, "galaxy": record.galaxy},
            )
        # An id the producer did not send was derived by the rule itself.
        sent_id = isinstance(item, dict) and item.get("document_id") is not None
        violation = identity_violation(record) if sent_id else None
        if violation is not None:
            problems.append(
                {
                    "index": index,
                    "errors": [{"loc": ["document_id"], "msg": violation, "type": "identity"}],
                }
            )
            continue
        refused = record_problems(record, dimension=vector_dimension)
        if refused:
            problems.append({"index": index, "errors": problem_dicts(refused)})
            continue
        check_record_size(record, max_record_bytes=max_record_bytes, index=index)
        records.append(record)
    if problems:
        unknown = any(e.get("type") == "extra_forbidden" for p in problems for e in p["errors"])
        raise OrreryError(
            ErrorCode.UNKNOWN_FIELD if unknown else ErrorCode.INVALID_REQUEST,
            f"{len(problems)} of {len(items)} records are invalid; nothing was written",
            {"records": problems[:50]},
        )
    return records


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
) -> WriteResponse:
    """Write a validated batch in one transaction; stale revisions are rejected alone."""
    outcomes = store.write(records)
    crash_point("ingest.committed")
    if on_commit is not None and any(o.decision is Decision.ACCEPTED for o in outcomes):
        on_commit()
    items: list[WriteItem] = []
    # Built without validation (one per record): the values are the store's outcomes.
    for outcome in outcomes:
        assert outcome.document_id is not None and outcome.revision is not None
        accepted = outcome.decision is Decision.ACCEPTED
        items.append(
            WriteItem.model_construct(
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
