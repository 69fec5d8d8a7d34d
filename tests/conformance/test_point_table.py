"""The point tables the embedded vector search reads its candidates' fields from
(`contracts.point_table`) hold what qdrant-edge's payload holds, through any sequence of
writes, overwrites, stale writes, deletes and a reopen; and a search through them answers
exactly what a search reading payloads answers.

The vector conformance suite runs every case through them too (`qdrant-edge-points` in
`test_vector_index.ENGINES`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_edge import ScrollRequest

from contracts.errors import OrreryError
from contracts.index import Candidate, IndexDocument, SearchFilter
from contracts.index_fields import HIDDEN_FACET
from contracts.point_table import PointTable
from contracts.vector_payload import RETURNED_FIELDS, candidate_of, with_id
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch, VectorMemo
from tests.conformance.corpus import doc

DIM = 6
_T0 = datetime(2026, 1, 1, tzinfo=UTC)

vectors = st.lists(st.integers(-3, 3), min_size=DIM, max_size=DIM).filter(any)
# Ids: plain strings (their point id is a uuid5) and canonical UUIDs (their own point id).
_IDS = [f"d{n}" for n in range(12)] + [str(uuid.UUID(int=n + 1)) for n in range(4)]
documents = st.builds(
    lambda document_id, rev, galaxy, status, micros, vector, hidden: doc(
        document_id,
        rev,
        galaxy=galaxy,
        status=status,
        updated_at=_T0 + timedelta(microseconds=micros),
        vector=tuple(float(x) for x in vector),
        facets={HIDDEN_FACET: ("vector",)} if hidden else None,
    ),
    st.sampled_from(_IDS),
    st.integers(1, 4),
    st.sampled_from(("g1", "g2")),
    st.sampled_from(("active", "draft", "archived")),
    st.integers(0, 10**12),
    vectors,
    st.sampled_from((False, False, False, True)),
)
batches = st.lists(
    st.tuples(
        st.lists(documents, max_size=6),
        st.lists(st.tuples(st.sampled_from(_IDS), st.integers(1, 5)), max_size=3),
    ),
    min_size=1,
    max_size=6,
)
Batch = tuple[list[IndexDocument], list[tuple[str, int]]]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "vectors"


def _index(root: Path, *, inline: bool = True) -> QdrantEdgeVectorIndex:
    return QdrantEdgeVectorIndex(root, flat_scan=False, point_tables_inline=inline)


def _payload_fields(
    index: QdrantEdgeVectorIndex, generation: str
) -> dict[object, tuple[object, ...]]:
    """What the shard's payload says of every point, as `candidate_of` reads it."""
    shard = index.shard_for(generation)
    ids = index.ids_for(generation)
    out: dict[object, tuple[object, ...]] = {}
    offset = None
    while True:
        records, offset = shard.scroll(
            ScrollRequest(
                offset=offset, limit=100, with_payload=list(RETURNED_FIELDS), with_vector=False
            )
        )
        for record in records:
            # A document id that is its point id is not stored (`implied_id`).
            candidate = candidate_of(with_id(record.payload or {}, record.id), 0.0)
            pid = record.id if isinstance(record.id, int) else uuid.UUID(str(record.id))
            out[ids.key(pid)] = (*candidate[:2], *candidate[3:])
        if offset is None:
            return out


def _table_fields(table: PointTable, pids: set[object]) -> dict[object, tuple[object, ...]]:
    return {pid: fields for pid in pids if (fields := table.get(pid)) is not None}


def _assert_table_is_the_payload(index: QdrantEdgeVectorIndex, generation: str) -> None:
    table = index.points_for(generation)
    assert table is not None
    expected = _payload_fields(index, generation)
    assert len(table) == len(expected)
    assert _table_fields(table, set(expected)) == expected
    # Field by field identical, types and time zones included.
    for pid, fields in expected.items():
        held = table.get(pid)
        assert held is not None
        assert [type(v) for v in held] == [type(v) for v in fields]
        assert held[2].tzinfo == fields[2].tzinfo  # type: ignore[union-attr]


def _assert_searches_agree(index: QdrantEdgeVectorIndex, generation: str) -> None:
    """A search through the table answers exactly (fields and scores) what one reading
    payloads answers, for a few queries, filters and limits."""
    with_table = QdrantEdgeVectorSearch(index.shard_for, points_provider=index.points_for)
    with_payload = QdrantEdgeVectorSearch(index.shard_for)
    for vector in ([1.0, 0, 0, 0, 0, 0], [0.5, -1, 2, 0, 1, 0], [0, 0, 0, 0, 0, 1.0]):
        for filter in (SearchFilter(), SearchFilter(galaxy="g1"), SearchFilter(status=("draft",))):
            for limit in (1, 3, 50):
                got = with_table.search(generation, vector, filter, limit)
                assert got == with_payload.search(generation, vector, filter, limit)
                assert all(isinstance(c, Candidate) for c in got)
    # The re-score's lookups by revision: each side with a fresh memo, so the engine's
    # exact lookup reads the revisions (from the table, or from payloads) and fills it.
    # Every point, those hidden from the vector lane too (never scored: `_read` skips
    # them).
    present = {
        str(fields[0]): int(str(fields[1]))
        for fields in _payload_fields(index, generation).values()
    }
    # Some named at the revision held, some at another one (then the engine's score).
    asked = {d: r + (n % 3 == 0) for n, (d, r) in enumerate(sorted(present.items()))}
    ids = SearchFilter(document_ids=(*asked, "nowhere"))
    looked_up = [
        QdrantEdgeVectorSearch(index.shard_for, memo=VectorMemo(), points_provider=points).scores(
            generation, [0.5, -1, 2, 0, 1, 0], ids, revisions=asked, tenant="t"
        )
        for points in (index.points_for, None)
    ]
    assert looked_up[0] == looked_up[1]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(before=batches, after=batches, built_after=st.integers(0, 3))
def test_the_table_holds_what_the_payload_holds_through_writes_and_a_reopen(
    root: Path, before: list[Batch], after: list[Batch], built_after: int
) -> None:
    generation = f"pt-{uuid.uuid4().hex[:12]}"
    index = _index(root)
    try:
        index.create(generation, DIM)
        for number, (upserts, deletes) in enumerate(before):
            if number == built_after:
                # Built from the shard here; kept by `apply` from then on.
                assert index.points_for(generation) is not None
            index.apply(generation, upserts, deletes)
        _assert_table_is_the_payload(index, generation)
        _assert_searches_agree(index, generation)
    finally:
        index.close()
    # A reopened generation's table is read from its shard, then kept by `apply` again.
    index = _index(root)
    try:
        _assert_table_is_the_payload(index, generation)
        for upserts, deletes in after:
            index.apply(generation, upserts, deletes)
        _assert_table_is_the_payload(index, generation)
        _assert_searches_agree(index, generation)
    finally:
        index.drop(generation)
        index.close()


def test_a_read_stamped_before_a_write_is_refused() -> None:
    """The seqlock: `candidates` answers None for a stamp taken before (or during) a
    write window, so a search never pairs one moment's scores with another's fields."""
    table = PointTable()
    payload = {
        "document_id": "a",
        "revision": 1,
        "status": "active",
        "updated_at": "2026-01-01T00:00:00.000000Z",
    }
    with table.writing():
        assert table.stamp() is None  # a window is open: no read may start
        table.put([(7, payload)])
    stamp = table.stamp()
    assert stamp is not None
    assert table.candidates([7], [0.5], stamp) == [candidate_of(payload, 0.5)]
    assert table.candidates([8], [0.5], stamp) is None  # not held: ask the engine
    with table.writing():
        table.put([(7, {**payload, "revision": 2})])
    assert table.candidates([7], [0.5], stamp) is None
    assert table.candidates([7], [1.5], table.stamp() or 0) == [
        candidate_of({**payload, "revision": 2}, 1.5)  # clamped as `candidate_of` clamps
    ]
    with pytest.raises(RuntimeError), table.writing():
        raise RuntimeError("the shard's update failed")
    assert table.stamp() is None  # left open for good: the owner drops it


@dataclasses.dataclass(frozen=True)
class _Hit:
    """An engine hit as `PointTable.hits` reads it (`ScoredPoint`'s `id` and `score`)."""

    id: object
    score: float


def test_hits_are_the_candidates_of_their_ids_and_scores() -> None:
    """`hits` answers what `candidates` answers for the same points' `uuid.UUID.int`
    keys and scores (clamped alike), and None for an id that is no UUID, a point not
    held, or a stamp taken before a write."""
    table = PointTable()
    keys = [uuid.uuid5(uuid.NAMESPACE_URL, f"d{n}") for n in range(4)]
    with table.writing():
        table.put(
            (
                key.int,
                {
                    "document_id": f"d{n}",
                    "revision": n + 1,
                    "status": ("active", "draft")[n % 2],
                    "updated_at": f"2026-01-0{n + 1}T00:00:00.000000Z",
                },
            )
            for n, key in enumerate(keys)
        )
    stamp = table.stamp()
    assert stamp is not None
    scores = [0.25, -1.5, 1.0000001, -0.75]
    hits = [_Hit(key, score) for key, score in zip(keys, scores, strict=True)]
    expected = table.candidates([key.int for key in keys], scores, stamp)
    assert expected is not None
    assert table.hits(hits, stamp) == expected
    assert [c.score for c in expected] == [0.25, -1.0, 1.0, -0.75]
    assert table.hits([], stamp) == []
    assert table.hits([*hits, _Hit(7, 0.5)], stamp) is None  # an integer id: no key
    assert table.hits([_Hit(uuid.uuid4(), 0.5)], stamp) is None  # not held
    with table.writing():
        table.remove([keys[0].int])
    assert table.hits(hits[1:], stamp) is None  # stamped before the write


def test_a_refused_write_leaves_the_table_equal_to_the_shard(root: Path) -> None:
    index = _index(root)
    try:
        index.create("g", DIM)
        index.apply("g", [doc("a", vector=(1.0, 0, 0, 0, 0, 0))], [])
        assert index.points_for("g") is not None
        with pytest.raises(OrreryError):  # another dimension: refused before any write
            index.apply("g", [doc("b", 2, vector=(1.0, 0, 0))], [])
        _assert_table_is_the_payload(index, "g")
    finally:
        index.close()


@pytest.fixture
def background_index(root: Path) -> Iterator[QdrantEdgeVectorIndex]:
    index = _index(root, inline=False)
    yield index
    index.close()


def test_a_table_built_in_the_background_while_writes_flow_ends_equal_to_the_shard(
    background_index: QdrantEdgeVectorIndex,
) -> None:
    """The build reads the shard without the write lock; what `apply` touches meanwhile
    is read again at its end. Writes (new points, overwrites, deletes) run throughout."""
    index = background_index
    index.create("g", DIM)
    index.apply("g", [doc(f"d{n}", vector=(1.0, n % 7, 0, 0, 0, 1)) for n in range(600)], [])
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            index.apply(
                "g",
                [doc(f"d{n % 900}", 2 + n // 900, vector=(1.0, 0, n % 5, 0, 0, 1))],
                [(f"d{(n * 7) % 600}", 1)],
            )
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert index.points_for("g") is None  # the build starts in the background
        deadline = time.monotonic() + 60
        while index.points_for("g") is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)  # a few more writes through the built table
    finally:
        stop.set()
        writer.join()
    _assert_table_is_the_payload(index, "g")
    _assert_searches_agree(index, "g")


def test_a_generation_past_the_bound_gets_no_table(root: Path) -> None:
    index = QdrantEdgeVectorIndex(root, flat_scan=False, point_table_max_points=2)
    try:
        index.create("g", DIM)
        index.apply("g", [doc(f"d{n}", vector=(1.0, n, 0, 0, 0, 0)) for n in range(3)], [])
        assert index.points_for("g") is None
        assert index.points_for("g") is None  # not retried at once
        search = QdrantEdgeVectorSearch(index.shard_for, points_provider=index.points_for)
        found = search.search("g", [1.0, 2, 0, 0, 0, 0], SearchFilter(), 1)
        assert [c.document_id for c in found] == ["d2"]
    finally:
        index.close()
