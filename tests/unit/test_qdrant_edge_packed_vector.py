"""A point written from a `PackedVector` (the write workers' hand-over: float32 values and
the decimals as text) stores in qdrant-edge exactly the vector the same decimals as a
list of floats store: the engine keeps float32, and `_named_vector` gives it the
float32 values instead of parsing the decimals again."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_edge import EdgeShard, Point, UpdateOperation

from contracts.index import IndexDocument
from contracts.stored_vectors import PackedVector, float32_wire, packed_vector
from projector.adapters.qdrant_edge_vectors import (
    VECTOR_NAME,
    QdrantEdgeTuning,
    _named_vector,
)

DIMENSION = 8

values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
vectors = st.lists(values, min_size=DIMENSION, max_size=DIMENSION).filter(
    lambda v: sum(x * x for x in v) > 1e-6
)


def _document(vector: list[float] | PackedVector) -> IndexDocument:
    # Constructed as the projector builds it (`to_index_document`): the vector as it is.
    return IndexDocument.model_construct(
        document_id="d",
        revision=1,
        item_id="i",
        galaxy="g",
        ring="",
        status="active",
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
        vector=vector,
    )


def _stored(tmp: Path, name: str, vector: dict[str, list[float]]) -> list[float]:
    shard = EdgeShard.create(str(tmp / name), QdrantEdgeTuning().edge_config(DIMENSION))
    try:
        pid = uuid.uuid4()
        shard.update(UpdateOperation.upsert_points([Point(pid, vector, {})]))
        (record,) = shard.retrieve([pid], with_payload=False, with_vector=True)
        stored = record.vector
        assert isinstance(stored, dict)
        dense = stored[VECTOR_NAME]
        assert isinstance(dense, list)
        return [float(x) for x in dense]
    finally:
        shard.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(vector=vectors)
def test_a_packed_vector_stores_what_its_decimals_store(
    tmp_path_factory: pytest.TempPathFactory, vector: list[float]
) -> None:
    tmp = tmp_path_factory.mktemp("packed")
    text = json.dumps(vector, separators=(",", ":")).encode()
    packed = packed_vector(float32_wire(vector), text)
    assert packed is not None
    from_list = _named_vector(_document(vector))
    from_packed = _named_vector(_document(packed))
    assert _stored(tmp, "list", from_list) == _stored(tmp, "packed", from_packed)
