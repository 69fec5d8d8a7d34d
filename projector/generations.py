"""Use cases of the generation lifecycle: build, seal, verify, promote, roll back, retire,
collect garbage — and the evidence check that query workers route by.

Pure orchestration over ports; decisions (which transition is legal, how two document
sets differ, which generation a rollback returns to) live in `projector.model`.

How evidence is compared. Every generation that is building, sealed, verified or live
takes the log's writes (the projector writes to all of them), so what it holds moves
with the log. Its evidence is therefore always "as of a position": the registry's
per-generation document table says which `(document_id, revision)` pairs the generation
holds at its applied position, and a check reads every engine back and compares it with
that table *at the same moment* — under the writer lock, which projector batches and
snapshot loads hold while they write, so no write is half-done in between (an
optimistic read without the lock is tried first and accepted only if it matches and no
batch committed meanwhile). When the generation has taken no write since it was sealed,
the table equals the sealed descriptor's `document_count` / `id_set_digest`, and verify
checks that too. `verify` adds the coverage check: the table must equal the canonical
store's live set at the same position (the log is ordered in the embedded deployment,
so this is exact; with Kafka, partitions may lag, so it is retried for a while, each try
at the registry's then position).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol, cast

from contracts.admin import (
    BuildProgress,
    BuildRequest,
    GcReport,
    GenerationRow,
    GenerationView,
    PromoteReport,
    RollbackRequest,
)
from contracts.digests import id_set_digest, sha256_json
from contracts.embedding import Embedder
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError, is_deterministic
from contracts.events import LogEntry
from contracts.faults import crash_point
from contracts.generations import (
    BuildReceipt,
    CopyEvidence,
    EngineEvidence,
    EvidenceCheck,
    GenerationDescriptor,
    GenerationState,
    IndexConfig,
    SourceManifest,
    Topology,
)
from contracts.index import IndexDocument, to_index_document
from contracts.index_fields import TextLanguages
from contracts.pacing import Pace, no_pace, release
from contracts.qualification import (
    QualificationReceipt,
    QualificationThresholds,
    QualifyRequest,
    receipt_failures,
)
from contracts.records import Record
from projector.model import (
    diff_pairs,
    engine_evidence,
    gc_plan,
    mismatch_reason,
    plan_batch,
    rollback_target,
    transition,
)
from projector.ports import (
    AliasMirror,
    CanonicalSnapshot,
    CopyRead,
    CopyReadback,
    DeadLetterBox,
    EngineReadback,
    EventLog,
    EvidenceLog,
    GenerationContents,
    GenerationMaintenance,
    GenerationRegistry,
    LexicalIndex,
    ProjectionState,
    ReceiptLog,
    RegistrySnapshot,
    RejectedRecord,
    VectorCache,
    VectorIndex,
    WriterLock,
)
from projector.service import (
    BatchContainment,
    PoisonGuard,
    analyzed_schema_digest,
    embed_records,
    park_rejected,
)

__all__ = [
    "ORPHANED_AFTER",
    "BuildAborted",
    "BuildControl",
    "BuildJobs",
    "BulkLoad",
    "BulkLoader",
    "DeferredWrites",
    "GenerationAdmin",
    "GenerationOptions",
    "GenerationPorts",
    "LogHandover",
    "Qualifier",
    "build_shape",
    "check_evidence",
    "config_schema_digest",
    "load_snapshot",
    "mirror_live_aliases",
    "verify_generation",
]

log = logging.getLogger("orrery.generations")

_CHECKABLE = frozenset({GenerationState.SEALED, GenerationState.VERIFIED, GenerationState.LIVE})
# Attempts per snapshot batch when an engine is unavailable, and the pause between them.
# An evidence check whose optimistic read saw the registry move re-reads, with writers
# held off, only the documents it saw differ (`PointReadback.pairs_of`) while they are at
# most this share of the registry (or `_SETTLE_MINIMUM`); more, and it reads everything.
_SETTLE_SHARE = 0.5
_SETTLE_MINIMUM = 1_000
_LOAD_ATTEMPTS = 3
_LOAD_RETRY_S = 0.5
# A build parks the snapshot records it cannot apply as dead letters of this consumer.
BUILD_CONSUMER = "build"
# The loader looks at the registry every this many batches: an abort by another process
# (the generation is no longer `building`) stops it.
_STATE_POLL_BATCHES = 5
# A running build refreshes its heartbeat at least this often; a build whose heartbeat is
# older than `ORPHANED_AFTER` belongs to a process that is gone.
_HEARTBEAT_S = 5.0
ORPHANED_AFTER = timedelta(minutes=5)

Progress = Callable[[str, int, int], None]
Qualifier = Callable[[GenerationRow, GenerationDescriptor, QualifyRequest], QualificationReceipt]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BuildAborted(OrreryError):
    """The build was cancelled, or its generation left `building` meanwhile."""

    def __init__(self, generation_id: str, reason: str) -> None:
        super().__init__(
            ErrorCode.INVALID_STATE,
            f"build of {generation_id} stopped: {reason}",
            {"generation_id": generation_id, "reason": reason},
        )
        self.reason = reason


@dataclass(slots=True)
class BuildControl:
    """How a running build reports progress and learns that it should stop.

    `progress(phase, done, total)` is called after every batch; `cancelled` is polled
    between batches; `wait(seconds)` sleeps unless cancelled meanwhile.
    """

    progress: Progress = field(default=lambda _phase, _done, _total: None)
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def wait(self, seconds: float) -> None:
        self.cancel_event.wait(seconds)


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """Knobs of the lifecycle (defaults are production values).

    `batch_size`: snapshot documents per load batch; `pause_seconds`: a pause between
    batches that leaves more room to serving (0 = none); `catch_up_timeout_seconds`: how
    long a build waits for the projector; `max_promote_lag`: how many events a
    generation may be behind the log's high water to be promoted;
    `ordered_log`/`coverage_wait_seconds`: whether applied positions are prefixes of the
    log (embedded) or how long coverage checks wait for lagging partitions (Kafka).
    `switch_interval_seconds`: the interpreter's thread switch interval while a build runs
    in a server (None: unchanged). A build is CPU-bound Python; with the default 5 ms a
    query thread waits up to 5 ms at every hand-off between threads, so a shorter
    interval keeps queries closer to their idle latency.
    `load_in_child`: where the deployment can (embedded), bulk-load in a child process
    whose CPU priority is lowered by `child_nice`, so serving keeps the interpreter and
    the CPUs (see `run_build`). `qualification`: what the receipt of a sharded or
    replicated generation must show for it to be promoted (checked at promote time);
    `vector_search`: the query side's search-time settings now (`QuerySettings.
    vector_search`): only a receipt made with the same ones lets a generation be promoted.
    """

    batch_size: int = 1_000
    pause_seconds: float = 0.0
    catch_up_timeout_seconds: float = 600.0
    max_promote_lag: int = 1_000
    ordered_log: bool = True
    coverage_wait_seconds: float = 30.0
    switch_interval_seconds: float | None = None
    load_in_child: bool = True
    child_nice: int = 10
    qualification: QualificationThresholds = field(default_factory=QualificationThresholds)
    vector_search: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BulkLoad:
    """What a bulk load did: the manifest it loaded (every live document of the scope at
    `manifest.high_water`, nothing else), its counters (`written`, `skipped`, `failed`,
    `batches`) and its phases' durations in seconds."""

    manifest: SourceManifest
    counters: dict[str, int]
    durations: dict[str, float]


class BulkLoader(Protocol):
    """Bulk-loads a `building` generation's snapshot outside this process.

    Guarantees: when `load` returns, the generation's engine indexes exist, hold exactly
    the returned manifest's documents, are closed by whoever wrote them (this process may
    open them now) and the registry's document table says the same; nothing but the
    generation's own index directories and registry rows was written. `load` raises
    `OrreryError` when the load failed or `control` was cancelled, and only once the
    loader's process is gone. `heartbeat` is called every few seconds while it waits;
    the lexical index is created with `text_analyzer`.
    """

    def load(
        self,
        descriptor: GenerationDescriptor,
        control: BuildControl,
        heartbeat: Callable[[], None],
        *,
        text_analyzer: str,
    ) -> BulkLoad: ...


@dataclass(frozen=True, slots=True)
class LogHandover:
    """How a generation loaded by a `BulkLoader` catches up with the log here.

    `open_log(p)`: a private reader of the log after position `p` (closed after use);
    `applied_position()`: the position up to which the projector committed its batches
    (stable while the writer lock is held). Needs an ordered log (the embedded outbox).
    """

    open_log: Callable[[int], EventLog]
    applied_position: Callable[[], int]


class DeferredWrites:
    """Generations whose dual writes wait while another process bulk-loads them.

    A qdrant-edge shard directory admits one process and a tantivy index one writer, so
    while a child process writes a new generation the projector must not: `wrap(state)`
    is the projector's `ProjectionState` with deferred generations left out of the write
    targets. Their build replays what they missed from the log before `resume` (under
    the writer lock, so no batch falls between the two). Per process and thread-safe:
    the embedded deployment has one operating process per data directory.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def defer(self, generation_id: str) -> None:
        with self._lock:
            self._ids.add(generation_id)

    def resume(self, generation_id: str) -> None:
        with self._lock:
            self._ids.discard(generation_id)

    def deferred(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._ids)

    def wrap(self, state: ProjectionState) -> ProjectionState:
        return _DeferringState(state, self)


class _DeferringState:
    """A `ProjectionState` whose write targets leave out deferred generations."""

    def __init__(self, inner: ProjectionState, deferred: DeferredWrites) -> None:
        self._inner = inner
        self._deferred = deferred

    def position(self, consumer: str) -> int:
        return self._inner.position(consumer)

    def revisions(self, generation_id: str, document_ids: Sequence[str]) -> dict[str, int]:
        return self._inner.revisions(generation_id, document_ids)

    def commit(
        self,
        consumer: str,
        position: int,
        changes: Mapping[str, Mapping[str, tuple[int, bool]]],
        *,
        held: Collection[str] = (),
        namespaces: Mapping[str, int] | None = None,
        partitions: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        # A deferred generation missed this batch: its position must not claim it.
        self._inner.commit(
            consumer,
            position,
            changes,
            held=frozenset(held) | self._deferred.deferred(),
            namespaces=namespaces,
            partitions=partitions,
        )

    def write_targets(self, namespace: str, snapshot_kind: str) -> list[str]:
        deferred = self._deferred.deferred()
        return [g for g in self._inner.write_targets(namespace, snapshot_kind) if g not in deferred]

    def create_generation(
        self,
        namespace: str,
        snapshot_kind: str,
        *,
        embedder_id: str,
        embedder_dim: int,
        lexical_engine: str,
        vector_engine: str,
        schema_digest: str,
        make_live: bool,
        topology: Callable[[str], Topology] | None = None,
    ) -> GenerationDescriptor:
        return self._inner.create_generation(
            namespace,
            snapshot_kind,
            embedder_id=embedder_id,
            embedder_dim=embedder_dim,
            lexical_engine=lexical_engine,
            vector_engine=vector_engine,
            schema_digest=schema_digest,
            make_live=make_live,
            topology=topology,
        )


@dataclass(frozen=True, slots=True)
class GenerationPorts:
    """Everything the lifecycle use cases need, bound once by `projector.bootstrap`.

    `registry` implements `GenerationRegistry`, `GenerationContents`,
    `GenerationMaintenance`, `EvidenceLog` and `VectorCache` (one SQLite database);
    `lexical` / `vectors` are the engines, read back through `lexical_readback` /
    `vector_readback` (the same objects); `aliases` maps an engine name to its native
    alias mirror (None: the engine has none), `alias_name(engine, namespace, kind)`
    names a scope's alias. `text_languages` picks a new generation's text analyzer by its
    namespace (recorded in its index and schema digest). `drive_log` makes the projector apply
    what is waiting (returns whether it applied anything) — a wake-up of the running
    loop, or one batch run right here when no loop runs.

    With `bulk_loader`, `deferred` and `handover` (the embedded deployment), a build's
    snapshot is loaded by another process (`run_build`); without them, in this one.
    `dead_letters` is the projector's dead-letter box (see `load_snapshot`).
    """

    registry: GenerationRegistry
    contents: GenerationContents
    maintenance: GenerationMaintenance
    evidence_log: EvidenceLog
    cache: VectorCache
    snapshot: CanonicalSnapshot
    lexical: LexicalIndex
    vectors: VectorIndex
    lexical_readback: EngineReadback
    vector_readback: EngineReadback
    lock: WriterLock
    embedder: Embedder
    lexical_engine: str
    vector_engine: str
    schema_digest: str
    topology: Callable[[str], Topology]
    alias_name: Callable[[str, str, str], str]
    aliases: dict[str, AliasMirror | None]
    drive_log: Callable[[], bool] | None = None
    clock: Callable[[], datetime] = _utc_now
    options: GenerationOptions = field(default_factory=GenerationOptions)
    bulk_loader: BulkLoader | None = None
    deferred: DeferredWrites | None = None
    handover: LogHandover | None = None
    text_languages: TextLanguages = field(default_factory=TextLanguages)
    # Sharding and replication of new generations (server mode): `index_shape(namespace,
    # kind)` is `(shards, replicas)`; `index_config` the rest of what the engines are
    # configured with, bound into each generation's schema digest; `receipts` the
    # qualification receipts a spread generation's promote is gated on.
    index_shape: Callable[[str, str], tuple[int, int]] = lambda _ns, _kind: (1, 0)
    index_config: IndexConfig = field(default_factory=IndexConfig)
    spreads: bool = False
    receipts: ReceiptLog | None = None
    # Where a build parks the snapshot records it cannot apply (issue 22), as the
    # projector does; None: such a record fails the build.
    dead_letters: DeadLetterBox | None = None


def config_schema_digest(schema_digest: str, config: IndexConfig) -> str:
    """A generation's schema digest: its schema (engines, embedder, analyzer) and every
    index setting that changes what the indexes return."""
    return sha256_json({"schema": schema_digest, "index_config": config.model_dump(mode="json")})


def build_shape(request: BuildRequest, ports: GenerationPorts) -> tuple[int, int]:
    """The `(shards, replicas)` a build makes: the request's, else the deployment's for
    its scope. `INVALID_REQUEST` for a spread shape on engines that cannot spread."""
    shards, replicas = ports.index_shape(request.namespace, request.snapshot_kind)
    shards = request.shards if request.shards is not None else shards
    replicas = request.replicas if request.replicas is not None else replicas
    if (shards, replicas) != (1, 0) and not ports.spreads:
        raise OrreryError(
            ErrorCode.INVALID_REQUEST,
            f"{ports.lexical_engine} and {ports.vector_engine} keep a generation in one shard "
            f"with one copy: shards={shards}, replicas={replicas} needs server mode",
            {"shards": shards, "replicas": replicas},
        )
    return shards, replicas


# -- evidence -------------------------------------------------------------------------------


# One engine's read-back: its pairs, and each copy's for engines that address copies
# (then the pairs are empty).
Observed = tuple[list[tuple[str, int]], list[CopyRead] | None]


def _read_evidence(
    generation_id: str, ports: GenerationPorts, progress: Progress, pace: Pace = no_pace
) -> tuple[RegistrySnapshot, str, list[EngineEvidence], str]:
    """Registry set and every engine's read-back compared with it, at one moment.

    `pace` is called between chunks of the engine reads and of the comparison, except
    in the re-read that holds writers off (pacing there would hold them off for longer).

    Returns `(registry snapshot, its id_set_digest, per-engine evidence, error)`;
    `error` is set (and the evidence empty) when an engine could not be read. The
    registry digest is computed once and reused for every engine that matches (hashing
    every pair is the costly part of a check).
    """
    readbacks = (
        (ports.lexical_engine, ports.lexical_readback),
        (ports.vector_engine, ports.vector_readback),
    )

    # The registry as read before the engines: an unreadable engine's check reports the
    # facts it started from (a batch committed meanwhile must make it stale, not current).
    before: list[RegistrySnapshot] = []
    # The shard each engine that addresses copies places a document in.
    routes: dict[str, Callable[[str], int]] = {}
    # Every pair list read, freed paced once the check is done (`release`).
    reads: list[list[tuple[str, int]]] = []

    def read(
        pace: Pace = no_pace,
    ) -> tuple[RegistrySnapshot, list[tuple[str, Observed]]]:
        registry = ports.contents.registry_pairs(generation_id)
        before[:] = [registry]
        progress("registry", len(registry.pairs), len(registry.pairs))
        observed: list[tuple[str, Observed]] = []
        for engine, readback in readbacks:
            pace()
            if _copies_of(readback, generation_id):
                spread = cast(CopyReadback, readback)
                copies = spread.copy_pairs(generation_id, pace=pace)
                reads.extend(c.pairs for c in copies if c.pairs is not None)
                routes[engine] = functools.partial(spread.document_shard, generation_id)
                read_count = sum(len(c.pairs or ()) for c in copies)
                progress(engine, read_count, len(registry.pairs))
                observed.append((engine, ([], copies)))
                continue
            pairs = readback.stored_pairs(generation_id, pace=pace)
            reads.append(pairs)
            progress(engine, len(pairs), len(registry.pairs))
            observed.append((engine, (pairs, None)))
        return registry, observed

    def compare(
        registry: RegistrySnapshot,
        observed: list[tuple[str, Observed]],
    ) -> tuple[str, list[EngineEvidence]]:
        # Paced as the reads are (in memory: no writer waits on it); the registry's
        # pairs come in id order, hashed without a sort (`id_set_digest`).
        digest = id_set_digest(registry.pairs.items(), pace=pace)
        out = []
        for engine, (pairs, copies) in observed:
            if copies is not None:
                out.append(copy_evidence(engine, registry.pairs, copies, routes[engine]))
            else:
                diff = diff_pairs(registry.pairs, pairs, expected_digest=digest, pace=pace)
                out.append(engine_evidence(engine, diff))
        return digest, out

    def settle(
        registry: RegistrySnapshot, observed: list[tuple[str, Observed]]
    ) -> tuple[RegistrySnapshot, list[tuple[str, Observed]]] | None:
        """The optimistic read brought to `registry` (read with writers held off) by
        reading again only the documents whose pair it saw differ from `registry`'s
        (written while it ran, or truly divergent), or None when that cannot settle it:
        an engine that addresses copies or cannot read documents by id, a duplicated
        id, a re-read that still differs (a divergence: the full re-read reports it
        exactly), or more to re-read than `_SETTLE_SHARE` of the registry.

        Sound as the full re-read is: every engine write and registry commit happens
        under the writer lock, a batch writes the engines before it commits, and a
        document's revision only grows, so a document whose pair the optimistic read saw
        equal to the registry's now was not written after the engine read it (it would
        have committed a newer revision by now), unless a batch wrote the engine and
        failed before committing — the race the optimistic read accepts already."""
        limit = max(_SETTLE_MINIMUM, int(len(registry.pairs) * _SETTLE_SHARE))
        settled: list[tuple[str, Observed]] = []
        for (engine, (pairs, copies)), (_, readback) in zip(observed, readbacks, strict=True):
            pairs_of = getattr(readback, "pairs_of", None)
            if copies is not None or pairs_of is None:
                return None
            seen = dict(pairs)
            if len(seen) != len(pairs):
                return None
            expected = registry.pairs
            differ = {d for d, r in seen.items() if expected.get(d) != r}
            differ.update(d for d in expected if d not in seen)
            if len(differ) > limit:
                return None
            if differ:
                fresh = pairs_of(generation_id, sorted(differ))
                again = dict(fresh)
                if len(again) != len(fresh) or any(expected.get(d) != again.get(d) for d in differ):
                    return None
                for document_id in differ:
                    seen.pop(document_id, None)
                seen.update(again)
            progress(engine, len(seen), len(expected))
            settled.append((engine, (list(seen.items()), None)))
        return registry, settled

    try:
        registry, observed = read(pace)
        # Compared only when no batch committed meanwhile: else the re-read below decides
        # (hashing every pair of three sets for nothing was most of a check's CPU).
        if ports.contents.commit_seq(generation_id) == registry.commit_seq:
            digest, evidence = compare(registry, observed)
            if all(item.matches for item in evidence):
                return registry, digest, evidence, ""
        # A batch was (or may have been) mid-write: read again with writers held off —
        # first only the documents the optimistic read saw differ from the registry now
        # (`settle`); everything again when that does not settle it.
        with ports.lock.hold():
            settled = settle(ports.contents.registry_pairs(generation_id), observed)
            if settled is None:
                registry, observed = read()
            else:
                registry, observed = settled
        digest, evidence = compare(registry, observed)
        return registry, digest, evidence, ""
    except OrreryError as exc:
        registry = before[0] if before else ports.contents.registry_pairs(generation_id)
        digest = id_set_digest(registry.pairs.items())
        return registry, digest, [], f"cannot read the generation back: {exc.message}"
    finally:
        for pairs in reads:
            release(pairs, pace)


def _copies_of(readback: EngineReadback, generation_id: str) -> bool:
    """Whether `readback` addresses the generation's copies one by one (more than one)."""
    layout = getattr(readback, "copy_layout", None)
    return layout is not None and tuple(layout(generation_id)) != (1, 1)


def copy_evidence(
    engine: str,
    expected: Mapping[str, int],
    copies: Sequence[CopyRead],
    shard_of_document: Callable[[str], int],
) -> EngineEvidence:
    """An engine's evidence from its copies: each copy compared with the registry's pairs
    of its shard (by the engine's own routing, `shard_of_document`); the engine matches
    when every shard has an eligible copy, and its count and digest are then those of one
    eligible copy per shard (the first)."""
    shards = 1 + max(c.shard for c in copies)
    by_shard: list[dict[str, int]] = [{} for _ in range(shards)]
    for document_id, revision in expected.items():
        by_shard[shard_of_document(document_id)][document_id] = revision
    judged: list[CopyEvidence] = []
    chosen: dict[int, list[tuple[str, int]]] = {}
    covered: set[int] = set()
    for copy in sorted(copies, key=lambda c: (c.shard, c.copy_index)):
        if copy.pairs is None:
            judged.append(
                CopyEvidence(
                    shard=copy.shard,
                    copy_index=copy.copy_index,
                    key=copy.key,
                    eligible=False,
                    reason=f"cannot be read: {copy.error}",
                )
            )
            continue
        diff = diff_pairs(by_shard[copy.shard], copy.pairs)
        reason = "" if diff.matches else mismatch_reason([engine_evidence(copy.key, diff)])
        judged.append(
            CopyEvidence(
                shard=copy.shard,
                copy_index=copy.copy_index,
                key=copy.key,
                eligible=diff.matches,
                document_count=diff.count,
                reason=reason,
            )
        )
        if diff.matches and copy.shard not in covered:
            chosen[copy.shard] = copy.pairs
            covered.add(copy.shard)
        elif copy.shard not in chosen:
            chosen[copy.shard] = copy.pairs
    merged = [pair for shard in sorted(chosen) for pair in chosen[shard]]
    overall = engine_evidence(engine, diff_pairs(expected, merged))
    uncovered = [s for s in range(shards) if s not in covered]
    return overall.model_copy(
        update={"matches": overall.matches and not uncovered, "copies": tuple(judged)}
    )


def check_evidence(
    generation_id: str,
    *,
    ports: GenerationPorts,
    progress: Progress | None = None,
    pace: Pace = no_pace,
) -> EvidenceCheck:
    """Read the generation back from every engine and compare with the registry at the
    same position (see the module docstring); record and return the outcome. `pace`:
    see `_read_evidence` (a background check yields to queries through it).

    Never raises for a mismatch or an unreadable engine: that is a failed check. A
    generation that is not sealed, verified or live fails the check by its state.
    """
    started = time.perf_counter()
    _, descriptor = ports.registry.generation(generation_id)
    if descriptor.state not in _CHECKABLE:
        registry = ports.contents.registry_pairs(generation_id)
        check = _check(
            generation_id,
            "eligibility",
            ports,
            (registry, id_set_digest(registry.pairs.items())),
            [],
            None,
            f"generation is {descriptor.state.value}",
            started,
        )
    else:
        registry, digest, evidence, error = _read_evidence(
            generation_id, ports, progress or (lambda *_: None), pace
        )
        check = _check(
            generation_id,
            "eligibility",
            ports,
            (registry, digest),
            evidence,
            None,
            error or mismatch_reason(evidence),
            started,
        )
        release(registry.pairs, pace)
    ports.evidence_log.record_check(check)
    return check


def _check(
    generation_id: str,
    kind: str,
    ports: GenerationPorts,
    expected: tuple[RegistrySnapshot, str],
    evidence: list[EngineEvidence],
    coverage: EngineEvidence | None,
    reason: str,
    started: float,
) -> EvidenceCheck:
    registry, digest = expected
    ok = bool(evidence) and not reason
    return EvidenceCheck.model_validate(
        {
            "generation_id": generation_id,
            "kind": kind,
            "checked_at": ports.clock(),
            "state": registry.state,
            "applied_position": registry.applied_position,
            "commit_seq": registry.commit_seq,
            "expected_count": len(registry.pairs),
            "expected_digest": digest,
            "engines": evidence,
            "coverage": coverage,
            "ok": ok,
            "reason": "" if ok else reason,
            "seconds": round(time.perf_counter() - started, 4),
        }
    )


# Dead letters read per coverage check at most (parked records are rare).
_PARKED_READ = 100_000


def _parked_pairs(
    descriptor: GenerationDescriptor, manifest: SourceManifest | None, ports: GenerationPorts
) -> set[tuple[str, int]]:
    """The scope's `(document_id, revision)` pairs parked as dead letters: those its
    build's manifest lists and those in the dead-letter box now (parked by a build or
    by the projector; a re-drive removes a letter only once it wrote a newer revision)."""
    parked = set(manifest.dead_lettered) if manifest is not None else set()
    if ports.dead_letters is not None:
        parked.update(
            (letter.document_id, letter.revision)
            for letter in ports.dead_letters.dead_letters(
                _PARKED_READ, namespace=descriptor.namespace
            )
            if letter.snapshot_kind == descriptor.snapshot_kind
            and letter.document_id is not None
            and letter.revision is not None
        )
    return parked


def _coverage(
    descriptor: GenerationDescriptor,
    registry: RegistrySnapshot,
    digest: str,
    ports: GenerationPorts,
    manifest: SourceManifest | None = None,
) -> tuple[EngineEvidence, RegistrySnapshot, str]:
    """The registry's set compared with the canonical store's live set at its position;
    with an unordered log, retried (at the registry's then position) while older
    positions may still be on their way. Returns the evidence and the registry snapshot
    (and its digest) it was compared at.

    Canonical pairs parked as dead letters (`_parked_pairs`; `manifest` defaults to the
    generation's own) are not expected — each generation removed them at their revision
    — and are counted in the evidence's `dead_lettered`, never left out silently."""
    deadline = time.monotonic() + (
        0.0 if ports.options.ordered_log else ports.options.coverage_wait_seconds
    )
    parked = _parked_pairs(
        descriptor, manifest if manifest is not None else descriptor.source_manifest, ports
    )
    while True:
        canonical = ports.snapshot.live_pairs_at(
            descriptor.namespace, descriptor.snapshot_kind, registry.applied_position
        )
        expected = [pair for pair in canonical if pair not in parked]
        diff = diff_pairs(registry.pairs, expected, expected_digest=digest)
        if diff.matches or time.monotonic() >= deadline:
            evidence = engine_evidence("canonical", diff).model_copy(
                update={"dead_lettered": len(canonical) - len(expected)}
            )
            return evidence, registry, digest
        time.sleep(0.5)
        registry = ports.contents.registry_pairs(descriptor.generation_id)
        digest = id_set_digest(registry.pairs.items())


def verify_generation(
    generation_id: str, *, ports: GenerationPorts, progress: Progress | None = None
) -> EvidenceCheck:
    """Read the generation back from each engine, compare with its evidence, check its
    coverage of the canonical store; `sealed → verified` on success, `→ failed` (reason
    `verify_failed: …`, with the differing ids in the recorded check) on a mismatch. When
    an engine cannot be read at all the check fails but the state stays (retry later).

    Refuses (`INVALID_STATE`) a generation that is building, failed or retired.
    """
    started = time.perf_counter()
    progress = progress or (lambda *_: None)
    _, descriptor = ports.registry.generation(generation_id)
    if descriptor.state not in _CHECKABLE:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"generation {generation_id} is {descriptor.state.value}; only sealed, verified "
            "and live generations can be verified",
            {"generation_id": generation_id, "state": descriptor.state.value},
        )
    registry, digest, evidence, error = _read_evidence(generation_id, ports, progress)
    coverage, _, _ = _coverage(descriptor, registry, digest, ports)
    progress("coverage", coverage.document_count, len(registry.pairs))
    reasons = [error] if error else []
    mismatch = mismatch_reason([*evidence, coverage])
    if mismatch:
        reasons.append(mismatch)
    if registry.applied_position == descriptor.applied_position and descriptor.id_set_digest:
        expected = (descriptor.document_count, descriptor.id_set_digest)
        if (len(registry.pairs), digest) != expected:
            reasons.append("registry: the document table no longer equals the sealed evidence")
    check = _check(
        generation_id,
        "verify",
        ports,
        (registry, digest),
        evidence,
        coverage,
        "; ".join(reasons),
        started,
    )
    ports.evidence_log.record_check(check)
    _, current = ports.registry.generation(generation_id)
    if check.ok and current.state is GenerationState.SEALED:
        verified = transition(
            current,
            GenerationState.VERIFIED,
            at=check.checked_at,
            position=check.applied_position,
            reason=f"evidence matched in {', '.join(e.engine for e in evidence)} and canonical",
        )
        ports.registry.save_descriptor(verified, expect=frozenset({GenerationState.SEALED}))
    elif not check.ok and not error and current.state in _CHECKABLE:
        # Only evidence fails a generation: an engine that could not be read (`error`)
        # leaves the state alone; the recorded check says why it did not verify.
        failed = transition(
            current,
            GenerationState.FAILED,
            at=check.checked_at,
            position=check.applied_position,
            reason=f"verify_failed: {check.reason}",
        )
        ports.registry.save_descriptor(failed, expect=frozenset({current.state}))
    return check


# -- build ----------------------------------------------------------------------------------


def _loads_elsewhere(request: BuildRequest, ports: GenerationPorts) -> bool:
    """Whether this build's snapshot is loaded by `ports.bulk_loader` (another process).

    Only while the scope has another generation taking writes: with none, the
    projector's next event would create a new first generation instead.
    """
    if ports.bulk_loader is None or ports.deferred is None or ports.handover is None:
        return False
    return any(
        d.state in _CHECKABLE or d.state is GenerationState.BUILDING
        for _, d in ports.registry.generation_rows(request.namespace, request.snapshot_kind)
    )


def _refuse_empty(request: BuildRequest, ports: GenerationPorts) -> None:
    """A scope that never had a generation nor a record (live or deleted) is refused
    unless `allow_empty`: `gen build nosuchns objects` is a typo, not an empty index.
    A scope with generations may be rebuilt whatever it holds now."""
    if request.allow_empty:
        return
    if ports.registry.generation_rows(request.namespace, request.snapshot_kind):
        return
    snapshot = ports.snapshot.snapshot_keys(request.namespace, request.snapshot_kind)
    if snapshot.keys or snapshot.tombstones:
        return
    raise OrreryError(
        ErrorCode.INVALID_STATE,
        f"scope {request.namespace}/{request.snapshot_kind} holds no records and has no "
        "generation: nothing to build (a typo?); allow_empty (--allow-empty) builds an "
        "empty one",
        {"namespace": request.namespace, "snapshot_kind": request.snapshot_kind},
    )


def start_build(request: BuildRequest, *, ports: GenerationPorts) -> GenerationDescriptor:
    """Register a `building` generation and create its engine indexes.

    Under the writer lock, so the projector's first batch that sees the new write target
    finds its indexes in place. From here on the projector dual-writes to it — unless its
    snapshot is loaded by another process: then its writes are deferred (in the same
    lock) and that process creates the indexes.
    """
    _refuse_empty(request, ports)
    shards, replicas = build_shape(request, ports)
    elsewhere = _loads_elsewhere(request, ports)
    text_analyzer = ports.text_languages.analyzer_for(request.namespace)
    config = ports.index_config.model_copy(update={"shards": shards, "replicas": replicas})

    def topology(generation_id: str) -> Topology:
        return ports.topology(generation_id).model_copy(
            update={"shards": shards, "replicas": replicas}
        )

    with ports.lock.hold():
        descriptor = ports.registry.begin_generation(
            request.namespace,
            request.snapshot_kind,
            embedder_id=ports.embedder.embedder_id,
            embedder_dim=ports.embedder.dimension,
            schema_digest=config_schema_digest(
                analyzed_schema_digest(ports.schema_digest, text_analyzer), config
            ),
            topology=topology,
            at=ports.clock(),
        )
        crash_point("build.generation_registered")
        if elsewhere:
            assert ports.deferred is not None
            ports.deferred.defer(descriptor.generation_id)
        else:
            try:
                ports.lexical.create(
                    descriptor.generation_id,
                    text_analyzer=text_analyzer,
                    shards=shards,
                    replicas=replicas,
                )
                ports.vectors.create(
                    descriptor.generation_id,
                    ports.embedder.dimension,
                    shards=shards,
                    replicas=replicas,
                )
            except OrreryError as exc:
                _fail(descriptor.generation_id, f"cannot create indexes: {exc.message}", ports)
                raise
    log.info(
        "build of %s started%s",
        descriptor.generation_id,
        " (bulk load in a child process)" if elsewhere else "",
    )
    return descriptor


def load_snapshot(
    descriptor: GenerationDescriptor, *, ports: GenerationPorts, control: BuildControl
) -> BulkLoad:
    """Load the scope's canonical snapshot into a `building` generation, in batches.

    The snapshot is the scope's live heads at one high-water position H. Each batch is
    written under the writer lock and only where the generation does not already hold
    the same or a newer revision (a dual write may have got there first, with an upsert
    or a tombstone), so replays and races converge. Vectors come from the records or
    the vector cache (nothing already embedded is embedded again). A record that cannot
    be applied is parked as a dead letter and left out (`_load_batch`); the manifest
    lists it (`SourceManifest.dead_lettered`) and seal's coverage check leaves it out of
    the expected set. Stops with
    `BuildAborted` when cancelled or when the generation left `building`.
    """
    generation_id = descriptor.generation_id
    started = time.perf_counter()
    durations: dict[str, float] = {}
    counters = {"written": 0, "skipped": 0, "failed": 0, "batches": 0, "dead_lettered": 0}
    control.progress("snapshot", 0, 0)
    keys = ports.snapshot.snapshot_keys(descriptor.namespace, descriptor.snapshot_kind)
    guard = PoisonGuard()
    parked: set[tuple[str, int]] = set()
    durations["snapshot"] = time.perf_counter() - started
    mark = time.perf_counter()
    counters["tombstones"] = _record_tombstones(generation_id, keys.tombstones, ports)
    total = len(keys.keys)
    control.progress("load", 0, total)
    for start in range(0, total, ports.options.batch_size):
        _check_running(generation_id, control, ports, counters["batches"])
        chunk = keys.keys[start : start + ports.options.batch_size]
        try:
            written, skipped, dead = _load_batch(generation_id, chunk, ports, guard)
        except OrreryError:
            counters["failed"] += len(chunk)
            raise
        parked.update(dead)
        counters["dead_lettered"] = len(parked)
        counters["written"] += written
        counters["skipped"] += skipped
        counters["batches"] += 1
        ports.maintenance.heartbeat(generation_id)
        control.progress("load", min(start + len(chunk), total), total)
        if ports.options.pause_seconds > 0:
            control.wait(ports.options.pause_seconds)
    durations["load"] = time.perf_counter() - mark
    manifest = SourceManifest(
        namespace=descriptor.namespace,
        snapshot_kind=descriptor.snapshot_kind,
        high_water=keys.high_water,
        document_count=len(keys.keys),
        id_set_digest=id_set_digest(keys.keys),
        dead_lettered=tuple(sorted(parked)),
    )
    return BulkLoad(manifest, counters, durations)


def _record_tombstones(
    generation_id: str, tombstones: Sequence[tuple[str, int]], ports: GenerationPorts
) -> int:
    """Record the snapshot's deletes in the generation before its documents load: an
    upsert of an older revision delivered again later (a dual write racing the load, a
    replay) is then skipped as stale, exactly as in a generation that saw the delete
    event. A document such an upsert already wrote is deleted from the engines too.
    Returns how many tombstones were recorded."""
    recorded = 0
    for start in range(0, len(tombstones), ports.options.batch_size):
        chunk = dict(tombstones[start : start + ports.options.batch_size])
        with ports.lock.hold():
            held = ports.contents.revisions(generation_id, list(chunk))
            newer = {d: r for d, r in chunk.items() if held.get(d, 0) < r}
            present = [(d, r) for d, r in newer.items() if held.get(d, 0) > 0]
            if present:
                ports.lexical.apply(generation_id, [], present)
                ports.vectors.apply(generation_id, [], present)
            if newer:
                ports.contents.record_documents(
                    generation_id, {d: (r, True) for d, r in newer.items()}
                )
        recorded += len(newer)
    return recorded


def run_build(
    descriptor: GenerationDescriptor, *, ports: GenerationPorts, control: BuildControl
) -> GenerationDescriptor:
    """Bulk-load the canonical snapshot into a `building` generation, catch up with the
    log and seal it. Returns the sealed descriptor.

    In this process (`load_snapshot`, the projector dual-writing meanwhile), or — when
    `start_build` deferred the generation's writes — by `ports.bulk_loader` in a child
    process, niced, so that serving keeps this process's interpreter and the CPUs; the
    child also builds the vector index's HNSW graph. Then the hand-over (`_handover`):
    this process opens the loaded indexes, replays the log from the snapshot's
    high-water position (idempotent on `(document_id, revision)`), and under the writer
    lock replays the rest up to the projector's position and lifts the deferral, so
    from the next batch on the projector dual-writes as usual and nothing is lost.
    Either way the generation then reflects every event up to H and beyond; `seal`
    freezes its evidence once it caught up with the log.

    On cancellation or any error the generation is marked `failed` (never promotable)
    and the error is raised; a crash leaves it `building` until the next start marks it
    failed (a child process exits when its parent does).
    """
    generation_id = descriptor.generation_id
    started = time.perf_counter()
    elsewhere = ports.deferred is not None and generation_id in ports.deferred.deferred()
    try:
        if elsewhere:
            assert ports.bulk_loader is not None
            try:
                loaded = ports.bulk_loader.load(
                    descriptor,
                    control,
                    lambda: ports.maintenance.heartbeat(generation_id),
                    text_analyzer=ports.text_languages.analyzer_for(descriptor.namespace),
                )
            except OrreryError as exc:
                if control.cancelled():
                    raise BuildAborted(generation_id, "cancelled") from exc
                raise
        else:
            loaded = load_snapshot(descriptor, ports=ports, control=control)
            ports.contents.mark_applied(generation_id, loaded.manifest.high_water)
        manifest, counters = loaded.manifest, dict(loaded.counters)
        durations = dict(loaded.durations)
        mark = time.perf_counter()
        control.progress("catch_up", 0, 1)
        if elsewhere:
            _handover(generation_id, manifest.high_water, control, ports)
        _catch_up(generation_id, ports.snapshot.high_water(), control, ports)
        control.progress("catch_up", 1, 1)
        durations["catch_up"] = time.perf_counter() - mark
        mark = time.perf_counter()
        control.progress("seal", 0, 1)
        sealed = _seal(generation_id, manifest, counters, durations, mark, started, ports)
        control.progress("seal", 1, 1)
        log.info(
            "sealed %s: %d documents at position %d (%d written, %d skipped) in %.1fs",
            generation_id,
            sealed.document_count,
            sealed.applied_position,
            counters["written"],
            counters["skipped"],
            time.perf_counter() - started,
        )
        return sealed
    except BaseException as exc:
        reason = exc.reason if isinstance(exc, BuildAborted) else _describe(exc)
        prefix = "aborted" if isinstance(exc, BuildAborted) else "build failed"
        _fail(generation_id, f"{prefix}: {reason}", ports)
        raise
    finally:
        if elsewhere:
            # Failed (no write target any more) or handed over (already resumed).
            assert ports.deferred is not None
            ports.deferred.resume(generation_id)


# The hand-over replays without the writer lock this many rounds at most, and stops
# early once at most `_HANDOVER_SLACK` events are left for the round under the lock.
_HANDOVER_ROUNDS = 3
_HANDOVER_SLACK = 256


def _handover(
    generation_id: str, high_water: int, control: BuildControl, ports: GenerationPorts
) -> int:
    """Bring a generation loaded elsewhere from `high_water` up to the projector's
    position and lift its deferral (see `run_build`); returns that position."""
    assert ports.handover is not None and ports.deferred is not None
    _, descriptor = ports.registry.generation(generation_id)
    scope = (descriptor.namespace, descriptor.snapshot_kind)
    reader = ports.handover.open_log(high_water)
    try:
        position = high_water
        for _ in range(_HANDOVER_ROUNDS):
            if control.cancelled():
                raise BuildAborted(generation_id, "cancelled")
            position = _replay_log(generation_id, scope, reader, position, ports)
            if ports.handover.applied_position() - position <= _HANDOVER_SLACK:
                break
        with ports.lock.hold():
            _, current = ports.registry.generation(generation_id)
            if current.state is not GenerationState.BUILDING:
                raise BuildAborted(generation_id, f"the generation became {current.state.value}")
            target = ports.handover.applied_position()
            position = _replay_log(generation_id, scope, reader, position, ports, target)
            if position < target:
                # Never claim a position whose events it did not get.
                raise OrreryError(
                    ErrorCode.INTERNAL,
                    f"the log read for {generation_id}'s hand-over ended at {position}, "
                    f"the projector is at {target}",
                    {"generation_id": generation_id},
                )
            ports.contents.mark_applied(generation_id, position)
            ports.deferred.resume(generation_id)
    finally:
        reader.close()
    log.info("%s handed over: replayed the log from %d to %d", generation_id, high_water, target)
    return target


def _replay_log(
    generation_id: str,
    scope: tuple[str, str],
    reader: EventLog,
    position: int,
    ports: GenerationPorts,
    target: int | None = None,
) -> int:
    """Apply the scope's events from `reader` to one generation until `target` (default:
    the projector's position now); returns the position read up to."""
    assert ports.handover is not None
    goal = ports.handover.applied_position() if target is None else target
    while position < goal:
        entries = reader.fetch(ports.options.batch_size)
        if not entries:
            break
        position = max(position, *(e.position or 0 for e in entries))
        # Undecodable messages are the projector's to park (it reads the same log).
        events = [
            e.event
            for e in entries
            if isinstance(e, LogEntry)
            and (e.event.record.namespace, e.event.record.snapshot_kind) == scope
        ]
        if not events:
            continue
        doc_ids = sorted({e.document_id for e in events})
        plan = plan_batch(events, ports.contents.revisions(generation_id, doc_ids))
        if not plan.revisions:
            continue
        # The door check, as in the projector and `_load_batch`: a refused record is
        # parked and removed at its revision (an engine's refusal still fails the build).
        positions = {
            (e.event.document_id, e.event.revision): e.position
            for e in entries
            if isinstance(e, LogEntry)
        }
        rejected: list[RejectedRecord] = []
        upserts, refused = BatchContainment(PoisonGuard(), rejected).admit(
            list(plan.upserts.values()), positions, dimension=ports.embedder.dimension
        )
        vectors, _ = embed_records(upserts, embedder=ports.embedder, cache=ports.cache)
        documents = [to_index_document(r, vectors[r.doc_id]) for r in upserts]
        deletes = sorted({*plan.deletes.items(), *refused})
        ports.lexical.apply(generation_id, documents, deletes)
        ports.vectors.apply(generation_id, documents, deletes)
        if rejected:
            park_rejected(rejected, ports.dead_letters, BUILD_CONSUMER)
        for document_id, revision in refused:
            plan.revisions[document_id] = (revision, True)
        ports.contents.record_documents(generation_id, plan.revisions)
    return position


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, OrreryError) else f"{type(exc).__name__}: {exc}"


def _check_running(
    generation_id: str, control: BuildControl, ports: GenerationPorts, batches: int
) -> None:
    if control.cancelled():
        raise BuildAborted(generation_id, "cancelled")
    if batches % _STATE_POLL_BATCHES == 0:
        _, current = ports.registry.generation(generation_id)
        if current.state is not GenerationState.BUILDING:
            raise BuildAborted(generation_id, f"the generation became {current.state.value}")


def _load_batch(
    generation_id: str,
    keys: Sequence[tuple[str, int]],
    ports: GenerationPorts,
    guard: PoisonGuard,
) -> tuple[int, int, list[tuple[str, int]]]:
    """Write one batch of snapshot records; returns `(written, skipped, dead-lettered
    (document_id, revision) pairs)`.

    Contained like the projector's batches (`projector.service.PoisonGuard`): a record
    the door refuses (`contracts.admission`) or an engine refuses deterministically
    (found by bisecting the batch) is parked as a dead letter (`ports.dead_letters`,
    consumer `build`, named by namespace, kind, document id and revision: it has no log
    position) and recorded in the generation as removed at its revision (a delete in
    both engines and the registry, so a dual write of the same revision is skipped and
    a later one applies); the rest of the batch loads. An engine that takes no write of
    the batch is retried up to `guard.max_attempts` times before its records are
    parked (the engine may be at fault); a transient fault (`DependencyUnavailable`) is
    retried `_LOAD_ATTEMPTS` times, then raised. Without a dead-letter box a refused
    record fails the batch (and the build).
    """
    records: list[Record] = ports.snapshot.records(keys)
    refused_at_door: list[RejectedRecord] = []
    admitted, _ = BatchContainment(guard, refused_at_door).admit(
        records, {}, dimension=ports.embedder.dimension
    )
    vectors, _ = embed_records(admitted, embedder=ports.embedder, cache=ports.cache)
    documents = {r.doc_id: to_index_document(r, vectors[r.doc_id]) for r in admitted}
    upserts = {r.doc_id: r for r in admitted}

    def write(docs: Sequence[IndexDocument], deletes: Sequence[tuple[str, int]]) -> None:
        ports.lexical.apply(generation_id, docs, deletes)
        ports.vectors.apply(generation_id, docs, deletes)

    transient = refusals = 0
    while True:
        refused_by_engine: list[RejectedRecord] = []
        containment = BatchContainment(guard, refused_by_engine)
        try:
            with ports.lock.hold():
                held = ports.contents.revisions(generation_id, [r.doc_id for r in records])
                fresh: list[IndexDocument] = [
                    d for d in documents.values() if held.get(d.document_id, 0) < d.revision
                ]
                refused = containment.write(write, fresh, [], {}, upserts)
                letters = [
                    r
                    for r in [*refused_at_door, *refused_by_engine]
                    if held.get(r.record.doc_id, 0) <= r.record.revision
                ]
                removed = sorted(
                    (r.record.doc_id, r.record.revision)
                    for r in letters
                    if held.get(r.record.doc_id, 0) < r.record.revision
                )
                if removed:
                    # Whatever an engine took of a refused revision leaves again.
                    write([], removed)
                if letters:
                    park_rejected(letters, ports.dead_letters, BUILD_CONSUMER)
                changes = {d.document_id: (d.revision, False) for d in fresh}
                changes.update({d: (r, True) for d, r in removed})
                if changes:
                    ports.contents.record_documents(generation_id, changes)
            parked = sorted({(r.record.doc_id, r.record.revision) for r in letters})
            written = len(fresh) - len(refused)
            return written, len(records) - written - len(removed), parked
        except DependencyUnavailable as exc:
            transient += 1
            if transient == _LOAD_ATTEMPTS:
                raise
            log.warning("snapshot batch of %s failed (%s); retrying", generation_id, exc.message)
            time.sleep(_LOAD_RETRY_S * transient)
        except OrreryError as exc:
            refusals += 1
            if not is_deterministic(exc) or refusals > guard.max_attempts:
                raise
            # The engine took no write of the batch: it may refuse everything (its own
            # fault, not a record's). `guard` counts; its records are parked at the last.
            log.warning("snapshot batch of %s refused (%s); retrying", generation_id, exc.message)
            time.sleep(_LOAD_RETRY_S * refusals)


def _catch_up(
    generation_id: str, target: int, control: BuildControl, ports: GenerationPorts
) -> int:
    """Wait until the generation's applied position reaches `target` (the log's high
    water after the snapshot load), driving the projector meanwhile."""
    deadline = time.monotonic() + ports.options.catch_up_timeout_seconds
    beat = 0.0
    while True:
        if time.monotonic() - beat > _HEARTBEAT_S:
            ports.maintenance.heartbeat(generation_id)
            beat = time.monotonic()
        row, current = ports.registry.generation(generation_id)
        if current.state is not GenerationState.BUILDING:
            raise BuildAborted(generation_id, f"the generation became {current.state.value}")
        if row.applied_position >= target:
            return row.applied_position
        if control.cancelled():
            raise BuildAborted(generation_id, "cancelled")
        if time.monotonic() > deadline:
            raise OrreryError(
                ErrorCode.NOT_CAUGHT_UP,
                f"{generation_id} did not catch up with position {target} within "
                f"{ports.options.catch_up_timeout_seconds:.0f}s (is a projector running?)",
                {"generation_id": generation_id, "applied_position": row.applied_position},
            )
        applied = ports.drive_log() if ports.drive_log is not None else False
        if not applied:
            control.wait(0.05)


def _seal(
    generation_id: str,
    manifest: SourceManifest,
    counters: dict[str, int],
    durations: dict[str, float],
    mark: float,
    started: float,
    ports: GenerationPorts,
) -> GenerationDescriptor:
    """Freeze the expected evidence at the applied position after a coverage check."""
    _, current = ports.registry.generation(generation_id)
    registry = ports.contents.registry_pairs(generation_id)
    coverage, registry, digest = _coverage(
        current, registry, id_set_digest(registry.pairs.items()), ports, manifest
    )
    if not coverage.matches:
        raise OrreryError(
            ErrorCode.INTERNAL,
            f"{generation_id} does not cover the canonical store at position "
            f"{registry.applied_position}: {mismatch_reason([coverage])}",
            {"generation_id": generation_id, "coverage": coverage.model_dump(mode="json")},
        )
    durations["seal"] = time.perf_counter() - mark
    durations["total"] = time.perf_counter() - started
    receipt = BuildReceipt(
        snapshot_documents=manifest.document_count,
        written=counters["written"],
        skipped=counters["skipped"],
        failed=counters["failed"],
        batches=counters["batches"],
        high_water=manifest.high_water,
        caught_up_to=registry.applied_position,
        durations_s={k: round(v, 3) for k, v in durations.items()},
    )
    sealed = transition(
        current,
        GenerationState.SEALED,
        at=ports.clock(),
        position=registry.applied_position,
        reason="snapshot loaded, caught up, coverage matched",
        document_count=len(registry.pairs),
        id_set_digest=digest,
        applied_position=registry.applied_position,
        source_manifest=manifest,
        source_manifest_id=manifest.manifest_id,
        build_receipt=receipt,
        build_receipt_digest=receipt.digest,
    )
    ports.registry.save_descriptor(sealed, expect=frozenset({GenerationState.BUILDING}))
    return sealed


def _fail(generation_id: str, reason: str, ports: GenerationPorts) -> None:
    """Mark a building generation failed; a no-op if it already left `building`."""
    try:
        row, current = ports.registry.generation(generation_id)
        if current.state is not GenerationState.BUILDING:
            return
        failed = transition(
            current,
            GenerationState.FAILED,
            at=ports.clock(),
            position=row.applied_position,
            reason=reason,
        )
        ports.registry.save_descriptor(failed, expect=frozenset({GenerationState.BUILDING}))
        log.warning("%s marked failed: %s", generation_id, reason)
    except OrreryError as exc:
        log.warning("could not mark %s failed: %s", generation_id, exc.message)


# -- promote, rollback, retire, gc --------------------------------------------------------


def _live_of(
    namespace: str, snapshot_kind: str, ports: GenerationPorts
) -> tuple[GenerationRow, GenerationDescriptor] | None:
    for row, descriptor in ports.registry.generation_rows(namespace, snapshot_kind):
        if row.live:
            return row, descriptor
    return None


def _switch(
    action: str,
    row: GenerationRow,
    descriptor: GenerationDescriptor,
    ports: GenerationPorts,
) -> PromoteReport:
    """Refuse unless verified, evidence-clean and caught up; flip the pointer in one
    write; then mirror native aliases."""
    generation_id = descriptor.generation_id
    if descriptor.state is not GenerationState.VERIFIED:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"generation {generation_id} is {descriptor.state.value}; only a verified "
            f"generation can be made live",
            {"generation_id": generation_id, "state": descriptor.state.value},
        )
    latest = ports.evidence_log.latest_checks(generation_id, 1)
    if latest and not latest[0].ok:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"the latest evidence check of {generation_id} failed: {latest[0].reason}",
            {"generation_id": generation_id, "check": latest[0].model_dump(mode="json")},
        )
    receipt_id = _qualified(descriptor, ports) if action == "promote" else None
    lag = max(0, ports.snapshot.high_water() - row.applied_position)
    if lag > ports.options.max_promote_lag:
        raise OrreryError(
            ErrorCode.NOT_CAUGHT_UP,
            f"generation {generation_id} is {lag} events behind the log (at most "
            f"{ports.options.max_promote_lag} allowed)",
            {"generation_id": generation_id, "lag_events": lag},
        )
    at = ports.clock()
    current = _live_of(descriptor.namespace, descriptor.snapshot_kind, ports)
    demoted = None
    previous = None
    if current is not None:
        previous = current[1].generation_id
        if current[1].state is GenerationState.LIVE:
            demoted = transition(
                current[1],
                GenerationState.VERIFIED,
                at=at,
                position=current[0].applied_position,
                reason=f"{action}: {generation_id} became live",
            )
    promoted = transition(
        descriptor,
        GenerationState.LIVE,
        at=at,
        position=row.applied_position,
        reason=action,
    )
    flip_started = time.perf_counter()
    ports.registry.switch_live(promoted, demoted, expected_live=previous, at=at)
    crash_point("promote.switched")
    flip_ms = (time.perf_counter() - flip_started) * 1000.0
    aliases = _mirror_aliases(descriptor, ports)
    log.info(
        "%s: %s/%s now reads %s",
        action,
        descriptor.namespace,
        descriptor.snapshot_kind,
        generation_id,
    )
    return PromoteReport(
        action="promote" if action == "promote" else "rollback",
        namespace=descriptor.namespace,
        snapshot_kind=descriptor.snapshot_kind,
        generation_id=generation_id,
        previous_generation_id=previous,
        switched_at=at,
        flip_ms=round(flip_ms, 3),
        lag_events=lag,
        aliases=aliases,
        receipt_id=receipt_id,
    )


def _qualified(descriptor: GenerationDescriptor, ports: GenerationPorts) -> str | None:
    """The id of the receipt that lets a spread generation be promoted (None: it is one
    shard with one copy and needs none).

    The newest receipt for the generation's *current* descriptor digest, made with the
    search-time settings in force now (`GenerationOptions.vector_search`: a receipt made
    at another HNSW ef measured another search), decides against the thresholds in force
    now: none → `qualification_required`; one that misses a threshold →
    `qualification_failed` naming what it missed.
    """
    if not descriptor.topology.spread:
        return None
    generation_id = descriptor.generation_id
    details: dict[str, object] = {
        "generation_id": generation_id,
        "descriptor_digest": descriptor.descriptor_digest,
        "shards": descriptor.topology.shards,
        "replicas": descriptor.topology.replicas,
    }
    receipts = [] if ports.receipts is None else ports.receipts.receipts(generation_id)
    search = dict(ports.options.vector_search)
    current = [
        r
        for r in receipts
        if r.descriptor_digest == descriptor.descriptor_digest and r.vouches_for(search)
    ]
    if not current:
        raise OrreryError(
            ErrorCode.QUALIFICATION_REQUIRED,
            f"generation {generation_id} has {descriptor.topology.shards} shard(s) and "
            f"{descriptor.topology.replicas} replica(s): qualify it first "
            f"(`orrery gen qualify {generation_id}`)"
            + (": no receipt for its descriptor and search settings" if receipts else ""),
            {**details, "search": search, "stale_receipts": [r.receipt_id for r in receipts]},
        )
    newest = current[0]
    failures = receipt_failures(newest.slices, ports.options.qualification)
    if failures:
        raise OrreryError(
            ErrorCode.QUALIFICATION_FAILED,
            f"the qualification receipt of {generation_id} misses {len(failures)} "
            f"threshold(s): {failures[0]}",
            {**details, "receipt_id": newest.receipt_id, "failures": list(failures)},
        )
    return newest.receipt_id


def _mirror_aliases(descriptor: GenerationDescriptor, ports: GenerationPorts) -> dict[str, str]:
    out: dict[str, str] = {}
    for engine, mirror in ports.aliases.items():
        alias = ports.alias_name(engine, descriptor.namespace, descriptor.snapshot_kind)
        if mirror is None:
            out[engine] = f"skipped: {engine} has no native aliases"
            continue
        try:
            mirror.mirror_alias(alias, descriptor.generation_id)
            out[engine] = f"{alias} -> {descriptor.generation_id}"
        except OrreryError as exc:
            log.warning("mirroring alias %s in %s failed: %s", alias, engine, exc.message)
            out[engine] = f"failed: {exc.message}"
    return out


def mirror_live_aliases(*, ports: GenerationPorts) -> dict[str, dict[str, str]]:
    """Point every scope's native aliases at its live generation again (idempotent).

    A promote flips the registry's pointer first and mirrors the aliases after it; a
    process killed in between leaves the aliases on the old generation. Every role that
    administers generations runs this at start, so outside readers converge on what
    the registry says is live. Returns the outcome per generation and engine.
    """
    out: dict[str, dict[str, str]] = {}
    if not any(mirror is not None for mirror in ports.aliases.values()):
        return out
    for row, descriptor in ports.registry.generation_rows():
        if row.live:
            out[descriptor.generation_id] = _mirror_aliases(descriptor, ports)
    return out


def promote_generation(generation_id: str, *, ports: GenerationPorts) -> PromoteReport:
    """Make a verified generation live (see `_switch`); the old live one becomes
    verified and keeps taking writes, so a rollback can return to it losslessly."""
    row, descriptor = ports.registry.generation(generation_id)
    return _switch("promote", row, descriptor, ports)


def rollback_scope(request: RollbackRequest, *, ports: GenerationPorts) -> PromoteReport:
    """Point the scope back at its previous verified generation (the one most recently
    live, else the newest verified)."""
    rows = ports.registry.generation_rows(request.namespace, request.snapshot_kind)
    live = next((d.generation_id for r, d in rows if r.live), None)
    target = rollback_target([d for _, d in rows], live)
    if target is None:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"{request.namespace}/{request.snapshot_kind} has no verified generation to roll "
            "back to",
            {"namespace": request.namespace, "snapshot_kind": request.snapshot_kind},
        )
    row = next(r for r, d in rows if d.generation_id == target.generation_id)
    return _switch("rollback", row, target, ports)


def retire_generation(generation_id: str, *, ports: GenerationPorts) -> GenerationDescriptor:
    """`sealed | verified | failed → retired`: it stops taking writes; `gc` drops its
    indexes. The live generation and running builds are refused."""
    row, descriptor = ports.registry.generation(generation_id)
    if descriptor.state is GenerationState.LIVE:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"{generation_id} is live: promote another generation or roll back first",
            {"generation_id": generation_id},
        )
    if descriptor.state is GenerationState.BUILDING:
        raise OrreryError(
            ErrorCode.INVALID_STATE,
            f"{generation_id} is building: abort the build first",
            {"generation_id": generation_id},
        )
    retired = transition(
        descriptor,
        GenerationState.RETIRED,
        at=ports.clock(),
        position=row.applied_position,
        reason="retired by operator",
    )
    ports.registry.save_descriptor(retired, expect=frozenset({descriptor.state}))
    return retired


def gc_generations(keep: int, *, ports: GenerationPorts) -> GcReport:
    """Drop the engine indexes of failed generations and of retired ones beyond the
    `keep` newest per scope. Generations that take writes are never touched."""
    rows = ports.registry.generation_rows()
    drop, kept = gc_plan([(d, r.indexes_dropped) for r, d in rows], keep)
    for generation_id in drop:
        with ports.lock.hold():
            ports.lexical.drop(generation_id)
            ports.vectors.drop(generation_id)
            ports.maintenance.mark_indexes_dropped(generation_id)
        log.info("gc: dropped the indexes of %s", generation_id)
    return GcReport(dropped=drop, kept=kept)


# -- running builds -------------------------------------------------------------------------


@dataclass(slots=True)
class _Job:
    generation_id: str
    control: BuildControl
    thread: threading.Thread | None = None
    phase: str = "starting"
    done: int = 0
    total: int = 0
    started: float = field(default_factory=time.monotonic)
    load_started: float | None = None
    error: str | None = None


class BuildJobs:
    """Builds running in this process, one daemon thread each.

    Guarantees: `start` returns once the generation is registered (state `building`,
    indexes created); `abort` cancels a build and waits for it to mark the generation
    failed; `close` aborts every running build.
    """

    def __init__(self, ports: GenerationPorts) -> None:
        self._ports = ports
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._building = 0
        self._saved_interval = sys.getswitchinterval()

    def start(self, request: BuildRequest) -> GenerationDescriptor:
        descriptor = start_build(request, ports=self._ports)
        job = _Job(descriptor.generation_id, BuildControl())
        job.control.progress = _job_progress(job)
        job.thread = threading.Thread(
            target=self._run,
            args=(job, descriptor),
            name=f"orrery-build-{descriptor.generation_id}",
            daemon=True,
        )
        with self._lock:
            self._jobs[descriptor.generation_id] = job
        job.thread.start()
        return descriptor

    def _run(self, job: _Job, descriptor: GenerationDescriptor) -> None:
        try:
            with self._switch_interval():
                run_build(descriptor, ports=self._ports, control=job.control)
            job.phase = "done"
        except BuildAborted as exc:
            job.phase, job.error = "aborted", exc.reason
        except Exception as exc:
            job.phase, job.error = "failed", _describe(exc)
            log.exception("build of %s failed", job.generation_id)

    @contextlib.contextmanager
    def _switch_interval(self) -> Iterator[None]:
        """The configured switch interval while at least one build runs here."""
        wanted = self._ports.options.switch_interval_seconds
        if wanted is None:
            yield
            return
        with self._lock:
            if self._building == 0:
                self._saved_interval = sys.getswitchinterval()
                sys.setswitchinterval(wanted)
            self._building += 1
        try:
            yield
        finally:
            with self._lock:
                self._building -= 1
                if self._building == 0:
                    sys.setswitchinterval(self._saved_interval)

    def progress(self, generation_id: str) -> BuildProgress | None:
        with self._lock:
            job = self._jobs.get(generation_id)
        if job is None:
            return None
        elapsed = time.monotonic() - job.started
        load_elapsed = time.monotonic() - (job.load_started or job.started)
        rate = job.done / load_elapsed if job.phase == "load" and load_elapsed > 0 else 0.0
        return BuildProgress(
            generation_id=generation_id,
            phase=job.phase,
            done=job.done,
            total=job.total,
            rate_per_s=round(rate, 1),
            elapsed_s=round(elapsed, 3),
            error=job.error,
        )

    def running(self, generation_id: str) -> bool:
        with self._lock:
            job = self._jobs.get(generation_id)
        return job is not None and job.thread is not None and job.thread.is_alive()

    def abort(self, generation_id: str, *, timeout: float = 60.0) -> bool:
        """Cancel a build running here; returns False if none runs here."""
        with self._lock:
            job = self._jobs.get(generation_id)
        if job is None or job.thread is None or not job.thread.is_alive():
            return False
        job.control.cancel_event.set()
        job.thread.join(timeout)
        return True

    def close(self, timeout: float = 30.0) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.control.cancel_event.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout)


def _job_progress(job: _Job) -> Progress:
    """A progress callback that records into `job` (the rate is over the load phase)."""

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "load" and job.load_started is None:
            job.load_started = time.monotonic()
        job.phase, job.done, job.total = phase, done, total

    return progress


# -- the facade the CLI and the admin API call --------------------------------------------


@dataclass(slots=True)
class GenerationAdmin:
    """Every operator action over generations, bound to one deployment's ports.

    The admin HTTP API (`projector.entrypoints.admin_http`) and a direct `orrery gen`
    call the same methods; builds started with `start_build` run in this process.
    """

    ports: GenerationPorts
    jobs: BuildJobs = field(init=False)
    # Runs a qualification sample (`orrery.servers` binds the query side's); None: this
    # deployment cannot qualify (it needs no receipts: nothing it builds is spread).
    qualifier: Qualifier | None = None

    def __post_init__(self) -> None:
        self.jobs = BuildJobs(self.ports)

    def rows(
        self, namespace: str | None = None, snapshot_kind: str | None = None
    ) -> list[GenerationRow]:
        return [row for row, _ in self.ports.registry.generation_rows(namespace, snapshot_kind)]

    def view(self, generation_id: str) -> GenerationView:
        row, descriptor = self.ports.registry.generation(generation_id)
        return GenerationView(
            row=row,
            descriptor=descriptor,
            checks=self.ports.evidence_log.latest_checks(generation_id, 5),
            build=self.jobs.progress(generation_id),
            receipts=self.receipts(generation_id),
        )

    def receipts(self, generation_id: str) -> list[QualificationReceipt]:
        """The generation's qualification receipts, newest first."""
        self.ports.registry.generation(generation_id)  # not_found for an unknown id
        return [] if self.ports.receipts is None else self.ports.receipts.receipts(generation_id)

    def live_qualification(self) -> list[dict[str, object]]:
        """Per live generation: its shards and replicas and, when it is spread, its
        newest receipt (`receipt_descriptor_digest` says which descriptor it qualified:
        the promote changed the descriptor's state, so the gate's receipt names the
        verified one) — what readiness shows."""
        out: list[dict[str, object]] = []
        for row, descriptor in self.ports.registry.generation_rows():
            if not row.live:
                continue
            entry: dict[str, object] = {
                "namespace": descriptor.namespace,
                "snapshot_kind": descriptor.snapshot_kind,
                "generation_id": descriptor.generation_id,
                "shards": descriptor.topology.shards,
                "replicas": descriptor.topology.replicas,
                "needs_receipt": descriptor.topology.spread,
            }
            if descriptor.topology.spread and self.ports.receipts is not None:
                receipts = self.ports.receipts.receipts(descriptor.generation_id)
                newest = receipts[0] if receipts else None
                entry["receipt_id"] = None if newest is None else newest.receipt_id
                entry["receipt_passed"] = None if newest is None else newest.passed
                entry["receipt_descriptor_digest"] = (
                    None if newest is None else newest.descriptor_digest
                )
            out.append(entry)
        return out

    def qualify(self, generation_id: str, request: QualifyRequest) -> QualificationReceipt:
        """Run the qualification sample of a generation (`qualifier`, bound by the
        composition root: it needs the query side) and store its receipt."""
        row, descriptor = self.ports.registry.generation(generation_id)
        if descriptor.state not in _CHECKABLE:
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"generation {generation_id} is {descriptor.state.value}; only a sealed, "
                "verified or live generation can be qualified",
                {"generation_id": generation_id, "state": descriptor.state.value},
            )
        if self.qualifier is None or self.ports.receipts is None:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                "this process cannot qualify generations (it runs no query side)",
                {"generation_id": generation_id},
            )
        receipt = self.qualifier(row, descriptor, request)
        self.ports.receipts.record_receipt(receipt)
        return receipt

    def build(self, request: BuildRequest, control: BuildControl) -> GenerationDescriptor:
        """Build in the calling thread (the direct CLI): start, load, catch up, seal."""
        descriptor = start_build(request, ports=self.ports)
        return run_build(descriptor, ports=self.ports, control=control)

    def start_build(self, request: BuildRequest) -> GenerationDescriptor:
        return self.jobs.start(request)

    def abort(self, generation_id: str) -> GenerationDescriptor:
        """Stop a build: cancel it if it runs here, else mark it failed (a builder in
        another process notices within a few batches and stops)."""
        _, descriptor = self.ports.registry.generation(generation_id)
        if descriptor.state is not GenerationState.BUILDING:
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"{generation_id} is {descriptor.state.value}, not building",
                {"generation_id": generation_id, "state": descriptor.state.value},
            )
        if not self.jobs.abort(generation_id):
            _fail(generation_id, "aborted by operator", self.ports)
        _, descriptor = self.ports.registry.generation(generation_id)
        if descriptor.state is GenerationState.BUILDING:
            raise OrreryError(
                ErrorCode.INVALID_STATE,
                f"{generation_id} is still building",
                {"generation_id": generation_id},
            )
        return descriptor

    def verify(self, generation_id: str, progress: Progress | None = None) -> EvidenceCheck:
        return verify_generation(generation_id, ports=self.ports, progress=progress)

    def check(self, generation_id: str, *, pace: Pace = no_pace) -> EvidenceCheck:
        return check_evidence(generation_id, ports=self.ports, pace=pace)

    def promote(self, generation_id: str) -> PromoteReport:
        return promote_generation(generation_id, ports=self.ports)

    def mirror_live_aliases(self) -> dict[str, dict[str, str]]:
        return mirror_live_aliases(ports=self.ports)

    def rollback(self, request: RollbackRequest) -> PromoteReport:
        return rollback_scope(request, ports=self.ports)

    def retire(self, generation_id: str) -> GenerationDescriptor:
        return retire_generation(generation_id, ports=self.ports)

    def gc(self, keep: int) -> GcReport:
        return gc_generations(keep, ports=self.ports)

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]:
        return self.ports.evidence_log.checks_since(sequence)

    def close(self) -> None:
        """Abort builds running here (their generations fail) and close the snapshot."""
        self.jobs.close()
        self.ports.snapshot.close()
