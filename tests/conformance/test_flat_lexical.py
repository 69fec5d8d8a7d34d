"""The in-memory copies the embedded query side scores small lexical generations from
(`contracts.flat_lexical`) answer what tantivy itself answers, through any sequence of
additions, and are dropped at the first replacement or deletion.

A property drives random documents (title, body, tags from a small vocabulary, filter
fields, documents hidden from the lexical lane), random queries under random field
boosts and filters against one index, and compares the copy's answers with the
engine's: the same documents, best first with ties by id, each score the engine's to
float32 rounding, nothing left out that scores better than what was kept; lookups by id
alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import OrreryError
from contracts.flat_lexical import FlatLexical, _top_rows, fieldnorm_id
from contracts.index import Candidate, IndexDocument, SearchFilter
from contracts.index_fields import (
    BODY,
    DEFAULT_TEXT_ANALYZER,
    HIDDEN_FACET,
    NO_STEMMING,
    TAGS,
    TEXT,
    TEXT_ANALYZER_V1,
    TITLE,
    text_analyzer_name,
)
from projector.adapters.tantivy_lexical import TantivyLexicalIndex, _flat_row, _text_analyzer
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from tests.conformance.corpus import doc

_T0 = datetime(2026, 1, 1, tzinfo=UTC)
_WORDS = ("red", "reds", "thermos", "hall", "cupboard", "blue", "kettle", "the", "running")
_GALAXIES = ("g1", "g2")
_STATUSES = ("active", "draft")
_RINGS = ("", "a", "b")
# Relative: both sides compute in float32 and sum a document's terms in their own order.
_REL = 1e-6

texts = st.lists(st.sampled_from(_WORDS), max_size=12).map(" ".join)
documents = st.builds(
    lambda n, galaxy, status, ring, minutes, title, body, tags, hidden: doc(
        f"d{n}",
        galaxy=galaxy,
        status=status,
        ring=ring,
        updated_at=_T0 + timedelta(minutes=minutes),
        title=title,
        body=body,
        tags=tuple(tags),
        facets={HIDDEN_FACET: ("lexical",)} if hidden else None,
    ),
    st.integers(0, 40),
    st.sampled_from(_GALAXIES),
    st.sampled_from(_STATUSES),
    st.sampled_from(_RINGS),
    st.integers(0, 60),
    texts,
    texts,
    st.lists(texts, max_size=2),
    st.sampled_from((False, False, False, True)),
)
batches = st.lists(
    st.lists(documents, min_size=1, max_size=8, unique_by=lambda d: d.document_id),
    min_size=1,
    max_size=4,
)
filters = st.builds(
    lambda galaxy, status, rings, after, ids: SearchFilter(
        galaxy=galaxy,
        status=status,
        rings=rings,
        updated_after=None if after is None else _T0 + timedelta(minutes=after),
        document_ids=ids,
    ),
    st.none() | st.sampled_from((*_GALAXIES, "nowhere")),
    st.none() | st.lists(st.sampled_from(_STATUSES), min_size=1, max_size=2).map(tuple),
    st.none() | st.lists(st.sampled_from(("a", "b", "zz")), min_size=1, max_size=2).map(tuple),
    st.none() | st.integers(0, 60),
    st.none() | st.lists(st.integers(0, 42).map(lambda n: f"d{n}"), max_size=8).map(tuple),
)
# The copy holds the combined field (what `weighted@3` and `rrf@2` score); a query
# boosting another field is the engine's, through the same adapter.
_TEXT_ONLY = {"title": 0.0, "body": 0.0, "tags": 0.0}
boosts = st.sampled_from(
    (
        {**_TEXT_ONLY, "text": 1.0},  # weighted@3
        {**_TEXT_ONLY, "text": 1.0},
        {**_TEXT_ONLY, "text": 2.5},
        None,  # the default: title ×2, body, tags (tantivy)
        {"title": 0.5, "body": 3.0, "text": 0.25},  # (tantivy)
    )
)


@pytest.fixture
def lexical(tmp_path: Path) -> Iterator[TantivyLexicalIndex]:
    index = TantivyLexicalIndex(tmp_path / "lexical", flat_max_rows=1_000)
    yield index
    index.close()


def _agree(got: list[Candidate], exact: list[Candidate], limit: int) -> None:
    assert got == sorted(got, key=lambda c: (-c.score, c.document_id))
    assert len(got) == min(limit, len(exact))
    by_id = {c.document_id: c for c in exact}
    for candidate in got:
        reference = by_id[candidate.document_id]
        assert candidate.score == pytest.approx(reference.score, rel=_REL)
        assert candidate._replace(score=0.0) == reference._replace(score=0.0)
    if got:
        floor = got[-1].score
        kept = {c.document_id for c in got}
        assert all(c.score <= floor * (1 + _REL) for c in exact if c.document_id not in kept)


def _same_answers(
    engine: TantivyLexicalSearch,
    flat: TantivyLexicalSearch,
    generation: str,
    text: str,
    filter: SearchFilter,
    limit: int,
    field_boosts: dict[str, float] | None,
) -> list[Candidate]:
    """`flat`'s top `limit` and its lookups by id (of some of them, one document that
    may not match, one unknown id) agree with `engine`'s; the engine's whole answer."""
    exact = engine.search(generation, text, filter, 1_000, field_boosts=field_boosts)
    _agree(flat.search(generation, text, filter, limit, field_boosts=field_boosts), exact, limit)
    listed = filter.model_copy(
        update={"document_ids": (*[c.document_id for c in exact][:5], "d41", "nope")}
    )
    looked_up = flat.scores(generation, text, listed, field_boosts=field_boosts)
    reference = engine.scores(generation, text, listed, field_boosts=field_boosts)
    assert looked_up.keys() == reference.keys()
    assert all(looked_up[d] == pytest.approx(reference[d], rel=_REL) for d in looked_up)
    return exact


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    added=batches,
    asked=st.lists(st.tuples(texts, boosts, filters, st.integers(1, 12)), min_size=1, max_size=6),
)
def test_the_copy_answers_what_tantivy_answers(
    lexical: TantivyLexicalIndex,
    added: list[list[IndexDocument]],
    asked: list[tuple[str, dict[str, float] | None, SearchFilter, int]],
) -> None:
    generation = f"flat-{abs(hash((str(added), str(asked)))):x}"[:40]
    lexical.create(generation, text_analyzer="orrery_text_v2_english")
    try:
        seen: set[str] = set()
        for batch in added:
            fresh = [d for d in batch if d.document_id not in seen]
            seen.update(d.document_id for d in fresh)
            if fresh:
                lexical.apply(generation, fresh, [])
        assert lexical.flat_for(generation) is not None  # only additions so far
        engine = TantivyLexicalSearch(lexical.searchable)
        flat = TantivyLexicalSearch(lexical.searchable, flat_provider=lexical.flat_for)
        copy = lexical.flat_for(generation)
        assert copy is not None
        analyzer = lexical.searchable(generation)[2]
        for text, field_boosts, filter, limit in asked:
            if field_boosts is not None and set(field_boosts) == {*_TEXT_ONLY, "text"}:
                # Answered by the copy itself, not handed on to tantivy.
                terms = list(dict.fromkeys(analyzer.analyze(text)))
                boost = {"text": field_boosts["text"]}
                assert copy.search(terms, boost, filter, limit) is not None
            exact = _same_answers(engine, flat, generation, text, filter, limit, field_boosts)
            everything = flat.search(generation, text, filter, 1_000, field_boosts=field_boosts)
            assert {c.document_id for c in everything} == {c.document_id for c in exact}
    finally:
        lexical.drop(generation)


def test_a_replacement_or_a_deletion_drops_the_copy_for_good(
    lexical: TantivyLexicalIndex,
) -> None:
    lexical.create("g", text_analyzer="orrery_text_v2_english")
    lexical.apply("g", [doc("d1", body="red thermos"), doc("d2", body="blue kettle")], [])
    assert lexical.flat_for("g") is not None
    lexical.apply("g", [doc("d3", body="red kettle")], [])
    assert lexical.flat_for("g") is not None
    lexical.apply("g", [doc("d1", 2, body="red red thermos")], [])  # a new revision
    assert lexical.flat_for("g") is None
    lexical.apply("g", [doc("d4", body="red")], [])
    assert lexical.flat_for("g") is None  # for good, in this process
    lexical.create("h", text_analyzer="orrery_text_v2_english")
    lexical.apply("h", [doc("d1", body="red thermos")], [])
    lexical.apply("h", [], [("d1", 1)])
    assert lexical.flat_for("h") is None
    # An engine still answers, through tantivy.
    search = TantivyLexicalSearch(lexical.searchable, flat_provider=lexical.flat_for)
    found = search.search("g", "red", SearchFilter(), 10)
    assert {c.document_id for c in found} == {"d1", "d3", "d4"}
    assert next(c.revision for c in found if c.document_id == "d1") == 2


def test_a_generation_past_the_copys_size_is_searched_in_tantivy(tmp_path: Path) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical", flat_max_rows=3)
    try:
        index.create("g", text_analyzer="orrery_text_v2_english")
        index.apply("g", [doc(f"d{n}", body="red thermos") for n in range(3)], [])
        assert index.flat_for("g") is not None
        index.apply("g", [doc("d3", body="red")], [])
        assert index.flat_for("g") is None
        search = TantivyLexicalSearch(index.searchable, flat_provider=index.flat_for)
        assert [c.document_id for c in search.search("g", "red", SearchFilter(), 1)] == ["d3"]
    finally:
        index.close()


def test_a_reopened_generation_keeps_no_copy(tmp_path: Path) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical", flat_max_rows=10)
    index.create("g", text_analyzer="orrery_text_v2_english")
    index.apply("g", [doc("d1", body="red thermos")], [])
    index.close()
    try:
        # Its statistics may count documents an earlier process replaced: no copy.
        assert index.flat_for("g") is None
    finally:
        index.close()


def test_fieldnorm_ids_quantize_lengths_as_tantivy_does() -> None:
    assert [fieldnorm_id(n) for n in (0, 1, 40, 41, 42, 43, 44, 1_000_000)] == [
        0,
        1,
        40,
        40,
        41,
        41,
        42,
        fieldnorm_id(1_000_000),
    ]
    assert fieldnorm_id(2_013_265_944) == 255
    assert FlatLexical(("body",), max_rows=1).fields == ("body",)


def test_copies_share_one_bound_and_give_it_back_when_dropped(tmp_path: Path) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical", flat_max_rows=10, flat_max_total_rows=3)
    try:
        for name in ("a", "b", "c"):
            index.create(name, text_analyzer="orrery_text_v2_english")
        index.apply("a", [doc("d1", body="red"), doc("d2", body="blue")], [])
        index.apply("b", [doc("d1", body="red"), doc("d2", body="blue")], [])
        assert index.flat_for("a") is not None
        assert index.flat_for("b") is None  # the bound held only the first two
        index.drop("a")
        index.apply("c", [doc("d1", body="red"), doc("d2", body="blue")], [])
        assert index.flat_for("c") is not None
    finally:
        index.close()


def _compaction_source(
    written: dict[tuple[str, int], IndexDocument],
) -> Callable[[Sequence[tuple[str, int]]], list[IndexDocument]]:
    """The canonical store's side of a compaction: exactly the revisions asked for."""
    return lambda pairs: [written[pair] for pair in pairs]


def test_a_compacted_generation_keeps_its_copy_and_its_answers(tmp_path: Path) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical", flat_max_rows=100)
    written: dict[tuple[str, int], IndexDocument] = {}
    try:
        index.create("g", text_analyzer="orrery_text_v2_english")
        for batch in range(4):  # one segment per commit
            docs = [
                doc(f"d{batch}-{n}", body=" ".join(_WORDS[(batch + n) % 9 :][:4])) for n in range(6)
            ]
            written.update({(d.document_id, d.revision): d for d in docs})
            index.apply("g", docs, [])
        copy = index.flat_for("g")
        assert copy is not None and index.segment_count("g") > 1
        engine = TantivyLexicalSearch(index.searchable)
        flat = TantivyLexicalSearch(index.searchable, flat_provider=index.flat_for)
        boosts = {**_TEXT_ONLY, "text": 1.0}
        texts = ("red thermos", "the running hall", "blue kettle reds", "cupboard")
        before = [engine.search("g", t, SearchFilter(), 1_000, field_boosts=boosts) for t in texts]

        assert index.compact("g", _compaction_source(written))

        assert index.segment_count("g") == 1
        assert index.flat_for("g") is copy  # the same documents, the same statistics
        for text, exact in zip(texts, before, strict=True):
            assert engine.search("g", text, SearchFilter(), 1_000, field_boosts=boosts) == exact
            _agree(flat.search("g", text, SearchFilter(), 5, field_boosts=boosts), exact, 5)
        index.apply("g", [doc("late", body="red red thermos")], [])  # still only additions
        assert index.flat_for("g") is copy and len(copy) == 25
    finally:
        index.close()


def test_a_compaction_that_keeps_a_deleted_document_drops_the_copy(tmp_path: Path) -> None:
    index = TantivyLexicalIndex(
        tmp_path / "lexical", flat_max_rows=2_000, flat_max_total_rows=1_200
    )
    written: dict[tuple[str, int], IndexDocument] = {}
    try:
        index.create("g", text_analyzer="orrery_text_v2_english")
        for start in range(0, 1_200, 300):  # more than one copied chunk of 1,000
            docs = [doc(f"n{n:04d}", body=_WORDS[n % 9]) for n in range(start, start + 300)]
            written.update({(d.document_id, d.revision): d for d in docs})
            index.apply("g", docs, [])
        assert index.flat_for("g") is not None
        first = written[("n0000", 1)]
        calls = 0

        def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
            nonlocal calls
            calls += 1
            if calls == 2:  # the first chunk is in the copy: the same revision again
                index.apply("g", [first], [])  # changes nothing live, is journaled
            return [written[pair] for pair in pairs]

        assert index.compact("g", documents)
        # The copy deleted and added that document again: its statistics count one more
        # document than the live ones, which the in-memory copy would not.
        assert index.flat_for("g") is None
        index.create("h", text_analyzer="orrery_text_v2_english")
        index.apply("h", [doc("d1", body="red")], [])
        assert index.flat_for("h") is not None  # the dropped copy's rows were given back
    finally:
        index.close()


def test_kept_term_scores_are_bounded_and_change_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy keeps each queried term's BM25 array (dense for a term in many rows) up
    to `_BM25_MAX_BYTES`, then starts again: the same answers from the kept arrays as
    when first computed, and through a bound far smaller than the terms asked for."""
    import contracts.flat_lexical as flat_module

    words = [*_WORDS, *(f"w{i}" for i in range(40))]
    docs = [
        doc(f"d{i}", body=" ".join(words[j] for j in range(i % 7, len(words), 3)))
        for i in range(60)
    ]
    queries = [[word, "the", "red"] for word in words]

    def answers(copy: FlatLexical) -> list[list[tuple[str, float]]]:
        found = [copy.search(q, {"text": 1.0}, SearchFilter(), 20) for q in queries]
        return [[(c.document_id, c.score) for c in hits or ()] for hits in found]

    unbounded = TantivyLexicalIndex(tmp_path / "a", flat_max_rows=1_000)
    bounded = TantivyLexicalIndex(tmp_path / "b", flat_max_rows=1_000)
    try:
        for index in (unbounded, bounded):
            index.create("g1", text_analyzer="orrery_text_v2_english")
            index.apply("g1", docs, [])
        wide, narrow = unbounded.flat_for("g1"), bounded.flat_for("g1")
        assert wide is not None and narrow is not None
        first = answers(wide)
        assert any(first) and answers(wide) == first  # the second pass reads kept arrays
        monkeypatch.setattr(flat_module, "_BM25_MAX_BYTES", 600)
        assert answers(narrow) == first
        assert 0 < narrow._bm25_bytes <= 600
        assert wide._bm25_bytes > 600
    finally:
        unbounded.close()
        bounded.close()


# Writes to a generation before it is reopened: a batch of documents (a new revision of
# one already written replaces it) or the deletion of some written ones.
# At most 7 commits: from 8 segments on, tantivy's merges drop deleted documents.
_writes = st.lists(
    st.tuples(st.integers(0, 3).map(lambda n: f"d{n}"), st.booleans(), texts, texts),
    min_size=2,
    max_size=7,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    writes=_writes,
    compact=st.booleans(),
    asked=st.lists(st.tuples(texts, filters, st.integers(1, 12)), min_size=1, max_size=5),
)
def test_a_copy_built_from_the_store_answers_what_tantivy_answers(
    tmp_path_factory: pytest.TempPathFactory,
    writes: list[tuple[str, bool, str, str]],
    compact: bool,
    asked: list[tuple[str, SearchFilter, int]],
) -> None:
    """`build_flat` on a generation opened from disk (replaced and deleted documents
    included, compacted or not): a copy exactly when the index holds no deleted document,
    and then the copy's answers are the engine's, lookups by id alike."""
    root = tmp_path_factory.mktemp("built") / "lexical"
    held: dict[str, IndexDocument] = {}
    written: dict[tuple[str, int], IndexDocument] = {}
    first = TantivyLexicalIndex(root)
    first.create("g", text_analyzer="orrery_text_v2_english")
    # One segment of several documents first: a later write leaves deleted ones in it
    # (a segment whose every document is deleted is dropped at once).
    opening = [doc(f"d{n}", title=writes[0][2], body=f"{writes[0][3]} red") for n in range(4)]
    first.apply("g", opening, [])
    for document in opening:
        held[document.document_id] = written[(document.document_id, 1)] = document
    for document_id, delete, title, body in writes:
        if delete and document_id in held:
            first.apply("g", [], [(document_id, held.pop(document_id).revision)])
            continue
        revision = held[document_id].revision + 1 if document_id in held else 1
        fresh = doc(document_id, revision, title=title, body=body)
        held[document_id] = written[(document_id, revision)] = fresh
        first.apply("g", [fresh], [])
    first.close()
    index = TantivyLexicalIndex(root, flat_max_rows=100, flat_open_max_rows=100)
    try:
        source = _compaction_source(written)
        if compact:
            index.compact("g", source)
        # tantivy's own merges may have dropped deleted documents too: read its meta.
        meta = json.loads((root / "g" / "meta.json").read_text(encoding="utf-8"))
        deletes = any(segment.get("deletes") for segment in meta["segments"])
        assert index.flat_due("g", quiet_s=0.0) == (bool(held) and not deletes)
        built = index.build_flat("g", source)
        assert built == (bool(held) and not deletes)
        if not built:
            assert index.flat_for("g") is None
            return
        copy = index.flat_for("g")
        assert copy is not None and len(copy) == len(held)
        assert not index.flat_due("g", quiet_s=0.0)  # it has one
        engine = TantivyLexicalSearch(index.searchable)
        flat = TantivyLexicalSearch(index.searchable, flat_provider=index.flat_for)
        boosts = {**_TEXT_ONLY, "text": 1.0}
        analyzer = index.searchable("g")[2]
        for text, filter, limit in asked:
            terms = list(dict.fromkeys(analyzer.analyze(text)))
            assert copy.search(terms, {"text": 1.0}, filter, limit) is not None
            _same_answers(engine, flat, "g", text, filter, limit, boosts)
    finally:
        index.close()


def test_a_built_copy_is_bounded_and_kept_only_without_a_commit_meanwhile(
    tmp_path: Path,
) -> None:
    root = tmp_path / "lexical"
    docs = [doc(f"n{n:04d}", body=_WORDS[n % 9]) for n in range(1_200)]
    written = {(d.document_id, d.revision): d for d in docs}
    first = TantivyLexicalIndex(root)
    for name in ("a", "b"):
        first.create(name, text_analyzer="orrery_text_v2_english")
        first.apply(name, docs, [])
    first.create("small", text_analyzer="orrery_text_v2_english")
    first.apply("small", docs[:10], [])
    first.close()
    source = _compaction_source(written)
    index = TantivyLexicalIndex(
        root, flat_max_rows=10, flat_max_total_rows=1_206, flat_open_max_rows=1_201
    )
    try:
        assert TantivyLexicalIndex(root).build_flat("a", source) is False  # 0: never
        # A deleted document still counts in tantivy's statistics: no copy until a
        # compaction drops it.
        index.apply("small", [], [("n0000", 1)])
        assert index.flat_due("small", quiet_s=0.0) is False
        assert index.build_flat("small", source) is False
        assert index.compact("small", source)
        assert index.build_flat("small", source) is True
        index.drop("small")
        index.create("small", text_analyzer="orrery_text_v2_english")
        index.apply("small", docs[:10], [])
        index.close()  # reopened from disk below, without a copy
        calls = 0

        def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
            nonlocal calls
            calls += 1
            if calls == 1:  # a commit while the copy reads: it would miss these documents
                late = [doc("late", body="red"), doc("later", body="blue")]
                index.apply("a", late, [])
                written.update({(d.document_id, 1): d for d in late})
            return source(pairs)

        assert index.build_flat("a", documents) is False
        assert calls == 1  # the second chunk of 1,200 is never read: it gave way at once
        assert index.flat_for("a") is None
        assert index.flat_due("a", quiet_s=0.0) is False  # 1,202 documents: past its size
        assert index.build_flat("a", source) is False
        assert index.flat_due("b", quiet_s=0.0) is True
        assert index.flat_due("b", quiet_s=60.0) is True  # never written in this process
        with pytest.raises(OrreryError):  # the store lacks the revisions: INTERNAL
            index.build_flat("b", lambda pairs: [])
        assert index.flat_due("b", quiet_s=0.0) is False  # not again before a commit
        index.apply("b", [doc("n0000", body="red")], [])  # the same revision: no commit
        assert index.flat_due("b", quiet_s=0.0) is False
        index.apply("b", [doc("b-new", body="red")], [])
        written[("b-new", 1)] = doc("b-new", body="red")
        assert index.flat_due("b", quiet_s=0.0) is True
        assert index.build_flat("b", source) is True
        assert index.flat_for("b") is not None
        # The shared bound: 1,201 of 1,206 rows taken, the small one does not fit.
        assert index.flat_due("small", quiet_s=0.0) is False
        assert index.build_flat("small", source) is False
        index.drop("b")
        assert index.build_flat("small", source) is True
        # A write makes the generation not quiet for a while.
        index.apply("small", [doc("x", body="blue")], [])
        assert index.flat_for("small") is not None  # an addition, kept
    finally:
        index.close()


def _reference_top_rows(eligible: np.ndarray, limit: int) -> np.ndarray:
    """`_top_rows` by one partition of every row (its definition)."""
    total = eligible.size
    kth = np.partition(eligible, total - limit)[total - limit] if total > limit else 0.0
    return np.flatnonzero(eligible >= kth if kth > 0.0 else eligible > 0.0)


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 5_000),
    positive=st.sampled_from((0.0, 0.001, 0.01, 0.1, 0.5, 1.0)),
    tied=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    limit=st.integers(1, 60),
)
def test_the_top_rows_from_a_sampled_bound_are_those_of_one_partition_of_all_rows(
    size: int, positive: float, tied: bool, seed: int, limit: int
) -> None:
    """The bound taken from every 16th row never loses a row at or above the `limit`-th
    best score, ties and zero scores included (few matches, many, all tied)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 4, size) if tied else rng.random(size) * 20
    eligible = np.where(rng.random(size) < positive, values, 0.0).astype(np.float32)
    assert _top_rows(eligible, limit).tolist() == _reference_top_rows(eligible, limit).tolist()


# Text with everything the analyzer splits, folds, stems or drops: letters with
# accents, digits, separators of every kind (the newline that joins the combined field
# too), lone surrogates (made "?" before analysis), and tokens past the length limit.
_ANALYZED_TEXT = st.lists(
    st.sampled_from(
        ["running", "Café", "ÉTÉ", "x" * 300, "\n", " ", "-", "'", "\ud800", "ß", "42", "ǅ"]
    )
    | st.characters(),
    max_size=16,
).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    title=_ANALYZED_TEXT,
    body=_ANALYZED_TEXT,
    tags=st.lists(_ANALYZED_TEXT, max_size=3),
    analyzer_name=st.sampled_from(
        (DEFAULT_TEXT_ANALYZER, TEXT_ANALYZER_V1, text_analyzer_name(NO_STEMMING))
    ),
)
def test_a_copy_of_the_combined_field_keeps_its_parts_tokens(
    title: str, body: str, tags: list[str], analyzer_name: str
) -> None:
    """A copy of the combined field alone analyzes the combined value in one call: the
    same tokens, in the same order, as its parts analyzed one by one (what the copies of
    several fields keep)."""
    analyzer = _text_analyzer(analyzer_name)
    source = doc("d1", title=title, body=body, tags=tuple(tags))
    alone = _flat_row(source, analyzer, (TEXT,))
    parts = _flat_row(source, analyzer, (TITLE, BODY, TAGS, TEXT))
    assert alone.tokens == {TEXT: parts.tokens[TEXT]}
    assert alone.candidate == parts.candidate
    assert (alone.galaxy, alone.ring, alone.hidden) == (parts.galaxy, parts.ring, parts.hidden)
