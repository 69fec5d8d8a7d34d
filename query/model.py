"""Pure query logic: scope refs, and the fusion entry points kept for older callers
(the scope registry lives in `query.scopes`, the fusion math in `query.fusion`, the
profiles in `query.profiles`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from contracts.index import Candidate
from contracts.profiles import DEFAULT_STATUS_BOOSTS
from contracts.topk import Ranking
from query.fusion import FusedCandidate, freshness, fuse, min_max
from query.profiles import BUILTIN_PROFILES, derive_profile
from query.scopes import BUILTIN_SCOPES, ScopeRegistry

__all__ = [
    "BUILTIN_SCOPES",
    "DEFAULT_STATUS_BOOSTS",
    "FusedCandidate",
    "freshness",
    "fuse_weighted",
    "min_max",
    "resolve_scope_ref",
]


def resolve_scope_ref(
    scope_ref: str, namespace: str = "", registry: ScopeRegistry | None = None
) -> str:
    """The snapshot kind a scope ref (pinned or not) reads in `namespace`, or
    `unknown_scope` (built-in refs only unless a registry is given; see `query.scopes`)."""
    return (registry or ScopeRegistry()).target(namespace, scope_ref).snapshot_kind


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
