"""The server-mode cache: Redis (redis-py), values with TTLs under one key prefix and a
namespace token per tenant.

Keys are per tenant (`{prefix}{namespace_token(tenant)}:{key}`), so tenants never share
an entry; Redis bounds memory only as a whole (`maxmemory` with an eviction policy such
as `allkeys-lru` is global): per-tenant memory is not enforced in Redis, and one tenant's
entries can evict another's there (docs/reliability.md)."""

from __future__ import annotations

import redis

from contracts.errors import DependencyUnavailable
from contracts.names import namespace_token

__all__ = ["RedisCache"]


class RedisCache:
    """`Cache` on Redis.

    Guarantees: every operation is bounded by `timeout_seconds` (connect and socket);
    a Redis error raises `DependencyUnavailable("redis")` so the caller answers uncached
    and says so (`query_plan.cache = "unavailable"`); keys live under `prefix`, then the
    tenant's namespace token (`-` for no tenant, which no namespace token is).
    """

    def __init__(self, url: str, *, prefix: str = "orrery:", timeout_seconds: float = 0.05):
        self._prefix = prefix
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry_on_timeout=False,
            health_check_interval=0,
        )

    @property
    def name(self) -> str:
        return "redis"

    def _key(self, tenant: str, key: str) -> str:
        return f"{self._prefix}{namespace_token(tenant) if tenant else '-'}:{key}"

    def get(self, key: str, *, tenant: str = "") -> bytes | None:
        try:
            value = self._client.get(self._key(tenant, key))
        except redis.RedisError as exc:
            raise DependencyUnavailable("redis", str(exc)) from exc
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes, ttl_seconds: float, *, tenant: str = "") -> None:
        try:
            self._client.set(self._key(tenant, key), value, px=max(1, int(ttl_seconds * 1000)))
        except redis.RedisError as exc:
            raise DependencyUnavailable("redis", str(exc)) from exc

    def close(self) -> None:
        self._client.close()
