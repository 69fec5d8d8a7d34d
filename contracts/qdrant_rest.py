"""When a Qdrant server client's calls may go over Orrery's own kept-alive REST pool.

qdrant-client closes every connection to a server on 127.0.0.1/localhost after one
request and builds pydantic models for every point it sends or reads; the projector's
writes (`projector.adapters.qdrant_vectors`) and the query worker's searches
(`query.adapters.qdrant_vectors`) therefore speak REST themselves over a urllib3 pool,
for a client made with a `url` and nothing that path does not reproduce (a token
provider, gRPC, extra headers or metadata). Both adapters decide that here, and build
their pool with the same retry rule; the pool itself is theirs (contracts import no
driver). Pure: the stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["DEFAULT_TIMEOUT_S", "RETRY_ONCE", "RestTarget", "rest_target"]

# A call's whole time when the client was made without a timeout (qdrant-client's own
# default is 5 s).
DEFAULT_TIMEOUT_S = 5.0

# `urllib3.Retry` arguments: a kept-alive connection the server closed meanwhile is
# retried once on a new one (queries change nothing; writes are guarded by revision),
# nothing else is retried and a status is returned as it is.
RETRY_ONCE: Mapping[str, Any] = {
    "total": 1,
    "connect": 1,
    "read": 1,
    "status": 0,
    "redirect": 0,
    "other": 0,
    "allowed_methods": None,
    "raise_on_status": False,
}


@dataclass(frozen=True, slots=True)
class RestTarget:
    """Where and how a client's REST calls go: the server's base URI, the headers every
    call carries (the API key), the call timeout and the URI's path prefix."""

    uri: str
    headers: Mapping[str, str]
    timeout_s: float

    @property
    def prefix(self) -> str:
        """The base URI's path (a server behind a path prefix), without a final slash."""
        return (urlsplit(self.uri).path or "").rstrip("/")


def rest_target(client: Any) -> RestTarget | None:
    """`client`'s REST target when its calls may bypass it (see the module), else None."""
    options = client.init_options
    if (
        not isinstance(options.get("url"), str)
        or options.get("prefer_grpc")
        or options.get("auth_token_provider") is not None
        or options.get("metadata")
        or options.get("headers")
    ):
        return None
    rest_uri = getattr(getattr(client.http, "client", None), "host", None)
    if not isinstance(rest_uri, str):
        return None
    headers = {} if options.get("api_key") is None else {"api-key": str(options["api_key"])}
    timeout = options.get("timeout")
    return RestTarget(rest_uri, headers, float(timeout) if timeout else DEFAULT_TIMEOUT_S)
