"""A write worker of the embedded deployment: `POST /v1/records`' parse, validation and
canonical-store write, in a process of its own (`ingest.write_workers` starts it).

Why a process: the embedded server runs the projector and the queries in one
interpreter; a POST's parse, validation and SQLite write held that interpreter ~40 % of
an ingest's GIL-held time, so one process could not pass ~2,400 records/s. Here they run
beside it, on another core. The worker runs exactly the in-process use cases
(`ingest.service.parse_body`, `ingest.service.write_records`) on its own connection to
the same SQLite file (WAL: writers of several processes are serialized by SQLite's
write lock, outbox positions stay dense and in commit order).

Protocol (`multiprocessing.connection` framing over two inherited pipes, pickled tuples,
one answer per command, commands handled one at a time):

- `("parse", token, body, allowed_namespace, allowed_galaxy)` -> `("ok", namespaces)`:
  the batch is admitted and held under `token` until `write` or `drop`;
- `("write", token, traceparent)` -> `("ok", status, body_json, written, entries)`: the
  held batch written in one transaction; `written` its `(namespace, position)` events,
  `entries` the outbox events the store hands over after a commit (`LogEntry`s, records
  up to `HANDOVER_MAX_BYTES` as stored, each upsert's vector a `PackedVector`: `_packed`,
  pickled in chunks of `HANDOVER_CHUNK`: the server's projector takes them instead of
  reading and decoding the rows again — unpickling costs it less). The WAL checkpoint
  the write made due runs after this answer is sent
  (`SqliteRecordStore(defer_checkpoint=True)`);
- `("drop", token)` -> `("ok",)`.

A refused command answers `("error", code, message, details)` (an `OrreryError`: the
same answer the in-process path gives) or `("failed", text)` (anything else). The worker
exits when its command pipe closes (its server ended, however it ended).
"""

from __future__ import annotations

import argparse
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from contracts.errors import DependencyUnavailable, OrreryError
from contracts.events import LogEntry, RecordChanged
from contracts.gc_tuning import tune_gc
from contracts.records import vector_span
from contracts.request_context import RequestContext, close_request, open_request
from contracts.stored_vectors import float32_wire, packed_vector
from ingest.adapters.sqlite_store import SqliteRecordStore
from ingest.service import Admitted, all_stale_body, parse_body, write_records

__all__ = ["DEPENDENCY", "main", "serve"]

# How a refusal names the worker (`details.dependency`).
DEPENDENCY = "ingest write worker"


def serve(
    commands: Connection,
    answers: Connection,
    *,
    db_path: Path,
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
) -> None:
    """Answer commands until `commands` closes (see the module docstring)."""
    handed: list[LogEntry] = []
    # The WAL checkpoint after the answer, not inside `write`: the server's projector
    # takes the batch's events from the answer, and until they arrive it waits for them
    # rather than decoding the rows (`SqliteOutboxLog`'s hand-over wait).
    store = SqliteRecordStore(db_path, on_committed=handed.extend, defer_checkpoint=True)
    held: dict[int, Admitted] = {}
    try:
        while True:
            try:
                command = commands.recv()
            except (EOFError, OSError):
                return
            handed.clear()
            try:
                answer = _answer(
                    command,
                    held,
                    handed,
                    store=store,
                    max_batch=max_batch,
                    vector_dimension=vector_dimension,
                    max_record_bytes=max_record_bytes,
                )
            except OrreryError as exc:
                answer = ("error", exc.code.value, exc.message, exc.details)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                answer = ("failed", f"{type(exc).__name__}: {exc}")
            try:
                answers.send(answer)
            except (BrokenPipeError, OSError):
                return
            store.checkpoint_if_due()
    finally:
        store.close()


def _answer(
    command: tuple[Any, ...],
    held: dict[int, Admitted],
    handed: list[LogEntry],
    *,
    store: SqliteRecordStore,
    max_batch: int,
    vector_dimension: int | None,
    max_record_bytes: int,
) -> tuple[Any, ...]:
    op = command[0]
    if op == "parse":
        _, token, body, allowed_namespace, allowed_galaxy = command
        batch = parse_body(
            body,
            max_batch=max_batch,
            vector_dimension=vector_dimension,
            max_record_bytes=max_record_bytes,
            allowed_namespace=allowed_namespace,
            allowed_galaxy=allowed_galaxy,
        )
        held[token] = batch
        return ("ok", sorted({r.namespace for r in batch.records}))
    if op == "write":
        _, token, traceparent = command
        if token not in held:
            # Parsed by a worker that ended since (this is its successor): nothing of it
            # was written, the client may send it again.
            raise DependencyUnavailable(
                DEPENDENCY, "the worker that parsed this batch ended; nothing was written"
            )
        batch = held.pop(token)
        # The outbox rows carry the request's trace context, as when written in process.
        context = open_request(RequestContext(request_id="", traceparent=traceparent))
        try:
            result = write_records(batch.records, store=store, stored_json=batch.stored_json)
        finally:
            close_request(context)
        written = [
            (batch.records[item.index].namespace, item.position)
            for item in result.items
            if item.position is not None
        ]
        written.sort(key=lambda event: event[1])
        entries = _packed(handed, batch)
        if result.accepted == 0:
            body = all_stale_body(result)
            return ("ok", 409, body, written, _pickled(entries))
        return (
            "ok",
            200,
            result.model_dump_json(exclude={"searchable"}),
            written,
            _pickled(entries),
        )
    if op == "drop":
        held.pop(command[1], None)
        return ("ok",)
    raise ValueError(f"unknown command {op!r}")


# Events per pickled chunk: the server unpickles a chunk in one call that keeps the GIL
# (~5 ms for 128 records with 384-d vectors), so its queries and projector wait no longer.
HANDOVER_CHUNK = 128


def _packed(entries: list[LogEntry], batch: Admitted) -> list[LogEntry]:
    """`entries` with each upsert's vector as a `PackedVector`: its float32 values and its
    JSON text cut from the record's stored JSON (`Admitted.stored_json`), as the
    server-mode projector decodes an event with its float32 header. A pickled list of
    384 floats costs the server ~25 us a record to unpickle, the packed form ~5, and the
    projector then reads the float32 array (ring statistics, qdrant-edge) instead of
    converting the floats again. An entry that cannot be packed (no stored JSON kept, a
    layout `vector_span` does not cut) is handed over as it is: the same record."""
    # By object: the store hands over events of the very records it was given.
    stored = {
        id(record): text
        for record, text in zip(batch.records, batch.stored_json, strict=True)
        if text is not None
    }
    out: list[LogEntry] = []
    for entry in entries:
        record = entry.event.record
        values = record.vector
        text = stored.get(id(record))
        vector = None
        if type(values) is list and not record.deleted and text is not None:
            raw = text.encode()
            span = vector_span(raw, 0, len(raw))
            if span is not None:
                vector = packed_vector(float32_wire(values), raw[span[1] : span[2]])
        if vector is None:
            out.append(entry)
            continue
        event = RecordChanged(record=record.model_copy(update={"vector": vector}))
        out.append(entry.model_copy(update={"event": event}))
    return out


def _pickled(entries: list[LogEntry]) -> list[bytes]:
    return [
        pickle.dumps(entries[start : start + HANDOVER_CHUNK], protocol=pickle.HIGHEST_PROTOCOL)
        for start in range(0, len(entries), HANDOVER_CHUNK)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--commands-fd", type=int, required=True)
    parser.add_argument("--answers-fd", type=int, required=True)
    parser.add_argument("--max-batch", type=int, required=True)
    parser.add_argument("--vector-dimension", type=int, default=None)
    parser.add_argument("--max-record-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    # Ctrl+C reaches the whole process group: the server decides when its workers end
    # (it closes their pipes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Each batch's parse allocates hundreds of thousands of containers, as the server's
    # did when it parsed in process: its collector tuned as the server's is.
    tune_gc()
    serve(
        Connection(args.commands_fd, writable=False),
        Connection(args.answers_fd, readable=False),
        db_path=args.db,
        max_batch=args.max_batch,
        vector_dimension=args.vector_dimension,
        max_record_bytes=args.max_record_bytes,
    )


if __name__ == "__main__":
    main()
