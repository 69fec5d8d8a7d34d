"""Conformance suite for `EngineReadback` (`stored_pairs`): what an engine holds for a
generation, read back from the engine itself. Every lexical and vector engine runs every
test; server engines are marked `servers` (OpenSearch and the Qdrant server come from
the harness).

`stored_pairs` is the evidence `orrery gen verify` and the query workers' eligibility
checks compare with the registry, so it must see exactly what searches see: writes,
deletes, stale writes that were refused — and documents removed behind the registry's
back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts.digests import id_set_digest
from contracts.errors import OrreryError
from contracts.index import IndexDocument
from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from projector.adapters.qdrant_vectors import QdrantServerVectorIndex
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.ports import EngineReadback
from tests.conformance.corpus import CORPUS, DIM, doc
from tests.conftest import require_server, run_tag

PREFIX = f"orrery-test-{run_tag()}"


@dataclass
class Engine:
    """One engine's index (`apply`, `create`, `drop`, `close`) and its readback."""

    create: Callable[[str], None]
    apply: Callable[[str, Sequence[IndexDocument], Sequence[tuple[str, int]]], None]
    drop: Callable[[str], None]
    readback: EngineReadback
    evidence_digest: Callable[[str], str]
    close: Callable[[], None]


def _engine(index: Any, create: Callable[[str], None] | None = None) -> Engine:
    """`Engine` over an index adapter (`create` overrides `index.create`, e.g. to give
    a vector index its dimension)."""
    return Engine(
        create or index.create,
        index.apply,
        index.drop,
        index,
        lambda g: index.evidence(g).id_set_digest,
        index.close,
    )


def _tantivy(workdir: Path) -> Engine:
    return _engine(TantivyLexicalIndex(workdir / "tantivy"))


def _opensearch(workdir: Path) -> Engine:
    url = require_server("opensearch")
    return _engine(OpenSearchLexicalIndex(url, index_prefix=PREFIX, refresh_interval="100ms"))


def _qdrant_edge(workdir: Path) -> Engine:
    index = QdrantEdgeVectorIndex(workdir / "edge")
    return _engine(index, lambda g: index.create(g, DIM))


def _qdrant(workdir: Path) -> Engine:
    index = QdrantServerVectorIndex(url=require_server("qdrant"), collection_prefix=PREFIX)
    return _engine(index, lambda g: index.create(g, DIM))


ENGINES: dict[str, Callable[[Path], Engine]] = {
    "tantivy": _tantivy,
    "opensearch": _opensearch,
    "qdrant-edge": _qdrant_edge,
    "qdrant": _qdrant,
}
MARKS: dict[str, Sequence[pytest.MarkDecorator]] = {
    "opensearch": [pytest.mark.servers],
    "qdrant": [pytest.mark.servers],
}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, ())) for n in ENGINES])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, str]]:
    handle = ENGINES[request.param](tmp_path)
    generation_id = f"rb-{uuid.uuid4().hex[:10]}"
    handle.create(generation_id)
    yield handle, generation_id
    handle.drop(generation_id)
    handle.close()


def test_empty_generation_reads_back_nothing(engine: tuple[Engine, str]) -> None:
    handle, generation_id = engine
    assert handle.readback.stored_pairs(generation_id) == []


def test_reads_back_exactly_what_was_written(engine: tuple[Engine, str]) -> None:
    handle, generation_id = engine
    handle.apply(generation_id, CORPUS, [])
    pairs = handle.readback.stored_pairs(generation_id)
    assert sorted(pairs) == sorted((d.document_id, d.revision) for d in CORPUS)
    assert id_set_digest(pairs) == handle.evidence_digest(generation_id)


def test_reads_back_updates_deletes_and_refused_stale_writes(engine: tuple[Engine, str]) -> None:
    handle, generation_id = engine
    handle.apply(generation_id, CORPUS, [])
    first, second = CORPUS[0].document_id, CORPUS[1].document_id
    handle.apply(generation_id, [doc(first, 3, title="newer")], [(second, 5)])
    handle.apply(generation_id, [doc(first, 2, title="stale")], [])
    pairs = dict(handle.readback.stored_pairs(generation_id))
    assert pairs[first] == 3
    assert second not in pairs
    assert len(pairs) == len(CORPUS) - 1


def test_unknown_generation_is_an_error(engine: tuple[Engine, str]) -> None:
    handle, _ = engine
    with pytest.raises(OrreryError):
        handle.readback.stored_pairs(f"missing-{uuid.uuid4().hex[:8]}")


def test_a_paced_read_back_yields_between_chunks_and_reads_the_same(
    engine: tuple[Engine, str],
) -> None:
    # More documents than any adapter reads in one page or chunk (at most 5,000).
    handle, generation_id = engine
    many = [doc(f"paced-{i:05d}", 1 + i % 3) for i in range(5_001)]
    for start in range(0, len(many), 1_000):
        handle.apply(generation_id, many[start : start + 1_000], [])
    calls: list[int] = []
    paced = handle.readback.stored_pairs(generation_id, pace=lambda: calls.append(1))
    assert sorted(paced) == sorted((d.document_id, d.revision) for d in many)
    assert sorted(paced) == sorted(handle.readback.stored_pairs(generation_id))
    assert calls
