"""Use cases of the projector: apply the log to every generation that takes writes."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from contracts.digests import sha256_json
from contracts.embedding import Embedder, embedding_text, text_digest
from contracts.events import LogEntry
from contracts.generations import Topology
from contracts.index import IndexDocument, to_index_document
from contracts.records import Record
from projector.model import plan_batch
from projector.ports import (
    EventLog,
    LexicalIndex,
    ProjectionState,
    VectorCache,
    VectorIndex,
    WriterLock,
)

__all__ = ["BatchReport", "embed_records", "project_batch"]

# Bump when the index schema (fields, analyzers, payload indexes) changes.
SCHEMA_VERSION = 1


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


def schema_digest(lexical_engine: str, vector_engine: str, embedder_id: str) -> str:
    return sha256_json(
        {
            "schema_version": SCHEMA_VERSION,
            "lexical": lexical_engine,
            "vector": vector_engine,
            "embedder": embedder_id,
        }
    )


def embed_records(
    records: Sequence[Record], *, embedder: Embedder, cache: VectorCache
) -> tuple[dict[str, tuple[float, ...]], int]:
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
    vectors = {doc_id: cached[key] for doc_id, key in keys.items()}
    for record in records:
        if record.vector is not None:
            vectors[record.doc_id] = tuple(record.vector)
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
) -> BatchReport:
    """Apply the next batch of the log to each generation that takes writes.

    Idempotent on `(document_id, revision)`: the indexes are written first, then the
    position and revisions commit together, so a crash in between replays the batch
    and converges to the same state. The first event of a scope with no generation
    creates its first generation (engine indexes named by `topology`) and makes it live.

    With a `lock`, reading the write targets and their revisions, writing the indexes
    and committing happen inside it, so a snapshot load or an evidence check never
    interleaves with a batch; new texts are embedded before it is taken.
    """
    started = time.perf_counter()
    report = BatchReport(position=state.position(consumer))
    entries: list[LogEntry] = log.fetch(batch_size)
    if not entries:
        return report
    try:
        _, report.embedded = embed_records(_newest_upserts(entries), embedder=embedder, cache=cache)
        with lock.hold() if lock is not None else contextlib.nullcontext():
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
            )
            report.events = len(entries)
            report.position = max(report.position, max(e.position for e in entries))
            state.commit(consumer, report.position, changes)
    except BaseException:
        log.reset()  # nothing committed: deliver the same entries again
        raise
    log.acknowledge(entries)
    report.seconds = time.perf_counter() - started
    return report


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
) -> dict[str, dict[str, tuple[int, bool]]]:
    by_scope: dict[tuple[str, str], list[LogEntry]] = defaultdict(list)
    for entry in entries:
        record = entry.event.record
        by_scope[(record.namespace, record.snapshot_kind)].append(entry)
    changes: dict[str, dict[str, tuple[int, bool]]] = {}
    for (namespace, kind), scoped in by_scope.items():
        targets = state.write_targets(namespace, kind)
        if not targets:
            descriptor = state.create_generation(
                namespace,
                kind,
                embedder_id=embedder.embedder_id,
                embedder_dim=embedder.dimension,
                lexical_engine=lexical_engine,
                vector_engine=vector_engine,
                schema_digest=schema_digest(lexical_engine, vector_engine, embedder.embedder_id),
                make_live=True,
                topology=topology,
            )
            lexical.create(descriptor.generation_id)
            vectors.create(descriptor.generation_id, embedder.dimension)
            report.generations_created.append(descriptor.generation_id)
            targets = [descriptor.generation_id]
        events = [e.event for e in scoped]
        doc_ids = sorted({e.document_id for e in events})
        for generation_id in targets:
            plan = plan_batch(events, state.revisions(generation_id, doc_ids))
            report.skipped += plan.skipped
            if not plan.revisions:
                continue
            upsert_records = list(plan.upserts.values())
            vecs, embedded = embed_records(upsert_records, embedder=embedder, cache=cache)
            report.embedded += embedded
            docs: list[IndexDocument] = [
                to_index_document(r, vecs[r.doc_id]) for r in upsert_records
            ]
            deletes = sorted(plan.deletes.items())
            lexical.apply(generation_id, docs, deletes)
            vectors.apply(generation_id, docs, deletes)
            report.upserts += len(docs)
            report.deletes += len(deletes)
            changes[generation_id] = plan.revisions
    return changes
