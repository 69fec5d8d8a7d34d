"""Qualification receipts: the evidence that a sharded or replicated generation answers
what one exact index would.

A receipt compares a generation's production search path with a global reference (a
1-shard BM25 copy of the same index with the same mapping; exact vector search) over a
sample of queries, per slice (unfiltered, tenant, status + visibility, phrase plan):

- per source, candidate inclusion *before* fusion: |candidates ∩ reference top-D| /
  |reference top-D| at the source's cap D (a document a shard-local cap dropped cannot
  be brought back by anything after it);
- per profile, top-k overlap (|production top-k ∩ reference top-k| / |reference top-k|)
  and order agreement (the share of reference ranks holding the same document in the
  production answer: 1.0 only for the same ids in the same order), over every query and
  over the *complete* ones, whose every source's candidates held the reference's whole
  top D (inclusion 1.0). An approximate source (HNSW) that misses one candidate changes
  the pool fusion ranks: under `rrf` every later candidate of that source moves up a rank,
  under `weighted` with re-score the candidate that took its place (from just past rank
  D) can outscore the reference's tenth — so a query HNSW left incomplete may disagree in
  order however right the fusion is. By default order agreement is judged over the
  complete queries (`order_agreement_over`), the incomplete ones by the vector inclusion
  and top-k overlap thresholds (docs/deploy.md).

A receipt holds no query text: the sample is named by its digest. It is immutable and
content-addressed: `receipt_id` is sha256 over the canonical JSON of every other field
(`contracts.digests`). It binds the generation's descriptor digest: a generation whose
descriptor changed needs a new receipt. It also records the search-time settings that
change what the production path returns (`search`: the vector search's HNSW `ef` rule and
the `ef` it ran with at the receipt's cap); a receipt vouches only for the settings it
was made with (`vouches_for`), so changing them needs a new receipt too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contracts.digests import sha256_json
from contracts.wire import JsonInt

__all__ = [
    "SLICES",
    "ProfileFigures",
    "QualificationReceipt",
    "QualificationThresholds",
    "QualifyRequest",
    "ReceiptList",
    "SliceFigures",
    "SourceFigures",
    "receipt_failures",
]

# The slices every sample is spread over, in this order (round robin).
SLICES: tuple[str, ...] = ("unfiltered", "tenant", "status_visibility", "phrase")


class QualifyRequest(BaseModel):
    """`POST /v1/admin/generations/{id}/qualify`: the sample to run.

    `queries`: query texts to use instead of a sample of document titles (each is run in
    the slice its position picks, round robin); `sample_size`: how many titles to sample
    (None: the deployment's `ORRERY_QUALIFY_QUERIES`).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    queries: list[str] | None = Field(default=None, min_length=1, max_length=10_000)
    sample_size: JsonInt | None = Field(
        default=None, ge=1, le=10_000, json_schema_extra={"minimum": 1, "maximum": 10_000}
    )


class QualificationThresholds(BaseModel):
    """What a passing receipt needs (settings `ORRERY_QUALIFY_*`).

    `order_agreement_over`: the queries order agreement is judged over — `complete`
    (those whose every source's candidates held the reference's top D; the default of
    the settings) or `all` (receipts made before session 15 were judged so)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lexical_inclusion: float = 1.0
    order_agreement: float = 1.0
    order_agreement_over: Literal["all", "complete"] = "all"
    vector_inclusion_mean: float = 0.99
    vector_inclusion_min: float = 0.95
    overlap_mean: float = 0.99


class SourceFigures(BaseModel):
    """Candidate inclusion of one source over one slice (None: the slice ran no query
    that searched this source)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cap: int
    queries: int
    inclusion_mean: float | None = None
    inclusion_min: float | None = None


class ProfileFigures(BaseModel):
    """Top-k agreement of one profile over one slice; `score_max_rel_diff` is the largest
    relative difference of the score of a document both answers rank;
    `complete_queries` / `complete_order_agreement_min`: how many queries had every
    source's candidates include the reference's whole top D, and the least order
    agreement among them (None: none had, or the receipt predates the figure)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queries: int
    overlap_mean: float | None = None
    overlap_min: float | None = None
    order_agreement_mean: float | None = None
    order_agreement_min: float | None = None
    score_max_rel_diff: float = 0.0
    complete_queries: int | None = None
    complete_order_agreement_min: float | None = None


class SliceFigures(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slice: str
    queries: int
    skipped: str = ""
    sources: dict[str, SourceFigures] = Field(default_factory=dict)
    profiles: dict[str, ProfileFigures] = Field(default_factory=dict)


class QualificationReceipt(BaseModel):
    """One qualification run of one generation (see the module docstring).

    `caps`: candidates per source (`lexical`, `vector`) and `top_k`; `profiles`: each
    qualified profile id with the digest of its recipe; `rrf_k`: the RRF constant of
    each `rrf` profile; `method`: how production and reference searched (the lexical
    search type, the reference's shape); `search`: the search-time settings the production
    path ran with (`vector_hnsw_ef`, `vector_spread_ef_factor`) and `vector_ef`, the HNSW
    ef each shard key was searched with at the vector cap; `position`: the generation's
    applied position when the sample ran; `failures`: which thresholds were missed
    (empty = `passed`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    receipt_id: str = ""
    generation_id: str
    namespace: str
    snapshot_kind: str
    descriptor_digest: str
    position: int
    shards: int
    replicas: int
    caps: dict[str, int]
    profiles: dict[str, str]
    rrf_k: dict[str, int] = Field(default_factory=dict)
    method: dict[str, str] = Field(default_factory=dict)
    search: dict[str, int] = Field(default_factory=dict)
    sample_digest: str
    sample_size: int
    slices: tuple[SliceFigures, ...]
    thresholds: QualificationThresholds
    passed: bool
    failures: tuple[str, ...] = ()
    created_at: datetime
    seconds: float = 0.0

    def computed_id(self) -> str:
        """sha256 over the canonical JSON of every field but `receipt_id`."""
        return sha256_json(self.model_dump(mode="json", exclude={"receipt_id"}))

    def vouches_for(self, search: Mapping[str, int]) -> bool:
        """Whether the receipt was made with these search-time settings (each one of
        `search` recorded with the same value; a receipt without them vouches for none)."""
        return all(self.search.get(name) == value for name, value in search.items())

    def with_id(self) -> QualificationReceipt:
        return self.model_copy(update={"receipt_id": self.computed_id()})

    def id_is_valid(self) -> bool:
        return bool(self.receipt_id) and self.receipt_id == self.computed_id()


class ReceiptList(BaseModel):
    """`GET /v1/admin/generations/{id}/receipts`: newest first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    generation_id: str
    receipts: list[QualificationReceipt]


def receipt_failures(
    slices: tuple[SliceFigures, ...], thresholds: QualificationThresholds
) -> tuple[str, ...]:
    """Which thresholds the figures miss, one line each (empty: the receipt passes).

    Lexical inclusion and order agreement are compared with their threshold at every
    query (the minimum; order agreement over the queries `order_agreement_over` names);
    vector inclusion by mean and minimum; top-k overlap by mean. A sample that ran no
    query at all fails: nothing was shown.
    """
    failures: list[str] = []
    if not any(s.queries for s in slices):
        return ("the sample ran no query",)
    for figures in slices:
        lexical = figures.sources.get("lexical")
        lexical_min = None if lexical is None else lexical.inclusion_min
        if lexical_min is not None and lexical_min < thresholds.lexical_inclusion:
            failures.append(
                f"{figures.slice}: lexical inclusion min {lexical_min:.4f} < "
                f"{thresholds.lexical_inclusion}"
            )
        vector = figures.sources.get("vector")
        if vector is not None and vector.inclusion_mean is not None:
            if vector.inclusion_mean < thresholds.vector_inclusion_mean:
                failures.append(
                    f"{figures.slice}: vector inclusion mean {vector.inclusion_mean:.4f} < "
                    f"{thresholds.vector_inclusion_mean}"
                )
            if vector.inclusion_min is not None and (
                vector.inclusion_min < thresholds.vector_inclusion_min
            ):
                failures.append(
                    f"{figures.slice}: vector inclusion min {vector.inclusion_min:.4f} < "
                    f"{thresholds.vector_inclusion_min}"
                )
        for profile, result in sorted(figures.profiles.items()):
            if result.overlap_mean is not None and result.overlap_mean < thresholds.overlap_mean:
                failures.append(
                    f"{figures.slice}/{profile}: top-k overlap mean {result.overlap_mean:.4f} "
                    f"< {thresholds.overlap_mean}"
                )
            order_min, over = result.order_agreement_min, ""
            if thresholds.order_agreement_over == "complete":
                order_min = result.complete_order_agreement_min
                over = " over complete queries"
            if order_min is not None and order_min < thresholds.order_agreement:
                failures.append(
                    f"{figures.slice}/{profile}: order agreement min{over} "
                    f"{order_min:.4f} < {thresholds.order_agreement}"
                )
    return tuple(failures)
