"""qdrant-edge generations created since session 26 store `updated_at` as integer
microseconds with an integer range index (`payload_of(micros=True)`), not RFC 3339 text
with a datetime index: the binding converts a string only after failing bool, u64, i64
and f64, and the datetime index parses it again. Time filters must match such a
generation exactly as they match one written as text (inclusive bounds, to the
microsecond, for every `datetime`), and every reader must take either form."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_edge import (
    DatetimeIndexParams,
    EdgeShard,
    PayloadSchemaType,
    Point,
    Query,
    QueryRequest,
    SearchParams,
    UpdateOperation,
)

from contracts.index import IndexDocument, SearchFilter
from contracts.index_fields import DOCUMENT_ID, UPDATED_AT
from contracts.point_table import PointTable
from contracts.vector_payload import (
    VECTOR_NAME,
    candidate_of,
    payload_of,
    point_id,
    utc_micros,
)
from projector.adapters.qdrant_edge_vectors import (
    _PAYLOAD_INDEXES,
    QdrantEdgeTuning,
    QdrantEdgeVectorIndex,
)
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch, edge_filter

DIMENSION = 4
_MIN = datetime.min.replace(tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)
# Instants where float64 microseconds are exact, and far past it (steps of 2-32 us).
ANCHORS = (
    _MIN,
    datetime(1, 1, 1, 0, 0, 7, 3, tzinfo=UTC),
    datetime(1500, 6, 1, 12, tzinfo=UTC),
    datetime(1685, 1, 1, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    datetime(2255, 6, 1, tzinfo=UTC),
    datetime(7000, 3, 3, 3, 3, 3, 333_333, tzinfo=UTC),
    _MAX,
)


def _instants() -> list[datetime]:
    """Each anchor and its neighbours a few microseconds either side."""
    out: set[datetime] = set()
    for anchor in ANCHORS:
        for step in (-40, -17, -3, -1, 0, 1, 2, 5, 31):
            try:
                out.add(anchor + timedelta(microseconds=step))
            except OverflowError:
                continue
    return sorted(out)


INSTANTS = _instants()


def _document(index: int, updated_at: datetime, *, uuid_id: bool = False) -> IndexDocument:
    return IndexDocument(
        document_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"doc-{index}"))
        if uuid_id
        else f"doc-{index}",
        revision=1,
        item_id=f"item-{index}",
        galaxy="g",
        ring="",
        status="active",
        updated_at=updated_at,
        vector=(1.0, 0.1 * (index % 7), 0.5, 1.0),
    )


@given(st.datetimes(timezones=st.just(UTC)))
def test_micros_are_exact_and_read_back_as_the_text_is(instant: datetime) -> None:
    document = _document(1, instant)
    text = payload_of(document, singletons=True)
    micros = payload_of(document, singletons=True, micros=True)
    assert type(micros[UPDATED_AT]) is int
    assert micros[UPDATED_AT] == utc_micros(instant)
    assert {k: v for k, v in micros.items() if k != UPDATED_AT} == {
        k: v for k, v in text.items() if k != UPDATED_AT
    }
    read = candidate_of(micros, 0.5)
    assert read.updated_at == instant and read.updated_at.tzinfo == UTC
    table = PointTable()
    with table.writing():
        table.put([(1, micros)])
    assert table.get(1) == (read.document_id, read.revision, instant, read.status)
    assert read == candidate_of(text, 0.5)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EdgeShard, EdgeShard]]:
    """The same corpus twice: `updated_at` as text with a datetime index (generations
    before session 26), and as integer microseconds with this adapter's indexes now."""
    root = tmp_path_factory.mktemp("edge-micros")
    corpus = [_document(index, instant) for index, instant in enumerate(INSTANTS)]
    old_indexes = {**_PAYLOAD_INDEXES, UPDATED_AT: DatetimeIndexParams()}
    made = []
    for name, indexes, micros in (("text", old_indexes, False), ("micros", _PAYLOAD_INDEXES, True)):
        shard = EdgeShard.create(str(root / name), QdrantEdgeTuning().edge_config(DIMENSION))
        for field, schema in indexes.items():
            shard.update(UpdateOperation.create_field_index(field, schema))
        points = [
            Point(
                point_id(d.document_id),
                {VECTOR_NAME: list(d.vector or ())},
                payload_of(d, singletons=True, micros=micros),
            )
            for d in corpus
        ]
        shard.update(UpdateOperation.upsert_points(points))
        made.append(shard)
    old, new = made
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def _ids(shard: EdgeShard, filter: SearchFilter, *, micros: bool) -> set[str]:
    points = shard.query(
        QueryRequest(
            limit=1_000,
            query=Query.Nearest([1.0, 0.0, 0.0, 0.0], using=VECTOR_NAME),
            filter=edge_filter(filter, micros=micros),
            with_payload=True,
            with_vector=False,
            params=SearchParams(exact=True),
        )
    )
    return {str((p.payload or {})[DOCUMENT_ID]) for p in points}


def _expected(filter: SearchFilter) -> set[str]:
    low, high = filter.updated_after, filter.updated_before
    return {
        f"doc-{index}"
        for index, instant in enumerate(INSTANTS)
        if (low is None or instant >= low) and (high is None or instant <= high)
    }


bounds = st.none() | st.sampled_from(INSTANTS) | st.datetimes(timezones=st.just(UTC))


@settings(max_examples=150, deadline=None)
@given(bounds, bounds)
def test_time_filters_match_micros_as_they_match_text(
    shards: tuple[EdgeShard, EdgeShard], after: datetime | None, before: datetime | None
) -> None:
    old, new = shards
    filter = SearchFilter(updated_after=after, updated_before=before)
    found = _ids(new, filter, micros=True)
    assert found == _expected(filter)
    assert found == _ids(old, filter, micros=False)


def test_the_new_layout_holds_integers_under_an_integer_index(
    shards: tuple[EdgeShard, EdgeShard],
) -> None:
    old, new = shards
    assert new.info().payload_schema[UPDATED_AT].data_type == PayloadSchemaType.Integer
    assert old.info().payload_schema[UPDATED_AT].data_type == PayloadSchemaType.Datetime
    (record,) = new.retrieve([point_id("doc-0")], with_payload=True, with_vector=False)
    assert (record.payload or {})[UPDATED_AT] == utc_micros(INSTANTS[0])


@pytest.mark.parametrize("flat_scan", [False, True])
def test_a_generation_written_and_searched_through_the_adapters(
    tmp_path: Path, flat_scan: bool
) -> None:
    """A new UUID-id generation (session 26's layout; integer-id ones store every
    `document_id`, `tests/conformance/test_integer_point_ids.py`) stores integers, and no
    `document_id` that is its point id; its searches and scores filter on time as the
    text did (inclusive bounds) and read `updated_at` and the document ids back as
    written (from payloads, the point table, the flat copy, the stored pairs)."""
    index = QdrantEdgeVectorIndex(tmp_path, flat_scan=flat_scan, integer_ids=False)
    try:
        index.create("g1", DIMENSION)
        documents = [
            _document(i, INSTANTS[i], uuid_id=i % 2 == 0) for i in range(0, len(INSTANTS), 3)
        ]
        index.apply("g1", documents, [])
        for document in documents[:2]:
            (record,) = index.shard_for("g1").retrieve(
                [point_id(document.document_id)], with_payload=True, with_vector=False
            )
            payload = record.payload or {}
            assert payload[UPDATED_AT] == utc_micros(document.updated_at)
            implied = document.document_id == str(point_id(document.document_id))
            assert (DOCUMENT_ID in payload) is not implied
        assert any(d.document_id == str(point_id(d.document_id)) for d in documents)
        written = sorted((d.document_id, d.revision) for d in documents)
        assert sorted(index.stored_pairs("g1")) == written
        assert sorted(index.pairs_of("g1", [d.document_id for d in documents])) == written
        if flat_scan:
            flat = index.flat_for("g1")
            assert flat is not None
            found = flat.search([1.0, 0.0, 0.0, 0.0], SearchFilter(), 100)
            assert found is not None
            assert {c.document_id: c.updated_at for c in found} == {
                d.document_id: d.updated_at for d in documents
            }
        pivot = documents[len(documents) // 2].updated_at
        filter = SearchFilter(updated_after=pivot)
        # Read from payloads, then from the point table.
        for search in (
            QdrantEdgeVectorSearch(index.shard_for),
            QdrantEdgeVectorSearch(index.shard_for, points_provider=index.points_for),
        ):
            found = search.search("g1", [1.0, 0.0, 0.0, 0.0], filter, 100)
            assert {c.document_id: c.updated_at for c in found} == {
                d.document_id: d.updated_at for d in documents if d.updated_at >= pivot
            }
        search = QdrantEdgeVectorSearch(index.shard_for)
        listed = tuple(d.document_id for d in documents)
        scored = search.scores(
            "g1",
            [1.0, 0.0, 0.0, 0.0],
            SearchFilter(updated_before=pivot, document_ids=listed),
        )
        assert set(scored) == {d.document_id for d in documents if d.updated_at <= pivot}
    finally:
        index.close()
