"""`TantivyLexicalIndex.compact`: one segment, the same answers, writes kept, crash safe.

Answers are compared with an index built afresh (one `apply` of the final documents): a
compacted index no longer counts deleted documents in BM25's statistics, exactly like a
fresh one. Without deletes, they also equal the answers before compaction.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode, OrreryError
from contracts.index import IndexDocument, SearchFilter
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from tests.conformance.corpus import doc

WORDS = ("red", "blue", "thermos", "kettle", "hall", "cupboard", "garden", "lamp", "stone")
QUERIES = ("red thermos", "blue kettle", "garden lamp stone", "hall", "cupboard red blue")
GENERATION = "g1"


class Store:
    """Every revision ever written, as a canonical store keeps them."""

    def __init__(self) -> None:
        self.revisions: dict[tuple[str, int], IndexDocument] = {}
        self.calls = 0

    def write(self, index: TantivyLexicalIndex, docs: Sequence[IndexDocument]) -> None:
        for d in docs:
            self.revisions[(d.document_id, d.revision)] = d
        index.apply(GENERATION, docs, [])

    def documents(self, pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        self.calls += 1
        return [self.revisions[pair] for pair in pairs]


def _document(document_id: str, revision: int, words: Sequence[str]) -> IndexDocument:
    return doc(document_id, revision, title=" ".join(words[:2]), body=" ".join(words))


def _answers(index: TantivyLexicalIndex) -> list[object]:
    search = TantivyLexicalSearch(index.searchable)
    out: list[object] = []
    for text in QUERIES:
        hits = search.search(GENERATION, text, SearchFilter(), 1_000)
        out.append([(c.document_id, c.revision, c.score) for c in hits])
        ids = tuple(sorted({c.document_id for c in hits}))[:7]
        if ids:
            out.append(
                sorted(search.scores(GENERATION, text, SearchFilter(document_ids=ids)).items())
            )
    return out


def _fresh(root: Path, index: TantivyLexicalIndex) -> TantivyLexicalIndex:
    """An index built in one `apply` from what `index` holds (from the store)."""
    fresh = TantivyLexicalIndex(root)
    fresh.create(GENERATION)
    return fresh


def _segments_of(index: TantivyLexicalIndex) -> int:
    return index.segment_count(GENERATION)


batches = st.lists(
    st.lists(
        st.tuples(
            st.integers(0, 11),  # document
            st.booleans(),  # delete?
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=8,
    ),
    min_size=2,
    max_size=10,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=batches)
def test_compaction_answers_like_a_fresh_index_and_keeps_evidence(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[int, bool, list[str]]]]
) -> None:
    root = tmp_path_factory.mktemp("compact")
    index = TantivyLexicalIndex(root / "live")
    index.create(GENERATION)
    store = Store()
    revisions: dict[str, int] = {}
    deleted = False
    for batch in batches:  # One commit (one segment at most) per batch.
        upserts: dict[str, IndexDocument] = {}
        deletes: dict[str, int] = {}
        for number, delete, words in batch:
            document_id = f"d{number}"
            revision = revisions[document_id] = revisions.get(document_id, 0) + 1
            if delete:
                deletes[document_id] = revision
                upserts.pop(document_id, None)
            else:
                upserts[document_id] = _document(document_id, revision, words)
                deletes.pop(document_id, None)
        for d in upserts.values():
            store.revisions[(d.document_id, d.revision)] = d
        deleted = deleted or bool(deletes) or any(r > 1 for r in revisions.values())
        index.apply(GENERATION, list(upserts.values()), sorted(deletes.items()))
    before_answers = _answers(index)
    before_evidence = index.evidence(GENERATION)
    pairs = index.stored_pairs(GENERATION)

    compacted = index.compact(GENERATION, store.documents)

    assert index.evidence(GENERATION) == before_evidence
    assert _segments_of(index) <= 1
    if pairs:
        assert compacted or _segments_of(index) == 1
    fresh = _fresh(root / "fresh", index)
    fresh.apply(GENERATION, store.documents(pairs), [])
    assert _answers(index) == _answers(fresh)
    if not deleted:
        assert _answers(index) == before_answers
    # Still writable, and the next compaction of a compact index does nothing.
    assert not index.compact(GENERATION, store.documents)
    store.write(index, [_document("new", 1, ["red", "lamp"])])
    assert ("new", 1) in index.stored_pairs(GENERATION)
    index.close()
    fresh.close()


def _built(root: Path, store: Store, *, commits: int = 6) -> TantivyLexicalIndex:
    index = TantivyLexicalIndex(root)
    index.create(GENERATION)
    for batch in range(commits):
        store.write(
            index,
            [
                _document(f"b{batch}-{n}", 1, [WORDS[(batch + n) % len(WORDS)], "red", "hall"])
                for n in range(5)
            ],
        )
    return index


def test_writes_made_while_copying_are_kept(tmp_path: Path) -> None:
    store = Store()
    index = _built(tmp_path / "live", store)
    assert _segments_of(index) > 1
    written = threading.Event()

    def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        if not written.is_set():
            written.set()
            # Another thread's writes while the copy is under way (its lock is free):
            # an update, a delete and a new document.
            writer = threading.Thread(
                target=lambda: (
                    store.write(index, [_document("b0-0", 2, ["blue", "kettle"])]),
                    index.apply(GENERATION, [], [("b1-1", 2)]),
                    store.write(index, [_document("late", 1, ["garden", "red"])]),
                )
            )
            writer.start()
            writer.join()
        return store.documents(pairs)

    assert index.compact(GENERATION, documents)
    assert _segments_of(index) == 1
    pairs = set(index.stored_pairs(GENERATION))
    assert ("b0-0", 2) in pairs and ("b0-0", 1) not in pairs
    assert not any(d == "b1-1" for d, _ in pairs)
    assert ("late", 1) in pairs
    fresh = _fresh(tmp_path / "fresh", index)
    fresh.apply(GENERATION, store.documents(sorted(pairs)), [])
    assert index.evidence(GENERATION) == fresh.evidence(GENERATION)
    assert _answers(index) == _answers(fresh)


def test_a_document_written_after_its_chunk_was_copied_is_kept(tmp_path: Path) -> None:
    store = Store()
    index = TantivyLexicalIndex(tmp_path / "live")
    index.create(GENERATION)
    for start in range(0, 1_200, 300):  # More than one chunk of 1,000, four segments.
        store.write(
            index,
            [
                _document(f"n{n:04d}", 1, [WORDS[n % len(WORDS)], "red"])
                for n in range(start, start + 300)
            ],
        )
    first = index.stored_pairs(GENERATION)[0][0]

    def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        if store.calls == 1:  # The second chunk: the first one is in the copy already.
            writer = threading.Thread(
                target=store.write, args=(index, [_document(first, 2, ["blue", "stone"])])
            )
            writer.start()
            writer.join()
        return store.documents(pairs)

    assert index.compact(GENERATION, documents)
    pairs = sorted(index.stored_pairs(GENERATION))
    assert (first, 2) in pairs and (first, 1) not in pairs and len(pairs) == 1_200
    fresh = _fresh(tmp_path / "fresh", index)
    fresh.apply(GENERATION, store.documents(pairs), [])
    assert index.evidence(GENERATION) == fresh.evidence(GENERATION)
    # The copy kept the first revision as a deleted document; the next compaction drops it.
    assert index.compact(GENERATION, store.documents)
    assert _answers(index) == _answers(fresh)


def test_a_source_that_returns_other_revisions_changes_nothing(tmp_path: Path) -> None:
    store = Store()
    index = _built(tmp_path / "live", store)
    before = (index.evidence(GENERATION), _segments_of(index), _answers(index))

    def stale(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        return [d.model_copy(update={"revision": d.revision + 1}) for d in store.documents(pairs)]

    with pytest.raises(OrreryError) as raised:
        index.compact(GENERATION, stale)
    assert raised.value.code is ErrorCode.INTERNAL
    assert (index.evidence(GENERATION), _segments_of(index), _answers(index)) == before
    assert not list((tmp_path / "live").glob(".compact.*"))
    store.write(index, [_document("after", 1, ["lamp"])])  # The writer still works.
    assert index.compact(GENERATION, store.documents)


def test_a_generation_dropped_while_copying_is_not_brought_back(tmp_path: Path) -> None:
    store = Store()
    index = _built(tmp_path / "live", store)

    def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        dropper = threading.Thread(target=index.drop, args=(GENERATION,))
        dropper.start()  # Another thread; the copy holds no lock the drop needs.
        dropper.join()
        return store.documents(pairs)

    assert not index.compact(GENERATION, documents)
    index.close()
    reopened = TantivyLexicalIndex(tmp_path / "live")
    with pytest.raises(OrreryError) as raised:
        reopened.evidence(GENERATION)
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE
    assert not [p.name for p in (tmp_path / "live").iterdir() if GENERATION in p.name]


def _stopped_between_renames(root: Path, store: Store) -> tuple[object, object]:
    """The directories a process leaves if it stops between the swap's two renames:
    the old index aside (whole), the copy (whole or not) not yet in place."""
    index = _built(root, store)
    old = (index.evidence(GENERATION), _answers(index))
    index.close()
    (root / GENERATION).rename(root / f".retired.{GENERATION}")
    (root / f".compact.{GENERATION}").mkdir()
    (root / f".compact.{GENERATION}" / "meta.json").write_text("{}", encoding="utf-8")
    return old


def test_a_stop_between_the_renames_finds_the_old_index_whole(tmp_path: Path) -> None:
    root = tmp_path / "live"
    old_evidence, old_answers = _stopped_between_renames(root, Store())
    reopened = TantivyLexicalIndex(root)
    assert reopened.evidence(GENERATION) == old_evidence
    assert _answers(reopened) == old_answers
    assert sorted(p.name for p in root.iterdir()) == [GENERATION]


def test_a_stop_after_the_renames_finds_the_new_index_whole(tmp_path: Path) -> None:
    root = tmp_path / "live"
    store = Store()
    index = _built(root, store)
    kept = tmp_path / "kept"
    shutil.copytree(root / GENERATION, kept)  # The old index, as the swap set it aside.
    assert index.compact(GENERATION, store.documents)
    new = (index.evidence(GENERATION), _answers(index))
    index.close()
    shutil.copytree(kept, root / f".retired.{GENERATION}")
    reopened = TantivyLexicalIndex(root)
    assert (reopened.evidence(GENERATION), _answers(reopened)) == new
    assert reopened.segment_count(GENERATION) == 1
    assert sorted(p.name for p in root.iterdir()) == [GENERATION]


def test_compaction_is_due_when_quiet_and_the_tail_is_large(tmp_path: Path) -> None:
    store = Store()
    index = _built(tmp_path / "live", store)  # 6 segments of 5.
    assert not index.compaction_due(GENERATION, quiet_s=3_600.0, growth=0.25)  # Not quiet.
    assert index.compaction_due(GENERATION, quiet_s=0.0, growth=0.25)  # 25 outside 5.
    assert index.compact(GENERATION, store.documents)
    assert not index.compaction_due(GENERATION, quiet_s=0.0, growth=0.0)  # One segment.
    store.write(index, [_document("x1", 1, ["lamp"])])
    assert _segments_of(index) == 2
    assert index.compaction_due(GENERATION, quiet_s=0.0, growth=0.0)
    assert not index.compaction_due(GENERATION, quiet_s=0.0, growth=0.25)  # 1 beside 30.
    store.write(index, [_document(f"x{n}", 1, ["lamp"]) for n in range(2, 10)])
    assert index.compaction_due(GENERATION, quiet_s=0.0, growth=0.25)  # 9 beside 30.
    # An update deletes the old revision in the big segment: deletes count as the tail.
    assert index.compact(GENERATION, store.documents)
    store.write(index, [_document(f"b0-{n}", 2, ["blue"]) for n in range(5)])
    assert not index.compaction_due(GENERATION, quiet_s=0.0, growth=0.5)  # 5 + 5 beside 33.
    assert index.compaction_due(GENERATION, quiet_s=0.0, growth=0.25)


def test_a_compaction_stopped_between_chunks_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    store = Store()
    index = TantivyLexicalIndex(tmp_path / "live")
    index.create(GENERATION)
    for start in range(0, 1_200, 400):
        store.write(index, [_document(f"n{n:04d}", 1, ["red"]) for n in range(start, start + 400)])
    before = (index.evidence(GENERATION), _segments_of(index), _answers(index))

    class Stop(Exception):
        pass

    def pace() -> None:
        raise Stop

    with pytest.raises(Stop):
        index.compact(GENERATION, store.documents, pace=pace)
    assert (index.evidence(GENERATION), _segments_of(index), _answers(index)) == before
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == [GENERATION]
    store.write(index, [_document("after", 1, ["lamp"])])
    assert index.compact(GENERATION, store.documents)
    assert _segments_of(index) == 1


def test_writes_throughout_a_compaction_are_all_kept(tmp_path: Path) -> None:
    """A writer thread updates, deletes and adds documents during the whole compaction
    (the copy, the big commit, the replays, the swap): nothing lost, nothing twice."""
    store = Store()
    index = TantivyLexicalIndex(tmp_path / "live")
    index.create(GENERATION)
    for start in range(0, 2_400, 600):
        store.write(
            index,
            [_document(f"n{n:04d}", 1, ["red", WORDS[n % 9]]) for n in range(start, start + 600)],
        )
    expected = dict(index.stored_pairs(GENERATION))
    done = threading.Event()

    def write() -> None:
        step = 0
        while not done.is_set() or step < 20:
            document_id = f"n{(step * 37) % 2_400:04d}"
            if step % 5 == 4:
                revision = expected.pop(document_id, 0) + 1 if document_id in expected else 0
                if revision:
                    index.apply(GENERATION, [], [(document_id, revision)])
            else:
                new = f"w{step}" if step % 5 == 3 else document_id
                revision = expected.get(new, 0) + 1
                store.write(index, [_document(new, revision, ["blue", "lamp"])])
                expected[new] = revision
            step += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        compacted = index.compact(GENERATION, store.documents)
    finally:
        done.set()
        writer.join()
    assert compacted
    pairs = index.stored_pairs(GENERATION)
    assert len(pairs) == len(set(pairs)) and dict(pairs) == expected
    fresh = _fresh(tmp_path / "fresh", index)
    fresh.apply(GENERATION, store.documents(sorted(expected.items())), [])
    assert index.evidence(GENERATION) == fresh.evidence(GENERATION)


def test_a_compaction_gives_way_to_writes_past_max_journal(tmp_path: Path) -> None:
    store = Store()
    index = _built(tmp_path / "live", store)

    def documents(pairs: Sequence[tuple[str, int]]) -> list[IndexDocument]:
        writer = threading.Thread(
            target=store.write,
            args=(index, [_document("w1", 1, ["lamp"]), _document("w2", 1, ["lamp"])]),
        )
        writer.start()
        writer.join()
        return store.documents(pairs)

    assert not index.compact(GENERATION, documents, max_journal=1)
    assert {("w1", 1), ("w2", 1)} <= set(index.stored_pairs(GENERATION))
    assert _segments_of(index) > 1
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == [GENERATION]
    assert index.compact(GENERATION, store.documents, max_journal=1)  # Quiet: done.
    assert _segments_of(index) == 1
