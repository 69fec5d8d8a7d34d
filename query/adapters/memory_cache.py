"""The embedded cache: an in-process LRU with per-entry TTLs."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MemoryCache"]


class MemoryCache:
    """`Cache` in process memory, bounded by entry count and total bytes. Thread-safe."""

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "memory"

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            expires, value = item
            if expires <= self._clock():
                self._remove(key)
                return None
            self._items.move_to_end(key)
            return value

    def set(self, key: str, value: bytes, ttl_seconds: float) -> None:
        if len(value) > self._max_bytes:
            return
        with self._lock:
            if key in self._items:
                self._remove(key)
            self._items[key] = (self._clock() + ttl_seconds, value)
            self._bytes += len(value)
            while len(self._items) > self._max_entries or self._bytes > self._max_bytes:
                self._remove(next(iter(self._items)))

    def _remove(self, key: str) -> None:
        _, value = self._items.pop(key)
        self._bytes -= len(value)

    def close(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
