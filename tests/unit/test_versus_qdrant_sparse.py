"""The BM25 sparse vectors `bench/versus_qdrant.py` gives Qdrant: BM25's tf part per
document term (k1 = 1.2, b = 0.75), so that Qdrant's `modifier: idf` makes tantivy's
BM25 score."""

from __future__ import annotations

import math

import pytest
import tantivy

from bench.versus_qdrant import bm25_corpus, query_sparse


def test_tf_part_by_hand() -> None:
    # avgdl = 8 / 3; e.g. "a" in the first document: 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 9 / 8))
    corpus = bm25_corpus([["a", "a", "b"], ["b"], ["c", "c", "c", "c"]])
    assert corpus.vocabulary == {"a": 0, "b": 1, "c": 2}
    assert corpus.avgdl == pytest.approx(8 / 3)
    assert [indices for indices, _ in corpus.rows] == [[0, 1], [1], [2]]
    values = [v for _, row in corpus.rows for v in row]
    assert values == pytest.approx([4.4 / 3.3125, 2.2 / 2.3125, 2.2 / 1.6375, 8.8 / 5.65])


def test_vocabulary_is_a_function_of_the_terms_not_their_order() -> None:
    one = bm25_corpus([["zeta", "alpha"], ["mid"]])
    other = bm25_corpus([["mid"], ["alpha", "zeta"]])
    assert one.vocabulary == other.vocabulary == {"alpha": 0, "mid": 1, "zeta": 2}
    assert one.rows[0] == other.rows[1]


def test_empty_document_gets_an_empty_row() -> None:
    corpus = bm25_corpus([["a"], []])
    assert corpus.rows[1] == ([], [])


def test_query_terms_count_once_and_unknown_terms_drop() -> None:
    vocabulary = {"a": 0, "b": 1, "c": 2}
    assert query_sparse(["c", "a", "zz", "a"], vocabulary) == ([0, 2], [1.0, 1.0])
    assert query_sparse(["zz"], vocabulary) == ([], [])


def _qdrant_idf(documents: int, containing: int) -> float:
    """Qdrant's `modifier: idf` (the BM25 idf, as tantivy's and Lucene's)."""
    return math.log(1.0 + (documents - containing + 0.5) / (containing + 0.5))


def test_sparse_dot_product_with_idf_is_tantivys_bm25() -> None:
    # Short documents: tantivy's field norms are exact below 40 tokens.
    docs = [
        "apple banana apple cherry",
        "banana banana banana",
        "cherry date elder fig grape apple",
        "date",
        "apple",
    ]
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("i", stored=True)
    builder.add_text_field("t", tokenizer_name="default")
    schema = builder.build()
    index = tantivy.Index(schema)
    writer = index.writer()
    for i, text in enumerate(docs):
        writer.add_document(tantivy.Document(i=i, t=text))
    writer.commit()
    index.reload()
    searcher = index.searcher()

    tokens = [text.split() for text in docs]
    corpus = bm25_corpus(tokens)
    for query in (["apple"], ["banana", "cherry"], ["date", "apple", "grape"]):
        indices, values = query_sparse(query, corpus.vocabulary)
        expected: dict[int, float] = {}
        for doc, (doc_indices, doc_values) in enumerate(corpus.rows):
            weights = dict(zip(doc_indices, doc_values, strict=True))
            score = sum(
                value * weights[i] * _qdrant_idf(len(docs), sum(i in row for row, _ in corpus.rows))
                for i, value in zip(indices, values, strict=True)
                if i in weights
            )
            if score:
                expected[doc] = score
        parsed = index.parse_query(" ".join(query), ["t"])
        hits = searcher.search(parsed, limit=10).hits
        got = {searcher.doc(address)["i"][0]: score for score, address in hits}
        assert got.keys() == expected.keys()
        for doc, score in got.items():
            assert score == pytest.approx(expected[doc], rel=1e-5)
