"""The four engines agree on filter semantics, on random corpora and random filters.

Each lexical engine (tantivy, OpenSearch) and each vector engine (qdrant-edge,
qdrant-client) indexes the same seeded random corpus; every random `SearchFilter` must
select exactly the same document set in all of them, and that set must be the one the
contract's definition (`_reference`, written from `SearchFilter`'s docstring) selects.
The lexical engines are asked in filter-only mode (blank query), the vector engines with
a fixed query vector and a limit above the corpus size, so that every filtered document
comes back.

Values are chosen to catch the classic drift between engines: case (`Hall` vs `hall`),
umlauts, spaces and separators in facet values, a facet value that equals another
facet's name, timestamps a microsecond apart, time zones other than UTC, and empty
lists (which match nothing).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from contracts.index import IndexDocument, SearchFilter
from tests.conformance import test_lexical_index as lexical_suite
from tests.conformance import test_vector_index as vector_suite
from tests.conformance.corpus import DIM, doc, unit

SEED = 20261129
CORPUS_SIZE = 150
CASES = 80

GALAXIES = ("default", "other", "Default", "gälaxy")
STATUSES = ("active", "archived", "candidate", "Active")
LABELS = ("family", "guests", "private", "Family", "kids room")
FACET_VALUES = {
    "room": ("hall", "Hall", "küche", "kitchen", "living room", "a=b", "lang"),
    "lang": ("de", "en", "DE"),
    "tier": ("1", "2", "10"),
}
# Rings that share prefixes without being ancestors ("ai" / "ai2", "ai/x" / "ai/xy"),
# a deep path, upper case, an umlaut and a space, plus records without a ring.
RINGS = ("", "ai", "ai2", "ai/x", "ai/xy", "ai/x/deep/er", "db", "DB", "jä pan/tokyo")
RING_QUERIES = ("ai", "ai/x", "ai/x/deep", "db", "jä pan", "jä pan/tokyo", "ai/missing", "a")
BASE_TIME = datetime(2026, 3, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def _instant(rng: random.Random) -> datetime:
    """Instants clustered around a few seconds, some a microsecond apart."""
    return BASE_TIME + timedelta(
        days=rng.choice((0, 0, 1, 30)),
        seconds=rng.choice((0, 1, 59)),
        microseconds=rng.choice((0, 1, 2, 999_999)),
    )


def _random_corpus(rng: random.Random) -> list[IndexDocument]:
    docs = []
    for n in range(CORPUS_SIZE):
        facets = {
            name: tuple(rng.sample(values, rng.randint(1, 2)))
            for name, values in FACET_VALUES.items()
            if rng.random() < 0.6
        }
        docs.append(
            doc(
                f"doc-{n:03d}",
                revision=rng.randint(1, 3),
                title=f"item {n}",
                body="filter agreement corpus",
                galaxy=rng.choice(GALAXIES),
                status=rng.choice(STATUSES),
                visibility=tuple(rng.sample(LABELS, rng.randint(0, 2))),
                facets=facets,
                updated_at=_instant(rng),
                vector=unit(1.0, rng.random(), rng.random(), rng.random()),
                ring=rng.choice(RINGS),
            )
        )
    return docs


def _maybe_values(rng: random.Random, pool: tuple[str, ...]) -> tuple[str, ...] | None:
    roll = rng.random()
    if roll < 0.5:
        return None
    if roll < 0.55:
        return ()
    return tuple(rng.sample((*pool, "unknown"), rng.randint(1, 3)))


def _random_filter(rng: random.Random, ids: list[str]) -> SearchFilter:
    after = before = None
    if rng.random() < 0.4:
        after = _instant(rng) + rng.choice((-MICROSECOND, timedelta(0), MICROSECOND))
        if rng.random() < 0.3:
            after = after.astimezone(timezone(timedelta(hours=rng.choice((-5, 2)))))
    if rng.random() < 0.4:
        before = _instant(rng) + rng.choice((-MICROSECOND, timedelta(0), MICROSECOND))
    facets: dict[str, tuple[str, ...]] = {}
    for name, values in FACET_VALUES.items():
        if rng.random() < 0.3:
            facets[name] = tuple(rng.sample(values, rng.randint(1, 2)))
    if rng.random() < 0.03:
        facets["room"] = ()
    document_ids = None
    if rng.random() < 0.15:
        document_ids = (*rng.sample(ids, rng.randint(0, 30)), "doc-missing")
    return SearchFilter(
        rings=_maybe_values(rng, RING_QUERIES) if rng.random() < 0.4 else None,
        ring_trees=_maybe_values(rng, RING_QUERIES) if rng.random() < 0.6 else None,
        galaxy=rng.choice(GALAXIES) if rng.random() < 0.4 else None,
        status=_maybe_values(rng, STATUSES),
        visibility=_maybe_values(rng, LABELS),
        updated_after=after,
        updated_before=before,
        facets=facets,
        document_ids=document_ids,
    )


def _reference(docs: list[IndexDocument], f: SearchFilter) -> set[str]:
    """The contract's definition of a filter, evaluated in Python."""

    def keeps(d: IndexDocument) -> bool:
        if f.galaxy is not None and d.galaxy != f.galaxy:
            return False
        if f.status is not None and d.status not in f.status:
            return False
        if f.visibility is not None and not set(d.visibility) & set(f.visibility):
            return False
        if f.updated_after is not None and d.updated_at < f.updated_after:
            return False
        if f.updated_before is not None and d.updated_at > f.updated_before:
            return False
        for name, values in f.facets.items():
            if not set(d.facets.get(name, ())) & set(values):
                return False
        if f.rings is not None and d.ring not in f.rings:
            return False
        if f.ring_trees is not None and not any(
            d.ring == tree or d.ring.startswith(tree + "/") for tree in f.ring_trees
        ):
            return False
        return f.document_ids is None or d.document_id in f.document_ids

    return {d.document_id for d in docs if keeps(d)}


@dataclass
class Selectors:
    """Each engine's way to list the documents a filter selects."""

    lexical: dict[str, lexical_suite.Lexical]
    vectors: dict[str, vector_suite.Harness]

    def selected(self, f: SearchFilter) -> dict[str, set[str]]:
        limit = CORPUS_SIZE + 10
        out = {name: set(h.ids("", f, limit=limit)) for name, h in self.lexical.items()}
        for name, harness in self.vectors.items():
            out[name] = set(harness.ids(unit(1, 0, 0, 0), f, limit=limit))
        return out


@pytest.fixture(scope="module")
def corpus() -> list[IndexDocument]:
    return _random_corpus(random.Random(SEED))


@pytest.fixture
def engines(tmp_path: Path, corpus: list[IndexDocument]) -> Iterator[Selectors]:
    """All four engines, each with the corpus applied (in two batches, out of order)."""
    lexical: dict[str, lexical_suite.Lexical] = {}
    vectors: dict[str, vector_suite.Harness] = {}
    half = len(corpus) // 2
    try:
        for name, factory in lexical_suite.ENGINES.items():
            harness = lexical_suite.Lexical(
                factory, tmp_path / name, f"filters-{uuid.uuid4().hex[:12]}"
            )
            harness.index.create(harness.generation_id)
            lexical[name] = harness
            harness.apply(corpus[half:])
            harness.apply(corpus[:half])
        for name, vector_factory in vector_suite.ENGINES.items():
            vector_harness = vector_suite.Harness(vector_factory, tmp_path / name)
            vector_harness.index.create(vector_harness.generation_id, DIM)
            vectors[name] = vector_harness
            vector_harness.apply(corpus[half:])
            vector_harness.apply(corpus[:half])
        yield Selectors(lexical=lexical, vectors=vectors)
    finally:
        for harness in lexical.values():
            harness.index.drop(harness.generation_id)
            harness.pair.close()
        for vector_harness in vectors.values():
            vector_harness.index.drop(vector_harness.generation_id)
            vector_harness.index.close()


@pytest.mark.servers
def test_every_engine_selects_what_the_contract_defines(
    engines: Selectors, corpus: list[IndexDocument]
) -> None:
    rng = random.Random(SEED + 1)
    ids = [d.document_id for d in corpus]
    sizes = []
    ring_cases = 0
    for case in range(CASES):
        f = _random_filter(rng, ids)
        expected = _reference(corpus, f)
        sizes.append(len(expected))
        ring_cases += bool((f.rings or f.ring_trees) and expected)
        for engine, selected in engines.selected(f).items():
            missing = sorted(expected - selected)[:10]
            extra = sorted(selected - expected)[:10]
            assert selected == expected, (
                f"case {case}: {engine} disagrees with the contract on {f!r}: "
                f"missing {missing}, extra {extra}"
            )
    # The random cases must exercise both empty and non-trivial selections, or the test
    # would prove little.
    assert min(sizes) == 0
    assert sum(1 for n in sizes if 0 < n < CORPUS_SIZE) >= CASES // 3
    assert ring_cases >= 5


def test_reference_follows_the_documented_semantics() -> None:
    """The reference itself, on hand-checked cases (so a wrong reference cannot make
    every engine look wrong or right together)."""
    at = BASE_TIME
    a = doc("a", galaxy="g", status="active", visibility=("family",), updated_at=at)
    b = doc(
        "b",
        galaxy="g",
        status="archived",
        visibility=("guests", "family"),
        facets={"room": ("hall",)},
        updated_at=at + MICROSECOND,
    )
    docs = [a, b]
    assert _reference(docs, SearchFilter()) == {"a", "b"}
    assert _reference(docs, SearchFilter(status=())) == set()
    assert _reference(docs, SearchFilter(visibility=("guests", "x"))) == {"b"}
    assert _reference(docs, SearchFilter(updated_after=at + MICROSECOND)) == {"b"}
    assert _reference(docs, SearchFilter(updated_before=at)) == {"a"}
    assert _reference(docs, SearchFilter(facets={"room": ("hall",)})) == {"b"}
    assert _reference(docs, SearchFilter(facets={"room": ("Hall",)})) == set()
    assert _reference(docs, SearchFilter(document_ids=("a", "zz"))) == {"a"}
    c = doc("c", ring="ai/x")
    d = doc("d", ring="ai/xy")
    e = doc("e", ring="ai")
    rings = [c, d, e, a]
    assert _reference(rings, SearchFilter(ring_trees=("ai/x",))) == {"c"}
    assert _reference(rings, SearchFilter(ring_trees=("ai",))) == {"c", "d", "e"}
    assert _reference(rings, SearchFilter(rings=("ai",))) == {"e"}
    assert _reference(rings, SearchFilter(rings=("ai", "ai/xy"))) == {"d", "e"}
    assert _reference(rings, SearchFilter(ring_trees=())) == set()
