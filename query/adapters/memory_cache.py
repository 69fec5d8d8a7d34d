"""The embedded cache: an in-process LRU per tenant with per-entry TTLs."""

from __future__ import annotations

import time
from collections.abc import Callable

from query.tenant_lru import TenantLru

__all__ = ["MemoryCache"]


class MemoryCache:
    """`Cache` in process memory: per tenant (`query.tenant_lru`) bounded by entry count
    and total bytes, at most `max_tenants` tenants (the least recently used one dropped
    whole past that): by default 2,000 entries and 8 MiB per tenant, 16 tenants, so
    at most 128 MiB of values. Thread-safe."""

    def __init__(
        self,
        *,
        max_entries: int = 2_000,
        max_bytes: int = 8 * 1024 * 1024,
        max_tenants: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._items: TenantLru[str, tuple[float, bytes]] = TenantLru(
            max_entries=max_entries,
            max_bytes=max_bytes,
            max_tenants=max_tenants,
            size=lambda item: len(item[1]),
        )
        self._clock = clock

    @property
    def name(self) -> str:
        return "memory"

    def get(self, key: str, *, tenant: str = "") -> bytes | None:
        item = self._items.get(tenant, key)
        if item is None:
            return None
        expires, value = item
        if expires <= self._clock():
            self._items.remove(tenant, key)
            return None
        return value

    def set(self, key: str, value: bytes, ttl_seconds: float, *, tenant: str = "") -> None:
        self._items.put(tenant, key, (self._clock() + ttl_seconds, value))

    def close(self) -> None:
        self._items.clear()
