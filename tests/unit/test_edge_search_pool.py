"""A qdrant-edge generation is served with the adapter's search pool size
(`QdrantEdgeTuning.max_search_threads`), whatever size it was created with: the size is
applied when its shard is loaded (opened, reopened, or swapped in optimized) and
persisted, every other setting the shard persisted is kept, and its answers do not
change."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from contracts.index import IndexDocument, SearchFilter
from projector.adapters.qdrant_edge_vectors import (
    _CONFIG_FILE,
    QdrantEdgeTuning,
    QdrantEdgeVectorIndex,
    _search_pool_config,
)
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch

DIMENSION = 4
# Small thresholds, so that `optimize` builds HNSW for a few dozen points.
_SMALL = {"indexing_threshold_kb": 1, "full_scan_threshold_kb": 1}


def _documents() -> list[IndexDocument]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        IndexDocument(
            document_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"d{i}")),
            revision=1 + i % 3,
            item_id=f"item-{i}",
            galaxy="g" if i % 5 else "h",
            ring="",
            status="active" if i % 7 else "archived",
            updated_at=start + timedelta(minutes=i),
            vector=(1.0, 0.05 * (i % 11), 0.5 - 0.03 * (i % 5), 0.2 + 0.01 * i),
        )
        for i in range(80)
    ]


def _answers(index: QdrantEdgeVectorIndex, generation_id: str) -> list[object]:
    search = QdrantEdgeVectorSearch(index.shard_for)
    out: list[object] = [sorted(index.stored_pairs(generation_id))]
    for query in ([1.0, 0.0, 0.0, 0.0], [0.1, 0.9, 0.3, 0.2]):
        for filter in (SearchFilter(), SearchFilter(galaxy="g", status=["active"])):
            found = search.search(generation_id, query, filter, 20)
            out.append([(c.document_id, c.score, c.revision) for c in found])
    return out


def _stored(root: Path, generation_id: str) -> dict[str, Any]:
    live = root / f"{generation_id}+live"
    path = root / (live.read_text().strip() if live.is_file() else generation_id)
    config: dict[str, Any] = json.loads((path / _CONFIG_FILE).read_text())
    return config


def test_a_generation_is_served_with_the_adapters_search_pool(tmp_path: Path) -> None:
    created_with = QdrantEdgeTuning(max_search_threads=None, hnsw_m=8, **_SMALL)
    index = QdrantEdgeVectorIndex(tmp_path, tuning=created_with, flat_scan=False)
    try:
        index.create("g1", DIMENSION)
        index.apply("g1", _documents(), [])
        before = _answers(index, "g1")
    finally:
        index.close()
    assert "max_search_threads" not in _stored(tmp_path, "g1")  # the engine's own

    default = QdrantEdgeTuning(**_SMALL)
    assert default.max_search_threads == 1
    index = QdrantEdgeVectorIndex(tmp_path, tuning=default, flat_scan=False)
    try:
        assert _answers(index, "g1") == before
        stored = _stored(tmp_path, "g1")
        assert stored["max_search_threads"] == 1
        # Everything else the generation was created with is kept.
        assert stored["hnsw_config"]["m"] == 8 != default.hnsw_m
        assert stored["optimizers"]["indexing_threshold"] == 1
        assert stored["vectors"]["dense"] == {"size": DIMENSION, "distance": "Cosine"}
        # Optimized in a child and swapped in: loaded with the same pool, same answers.
        assert index.optimize("g1")
        assert _answers(index, "g1") == before
        assert _stored(tmp_path, "g1")["max_search_threads"] == 1
        assert _stored(tmp_path, "g1")["hnsw_config"]["m"] == 8
    finally:
        index.close()

    # Another size is applied the same way; None leaves the shard's own.
    for threads, expected in ((2, 2), (None, 2)):
        tuning = QdrantEdgeTuning(max_search_threads=threads, **_SMALL)
        index = QdrantEdgeVectorIndex(tmp_path, tuning=tuning, flat_scan=False)
        try:
            assert _answers(index, "g1") == before
            assert _stored(tmp_path, "g1")["max_search_threads"] == expected
        finally:
            index.close()


def test_only_the_adapters_own_vector_layout_is_loaded_with_a_pool_config() -> None:
    dense = {"size": 384, "distance": "Cosine"}
    config = _search_pool_config({"vectors": {"dense": dense}}, 1)
    assert config is not None and config.max_search_threads == 1
    assert config.vectors["dense"].size == 384
    # Anything else is loaded as it is (the engine then uses the shard's own pool).
    for stored in (
        {},
        {"vectors": {}},
        {"vectors": {"dense": {"size": 384, "distance": "Dot"}}},
        {"vectors": {"other": dense}},
        {"vectors": {"dense": {"size": "x", "distance": "Cosine"}}},
        {"vectors": None},
    ):
        assert _search_pool_config(stored, 1) is None
