"""Conformance suite of the `Cache` port: in-process LRU and Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_tenants_never_share_an_entry(cache: Cache) -> None:
    cache.set("k", b"a", 60, tenant="tenant-a")
    cache.set("k", b"b", 60, tenant="tenant-b")
    assert cache.get("k", tenant="tenant-a") == b"a"
    assert cache.get("k", tenant="tenant-b") == b"b"
    assert cache.get("k") is None and cache.get("k", tenant="tenant-c") is None


@pytest.mark.servers
def test_redis_keys_live_under_the_tenants_namespace_token() -> None:
    import redis

    from contracts.names import namespace_token

    prefix = f"orrery-test-{uuid.uuid4().hex[:8]}:"
    cache = RedisCache(require_server("redis"), prefix=prefix, timeout_seconds=1.0)
    raw = redis.Redis.from_url(require_server("redis"))
    try:
        for tenant in ("plain", *HOSTILE_NAMESPACES[:3]):
            cache.set("k", tenant.encode("utf-8", "surrogatepass"), 60, tenant=tenant)
            stored = raw.get(f"{prefix}{namespace_token(tenant)}:k")
            assert stored == tenant.encode("utf-8", "surrogatepass")
        cache.set("k", b"process", 60)
        assert raw.get(f"{prefix}-:k") == b"process"
    finally:
        raw.delete(*raw.keys(f"{prefix}*"))
        raw.close()
        cache.close()


PER_TENANT = 8
writes = st.lists(
    st.tuples(st.sampled_from(["b", "c", "d"]), st.integers(0, 40), st.integers(1, 300)),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(a_entries=st.integers(1, PER_TENANT), others=writes)
def test_another_tenants_writes_never_evict_a_tenants_entries(
    a_entries: int, others: list[tuple[str, int, int]]
) -> None:
    """Issue 22: the caches were one LRU, so tenant B's traffic evicted tenant A's
    entries. Within the tenant bound, whatever the others write (count, keys, sizes
    up to the byte bound), every entry of A stays."""
    cache = MemoryCache(max_entries=PER_TENANT, max_bytes=1_000, max_tenants=4)
    for n in range(a_entries):
        cache.set(f"a{n}", f"value-{n}".encode(), 60, tenant="a")
    for tenant, key, size in others:
        cache.set(f"{tenant}{key}", b"x" * size, 60, tenant=tenant)
    assert [cache.get(f"a{n}", tenant="a") for n in range(a_entries)] == [
        f"value-{n}".encode() for n in range(a_entries)
    ]


def test_a_tenant_is_bounded_on_its_own_and_tenants_past_the_bound_drop_the_coldest() -> None:
    cache = MemoryCache(max_entries=2, max_bytes=10, max_tenants=2)
    for key in ("1", "2", "3"):
        cache.set(key, b"v", 60, tenant="a")
    assert [cache.get(k, tenant="a") for k in ("1", "2", "3")] == [None, b"v", b"v"]
    cache.set("big", b"x" * 11, 60, tenant="a")  # over the tenant's bytes: not kept
    assert cache.get("big", tenant="a") is None and cache.get("3", tenant="a") == b"v"
    cache.set("1", b"v", 60, tenant="b")
    cache.get("3", tenant="a")  # a used after b: b is now the coldest tenant
    cache.set("1", b"v", 60, tenant="c")
    assert cache.get("1", tenant="b") is None
    assert cache.get("3", tenant="a") == b"v" and cache.get("1", tenant="c") == b"v"
