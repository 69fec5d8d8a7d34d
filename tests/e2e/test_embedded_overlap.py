"""The embedded one-shot gives the same answers however its engine calls are arranged:
sources and score lookups side by side (`QueryPorts.overlap`, what a generation without
in-memory copies gets; the vector search after tantivy's has begun or right away,
`QueryPorts.lexical_first`), or everything one after the other, the vector search
first (what a generation with an in-memory copy gets, and one `overlap_for` refuses)."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import orrery.embedded as embedded
from bench.topk import Vocabulary, corpus_batches, make_queries, topk_body
from contracts.errors import DependencyUnavailable
from orrery.embedded import EmbeddedStack
from query.settings import QuerySettings

NOW = datetime(2026, 1, 15, tzinfo=UTC)
SEED = 20_260_101
SIZE = 600
QUERIES = 24


class _Broken:
    """A port whose searches and lookups fail as an unreachable engine's do."""

    def __init__(self, inner: Any, engine: str) -> None:
        self._inner = inner
        self._engine = engine

    def search(self, *args: Any, **kwargs: Any) -> Any:
        raise DependencyUnavailable(self._engine, "down")

    def scores(self, *args: Any, **kwargs: Any) -> Any:
        raise DependencyUnavailable(self._engine, "down")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _SlowLexical:
    """The lexical port, its searches held back a moment: every vector search then ends
    first, so both lookups run beside the lexical search (what a large generation's
    slower tantivy search gives), deterministically."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def search(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return self._inner.search(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_Arrange = Callable[[Any], Any]
ARRANGEMENTS: dict[str, _Arrange] = {
    "side-by-side": lambda ports: dataclasses.replace(ports, overlap_for=lambda _g: True),
    "side-by-side, vector first": lambda ports: dataclasses.replace(
        ports, overlap_for=lambda _g: True, lexical_first=False
    ),
    "side-by-side, lookups beside the lexical search": lambda ports: dataclasses.replace(
        ports, overlap_for=lambda _g: True, lexical=_SlowLexical(ports.lexical)
    ),
    "one after the other, refused side by side": lambda ports: dataclasses.replace(
        ports, overlap_for=lambda _g: False
    ),
    "sequential": lambda ports: dataclasses.replace(ports, overlap=None),
}


def _settings(data_dir: Path) -> QuerySettings:
    return QuerySettings(data_dir=data_dir, cache_responses=False, max_batch=2_000)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("overlap") / "data"
    stack = EmbeddedStack.open(_settings(data_dir))
    stack.loop.start()
    try:
        with TestClient(stack.app) as client:
            vocab = Vocabulary.build(random.Random(SEED))
            for body in corpus_batches(SIZE, 300, SEED, vocab):
                response = client.post(
                    "/v1/records", content=body, headers={"content-type": "application/json"}
                )
                assert response.status_code == 200, response.text
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                scopes = client.get("/v1/readiness").json().get("scopes", [])
                count = sum(s["document_count"] for s in scopes)
                if scopes and count == SIZE and sum(s["lag_events"] for s in scopes) == 0:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the corpus was not projected in time")
    finally:
        stack.close()
    return data_dir


def _stack(data_dir: Path, arrange: _Arrange, monkeypatch: pytest.MonkeyPatch) -> EmbeddedStack:
    ports_of = embedded.embedded_query_ports
    with monkeypatch.context() as patch:
        # A fixed clock: freshness is the same in every arrangement.
        patch.setattr(
            embedded,
            "embedded_query_ports",
            lambda *a, **k: dataclasses.replace(arrange(ports_of(*a, **k)), clock=lambda: NOW),
        )
        return EmbeddedStack.open(_settings(data_dir))


def _answers(
    data_dir: Path, arrange: _Arrange, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    stack = _stack(data_dir, arrange, monkeypatch)
    try:
        with TestClient(stack.app) as client:
            rng = random.Random(SEED + 1)
            queries = make_queries(rng, Vocabulary.build(random.Random(SEED)), QUERIES)
            for query in queries:  # Embeds each query text once: later asks find it known.
                client.post("/v1/external/retrieve/topk_records", json=topk_body(query, 1))
            for query in queries:
                response = client.post(
                    "/v1/external/retrieve/topk_records", json=topk_body(query, 10)
                )
                assert response.status_code == 200, response.text
                answer = response.json()
                yield {
                    "results": [
                        [r["document_id"], r["score"], r["score_breakdown"]]
                        for r in answer["results"]
                    ],
                    "rescored": answer["query_plan"]["rescored_count"],
                }
    finally:
        stack.close()


def test_every_arrangement_answers_alike(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: dict[str, list[dict[str, Any]]] = {}
    for name, arrange in ARRANGEMENTS.items():
        copy = tmp_path / name.replace(" ", "-").replace(",", "")
        shutil.copytree(built, copy)
        answers[name] = list(_answers(copy, arrange, monkeypatch))
    reference = answers.pop("sequential")
    # The re-score looked missing scores up: the lookups' arrangement was exercised.
    assert sum(a["rescored"] for a in reference) > 0
    assert all(a["results"] for a in reference)
    for name, given in answers.items():
        assert json.dumps(given) == json.dumps(reference), name


def test_the_default_arrangement_runs_one_after_the_other_with_an_in_memory_copy(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded ports run a generation's sources side by side only when neither has
    an in-memory copy; with one, one after the other on the request's thread (no
    lexical search beside the vector one)."""
    copy = tmp_path / "decided"
    shutil.copytree(built, copy)
    made: list[Any] = []
    stack = _stack(copy, lambda ports: made.append(ports) or ports, monkeypatch)
    try:
        (ports,) = made
        (generation_id, *_), *_ = stack.projector.state.generations()
        flat = stack.projector.vectors.flat_for(generation_id)
        assert flat is not None  # 600 points: scanned flat
        assert ports.overlap_of(generation_id) is None
    finally:
        stack.close()


@pytest.mark.parametrize(
    ("broken", "reported"),
    [(("vectors",), "qdrant-edge"), (("lexical",), "tantivy"), (("vectors", "lexical"), "tantivy")],
)
def test_one_after_the_other_a_failure_of_both_reports_the_lexical_one(
    built: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broken: tuple[str, ...],
    reported: str,
) -> None:
    def arrange(ports: Any) -> Any:
        ports = dataclasses.replace(ports, overlap_for=lambda _g: False)
        engines = {"vectors": "qdrant-edge", "lexical": "tantivy"}
        return dataclasses.replace(
            ports, **{port: _Broken(getattr(ports, port), engines[port]) for port in broken}
        )

    copy = tmp_path / "broken"
    shutil.copytree(built, copy)
    stack = _stack(copy, arrange, monkeypatch)
    try:
        with TestClient(stack.app) as client:
            rng = random.Random(SEED + 1)
            (query,) = make_queries(rng, Vocabulary.build(random.Random(SEED)), 1)
            response = client.post("/v1/external/retrieve/topk_records", json=topk_body(query, 10))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["details"]["dependency"] == reported
    finally:
        stack.close()
