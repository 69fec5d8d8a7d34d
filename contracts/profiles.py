"""Fusion profiles: named, versioned recipes that turn lexical and vector candidates
into one ranking.

A profile id is `name@version` (`weighted@2`, `rrf@1`). An id means exactly one recipe
forever: a change is a new version. A request may override a profile's weights; the
result is a *derived* profile whose id is the base id plus a stable hash of the
overrides (`weighted@2+w:3f9a1c2b`). Every response names the id it ranked with.

Two kinds:

- `weighted`: each source's scores are normalized (`min_max` or `z_score`) to [0, 1],
  then `score = Σ weight·component / Σ weight` over lexical, vector, freshness
  (exponential decay of `updated_at`) and metadata (`status_boosts`).
- `rrf`: reciprocal rank fusion, `score = Σ weight·(k+1)/(k+rank) / Σ weight` over the
  sources, counting a source only where the candidate's rank in it is within
  `rank_window` (scaled by `k+1` so a first place in every source scores 1.0).

Operators add profiles in `ORRERY_PROFILES` (JSON, or a path to a JSON file) in the
`ProfileSet` format below.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_STATUS_BOOSTS",
    "PROFILE_ID_PATTERN",
    "FusionProfile",
    "ProfileSet",
    "RrfProfile",
    "WeightedProfile",
]

# `name@version`: a lowercase name and a positive integer version.
PROFILE_ID_PATTERN = r"^[a-z][a-z0-9_-]{0,63}@[1-9][0-9]{0,5}$"
_PROFILE_ID = re.compile(PROFILE_ID_PATTERN)

# How much a record's status is worth to the metadata component, in [0, 1].
DEFAULT_STATUS_BOOSTS: dict[str, float] = {
    "active": 1.0,
    "confirmed": 1.0,
    "candidate": 0.6,
    "uncertain": 0.4,
    "superseded": 0.1,
    "archived": 0.1,
}


def _check_profile_id(value: str) -> str:
    if not _PROFILE_ID.fullmatch(value):
        raise ValueError("a profile id is 'name@version', e.g. 'weighted@2' or 'rrf@1'")
    return value


ProfileId = Annotated[str, AfterValidator(_check_profile_id)]
Weight = Annotated[float, Field(ge=0.0, le=100.0)]
Depth = Annotated[int, Field(ge=1, le=10_000)]


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ProfileId = Field(description="name@version; immutable once published")
    description: str = Field(default="", max_length=1_000)
    lexical_depth: Depth | None = Field(
        default=None,
        description="Lexical candidates fetched (at least result_limit); "
        "None = ORRERY_LEXICAL_CANDIDATE_DEPTH / ORRERY_CANDIDATE_DEPTH",
    )
    vector_depth: Depth | None = Field(
        default=None,
        description="Vector candidates fetched (at least result_limit); "
        "None = ORRERY_VECTOR_CANDIDATE_DEPTH / ORRERY_CANDIDATE_DEPTH",
    )
    field_boosts: dict[Literal["title", "body", "tags", "text"], Weight] | None = Field(
        default=None,
        description="BM25 boost per text field, replacing the default (title 2, body 1, "
        "tags 1, text 0) of each field named; 0 leaves a field out. `text` is title, body "
        "and tags in one field (generations with text analyzer v2 and later; on older "
        "ones its boost applies to the three fields)",
    )

    def lexical_boosts(self) -> dict[str, float] | None:
        """`field_boosts` keyed by plain field names (what the lexical port takes)."""
        if self.field_boosts is None:
            return None
        return {str(name): boost for name, boost in self.field_boosts.items()}


class WeightedProfile(_Profile):
    """Weighted sum of normalized components; scores lie in [0, 1].

    `missing` says what a candidate found by one source only gets for the other:
    `zero` (0.0), or `rescore` (its exact score in that source, fetched by id, with the
    normalization taken over the union of both candidate sets).
    """

    kind: Literal["weighted"] = "weighted"
    lexical_weight: Weight = 1.0
    vector_weight: Weight = 1.0
    freshness_weight: Weight = 0.0
    metadata_weight: Weight = 0.0
    normalization: Literal["min_max", "z_score"] = "min_max"
    missing: Literal["zero", "rescore"] = "zero"
    freshness_half_life_days: float | None = Field(
        default=None, gt=0.0, description="None = ORRERY_FRESHNESS_HALF_LIFE_DAYS"
    )
    status_boosts: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: dict(DEFAULT_STATUS_BOOSTS), max_length=256
    )
    other_status_boost: float = Field(default=0.3, ge=0.0, le=1.0)


class RrfProfile(_Profile):
    """Reciprocal rank fusion over the sources' full candidate ranks."""

    kind: Literal["rrf"] = "rrf"
    rrf_k: float = Field(default=60.0, gt=0.0, le=10_000.0)
    lexical_weight: Weight = 1.0
    vector_weight: Weight = 1.0
    rank_window: Depth = Field(
        default=100, description="Ranks beyond this count nothing for that source"
    )


FusionProfile = Annotated[WeightedProfile | RrfProfile, Field(discriminator="kind")]


class ProfileSet(BaseModel):
    """The operator's profiles (`ORRERY_PROFILES`): added to the built-ins, whose ids
    they may not redefine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profiles: list[FusionProfile] = Field(default_factory=list, max_length=1_000)
