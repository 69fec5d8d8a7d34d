"""The qualification's reference copy on the harness's OpenSearch: a 1-shard copy of a
spread generation that is kept and reused while its source took no write, made again
after any write, and dropped with its generation (issue 23)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contracts.index import SearchFilter
from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
from query.adapters.opensearch_lexical import OpenSearchLexicalSearch
from tests.conformance.corpus import doc
from tests.conftest import require_server, run_tag

pytestmark = pytest.mark.servers

PREFIX = f"orrery-test-{run_tag()}"
WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "granite", "harbor"]


@pytest.fixture
def engine() -> Iterator[tuple[OpenSearchLexicalIndex, OpenSearchLexicalSearch]]:
    url = require_server("opensearch")
    index = OpenSearchLexicalIndex(url, index_prefix=PREFIX, refresh_interval="100ms")
    search = OpenSearchLexicalSearch(url, index_prefix=PREFIX)
    index.create("g3", shards=3)
    yield index, search
    index.drop("g3")
    index.close()
    search.close()


def _uuid(index: OpenSearchLexicalIndex, generation_id: str) -> str | None:
    name = index.index_name(generation_id)
    settings = index._client.indices.get_settings(index=name, ignore_unavailable=True)
    found = settings.get(name)
    return None if found is None else str(found["settings"]["index"]["uuid"])


def _ranked(search: OpenSearchLexicalSearch, generation_id: str) -> list[list[tuple[str, float]]]:
    return [
        [(c.document_id, c.score) for c in search.search(generation_id, w, SearchFilter(), 50)]
        for w in WORDS
    ]


def test_the_reference_copy_is_reused_until_its_source_takes_a_write(
    engine: tuple[OpenSearchLexicalIndex, OpenSearchLexicalSearch],
) -> None:
    index, search = engine
    docs = [
        doc(f"d{i}", title=f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]}", body=WORDS[(i * 5) % 8] * 2)
        for i in range(60)
    ]
    index.apply("g3", docs, [])
    with index.reference_copy("g3") as reference_id:
        assert reference_id == "g3.qref"
        first = _uuid(index, reference_id)
        made = _ranked(search, reference_id)
    assert first is not None and any(made)
    # Nothing written since: the same copy, the same answers.
    with index.reference_copy("g3") as reference_id:
        assert _uuid(index, reference_id) == first
        assert _ranked(search, reference_id) == made
    # A delete (and then an upsert) moves the source on: the copy is made again and
    # holds the change.
    index.apply("g3", [], [("d0", 1)])
    with index.reference_copy("g3") as reference_id:
        second = _uuid(index, reference_id)
        assert second not in (None, first)
        assert all("d0" not in [d for d, _ in found] for found in _ranked(search, reference_id))
    index.apply("g3", [doc("d0", 2, title="amber amber amber")], [])
    with index.reference_copy("g3") as reference_id:
        assert _uuid(index, reference_id) not in (None, first, second)
        top = search.search(reference_id, "amber", SearchFilter(), 1)
        assert [(c.document_id, c.revision) for c in top] == [("d0", 2)]
    # An untagged copy (an interrupted one) is never taken as is.
    name = index.index_name("g3.qref")
    index._client.indices.put_mapping(index=name, body={"_meta": {"orrery": {}}})
    untagged = _uuid(index, "g3.qref")
    with index.reference_copy("g3") as reference_id:
        assert _uuid(index, reference_id) != untagged
    # `drop_reference` deletes it (twice is harmless); dropping the generation drops
    # its reference too.
    index.drop_reference("g3")
    index.drop_reference("g3")
    assert _uuid(index, "g3.qref") is None
    with index.reference_copy("g3"):
        assert _uuid(index, "g3.qref") is not None
    index.drop("g3")
    assert _uuid(index, "g3.qref") is None
    index.create("g3", shards=3)  # for the fixture's teardown


def test_a_copy_in_many_pages_and_bulks_holds_every_document_and_ranks_as_one_shard(
    engine: tuple[OpenSearchLexicalIndex, OpenSearchLexicalSearch],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import projector.adapters.opensearch_lexical as adapter

    # Pages and bulks far smaller than the corpus: several scroll pages, each bulked
    # in several parts with two in flight (a last part and a last page shorter).
    monkeypatch.setattr(adapter, "_SCROLL_PAGE", 23)
    monkeypatch.setattr(adapter, "_COPY_BULK_DOCUMENTS", 5)
    index, search = engine
    docs = [
        doc(f"d{i}", 1 + i % 4, title=f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]}", body=WORDS[i % 5])
        for i in range(101)
    ]
    index.apply("g3", docs, [])
    with index.reference_copy("g3") as reference_id:
        assert sorted(index.stored_pairs(reference_id)) == sorted(index.stored_pairs("g3"))
        name = index.index_name(reference_id)
        settings = index._client.indices.get_settings(index=name)[name]["settings"]
        assert settings["index"]["number_of_shards"] == "1"
        # Global statistics over three shards (DFS) rank as the one-shard copy does.
        copied, spread = _ranked(search, reference_id), _ranked(search, "g3")
        assert [[d for d, _ in found] for found in copied] == [
            [d for d, _ in found] for found in spread
        ]
        assert all(
            s == pytest.approx(t, rel=1e-6)
            for found, other in zip(copied, spread, strict=True)
            for (_, s), (_, t) in zip(found, other, strict=True)
        )
