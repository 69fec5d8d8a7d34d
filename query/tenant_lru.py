"""An LRU kept per tenant (namespace): one tenant's entries never evict another's.

Each tenant has its own LRU, bounded by entry count and by a size (`size(value)`) of its
own; the number of tenants is bounded too, and past it the tenant used least recently
is dropped whole (its entries were the coldest of all tenants). So within `max_tenants`
tenants, a tenant's writes evict only that tenant's entries (issue 22: the response and
query-vector caches were one LRU, and one tenant's traffic evicted another's entries).
Memory is at most `max_tenants × max_bytes` (plus keys). Thread-safe; stdlib only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["TenantLru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TenantLru(Generic[K, V]):
    """`get`/`put` per `(tenant, key)`.

    Guarantees: a tenant holds at most `max_entries` entries of total `size` at most
    `max_bytes` (a value larger than that is not kept); `put` for tenant T removes only
    T's entries, except when T is new and `max_tenants` tenants are already held: then
    the least recently used tenant is dropped whole."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        max_tenants: int,
        size: Callable[[V], int] = lambda _: 0,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._max_tenants = max_tenants
        self._size = size
        self._tenants: OrderedDict[str, _Lru[K, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, key: K) -> V | None:
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is None:
                return None
            self._tenants.move_to_end(tenant)
            return lru.get(key)

    def get_many(self, tenant: str, keys: Iterable[K]) -> list[V | None]:
        """`get` of each key, in order, under one lock (a hot path's batch)."""
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is None:
                return [None for _ in keys]
            self._tenants.move_to_end(tenant)
            return lru.get_many(keys)

    def put(self, tenant: str, key: K, value: V) -> None:
        size = self._size(value)
        if size > self._max_bytes:
            return
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is None:
                lru = self._tenants[tenant] = _Lru()
                while len(self._tenants) > self._max_tenants:
                    self._tenants.popitem(last=False)
            self._tenants.move_to_end(tenant)
            lru.put(key, value, size, self._max_entries, self._max_bytes)

    def remove(self, tenant: str, key: K) -> None:
        with self._lock:
            lru = self._tenants.get(tenant)
            if lru is not None:
                lru.remove(key)

    def tenants(self) -> list[str]:
        with self._lock:
            return list(self._tenants)

    def clear(self) -> None:
        with self._lock:
            self._tenants.clear()

    def __len__(self) -> int:
        """Entries held, over all tenants."""
        with self._lock:
            return sum(len(lru) for lru in self._tenants.values())


class _Lru(Generic[K, V]):
    __slots__ = ("_bytes", "_items")

    def __init__(self) -> None:
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def get_many(self, keys: Iterable[K]) -> list[V | None]:
        items = self._items
        touch = items.move_to_end
        out: list[V | None] = []
        for key in keys:
            item = items.get(key)
            if item is None:
                out.append(None)
            else:
                touch(key)
                out.append(item[0])
        return out

    def put(self, key: K, value: V, size: int, max_entries: int, max_bytes: int) -> None:
        self.remove(key)
        self._items[key] = (value, size)
        self._bytes += size
        while len(self._items) > max_entries or self._bytes > max_bytes:
            self.remove(next(iter(self._items)))

    def remove(self, key: K) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]
