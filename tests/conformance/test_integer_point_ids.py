"""Integer point ids (`contracts.point_ids`): a qdrant-edge generation created since session
27 keys its points by a 63-bit hash of the document id, and one whose hash another
document's point holds keeps its UUID id. Forced to collide (an injected hash with three
values), any upserts, deletes and re-upserts leave visible exactly what a UUID-id
generation leaves, and every search and listed lookup answers the same; a collision never
returns nor deletes another document's point. Generations created before (UUID ids, no
`+ids` file) keep working.

The vector-index and vector-search conformance suites run on integer-id generations as
they are (every index there creates new generations).
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import projector.adapters.qdrant_edge_vectors as edge_module
from contracts.index import IndexDocument, SearchFilter
from contracts.index_fields import HIDDEN_FACET
from contracts.point_ids import INT_ID_SCHEME, PointIds, int_point_id
from projector.adapters.qdrant_edge_vectors import QdrantEdgeTuning, QdrantEdgeVectorIndex
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch, VectorMemo
from tests.conformance.corpus import doc
from tests.conformance.test_vector_index import HeldChild, OptimizeThread, _leftovers, _wait_for

DIM = 6
_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_TUNING = QdrantEdgeTuning(indexing_threshold_kb=1, full_scan_threshold_kb=1)
# Plain ids and canonical UUIDs (their own UUID point id), 16 in all, on 3 hash values.
_IDS = [f"d{n}" for n in range(12)] + [str(uuid.UUID(int=n + 1)) for n in range(4)]


def _colliding(document_id: str) -> int:
    """A hash with three values: nearly every pair of documents collides."""
    return 5 + _IDS.index(document_id) % 3 if document_id in _IDS else 4


vectors = st.lists(st.integers(-3, 3), min_size=DIM, max_size=DIM).filter(any)
documents = st.builds(
    lambda document_id, rev, galaxy, vector, hidden: doc(
        document_id,
        rev,
        galaxy=galaxy,
        updated_at=_T0 + timedelta(seconds=rev),
        vector=tuple(float(x) for x in vector),
        facets={HIDDEN_FACET: ("vector",)} if hidden else None,
    ),
    st.sampled_from(_IDS),
    st.integers(1, 4),
    st.sampled_from(("g1", "g2")),
    vectors,
    st.sampled_from((False, False, False, True)),
)
batches = st.lists(
    st.tuples(
        st.lists(documents, max_size=6),
        st.lists(st.tuples(st.sampled_from(_IDS), st.integers(1, 5)), max_size=4),
    ),
    min_size=1,
    max_size=8,
)
Batch = tuple[list[IndexDocument], list[tuple[str, int]]]
_QUERIES = ([1.0, 0, 0, 0, 0, 0], [0.5, -1, 2, 0, 1, 0], [0, 0, 0, 0, 0, 1.0])


def _integer(root: Path) -> QdrantEdgeVectorIndex:
    return QdrantEdgeVectorIndex(
        root, flat_scan=False, point_tables_inline=True, point_hash=_colliding
    )


def _uuid(root: Path) -> QdrantEdgeVectorIndex:
    return QdrantEdgeVectorIndex(root, flat_scan=False, integer_ids=False)


def _searches(index: QdrantEdgeVectorIndex) -> list[QdrantEdgeVectorSearch]:
    """Through the point table and through payloads, both told the generation's ids."""
    return [
        QdrantEdgeVectorSearch(
            index.shard_for, points_provider=index.points_for, ids_provider=index.ids_for
        ),
        QdrantEdgeVectorSearch(index.shard_for, ids_provider=index.ids_for),
    ]


def _answers(index: QdrantEdgeVectorIndex, search: QdrantEdgeVectorSearch) -> list[object]:
    """What the generation "g" shows: its pairs, listed pairs, searches (plain, filtered,
    listed) and listed score lookups, with and without revisions."""
    present = dict(index.stored_pairs("g"))
    listed_sets = [tuple(_IDS[:5]), tuple(_IDS[5:11]), (*_IDS, "nowhere"), (_IDS[3],)]
    out: list[object] = [
        sorted(present.items()),
        sorted(index.pairs_of("g", [*_IDS, "nowhere"])),
    ]
    for vector in _QUERIES:
        for filter in (SearchFilter(), SearchFilter(galaxy="g1")):
            for limit in (1, 4, 50):
                out.append(search.search("g", vector, filter, limit))
        for listed in listed_sets:
            filter = SearchFilter(document_ids=listed)
            out.append(search.search("g", vector, filter, 3))
            out.append(search.search("g", vector, filter, 50))
            out.append(search.scores("g", vector, filter))
    # The re-score's lookups at revisions (a fresh memo: the engine's exact lookup reads
    # them), some at the revision held, some at another one.
    asked = {d: r + (n % 3 == 0) for n, (d, r) in enumerate(sorted(present.items()))}
    asked["nowhere"] = 1
    memoized = QdrantEdgeVectorSearch(
        index.shard_for,
        memo=VectorMemo(),
        points_provider=search._points_provider,
        ids_provider=index.ids_for,
    )
    scored = memoized.scores(
        "g", _QUERIES[1], SearchFilter(document_ids=tuple(asked)), revisions=asked, tenant="t"
    )
    out.append({d: round(s, 6) for d, s in scored.items()})  # the memo's float64 sums
    return out


def _assert_same(integer: QdrantEdgeVectorIndex, uuid_ids: QdrantEdgeVectorIndex) -> None:
    expected = _answers(uuid_ids, QdrantEdgeVectorSearch(uuid_ids.shard_for))
    for search in _searches(integer):
        assert _answers(integer, search) == expected


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(before=batches, after=batches)
def test_colliding_integer_ids_answer_what_uuid_ids_answer(
    tmp_path_factory: pytest.TempPathFactory, before: list[Batch], after: list[Batch]
) -> None:
    """Upserts, deletes and re-upserts over documents forced to collide: after every
    call, and across a reopen (the fallback set read back from its file), the visible
    `(document_id, revision)` set and every search and lookup equal the UUID scheme's."""
    root = tmp_path_factory.mktemp("ids")
    integer, uuid_ids = _integer(root / "int"), _uuid(root / "uuid")
    try:
        for index in (integer, uuid_ids):
            index.create("g", DIM)
        assert integer.points_for("g") is not None
        for upserts, deletes in before:
            for index in (integer, uuid_ids):
                index.apply("g", upserts, deletes)
            _assert_same(integer, uuid_ids)
        fallback = set(integer.ids_for("g").fallback)
        integer.close()
        integer = _integer(root / "int")
        assert integer.ids_for("g").fallback == fallback
        for upserts, deletes in after:
            for index in (integer, uuid_ids):
                index.apply("g", upserts, deletes)
        _assert_same(integer, uuid_ids)
    finally:
        integer.close()
        uuid_ids.close()


def test_a_collision_never_returns_nor_deletes_another_documents_point(tmp_path: Path) -> None:
    """ "d0" and "d3" share a hash: "d0" holds it, so "d3" (absent) is never found there
    and its delete leaves "d0" alone; once written, "d3" keeps its UUID point id."""
    index = _integer(tmp_path)
    try:
        index.create("g", DIM)
        index.apply("g", [doc("d0", 2, vector=(1.0, 0, 0, 0, 0, 0))], [])
        index.apply("g", [], [("d3", 9)])
        assert index.stored_pairs("g") == [("d0", 2)]
        listed = SearchFilter(document_ids=("d3",))
        for search in _searches(index):
            assert search.search("g", _QUERIES[0], listed, 5) == []
            assert search.scores("g", _QUERIES[0], listed) == {}
        assert index.pairs_of("g", ["d3"]) == []
        index.apply("g", [doc("d3", 1, vector=(0, 1.0, 0, 0, 0, 0))], [])
        assert index.ids_for("g").fallback == {"d3"}
        assert sorted(index.stored_pairs("g")) == [("d0", 2), ("d3", 1)]
        pids = {
            type(p.id)
            for p in index.shard_for("g").retrieve([5], with_payload=False, with_vector=False)
        }
        assert pids == {int}
        index.apply("g", [], [("d0", 2)])
        assert index.stored_pairs("g") == [("d3", 1)]
        # "d0" is gone: the hash is free, and "d6" (the same hash) takes it.
        index.apply("g", [doc("d6", 1, vector=(0, 0, 1.0, 0, 0, 0))], [])
        assert index.ids_for("g").fallback == {"d3"}
        lines = (tmp_path / "g+ids").read_text(encoding="utf-8").splitlines()
        assert lines == [INT_ID_SCHEME, '"d3"']
    finally:
        index.close()


def test_a_uuid_id_generation_is_opened_written_and_searched_as_before(tmp_path: Path) -> None:
    """A generation created with UUID ids (every one before session 27: no `+ids` file)
    opened by an index that creates integer-id ones: it keeps UUID ids for its writes,
    deletes, table, searches and lookups; a new generation beside it gets integer ids."""
    old = QdrantEdgeVectorIndex(tmp_path, flat_scan=False, integer_ids=False)
    try:
        old.create("g", DIM)
        old.apply("g", [doc(d, vector=(1.0, n, 0, 0, 0, 1)) for n, d in enumerate(_IDS)], [])
    finally:
        old.close()
    assert not (tmp_path / "g+ids").exists()
    index = QdrantEdgeVectorIndex(tmp_path, flat_scan=False, point_tables_inline=True)
    try:
        assert not index.ids_for("g").integer
        index.apply("g", [doc("d1", 2, vector=(0, 1.0, 0, 0, 0, 0))], [("d2", 1)])
        records, _ = index.shard_for("g").scroll(
            edge_module.ScrollRequest(limit=100, with_payload=False)
        )
        assert {type(r.id) for r in records} == {uuid.UUID}
        assert len(records) == len(_IDS) - 1
        for search in [QdrantEdgeVectorSearch(index.shard_for), *_searches(index)]:
            top = search.search("g", _QUERIES[1], SearchFilter(), 3)
            assert [c.document_id for c in top] == ["d0", "d3", "d4"]
            listed = SearchFilter(document_ids=("d1", "d2", "d5"))
            assert sorted(search.scores("g", _QUERIES[0], listed)) == ["d1", "d5"]
            assert [c.document_id for c in search.search("g", _QUERIES[0], listed, 5)] == [
                "d5",
                "d1",
            ]
        index.create("h", DIM)
        index.apply("h", [doc("d1", vector=(1.0, 0, 0, 0, 0, 0))], [])
        assert index.ids_for("h").integer
        assert (tmp_path / "h+ids").read_text(encoding="utf-8") == INT_ID_SCHEME + "\n"
        records, _ = index.shard_for("h").scroll(edge_module.ScrollRequest(limit=10))
        assert [r.id for r in records] == [int_point_id("d1")]
        index.drop("h")
        assert not (tmp_path / "h+ids").exists()
    finally:
        index.close()


@pytest.mark.parametrize("journal_bytes", [0, edge_module._MAX_JOURNAL_BYTES])
def test_an_optimize_swaps_in_colliding_integer_ids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, journal_bytes: int
) -> None:
    """Writes over colliding documents while the child optimizes the copy, journaled as
    operations or as point ids (integer and UUID ones): the swapped-in shard answers what
    a UUID-id twin answers, and the fallback file outlives the swap."""
    child = HeldChild(monkeypatch, tmp_path)
    edge = QdrantEdgeVectorIndex(
        tmp_path / "edge",
        tuning=_TUNING,
        flat_scan=False,
        point_tables_inline=True,
        point_hash=_colliding,
        max_journal_bytes=journal_bytes,
    )
    twin = QdrantEdgeVectorIndex(tmp_path / "twin", tuning=_TUNING, integer_ids=False)
    rng = random.Random(27)

    def vector() -> tuple[float, ...]:
        return tuple(rng.uniform(-1, 1) for _ in range(DIM))

    def apply(upserts: list[IndexDocument], deletes: list[tuple[str, int]]) -> None:
        for index in (edge, twin):
            index.apply("g", upserts, deletes)

    try:
        for index in (edge, twin):
            index.create("g", DIM)
        assert edge.points_for("g") is not None
        # Enough vectors for an HNSW segment; all on one hash value (`_colliding`).
        apply([doc(f"p{n}", vector=vector()) for n in range(200)], [])
        apply([doc(d, vector=vector()) for d in _IDS[:6]], [])
        optimizer = OptimizeThread(edge, "g")
        optimizer.start()
        _wait_for(lambda: (tmp_path / "edge" / ".g.optimizing").exists())
        apply([doc(d, 2, vector=vector()) for d in _IDS[4:]], [("d1", 1)])
        apply([], [("d0", 5), ("d9", 1)])
        apply([doc("d0", 6, vector=vector()), doc("d1", 3, vector=vector())], [])
        child.release()
        optimizer.join_or_fail(300.0)
        assert (optimizer.error, optimizer.result) == (None, True)
        assert edge.ids_for("g").fallback
        assert (tmp_path / "edge" / "g+ids").exists()
        assert _leftovers(tmp_path / "edge") == []
        _assert_same(edge, twin)
    finally:
        edge.close()
        twin.close()


@pytest.mark.parametrize("pid", [0, 5, (1 << 63) - 1, uuid.UUID(int=5), uuid.uuid4()])
def test_journal_ids_keep_their_kind(pid: int | uuid.UUID) -> None:
    raw = edge_module._pid_bytes(pid)
    assert len(raw) == edge_module._ID_BYTES
    back = edge_module._pid_of_bytes(raw)
    assert back == pid and type(back) is type(pid)


def test_point_ids_of_a_generation() -> None:
    ids = PointIds(True, {"b"}, _colliding)
    assert ids.of("d0") == 5 and ids.key(5) == 5
    assert isinstance(ids.of("b"), uuid.UUID)
    assert PointIds(False).key(uuid.UUID(int=7)) == 7
    assert 0 <= int_point_id("any") < 1 << 63
    assert int_point_id("any") == int_point_id("any") != int_point_id("Any")
