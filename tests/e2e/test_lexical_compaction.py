"""The embedded stack's background compactor brings a live generation's tantivy index
to one segment once ingest is quiet, and the answers stay those of the index before."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from orrery.embedded import EmbeddedStack
from projector.adapters import qdrant_edge_vectors as edge_module
from query.settings import QuerySettings

NS = "e2e"
WORDS = ("thermos", "kettle", "garden", "umbrella", "glasses", "keys", "shed", "hook")


def _record(n: int) -> dict[str, Any]:
    words = [WORDS[(n + k) % len(WORDS)] for k in range(3)]
    return {
        "namespace": NS,
        "snapshot_kind": "objects",
        "item_id": f"fact:{n}",
        "revision": 1,
        "payload_schema": "twinr_memory_object_record_v2",
        "payload": {"memory_id": f"fact:{n}"},
        "text": {"title": words[0], "body": " ".join(words), "tags": []},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
    }


def _wait(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _settings(tmp_path: Path) -> QuerySettings:
    return QuerySettings(
        data_dir=tmp_path / "data", cache_responses=False, optimize_interval_seconds=0.5
    )


def _query(text: str) -> dict[str, Any]:
    return {
        "namespace": NS,
        "scope_ref": "longterm:objects:current",
        "query_text": text,
        "result_limit": 10,
    }


def _post_in_segments(client: TestClient, total: int) -> None:
    """POST `total` records ten at a time, each batch applied before the next: one
    commit, so one tantivy segment, per batch."""
    for start in range(0, total, 10):
        response = client.post("/v1/records", json=[_record(n) for n in range(start, start + 10)])
        assert response.status_code == 200, response.text

        def caught_up(count: int = start + 10) -> bool:
            scopes = client.get("/v1/readiness").json().get("scopes", [])
            return sum(s["document_count"] for s in scopes) == count and not any(
                s["lag_events"] for s in scopes
            )

        _wait(caught_up)


def test_the_background_compactor_leaves_one_segment_and_the_same_answers(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    stack = EmbeddedStack.open(settings)
    lexical = stack.projector.lexical
    query = _query("thermos garden")
    try:
        stack.loop.start()  # The projector only: no compactor yet.
        with TestClient(stack.app) as client:
            _post_in_segments(client, 40)
            (generation_id,) = lexical.generation_ids()
            assert lexical.segment_count(generation_id) > 1
            evidence = lexical.evidence(generation_id)
            before = client.post("/v1/external/retrieve/topk_records", json=query)
            assert before.status_code == 200, before.text
            stack.start()
            _wait(lambda: lexical.segment_count(generation_id) == 1)
            after = client.post("/v1/external/retrieve/topk_records", json=query)
            assert lexical.evidence(generation_id) == evidence
            assert before.json()["results"] and [
                (r["document_id"], r["score"]) for r in after.json()["results"]
            ] == [(r["document_id"], r["score"]) for r in before.json()["results"]]
            # Writes after the compaction still land.
            response = client.post("/v1/records", json=[_record(99)])
            assert response.status_code == 200
            _wait(lambda: lexical.evidence(generation_id).document_count == 41)
    finally:
        stack.close()


def test_the_compactor_waits_while_a_vector_build_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the vector index builds HNSW (a real optimize, its child held until a file
    appears), a compaction that is due waits and the tantivy index keeps its segments;
    once the build is swapped in it compacts, and the answers stay those of before."""
    go = tmp_path / "go"
    held = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
    monkeypatch.setattr(edge_module, "_OPTIMIZE_SCRIPT", held + edge_module._OPTIMIZE_SCRIPT)
    settings = _settings(tmp_path)
    stack = EmbeddedStack.open(settings)
    lexical = stack.projector.lexical
    vectors = stack.projector.vectors
    query = _query("thermos garden")
    asked: list[bool] = []

    def building() -> bool:
        now = vectors.building()
        asked.append(now)
        return now

    build: threading.Thread | None = None
    try:
        stack.loop.start()  # The projector only: the compactor is started below.
        with TestClient(stack.app) as client:
            _post_in_segments(client, 30)
            (generation_id,) = lexical.generation_ids()
            assert lexical.segment_count(generation_id) > 1
            before = client.post("/v1/external/retrieve/topk_records", json=query)
            assert before.status_code == 200, before.text
            build = threading.Thread(target=vectors.optimize, args=(generation_id,), daemon=True)
            build.start()
            _wait(vectors.building)
            stack.projector.start_lexical_compactor(
                0.5, growth=settings.lexical_compact_growth, building=building
            )
            _wait(lambda: asked.count(True) >= 4)  # due, and waited ~2 s for the build
            assert lexical.segment_count(generation_id) > 1
            during = client.post("/v1/external/retrieve/topk_records", json=query)
            assert during.json()["results"] == before.json()["results"]
            go.touch()
            build.join(120.0)
            assert not build.is_alive()
            assert not vectors.building()
            _wait(lambda: lexical.segment_count(generation_id) == 1)
            after = client.post("/v1/external/retrieve/topk_records", json=query)
            assert before.json()["results"] and [
                (r["document_id"], r["score"]) for r in after.json()["results"]
            ] == [(r["document_id"], r["score"]) for r in before.json()["results"]]
    finally:
        go.touch()
        stack.close()
        if build is not None:
            build.join(120.0)


def test_a_reopened_generation_gets_its_in_memory_copy_and_the_same_answers(
    tmp_path: Path,
) -> None:
    """A generation opened from disk has no in-memory lexical copy; the background
    compactor builds one from the canonical store once it is quiet (one segment, no
    deleted document), and the answers stay the engine's."""
    settings = _settings(tmp_path)
    query = _query("thermos garden keys")
    first = EmbeddedStack.open(settings)
    try:
        first.loop.start()
        with TestClient(first.app) as client:
            for start in range(0, 30, 10):
                response = client.post(
                    "/v1/records", json=[_record(n) for n in range(start, start + 10)]
                )
                assert response.status_code == 200, response.text

            def caught_up() -> bool:
                scopes = client.get("/v1/readiness").json().get("scopes", [])
                return sum(s["document_count"] for s in scopes) == 30 and not any(
                    s["lag_events"] for s in scopes
                )

            _wait(caught_up)
    finally:
        first.close()
    stack = EmbeddedStack.open(settings)
    lexical = stack.projector.lexical
    try:
        with TestClient(stack.app) as client:
            before = client.post("/v1/external/retrieve/topk_records", json=query)
            assert before.status_code == 200, before.text
            (generation_id,) = lexical.generation_ids()
            assert lexical.flat_for(generation_id) is None
            stack.start()
            _wait(lambda: lexical.flat_for(generation_id) is not None)
            assert lexical.segment_count(generation_id) == 1
            after = client.post("/v1/external/retrieve/topk_records", json=query)
            assert after.json()["query_plan"]["engine_ms"].get("flat_lexical") is not None
            got = [(r["document_id"], r["score"]) for r in after.json()["results"]]
            expected = [(r["document_id"], r["score"]) for r in before.json()["results"]]
            assert expected and [d for d, _ in got] == [d for d, _ in expected]
            assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-6)
    finally:
        stack.close()
