"""`contracts.qdrant_rest.rest_target`: which qdrant-client clients the adapters may
bypass with their own REST pool, and with what base URI, headers and timeout."""

from __future__ import annotations

from typing import Any

from qdrant_client import QdrantClient

from contracts.qdrant_rest import DEFAULT_TIMEOUT_S, RestTarget, rest_target


def _target(**options: Any) -> RestTarget | None:
    # No call is made: the client is only read (its version check would connect).
    return rest_target(QdrantClient(check_compatibility=False, **options))


def test_a_url_client_is_bypassed_with_its_key_timeout_and_prefix() -> None:
    target = _target(url="https://127.0.0.1:6333", prefix="vectors/", api_key="k", timeout=7)
    assert target is not None
    assert target.uri.startswith("https://127.0.0.1:6333")
    assert target.prefix == "/vectors"
    assert target.headers == {"api-key": "k"}
    assert target.timeout_s == 7.0
    plain = _target(url="http://127.0.0.1:6333")
    assert plain is not None
    assert (plain.prefix, dict(plain.headers), plain.timeout_s) == ("", {}, DEFAULT_TIMEOUT_S)


def test_what_the_pool_cannot_reproduce_keeps_the_client() -> None:
    url = "http://127.0.0.1:6333"
    assert _target(url=url, headers={"x-tenant": "a"}) is None
    assert _target(url=url, prefer_grpc=True) is None
    assert _target(url="https://127.0.0.1:6333", auth_token_provider=lambda: "t") is None
    assert _target(location=":memory:") is None
