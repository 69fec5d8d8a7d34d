"""The server-mode cache: Redis (redis-py), values with TTLs under one key prefix."""

from __future__ import annotations

import redis

from contracts.errors import DependencyUnavailable

__all__ = ["RedisCache"]


class RedisCache:
    """`Cache` on Redis.

    Guarantees: every operation is bounded by `timeout_seconds` (connect and socket);
    a Redis error raises `DependencyUnavailable("redis")` so the caller answers uncached
    and says so (`query_plan.cache = "unavailable"`); keys live under `prefix`.
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

    def get(self, key: str) -> bytes | None:
        try:
            value = self._client.get(self._prefix + key)
        except redis.RedisError as exc:
            raise DependencyUnavailable("redis", str(exc)) from exc
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes, ttl_seconds: float) -> None:
        try:
            self._client.set(self._prefix + key, value, px=max(1, int(ttl_seconds * 1000)))
        except redis.RedisError as exc:
            raise DependencyUnavailable("redis", str(exc)) from exc

    def close(self) -> None:
        self._client.close()
