"""KoutenDB's retrieval envelope (`koutendb.retrieval.v1`) on Orrery: wire shapes, the
amount/scope/depth vocabulary, the plan formulas and KoutenDB's envelope validator.

Pure (pydantic + stdlib). The routes are `query.entrypoints.koutendb_http`, the
planning `query.koutendb`; docs/koutendb.md maps every field and says where Orrery
deliberately differs. Wire names are camelCase as KoutenDB's; unknown request fields
are `422 unknown_field`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationInfo, field_validator
from pydantic.config import JsonDict

from contracts.names import Namespace
from contracts.records import VECTOR_FACT, Name
from contracts.topk import LIMIT_FACT, PROFILES_FACT
from contracts.wire import JsonInt

__all__ = [
    "AMOUNTS",
    "ATLAS_SCHEMA",
    "ATLAS_VERSION",
    "DEFAULT_PROFILE",
    "DEPTHS",
    "ENVELOPE_SCHEMA",
    "ENVELOPE_VERSION",
    "RAW_PAYLOAD_SCHEMA",
    "SCOPES",
    "AnyJson",
    "Atlas",
    "AtlasGalaxy",
    "AtlasRing",
    "Chunk",
    "Envelope",
    "EnvelopeQuery",
    "EnvelopeSource",
    "FeedbackRequest",
    "FeedbackResponse",
    "KoutenPlanRequest",
    "KoutenRetrieveRequest",
    "Plan",
    "PlanResponse",
    "PolicyHints",
    "ProfileBody",
    "ProfileOut",
    "ProfileResponse",
    "ProfilesResponse",
    "Recommendation",
    "RecommendationsResponse",
    "RingFeature",
    "RingUse",
    "Stats",
    "Trace",
    "Tuning",
    "ValidateResponse",
    "check_ring",
    "clamp_top_rings",
    "effective_top_rings",
    "estimated_tokens",
    "focus_to_top_rings",
    "payload_string",
    "retrieval_envelope_validation_errors",
    "tuning_of",
]

ENVELOPE_SCHEMA = "koutendb.retrieval.v1"
ENVELOPE_VERSION = 1
ATLAS_SCHEMA = "koutendb.atlas.v1"
ATLAS_VERSION = 1
# A payload `{"raw": "..."}` written with this schema is the string itself (KoutenDB's
# raw codec); any other payload is returned as compact JSON.
RAW_PAYLOAD_SCHEMA = "koutendb.raw.v1"
DEFAULT_PROFILE = "default"


def _null_means_default(schema: JsonDict) -> None:
    """The field's schema as the string it is, or null (which means its default)."""
    string: JsonDict = {"type": "string"}
    for word in ("minLength", "maxLength"):
        if word in schema:
            string[word] = schema.pop(word)
    schema.pop("type", None)
    schema["anyOf"] = [string, {"type": "null"}]


# The vocabulary (KoutenDB's `tuningFromSearchProfile`).
AMOUNTS: Mapping[str, int] = {"raFew": 3, "raNormal": 8, "raMany": 16, "raAllUseful": 32}
SCOPES: Mapping[str, int] = {"ssTight": 0, "ssNear": 15, "ssWide": 45, "ssAll": 90}
# depth -> (includeChildren, maxDepth, branchBudget)
DEPTHS: Mapping[str, tuple[bool, int, int]] = {
    "sdShallow": (False, 0, 0),
    "sdNormal": (False, 0, 0),
    "sdDeep": (True, 2, 4),
    "sdVeryDeep": (True, 4, 8),
}
DEFAULT_WORDS = ("raNormal", "ssTight", "sdNormal")

_TOP_RINGS_MIN = 2
_TOP_RINGS_MAX = 500


def focus_to_top_rings(focus: int) -> int:
    """Focus 1..100 (clamped) as a ring count 2..500: never a single ring."""
    f = max(1, min(100, focus))
    return max(_TOP_RINGS_MIN, min(_TOP_RINGS_MAX, 2 + ((f - 1) * 498 + 98) // 99))


def clamp_top_rings(top_rings: int) -> int:
    """0 (or less) disables top-rings selection; else 2..500."""
    return 0 if top_rings <= 0 else max(_TOP_RINGS_MIN, min(_TOP_RINGS_MAX, top_rings))


def effective_top_rings(focus: int, top_rings: int) -> int:
    return focus_to_top_rings(focus) if focus > 0 else clamp_top_rings(top_rings)


def check_ring(ring: str) -> str:
    """A ring name: '/'-separated, no empty segment (`ValueError` otherwise)."""
    if not ring or any(not part for part in ring.split("/")):
        raise ValueError("ring is a '/'-separated path without empty segments")
    return ring


def estimated_tokens(payload_bytes: int) -> int:
    return (payload_bytes + 3) // 4


def payload_string(payload_schema: str, payload: Mapping[str, Any]) -> str:
    """The chunk (and dump) payload of a record: `payload.raw` for KoutenDB's raw
    codec, else the payload object as compact JSON."""
    raw = payload.get("raw")
    if payload_schema == RAW_PAYLOAD_SCHEMA and isinstance(raw, str):
        return raw
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AnyJson(RootModel[Any]):
    """Any JSON value. What `POST /v1/koutendb/validate` takes (it checks whatever it is
    sent against the envelope and reports what it finds) and what one line of `POST
    /v1/koutendb/import` may be (a line that cannot become a record is counted in
    `errors`, the import goes on): a schema stricter than the route would promise
    refusals the route never answers."""


class _Request(_Wire):
    # Strict types: `"includeChildren": "yes"` or `"budget": "8"` is `422`, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)


# A text with a character Python's `str.strip` keeps (not blank), as JSON Schema says it.
NOT_BLANK = (
    "[^\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a"
    "\\u2028\\u2029\\u202f\\u205f\\u3000]"
)
_TEXT: JsonDict = {"required": ["queryText"], "properties": {"queryText": {"pattern": NOT_BLANK}}}
# What `query.koutendb` refuses and a field's type cannot say: `hybrid` and `lexical`
# search need a query text when a query is given (`422 invalid_request`).
_MODE_NEEDS_TEXT: JsonDict = {
    "if": {
        "required": ["mode", "queryVector"],
        "properties": {"mode": {"enum": ["hybrid", "lexical"]}, "queryVector": {"type": "array"}},
    },
    "then": _TEXT,
}
# `retrieve` needs a query: a text or a vector (`422 empty_query`); `hybrid` and
# `lexical` a text.
_RETRIEVE_RULES = ConfigDict(
    extra="forbid",
    strict=True,
    json_schema_extra={
        "anyOf": [
            _TEXT,
            {"required": ["queryVector"], "properties": {"queryVector": {"type": "array"}}},
        ],
        "if": {
            "required": ["mode"],
            "properties": {"mode": {"enum": ["hybrid", "lexical"]}},
        },
        "then": _TEXT,
    },
)


class Tuning(_Wire):
    budget: int
    focus: int
    topRings: int
    includeChildren: bool
    maxDepth: int
    branchBudget: int


def tuning_of(amount: str, scope: str, depth: str) -> Tuning:
    """The numbers of three words (`KeyError` for an unknown word)."""
    include_children, max_depth, branch_budget = DEPTHS[depth]
    return Tuning(
        budget=AMOUNTS[amount],
        focus=SCOPES[scope],
        topRings=0,
        includeChildren=include_children,
        maxDepth=max_depth,
        branchBudget=branch_budget,
    )


# A bound of an optional integer is also said at the top of its schema: pydantic writes
# it as `ge`/`le` (no JSON Schema keywords) inside the union of a validated type.
_Count = Field(
    default=None, ge=0, le=1_000_000, json_schema_extra={"minimum": 0, "maximum": 1_000_000}
)
_VOCABULARY: Mapping[str, Mapping[str, object]] = {
    "amount": AMOUNTS,
    "scope": SCOPES,
    "depth": DEPTHS,
}


def _check_word(value: str | None, info: ValidationInfo) -> str | None:
    words = _VOCABULARY[str(info.field_name)]
    if value is not None and value not in words:
        raise ValueError(f"{info.field_name} must be one of {', '.join(words)}")
    return value


class KoutenRetrieveRequest(_Request):
    """`POST /v1/koutendb/retrieve` (and, as `KoutenPlanRequest`, `/plan`). Words
    override the profile's; numbers override words (docs/koutendb.md)."""

    model_config = _RETRIEVE_RULES

    namespace: Namespace | None = None
    scopeRef: str = Field(default="longterm:objects:current", min_length=1, max_length=256)
    galaxy: Name | None = None
    queryText: str = Field(default="", max_length=4_096)
    queryVector: list[float] | None = Field(
        default=None,
        min_length=1,
        max_length=4_096,
        # The embedder's dimension; not all zeros (a direction is needed).
        json_schema_extra={**VECTOR_FACT, "contains": {"not": {"const": 0}}},
    )
    mode: Literal["hybrid", "vector", "lexical"] | None = None
    ring: str | None = Field(
        default=None, max_length=512, json_schema_extra={"pattern": "^[^/]+(/[^/]+)*$"}
    )
    # null means the default profile, as a field left out does.
    profile: str = Field(
        default=DEFAULT_PROFILE,
        min_length=1,
        max_length=128,
        json_schema_extra=_null_means_default,
    )
    amount: str | None = Field(default=None, json_schema_extra={"enum": [*AMOUNTS, None]})
    scope: str | None = Field(default=None, json_schema_extra={"enum": [*SCOPES, None]})
    depth: str | None = Field(default=None, json_schema_extra={"enum": [*DEPTHS, None]})
    budget: JsonInt | None = Field(
        default=None, ge=1, json_schema_extra={**LIMIT_FACT, "minimum": 1}
    )
    focus: JsonInt | None = _Count
    topRings: JsonInt | None = _Count
    maxDepth: JsonInt | None = _Count
    branchBudget: JsonInt | None = _Count
    includeChildren: bool = False
    requestId: str | None = Field(default=None, min_length=1, max_length=128)
    correlationId: str | None = Field(default=None, max_length=256)
    sourceType: str = Field(default="document", min_length=1, max_length=64)
    dataLabel: str = Field(default="", max_length=128)
    retentionClass: str = Field(default="normal", min_length=1, max_length=64)
    fusionProfile: str | None = Field(default=None, max_length=256, json_schema_extra=PROFILES_FACT)
    timeoutSeconds: float = Field(default=10.0, gt=0.0, le=60.0)

    @field_validator("ring")
    @classmethod
    def _ring(cls, value: str | None) -> str | None:
        return None if value is None else check_ring(value)

    _words = field_validator("amount", "scope", "depth")(lambda v, info: _check_word(v, info))

    @field_validator("profile", mode="before")
    @classmethod
    def _null_profile(cls, value: object) -> object:
        return DEFAULT_PROFILE if value is None else value


class KoutenPlanRequest(KoutenRetrieveRequest):
    """`POST /v1/koutendb/plan`: `retrieve`'s request, a query optional (without one the
    plan ranks no rings by centroid)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_MODE_NEEDS_TEXT)


class RingFeature(_Wire):
    ring: str
    key: str
    score: float
    centroidScore: float
    ringCount: int
    utility: float
    isBase: bool
    isSibling: bool
    isDescendant: bool


class Plan(_Wire):
    strategy: Literal["ring-scoped", "hierarchical-ring", "top-rings", "global"]
    profile: str
    baseRing: str
    amount: str
    scope: str
    depth: str
    ringScoped: bool
    budget: int
    focus: int
    topRings: int
    effectiveTopRings: int
    branchBudget: int
    maxDepth: int
    includeChildren: bool
    reason: str
    selectedRings: list[str]
    prunedRings: list[str]
    ringFeatures: list[RingFeature]


class EnvelopeSource(_Wire):
    provider: str = "orrery"
    galaxy: str
    ring: str
    backend: Literal["embedded", "servers"]
    sourceType: str


class EnvelopeQuery(_Wire):
    mode: str
    budget: int
    ringScoped: bool


class Chunk(_Wire):
    id: str
    payload: str
    score: float
    estimatedTokens: int
    ring: str
    sourceUri: str


class Stats(_Wire):
    totalVectors: int
    scanned: int
    skippedVectors: int
    returned: int
    ringsTouched: int
    fanoutNodes: int
    payloadBytes: int
    estimatedTokens: int
    candidateReduction: float


class PolicyHints(_Wire):
    resourceKind: str = "rag"
    resourceScope: Literal["topic", "persistent"]
    retentionClass: str
    contextReusable: bool = True
    dataLabel: str


class Trace(_Wire):
    requestId: str
    correlationId: str | None = None


class Envelope(_Wire):
    """`koutendb.retrieval.v1` as Orrery answers it (fields may be added, never removed
    or renamed; every envelope passes `retrieval_envelope_validation_errors`)."""

    schema_: str = Field(default=ENVELOPE_SCHEMA, alias="schema")
    version: int = ENVELOPE_VERSION
    source: EnvelopeSource
    query: EnvelopeQuery
    plan: Plan
    chunks: list[Chunk]
    stats: Stats
    policyHints: PolicyHints
    trace: Trace

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PlanResponse(_Wire):
    success: Literal[True] = True
    plan: Plan


class ValidateResponse(_Wire):
    success: Literal[True] = True
    valid: bool
    errors: list[str]


class ProfileBody(_Request):
    """`PUT /v1/koutendb/profiles/{name}`; a word left out is `default`'s."""

    namespace: Namespace | None = None
    amount: str | None = Field(default=None, json_schema_extra={"enum": [*AMOUNTS, None]})
    scope: str | None = Field(default=None, json_schema_extra={"enum": [*SCOPES, None]})
    depth: str | None = Field(default=None, json_schema_extra={"enum": [*DEPTHS, None]})
    note: str = Field(default="", max_length=1_000)

    _words = field_validator("amount", "scope", "depth")(lambda v, info: _check_word(v, info))


class ProfileOut(_Wire):
    name: str
    amount: str
    scope: str
    depth: str
    note: str
    tuning: Tuning


class ProfileResponse(ProfileOut):
    """`PUT /profiles/{name}`: the stored profile and its tuning."""

    success: Literal[True] = True


class ProfilesResponse(_Wire):
    success: Literal[True] = True
    namespace: str
    profiles: list[ProfileOut]


class AtlasGalaxy(_Wire):
    galaxy: str
    mode: Literal["embedded", "servers"]
    rings: int
    documents: int
    vectorDocuments: int


class AtlasRing(_Wire):
    name: str
    parent: str
    children: list[str]
    depth: int
    documents: int
    vectorDocuments: int
    coherence: float
    massG: float
    centroidPreview: list[float]


class Atlas(_Wire):
    success: Literal[True] = True
    schema_: str = Field(default=ATLAS_SCHEMA, alias="schema")
    version: int = ATLAS_VERSION
    generationId: str
    galaxyMap: AtlasGalaxy
    ringMap: list[AtlasRing]

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FeedbackRequest(_Request):
    namespace: Namespace | None = None
    galaxy: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The galaxy the envelope was retrieved in (a galaxy-bound key: its "
        "own). Needed only when the request id was used in more than one galaxy.",
    )
    scopeRef: str = Field(default="longterm:objects:current", min_length=1, max_length=256)
    requestId: str = Field(min_length=1, max_length=128)
    usedChunkIds: list[str] = Field(default_factory=list, max_length=1_000)
    ignoredChunkIds: list[str] = Field(default_factory=list, max_length=1_000)


class FeedbackResponse(_Wire):
    success: Literal[True] = True
    requestId: str
    used: int
    ignored: int


class RingUse(_Wire):
    ring: str
    returned: int
    used: int


class Recommendation(_Wire):
    baseRing: str
    profile: str
    envelopes: int
    returnedChunks: int
    usedChunks: int
    ignoredChunks: int
    usedRatio: float
    currentBudget: int
    recommendedBudget: int
    recommendedAmount: str
    rings: list[RingUse]


class RecommendationsResponse(_Wire):
    success: Literal[True] = True
    namespace: str
    galaxy: str
    recommendations: list[Recommendation]


# -- KoutenDB's validator ------------------------------------------------------------
# The messages and their order are KoutenDB's (`retrievalEnvelopeValidationErrors`);
# the checks read JSON the way its accessors do: an integer check takes only JSON
# integers (not booleans or floats), a string check only strings.


def _int(node: Any, key: str, default: int) -> int:
    value = node.get(key) if isinstance(node, dict) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return default


def _text(node: Any, key: str) -> str:
    value = node.get(key) if isinstance(node, dict) else None
    return value if isinstance(value, str) else ""


def _is_bool(node: dict[str, Any], key: str) -> bool:
    return isinstance(node.get(key), bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def retrieval_envelope_validation_errors(env: Any) -> list[str]:
    """KoutenDB's compatibility errors of an envelope (empty: valid), in its order."""
    if not isinstance(env, dict):
        return ["envelope must be a JSON object"]
    errors: list[str] = []
    if _text(env, "schema") != ENVELOPE_SCHEMA:
        errors.append(f"schema must be {ENVELOPE_SCHEMA}")
    if _int(env, "version", 0) != ENVELOPE_VERSION:
        errors.append(f"version must be {ENVELOPE_VERSION}")
    for key, kind in (
        ("source", "object"),
        ("query", "object"),
        ("plan", "object"),
        ("chunks", "array"),
        ("stats", "object"),
        ("policyHints", "object"),
    ):
        expected = list if kind == "array" else dict
        if not isinstance(env.get(key), expected):
            errors.append(f"{key} must be an {kind}")

    source = env.get("source")
    if isinstance(source, dict):
        for key in ("provider", "backend", "sourceType"):
            if not _text(source, key):
                errors.append(f"source.{key} must be a non-empty string")

    query = env.get("query")
    if isinstance(query, dict):
        if not _text(query, "mode"):
            errors.append("query.mode must be a non-empty string")
        if _int(query, "budget", -1) < 0:
            errors.append("query.budget must be >= 0")
        if not _is_bool(query, "ringScoped"):
            errors.append("query.ringScoped must be a boolean")

    plan = env.get("plan")
    if isinstance(plan, dict):
        for key in ("strategy", "reason", "amount", "scope", "depth"):
            if not _text(plan, key):
                errors.append(f"plan.{key} must be a non-empty string")
        for key in ("budget", "focus", "effectiveTopRings", "branchBudget", "maxDepth"):
            if _int(plan, key, -1) < 0:
                errors.append(f"plan.{key} must be >= 0")
        if not _is_bool(plan, "ringScoped"):
            errors.append("plan.ringScoped must be a boolean")
        if not _is_bool(plan, "includeChildren"):
            errors.append("plan.includeChildren must be a boolean")

    chunks = env.get("chunks")
    if isinstance(chunks, list):
        for i, chunk in enumerate(chunks):
            if not isinstance(chunk, dict):
                errors.append(f"chunks[{i}] must be an object")
                continue
            for key in ("id", "payload", "ring", "sourceUri"):
                if not isinstance(chunk.get(key), str):
                    errors.append(f"chunks[{i}].{key} must be a string")
            if not _is_number(chunk.get("score")):
                errors.append(f"chunks[{i}].score must be numeric")
            if _int(chunk, "estimatedTokens", -1) < 0:
                errors.append(f"chunks[{i}].estimatedTokens must be >= 0")

    stats = env.get("stats")
    if isinstance(stats, dict):
        for key in (
            "totalVectors",
            "scanned",
            "skippedVectors",
            "returned",
            "ringsTouched",
            "fanoutNodes",
            "payloadBytes",
            "estimatedTokens",
        ):
            if _int(stats, key, -1) < 0:
                errors.append(f"stats.{key} must be >= 0")
        if not _is_number(stats.get("candidateReduction")):
            errors.append("stats.candidateReduction must be numeric")

    hints = env.get("policyHints")
    if isinstance(hints, dict):
        for key in ("resourceKind", "resourceScope", "retentionClass"):
            if not _text(hints, key):
                errors.append(f"policyHints.{key} must be a non-empty string")
        if not _is_bool(hints, "contextReusable"):
            errors.append("policyHints.contextReusable must be a boolean")
    return errors
