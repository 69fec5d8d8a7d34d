"""Native alias mirrors and other specifics of the Qdrant server vector adapters.

Runs against the harness's Qdrant server (`ORRERY_QDRANT_URL`; collections and aliases
carry a unique prefix per test and are dropped afterwards), so these tests are marked
`servers`. The few tests at the end that build their own index use qdrant-client's local
mode on purpose: they check the constructor, closing, and local mode's one-client-per-path
rule, which need no server. The shared port cases are in `test_vector_index.py` (engines
"qdrant-server" and "qdrant-local").
"""

from __future__ import annotations

import gc
import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient, models

from contracts import vector_payload
from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError
from contracts.index import SearchFilter
from contracts.names import live_alias_name
from projector.adapters import qdrant_edge_vectors
from projector.adapters.qdrant_vectors import QdrantServerVectorIndex, open_qdrant_client
from query.adapters.qdrant_vectors import QdrantServerVectorSearch
from tests.conformance.corpus import CORPUS, DIM, HOSTILE_NAMESPACES, doc, unit
from tests.conftest import require_server, run_tag


@dataclass
class Qdrant:
    client: QdrantClient
    index: QdrantServerVectorIndex
    search: QdrantServerVectorSearch
    prefix: str

    def ids(self, generation_id: str, vector: tuple[float, ...] = unit(1, 0, 0, 0)) -> list[str]:
        hits = self.search.search(generation_id, vector, SearchFilter(), 10)
        return [c.document_id for c in hits]

    def ids_through_alias(self, alias: str) -> set[str]:
        """What an outside reader of the alias sees (it knows no generation ids)."""
        response = self.client.query_points(
            alias,
            query=list(unit(1, 0, 0, 0)),
            using=vector_payload.VECTOR_NAME,
            with_payload=["document_id"],
            limit=10,
        )
        return {str((point.payload or {})["document_id"]) for point in response.points}


@pytest.fixture(params=[pytest.param("qdrant-server", marks=[pytest.mark.servers])])
def qdrant() -> Iterator[Qdrant]:
    client = QdrantClient(url=require_server("qdrant"), check_compatibility=False)
    prefix = f"orrery-test-{run_tag()}"
    harness = Qdrant(
        client=client,
        index=QdrantServerVectorIndex(client, collection_prefix=prefix),
        search=QdrantServerVectorSearch(client, collection_prefix=prefix),
        prefix=prefix,
    )
    try:
        yield harness
    finally:
        ours = prefix
        stale_aliases = [
            models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=a.alias_name))
            for a in client.get_aliases().aliases
            if a.alias_name.startswith(ours)
        ]
        if stale_aliases:
            client.update_collection_aliases(change_aliases_operations=stale_aliases)
        for collection in client.get_collections().collections:
            if collection.name.startswith(ours):
                client.delete_collection(collection.name)
        harness.index.close()


def _two_generations(qdrant: Qdrant) -> None:
    qdrant.index.create("g1", DIM)
    qdrant.index.create("g2", DIM)
    qdrant.index.apply("g1", [doc("a1"), doc("a2", vector=unit(1, 1, 0, 0))], [])
    qdrant.index.apply("g2", [doc("b1"), doc("b2", vector=unit(0, 1, 0, 0)), doc("b3")], [])


# -- alias mirrors ---------------------------------------------------------------------


def test_alias_moves_atomically_from_one_generation_to_the_next(
    qdrant: Qdrant, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_generations(qdrant)
    alias = f"{qdrant.prefix}-live"
    assert qdrant.index.resolve_alias(alias) is None

    qdrant.index.mirror_alias(alias, "g1")
    assert qdrant.index.resolve_alias(alias) == "g1"
    assert qdrant.ids_through_alias(alias) == {"a1", "a2"}

    calls: list[list[Any]] = []
    update = qdrant.client.update_collection_aliases

    def recording(*, change_aliases_operations: list[Any], **kwargs: Any) -> bool:
        calls.append(list(change_aliases_operations))
        return update(change_aliases_operations=change_aliases_operations, **kwargs)

    monkeypatch.setattr(qdrant.client, "update_collection_aliases", recording)
    qdrant.index.mirror_alias(alias, "g2")
    # One request holding both steps: readers never see the alias missing.
    [operations] = calls
    assert [type(op) for op in operations] == [
        models.DeleteAliasOperation,
        models.CreateAliasOperation,
    ]
    assert qdrant.index.resolve_alias(alias) == "g2"
    assert qdrant.ids_through_alias(alias) == {"b1", "b2", "b3"}
    assert qdrant.ids("g1") == ["a1", "a2"]  # the generations themselves are untouched


def test_mirroring_again_is_a_no_op(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    alias = f"{qdrant.prefix}-live"
    qdrant.index.mirror_alias(alias, "g2")
    qdrant.index.mirror_alias(alias, "g2")
    assert qdrant.index.resolve_alias(alias) == "g2"
    assert qdrant.ids_through_alias(alias) == {"b1", "b2", "b3"}


def test_alias_to_unknown_generation_is_not_found_and_changes_nothing(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    alias = f"{qdrant.prefix}-live"
    qdrant.index.mirror_alias(alias, "g1")
    with pytest.raises(OrreryError) as raised:
        qdrant.index.mirror_alias(alias, "g-never-created")
    assert raised.value.code is ErrorCode.NOT_FOUND
    assert qdrant.index.resolve_alias(alias) == "g1"


def test_alias_cannot_take_a_collection_name(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    with pytest.raises(OrreryError) as raised:
        qdrant.index.mirror_alias(qdrant.index.collection_name("g1"), "g2")
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert qdrant.ids("g1") == ["a1", "a2"]


def test_dropping_the_generation_removes_its_alias(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    alias = f"{qdrant.prefix}-live"
    qdrant.index.mirror_alias(alias, "g1")
    qdrant.index.drop("g1")
    assert qdrant.index.resolve_alias(alias) is None


def test_alias_to_a_foreign_collection_resolves_to_none(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    other = QdrantServerVectorIndex(qdrant.client, collection_prefix=f"{qdrant.prefix}.other")
    other.create("g1", DIM)
    alias = f"{qdrant.prefix}-live"
    other.mirror_alias(alias, "g1")
    assert other.resolve_alias(alias) == "g1"
    assert qdrant.index.resolve_alias(alias) is None


def test_a_generation_cannot_be_created_under_an_alias_name(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    # Qdrant resolves aliases wherever a collection name goes: "g9" would write into g1.
    qdrant.index.mirror_alias(qdrant.index.collection_name("g9"), "g1")
    with pytest.raises(OrreryError) as raised:
        qdrant.index.create("g9", DIM)
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert qdrant.ids("g1") == ["a1", "a2"]


def test_unsafe_alias_names_are_rejected(qdrant: Qdrant) -> None:
    qdrant.index.create("g1", DIM)
    for bad in ("", "a/b", "../x", "-x"):
        with pytest.raises(OrreryError) as raised:
            qdrant.index.mirror_alias(bad, "g1")
        assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_aliases_of_hostile_namespaces_are_valid_and_distinct(qdrant: Qdrant) -> None:
    _two_generations(qdrant)
    # As `projector.bootstrap` names them for Qdrant.
    names = {
        ns: live_alias_name(ns, "objects", qdrant.prefix) for ns in ("ns", *HOSTILE_NAMESPACES)
    }
    assert len(set(names.values())) == len(names)
    for ns, alias in names.items():
        qdrant.index.mirror_alias(alias, "g2" if ns == "NS" else "g1")
    for ns, alias in names.items():
        assert qdrant.index.resolve_alias(alias) == ("g2" if ns == "NS" else "g1"), ns
        expected = {"b1", "b2", "b3"} if ns == "NS" else {"a1", "a2"}
        assert qdrant.ids_through_alias(alias) == expected, ns


# -- server adapter specifics -----------------------------------------------------------


def test_points_and_payload_are_those_of_qdrant_edge(qdrant: Qdrant) -> None:
    documents = [*CORPUS, doc("0f5c7a52-6c53-4a8e-9a3e-3d0e6f0b9e42"), doc("ABC-Upper")]
    for document in documents:
        pid = vector_payload.point_id(document.document_id)
        assert pid == qdrant_edge_vectors.point_id(document.document_id)
        assert vector_payload.payload_of(document) == qdrant_edge_vectors.payload_of(document)
    qdrant.index.create("g", DIM)
    qdrant.index.apply("g", documents, [])
    stored = qdrant.client.retrieve(
        qdrant.index.collection_name("g"),
        [str(vector_payload.point_id(d.document_id)) for d in documents],
        with_payload=True,
    )
    assert {str(record.id): record.payload for record in stored} == {
        str(vector_payload.point_id(d.document_id)): vector_payload.payload_of(d) for d in documents
    }


def test_create_requests_every_payload_index(
    qdrant: Qdrant, monkeypatch: pytest.MonkeyPatch
) -> None:
    requested: dict[str, Any] = {}
    create_payload_index = qdrant.client.create_payload_index

    def recording(collection_name: str, field_name: str, **kwargs: Any) -> Any:
        requested[field_name] = kwargs["field_schema"]
        return create_payload_index(collection_name, field_name, **kwargs)

    monkeypatch.setattr(qdrant.client, "create_payload_index", recording)
    qdrant.index.create("g", DIM)
    keyword = models.KeywordIndexType.KEYWORD

    def graphed(**params: Any) -> models.KeywordIndexParams:
        return models.KeywordIndexParams(type=keyword, enable_hnsw=True, **params)

    # Payload-aware HNSW links for the equality filters only (GRAPH_FIELDS).
    assert requested == {
        "galaxy": graphed(is_tenant=True),
        "status": graphed(),
        "visibility": graphed(),
        "facets": graphed(),
        "document_id": models.KeywordIndexParams(type=keyword, enable_hnsw=False),
        # Ring filters (issue 12): small selections, served by the payload index.
        "ring": models.KeywordIndexParams(type=keyword, enable_hnsw=False),
        "ring_path": models.KeywordIndexParams(type=keyword, enable_hnsw=False),
        "revision": models.IntegerIndexParams(
            type=models.IntegerIndexType.INTEGER, lookup=True, range=True, enable_hnsw=False
        ),
        "updated_at": models.DatetimeIndexParams(
            type=models.DatetimeIndexType.DATETIME, enable_hnsw=False
        ),
    }


def test_the_server_guards_revisions_when_the_read_is_stale(
    qdrant: Qdrant, monkeypatch: pytest.MonkeyPatch
) -> None:
    qdrant.index.create("g", DIM)
    qdrant.index.apply("g", [doc("d1", 3, status="active")], [])
    # As if another writer stored revision 3 between this writer's read and its write.
    monkeypatch.setattr(qdrant.index, "_present_revisions", lambda name, pids, keys: {})
    qdrant.index.apply("g", [doc("d1", 2, status="archived", vector=unit(0, 1, 0, 0))], [])
    [hit] = qdrant.search.search("g", unit(1, 0, 0, 0), SearchFilter(), 5)
    assert (hit.revision, hit.status, hit.score) == (3, "active", pytest.approx(1.0, abs=1e-6))
    qdrant.index.apply("g", [], [("d1", 2)])
    assert qdrant.index.evidence("g").document_count == 1
    qdrant.index.apply("g", [doc("d1", 4)], [("d1", 3)])  # the upsert lands first
    assert qdrant.index.evidence("g").document_count == 1
    qdrant.index.apply("g", [], [("d1", 4)])
    assert qdrant.index.evidence("g").document_count == 0


def test_generations_are_found_by_a_new_index_object(qdrant: Qdrant) -> None:
    qdrant.index.create("g", DIM)
    qdrant.index.apply("g", list(CORPUS), [])
    other = QdrantServerVectorIndex(qdrant.client, collection_prefix=qdrant.prefix)
    assert other.evidence("g") == qdrant.index.evidence("g")
    with pytest.raises(OrreryError) as raised:  # the dimension is read back from the engine
        other.apply("g", [doc("d1", 2, vector=(1.0, 0.0))], [])
    assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH
    with pytest.raises(OrreryError) as raised:
        other.apply("g-never-created", [doc("d1")], [])
    assert raised.value.code is ErrorCode.NOT_FOUND


def test_constructor_takes_exactly_one_target() -> None:
    for kwargs in ({}, {"url": "http://127.0.0.1:9", "path": ":memory:"}):
        with pytest.raises(OrreryError) as raised:
            QdrantServerVectorIndex(**kwargs)
        assert raised.value.code is ErrorCode.INVALID_REQUEST
        with pytest.raises(OrreryError):
            open_qdrant_client(**kwargs)
    with pytest.raises(OrreryError) as raised:
        QdrantServerVectorIndex(path=":memory:", collection_prefix="a/b")
    assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_closed_index_stays_closed() -> None:
    index = QdrantServerVectorIndex(path=":memory:")
    index.create("g", DIM)
    index.close()
    index.close()  # idempotent
    with pytest.raises(OrreryError) as raised:
        index.evidence("g")
    assert raised.value.code is ErrorCode.INTERNAL


# qdrant-client leaves the lock file of a refused second client open (a ResourceWarning
# when it is collected); that is its leak, not the adapter's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_one_local_client_per_path(tmp_path: Path) -> None:
    first = QdrantServerVectorIndex(path=str(tmp_path))
    try:
        with pytest.raises(DependencyUnavailable) as raised:
            QdrantServerVectorIndex(path=str(tmp_path))
        del raised
        gc.collect()
    finally:
        first.close()


def test_unreachable_server_is_dependency_unavailable() -> None:
    # Port 9 (discard) is closed on test machines: the connection is refused at once.
    index = QdrantServerVectorIndex(url="http://127.0.0.1:9")
    search = QdrantServerVectorSearch(open_qdrant_client(url="http://127.0.0.1:9"))
    try:
        with pytest.raises(DependencyUnavailable):
            index.create("g", DIM)
        with pytest.raises(DependencyUnavailable):
            index.evidence("g")
        with pytest.raises(DependencyUnavailable):
            search.search("g", unit(1, 0, 0, 0), SearchFilter(), 5)
    finally:
        index.close()
        search.close()


def test_the_client_is_newer_than_the_server_on_purpose(qdrant: Qdrant) -> None:
    """qdrant-client 1.20 against the Qdrant 1.16 server (the harness's binary; compose pins
    the same image): the minor-version check is lifted deliberately (the adapters open
    clients with `check_compatibility=False`), and this module plus the "qdrant-server"
    engine of `test_vector_index.py` are what shows the pair works. What the skew costs is
    pinned here so an upgrade of either side comes back to it: a 1.16 server accepts but
    does not keep `enable_hnsw` on payload indexes (1.17+), so the per-field choice of
    payload-aware graph links (`GRAPH_FIELDS`) has no effect there; filters still select
    exactly (test_filter_agreement.py)."""
    client_minor = importlib.metadata.version("qdrant-client").split(".")[:2]
    server_minor = qdrant.client.info().version.split(".")[:2]
    assert (client_minor, server_minor) == (["1", "20"], ["1", "16"])
    qdrant.index.create("g", DIM)
    schema = qdrant.client.get_collection(qdrant.index.collection_name("g")).payload_schema
    galaxy = schema["galaxy"].params
    assert isinstance(galaxy, models.KeywordIndexParams) and galaxy.is_tenant
    assert galaxy.enable_hnsw is None  # sent as True; a 1.16 server drops it
