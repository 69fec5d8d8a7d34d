"""Error codes and the one error shape every API returns.

`{"success": false, "error": {"code": ..., "message": ..., "details": ...}}`

Adapters translate driver exceptions into `OrreryError` subclasses; nothing above an
adapter catches a driver's exception type.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DETERMINISTIC_CODES",
    "HTTP_STATUS",
    "DependencyUnavailable",
    "ErrorBody",
    "ErrorCode",
    "ErrorResponse",
    "OrreryError",
    "is_deterministic",
]


class ErrorCode(StrEnum):
    """Machine-readable error codes. Each maps to exactly one HTTP status."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_SCOPE = "unknown_scope"
    UNKNOWN_NAMESPACE = "unknown_namespace"
    UNKNOWN_PROFILE = "unknown_profile"
    UNKNOWN_SEARCH_PROFILE = "unknown_search_profile"
    UNKNOWN_REQUEST = "unknown_request"
    UNKNOWN_CHUNK = "unknown_chunk"
    UNKNOWN_VOCABULARY = "unknown_vocabulary"
    PHRASE_SET_TOO_LARGE = "phrase_set_too_large"
    EMPTY_QUERY = "empty_query"
    RESULT_LIMIT_EXCEEDED = "result_limit_exceeded"
    BATCH_TOO_LARGE = "batch_too_large"
    BODY_TOO_LARGE = "body_too_large"
    HEADERS_TOO_LARGE = "headers_too_large"
    RECORD_TOO_LARGE = "record_too_large"
    ANSWER_TOO_LARGE = "answer_too_large"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    UNKNOWN_JOB = "unknown_job"
    REVISION_CONFLICT = "revision_conflict"
    EMBEDDER_MISMATCH = "embedder_mismatch"
    SCOPE_NOT_READY = "scope_not_ready"
    COVERAGE_UNAVAILABLE = "coverage_unavailable"
    INVALID_STATE = "invalid_state"
    NOT_CAUGHT_UP = "not_caught_up"
    QUALIFICATION_REQUIRED = "qualification_required"
    QUALIFICATION_FAILED = "qualification_failed"
    INGEST_BACKLOG = "ingest_backlog"
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INVALID_CONTINUATION = "invalid_continuation"
    EXPIRED_CONTINUATION = "expired_continuation"
    GENERATION_UNAVAILABLE = "generation_unavailable"
    INTERNAL = "internal"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.UNKNOWN_FIELD: 422,
    ErrorCode.UNKNOWN_SCOPE: 404,
    ErrorCode.UNKNOWN_NAMESPACE: 404,
    ErrorCode.UNKNOWN_PROFILE: 422,
    ErrorCode.UNKNOWN_SEARCH_PROFILE: 422,
    ErrorCode.UNKNOWN_REQUEST: 404,
    ErrorCode.UNKNOWN_CHUNK: 422,
    ErrorCode.UNKNOWN_VOCABULARY: 422,
    ErrorCode.PHRASE_SET_TOO_LARGE: 422,
    ErrorCode.EMPTY_QUERY: 422,
    ErrorCode.RESULT_LIMIT_EXCEEDED: 422,
    ErrorCode.BATCH_TOO_LARGE: 413,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.RECORD_TOO_LARGE: 413,
    ErrorCode.ANSWER_TOO_LARGE: 413,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNKNOWN_JOB: 404,
    ErrorCode.REVISION_CONFLICT: 409,
    ErrorCode.EMBEDDER_MISMATCH: 422,
    ErrorCode.SCOPE_NOT_READY: 503,
    ErrorCode.COVERAGE_UNAVAILABLE: 503,
    ErrorCode.INVALID_STATE: 409,
    ErrorCode.NOT_CAUGHT_UP: 409,
    ErrorCode.QUALIFICATION_REQUIRED: 409,
    ErrorCode.QUALIFICATION_FAILED: 409,
    ErrorCode.INGEST_BACKLOG: 503,
    ErrorCode.DEPENDENCY_UNAVAILABLE: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.INVALID_CONTINUATION: 400,
    ErrorCode.EXPIRED_CONTINUATION: 410,
    ErrorCode.GENERATION_UNAVAILABLE: 410,
    ErrorCode.INTERNAL: 500,
}


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: ErrorCode
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    """The body of every non-2xx response."""

    model_config = ConfigDict(extra="forbid")

    success: Literal[False] = False
    error: ErrorBody


class OrreryError(Exception):
    """An error with a code, a human message and machine-readable details."""

    def __init__(
        self, code: ErrorCode, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorBody(code=self.code, message=self.message, details=self.details)
        )


class DependencyUnavailable(OrreryError):
    """A store, engine or broker did not answer; the operation had no effect or is retried."""

    def __init__(self, dependency: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(
            ErrorCode.DEPENDENCY_UNAVAILABLE,
            f"{dependency}: {message}",
            {"dependency": dependency, **(details or {})},
        )


# Codes that say the request (a record, a document) itself is wrong: the same request
# fails the same way on every attempt. Every other code — an unreachable or overloaded
# dependency, a deadline, a missing index, a state that moved, an internal error — may
# pass on a retry.
DETERMINISTIC_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.INVALID_JSON,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_FIELD,
        ErrorCode.EMBEDDER_MISMATCH,
        ErrorCode.BODY_TOO_LARGE,
        ErrorCode.BATCH_TOO_LARGE,
    }
)


def is_deterministic(exc: BaseException) -> bool:
    """Whether `exc` fails the same way on every retry of the same request: an
    `OrreryError` with a code in `DETERMINISTIC_CODES` (adapters translate an engine's
    refusal of a document — a 4xx for its content — to one of them, and a fault of the
    engine itself — unreachable, a timeout, a 5xx — to `DependencyUnavailable`)."""
    return isinstance(exc, OrreryError) and exc.code in DETERMINISTIC_CODES
