"""Conformance suite of the `Cache` port: in-process LRU and Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from query.adapters.memory_cache import MemoryCache
from query.adapters.redis_cache import RedisCache
from query.ports import Cache
from tests.conformance.corpus import HOSTILE_NAMESPACES
from tests.conftest import require_server


def _redis() -> Cache:
    return RedisCache(
        require_server("redis"), prefix=f"orrery-test-{uuid.uuid4().hex[:8]}:", timeout_seconds=1.0
    )


ENGINES: dict[str, Callable[[], Cache]] = {"memory": MemoryCache, "redis": _redis}
ENGINE_MARKS = {"redis": [pytest.mark.servers]}


@pytest.fixture(
    params=[pytest.param(name, marks=ENGINE_MARKS.get(name, [])) for name in sorted(ENGINES)]
)
def cache(request: pytest.FixtureRequest) -> Iterator[Cache]:
    instance = ENGINES[request.param]()
    yield instance
    instance.close()


def test_round_trip_is_byte_exact(cache: Cache) -> None:
    value = "Grüße 🌍".encode() + bytes(range(256))
    cache.set("k1", value, 30)
    assert cache.get("k1") == value


def test_missing_key_is_none(cache: Cache) -> None:
    assert cache.get("absent") is None


def test_overwrite(cache: Cache) -> None:
    cache.set("k", b"one", 30)
    cache.set("k", b"two", 30)
    assert cache.get("k") == b"two"


def test_ttl_expires(cache: Cache) -> None:
    cache.set("short", b"x", 0.05)
    deadline = time.monotonic() + 5
    while cache.get("short") is not None:
        assert time.monotonic() < deadline, "entry did not expire"
        time.sleep(0.02)


def test_memory_cache_evicts_least_recent() -> None:
    cache = MemoryCache(max_entries=2)
    cache.set("a", b"1", 30)
    cache.set("b", b"2", 30)
    assert cache.get("a") == b"1"
    cache.set("c", b"3", 30)
    assert cache.get("b") is None and cache.get("a") == b"1" and cache.get("c") == b"3"


def test_redis_down_raises_dependency_unavailable() -> None:
    from contracts.errors import DependencyUnavailable

    dead = RedisCache("redis://127.0.0.1:1/0", timeout_seconds=0.05)
    with pytest.raises(DependencyUnavailable):
        dead.get("k")
    with pytest.raises(DependencyUnavailable):
        dead.set("k", b"v", 1)
    dead.close()


def test_keys_naming_hostile_namespaces_stay_apart(cache: Cache) -> None:
    # Orrery's own keys hash the namespace (`query.service`, `query.scopes`); the port
    # must still keep any key text apart, byte for byte.
    keys = [f"scope:{ns}" for ns in ("ns", *HOSTILE_NAMESPACES)]
    for n, key in enumerate(keys):
        cache.set(key, str(n).encode(), 60)
    assert [cache.get(key) for key in keys] == [str(n).encode() for n in range(len(keys))]
