"""Generation descriptors, their lifecycle, the live pointer and completeness evidence.

A generation is one complete projection of a `(namespace, snapshot_kind)` scope into one
lexical and one vector index. Its descriptor names everything needed to compare it:
engines and index names, embedder, schema digest, the canonical snapshot it was built
from, the evidence of what it holds and what the builder did.

A descriptor is content-addressed: `descriptor_digest` is sha256 over the canonical JSON
of every other field, so it is the descriptor's identity and any change (a new state, a
new evidence figure) makes a new descriptor with a new digest. The registry keeps the
newest descriptor of each generation; the state history inside it tells how it got there.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.digests import sha256_json

__all__ = [
    "BuildReceipt",
    "CopyEvidence",
    "CoverageFallback",
    "EngineEvidence",
    "EvidenceCheck",
    "GenerationDescriptor",
    "GenerationState",
    "IndexConfig",
    "LivePointer",
    "SourceManifest",
    "StateChange",
    "Topology",
]


class GenerationState(StrEnum):
    """`building → sealed → verified → live → retired`, and `failed` from any but retired.

    Every state but `retired` and `failed` takes the log's writes (the projector writes
    to all of them), so a sealed or verified generation stays as fresh as the live one
    and a promote or a rollback loses nothing.
    """

    BUILDING = "building"
    SEALED = "sealed"
    VERIFIED = "verified"
    LIVE = "live"
    RETIRED = "retired"
    FAILED = "failed"


class Topology(BaseModel):
    """Where a generation lives: engines and their index (collection, directory) names,
    and how each index is spread: `shards` primaries, each with `replicas` extra copies
    (a generation is built with the deployment's `ORRERY_INDEX_SHARDS` /
    `ORRERY_INDEX_REPLICAS`, per scope overridable; embedded engines are always 1/0).

    Descriptors registered before sharding existed say `replicas: 1` for what was one
    copy; their recorded value is kept (it is part of their digest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lexical_engine: str
    lexical_index: str
    vector_engine: str
    vector_index: str
    shards: int = 1
    replicas: int = 0

    @property
    def spread(self) -> bool:
        """Whether the generation is sharded or replicated (needs a qualification receipt
        to be promoted, `contracts.qualification`)."""
        return self.shards > 1 or self.replicas > 0


class IndexConfig(BaseModel):
    """Every setting of a generation's indexes that changes what they return.

    Bound into the generation's `schema_digest` (with the embedder and the text
    analyzer), so two generations answer alike only if their digests say so: a change
    of any of these is a new generation (build, qualify, promote), never an in-place edit.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    shards: int = Field(default=1, ge=1)
    replicas: int = Field(default=0, ge=0)
    lexical_similarity: str = "BM25"
    vector_distance: str = "cosine"
    hnsw_m: int = 16
    hnsw_ef_construct: int = 100
    quantization: str = "none"
    payload_index_policy: tuple[str, ...] = ()

    def digest(self) -> str:
        return sha256_json(self.model_dump(mode="json"))


class SourceManifest(BaseModel):
    """The canonical snapshot a generation was built from.

    `high_water` is the log position the snapshot reflects; `document_count` and
    `id_set_digest` describe the canonical store's live documents of the scope at that
    position (sha256 over sorted `(document_id, revision)`). `dead_lettered`: the
    `(document_id, revision)` pairs of the snapshot the build could not apply (refused
    at the door or by an engine, deterministically) and parked as dead letters instead:
    the generation does not hold them, and its coverage check leaves them out (sorted).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    snapshot_kind: str
    high_water: int
    document_count: int
    id_set_digest: str
    dead_lettered: tuple[tuple[str, int], ...] = ()

    @property
    def manifest_id(self) -> str:
        """The manifest's digest: its identity (a manifest without dead letters has the
        identity it had before the field existed)."""
        exclude = None if self.dead_lettered else {"dead_lettered"}
        return sha256_json(self.model_dump(mode="json", exclude=exclude))


class BuildReceipt(BaseModel):
    """What the builder did.

    `written`: snapshot documents written to both engines; `skipped`: snapshot documents
    the generation already held at the same or a newer revision (the dual write got
    there first); `failed`: documents that could not be written (a build with failures
    never seals). `durations_s` has `snapshot`, `load`, `catch_up`, `seal`, `total`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    snapshot_documents: int
    written: int
    skipped: int
    failed: int
    batches: int
    high_water: int
    caught_up_to: int
    durations_s: dict[str, float] = Field(default_factory=dict)

    @property
    def digest(self) -> str:
        return sha256_json(self.model_dump(mode="json"))


class StateChange(BaseModel):
    """One entry of a generation's state history."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: GenerationState
    at: datetime
    position: int = 0
    reason: str = ""


class GenerationDescriptor(BaseModel):
    """What a generation is, what it was built from, and what it holds as of a position.

    `document_count` and `id_set_digest` are the expected evidence as of
    `applied_position`: frozen when the generation is sealed (from the registry's
    per-generation document table, after the coverage check against the canonical
    store). A generation keeps taking the log's writes after that, so evidence read back
    later is compared with the registry at the position it is read at (see
    `projector.generations`). `source_manifest` and `build_receipt` are absent for a
    scope's first generation, which the projector creates live from the log itself.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    generation_id: str
    namespace: str
    snapshot_kind: str
    state: GenerationState
    created_at: datetime
    embedder_id: str
    embedder_dim: int
    topology: Topology
    schema_digest: str
    document_count: int = 0
    id_set_digest: str = ""
    applied_position: int = 0
    profile: str = Field(default="weighted@1")
    source_manifest: SourceManifest | None = None
    source_manifest_id: str = ""
    build_receipt: BuildReceipt | None = None
    build_receipt_digest: str = ""
    history: tuple[StateChange, ...] = ()
    descriptor_digest: str = ""

    def computed_digest(self) -> str:
        """sha256 over the canonical JSON of every field but `descriptor_digest`."""
        return sha256_json(self.model_dump(mode="json", exclude={"descriptor_digest"}))

    def with_digest(self) -> GenerationDescriptor:
        """This descriptor with `descriptor_digest` set to its content digest."""
        return self.model_copy(update={"descriptor_digest": self.computed_digest()})

    def digest_is_valid(self) -> bool:
        return bool(self.descriptor_digest) and self.descriptor_digest == self.computed_digest()


class LivePointer(BaseModel):
    """The one record that routes a scope to a generation. Switched atomically."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    snapshot_kind: str
    generation_id: str
    switched_at: datetime


class CopyEvidence(BaseModel):
    """One copy of one shard read back and compared with the registry's pairs of that
    shard (`contracts.shards.shard_of`) at the check's position. `eligible`: it holds
    exactly those pairs; `reason` says how it differs (or that it could not be read)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shard: int
    copy_index: int
    key: str
    eligible: bool
    document_count: int = 0
    reason: str = ""


class EngineEvidence(BaseModel):
    """One engine's read-back of a generation compared with the expected document set.

    `missing`: expected but absent; `unexpected`: present but not expected; `stale`:
    present at another revision; `duplicates`: ids the engine holds more than once. The
    id lists are bounded samples (sorted); the `*_count` fields are exact. For the
    `canonical` coverage check, `dead_lettered` counts the canonical store's live pairs
    left out of the expected set because they are parked as dead letters (the
    generation removed them at that revision).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    document_count: int
    id_set_digest: str
    matches: bool
    missing_count: int = 0
    unexpected_count: int = 0
    stale_count: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    # Per copy of each shard (engines that address copies; empty for one copy): the
    # engine matches when every shard has an eligible copy, and `document_count` and
    # `id_set_digest` then describe one eligible copy of each shard.
    copies: tuple[CopyEvidence, ...] = ()


class EvidenceCheck(BaseModel):
    """The outcome of reading a generation's evidence back from every engine.

    `expected_*` is what the registry says the generation holds at `applied_position`
    (its descriptor's evidence as of that position), read consistently with the
    engines (no write committed in between). `coverage` compares that set with the
    canonical store's live documents at the same position (`verify` only). `ok` means
    every engine matched (and coverage, when checked, matched too).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    generation_id: str
    kind: Literal["verify", "eligibility"]
    checked_at: datetime
    state: GenerationState
    applied_position: int
    commit_seq: int
    expected_count: int
    expected_digest: str
    engines: tuple[EngineEvidence, ...]
    coverage: EngineEvidence | None = None
    ok: bool
    reason: str = ""
    seconds: float = 0.0


class CoverageFallback(BaseModel):
    """Declared in `query_plan.fallback` when a query was not answered by the live
    generation because it was not eligible, and a configured fallback answered it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Literal["previous_verified"]
    live_generation_id: str
    reason: str
