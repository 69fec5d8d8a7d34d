"""Pure query logic: scope refs, fusion math, freshness and metadata components."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate
from contracts.topk import Ranking

__all__ = [
    "BUILTIN_SCOPES",
    "DEFAULT_STATUS_BOOSTS",
    "FusedCandidate",
    "freshness",
    "fuse_weighted",
    "min_max",
    "resolve_scope_ref",
]

# Scope refs known to every namespace, each naming one snapshot kind's live generation.
BUILTIN_SCOPES: Mapping[str, str] = {
    "longterm:objects:current": "objects",
    "longterm:conflicts:current": "conflicts",
    "longterm:archive:current": "archive",
    "graph:current": "graph",
    "midterm:current": "midterm",
}

# The metadata component: how much a record's status is worth, in [0, 1]. Statuses not
# listed score `OTHER_STATUS_BOOST`.
DEFAULT_STATUS_BOOSTS: Mapping[str, float] = {
    "active": 1.0,
    "confirmed": 1.0,
    "candidate": 0.6,
    "uncertain": 0.4,
    "superseded": 0.1,
    "archived": 0.1,
}
OTHER_STATUS_BOOST = 0.3

PROFILE_ID = "weighted@1"


def resolve_scope_ref(scope_ref: str) -> str:
    """The snapshot kind a scope ref reads, or `unknown_scope`."""
    kind = BUILTIN_SCOPES.get(scope_ref)
    if kind is None:
        raise OrreryError(
            ErrorCode.UNKNOWN_SCOPE,
            f"unknown scope_ref {scope_ref!r}",
            {"scope_ref": scope_ref, "known": sorted(BUILTIN_SCOPES)},
        )
    return kind


def min_max(scores: Mapping[str, float]) -> dict[str, float]:
    """Scale scores to [0, 1]; a single distinct value scales to 1.0."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high - low <= 1e-12:
        return dict.fromkeys(scores, 1.0)
    return {key: (value - low) / (high - low) for key, value in scores.items()}


def freshness(updated_at: datetime, now: datetime, half_life_days: float) -> float:
    """Exponential decay: 1.0 now, 0.5 after one half-life; future times count as now."""
    age_days = max(0.0, (now - updated_at).total_seconds() / 86_400.0)
    return math.exp(-math.log(2.0) * age_days / half_life_days)


@dataclass(frozen=True, slots=True)
class FusedCandidate:
    document_id: str
    revision: int
    score: float
    lexical: float
    vector: float
    freshness: float
    metadata: float


def fuse_weighted(
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    ranking: Ranking,
    now: datetime,
    half_life_days: float = 30.0,
    status_boosts: Mapping[str, float] = DEFAULT_STATUS_BOOSTS,
) -> list[FusedCandidate]:
    """Weighted sum of min-max normalized lexical and vector scores plus freshness and
    metadata, divided by the sum of weights (so scores lie in [0, 1]).

    A candidate found by one source only scores 0 for the other. Ties break on
    `document_id` ascending, so the order is deterministic.
    """
    weights = (
        ranking.lexical_weight,
        ranking.vector_weight,
        ranking.freshness_weight,
        ranking.metadata_weight,
    )
    total = sum(weights)
    if total <= 0.0:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "at least one ranking weight must be positive")
    lex = min_max({c.document_id: c.score for c in lexical})
    vec = min_max({c.document_id: c.score for c in vector})
    seen: dict[str, Candidate] = {}
    for candidate in (*lexical, *vector):
        held = seen.get(candidate.document_id)
        if held is None or candidate.revision > held.revision:
            seen[candidate.document_id] = candidate
    fused: list[FusedCandidate] = []
    for doc_id, candidate in seen.items():
        parts = (
            lex.get(doc_id, 0.0),
            vec.get(doc_id, 0.0),
            freshness(candidate.updated_at, now, half_life_days),
            status_boosts.get(candidate.status, OTHER_STATUS_BOOST),
        )
        score = sum(w * p for w, p in zip(weights, parts, strict=True)) / total
        fused.append(FusedCandidate(doc_id, candidate.revision, score, *parts))
    fused.sort(key=lambda f: (-f.score, f.document_id))
    return fused
