"""One conformance suite for the vector port pair (`VectorIndex` + `VectorSearch`).

Every engine runs the same cases through `ENGINES`, a dict of factories keyed by engine
name; a server engine is added there with its marks in `ENGINE_MARKS`. A factory opens
(or reopens) the engine on `storage` and returns its `index`, its `search` and a way to
build ANN structures (`optimize`). Each test gets a unique generation id, dropped at
the end.

`FILTER_CASES` are the filter cases the lexical suite uses too: same corpus, same
expected document sets.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.index import Candidate, IndexDocument, SearchFilter
from projector.adapters.qdrant_edge_vectors import (
    QdrantEdgeTuning,
    QdrantEdgeVectorIndex,
    point_id,
)
from projector.ports import IndexEvidence, VectorIndex
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch
from query.ports import VectorSearch
from tests.conformance.corpus import CORPUS, DIM, doc, unit

# -- engines under test ----------------------------------------------------------------


@dataclass
class Engine:
    index: VectorIndex
    search: VectorSearch
    optimize: Callable[[str], None]


EngineFactory = Callable[[Path], Engine]

# Thresholds of 1 KB so that `optimize` really builds HNSW on the small test corpora and
# searches really go through the graph afterwards.
_EDGE_TEST_TUNING = QdrantEdgeTuning(indexing_threshold_kb=1, full_scan_threshold_kb=1)


def _qdrant_edge(storage: Path) -> Engine:
    index = QdrantEdgeVectorIndex(storage, tuning=_EDGE_TEST_TUNING)

    def optimize(generation_id: str) -> None:
        index.optimize(generation_id)

    return Engine(index=index, search=QdrantEdgeVectorSearch(index.shard_for), optimize=optimize)


ENGINES: dict[str, EngineFactory] = {"qdrant-edge": _qdrant_edge}
ENGINE_MARKS: dict[str, list[pytest.MarkDecorator]] = {}


class Harness:
    """One engine and one fresh generation; `restart` closes and reopens the storage."""

    def __init__(self, factory: EngineFactory, storage: Path) -> None:
        self._factory = factory
        self._storage = storage
        self._engine = factory(storage)
        self.generation_id = f"gen-{uuid.uuid4().hex[:12]}"

    @property
    def index(self) -> VectorIndex:
        return self._engine.index

    @property
    def search(self) -> VectorSearch:
        return self._engine.search

    def restart(self) -> None:
        self._engine.index.close()
        self._engine = self._factory(self._storage)

    def optimize(self) -> None:
        self._engine.optimize(self.generation_id)

    def apply(
        self, upserts: list[IndexDocument], deletes: list[tuple[str, int]] | None = None
    ) -> None:
        self.index.apply(self.generation_id, upserts, deletes or [])

    def query(
        self,
        vector: tuple[float, ...] = unit(1, 0, 0, 0),
        filter: SearchFilter | None = None,
        limit: int = 10,
    ) -> list[Candidate]:
        return self.search.search(self.generation_id, vector, filter or SearchFilter(), limit)

    def ids(
        self,
        vector: tuple[float, ...] = unit(1, 0, 0, 0),
        filter: SearchFilter | None = None,
        limit: int = 10,
    ) -> list[str]:
        return [c.document_id for c in self.query(vector, filter, limit)]

    def evidence(self) -> IndexEvidence:
        return self.index.evidence(self.generation_id)


@pytest.fixture(
    params=[pytest.param(name, marks=ENGINE_MARKS.get(name, [])) for name in ENGINES],
)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(ENGINES[request.param], tmp_path / "vectors")
    harness.index.create(harness.generation_id, DIM)
    try:
        yield harness
    finally:
        harness.index.drop(harness.generation_id)
        harness.index.close()


@pytest.fixture
def loaded(engine: Harness) -> Harness:
    engine.apply(list(CORPUS))
    return engine


def pairs(*docs: IndexDocument) -> set[tuple[str, int]]:
    return {(d.document_id, d.revision) for d in docs}


# -- the fixed corpus ------------------------------------------------------------------

# Query unit(1, 0, 0, 0): cosines d1 1.0, d2 0.994, d5 0.707, d3 0.0, d4 0.0 (tie -> id).
NEAREST_ORDER = ["d1", "d2", "d5", "d3", "d4"]
EXPECTED_SCORES = {"d1": 1.0, "d2": 0.9 / (0.82**0.5), "d5": 0.5**0.5, "d3": 0.0, "d4": 0.0}


def _at(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


MICROSECOND = timedelta(microseconds=1)

FILTER_CASES: dict[str, tuple[SearchFilter, set[str]]] = {
    "galaxy": (SearchFilter(galaxy="default"), {"d1", "d2", "d3", "d4"}),
    "galaxy-other": (SearchFilter(galaxy="other"), {"d5"}),
    "galaxy-unknown": (SearchFilter(galaxy="nowhere"), set()),
    "status-one": (SearchFilter(status=("active",)), {"d1", "d3", "d5"}),
    "status-any": (SearchFilter(status=("candidate", "archived")), {"d2", "d4"}),
    "visibility-one": (SearchFilter(visibility=("guests",)), {"d2"}),
    "visibility-any": (SearchFilter(visibility=("private", "guests")), {"d2", "d3"}),
    "visibility-shared": (SearchFilter(visibility=("family",)), {"d1", "d2", "d4", "d5"}),
    "updated-inclusive": (
        SearchFilter(updated_after=_at(2026, 2, 1), updated_before=_at(2026, 4, 1)),
        {"d2", "d3", "d4"},
    ),
    "updated-after-exclusive-by-1us": (
        SearchFilter(updated_after=_at(2026, 2, 1) + MICROSECOND),
        {"d3", "d4", "d5"},
    ),
    "updated-before-exclusive-by-1us": (
        SearchFilter(updated_before=_at(2026, 2, 1) - MICROSECOND),
        {"d1"},
    ),
    "updated-other-timezone": (
        SearchFilter(updated_after=datetime(2026, 3, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))),
        {"d3", "d4", "d5"},
    ),
    "updated-empty-range": (
        SearchFilter(updated_after=_at(2026, 4, 2), updated_before=_at(2026, 4, 1)),
        set(),
    ),
    "facet-any": (SearchFilter(facets={"room": ("hall", "kitchen")}), {"d1", "d2"}),
    "facets-all-names": (SearchFilter(facets={"room": ("flur",), "lang": ("de",)}), {"d3"}),
    "facets-name-missing": (SearchFilter(facets={"room": ("garden",), "lang": ("de",)}), set()),
    "facet-value-is-per-name": (SearchFilter(facets={"lang": ("hall",)}), set()),
    "document-ids": (SearchFilter(document_ids=("d2", "d4", "unknown")), {"d2", "d4"}),
    "combined": (
        SearchFilter(galaxy="default", status=("active",), visibility=("family",)),
        {"d1"},
    ),
    "empty-status": (SearchFilter(status=()), set()),
    "empty-visibility": (SearchFilter(visibility=()), set()),
    "empty-document-ids": (SearchFilter(document_ids=()), set()),
    "empty-facet-values": (SearchFilter(facets={"room": ()}), set()),
}


def test_nearest_order_on_fixed_corpus(loaded: Harness) -> None:
    results = loaded.query(limit=10)
    assert [c.document_id for c in results] == NEAREST_ORDER
    for candidate in results:
        assert candidate.score == pytest.approx(EXPECTED_SCORES[candidate.document_id], abs=1e-5)
        assert -1.0 <= candidate.score <= 1.0
    by_id = {c.document_id: c for c in results}
    assert by_id["d4"].status == "archived"
    assert by_id["d4"].updated_at == _at(2026, 4, 1)
    assert by_id["d4"].revision == 1


def test_limit_keeps_the_best(loaded: Harness) -> None:
    assert loaded.ids(limit=2) == ["d1", "d2"]
    assert loaded.ids(limit=4) == ["d1", "d2", "d5", "d3"]  # d3/d4 tie: lower id first
    assert loaded.ids(limit=0) == []


def test_other_query_vectors(loaded: Harness) -> None:
    assert loaded.ids(unit(0, 1, 0, 0), limit=3) == ["d3", "d5", "d2"]
    assert loaded.ids(unit(0, 0, 1, 0), limit=1) == ["d4"]


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_filter(loaded: Harness, case: str) -> None:
    search_filter, expected = FILTER_CASES[case]
    assert loaded.ids(filter=search_filter) == [d for d in NEAREST_ORDER if d in expected]


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_filter_does_not_change_scores(loaded: Harness, case: str) -> None:
    unfiltered = {c.document_id: c.score for c in loaded.query(limit=10)}
    for candidate in loaded.query(filter=FILTER_CASES[case][0], limit=10):
        assert candidate.score == pytest.approx(unfiltered[candidate.document_id], abs=1e-6)


def test_filter_restricts_before_the_limit(loaded: Harness) -> None:
    # d3 and d4 are the two worst matches: a post-filter on the top 2 would return nothing.
    assert loaded.ids(filter=SearchFilter(facets={"room": ("flur", "garden")}), limit=2) == [
        "d3",
        "d4",
    ]


def test_ties_are_broken_by_document_id_across_the_limit(engine: Harness) -> None:
    twins = [doc(f"t{i:02d}", vector=unit(0, 0, 0, 1)) for i in range(12)]
    random.Random(3).shuffle(twins)
    engine.apply([*twins, doc("best", vector=unit(0.1, 0, 0, 1))])
    assert engine.ids(unit(0, 0, 0, 1), limit=4) == ["t00", "t01", "t02", "t03"]
    assert engine.ids(unit(0.1, 0, 0, 1), limit=3) == ["best", "t00", "t01"]


def test_reapplying_is_idempotent(loaded: Harness) -> None:
    before = (loaded.evidence(), loaded.query(limit=10))
    loaded.apply(list(CORPUS), [("d4", 0)])
    loaded.apply(list(CORPUS))
    assert (loaded.evidence(), loaded.query(limit=10)) == before


def test_newer_revision_replaces_older(loaded: Harness) -> None:
    loaded.apply([doc("d4", 2, vector=unit(1, 0, 0, 0), status="active")])
    results = {c.document_id: c for c in loaded.query(limit=10)}
    assert (results["d4"].revision, results["d4"].status) == (2, "active")
    assert results["d4"].score == pytest.approx(1.0, abs=1e-6)
    assert loaded.ids(filter=SearchFilter(status=("archived",))) == []


def test_out_of_order_revisions_keep_the_newest(engine: Harness) -> None:
    engine.apply([doc("d1", 3, status="active", vector=unit(1, 0, 0, 0))])
    engine.apply([doc("d1", 2, status="archived", vector=unit(0, 1, 0, 0))])
    [hit] = engine.query()
    assert (hit.revision, hit.status) == (3, "active")
    assert hit.score == pytest.approx(1.0, abs=1e-6)
    # Within one call the highest revision wins whatever the order.
    engine.apply([doc("d2", 5, status="active"), doc("d2", 7, status="candidate"), doc("d2", 6)])
    assert {(c.document_id, c.revision, c.status) for c in engine.query()} == {
        ("d1", 3, "active"),
        ("d2", 7, "candidate"),
    }


def test_delete_removes_present_revision(loaded: Harness) -> None:
    loaded.apply([], [("d2", 1)])
    assert "d2" not in loaded.ids()
    loaded.apply([], [("d2", 1), ("never-indexed", 4)])
    assert loaded.evidence().document_count == len(CORPUS) - 1


def test_stale_delete_is_ignored(loaded: Harness) -> None:
    loaded.apply([doc("d3", 3, vector=unit(0, 1, 0, 0))])
    loaded.apply([], [("d3", 2)])
    assert "d3" in loaded.ids()
    loaded.apply([], [("d3", 3)])
    assert "d3" not in loaded.ids()


def test_upsert_and_delete_in_one_call(engine: Harness) -> None:
    engine.apply([doc("a", 2), doc("b", 3), doc("c", 1)], [("a", 2), ("b", 2), ("c", 5)])
    assert engine.ids() == ["b"]
    # A delete of the present document in the same call as an older upsert.
    engine.apply([doc("b", 2)], [("b", 3)])
    assert engine.ids() == []


@pytest.mark.parametrize(
    "bad",
    [
        doc("bad", vector=(1.0, 0.0, 0.0)),
        doc("bad", vector=(1.0, 0.0, 0.0, 0.0, 0.0)),
        doc("bad", vector=(float("nan"), 0.0, 0.0, 0.0)),
        doc("bad", vector=(0.0, 0.0, 0.0, 0.0)),
        doc("bad").model_copy(update={"vector": None}),
    ],
    ids=["too-short", "too-long", "nan", "zero", "missing"],
)
def test_bad_vector_rejects_the_whole_call(engine: Harness, bad: IndexDocument) -> None:
    with pytest.raises(OrreryError) as raised:
        engine.apply([doc("good"), bad])
    assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH
    assert engine.evidence().document_count == 0


def test_create_is_idempotent_and_checks_dimension(loaded: Harness) -> None:
    loaded.index.create(loaded.generation_id, DIM)
    assert loaded.evidence().document_count == len(CORPUS)
    with pytest.raises(OrreryError) as raised:
        loaded.index.create(loaded.generation_id, DIM + 1)
    assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH


def test_query_vector_of_wrong_dimension(loaded: Harness) -> None:
    with pytest.raises(OrreryError) as raised:
        loaded.query(vector=(1.0, 0.0, 0.0))
    assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH


def test_unknown_generation_is_coverage_unavailable(engine: Harness) -> None:
    with pytest.raises(OrreryError) as raised:
        engine.search.search("gen-never-created", unit(1, 0, 0, 0), SearchFilter(), 5)
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE


def test_naive_time_bound_is_rejected(loaded: Harness) -> None:
    with pytest.raises(OrreryError) as raised:
        loaded.query(filter=SearchFilter(updated_after=datetime(2026, 1, 1)))
    assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_evidence_digest(loaded: Harness) -> None:
    assert loaded.evidence() == IndexEvidence(
        document_count=len(CORPUS), id_set_digest=id_set_digest(pairs(*CORPUS))
    )
    loaded.apply([doc("d1", 4), doc("d9", 2)], [("d5", 1)])
    expected = pairs(*CORPUS) - {("d1", 1), ("d5", 1)} | {("d1", 4), ("d9", 2)}
    assert loaded.evidence() == IndexEvidence(
        document_count=len(expected), id_set_digest=id_set_digest(expected)
    )


def test_evidence_of_empty_generation(engine: Harness) -> None:
    assert engine.evidence() == IndexEvidence(document_count=0, id_set_digest=id_set_digest([]))


def test_evidence_pages_through_many_documents(engine: Harness) -> None:
    docs = [doc(str(uuid.UUID(int=i + 1)), i % 3 + 1) for i in range(2_345)]
    for start in range(0, len(docs), 1_000):
        engine.apply(docs[start : start + 1_000])
    assert engine.evidence() == IndexEvidence(
        document_count=len(docs), id_set_digest=id_set_digest(pairs(*docs))
    )


def test_restart_keeps_everything(loaded: Harness) -> None:
    loaded.apply([doc("d9", 2, vector=unit(0, 0, 0, 1))], [("d2", 1)])
    before = (
        loaded.evidence(),
        loaded.query(limit=10),
        loaded.query(filter=FILTER_CASES["facet-any"][0]),
    )
    loaded.restart()
    after = (
        loaded.evidence(),
        loaded.query(limit=10),
        loaded.query(filter=FILTER_CASES["facet-any"][0]),
    )
    assert after == before
    loaded.apply([doc("d9", 1)])  # revision rules still hold after the restart
    assert {c.document_id: c.revision for c in loaded.query()}["d9"] == 2


def test_drop_removes_the_generation(loaded: Harness) -> None:
    loaded.index.drop(loaded.generation_id)
    with pytest.raises(OrreryError) as raised:
        loaded.query()
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE
    loaded.index.drop(loaded.generation_id)  # no-op when absent
    loaded.index.create(loaded.generation_id, DIM)
    assert loaded.evidence().document_count == 0


def test_optimize_keeps_the_top_results(engine: Harness) -> None:
    rng = random.Random(20260319)
    statuses = ("active", "candidate", "archived")
    docs = [
        doc(
            f"r{i:04d}",
            vector=unit(*(rng.uniform(-1, 1) for _ in range(DIM))),
            status=statuses[i % 3],
            galaxy=("g1", "g2")[i % 2],
        )
        for i in range(600)
    ]
    engine.apply(docs)
    queries = [unit(*(rng.uniform(-1, 1) for _ in range(DIM))) for _ in range(10)]
    filters = [SearchFilter(), SearchFilter(galaxy="g1", status=("active", "candidate"))]

    def top() -> list[list[str]]:
        return [engine.ids(q, filter=f, limit=10) for q in queries for f in filters]

    before = top()
    engine.optimize()
    assert top() == before
    engine.apply([doc("late", vector=queries[0], galaxy="g1")])  # writes after optimize
    assert engine.ids(queries[0], filter=filters[1], limit=1) == ["late"]


# -- qdrant-edge specifics -------------------------------------------------------------


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[QdrantEdgeVectorIndex]:
    index = QdrantEdgeVectorIndex(tmp_path / "edge", tuning=_EDGE_TEST_TUNING)
    try:
        yield index
    finally:
        index.close()


def test_edge_point_ids() -> None:
    canonical = "0f5c7a52-6c53-4a8e-9a3e-3d0e6f0b9e42"
    assert point_id(canonical) == uuid.UUID(canonical)
    assert point_id(canonical.upper()) != uuid.UUID(canonical)
    assert point_id("d1") == point_id("d1") != point_id("d2")


def test_edge_shard_for_unknown_generation_raises_key_error(
    edge: QdrantEdgeVectorIndex,
) -> None:
    with pytest.raises(KeyError):
        edge.shard_for("gen-x")
    with pytest.raises(OrreryError) as raised:
        edge.apply("gen-x", [doc("d1")], [])
    assert raised.value.code is ErrorCode.NOT_FOUND


def test_edge_rejects_unsafe_generation_ids(edge: QdrantEdgeVectorIndex) -> None:
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(OrreryError) as raised:
            edge.create(bad, DIM)
        assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_edge_optimize_builds_hnsw(edge: QdrantEdgeVectorIndex) -> None:
    edge.create("g", DIM)
    edge.apply("g", [doc(f"x{i}", vector=unit(1, i, 0, 1)) for i in range(300)], [])
    assert edge.unindexed_count("g") == 300
    assert not edge.optimize_if_needed("g", min_unindexed=301)
    assert edge.optimize_if_needed("g", min_unindexed=100)
    assert edge.unindexed_count("g") == 0
    assert not edge.optimize_if_needed("g", min_unindexed=0)


def test_edge_small_segments_need_no_optimize(tmp_path: Path) -> None:
    index = QdrantEdgeVectorIndex(tmp_path / "edge")  # default 10 MB indexing threshold
    try:
        index.create("g", DIM)
        index.apply("g", [doc(f"x{i}", vector=unit(1, i, 0, 1)) for i in range(300)], [])
        assert index.unindexed_count("g") == 300
        assert not index.optimize_needed("g", min_unindexed=1)
        assert not index.optimize("g")  # qdrant-edge leaves small segments unindexed
        assert index.unindexed_count("g") == 300
    finally:
        index.close()


def test_edge_optimize_in_subprocess(edge: QdrantEdgeVectorIndex) -> None:
    edge.create("g", DIM)
    edge.apply("g", [doc(f"x{i:03d}", vector=unit(1, i, 0, 1)) for i in range(300)], [])
    search = QdrantEdgeVectorSearch(edge.shard_for)
    before = search.search("g", unit(1, 7, 0, 1), SearchFilter(), 5)
    assert edge.optimize("g", in_subprocess=True)
    assert edge.unindexed_count("g") == 0
    assert search.search("g", unit(1, 7, 0, 1), SearchFilter(), 5) == before
    edge.apply("g", [doc("x007", 2, vector=unit(0, 0, 1, 0))], [])
    assert search.search("g", unit(0, 0, 1, 0), SearchFilter(), 1)[0].revision == 2


def test_edge_background_optimizer(edge: QdrantEdgeVectorIndex) -> None:
    edge.create("g", DIM)
    edge.apply("g", [doc(f"x{i}", vector=unit(1, i, 0, 1)) for i in range(300)], [])
    edge.start_background_optimizer(0.02, min_unindexed=10)
    edge.start_background_optimizer(0.02, min_unindexed=10)  # second call: no-op
    deadline = time.monotonic() + 30
    while edge.unindexed_count("g") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert edge.unindexed_count("g") == 0
    edge.drop("g")  # waits for a running optimize, then removes the shard


def test_edge_reopens_generations_lazily(tmp_path: Path) -> None:
    first = QdrantEdgeVectorIndex(tmp_path / "edge")
    first.create("g", DIM)
    first.apply("g", list(CORPUS), [])
    first.close()
    with pytest.raises(OrreryError):
        first.evidence("g")  # a closed index stays closed
    second = QdrantEdgeVectorIndex(tmp_path / "edge")
    try:
        search = QdrantEdgeVectorSearch(second.shard_for)
        assert [
            c.document_id for c in search.search("g", unit(1, 0, 0, 0), SearchFilter(), 10)
        ] == (NEAREST_ORDER)
        with pytest.raises(OrreryError) as raised:
            second.apply("g", [doc("d1", 2, vector=(1.0, 0.0))], [])
        assert raised.value.code is ErrorCode.EMBEDDER_MISMATCH
    finally:
        second.close()
