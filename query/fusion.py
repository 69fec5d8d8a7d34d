"""Pure fusion math: normalizations, the weighted and the reciprocal-rank fusion of
lexical and vector candidates, and the freshness and metadata components.

Every function here is deterministic: equal inputs give equal outputs, and ties break
on `document_id` ascending.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import compress, repeat
from operator import attrgetter
from operator import gt as _gt
from typing import NamedTuple

import numpy as np

from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate
from contracts.profiles import FusionProfile, RrfProfile, WeightedProfile

__all__ = [
    "FusedCandidate",
    "Rescored",
    "competition_ranks",
    "freshness",
    "fuse",
    "fuse_rrf",
    "fuse_top",
    "fuse_weighted_profile",
    "min_max",
    "normalize",
    "z_score",
]

# Spreads closer than this are "constant" (BM25 and cosine scores differ far more).
_FLAT = 1e-12


def min_max(scores: Mapping[str, float]) -> dict[str, float]:
    """Scale scores to [0, 1] (lowest 0, highest 1).

    Fewer than two distinct values (one candidate, or all equal) scale to 1.0: a source
    that found them but cannot tell them apart ranks them all first.
    """
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high - low <= _FLAT:
        return dict.fromkeys(scores, 1.0)
    return {key: (value - low) / (high - low) for key, value in scores.items()}


def z_score(scores: Mapping[str, float]) -> dict[str, float]:
    """Standardize, then map the window `mean ± 3·std` linearly onto [0, 1]; values
    beyond it clip to 0 or 1 (distribution-based score fusion). Unlike min-max, the
    result depends on the whole score distribution, not on its two extremes.

    Fewer than two distinct values scale to 1.0, as with `min_max`.
    """
    if not scores:
        return {}
    values = list(scores.values())
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if std <= _FLAT:
        return dict.fromkeys(scores, 1.0)
    low = mean - 3.0 * std
    return {key: min(1.0, max(0.0, (value - low) / (6.0 * std))) for key, value in scores.items()}


_NORMALIZERS: Mapping[str, Callable[[Mapping[str, float]], dict[str, float]]] = {
    "min_max": min_max,
    "z_score": z_score,
}


def normalize(scores: Mapping[str, float], method: str) -> dict[str, float]:
    """`min_max` or `z_score` of `scores`; each result lies in [0, 1]."""
    return _NORMALIZERS[method](scores)


def freshness(updated_at: datetime, now: datetime, half_life_days: float) -> float:
    """Exponential decay: 1.0 now, 0.5 after one half-life; future times count as now."""
    age_days = max(0.0, (now - updated_at).total_seconds() / 86_400.0)
    return math.exp(-math.log(2.0) * age_days / half_life_days)


def competition_ranks(candidates: Sequence[Candidate]) -> dict[str, int]:
    """1-based ranks in a best-first list; equal scores share the best rank ("1224").

    A document listed twice keeps its first (best) rank.
    """
    ranks: dict[str, int] = {}
    previous: float | None = None
    rank = 0
    for position, candidate in enumerate(candidates, start=1):
        if previous is None or candidate.score != previous:
            rank = position
            previous = candidate.score
        ranks.setdefault(candidate.document_id, rank)
    return ranks


class FusedCandidate(NamedTuple):
    """One fused candidate: its score and the normalized components it came from.

    For `weighted` profiles the components are the normalized lexical and vector scores,
    freshness and the status boost; for `rrf` profiles lexical and vector are the
    scaled reciprocal ranks `(k+1)/(k+rank)` and freshness and metadata are 0.0.

    A named tuple, immutable like the frozen dataclass it was and built in a fifth of
    its time: fusion makes one per candidate of every query.
    """

    document_id: str
    revision: int
    score: float
    lexical: float
    vector: float
    freshness: float
    metadata: float


@dataclass(frozen=True, slots=True)
class Rescored:
    """Exact scores of candidates in the source that did not return them, by document id.

    A document looked up but absent from `lexical` matched no query term (BM25 0.0).
    `looked_up` counts the (document, source) pairs that were looked up.
    """

    lexical: Mapping[str, float] = field(default_factory=dict)
    vector: Mapping[str, float] = field(default_factory=dict)
    looked_up: int = 0


def _union(lexical: Sequence[Candidate], vector: Sequence[Candidate]) -> dict[str, Candidate]:
    """Each document once, at the highest revision either source saw (the first listed,
    lexical before vector, among equal revisions)."""
    # A source lists each document once: both go in as they are (C loops), the vector
    # source's documents after the lexical ones; only a document both list at different
    # revisions needs a look of its own.
    seen: dict[str, Candidate] = dict(zip(map(_BY_ID, lexical), lexical, strict=True))
    rest: Sequence[Candidate] = vector
    if len(seen) != len(lexical):
        seen, rest = {}, (*lexical, *vector)
    else:
        others = dict(zip(map(_BY_ID, vector), vector, strict=True))
        if len(others) == len(vector):
            both = list(seen.keys() & others.keys())
            lexical_held = list(map(seen.__getitem__, both))
            # New keys keep the vector order after the lexical ones; a key both list
            # keeps its lexical place (and candidate, unless the vector's is newer).
            seen.update(others)
            seen.update(zip(both, lexical_held, strict=True))
            newer = map(
                _gt,
                map(_BY_REVISION, map(others.__getitem__, both)),
                map(_BY_REVISION, lexical_held),
            )
            for doc_id in compress(both, newer):
                seen[doc_id] = others[doc_id]
            return seen
    for candidate in rest:
        held = seen.get(candidate.document_id)
        if held is None or candidate.revision > held.revision:
            seen[candidate.document_id] = candidate
    return seen


# A named tuple built from its fields' tuple: half the time of its generated `__new__`
# (one per candidate of every query).
_new = tuple.__new__
_BY_ID = attrgetter("document_id")
_BY_REVISION = attrgetter("revision")
_BY_SCORE = attrgetter("score")
_BY_UPDATED = attrgetter("updated_at")
_BY_STATUS = attrgetter("status")
_TOTAL_SECONDS = timedelta.total_seconds


def _sorted(fused: list[FusedCandidate]) -> list[FusedCandidate]:
    """Best first, ties on `document_id` ascending: two stable sorts (ids, then scores
    descending, which keeps equal scores in id order) instead of a key tuple each."""
    fused.sort(key=_BY_ID)
    fused.sort(key=_BY_SCORE, reverse=True)
    return fused


class _Weighted(NamedTuple):
    """What a weighted fusion computes before its per-candidate loop."""

    weights: tuple[float, float, float, float]
    total: float
    seen: dict[str, Candidate]
    lex: dict[str, float]
    vec: dict[str, float]
    half_life: float


def _weights(profile: WeightedProfile) -> tuple[tuple[float, float, float, float], float]:
    """The profile's four weights and their sum; `INVALID_REQUEST` when every one is 0."""
    weights = (
        profile.lexical_weight,
        profile.vector_weight,
        profile.freshness_weight,
        profile.metadata_weight,
    )
    total = math.fsum(weights)
    if total <= 0.0:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "at least one ranking weight must be positive")
    return weights, total


def _weighted(
    profile: WeightedProfile,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    half_life_days: float,
    rescored: Rescored | None,
) -> _Weighted:
    weights, total = _weights(profile)
    seen = _union(lexical, vector)
    lex_raw = {c.document_id: c.score for c in lexical}
    vec_raw = {c.document_id: c.score for c in vector}
    if profile.missing == "rescore" and rescored is not None:
        if lexical:
            for doc_id in seen.keys() - lex_raw.keys():
                lex_raw[doc_id] = rescored.lexical.get(doc_id, 0.0)
        if vector:
            for doc_id in seen.keys() - vec_raw.keys():
                if doc_id in rescored.vector:
                    vec_raw[doc_id] = rescored.vector[doc_id]
    return _Weighted(
        weights,
        total,
        seen,
        normalize(lex_raw, profile.normalization),
        normalize(vec_raw, profile.normalization),
        profile.freshness_half_life_days or half_life_days,
    )


def _fused(
    profile: WeightedProfile,
    w: _Weighted,
    candidates: Iterable[Candidate],
    now: datetime,
) -> list[FusedCandidate]:
    """`candidates` fused exactly, in their order: `Σ weight·component / Σ weight`."""
    lex, vec, total, half_life = w.lex, w.vec, w.total, w.half_life
    # The same products summed by the same fsum as `Σ weight·component`, unrolled: this
    # loop runs once per candidate of every query.
    lw, vw, fw, mw = w.weights
    boosts, other = profile.status_boosts, profile.other_status_boost
    fsum = math.fsum
    # `freshness` inlined, its arithmetic in the same order (so bit for bit the same).
    exp, neg_ln2 = math.exp, -math.log(2.0)
    fused: list[FusedCandidate] = []
    for candidate in candidates:
        doc_id = candidate.document_id
        lx = lex.get(doc_id, 0.0)
        vx = vec.get(doc_id, 0.0)
        age_days = (now - candidate.updated_at).total_seconds() / 86_400.0
        fresh = exp(neg_ln2 * (age_days if age_days > 0.0 else 0.0) / half_life)
        meta = boosts.get(candidate.status, other)
        score = fsum((lw * lx, vw * vx, fw * fresh, mw * meta)) / total
        fused.append(_new(FusedCandidate, (doc_id, candidate.revision, score, lx, vx, fresh, meta)))
    return fused


def fuse_weighted_profile(
    profile: WeightedProfile,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    now: datetime,
    half_life_days: float,
    rescored: Rescored | None = None,
) -> list[FusedCandidate]:
    """`Σ weight·component / Σ weight` over lexical, vector, freshness and metadata;
    every score lies in [0, 1]. Best first, ties on `document_id` ascending.

    Each source's scores are normalized over the candidates it returned; with
    `missing="rescore"` and `rescored` given, a source's scores are first completed with
    the exact scores of the other source's candidates and normalized over the union.
    A candidate with no score from a source gets 0.0 for it. `half_life_days` applies
    when the profile names none. Raises `INVALID_REQUEST` when every weight is zero.
    """
    w = _weighted(profile, lexical, vector, half_life_days, rescored)
    return _sorted(_fused(profile, w, w.seen.values(), now))


# An upper bound, with a wide margin, on how far a fused score summed in plain float64
# arithmetic (numpy's `exp`, no `fsum`) can lie from the exact one: every component and
# weight share lies in [0, 1], so the difference is a few ulps of 1.0 (~1e-15).
_APPROX_SLACK = 1e-9


def _source_array(
    ids: Sequence[str],
    found: Mapping[str, float],
    looked_up: Mapping[str, float] | None,
    absent: float,
) -> np.ndarray:
    """Each id's raw score from `found`, else from `looked_up` (re-scored), else
    `absent` (NaN: the candidate does not take part in the normalization)."""
    # `dict.get` mapped over the ids (a C loop, no generator frame per id); the found
    # scores override the looked-up ones in the merged dict, as `found` comes first.
    scores = found if looked_up is None else {**looked_up, **found}
    return np.fromiter(map(scores.get, ids, repeat(absent, len(ids))), np.float64, len(ids))


def _min_max_array(raw: np.ndarray) -> np.ndarray:
    """`min_max` over the present (non-NaN) values, 0.0 for the absent: the same float
    arithmetic per value as `min_max`, so the same results bit for bit."""
    if not np.isnan(raw).any():
        # Every candidate present: the same arithmetic on the whole array.
        low, high = float(raw.min()), float(raw.max())
        if high - low <= _FLAT:
            return np.ones_like(raw)
        return (raw - low) / (high - low)
    present = ~np.isnan(raw)
    if not present.any():
        return np.zeros_like(raw)
    values = raw[present]
    low, high = float(values.min()), float(values.max())
    out = np.zeros_like(raw)
    out[present] = 1.0 if high - low <= _FLAT else (values - low) / (high - low)
    return out


def _top_weighted(
    profile: WeightedProfile,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    limit: int,
    now: datetime,
    half_life_days: float,
    rescored: Rescored | None,
) -> tuple[list[FusedCandidate], int]:
    seen = _union(lexical, vector)
    count = len(seen)
    if count <= 2 * limit + 8 or profile.normalization != "min_max":
        w = _weighted(profile, lexical, vector, half_life_days, rescored)
        return _sorted(_fused(profile, w, seen.values(), now))[:limit], count
    weights, total = _weights(profile)
    ids = list(seen)
    candidates = list(seen.values())
    nan = math.nan
    lex_found = dict(zip(map(_BY_ID, lexical), map(_BY_SCORE, lexical), strict=True))
    vec_found = dict(zip(map(_BY_ID, vector), map(_BY_SCORE, vector), strict=True))
    # As `_weighted`: re-scored, a source that returned candidates has a lexical score
    # for every candidate (0.0: no term matched) and a vector score for those found.
    rescore = rescored if profile.missing == "rescore" else None
    lex_looked = None if rescore is None or not lexical else rescore.lexical
    vec_looked = None if rescore is None or not vector else rescore.vector
    lex_raw = _source_array(ids, lex_found, lex_looked, nan if lex_looked is None else 0.0)
    vec_raw = _source_array(ids, vec_found, vec_looked, nan)
    lex, vec = _min_max_array(lex_raw), _min_max_array(vec_raw)
    half_life = profile.freshness_half_life_days or half_life_days
    boosts, other = profile.status_boosts, profile.other_status_boost
    meta = np.fromiter(
        map(boosts.get, map(_BY_STATUS, candidates), repeat(other, count)), np.float64, count
    )
    lw, vw, fw, mw = weights
    # Without freshness a score lies within the slack of `partial`, and freshness adds
    # between 0 and `fw / total` (it lies in [0, 1] for a positive half-life; weights are
    # >= 0). A candidate whose highest possible score is below the `limit`-th lowest
    # possible one is below `limit` others for sure: only the others need an age (~1 in
    # 6 of the candidates at 100k).
    partial = lw * lex + vw * vec + mw * meta
    partial /= total
    if half_life > 0.0:
        low = np.partition(partial, count - limit)[count - limit]
        kept = np.flatnonzero(partial >= low - fw / total - 2.0 * _APPROX_SLACK)
    else:  # no bound on freshness: every candidate is aged
        kept = np.arange(count)
    held = [candidates[i] for i in kept.tolist()]
    # Each age as `freshness` computes it, `(now - stamp).total_seconds()` in days: C
    # loops over the candidates (`map`), no generator frame per candidate.
    seconds = map(_TOTAL_SECONDS, map(now.__sub__, map(_BY_UPDATED, held)))
    age = np.maximum(np.fromiter(seconds, np.float64, len(held)) / 86_400.0, 0.0)
    approx = partial[kept] + fw * np.exp(-math.log(2.0) * age / half_life) / total
    # Every candidate the exact order could put in the top `limit` (all of them are
    # kept): the true `limit`-th score is within the slack of the approximate one, and
    # so is each true score.
    kth = np.partition(approx, approx.size - limit)[approx.size - limit]
    near = kept[np.flatnonzero(approx >= kth - 2.0 * _APPROX_SLACK)]
    w = _Weighted(
        weights,
        total,
        seen,
        dict(zip([ids[i] for i in near.tolist()], lex[near].tolist(), strict=True)),
        dict(zip([ids[i] for i in near.tolist()], vec[near].tolist(), strict=True)),
        half_life,
    )
    return _sorted(_fused(profile, w, [candidates[i] for i in near.tolist()], now))[:limit], count


def fuse_top(
    profile: FusionProfile,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    limit: int,
    now: datetime,
    half_life_days: float,
    rescored: Rescored | None = None,
) -> tuple[list[FusedCandidate], int]:
    """`fuse(...)[:limit]` and `len(fuse(...))`, equal to them bit for bit, without
    fusing every candidate exactly: a weighted profile scores all candidates at once in
    float64 arrays, without freshness first (ageing only those that freshness could lift
    into the top `limit`), then fuses exactly only those within a bound
    (`_APPROX_SLACK`) of the approximate `limit`-th score. For an answer that needs only
    its top `limit` (no cursor, no phrase report over every candidate)."""
    if isinstance(profile, RrfProfile) or limit <= 0:
        fused = fuse(profile, lexical, vector, now=now, half_life_days=half_life_days)
        return fused[: max(limit, 0)], len(fused)
    return _top_weighted(
        profile,
        lexical,
        vector,
        limit=limit,
        now=now,
        half_life_days=half_life_days,
        rescored=rescored,
    )


def fuse_rrf(
    profile: RrfProfile, lexical: Sequence[Candidate], vector: Sequence[Candidate]
) -> list[FusedCandidate]:
    """Reciprocal rank fusion over the sources' full ranks (`competition_ranks`).

    A source adds `weight·(k+1)/(k+rank)` where the candidate's rank in it is at most
    `rank_window`, nothing otherwise; the sum is divided by the sum of the weights, so a
    candidate first in every weighted source scores 1.0 and every score lies in [0, 1].
    Best first, ties on `document_id` ascending. Raises `INVALID_REQUEST` when both
    weights are zero.
    """
    k = profile.rrf_k
    total = profile.lexical_weight + profile.vector_weight
    if total <= 0.0:
        raise OrreryError(ErrorCode.INVALID_REQUEST, "at least one ranking weight must be positive")
    lex_ranks = competition_ranks(lexical)
    vec_ranks = competition_ranks(vector)

    def reciprocal(rank: int | None) -> float:
        if rank is None or rank > profile.rank_window:
            return 0.0
        return (k + 1.0) / (k + rank)

    fused: list[FusedCandidate] = []
    for doc_id, candidate in _union(lexical, vector).items():
        lex = reciprocal(lex_ranks.get(doc_id))
        vec = reciprocal(vec_ranks.get(doc_id))
        score = (profile.lexical_weight * lex + profile.vector_weight * vec) / total
        fused.append(_new(FusedCandidate, (doc_id, candidate.revision, score, lex, vec, 0.0, 0.0)))
    return _sorted(fused)


def fuse(
    profile: FusionProfile,
    lexical: Sequence[Candidate],
    vector: Sequence[Candidate],
    *,
    now: datetime,
    half_life_days: float,
    rescored: Rescored | None = None,
) -> list[FusedCandidate]:
    """Fuse with whichever kind `profile` is (see `fuse_weighted_profile`, `fuse_rrf`)."""
    if isinstance(profile, RrfProfile):
        return fuse_rrf(profile, lexical, vector)
    return fuse_weighted_profile(
        profile, lexical, vector, now=now, half_life_days=half_life_days, rescored=rescored
    )
