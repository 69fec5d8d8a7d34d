"""Shared fixtures: the local server harness (Kafka, OpenSearch, Qdrant, Redis, PostgreSQL).

`make test` runs `make servers-up` first. A test that needs a server asks for its URL
through `require_server`; when the server is not up the test is skipped with the reason,
or fails when `ORRERY_REQUIRE_SERVERS=1` (as in CI).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.harness.servers import server_urls

# Hypothesis's per-example deadline and its "input generation is slow" health check are
# wall-clock assertions: on a loaded machine (CI on 2 cores, xdist workers, servers) one
# descheduled draw fails a property that holds. Every property here runs without them;
# a test's own `@settings` still sets its examples and other checks.
settings.register_profile(
    "orrery",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("orrery")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a test marked `slow` first, the others after them; within each group the
    collection order, within a file its own order (the e2e files run in file order).

    `make test` hands whole files to its workers in this order (`--dist loadfile
    --no-loadscope-reorder`): the long files start first and the many short ones fill in
    at the end. (xdist's default order, most tests first, put the long files with one to
    seven tests last, where one of them can keep a worker busy for minutes after the other
    ran out of files.)"""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


_ENV_NAMES = {
    "kafka": "ORRERY_KAFKA_BOOTSTRAP",
    "opensearch": "ORRERY_OPENSEARCH_URL",
    "qdrant": "ORRERY_QDRANT_URL",
    "redis": "ORRERY_REDIS_URL",
    "postgres": "ORRERY_DATABASE_URL",
}


# Taken out of the environment for the whole session: `ORRERY_DATABASE_URL` switches
# server mode's canonical store, and a shell that sourced servers.env must not move every
# server-mode test (and the processes they start) onto PostgreSQL. Tests ask for
# PostgreSQL through the `postgres_url` fixture, which still finds this URL.
_DATABASE_URL = os.environ.pop("ORRERY_DATABASE_URL", None)


def require_server(name: str) -> str:
    """The URL of a running harness server, else skip (or fail when servers are required)."""
    from_env = _DATABASE_URL if name == "postgres" else os.environ.get(_ENV_NAMES[name])
    url = from_env or server_urls().get(name)
    if url:
        return url
    reason = f"{name} is not running (start it with `make servers-up`)"
    if os.environ.get("ORRERY_REQUIRE_SERVERS") == "1":
        pytest.fail(f"ORRERY_REQUIRE_SERVERS=1 but {reason}")
    pytest.skip(reason)


# Every OpenSearch index and Qdrant collection a test creates is named under
# `orrery-test-<tag>` with a tag from `run_tag()`; the session drops them all at its end.
# (A Qdrant node holding a few hundred leftover collections runs out of memory maps and
# aborts: "failed to allocate an alternative stack".)
_RUN_TAGS: list[str] = []


def run_tag() -> str:
    """A fresh tag for engine resource names (`orrery-test-<tag>…`), dropped after the run."""
    tag = uuid.uuid4().hex[:8]
    _RUN_TAGS.append(tag)
    return tag


def drop_engine_resources(*prefixes: str) -> None:
    """Delete the OpenSearch indexes and Qdrant collections whose names start with one of
    `prefixes` (best effort: a server that is gone has nothing left to drop).

    Each server is listed once and only the matches are deleted (OpenSearch: many names a
    request): a request per tag and server was the 14.7 s teardown of a worker's last
    test in CI (200 tags: 40.9 s against 1.2 s on a loaded machine). Only names under
    `prefixes` go: the other worker's session may still use its own."""
    import httpx

    urls = server_urls()
    try:
        if urls.get("opensearch"):
            opensearch = urls["opensearch"]
            listed = httpx.get(
                f"{opensearch}/_cat/indices/orrery-test-*",
                params={"format": "json", "h": "index", "expand_wildcards": "all"},
                timeout=60,
            ).json()
            doomed = sorted(i["index"] for i in listed if i["index"].startswith(prefixes))
            for start in range(0, len(doomed), _DELETE_BATCH):
                names = ",".join(doomed[start : start + _DELETE_BATCH])
                httpx.delete(f"{opensearch}/{names}", timeout=60)
        if urls.get("qdrant"):
            qdrant = urls["qdrant"]
            listed = httpx.get(f"{qdrant}/collections", timeout=30).json()
            for collection in listed["result"]["collections"]:
                if collection["name"].startswith(prefixes):
                    httpx.delete(f"{qdrant}/collections/{collection['name']}", timeout=60)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass


# Index names per OpenSearch delete: well under its 4 KB request line.
_DELETE_BATCH = 40


@pytest.fixture(scope="session", autouse=True)
def _drop_run_resources() -> Iterator[None]:
    yield
    if _RUN_TAGS:
        drop_engine_resources(*(f"orrery-test-{tag}" for tag in _RUN_TAGS))


# `orrery serve --sample` and the other servers the suite starts embed the same texts
# again and again (the 306-record sample: 20-40 s of a loaded 2-core machine each time).
# They share one content-addressed vector store (`ORRERY_EMBEDDING_CACHE_DIR`: keyed by
# embedder id and text digest, so a hit is the vector the model gives that text) under
# the run's temporary root, which every xdist worker of the run sees. A value already in
# the environment (a cache kept between runs) is used as it is.
EMBEDDING_CACHE_ENV = "ORRERY_EMBEDDING_CACHE_DIR"


@pytest.fixture(scope="session", autouse=True)
def _embedding_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if os.environ.get(EMBEDDING_CACHE_ENV):
        yield
        return
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ[EMBEDDING_CACHE_ENV] = str(root / "embedding-cache")
    try:
        yield
    finally:
        os.environ.pop(EMBEDDING_CACHE_ENV, None)


@contextlib.contextmanager
def new_database() -> Iterator[str]:
    """The URL of a new, empty database on the harness's PostgreSQL, dropped afterwards
    (`WITH (FORCE)`: sessions of killed processes included)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    server = require_server("postgres")
    name = f"orrery_t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


# Databases of helpers that are no fixtures (`session_database`), dropped at session end.
_SESSION_DATABASES = contextlib.ExitStack()


def session_database() -> str:
    """The URL of a new, empty database that lives until the test session ends (for
    server processes a test starts through a plain helper such as `server_env`)."""
    return _SESSION_DATABASES.enter_context(new_database())


@pytest.fixture(scope="session", autouse=True)
def _drop_session_databases() -> Iterator[None]:
    yield
    _SESSION_DATABASES.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of a new, empty database on the harness's PostgreSQL, dropped afterwards.

    Each test gets its own database, so tables, counters and advisory locks (which
    PostgreSQL scopes per database) never meet another test's.
    """
    with new_database() as url:
        yield url
