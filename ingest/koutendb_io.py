"""KoutenDB JSONL import and `koutendb.dump.v1` dump over the canonical store.

Import: every line becomes at most one record, written through `write_records` in
batches of `batch_size` (one store transaction each), exactly like `POST /v1/records`
writes; a line that cannot become a record is counted with its line number and the
import goes on. Only one batch of parsed lines is held at a time.

Dump: the live records of one namespace, snapshot kind and galaxy, read in one
snapshot of the store, as `meta`, `ring` (implied parents too) and `document` lines.
The document lines are spooled (to a temporary file past a few MB) while the rings are
collected, because the `meta` line that comes first counts both.

Line mapping (docs/koutendb.md, "Import, dump, backup"):
- blank → skipped; not a JSON object → error;
- a dump's `meta` / `ring` line → skipped;
- a dump's `document` line keeps `ring`, `payload` (`codec` `json` → the object, else
  the raw string), `vec`; its id is `id` (or the `idField` value);
- any other row: ring = `ringPrefix` + (value at `ringField`, else `defaultRing`),
  payload = value at `payloadField` (dot path; the whole row when unset; a string is
  raw; missing → skipped), vector at `vecField` (else the embedder computes one), id at
  `idField`, else the sha256 of the line;
- `item_id` = `{galaxy}:{id}`; the revision is one above the stored head (re-importing
  a line updates its record).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from pydantic import ValidationError

from contracts.admission import check_record_size, record_problems, vector_problem
from contracts.errors import ErrorCode, OrreryError
from contracts.koutendb_io import (
    DUMP_FORMAT,
    JSON_PAYLOAD_SCHEMA,
    MAX_REPORTED_ERRORS,
    RAW_PAYLOAD_SCHEMA,
    DumpDocumentLine,
    DumpMetaLine,
    DumpRingLine,
    ImportLineError,
    ImportResponse,
    payload_codec,
    ring_closure,
)
from contracts.records import Record, RecordText, derive_document_id
from contracts.wire import loads_strict
from ingest.model import strings_in
from ingest.ports import RecordStore
from ingest.service import write_records

__all__ = [
    "MAX_IMPORT_BATCH_BYTES",
    "MAX_LINE_BYTES",
    "ImportOptions",
    "JsonlImporter",
    "LineSplitter",
    "dump_lines",
    "map_line",
]

# A line longer than this is an error (its bytes are dropped as they arrive).
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_IMPORT_BATCH_BYTES = 8 * 1024 * 1024
_BODY_CHARS = RecordText.model_fields["body"].metadata[0].max_length
_MAX_VECTOR = next(
    m.max_length for m in Record.model_fields["vector"].metadata if hasattr(m, "max_length")
)
# Document lines spooled in memory before the spool moves to a temporary file.
_SPOOL_BYTES = 8 * 1024 * 1024
_NUMBER_TYPES = frozenset({int, float})
_FLOAT = frozenset({float})
_DUMP_RING_KEYS = frozenset({"type", "key", "name", "period", "head"})


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """Where and how an import writes (the request's parameters, resolved)."""

    namespace: str
    snapshot_kind: str
    galaxy: str
    default_ring: str = "imported"
    ring_field: str | None = None
    ring_prefix: str = ""
    payload_field: str | None = None
    vec_field: str | None = None
    id_field: str | None = None
    batch_size: int = 1_000
    vector_dimension: int | None = None
    # A batch is also full at this many bytes of lines: an import's memory is bounded in
    # bytes, whatever `batchSize` says (60 lines of 15 MB once held +2,977 MiB).
    max_batch_bytes: int = MAX_IMPORT_BATCH_BYTES
    # The deployment's `ORRERY_MAX_RECORD_BYTES` (`QuerySettings.max_record_bytes`).
    max_record_bytes: int = field(kw_only=True)


class LineError(Exception):
    """Why one line cannot become a record (its code and message are reported)."""

    def __init__(
        self, code: ErrorCode, message: str, field: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.reason = reason


SKIP = None


def _at(row: dict[str, Any], path: str) -> Any:
    """The value at a dot path (`body.title`), or None when any step is missing."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _payload(value: Any, *, codec: str | None = None) -> tuple[str, dict[str, Any]]:
    """(payload_schema, payload) of an imported payload value."""
    if isinstance(value, dict):
        return JSON_PAYLOAD_SCHEMA, value
    if isinstance(value, str) and codec == "json":
        try:
            parsed = loads_strict(value.encode("utf-8"))
        except OrreryError as exc:
            raise LineError(ErrorCode.INVALID_JSON, f"codec json, payload: {exc.message}") from exc
        if isinstance(parsed, dict):
            return JSON_PAYLOAD_SCHEMA, parsed
    if isinstance(value, str):
        return RAW_PAYLOAD_SCHEMA, {"raw": value}
    # Numbers, booleans and arrays: KoutenDB keeps their JSON text.
    return RAW_PAYLOAD_SCHEMA, {"raw": json.dumps(value, ensure_ascii=False, separators=(",", ":"))}


def _vector(value: Any, dimension: int | None) -> list[float]:
    if not isinstance(value, list) or not value:
        raise LineError(ErrorCode.INVALID_REQUEST, "the vector is not a non-empty list of numbers")
    # `map(type, …)` runs in C: a 384-d vector per line is the import's hottest loop.
    types = set(map(type, value))
    if not types <= _NUMBER_TYPES:
        raise LineError(ErrorCode.INVALID_REQUEST, "the vector holds something not a number")
    if dimension is not None and len(value) != dimension:
        raise LineError(
            ErrorCode.EMBEDDER_MISMATCH,
            f"the vector has {len(value)} dimensions, the embedder produces {dimension}",
            "vector",
            ErrorCode.EMBEDDER_MISMATCH.value,
        )
    vector = value if types == _FLOAT else [float(x) for x in value]
    problem = vector_problem(vector, None)
    if problem is not None:
        raise LineError(ErrorCode.INVALID_REQUEST, f"vector: {problem.msg}", "vector", problem.type)
    return vector


def _id(value: Any, line: bytes) -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is None:
        return hashlib.sha256(line).hexdigest()
    raise LineError(ErrorCode.INVALID_REQUEST, "the id is not a string or an integer")


def map_line(line: bytes, options: ImportOptions) -> dict[str, Any] | None:
    """The record (as JSON, without a revision) one line imports, or None (skipped).

    Raises `LineError` for a line that cannot become a record."""
    text = line.strip()
    if not text:
        return SKIP
    try:
        row = loads_strict(text)
    except OrreryError as exc:
        raise LineError(ErrorCode.INVALID_JSON, exc.message) from exc
    if not isinstance(row, dict):
        raise LineError(ErrorCode.INVALID_REQUEST, "the line is not a JSON object")
    kind = row.get("type")
    if kind == "meta" and row.get("format") == DUMP_FORMAT:
        return SKIP
    if kind == "ring" and isinstance(row.get("name"), str) and set(row) <= _DUMP_RING_KEYS:
        return SKIP
    vector: list[float] | None = None
    if kind == "document" and "payload" in row and "ring" in row:
        ring = row["ring"]
        if not isinstance(ring, str):
            raise LineError(ErrorCode.INVALID_REQUEST, "the document's ring is not a string")
        codec = row.get("codec")
        schema, payload = _payload(row["payload"], codec=codec if isinstance(codec, str) else None)
        if row.get("vec") is not None:
            vector = _vector(row["vec"], options.vector_dimension)
        ident = _id(row.get("id") if options.id_field is None else _at(row, options.id_field), text)
    else:
        chosen = None if options.ring_field is None else _at(row, options.ring_field)
        if chosen is not None and not isinstance(chosen, str | int):
            raise LineError(ErrorCode.INVALID_REQUEST, f"{options.ring_field} is not a string")
        ring = options.ring_prefix + (
            str(chosen) if chosen not in (None, "") else options.default_ring
        )
        value = row if options.payload_field is None else _at(row, options.payload_field)
        if value is None:
            return SKIP
        schema, payload = _payload(value)
        if options.vec_field is not None:
            found = _at(row, options.vec_field)
            if found is not None:
                vector = _vector(found, options.vector_dimension)
        ident = _id(None if options.id_field is None else _at(row, options.id_field), text)
    body = "\n".join(strings_in(payload["raw"] if schema == RAW_PAYLOAD_SCHEMA else payload))
    return {
        "namespace": options.namespace,
        "galaxy": options.galaxy,
        "snapshot_kind": options.snapshot_kind,
        "item_id": f"{options.galaxy}:{ident}",
        "ring": ring,
        "payload_schema": schema,
        "payload": payload,
        "text": {"body": body[:_BODY_CHARS]},
        **({"vector": vector} if vector is not None else {}),
    }


class LineSplitter:
    """Bytes in any chunks → complete lines (without the newline), never holding more
    than one line plus one chunk; a line past `max_line_bytes` comes out as `None`
    (its bytes dropped as they arrive)."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._overlong = False

    def feed(self, chunk: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            out.append(self._finish(chunk[start:end]))
            start = end + 1
        rest = chunk[start:]
        if not self._overlong:
            self._buffer += rest
            if len(self._buffer) > self._max:
                self._overlong = True
                self._buffer.clear()
        return out

    def close(self) -> list[bytes | None]:
        """The last line when the input did not end with a newline."""
        if self._buffer or self._overlong:
            return [self._finish(b"")]
        return []

    def _finish(self, tail: bytes) -> bytes | None:
        if self._overlong or len(self._buffer) + len(tail) > self._max:
            self._buffer.clear()
            self._overlong = False
            return None
        line = bytes(self._buffer) + tail if self._buffer else tail
        self._buffer.clear()
        return line


@dataclass(slots=True)
class _Pending:
    line_no: int
    raw: dict[str, Any]
    size: int


@dataclass(slots=True)
class JsonlImporter:
    """One import: `add` each line (in order), `write_pending` whenever `add` says a
    batch is full and once at the end, then `result`. Not thread-safe; one caller."""

    options: ImportOptions
    store: RecordStore
    on_commit: Callable[[], None] | None = None
    read: int = 0
    imported: int = 0
    skipped: int = 0
    errors: int = 0
    batches: int = 0
    error_lines: list[ImportLineError] = field(default_factory=list)
    rings: set[str] = field(default_factory=set)
    _pending: list[_Pending] = field(default_factory=list)
    _pending_bytes: int = 0

    def add(self, line: bytes | None) -> bool:
        """Take the next line (None: a line too long to read); True when a batch is full."""
        self.read += 1
        if line is None:
            self._error(self.read, ErrorCode.INVALID_REQUEST, "the line is too long")
            return False
        try:
            raw = map_line(line, self.options)
        except LineError as exc:
            self._error(self.read, exc.code, exc.message, exc.field, exc.reason)
            return False
        if raw is None:
            self.skipped += 1
            return False
        self._pending.append(_Pending(self.read, raw, len(line)))
        self._pending_bytes += len(line)
        return (
            len(self._pending) >= self.options.batch_size
            or self._pending_bytes >= self.options.max_batch_bytes
        )

    def write_pending(self) -> None:
        """Write the lines taken so far as one batch (blocking: store I/O)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        ids = [
            derive_document_id(
                p.raw["namespace"], p.raw["snapshot_kind"], p.raw["item_id"], p.raw["galaxy"]
            )
            for p in pending
        ]
        next_revision = {h.document_id: h.revision + 1 for h in self.store.heads(sorted(set(ids)))}
        records: list[Record] = []
        lines: list[int] = []
        for item, doc_id in zip(pending, ids, strict=True):
            revision = next_revision.get(doc_id, 1)
            raw = {**item.raw, "revision": revision, "document_id": doc_id}
            # `map_line` made the vector a non-empty list of `float` (`_vector`): when its
            # length is within Record's bound too, validating its floats again is all
            # `Record` would do with it (~40 % of a record's validation at 384-d), so it
            # is attached after the rest is validated. Past the bound, Record says why.
            vector: list[float] | None = raw.get("vector")
            if vector is not None and len(vector) <= _MAX_VECTOR:
                del raw["vector"]
            else:
                vector = None
            try:
                record = Record.model_validate(raw)
                if vector is not None:
                    record.vector = list(vector)  # its own list, as validation makes
            except ValidationError as exc:
                first = exc.errors(include_url=False, include_input=False)[0]
                where = ".".join(str(p) for p in first["loc"])
                self._error(
                    item.line_no,
                    ErrorCode.INVALID_REQUEST,
                    f"{where}: {first['msg']}",
                    where,
                    first["type"],
                )
                continue
            # The vector was checked by `map_line`; the rest of what engines refuse here.
            refused = record_problems(record, dimension=None, vector=False)
            if refused:
                where = ".".join(str(p) for p in refused[0].loc)
                self._error(
                    item.line_no,
                    ErrorCode.INVALID_REQUEST,
                    f"{where}: {refused[0].msg}",
                    where,
                    refused[0].type,
                )
                continue
            if self._too_large(item.line_no, record):
                continue
            # The same id twice in one batch: the later line is the newer revision.
            next_revision[doc_id] = revision + 1
            records.append(record)
            lines.append(item.line_no)
        if not records:
            return
        result = write_records(records, store=self.store, on_commit=self.on_commit)
        self.batches += 1
        for out, record, line_no in zip(result.items, records, lines, strict=True):
            if out.status == 201:
                self.imported += 1
                self.rings.add(record.ring)
            else:
                message = out.error.message if out.error is not None else "not written"
                self._error(line_no, ErrorCode.REVISION_CONFLICT, message)

    def _too_large(self, line_no: int, record: Record) -> bool:
        """Whether the record is over `max_record_bytes` as stored: an error line
        (`record_too_large`, with the 413's details), the import going on."""
        try:
            check_record_size(record, max_record_bytes=self.options.max_record_bytes)
        except OrreryError as exc:
            details = {k: v for k, v in exc.details.items() if k != "index"}
            self._error(line_no, exc.code, exc.message, str(details["field"]), details=details)
            return True
        return False

    def result(self) -> ImportResponse:
        return ImportResponse(
            namespace=self.options.namespace,
            galaxy=self.options.galaxy,
            read=self.read,
            imported=self.imported,
            skipped=self.skipped,
            errors=self.errors,
            errorLines=self.error_lines,
            rings=len(self.rings),
            batches=self.batches,
            batchSize=self.options.batch_size,
            defaultRing=self.options.default_ring,
        )

    def _error(
        self,
        line_no: int,
        code: ErrorCode,
        message: str,
        field: str | None = None,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.errors += 1
        if len(self.error_lines) < MAX_REPORTED_ERRORS:
            self.error_lines.append(
                ImportLineError(
                    line=line_no,
                    code=code.value,
                    message=message[:500],
                    field=field,
                    reason=reason,
                    details=details,
                )
            )


def _line(model: DumpMetaLine | DumpRingLine | DumpDocumentLine) -> bytes:
    return model.__pydantic_serializer__.to_json(model, exclude_none=True) + b"\n"


def dump_lines(
    *,
    store: RecordStore,
    namespace: str,
    snapshot_kind: str,
    galaxy: str,
    include_vectors: bool = True,
) -> Iterator[bytes]:
    """The `koutendb.dump.v1` lines of the live records of one galaxy in one scope, in
    item id order (a dump of the same data is the same bytes). Reads one consistent
    snapshot; the first line comes after the whole snapshot was read."""
    prefix = f"{galaxy}:"
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115
    try:
        documents = 0
        rings: set[str] = set()
        for record in store.live_records(namespace, snapshot_kind, galaxy):
            codec, text = payload_codec(record.payload_schema, record.payload)
            ident = (
                record.item_id[len(prefix) :]
                if record.item_id.startswith(prefix)
                else (record.item_id)
            )
            vec = record.vector if include_vectors else None
            spool.write(
                _line(
                    DumpDocumentLine(id=ident, ring=record.ring, payload=text, codec=codec, vec=vec)
                )
            )
            documents += 1
            rings.add(record.ring)
        closure = ring_closure(rings)
        yield _line(
            DumpMetaLine(
                galaxy=galaxy,
                namespace=namespace,
                snapshotKind=snapshot_kind,
                documents=documents,
                rings=len(closure),
            )
        )
        for name in closure:
            yield _line(DumpRingLine(name=name))
        spool.seek(0)
        while chunk := spool.read(1 << 16):
            yield chunk
    finally:
        spool.close()
