"""Pure query logic: scope refs, and the fusion entry points kept for older callers
(the fusion math lives in `query.fusion`, the profiles in `query.profiles`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate
from contracts.profiles import DEFAULT_STATUS_BOOSTS
from contracts.topk import Ranking
from query.fusion import FusedCandidate, freshness, fuse, min_max
from query.profiles import BUILTIN_PROFILES, derive_profile

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


def fuse_weighted(
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    ranking: Ranking,
    now: datetime,
    half_life_days: float = 30.0,
    status_boosts: Mapping[str, float] = DEFAULT_STATUS_BOOSTS,
) -> list[FusedCandidate]:
    """`weighted@1` with `ranking`'s weights applied: min-max normalized lexical and
    vector scores plus freshness and metadata, divided by the sum of weights (scores lie
    in [0, 1]). A candidate found by one source only scores 0 for the other; ties break
    on `document_id` ascending.
    """
    base = next(p for p in BUILTIN_PROFILES if p.id == "weighted@1")
    profile = derive_profile(base, ranking.overrides()).model_copy(
        update={"status_boosts": dict(status_boosts)}
    )
    return fuse(profile, lexical, vector, now=now, half_life_days=half_life_days)
