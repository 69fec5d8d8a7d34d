"""Use cases of the projector: apply the log to every generation that takes writes."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from contracts.admission import record_problems
from contracts.digests import sha256_json
from contracts.embedding import Embedder, embedding_text, text_digest
from contracts.errors import ErrorCode, OrreryError, is_deterministic
from contracts.events import LogEntry
from contracts.faults import crash_point
from contracts.generations import Topology
from contracts.index import IndexDocument, to_index_document
from contracts.index_fields import TextLanguages
from contracts.records import Record
from contracts.stored_vectors import is_encoded
from projector.model import plan_batch
from projector.ports import (
    DeadLetterBox,
    EventLog,
    LexicalIndex,
    LogHealth,
    ProjectionState,
    RejectedRecord,
    Undecodable,
    VectorCache,
    VectorIndex,
    WriterLock,
)

__all__ = [
    "BatchContainment",
    "BatchReport",
    "PoisonGuard",
    "analyzed_schema_digest",
    "embed_records",
    "park_rejected",
    "project_batch",
]

log_ = logging.getLogger("orrery.projector")

# Bump when the index schema (fields, analyzers, payload indexes) changes.
# 2: the combined `text` field; the text analyzer is named per generation.
# 3: payload-aware HNSW links only for `contracts.vector_payload.GRAPH_FIELDS`.
# 4: `ring_path` (a record's ring and its ancestors) in every engine; `ring` and
#    `ring_path` payload indexes in the Qdrant engines (ring filters, issue 12).
# 5: tantivy fast fields `document_key_hi`/`_lo` and `status_key`: a hit is read from
#    fast fields, not from its stored document (issue 14); version 4 indexes are still
#    searched, with stored-document reads.
# 6: Qdrant point payloads without `item_id` (no query reads it) and without empty values
#    (`contracts.vector_payload.payload_of`; issue 14: ~15 us less per point written);
#    version 5 points are filtered and read the same way.
SCHEMA_VERSION = 6


@dataclass(slots=True)
class BatchReport:
    """What one call of `project_batch` did."""

    events: int = 0
    upserts: int = 0
    deletes: int = 0
    skipped: int = 0
    embedded: int = 0
    position: int = 0
    generations_created: list[str] = field(default_factory=list)
    seconds: float = 0.0
    parked: int = 0
    dead_lettered: int = 0
    lag: int | None = None
    # The distinct trace contexts of the writes this batch applied (at most
    # `MAX_TRACE_LINKS`): a batch span links to them.
    trace_contexts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PoisonGuard:
    """How the projector contains a record that fails deterministically (issue 22: one
    bad record must never stop the world), and its memory across batches.

    A record refused by `contracts.admission.record_problems` (what the write routes
    refuse at the door) is dead-lettered at once: the check is a pure function, a retry
    cannot pass. A record an engine refuses deterministically (`contracts.errors.
    is_deterministic`) is isolated by bisecting its batch (every engine write is
    idempotent on `(document_id, revision)`, so writing halves again is harmless) and
    dead-lettered alone once the engine has taken another write in the same batch
    (proof that the engine takes writes: the record is the problem) or after
    `max_attempts` batches failed on it — never retried forever, and never a reason to
    hold another record back. A transient fault (an engine unreachable, a timeout, a
    5xx) fails the batch, which is delivered again and retried with backoff.

    `failures` counts the batches that failed on each log location (`event@<position>`)
    without the engine taking any write; kept by the caller across `project_batch`
    calls (one guard per projector process: a restart counts anew, still bounded).
    """

    max_attempts: int = 3
    failures: dict[str, int] = field(default_factory=dict)


def schema_digest(lexical_engine: str, vector_engine: str, embedder_id: str) -> str:
    return sha256_json(
        {
            "schema_version": SCHEMA_VERSION,
            "lexical": lexical_engine,
            "vector": vector_engine,
            "embedder": embedder_id,
        }
    )


def analyzed_schema_digest(base: str, text_analyzer: str) -> str:
    """The schema digest of one generation: the deployment's (`schema_digest`) and the
    text analyzer the generation was created with (its namespace's language)."""
    return sha256_json({"schema": base, "text_analyzer": text_analyzer})


def embed_records(
    records: Sequence[Record], *, embedder: Embedder, cache: VectorCache
) -> tuple[dict[str, Sequence[float]], int]:
    """Vectors for records without their own, each distinct text embedded once ever.

    Returns `(vectors by document id, number of texts embedded now)`.
    """
    texts = {r.doc_id: embedding_text(r.text) for r in records if r.vector is None}
    keys = {doc_id: text_digest(embedder.embedder_id, t) for doc_id, t in texts.items()}
    cached = cache.cached_vectors(set(keys.values()))
    missing = sorted({keys[d]: texts[d] for d in texts if keys[d] not in cached}.items())
    if missing:
        fresh = embedder.embed([text for _, text in missing])
        new = {key: vector for (key, _), vector in zip(missing, fresh, strict=True)}
        cache.store_vectors(new)
        cached.update(new)
    vectors: dict[str, Sequence[float]] = {doc_id: cached[key] for doc_id, key in keys.items()}
    for record in records:
        vector = record.vector
        if vector is not None:
            # A decoded event's `StoredVector` or `PackedVector` as it is: its float32
            # array and JSON text go to the engines without a float of it being
            # formatted or packed again.
            vectors[record.doc_id] = vector if is_encoded(vector) else tuple(vector)
    return vectors, len(missing)


def project_batch(
    *,
    log: EventLog,
    state: ProjectionState,
    lexical: LexicalIndex,
    vectors: VectorIndex,
    embedder: Embedder,
    cache: VectorCache,
    lexical_engine: str,
    vector_engine: str,
    consumer: str = "projector",
    batch_size: int = 512,
    lock: WriterLock | None = None,
    topology: Callable[[str], Topology] | None = None,
    dead_letters: DeadLetterBox | None = None,
    health: LogHealth | None = None,
    text_languages: TextLanguages | None = None,
    poison: PoisonGuard | None = None,
) -> BatchReport:
    """Apply the next batch of the log to each generation that takes writes.

    Idempotent on `(document_id, revision)`: the indexes are written first, then the
    position and revisions commit together, so a crash in between replays the batch
    and converges to the same state. The first event of a scope with no generation
    creates its first generation (engine indexes named by `topology`) and makes it live.

    With a `lock`, reading the write targets and their revisions, writing the indexes
    and committing happen inside it, so a snapshot load or an evidence check never
    interleaves with a batch; new texts are embedded before it is taken.

    Messages the log cannot decode are parked in `dead_letters` (idempotently, before
    the commit, so a replay parks nothing twice), logged at ERROR and acknowledged with
    the batch: the projector continues and nothing is dropped unseen. Without a
    `dead_letters` box the batch fails instead (and is delivered again).

    Records that cannot be applied (see `PoisonGuard`, `poison`: one per process; None
    counts failures within this call only) are parked the same way, each alone, and
    their document is removed from the generation at their revision (a delete at that
    revision in every engine, `(revision, deleted)` in the registry): engines and
    registry agree, and a later revision of the document (or a re-drive, which writes
    one) applies normally. Every other record of the batch is applied.

    With `health`, the log's lag is measured after each batch and after an empty fetch
    and recorded with the position committed at that moment (`BatchReport.lag`); a
    failed measurement is logged and leaves the previous one in place.
    """
    started = time.perf_counter()
    report = BatchReport(position=state.position(consumer))
    fetched = log.fetch(batch_size)
    if not fetched:
        _measure_lag(log, health, consumer, report)
        return report
    entries = [e for e in fetched if isinstance(e, LogEntry)]
    undecodable = [e for e in fetched if isinstance(e, Undecodable)]
    try:
        if undecodable:
            _park(undecodable, dead_letters, consumer)
            report.parked = len(undecodable)
            report.position = max(report.position, max((u.position or 0) for u in undecodable))
        # Only texts to embed: records that carry their vector need nothing here.
        _, report.embedded = embed_records(
            [r for r in _newest_upserts(entries) if r.vector is None],
            embedder=embedder,
            cache=cache,
        )
        with lock.hold() if lock is not None else contextlib.nullcontext():
            rejected: list[RejectedRecord] = []
            changes = _apply_entries(
                entries,
                report,
                state=state,
                lexical=lexical,
                vectors=vectors,
                embedder=embedder,
                cache=cache,
                lexical_engine=lexical_engine,
                vector_engine=vector_engine,
                topology=topology,
                text_languages=text_languages if text_languages is not None else TextLanguages(),
                containment=BatchContainment(
                    poison if poison is not None else PoisonGuard(), rejected
                ),
            )
            if rejected:
                park_rejected(rejected, dead_letters, consumer)
                report.dead_lettered = len({r.where for r in rejected})
            report.events = len(fetched)
            if entries:
                report.position = max(report.position, max(e.position for e in entries))
                report.trace_contexts = _trace_contexts(entries)
            crash_point("projector.engines_written")
            state.commit(
                consumer,
                report.position,
                changes,
                namespaces=_newest_by_namespace(entries),
                partitions=_newest_by_partition(entries),
            )
            crash_point("projector.committed")
    except BaseException:
        log.reset()  # nothing committed: deliver the same entries again
        raise
    log.acknowledge(fetched)
    _measure_lag(log, health, consumer, report)
    report.seconds = time.perf_counter() - started
    return report


def _newest_by_namespace(entries: Sequence[LogEntry]) -> dict[str, int]:
    """Each namespace's newest log position in the batch (dead-lettered records count:
    they are handled too)."""
    out: dict[str, int] = {}
    for entry in entries:
        namespace = entry.event.record.namespace
        if entry.position > out.get(namespace, -1):
            out[namespace] = entry.position
    return out


def _newest_by_partition(entries: Sequence[LogEntry]) -> dict[tuple[str, int], int]:
    """Each (namespace, partition)'s newest offset in the batch, for entries of a
    partitioned log (dead-lettered records count, as in `_newest_by_namespace`)."""
    out: dict[tuple[str, int], int] = {}
    for entry in entries:
        if entry.partition is None or entry.offset is None:
            continue
        key = (entry.event.record.namespace, entry.partition)
        if entry.offset > out.get(key, -1):
            out[key] = entry.offset
    return out


def _park(messages: Sequence[Undecodable], box: DeadLetterBox | None, consumer: str) -> None:
    for message in messages:
        log_.error(
            "undecodable event at %s (position %s, %d bytes): %s — %s",
            message.where,
            message.position,
            len(message.value),
            message.reason,
            "parked as a dead letter" if box is not None else "no dead-letter box: retrying",
        )
    if box is None:
        raise OrreryError(
            ErrorCode.INTERNAL,
            f"{len(messages)} undecodable event(s) and no dead-letter box, first at "
            f"{messages[0].where}: {messages[0].reason}",
            {"where": [m.where for m in messages]},
        )
    box.park(consumer, messages)


def park_rejected(
    rejected: Sequence[RejectedRecord], box: DeadLetterBox | None, consumer: str
) -> None:
    unique = list({r.where: r for r in rejected}.values())
    for letter in unique:
        log_.error(
            "record %s revision %d of namespace %r at %s cannot be applied (%s: %s) — %s",
            letter.record.doc_id,
            letter.record.revision,
            letter.record.namespace,
            letter.where,
            letter.code,
            letter.reason,
            "parked as a dead letter" if box is not None else "no dead-letter box: retrying",
        )
    if box is None:
        first = unique[0]
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"{len(unique)} record(s) cannot be applied and no dead-letter box, first "
            f"{first.record.doc_id} at {first.where}: {first.reason}",
            {"where": [r.where for r in unique]},
        )
    box.park_rejected(consumer, unique)


def _measure_lag(
    log: EventLog, health: LogHealth | None, consumer: str, report: BatchReport
) -> None:
    if health is None:
        return
    try:
        # The position first: a lag of 0 then covers every event up to it.
        position = report.position
        report.lag = log.lag()
        health.record_lag(consumer, position=position, lag_events=report.lag)
    except OrreryError:
        log_.warning("measuring the event log's lag failed", exc_info=True)


# A batch span's links are bounded: a bulk write of many traced requests links to the
# first ones.
MAX_TRACE_LINKS = 64


def _trace_contexts(entries: Sequence[LogEntry]) -> list[str]:
    seen: dict[str, None] = {}
    for entry in entries:
        if entry.trace_context and entry.trace_context not in seen:
            seen[entry.trace_context] = None
            if len(seen) == MAX_TRACE_LINKS:
                break
    return list(seen)


def _newest_upserts(entries: Sequence[LogEntry]) -> list[Record]:
    """The newest revision of each document in the batch, if it is not a tombstone."""
    newest: dict[str, Record] = {}
    for entry in entries:
        record = entry.event.record
        held = newest.get(record.doc_id)
        if held is None or record.revision > held.revision:
            newest[record.doc_id] = record
    return [r for r in newest.values() if not r.deleted]


def _apply_entries(
    entries: Sequence[LogEntry],
    report: BatchReport,
    *,
    state: ProjectionState,
    lexical: LexicalIndex,
    vectors: VectorIndex,
    embedder: Embedder,
    cache: VectorCache,
    lexical_engine: str,
    vector_engine: str,
    topology: Callable[[str], Topology] | None,
    text_languages: TextLanguages,
    containment: BatchContainment,
) -> dict[str, dict[str, tuple[int, bool]]]:
    by_scope: dict[tuple[str, str], list[LogEntry]] = defaultdict(list)
    for entry in entries:
        record = entry.event.record
        by_scope[(record.namespace, record.snapshot_kind)].append(entry)
    changes: dict[str, dict[str, tuple[int, bool]]] = {}
    for (namespace, kind), scoped in by_scope.items():
        targets = state.write_targets(namespace, kind)
        if not targets:
            text_analyzer = text_languages.analyzer_for(namespace)
            base_digest = schema_digest(lexical_engine, vector_engine, embedder.embedder_id)
            descriptor = state.create_generation(
                namespace,
                kind,
                embedder_id=embedder.embedder_id,
                embedder_dim=embedder.dimension,
                lexical_engine=lexical_engine,
                vector_engine=vector_engine,
                schema_digest=analyzed_schema_digest(base_digest, text_analyzer),
                make_live=True,
                topology=topology,
            )
            crash_point("projector.generation_registered")
            lexical.create(descriptor.generation_id, text_analyzer=text_analyzer)
            crash_point("projector.lexical_created")
            vectors.create(descriptor.generation_id, embedder.dimension)
            report.generations_created.append(descriptor.generation_id)
            targets = [descriptor.generation_id]
        events = [e.event for e in scoped]
        positions = {(e.event.document_id, e.event.revision): e.position for e in scoped}
        doc_ids = sorted({e.document_id for e in events})
        for generation_id in targets:
            plan = plan_batch(events, state.revisions(generation_id, doc_ids))
            report.skipped += plan.skipped
            if not plan.revisions:
                continue
            upsert_records, removed = containment.admit(
                list(plan.upserts.values()), positions, dimension=embedder.dimension
            )
            vecs, embedded = embed_records(upsert_records, embedder=embedder, cache=cache)
            report.embedded += embedded
            docs: list[IndexDocument] = [
                to_index_document(r, vecs[r.doc_id]) for r in upsert_records
            ]
            deletes = sorted(plan.deletes.items())

            def write(
                docs: Sequence[IndexDocument],
                deletes: Sequence[tuple[str, int]],
                generation_id: str = generation_id,
                namespace: str = namespace,
            ) -> None:
                _write_generation(
                    generation_id,
                    docs,
                    deletes,
                    lexical=lexical,
                    vectors=vectors,
                    text_analyzer=text_languages.analyzer_for(namespace),
                    dimension=embedder.dimension,
                )

            refused = containment.write(write, docs, deletes, positions, plan.upserts)
            # A refused revision leaves the generation: a delete at its revision removes
            # whatever an engine took of it before another refused it.
            refused_upserts = [(d, r) for d, r in refused if d in plan.upserts]
            removed = sorted({*removed, *refused_upserts})
            if removed:
                write([], removed)
            for document_id, revision in removed:
                plan.revisions[document_id] = (revision, True)
            report.upserts += len(docs) - len(refused_upserts)
            report.deletes += len(deletes)
            changes[generation_id] = plan.revisions
    return changes


@dataclass(slots=True)
class BatchContainment:
    """One batch's poison-record containment (see `PoisonGuard`): the projector's for a
    batch of the log, a generation build's for a batch of the canonical snapshot (whose
    records have no log position: `positions` maps them to None).

    Refused records are appended to `rejected`; the caller parks them and removes their
    revision from the generation (a delete at that revision in the engines and the
    registry)."""

    guard: PoisonGuard
    rejected: list[RejectedRecord]
    # Whether an engine write of this batch succeeded (the engines take writes).
    wrote: bool = False

    def reject(self, position: int | None, record: Record, code: str, reason: str) -> None:
        self.rejected.append(RejectedRecord(position, record, code, reason))

    def admit(
        self,
        records: Sequence[Record],
        positions: Mapping[tuple[str, int], int | None],
        *,
        dimension: int,
    ) -> tuple[list[Record], list[tuple[str, int]]]:
        """The door check of the write routes (`contracts.admission.record_problems`; a
        pure function, so a refusal is final): `(records admitted, (document_id,
        revision) of those rejected)`."""
        admitted: list[Record] = []
        refused: list[tuple[str, int]] = []
        for record in records:
            # Its size was a limit of the transport it came through already.
            problems = record_problems(record, dimension=dimension)
            if not problems:
                admitted.append(record)
                continue
            refused.append((record.doc_id, record.revision))
            first = problems[0]
            self.reject(
                positions.get((record.doc_id, record.revision)),
                record,
                first.type,
                f"{'.'.join(map(str, first.loc))}: {first.msg}",
            )
        return admitted, refused

    def write(
        self,
        write: Callable[[Sequence[IndexDocument], Sequence[tuple[str, int]]], None],
        docs: Sequence[IndexDocument],
        deletes: Sequence[tuple[str, int]],
        positions: Mapping[tuple[str, int], int | None],
        upserts: Mapping[str, Record],
    ) -> list[tuple[str, int]]:
        """Write `docs` and `deletes`; on a deterministic failure, bisect to the
        operations that fail alone and return those refused for good, as
        `(document_id, revision)`. Raises what is transient, and a deterministic failure
        not yet retried `max_attempts` times while nothing was written."""
        if not docs and not deletes:
            return []
        operations: list[IndexDocument | tuple[str, int]] = [*docs, *deletes]
        try:
            write(docs, deletes)
        except OrreryError as exc:
            if not is_deterministic(exc):
                raise
            failing = self._isolate(write, operations, exc)
        else:
            self.wrote = True
            return []
        refused: list[tuple[str, int]] = []
        for operation, error in failing:
            document_id, revision = (
                (operation.document_id, operation.revision)
                if isinstance(operation, IndexDocument)
                else operation
            )
            position = positions.get((document_id, revision))
            record = upserts.get(document_id)
            where = (
                f"event@{position}"
                if position is not None or record is None
                else RejectedRecord(None, record, "", "").where
            )
            attempts = self.guard.failures.get(where, 0) + 1
            if not self.wrote and attempts < self.guard.max_attempts:
                # Nothing of this batch was written: the engine may refuse everything
                # (its own fault, not the record's). Fail the batch; retried with backoff.
                self.guard.failures[where] = attempts
                raise error
            self.guard.failures.pop(where, None)
            if record is not None and record.revision == revision:
                self.reject(position, record, error.code.value, error.message)
            refused.append((document_id, revision))
        return refused

    def _isolate(
        self,
        write: Callable[[Sequence[IndexDocument], Sequence[tuple[str, int]]], None],
        operations: list[IndexDocument | tuple[str, int]],
        error: OrreryError,
    ) -> list[tuple[IndexDocument | tuple[str, int], OrreryError]]:
        """The operations that fail deterministically on their own, each with its error
        (`operations` failed together with `error`)."""
        if len(operations) == 1:
            return [(operations[0], error)]
        middle = len(operations) // 2
        failing: list[tuple[IndexDocument | tuple[str, int], OrreryError]] = []
        for half in (operations[:middle], operations[middle:]):
            docs = [o for o in half if isinstance(o, IndexDocument)]
            deletes = [o for o in half if not isinstance(o, IndexDocument)]
            try:
                write(docs, deletes)
            except OrreryError as exc:
                if not is_deterministic(exc):
                    raise
                failing += self._isolate(write, half, exc)
            else:
                self.wrote = True
        return failing


def _write_generation(
    generation_id: str,
    docs: Sequence[IndexDocument],
    deletes: Sequence[tuple[str, int]],
    *,
    lexical: LexicalIndex,
    vectors: VectorIndex,
    text_analyzer: str,
    dimension: int,
) -> None:
    """Write one batch to both engines' indexes of a generation that takes writes.

    The registry records a generation before the engines create its indexes (the id
    comes from the registry), so a crash in between leaves a write target the engines
    do not hold. That must heal, not wedge: an index missing for a registered write
    target is created (idempotently: `create` is a no-op for what exists) and the batch
    written again (idempotent on `(document_id, revision)`). Nothing the registry
    counts as applied can be missing from a crash, because revisions commit only after
    both engines were written; an index lost otherwise (dropped by hand) comes back
    empty, and the generation's evidence check then finds it incomplete.
    """
    try:
        _apply_side_by_side(generation_id, docs, deletes, lexical=lexical, vectors=vectors)
    except OrreryError as exc:
        if not _missing_index(exc, generation_id):
            raise
        log_.warning(
            "generation %s is registered but an engine does not hold it (%s): "
            "creating its indexes and writing the batch again",
            generation_id,
            exc.message,
        )
        lexical.create(generation_id, text_analyzer=text_analyzer)
        vectors.create(generation_id, dimension)
        lexical.apply(generation_id, docs, deletes)
        vectors.apply(generation_id, docs, deletes)


def _apply_side_by_side(
    generation_id: str,
    docs: Sequence[IndexDocument],
    deletes: Sequence[tuple[str, int]],
    *,
    lexical: LexicalIndex,
    vectors: VectorIndex,
) -> None:
    """`lexical.apply` on a thread of its own while `vectors.apply` runs on this one;
    returns once both ended, raising the lexical side's error first.

    Why: the two engines' writes are independent, and each spends much of its time where
    the other can use the interpreter — tantivy indexes on its own threads and waits for
    them at the commit, GIL released (~60 us a record, `bench/gil_release.py`), while
    qdrant-edge's point conversion and update hold the GIL; in server mode both wait on
    the network. Nothing is committed before both returned (the caller commits), and
    every write is idempotent on `(document_id, revision)`, so a failure or crash of
    either side — the other written, half written or not — is replayed as before.
    """
    failure: list[BaseException] = []

    def write_lexical() -> None:
        try:
            lexical.apply(generation_id, docs, deletes)
            crash_point("projector.lexical_applied")
        except BaseException as exc:  # re-raised on the projector's thread
            failure.append(exc)

    thread = threading.Thread(target=write_lexical, name="orrery-lexical-write", daemon=True)
    thread.start()
    try:
        vectors.apply(generation_id, docs, deletes)
    finally:
        thread.join()
        if failure:
            raise failure[0]


def _missing_index(exc: OrreryError, generation_id: str) -> bool:
    """Whether an engine said it holds no index for `generation_id` (vector adapters
    answer `NOT_FOUND`, lexical ones `COVERAGE_UNAVAILABLE`, both naming the id)."""
    return (
        exc.code in (ErrorCode.NOT_FOUND, ErrorCode.COVERAGE_UNAVAILABLE)
        and (exc.details or {}).get("generation_id") == generation_id
    )
