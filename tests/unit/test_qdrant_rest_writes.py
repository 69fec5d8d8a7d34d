"""The Qdrant server adapter's REST writes send what qdrant-client sends.

`QdrantServerVectorIndex.apply` builds its `points/batch` body itself (plain dicts,
serialized once by pydantic-core) when its client is a plain REST one; qdrant-client's
local mode and clients the REST path does not reproduce keep the client's models
(`_upsert_operations`, `_delete_operations`). For any batch — several revisions,
shard keys, ring paths, facets, visibility, deletes — the two bodies are the same JSON.
The vector conformance suite runs every case through the REST path against the real
server (`tests/conformance/test_vector_index.py`, `qdrant-server`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import to_json
from qdrant_client import QdrantClient, models
from qdrant_client.http.api.points_api import jsonable_encoder

from contracts.index import IndexDocument
from contracts.vector_payload import point_key
from projector.adapters.qdrant_vectors import (
    _delete_json,
    _delete_operations,
    _RestWrites,
    _upsert_json,
    _upsert_operations,
)

_NAMES = st.text(alphabet="abcxyz-é", min_size=1, max_size=6)


@st.composite
def _documents(draw: st.DrawFn) -> IndexDocument:
    dimension = draw(st.integers(1, 6))
    vector = tuple(
        draw(st.lists(st.floats(-1.0, 1.0, width=32), min_size=dimension, max_size=dimension))
    )
    return IndexDocument(
        document_id=str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1)))),
        revision=draw(st.integers(1, 4)),
        item_id="item",
        galaxy=draw(_NAMES),
        ring=draw(st.sampled_from(("", "docs", "docs/security/keys"))),
        status=draw(_NAMES),
        updated_at=datetime(2026, 1, 1, tzinfo=UTC)
        + timedelta(microseconds=draw(st.integers(0, 10**12))),
        visibility=tuple(draw(st.lists(_NAMES, max_size=3))),
        facets=draw(st.dictionaries(_NAMES, st.lists(_NAMES, max_size=2).map(tuple), max_size=2)),
        vector=vector,
    )


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_documents(), max_size=12),
    st.dictionaries(st.uuids().map(str), st.integers(1, 5), max_size=6),
    st.sampled_from((None, "s0c0", "s2c1")),
)
def test_the_rest_body_is_the_clients(
    documents: list[IndexDocument], deletes: dict[str, int], key: str | None
) -> None:
    writes = {point_key(d.document_id): d for d in documents}
    client = jsonable_encoder(
        models.UpdateOperations(
            operations=[*_upsert_operations(writes, key), *_delete_operations(deletes, key)]
        )
    )
    ours = to_json({"operations": [*_upsert_json(writes, key), *_delete_json(deletes, key)]})
    assert json.loads(ours) == json.loads(client)


def test_only_a_plain_rest_client_takes_the_rest_path() -> None:
    plain = QdrantClient(url="http://127.0.0.1:1", check_compatibility=False)
    headers = QdrantClient(url="http://127.0.0.1:1", metadata={"x": "1"}, check_compatibility=False)
    local = QdrantClient(location=":memory:")
    try:
        assert _RestWrites.of(plain) is not None
        assert _RestWrites.of(headers) is None
        assert _RestWrites.of(local) is None
    finally:
        for client in (plain, headers, local):
            client.close()
