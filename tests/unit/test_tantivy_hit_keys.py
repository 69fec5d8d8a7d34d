"""tantivy hits read from fast fields (schema version 5) or stored documents (before).

The conformance suite checks what a hit reports; these tests check which way tantivy
reads it (through `QueryPlan.engine_ms`'s keys) and that both ways agree: an index of
schema version 4 (no hit keys) still answers, and exactly as a version 5 index does.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import tantivy
from hypothesis import given, settings
from hypothesis import strategies as st

import projector.adapters.tantivy_lexical as projector_tantivy
import query.adapters.tantivy_lexical as query_tantivy
from contracts.index import Candidate, SearchFilter
from contracts.index_fields import (
    document_id_of_key,
    document_ids_of_keys,
    document_key,
    status_key,
)
from contracts.timing import engine_clock
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import (
    ENGINE_DOCS,
    ENGINE_FAST_FIELDS,
    ENGINE_SEARCH,
    TantivyLexicalSearch,
)
from tests.conformance.corpus import doc

UUIDS = [str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15) % (1 << 128))) for n in range(1, 41)]
STATUSES = ("active", "candidate", "uncertain", "geprüft")


def _documents() -> list:  # type: ignore[type-arg]
    start = datetime(2026, 2, 1, 9, 0, 0, 250_001, tzinfo=UTC)
    return [
        doc(
            document_id,
            revision=1 + n % 4,
            title=" ".join(["harbour"] * (1 + n % 5)),
            body="crane" if n % 2 else "harbour crane",
            status=STATUSES[n % len(STATUSES)],
            galaxy=f"g{n % 3}",
            updated_at=start + timedelta(seconds=n * 3607, microseconds=n),
        )
        for n, document_id in enumerate(UUIDS)
    ]


@pytest.fixture
def index(tmp_path: Path) -> Iterator[TantivyLexicalIndex]:
    index = TantivyLexicalIndex(tmp_path / "tantivy")
    yield index
    index.close()


def _searched(
    search: TantivyLexicalSearch, generation_id: str, text: str, filter: SearchFilter
) -> tuple[list[Candidate], dict[str, float]]:
    with engine_clock() as calls:
        hits = search.search(generation_id, text, filter, 25)
    assert ENGINE_SEARCH in calls
    return hits, calls


QUERIES = [
    ("harbour", SearchFilter()),
    ("harbour crane", SearchFilter(status=("active", "geprüft"))),
    ("crane", SearchFilter(galaxy="g1")),
    ("", SearchFilter(galaxy="g2")),
]


def test_document_keys_round_trip_canonical_uuids_only() -> None:
    for document_id in UUIDS:
        key = document_key(document_id)
        assert key is not None
        assert document_id_of_key(*key) == document_id
    assert document_key(UUIDS[0].upper()) is None
    assert document_key("{" + UUIDS[0] + "}") is None
    assert document_key("d1") is None
    assert status_key("active") != status_key("Active")


def _reference_document_key(document_id: str) -> tuple[int, int] | None:
    """`document_key` as first written: parse with `uuid.UUID`, keep the canonical form."""
    try:
        value = uuid.UUID(document_id)
    except ValueError:
        return None
    if str(value) != document_id:
        return None
    return value.int >> 64, value.int & ((1 << 64) - 1)


def _uuid_spellings(value: uuid.UUID) -> list[str]:
    text = str(value)
    return [
        text,
        text.upper(),
        text.replace("-", ""),
        "{" + text + "}",
        "urn:uuid:" + text,
        text + "\n",
        " " + text,
        text[:-1] + "g",
        text[:-1] + "\u0660",
    ]


@settings(max_examples=300, deadline=None)
@given(st.uuids(), st.text(max_size=40))
def test_document_key_is_the_uuid_parse_for_any_spelling(value: uuid.UUID, other: str) -> None:
    for candidate in [*_uuid_spellings(value), other]:
        assert document_key(candidate) == _reference_document_key(candidate)


@given(st.text(max_size=30))
def test_status_key_is_memoized_without_changing_it(status: str) -> None:
    expected = int.from_bytes(
        hashlib.sha256(status.encode("utf-8", "surrogatepass")).digest()[:8], "big"
    )
    assert status_key(status) == expected
    assert status_key(status) == expected


def test_a_version_5_index_reads_hits_from_fast_fields_only(
    index: TantivyLexicalIndex,
) -> None:
    index.create("g5")
    documents = _documents()
    index.apply("g5", documents[:20], [])
    index.apply("g5", documents[20:], [])
    search = TantivyLexicalSearch(index.searchable)
    for text, filter in QUERIES:
        hits, calls = _searched(search, "g5", text, filter)
        assert hits
        assert ENGINE_FAST_FIELDS in calls
        assert ENGINE_DOCS not in calls
        with engine_clock() as calls:
            search.scores("g5", text, filter.model_copy(update={"document_ids": tuple(UUIDS)}))
        assert ENGINE_DOCS not in calls


def _create_version_4(root: Path, generation_id: str) -> None:
    """An empty generation under `root` with schema version 4's fields (no hit keys), as
    an index written before them holds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            projector_tantivy,
            "_build_schema",
            functools.partial(projector_tantivy._build_schema, hit_keys=False),
        )
        old_writer = TantivyLexicalIndex(root)
        old_writer.create(generation_id)
        old_writer.close()


def test_a_version_4_index_answers_exactly_like_a_version_5_index(
    tmp_path: Path, index: TantivyLexicalIndex
) -> None:
    _create_version_4(tmp_path / "tantivy", "g4")
    index.create("g5")
    documents = _documents()
    for generation_id in ("g4", "g5"):
        index.apply(generation_id, documents[:25], [])
        index.apply(generation_id, documents[25:], [(UUIDS[3], 4)])
    index.close()  # reopened from disk: the schema read back decides
    search = TantivyLexicalSearch(index.searchable)
    for text, filter in QUERIES:
        old, old_calls = _searched(search, "g4", text, filter)
        new, new_calls = _searched(search, "g5", text, filter)
        assert old == new
        assert old and UUIDS[3] not in {c.document_id for c in old}
        assert ENGINE_DOCS in old_calls and ENGINE_DOCS not in new_calls
        by_id = filter.model_copy(update={"document_ids": tuple(UUIDS[::3])})
        assert search.scores("g4", text, by_id) == search.scores("g5", text, by_id)


def test_statuses_sharing_a_key_are_read_from_stored_documents(
    index: TantivyLexicalIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two statuses whose keys collide (forced here) are never confused."""

    def colliding(status: str) -> int:
        return 7

    monkeypatch.setattr(projector_tantivy, "status_key", colliding)
    monkeypatch.setattr(query_tantivy, "status_key", colliding)
    index.create("g5")
    documents = _documents()
    index.apply("g5", documents, [])
    search = TantivyLexicalSearch(index.searchable)
    hits, calls = _searched(search, "g5", "harbour", SearchFilter())
    expected = {d.document_id: d.status for d in documents}
    assert {c.document_id: c.status for c in hits} == {
        c.document_id: expected[c.document_id] for c in hits
    }
    assert len({c.status for c in hits}) > 1
    assert ENGINE_DOCS in calls


def test_a_status_written_after_the_first_search_is_named(
    index: TantivyLexicalIndex,
) -> None:
    index.create("g5")
    documents = _documents()
    index.apply("g5", documents[:10], [])
    search = TantivyLexicalSearch(index.searchable)
    assert search.search("g5", "harbour", SearchFilter(), 10)
    late = doc(str(uuid.UUID(int=12345)), title="harbour " * 9, status="brand-new")
    index.apply("g5", [late], [])
    hits, calls = _searched(search, "g5", "harbour", SearchFilter(status=("brand-new",)))
    assert [(c.document_id, c.status) for c in hits] == [(late.document_id, "brand-new")]
    assert ENGINE_DOCS not in calls


def _read_back_documents(ids: list[str], revisions: list[int]) -> list:  # type: ignore[type-arg]
    return [
        doc(document_id, revision=revision, title=f"harbour {n}", body="crane")
        for n, (document_id, revision) in enumerate(zip(ids, revisions, strict=True))
    ]


def _read_back_counting_stored(
    index: TantivyLexicalIndex, generation_id: str
) -> tuple[list[tuple[str, int]], int]:
    """`stored_pairs` of `generation_id`, and how many stored documents it read."""
    calls: list[tantivy.Document] = []
    read = projector_tantivy._stored_pair

    def counted(document: tantivy.Document) -> tuple[str, int]:
        calls.append(document)
        return read(document)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(projector_tantivy, "_stored_pair", counted)
        return index.stored_pairs(generation_id), len(calls)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.uuids().map(str),
            st.text(min_size=1, max_size=12),
            # UUIDs sharing their high 64 bits: a key range no split can thin out.
            st.integers(0, 2**16).map(lambda n: str(uuid.UUID(int=(7 << 64) | n))),
        ),
        min_size=1,
        max_size=60,
        unique=True,
    ),
    st.data(),
    st.sampled_from([2, projector_tantivy._RANGE_HITS]),
)
def test_the_read_back_pairs_are_the_stored_documents_pairs_under_both_schemas(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str], data: st.DataObject, range_hits: int
) -> None:
    """`stored_pairs` (an eligibility check's read-back) reads the key and revision
    columns and a stored document only for an id without a key: the same pairs as
    reading every stored document, in an index with key fields and in one without;
    replaced and deleted documents are gone from both. Listed a key range at a time
    (`_every_address`), with ranges of a few documents too: crowded ranges are halved,
    one key held by more than a range lists them all, keyless ids come last."""
    revisions = data.draw(st.lists(st.integers(1, 2**40), min_size=len(ids), max_size=len(ids)))
    deleted = data.draw(st.sets(st.sampled_from(ids), max_size=len(ids) // 3))
    root = tmp_path_factory.mktemp("read-back")
    _create_version_4(root / "tantivy", "g4")
    index = TantivyLexicalIndex(root / "tantivy")
    try:
        index.create("g5")
        documents = _read_back_documents(ids, revisions)
        half = len(documents) // 2
        expected = {d: r for d, r in zip(ids, revisions, strict=True) if d not in deleted}
        stored_reads: dict[str, int] = {}
        for generation_id in ("g4", "g5"):
            index.apply(generation_id, documents[:half], [])
            # The second half, and the deletions at a revision past each one's own.
            index.apply(
                generation_id,
                documents[half:],
                [(d, r + 1) for d, r in zip(ids, revisions, strict=True) if d in deleted],
            )
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(projector_tantivy, "_RANGE_HITS", range_hits)
                pairs, stored_reads[generation_id] = _read_back_counting_stored(
                    index, generation_id
                )
            assert sorted(pairs) == sorted(expected.items())
        assert stored_reads["g4"] == len(expected)
        assert stored_reads["g5"] == sum(document_key(d) is None for d in expected)
    finally:
        index.close()


def test_document_ids_of_keys_is_document_id_of_key_for_each() -> None:
    keys = [document_key(d) for d in UUIDS]
    highs: list[int | None] = [k[0] for k in keys if k is not None]
    lows: list[int | None] = [k[1] for k in keys if k is not None]
    highs += [0, (1 << 64) - 1, None, 5]
    lows += [0, (1 << 64) - 1, 7, None]
    assert document_ids_of_keys(highs, lows) == [
        *UUIDS,
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        None,
        None,
    ]
    assert document_ids_of_keys([], []) == []
    with pytest.raises(ValueError):
        document_ids_of_keys([1], [])
