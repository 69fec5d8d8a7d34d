"""The fusion-profile registry: built-in and operator profiles, the server's default,
and request overrides that derive a new, stably named profile.

Pure logic: the operator's JSON arrives as text (`parse_profiles`); reading a file is
the bootstrap's business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from pydantic import ValidationError

from contracts.digests import sha256_json
from contracts.errors import ErrorCode, OrreryError
from contracts.profiles import FusionProfile, ProfileSet, RrfProfile, WeightedProfile
from contracts.topk import Ranking

__all__ = [
    "BUILTIN_PROFILES",
    "DEFAULT_PROFILE_ID",
    "ProfileRegistry",
    "derive_profile",
    "parse_profiles",
]

BUILTIN_PROFILES: tuple[FusionProfile, ...] = (
    WeightedProfile(
        id="weighted@1",
        description="min-max lexical 1.0 + vector 1.0 + freshness 0.15 + status 0.25; "
        "a candidate missing from one source scores 0 there",
        lexical_weight=1.0,
        vector_weight=1.0,
        freshness_weight=0.15,
        metadata_weight=0.25,
    ),
    WeightedProfile(
        id="weighted@2",
        description="weighted@1 with titles boosted like bodies (BM25) and the union "
        "re-scored: a candidate missing from one source gets its exact score there, "
        "min-max over the union (SciFact nDCG@10 0.701 vs 0.686, docs/bench/quality.json)",
        lexical_weight=1.0,
        vector_weight=1.0,
        freshness_weight=0.15,
        metadata_weight=0.25,
        missing="rescore",
        field_boosts={"title": 1.0},
    ),
    RrfProfile(
        id="rrf@1",
        description="reciprocal rank fusion, k=60, equal weights, ranks 1-100",
        rrf_k=60.0,
        rank_window=100,
    ),
    WeightedProfile(
        id="weighted@3",
        description="weighted@2 with BM25 over the combined text field (title, body and "
        "tags as one field, stemmed by the generation's analyzer) instead of three fields",
        lexical_weight=1.0,
        vector_weight=1.0,
        freshness_weight=0.15,
        metadata_weight=0.25,
        missing="rescore",
        field_boosts={"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0},
    ),
    RrfProfile(
        id="rrf@2",
        description="rrf@1 with BM25 over the combined text field (title, body and tags "
        "as one field)",
        rrf_k=60.0,
        rank_window=100,
        field_boosts={"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0},
    ),
)
DEFAULT_PROFILE_ID = "weighted@3"

_RRF_WEIGHTS = frozenset({"lexical_weight", "vector_weight"})


def parse_profiles(text: str) -> ProfileSet:
    """Operator profiles from JSON: `{"profiles": [...]}` or a bare list of profiles.

    Blank text means none. Raises `ValueError` naming what is wrong.
    """
    if not text.strip():
        return ProfileSet()
    try:
        raw = json.loads(text)
        return ProfileSet.model_validate({"profiles": raw} if isinstance(raw, list) else raw)
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"invalid fusion profiles: {exc}") from exc


def derive_profile(profile: FusionProfile, overrides: Mapping[str, float]) -> FusionProfile:
    """`profile` with request weights applied.

    Weights equal to the profile's change nothing; if nothing changes, `profile` itself
    is returned. Otherwise the result's id is `<base id>+w:<8 hex>`, the hex being the
    sha256 of the canonical JSON of the changed weights, so equal overrides of one base
    always carry the same id. An `rrf` profile refuses a positive freshness or metadata
    weight (`INVALID_REQUEST`): it has no such component.
    """
    if isinstance(profile, RrfProfile):
        refused = {k: v for k, v in overrides.items() if k not in _RRF_WEIGHTS and v > 0.0}
        if refused:
            raise OrreryError(
                ErrorCode.INVALID_REQUEST,
                f"profile {profile.id} fuses ranks only; it has no "
                f"{', '.join(sorted(refused))} (use a weighted profile)",
                {"profile": profile.id, "weights": refused},
            )
        overrides = {k: v for k, v in overrides.items() if k in _RRF_WEIGHTS}
    changed = {
        name: float(value)
        for name, value in sorted(overrides.items())
        if float(getattr(profile, name)) != float(value)
    }
    if not changed:
        return profile
    derived_id = f"{profile.id}+w:{sha256_json(changed)[:8]}"
    return profile.model_copy(update={**changed, "id": derived_id})


class ProfileRegistry:
    """The profiles a query worker knows, by id, and which one it uses by default.

    Guarantees: the built-ins are always present and no operator profile can redefine
    one of their ids (a profile id names one recipe forever); ids are unique; the
    default exists. Violations raise `ValueError` at construction (startup), never at
    query time. Immutable after construction, so safe to share between threads.
    """

    def __init__(
        self, profiles: Iterable[FusionProfile] = (), *, default: str = DEFAULT_PROFILE_ID
    ) -> None:
        known: dict[str, FusionProfile] = {p.id: p for p in BUILTIN_PROFILES}
        builtin = set(known)
        for profile in profiles:
            if profile.id in builtin:
                if profile != known[profile.id]:
                    raise ValueError(f"profile {profile.id} is built in and cannot be redefined")
                continue
            if profile.id in known:
                raise ValueError(f"profile {profile.id} is defined twice")
            known[profile.id] = profile
        if default not in known:
            raise ValueError(f"default profile {default!r} is not defined (known: {sorted(known)})")
        self._profiles = known
        self._default = default

    @property
    def default_id(self) -> str:
        return self._default

    def ids(self) -> list[str]:
        return sorted(self._profiles)

    def get(self, profile_id: str | None) -> FusionProfile:
        """The profile named `profile_id` (None = the default); else `UNKNOWN_PROFILE`."""
        key = self._default if profile_id is None else profile_id
        profile = self._profiles.get(key)
        if profile is None:
            raise OrreryError(
                ErrorCode.UNKNOWN_PROFILE,
                f"unknown fusion profile {key!r}",
                {"profile": key, "known": self.ids()},
            )
        return profile

    def resolve(self, profile_id: str | None, ranking: Ranking) -> FusionProfile:
        """The profile a request ranks with: the named (or default) profile with the
        request's weight overrides applied (see `derive_profile`)."""
        return derive_profile(self.get(profile_id), ranking.overrides())
