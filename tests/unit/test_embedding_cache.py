"""The content-addressed vector store (`ORRERY_EMBEDDING_CACHE_DIR`): a hit is the exact
vector the embedder gives that text, shared by instances (processes) over one directory."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projector.adapters.embedding_cache import CACHE_FILE, CachingEmbedder
from projector.adapters.onnx_embedder import OnnxMiniLMEmbedder
from projector.bootstrap import _child_embedder, default_embedder
from tests.fakes import FakeHashingEmbedder


class Recording(FakeHashingEmbedder):
    """The fake embedder, remembering every text it was asked for."""

    def __init__(self, dimension: int = 32, embedder_id: str | None = None) -> None:
        super().__init__(dimension)
        self.asked: list[str] = []
        self._id = embedder_id

    @property
    def embedder_id(self) -> str:
        return self._id or super().embedder_id

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        self.asked.extend(texts)
        return super().embed(texts)


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(st.text(max_size=40), max_size=12),
    second=st.lists(st.text(max_size=40), max_size=12),
)
def test_vectors_are_the_embedders_and_each_text_is_embedded_once(
    tmp_path_factory: pytest.TempPathFactory, first: list[str], second: list[str]
) -> None:
    directory = tmp_path_factory.mktemp("cache")
    plain = FakeHashingEmbedder()
    inner = Recording()
    cached = CachingEmbedder(inner, directory)
    assert cached.embed(first) == plain.embed(first)
    assert sorted(inner.asked) == sorted(set(first))
    # Another instance over the same directory (another process, a fresh data dir).
    inner_again = Recording()
    again = CachingEmbedder(inner_again, directory)
    assert again.embed(first + second) == plain.embed(first + second)
    assert sorted(inner_again.asked) == sorted(set(second) - set(first))
    cached.close()
    again.close()


def test_another_embedder_id_never_reads_anothers_vectors(tmp_path: Path) -> None:
    CachingEmbedder(Recording(embedder_id="model-a"), tmp_path).embed(["kettle"])
    other = Recording(embedder_id="model-b")
    CachingEmbedder(other, tmp_path).embed(["kettle"])
    assert other.asked == ["kettle"]
    # Same id, another dimension (a broken store): a miss, embedded again.
    wider = Recording(dimension=64, embedder_id="model-a")
    assert CachingEmbedder(wider, tmp_path).embed(["kettle"]) == wider.embed(["kettle"])
    assert wider.asked[0] == "kettle"


def test_an_unreadable_store_embeds_as_without_it(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_bytes(b"not a database" * 100)
    inner = Recording()
    cached = CachingEmbedder(inner, tmp_path)
    assert cached.embed(["a", "b"]) == FakeHashingEmbedder().embed(["a", "b"])
    assert inner.asked == ["a", "b"]


def test_the_onnx_models_vectors_come_back_bit_exact(tmp_path: Path) -> None:
    texts = ["Wo stand früher meine rote Thermoskanne?", "", "kettle " * 300]
    model = OnnxMiniLMEmbedder(intra_op_num_threads=1)
    fresh = model.embed(texts)
    CachingEmbedder(model, tmp_path).embed(texts)
    with sqlite3.connect(tmp_path / CACHE_FILE) as conn:
        assert conn.execute("SELECT count(*) FROM vectors").fetchone() == (3,)
    # Read back with a model that may not run: every vector comes from the store.
    assert CachingEmbedder(Refusing(model.embedder_id), tmp_path).embed(texts) == fresh
    reopened = default_embedder(1, cache_dir=tmp_path)
    assert isinstance(reopened, CachingEmbedder) and reopened.directory == tmp_path
    assert reopened.embedder_id == model.embedder_id


class Refusing:
    def __init__(self, embedder_id: str) -> None:
        self.embedder_id = embedder_id
        self.dimension = 384

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        raise AssertionError(f"asked to embed {len(texts)} texts")


def test_a_bulk_load_child_uses_the_same_store(tmp_path: Path) -> None:
    factory = _child_embedder(default_embedder(2, cache_dir=tmp_path))
    assert factory is not None
    child = factory.create()
    assert isinstance(child, CachingEmbedder) and child.directory == tmp_path
    plain = _child_embedder(default_embedder(2))
    assert plain is not None and isinstance(plain.create(), OnnxMiniLMEmbedder)
