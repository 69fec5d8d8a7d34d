"""Generation descriptors and the live pointer.

A generation is one complete projection of a `(namespace, snapshot_kind)` scope into one
lexical and one vector index. Its descriptor names everything needed to compare it:
engines and index names, embedder, schema digest, and the evidence of what it holds.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GenerationDescriptor", "GenerationState", "LivePointer", "Topology"]


class GenerationState(StrEnum):
    BUILDING = "building"
    SEALED = "sealed"
    VERIFIED = "verified"
    LIVE = "live"
    RETIRED = "retired"
    FAILED = "failed"


class Topology(BaseModel):
    """Where a generation lives: engines and their index names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lexical_engine: str
    lexical_index: str
    vector_engine: str
    vector_index: str
    shards: int = 1
    replicas: int = 1


class GenerationDescriptor(BaseModel):
    """What a generation is and what it holds as of `applied_position`.

    `document_count` and `id_set_digest` (sha256 over sorted `(document_id, revision)` of
    live documents) are the completeness evidence an engine's read-back must match.
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


class LivePointer(BaseModel):
    """The one record that routes a scope to a generation. Switched atomically."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    snapshot_kind: str
    generation_id: str
    switched_at: datetime
