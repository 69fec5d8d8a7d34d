"""Conformance suite for the lexical port pair: `LexicalIndex` writes, `LexicalSearch` reads.

Every engine runs every test. To add one, put a factory in `ENGINES` (and its marks, such
as `servers`, in `ENGINE_MARKS`). A factory opens a fresh pair of adapters over the
engine's storage for `workdir`; calling it again with the same `workdir` is a restart
(for a server engine: new clients on the same indexes). `LexicalPair.close` releases
everything the factory opened.

The last section checks that the engines agree with each other (BM25 order, analysis).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.index import TITLE_BOOST, Candidate, IndexDocument, SearchFilter
from contracts.index_fields import (
    HIDDEN_FACET,
    NO_STEMMING,
    STEMMER_LANGUAGES,
    TEXT_ANALYZER_V1,
    text_analyzer_name,
)
from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.ports import LexicalIndex
from query.adapters.opensearch_lexical import OpenSearchLexicalSearch
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.ports import LexicalSearch
from tests.conformance.corpus import CORPUS, doc
from tests.conftest import require_server, run_tag


@dataclass
class LexicalPair:
    index: LexicalIndex
    search: LexicalSearch
    close: Callable[[], None]


EngineFactory = Callable[[Path], LexicalPair]


def _tantivy(workdir: Path) -> LexicalPair:
    index = TantivyLexicalIndex(workdir / "tantivy")
    return LexicalPair(
        index=index, search=TantivyLexicalSearch(index.searchable), close=index.close
    )


# One prefix per test run: every index this run creates is `orrery-test-<uuid8>-<generation>`.
OPENSEARCH_PREFIX = f"orrery-test-{run_tag()}"


def _opensearch(workdir: Path) -> LexicalPair:
    url = require_server("opensearch")
    # The default `wait_for` refresh policy, with a shorter interval than production's
    # 1 s, so that each `apply` waits ~0.1 s instead of up to a second.
    index = OpenSearchLexicalIndex(url, index_prefix=OPENSEARCH_PREFIX, refresh_interval="100ms")
    search = OpenSearchLexicalSearch(url, index_prefix=OPENSEARCH_PREFIX)

    def close() -> None:
        index.close()
        search.close()

    return LexicalPair(index=index, search=search, close=close)


ENGINES: dict[str, EngineFactory] = {"tantivy": _tantivy, "opensearch": _opensearch}
ENGINE_MARKS: dict[str, Sequence[pytest.MarkDecorator]] = {"opensearch": [pytest.mark.servers]}


class Lexical:
    """One engine's adapters over one fresh generation, with shorthands for the tests."""

    def __init__(self, factory: EngineFactory, workdir: Path, generation_id: str) -> None:
        self._factory = factory
        self._workdir = workdir
        self.generation_id = generation_id
        self.pair = factory(workdir)
        self.extra_generations: list[str] = []

    @property
    def index(self) -> LexicalIndex:
        return self.pair.index

    @property
    def search(self) -> LexicalSearch:
        return self.pair.search

    def apply(
        self, upserts: Sequence[IndexDocument] = (), deletes: Sequence[tuple[str, int]] = ()
    ) -> None:
        self.index.apply(self.generation_id, upserts, deletes)

    def query(
        self, text: str, filter: SearchFilter | None = None, limit: int = 10
    ) -> list[Candidate]:
        return self.search.search(self.generation_id, text, filter or SearchFilter(), limit)

    def ids(self, text: str, filter: SearchFilter | None = None, limit: int = 10) -> list[str]:
        return [candidate.document_id for candidate in self.query(text, filter, limit)]

    def id_set(self, filter: SearchFilter) -> set[str]:
        return set(self.ids("", filter, limit=100))

    def pairs(self, text: str = "", limit: int = 100) -> list[tuple[str, int]]:
        return [(c.document_id, c.revision) for c in self.query(text, limit=limit)]

    def restart(self) -> None:
        self.pair.close()
        self.pair = self._factory(self._workdir)

    def with_analyzer(self, text_analyzer: str) -> Lexical:
        """Another fresh generation on the same adapters, created with `text_analyzer`
        (dropped by the `lexical` fixture's teardown via `extra_generations`)."""
        other = Lexical.__new__(Lexical)
        other._factory, other._workdir, other.pair = self._factory, self._workdir, self.pair
        other.generation_id = f"{self.generation_id}-{len(self.extra_generations)}"
        other.extra_generations = []
        self.index.create(other.generation_id, text_analyzer=text_analyzer)
        self.extra_generations.append(other.generation_id)
        return other

    def boosted(self, text: str, boosts: dict[str, float], limit: int = 10) -> list[Candidate]:
        return self.search.search(
            self.generation_id, text, SearchFilter(), limit, field_boosts=boosts
        )


@pytest.fixture(params=[pytest.param(name, marks=ENGINE_MARKS.get(name, ())) for name in ENGINES])
def lexical(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lexical]:
    harness = Lexical(ENGINES[request.param], tmp_path, f"conf-{uuid.uuid4().hex[:12]}")
    harness.index.create(harness.generation_id)
    yield harness
    for generation_id in [harness.generation_id, *harness.extra_generations]:
        harness.index.drop(generation_id)
    harness.pair.close()


@pytest.fixture
def corpus(lexical: Lexical) -> Lexical:
    lexical.apply(CORPUS)
    return lexical


DEFAULT_GALAXY = SearchFilter(galaxy="default")


# -- lifecycle ----------------------------------------------------------------------


def test_create_is_idempotent_and_starts_empty(lexical: Lexical) -> None:
    lexical.index.create(lexical.generation_id)
    evidence = lexical.index.evidence(lexical.generation_id)
    assert evidence.document_count == 0
    assert evidence.id_set_digest == id_set_digest([])
    assert lexical.query("thermos") == []
    assert lexical.query("") == []


def test_apply_is_visible_when_it_returns(lexical: Lexical) -> None:
    lexical.apply([doc("v1", title="visible")])
    assert lexical.ids("visible") == ["v1"]


def test_unknown_generation_is_coverage_unavailable(lexical: Lexical) -> None:
    with pytest.raises(OrreryError) as raised:
        lexical.search.search(f"missing-{uuid.uuid4().hex[:8]}", "thermos", SearchFilter(), 10)
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE


def test_writes_to_an_unknown_generation_are_coverage_unavailable(lexical: Lexical) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(OrreryError) as raised:
        lexical.index.apply(missing, [doc("m1", title="nowhere")], [])
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE
    # Nothing was created on the way (a server engine must not auto-create the index).
    with pytest.raises(OrreryError) as raised:
        lexical.index.evidence(missing)
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE


def test_dropped_generation_is_gone(corpus: Lexical) -> None:
    corpus.index.drop(corpus.generation_id)
    with pytest.raises(OrreryError) as raised:
        corpus.query("thermos")
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE
    corpus.index.drop(corpus.generation_id)  # no-op when absent
    corpus.index.create(corpus.generation_id)
    assert corpus.query("") == []


def test_restart_keeps_documents_and_accepts_writes(corpus: Lexical) -> None:
    before = corpus.index.evidence(corpus.generation_id)
    results = corpus.query("red thermos")
    corpus.restart()
    assert corpus.index.evidence(corpus.generation_id) == before
    assert corpus.query("red thermos") == results
    corpus.apply([doc("d6", title="new after restart")])
    assert corpus.ids("restart") == ["d6"]
    assert corpus.index.evidence(corpus.generation_id).document_count == len(CORPUS) + 1


# -- ranking ------------------------------------------------------------------------


def test_exact_title_query_ranks_that_document_first(corpus: Lexical) -> None:
    assert corpus.ids("garden hose")[0] == "d4"
    assert corpus.ids("blue kettle")[0] == "d2"
    assert corpus.ids("Rote Thermoskanne")[0] == "d3"
    assert corpus.ids("Wo stand früher meine rote Thermoskanne?")[0] == "d3"


def test_title_match_counts_title_boost_times_a_body_match(lexical: Lexical) -> None:
    # Mirror images: each field has the same statistics, only the boost differs.
    lexical.apply(
        [
            doc("in-title", title="lantern", body="shelf"),
            doc("in-body", title="shelf", body="lantern"),
        ]
    )
    first, second = lexical.query("lantern")
    assert (first.document_id, second.document_id) == ("in-title", "in-body")
    assert first.score == pytest.approx(TITLE_BOOST * second.score, rel=1e-4)


def test_field_boosts_replace_the_defaults(lexical: Lexical) -> None:
    lexical.apply(
        [
            doc("in-title", title="lantern", body="shelf"),
            doc("in-body", title="shelf", body="lantern"),
        ]
    )

    def query(boosts: dict[str, float]) -> list[Candidate]:
        return lexical.search.search(
            lexical.generation_id, "lantern", SearchFilter(), 10, field_boosts=boosts
        )

    body_first = query({"title": 0.5, "body": 2.0})
    assert [c.document_id for c in body_first] == ["in-body", "in-title"]
    assert body_first[0].score == pytest.approx(4.0 * body_first[1].score, rel=1e-4)
    even = query({"title": 1.0})
    assert even[0].score == pytest.approx(even[1].score, rel=1e-4)
    assert [c.document_id for c in query({"title": 0.0})] == ["in-body"]
    assert query({"title": 0.0, "body": 0.0, "tags": 0.0}) == []
    with pytest.raises(OrreryError) as err:
        query({"abstract": 1.0})
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_tags_are_searchable(lexical: Lexical) -> None:
    lexical.apply([doc("t1", title="basket", tags=("Picnic", "summer")), doc("t2", title="x")])
    assert lexical.ids("picnic") == ["t1"]
    assert lexical.ids("SUMMER") == ["t1"]


def test_candidate_carries_stored_fields(lexical: Lexical) -> None:
    updated = datetime(2026, 3, 19, 14, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    lexical.apply([doc("c1", revision=7, title="compass", status="candidate", updated_at=updated)])
    (candidate,) = lexical.query("compass")
    assert candidate.document_id == "c1"
    assert candidate.revision == 7
    assert candidate.status == "candidate"
    assert candidate.updated_at == updated
    assert candidate.score > 0


def test_candidates_report_every_field_exactly_for_any_id(lexical: Lexical) -> None:
    """What a hit reports does not depend on how the engine stores it: UUID ids (tantivy
    reads them from fast fields), a UUID in another spelling and other ids (read from
    the stored document), statuses, revisions and sub-second times, across two commits
    and a restart, in `search` and in `scores`."""
    base = datetime(2025, 11, 2, 8, 15, 59, 999999, tzinfo=timezone(timedelta(hours=-5)))
    ids = [str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15) % (1 << 128))) for n in range(1, 7)]
    ids += [ids[0].upper(), "plain-id", "ü/ß"]
    statuses = ["active", "candidate", "geprüft ✓", "x" * 64, "", "superseded"]
    documents = [
        doc(
            document_id,
            revision=3 + n,
            title="lantern" + " lantern" * (n % 3),
            status=statuses[n % len(statuses)],
            updated_at=base + timedelta(microseconds=n * 1_000_003),
        )
        for n, document_id in enumerate(ids)
    ]
    lexical.apply(documents[:4])
    lexical.apply(documents[4:])
    expected = {d.document_id: (d.revision, d.status, d.updated_at) for d in documents}
    for _ in range(2):
        hits = lexical.query("lantern", limit=len(ids))
        assert {c.document_id: (c.revision, c.status, c.updated_at) for c in hits} == expected
        blank = lexical.query("", SearchFilter(document_ids=tuple(ids)), limit=len(ids))
        assert [c.document_id for c in blank] == sorted(ids)
        assert {c.document_id: (c.revision, c.status, c.updated_at) for c in blank} == expected
        scores = lexical.search.scores(
            lexical.generation_id, "lantern", SearchFilter(document_ids=tuple(ids))
        )
        assert scores == {c.document_id: c.score for c in hits}
        lexical.restart()


def test_unknown_words_match_nothing(corpus: Lexical) -> None:
    assert corpus.query("xylophone quuxification") == []


def test_repeated_words_count_once(corpus: Lexical) -> None:
    assert corpus.query("thermos thermos THERMOS") == corpus.query("thermos")


def test_a_query_with_very_many_distinct_words_still_answers(corpus: Lexical) -> None:
    # About 4 000 characters (the API's limit), far more words than an engine's clause
    # limit; the words that count come first.
    text = "thermos " + " ".join(f"q{n:x}" for n in range(800))
    assert len(text) <= 4_096
    assert corpus.ids(text) == corpus.ids("thermos")


# -- text analysis ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["Thermoskanne", "thermoskanne", "THERMOSKANNE", "früher", "fruher", "Flurschrank"]
)
def test_german_text_is_lowercased_and_folded(corpus: Lexical, text: str) -> None:
    assert corpus.ids(text) == ["d3"]


def test_folding_applies_to_indexed_and_query_text_alike(lexical: Lexical) -> None:
    lexical.apply([doc("g1", body="Die Straße am Café Müller"), doc("g2", body="strasse")])
    assert set(lexical.ids("strasse")) == {"g1", "g2"}
    assert lexical.ids("MÜLLER") == ["g1"]
    assert lexical.ids("cafe") == ["g1"]


# -- stemming and the combined field (text analyzer version 2) -----------------------

ONLY_TEXT = {"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0}
STEMMING_DOCS = [
    doc("s1", body="She runs to the station every morning"),
    doc("s2", title="Running shoes", body="light and cheap"),
    doc("s3", body="the run was long"),
    doc("s4", body="a rune stone"),
]


def test_english_stemming_matches_word_forms(lexical: Lexical) -> None:
    # The default analyzer stems English (Porter2): run, runs, running are one term.
    lexical.apply(STEMMING_DOCS)
    for text in ("run", "runs", "RUNNING", "Läufe runs"):
        assert set(lexical.ids(text)) == {"s1", "s2", "s3"}, text
    assert lexical.ids("runes") == ["s4"]
    assert lexical.ids("stations") == ["s1"]
    # Stemmed repeats are one word: "runs running" scores like "run".
    assert lexical.query("runs running") == lexical.query("run")


def test_without_stemming_word_forms_stay_apart(lexical: Lexical) -> None:
    plain = lexical.with_analyzer(text_analyzer_name(NO_STEMMING))
    plain.apply(STEMMING_DOCS)
    assert plain.ids("run") == ["s3"]
    assert plain.ids("runs") == ["s1"]
    assert plain.ids("running") == ["s2"]
    assert plain.ids("Straße") == []  # still folded and lowercased, just not stemmed


def test_german_stemming_in_a_german_generation(lexical: Lexical) -> None:
    german = lexical.with_analyzer(text_analyzer_name("german"))
    german.apply(
        [
            doc("h1", body="Die Häuser am Fluss"),
            doc("h2", title="Ein Haus im Garten"),
            doc("h3", body="In den Gärten blühen Rosen"),
        ]
    )
    assert set(german.ids("Haus")) == {"h1", "h2"}
    assert set(german.ids("hauser")) == {"h1", "h2"}
    assert set(german.ids("Garten")) == {"h2", "h3"}
    # The same documents in the default (English) generation: German forms stay apart.
    lexical.apply([doc("h1", body="Die Häuser am Fluss"), doc("h2", title="Ein Haus")])
    assert lexical.ids("Haus") == ["h2"]


def test_the_analyzer_survives_a_restart(lexical: Lexical) -> None:
    german = lexical.with_analyzer(text_analyzer_name("german"))
    german.apply([doc("k1", body="zwei Katzen")])
    lexical.apply([doc("k1", body="two cats running")])
    lexical.restart()
    german.pair = lexical.pair
    # Each generation is read (and written) with its own analyzer after reopening.
    assert german.ids("Katze") == ["k1"]
    assert lexical.ids("run") == ["k1"]
    german.apply([doc("k2", body="eine Katze")])
    assert set(german.ids("katzen")) == {"k1", "k2"}


def test_the_combined_field_scores_title_body_and_tags_as_one(lexical: Lexical) -> None:
    lexical.apply(
        [
            doc("in-title", title="lantern", body="shelf"),
            doc("in-body", title="shelf", body="lantern"),
            doc("in-tags", title="shelf", tags=("lantern",)),
            doc("none", title="shelf", body="cupboard"),
        ]
    )
    found = lexical.boosted("lanterns", ONLY_TEXT)
    assert {c.document_id for c in found} == {"in-title", "in-body", "in-tags"}
    # One field of two words each: where the word stands makes no difference.
    assert found[0].score == pytest.approx(found[-1].score, rel=1e-4)
    assert lexical.boosted("cupboard", {"body": 0.0}) == []  # `text` is off by default
    assert [c.document_id for c in lexical.boosted("cupboard", ONLY_TEXT)] == ["none"]


def test_a_version_1_generation_stays_searchable(lexical: Lexical) -> None:
    old = lexical.with_analyzer(TEXT_ANALYZER_V1)
    old.apply(STEMMING_DOCS)
    assert old.ids("runs") == ["s1"]  # no stemming in version 1
    assert set(old.ids("RUNS running")) == {"s1", "s2"}
    # No combined field: a profile scoring `text` gets title, body and tags instead.
    assert [c.document_id for c in old.boosted("runs", ONLY_TEXT)] == ["s1"]
    assert [c.document_id for c in old.boosted("shoes", ONLY_TEXT)] == ["s2"]
    both = old.boosted("shoes", {"title": 1.0, "body": 1.0, "tags": 1.0})
    assert old.boosted("shoes", ONLY_TEXT) == both


def test_an_unknown_analyzer_is_refused(lexical: Lexical) -> None:
    with pytest.raises(OrreryError) as raised:
        lexical.index.create(f"{lexical.generation_id}-x", text_analyzer="orrery_text_v2_elvish")
    assert raised.value.code is ErrorCode.INVALID_REQUEST


SYNTAX_TEXTS = [
    "title:thermos",
    "thermos AND",
    "AND",
    "OR NOT",
    "-thermos",
    "+thermos",
    '"thermos',
    "(thermos",
    "thermos)",
    "thermos*",
    "*",
    "thermos~2",
    "thermos^10",
    "[a TO z]",
    "{",
    "}",
    "\\",
    "'",
    "&& ||",
    "!",
    "a:b:c",
    "IN [thermos]",
    "status: active",
    "/regex.*/",
    "Wo stand früher meine rote Thermoskanne?",
]


@pytest.mark.parametrize("text", SYNTAX_TEXTS)
def test_query_syntax_characters_are_plain_text(corpus: Lexical, text: str) -> None:
    results = corpus.query(text)
    assert all(isinstance(candidate, Candidate) for candidate in results)


def test_operators_are_not_interpreted(corpus: Lexical) -> None:
    thermos = corpus.ids("thermos")
    assert thermos
    assert corpus.ids("-thermos") == thermos  # not a negation
    assert corpus.ids("thermos*") == thermos  # not a prefix query
    assert corpus.ids("title:thermos") == thermos  # not a field query ("title" is unknown)
    assert corpus.ids("NOT thermos") == thermos  # "not" is an unknown word
    assert corpus.query("*") == []  # not a match-all
    assert corpus.query("AND OR") == []


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    text=st.text(
        alphabet=st.sampled_from(list(":\"()[]{}-+*?~^!&|\\/'<>=,. AaNnDdOoRrTtäÄß\u3000\t"))
        | st.characters(),
        max_size=40,
    )
)
def test_no_user_text_raises(corpus: Lexical, text: str) -> None:
    results = corpus.query(text, DEFAULT_GALAXY, limit=3)
    assert len(results) <= 3


# stdlib `json` (and so FastAPI) decodes "\ud800" into a lone surrogate, not valid Unicode.
LONE = "\ud800"


def test_lone_surrogates_in_a_query_are_separators(corpus: Lexical) -> None:
    assert corpus.ids(f"{LONE}thermos{LONE}") == corpus.ids("thermos")
    assert corpus.query(LONE) == []


def test_lone_surrogates_in_filter_values_match_nothing(corpus: Lexical) -> None:
    assert corpus.ids("thermos", SearchFilter(galaxy=LONE)) == []
    assert corpus.id_set(SearchFilter(status=("archived", LONE))) == {"d4"}
    assert corpus.id_set(SearchFilter(document_ids=(LONE,))) == set()
    assert corpus.id_set(SearchFilter(facets={"room": (LONE, "garden")})) == {"d4"}


def test_lone_surrogates_in_text_fields_are_indexed_as_separators(lexical: Lexical) -> None:
    lexical.apply([doc("u1", title=f"broken{LONE}text", tags=(f"{LONE}tag",))])
    assert lexical.ids("broken") == ["u1"]
    assert lexical.ids("tag") == ["u1"]


def test_keywords_that_are_not_unicode_are_rejected_whole(lexical: Lexical) -> None:
    with pytest.raises(OrreryError) as raised:
        lexical.apply([doc("k1", title="fine"), doc("k2", title="fine", status=LONE)])
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(OrreryError) as raised:
        lexical.apply(deletes=[(f"k{LONE}", 1)])
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert lexical.index.evidence(lexical.generation_id).document_count == 0


# -- filters ------------------------------------------------------------------------


def test_galaxy_filter_is_exact(corpus: Lexical) -> None:
    assert corpus.ids("thermos", SearchFilter(galaxy="other")) == ["d5"]
    assert "d5" not in corpus.ids("thermos", DEFAULT_GALAXY)
    assert corpus.ids("thermos", SearchFilter(galaxy="othe")) == []


def test_status_filter_is_any_of(corpus: Lexical) -> None:
    assert corpus.id_set(SearchFilter(status=("active",))) == {"d1", "d3", "d5"}
    assert corpus.id_set(SearchFilter(status=("candidate", "archived"))) == {"d2", "d4"}


def test_visibility_filter_is_any_of(corpus: Lexical) -> None:
    assert corpus.id_set(SearchFilter(visibility=("guests",))) == {"d2"}
    assert corpus.id_set(SearchFilter(visibility=("private", "guests"))) == {"d2", "d3"}
    assert corpus.id_set(SearchFilter(visibility=("family",))) == {"d1", "d2", "d4", "d5"}


def test_updated_bounds_are_inclusive(corpus: Lexical) -> None:
    feb = datetime(2026, 2, 1, tzinfo=UTC)
    apr = datetime(2026, 4, 1, tzinfo=UTC)
    assert corpus.id_set(SearchFilter(updated_after=feb)) == {"d2", "d3", "d4", "d5"}
    assert corpus.id_set(SearchFilter(updated_before=feb)) == {"d1", "d2"}
    assert corpus.id_set(SearchFilter(updated_after=feb, updated_before=apr)) == {
        "d2",
        "d3",
        "d4",
    }
    assert corpus.id_set(SearchFilter(updated_after=apr, updated_before=feb)) == set()


def test_updated_bounds_are_exact_below_a_second(lexical: Lexical) -> None:
    at = datetime(2026, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC)
    lexical.apply([doc("s1", title="x", updated_at=at)])
    micro = timedelta(microseconds=1)
    assert lexical.id_set(SearchFilter(updated_after=at)) == {"s1"}
    assert lexical.id_set(SearchFilter(updated_before=at)) == {"s1"}
    assert lexical.id_set(SearchFilter(updated_after=at + micro)) == set()
    assert lexical.id_set(SearchFilter(updated_before=at - micro)) == set()
    # The same instant written in another zone.
    berlin = at.astimezone(timezone(timedelta(hours=2)))
    assert lexical.id_set(SearchFilter(updated_after=berlin, updated_before=berlin)) == {"s1"}


def test_facet_filter_is_any_of_values_and_all_of_names(corpus: Lexical) -> None:
    assert corpus.id_set(SearchFilter(facets={"room": ("hall", "kitchen")})) == {"d1", "d2"}
    assert corpus.id_set(SearchFilter(facets={"room": ("flur",), "lang": ("de",)})) == {"d3"}
    assert corpus.id_set(SearchFilter(facets={"room": ("hall",), "lang": ("de",)})) == set()
    assert corpus.id_set(SearchFilter(facets={"lang": ("hall",)})) == set()


def test_document_ids_filter_is_any_of(corpus: Lexical) -> None:
    assert corpus.id_set(SearchFilter(document_ids=("d1", "d4", "nope"))) == {"d1", "d4"}
    assert corpus.ids("thermos", SearchFilter(document_ids=("d2", "d3"))) == ["d2"]


def test_document_ids_filter_with_many_ids(corpus: Lexical) -> None:
    many = (*(f"absent-{n}" for n in range(500)), "d3", "d5", "d3")
    assert corpus.id_set(SearchFilter(document_ids=many)) == {"d3", "d5"}
    assert corpus.ids("thermos", SearchFilter(document_ids=many)) == ["d5"]


def test_filters_combine_as_and(corpus: Lexical) -> None:
    combined = SearchFilter(
        galaxy="default",
        status=("active", "candidate"),
        visibility=("family",),
        updated_before=datetime(2026, 3, 1, tzinfo=UTC),
        facets={"room": ("hall", "kitchen", "flur")},
    )
    assert corpus.id_set(combined) == {"d1", "d2"}
    assert corpus.ids("thermos", combined) == corpus.ids("thermos", combined.model_copy())


@pytest.mark.parametrize(
    "empty",
    [
        SearchFilter(status=()),
        SearchFilter(visibility=()),
        SearchFilter(document_ids=()),
        SearchFilter(facets={"room": ()}),
        SearchFilter(galaxy="default", facets={"room": ("hall",), "lang": ()}),
    ],
)
def test_an_empty_list_matches_nothing(corpus: Lexical, empty: SearchFilter) -> None:
    assert corpus.query("thermos", empty) == []
    assert corpus.query("", empty) == []


FILTERS_FOR_SCORES = [
    SearchFilter(galaxy="default"),
    SearchFilter(status=("active", "candidate")),
    SearchFilter(visibility=("family",)),
    SearchFilter(updated_after=datetime(2026, 1, 15, tzinfo=UTC)),
    SearchFilter(facets={"room": ("hall", "kitchen")}),
    SearchFilter(document_ids=("d1", "d2", "d5")),
    SearchFilter(galaxy="default", status=("active", "candidate"), visibility=("family",)),
]


@pytest.mark.parametrize("filter", FILTERS_FOR_SCORES)
def test_filters_do_not_change_scores(corpus: Lexical, filter: SearchFilter) -> None:
    unfiltered = {c.document_id: c.score for c in corpus.query("the red thermos kettle")}
    filtered = corpus.query("the red thermos kettle", filter)
    assert filtered
    for candidate in filtered:
        assert candidate.score == unfiltered[candidate.document_id]
    scores = [candidate.score for candidate in filtered]
    assert scores == sorted(scores, reverse=True)


# -- score lookups by id (`scores`) -------------------------------------------------

ALL_IDS = ("d1", "d2", "d3", "d4", "d5", "nope")


@pytest.mark.parametrize("filter", [SearchFilter(), *FILTERS_FOR_SCORES])
@pytest.mark.parametrize("text", ["the red thermos kettle", "thermos", "kettle"])
def test_scores_are_exactly_the_search_scores_of_the_listed_ids(
    corpus: Lexical, filter: SearchFilter, text: str
) -> None:
    listed = ALL_IDS if filter.document_ids is None else filter.document_ids
    by_id = filter.model_copy(update={"document_ids": listed})
    expected = {c.document_id: c.score for c in corpus.query(text, by_id, limit=100)}
    assert corpus.search.scores(corpus.generation_id, text, by_id) == expected
    assert expected  # the lookup is not trivially empty


def test_scores_leave_out_documents_that_match_no_term(corpus: Lexical) -> None:
    matching = set(corpus.ids("thermos", limit=100))
    found = corpus.search.scores(
        corpus.generation_id, "thermos", SearchFilter(document_ids=ALL_IDS)
    )
    assert set(found) == matching != set(ALL_IDS)
    assert (
        corpus.search.scores(corpus.generation_id, "zzzunknown", SearchFilter(document_ids=ALL_IDS))
        == {}
    )
    assert (
        corpus.search.scores(corpus.generation_id, "!!!", SearchFilter(document_ids=ALL_IDS)) == {}
    )


def test_scores_under_field_boosts_and_phrases_match_search(lexical: Lexical) -> None:
    lexical.apply(PHRASE_DOCS)
    ids = ("p1", "p2", "p3", "p4", "p5", "p6")
    for boosts in ({"title": 0.0, "body": 0.0, "tags": 0.0, "text": 1.0}, {"body": 2.0}):
        for filter in (SearchFilter(document_ids=ids), phrases(["red thermos"])):
            by_id = filter.model_copy(update={"document_ids": ids})
            found = lexical.search.search(
                lexical.generation_id, "red thermos hall", by_id, 100, field_boosts=boosts
            )
            assert lexical.search.scores(
                lexical.generation_id, "red thermos hall", by_id, field_boosts=boosts
            ) == {c.document_id: c.score for c in found}


@pytest.mark.parametrize("blank", ["", "   "])
def test_scores_of_blank_text_are_zero_for_filter_matches(corpus: Lexical, blank: str) -> None:
    by_id = SearchFilter(galaxy="default", document_ids=ALL_IDS)
    assert corpus.search.scores(corpus.generation_id, blank, by_id) == {
        document_id: 0.0 for document_id in corpus.ids(blank, by_id, limit=100)
    }


def test_scores_need_listed_ids(corpus: Lexical) -> None:
    with pytest.raises(OrreryError) as raised:
        corpus.search.scores(corpus.generation_id, "thermos", SearchFilter())
    assert raised.value.code is ErrorCode.INTERNAL
    assert (
        corpus.search.scores(corpus.generation_id, "thermos", SearchFilter(document_ids=())) == {}
    )


def test_scores_of_an_unknown_generation_are_coverage_unavailable(lexical: Lexical) -> None:
    with pytest.raises(OrreryError) as raised:
        lexical.search.scores(
            f"missing-{uuid.uuid4().hex[:8]}", "thermos", SearchFilter(document_ids=("d1",))
        )
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE


# -- empty query --------------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
def test_blank_query_returns_filter_matches_by_document_id(corpus: Lexical, blank: str) -> None:
    results = corpus.query(blank)
    assert [c.document_id for c in results] == ["d1", "d2", "d3", "d4", "d5"]
    assert all(c.score == 0.0 for c in results)
    assert corpus.ids(blank, DEFAULT_GALAXY) == ["d1", "d2", "d3", "d4"]
    assert corpus.ids(blank, limit=2) == ["d1", "d2"]


def test_blank_query_orders_across_batches(lexical: Lexical) -> None:
    for batch in (["e7", "e2"], ["e9", "e1"], ["e5"]):
        lexical.apply([doc(document_id, title="x") for document_id in batch])
    assert lexical.ids("", limit=3) == ["e1", "e2", "e5"]


# -- limit and ties -----------------------------------------------------------------


def test_limit_and_ties_break_by_document_id(lexical: Lexical) -> None:
    # Identical documents score identically; written over several commits in an order
    # unrelated to their ids so that the engine's internal order cannot be relied on.
    for batch in (["t5", "t2"], ["t7", "t1", "t6"], ["t3", "t4"]):
        lexical.apply([doc(document_id, title="same words") for document_id in batch])
    lexical.apply([doc("t9", title="same same words")])
    everything = lexical.query("same", limit=100)
    assert [c.document_id for c in everything] == ["t9", "t1", "t2", "t3", "t4", "t5", "t6", "t7"]
    assert len({c.score for c in everything[1:]}) == 1
    assert everything[0].score > everything[1].score
    for limit in range(1, 9):
        assert lexical.query("same", limit=limit) == everything[:limit]
    assert lexical.query("same", limit=0) == []


# -- writes -------------------------------------------------------------------------


def test_reapplying_a_batch_changes_nothing(corpus: Lexical) -> None:
    evidence = corpus.index.evidence(corpus.generation_id)
    results = corpus.query("the red thermos kettle")
    corpus.apply(CORPUS, [("d4", 0)])
    corpus.apply(CORPUS)
    assert corpus.index.evidence(corpus.generation_id) == evidence
    assert corpus.query("the red thermos kettle") == results


def test_upsert_replaces_an_older_revision(corpus: Lexical) -> None:
    corpus.apply([doc("d1", revision=2, title="yellow umbrella")])
    assert corpus.ids("umbrella") == ["d1"]
    assert "d1" not in corpus.ids("red thermos")
    assert ("d1", 2) in corpus.pairs()


def test_upsert_never_replaces_a_newer_revision(lexical: Lexical) -> None:
    lexical.apply([doc("o1", revision=2, title="newer")])
    lexical.apply([doc("o1", revision=1, title="older")])
    assert lexical.ids("newer") == ["o1"]
    assert lexical.ids("older") == []
    assert lexical.pairs() == [("o1", 2)]


def test_newest_revision_wins_within_a_batch(lexical: Lexical) -> None:
    lexical.apply([doc("b1", revision=3, title="third"), doc("b1", revision=2, title="second")])
    lexical.apply([doc("b2", revision=1, title="first"), doc("b2", revision=4, title="fourth")])
    assert lexical.pairs() == [("b1", 3), ("b2", 4)]
    assert lexical.ids("second first") == []


def test_delete_removes_present_revision_up_to_its_own(corpus: Lexical) -> None:
    corpus.apply(deletes=[("d1", 1)])
    corpus.apply(deletes=[("d2", 5)])
    assert "d1" not in corpus.ids("thermos")
    assert {pair[0] for pair in corpus.pairs()} == {"d3", "d4", "d5"}


def test_stale_delete_is_a_no_op(lexical: Lexical) -> None:
    lexical.apply([doc("x1", revision=3, title="kept")])
    lexical.apply(deletes=[("x1", 2), ("absent", 9)])
    assert lexical.pairs() == [("x1", 3)]


def test_delete_wins_a_tie_with_an_upsert_in_one_batch(lexical: Lexical) -> None:
    lexical.apply([doc("y1", revision=2, title="gone")], [("y1", 2)])
    lexical.apply([doc("y2", revision=3, title="stays")], [("y2", 2)])
    assert lexical.pairs() == [("y2", 3)]


def test_long_and_unusual_document_ids_are_kept_exactly(lexical: Lexical) -> None:
    # 256 characters of 3 UTF-8 bytes each: longer than some engines' native ids.
    long_id = "ü" + "中" * 255
    odd_ids = [long_id, "~tilde", "with space/and:colon", "ÄÖÜ"]
    lexical.apply([doc(document_id, title="oddity") for document_id in odd_ids])
    assert set(lexical.ids("oddity")) == set(odd_ids)
    assert lexical.id_set(SearchFilter(document_ids=(long_id, "~tilde"))) == {long_id, "~tilde"}
    evidence = lexical.index.evidence(lexical.generation_id)
    assert evidence.id_set_digest == id_set_digest([(document_id, 1) for document_id in odd_ids])
    lexical.apply([doc(long_id, revision=2, title="changed")], [("~tilde", 1)])
    assert lexical.pairs() == sorted([(long_id, 2), ("with space/and:colon", 1), ("ÄÖÜ", 1)])


def test_evidence_is_the_digest_of_live_pairs(corpus: Lexical) -> None:
    corpus.apply([doc("d2", revision=4, title="kettle"), doc("d9", revision=2)], [("d4", 1)])
    expected = [("d1", 1), ("d2", 4), ("d3", 1), ("d5", 1), ("d9", 2)]
    evidence = corpus.index.evidence(corpus.generation_id)
    assert evidence.document_count == len(expected)
    assert evidence.id_set_digest == id_set_digest(expected)


def test_searches_run_while_batches_are_applied(lexical: Lexical) -> None:
    errors: list[BaseException] = []
    done = threading.Event()

    def search_until_done() -> None:
        try:
            while not done.is_set():
                lexical.query("busy", limit=5)
                lexical.query("", DEFAULT_GALAXY, limit=5)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    readers = [threading.Thread(target=search_until_done) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for revision in range(1, 21):
            lexical.apply([doc(f"w{n}", revision=revision, title="busy") for n in range(10)])
    finally:
        done.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert lexical.pairs("busy") == [(f"w{n}", 20) for n in range(10)]


# -- the engines agree with each other ----------------------------------------------


@pytest.fixture
def both_engines(tmp_path: Path) -> Iterator[dict[str, Lexical]]:
    """Every engine over one fresh generation each; skips if a server engine is down."""
    engines: dict[str, Lexical] = {}
    try:
        for name, factory in ENGINES.items():
            harness = Lexical(factory, tmp_path / name, f"agree-{uuid.uuid4().hex[:12]}")
            harness.index.create(harness.generation_id)
            engines[name] = harness
        yield engines
    finally:
        for harness in engines.values():
            harness.index.drop(harness.generation_id)
            harness.pair.close()


AGREEMENT_QUERIES = [
    "red thermos",
    "thermos",
    "the red thermos kettle",
    "kettle thermos",
    "the",
    "hose shed kitchen",
    "Wo stand früher meine rote Thermoskanne?",
    "stood in the cupboards",
    "boiling kettles",
]


@pytest.mark.servers
def test_bm25_order_and_scores_agree_across_engines(both_engines: dict[str, Lexical]) -> None:
    for harness in both_engines.values():
        harness.apply(CORPUS)
    for text in AGREEMENT_QUERIES:
        results = {name: harness.query(text, limit=3) for name, harness in both_engines.items()}
        (reference_name, reference), *others = results.items()
        for name, candidates in others:
            assert [c.document_id for c in candidates] == [c.document_id for c in reference], (
                f"{text!r}: {name} and {reference_name} disagree on the top 3"
            )
            for mine, theirs in zip(candidates, reference, strict=True):
                assert mine.score == pytest.approx(theirs.score, rel=1e-3)


# Texts that exercise the analyzer's corners: folding, case mapping, the token byte limit
# (tokens of 40+ UTF-8 bytes are dropped) and separators.
ANALYSIS_TEXTS = {
    "a1": "Die Straße am Café Müller, ÆON œuvre ﬁx",
    "a2": "İstanbul ΣΊΣΥΦΟΣ don't 3.14 x² ½",
    "a3": "a" * 39 + " " + "b" * 40,
    "a4": "é" * 19 + " " + "ê" * 20,
    "a5": "中" * 13 + " " + "文" * 14,
    "a6": "\U0001d400" * 9 + "aaa" + " " + "\U0001d401" * 10,
    "a7": "left\ue000right under_score dash-word",
    "a8": "Ⓐb a\u0915\u093f 中文字",
}
ANALYSIS_QUERIES = [
    "strasse",
    "CAFE",
    "muller",
    "aeon",
    "oeuvre",
    "fix",
    "i\u0307stanbul",
    "istanbul",
    "İSTANBUL",
    "σίσυφοσ",
    "don",
    "14",
    "x2",
    "½",
    "a" * 39,
    "b" * 40,
    "e" * 19,
    "ê" * 20,
    "e" * 20,
    "中" * 13,
    "文" * 14,
    "\U0001d400" * 9 + "AAA",
    "\U0001d401" * 10,
    "left",
    "right",
    "under",
    "score",
    "word",
    "ab",
    "a\u0915\u093f",
    "中文字",
]


@pytest.mark.servers
def test_text_analysis_agrees_across_engines(both_engines: dict[str, Lexical]) -> None:
    for harness in both_engines.values():
        harness.apply([doc(document_id, body=text) for document_id, text in ANALYSIS_TEXTS.items()])
    for text in ANALYSIS_QUERIES:
        found = {name: set(harness.ids(text)) for name, harness in both_engines.items()}
        assert len(set(map(frozenset, found.values()))) == 1, f"{text!r}: {found}"


# -- phrase filters (controlled-term phrase plans) ------------------------------------

PHRASE_DOCS = [
    doc("p1", title="Kitchen notes", body="the red thermos stood in the hall cupboard"),
    # Every word of "red thermos", never adjacent in this order.
    doc("p2", title="Hall", body="a thermos, dented and red, stood in the hall"),
    doc("p3", title="Der Kühlschrank", body="Die Milch steht im Kühlschrank neben dem Käse"),
    doc("p4", body="the fridge is cold", tags=("red thermos",)),
    # Adjacent only across two tag values, or across two fields: not a phrase.
    doc("p5", body="nothing to see", tags=("red", "thermos")),
    doc("p6", title="Red", body="thermos flask"),
]


def phrases(*groups: Sequence[str]) -> SearchFilter:
    return SearchFilter(phrases=tuple(tuple(group) for group in groups))


@pytest.fixture
def phrase_docs(lexical: Lexical) -> Lexical:
    lexical.apply(PHRASE_DOCS)
    return lexical


def test_phrase_filter_needs_adjacent_words_in_order(phrase_docs: Lexical) -> None:
    assert phrase_docs.id_set(phrases(["red thermos"])) == {"p1", "p4"}
    assert phrase_docs.id_set(phrases(["thermos red"])) == set()
    assert phrase_docs.id_set(phrases(["red thermos stood"])) == {"p1"}
    # The same words as a bag match where they are not adjacent, too.
    assert {"p2", "p5", "p6"} <= set(phrase_docs.ids("red thermos", limit=20))


def test_phrase_filter_analyzes_like_indexed_text(phrase_docs: Lexical) -> None:
    assert phrase_docs.id_set(phrases(["RED, thermos!"])) == {"p1", "p4"}
    # A repeated word keeps its position ("the" twice).
    assert phrase_docs.id_set(phrases(["the red thermos stood in the hall"])) == {"p1"}
    assert phrase_docs.id_set(phrases(["stood in the hall"])) == {"p1", "p2"}


@pytest.mark.parametrize(
    "phrase",
    ["Kühlschrank", "kuhlschrank", "KÜHLSCHRANK", "im Kühlschrank neben", "der kuhlschrank"],
)
def test_phrase_filter_folds_german(phrase_docs: Lexical, phrase: str) -> None:
    assert phrase_docs.id_set(phrases([phrase])) == {"p3"}


def test_phrase_group_is_any_of_and_groups_are_all_of(phrase_docs: Lexical) -> None:
    assert phrase_docs.id_set(phrases(["red thermos", "kühlschrank"])) == {"p1", "p3", "p4"}
    assert phrase_docs.id_set(phrases(["red thermos"], ["hall cupboard"])) == {"p1"}
    assert phrase_docs.id_set(phrases(["red thermos"], ["kühlschrank"])) == set()
    assert phrase_docs.id_set(phrases(["red thermos", "kühlschrank"], ["milch", "fridge"])) == {
        "p3",
        "p4",
    }


def test_phrase_filter_combines_with_other_filters(phrase_docs: Lexical) -> None:
    both = SearchFilter(document_ids=("p1", "p2", "p3"), phrases=(("red thermos",),))
    assert phrase_docs.id_set(both) == {"p1"}
    assert phrase_docs.id_set(both.model_copy(update={"galaxy": "other"})) == set()
    assert phrase_docs.ids("hall", both) == ["p1"]


def test_phrase_without_words_and_empty_group_match_nothing(phrase_docs: Lexical) -> None:
    assert phrase_docs.id_set(phrases(["!!!"])) == set()
    assert phrase_docs.id_set(phrases(["!!!", "red thermos"])) == {"p1", "p4"}
    assert phrase_docs.query("thermos", phrases([])) == []
    assert phrase_docs.query("", phrases(["red thermos"], [])) == []


def test_phrase_filter_does_not_change_scores(phrase_docs: Lexical) -> None:
    unfiltered = {c.document_id: c.score for c in phrase_docs.query("red thermos hall", limit=20)}
    filtered = phrase_docs.query("red thermos hall", phrases(["red thermos"]), limit=20)
    assert {c.document_id for c in filtered} == {"p1", "p4"}
    for candidate in filtered:
        assert candidate.score == unfiltered[candidate.document_id]


def test_lone_surrogates_in_phrases_are_separators(phrase_docs: Lexical) -> None:
    assert phrase_docs.id_set(phrases([f"red{LONE}thermos"])) == {"p1", "p4"}
    assert phrase_docs.id_set(phrases([LONE])) == set()


PHRASE_FILTERS = [
    phrases(["red thermos"]),
    phrases(["thermos red"]),
    phrases(["the red thermos stood in the hall"]),
    phrases(["Kühlschrank"], ["milch steht"]),
    phrases(["red thermos", "kühlschrank"], ["fridge", "hall cupboard"]),
    phrases(["red", "flask"]),
    phrases(["red thermos"], ["fridge"]),
]


@pytest.mark.servers
def test_phrase_filters_agree_across_engines(both_engines: dict[str, Lexical]) -> None:
    for harness in both_engines.values():
        harness.apply(PHRASE_DOCS)
    for filter in PHRASE_FILTERS:
        found = {name: harness.id_set(filter) for name, harness in both_engines.items()}
        assert len(set(map(frozenset, found.values()))) == 1, f"{filter.phrases}: {found}"


# Inflected words of the languages with a stemmer, each indexed as one document; the
# engines must match each query word to the same documents in a generation of every
# language (the Snowball algorithms of rust-stemmers and Lucene must agree).
STEMMING_WORDS = [
    *("running runs ran runner generously nationalities agreed flying happily", ""),
    *("Häuser Hauses Gärten Katzen laufen läuft gelaufen Schönheit Möglichkeiten", ""),
    *("maisons nationalité chanteuses finissaient", ""),
    *("casas cantaban nacionalidades canzoni", ""),
    *("kirjoissa taloissa házakban köszönöm", ""),
    *("husene bøkerne flickorna läsningen", ""),
    *("evlerimizden kitaplar", ""),
    *("книгами домами читающий", ""),
    *("cărțile frumoasele", ""),
]
STEMMING_TEXT = " ".join(STEMMING_WORDS).split()


@pytest.fixture
def engines_for(tmp_path: Path) -> Iterator[Callable[[str], dict[str, Lexical]]]:
    """Makes every engine's pair over one fresh generation with a given analyzer."""
    made: list[Lexical] = []

    def make(text_analyzer: str) -> dict[str, Lexical]:
        engines: dict[str, Lexical] = {}
        for name, factory in ENGINES.items():
            harness = Lexical(factory, tmp_path / name, f"stem-{uuid.uuid4().hex[:12]}")
            made.append(harness)
            harness.index.create(harness.generation_id, text_analyzer=text_analyzer)
            engines[name] = harness
        return engines

    try:
        yield make
    finally:
        for harness in made:
            harness.index.drop(harness.generation_id)
            harness.pair.close()


@pytest.mark.servers
@pytest.mark.parametrize("language", sorted(STEMMER_LANGUAGES))
def test_stemming_agrees_across_engines(
    engines_for: Callable[[str], dict[str, Lexical]], language: str
) -> None:
    engines = engines_for(text_analyzer_name(language))
    documents = [doc(f"w{n}", body=word) for n, word in enumerate(STEMMING_TEXT)]
    for harness in engines.values():
        harness.apply(documents)
    for word in STEMMING_TEXT:
        found = {name: set(harness.ids(word, limit=50)) for name, harness in engines.items()}
        assert len(set(map(frozenset, found.values()))) == 1, f"{language} {word!r}: {found}"

    # Several forms of one word stem alike in both: the test can tell stemming apart.
    def ids_of(*words: str) -> set[str]:
        return {f"w{STEMMING_TEXT.index(word)}" for word in words}

    if language == "english":
        assert set(engines["tantivy"].ids("run")) == ids_of("running", "runs")
    if language == "german":
        assert set(engines["tantivy"].ids("Haus")) == ids_of("Häuser", "Hauses")


@pytest.mark.servers
def test_combined_field_bm25_agrees_across_engines(
    engines_for: Callable[[str], dict[str, Lexical]],
) -> None:
    engines = engines_for(text_analyzer_name("english"))
    for harness in engines.values():
        harness.apply([*CORPUS, *STEMMING_DOCS])
    for text in [*AGREEMENT_QUERIES, "runs", "running shoes station"]:
        results = {
            name: harness.boosted(text, ONLY_TEXT, limit=3) for name, harness in engines.items()
        }
        (reference_name, reference), *others = results.items()
        for name, candidates in others:
            assert [c.document_id for c in candidates] == [c.document_id for c in reference], (
                f"{text!r}: {name} and {reference_name} disagree on the top 3"
            )
            for mine, theirs in zip(candidates, reference, strict=True):
                assert mine.score == pytest.approx(theirs.score, rel=1e-3)


# -- lanes (`Record.index_lanes`) ------------------------------------------------------


def test_documents_hidden_from_the_lexical_lane_are_never_a_hit(lexical: Lexical) -> None:
    hidden = {HIDDEN_FACET: ("lexical",)}
    lexical.apply(
        [
            doc("h1", title="catalog segment thermos", facets=hidden),
            doc("h2", title="thermos", facets={HIDDEN_FACET: ("vector",), "room": ("hall",)}),
            doc("h3", title="thermos flask", facets={"room": ("hall",)}),
        ]
    )
    assert set(lexical.ids("thermos")) == {"h2", "h3"}
    assert lexical.ids("catalog segment") == []
    assert lexical.id_set(SearchFilter()) == {"h2", "h3"}
    assert lexical.id_set(SearchFilter(document_ids=("h1", "h3"))) == {"h3"}
    scores = lexical.search.scores(
        lexical.generation_id, "thermos", SearchFilter(document_ids=("h1", "h2", "h3"))
    )
    assert set(scores) == {"h2", "h3"}
    # Still held: the generation's evidence counts it.
    assert lexical.index.evidence(lexical.generation_id).document_count == 3
