"""The Qdrant server adapter's own REST query path against qdrant-client's.

`QdrantServerVectorSearch` sends its query calls over urllib3 (kept-alive connections,
plain JSON) when its client was made with a `url` and nothing else the path does not
reproduce; a client with extra `metadata` headers keeps qdrant-client. Both must give
the same candidates and the same scores, and the REST path must keep its connections.
The vector conformance suite runs every case through the REST path
(`tests/conformance/test_vector_index.py`, `qdrant-server`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
from qdrant_client import QdrantClient

from contracts.errors import DependencyUnavailable
from contracts.index import SearchFilter
from projector.adapters.qdrant_vectors import QdrantServerVectorIndex
from query.adapters.qdrant_vectors import QdrantServerVectorSearch
from tests.conformance.corpus import doc, unit
from tests.conformance.test_vector_index import FILTER_CASES
from tests.conftest import require_server, run_tag

pytestmark = pytest.mark.servers

PREFIX = f"orrery-test-{run_tag()}-rest"
DIM = 4
STATUSES = ("active", "candidate", "archived")


def _random_unit(rng: random.Random) -> tuple[float, ...]:
    return unit(*(rng.uniform(-1.0, 1.0) for _ in range(DIM)))


@pytest.fixture(scope="module")
def generation() -> Iterator[str]:
    """One collection of 300 points (some of them with equal vectors: ties)."""
    client = QdrantClient(url=require_server("qdrant"), check_compatibility=False)
    index = QdrantServerVectorIndex(client, collection_prefix=PREFIX)
    generation_id = f"gen-{uuid.uuid4().hex[:12]}"
    index.create(generation_id, DIM)
    rng = random.Random(15)
    shared = _random_unit(rng)
    docs = [
        doc(
            f"p{i:03d}",
            vector=shared if i % 25 == 0 else _random_unit(rng),
            galaxy=rng.choice(("default", "other")),
            status=rng.choice(STATUSES),
            visibility=tuple(rng.sample(("family", "private", "guests"), rng.randint(1, 2))),
            facets={"room": (rng.choice(("hall", "kitchen", "flur")),)},
        )
        for i in range(300)
    ]
    index.apply(generation_id, docs, [])
    try:
        yield generation_id
    finally:
        index.drop(generation_id)
        index.close()


def _search(*, rest: bool) -> QdrantServerVectorSearch:
    options = {} if rest else {"metadata": {"x-orrery-test": "qdrant-client path"}}
    client = QdrantClient(url=require_server("qdrant"), check_compatibility=False, **options)
    return QdrantServerVectorSearch(client, collection_prefix=PREFIX)


def test_the_rest_path_answers_what_qdrant_client_answers(generation: str) -> None:
    rest, through_client = _search(rest=True), _search(rest=False)
    rng = random.Random(24)
    filters = [f for f, _ in FILTER_CASES.values()] + [
        SearchFilter(document_ids=tuple(f"p{i:03d}" for i in rng.sample(range(300), 40)))
    ]
    try:
        for search_filter in filters:
            for _ in range(3):
                vector = _random_unit(rng)
                for limit in (1, 7, 50, 400):
                    got = rest.search(generation, vector, search_filter, limit)
                    assert got == through_client.search(generation, vector, search_filter, limit)
                by_ids = search_filter.model_copy(
                    update={"document_ids": tuple(f"p{i:03d}" for i in range(0, 300, 7))}
                )
                scores = rest.scores(generation, vector, by_ids)
                assert scores == through_client.scores(generation, vector, by_ids)
    finally:
        rest.close()
        through_client.close()


def test_the_rest_path_keeps_its_connection(generation: str) -> None:
    search = _search(rest=True)
    rest = search._rest
    assert rest is not None
    try:
        for i in range(30):
            search.search(generation, unit(1, i, 0, 1), SearchFilter(), 10)
            search.scores(generation, unit(0, 1, i, 0), SearchFilter(document_ids=("p001",)))
        # One request at a time: one connection, opened once and kept.
        assert rest._pool.num_connections == 1
    finally:
        search.close()


def test_a_client_with_extra_headers_keeps_qdrant_client() -> None:
    assert _search(rest=False)._rest is None
    assert _search(rest=True)._rest is not None


def test_an_unreachable_server_is_dependency_unavailable() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = QdrantClient(url=f"http://127.0.0.1:{port}", check_compatibility=False, timeout=2)
    search = QdrantServerVectorSearch(client, collection_prefix=PREFIX)
    assert search._rest is not None
    with pytest.raises(DependencyUnavailable):
        search.search("gen-nowhere", unit(1, 0, 0, 0), SearchFilter(), 5)
