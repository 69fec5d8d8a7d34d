"""Conformance of the ring statistics: what the projector's `RingStatistics` writes is
what the query side's reader returns, for every adapter pair: `SqliteRingStatistics` /
`SqliteRingStats` (the registry's SQLite database) and `PostgresRingStatistics` /
`PostgresRingStats` (server mode with `ORRERY_DATABASE_URL`; marked `servers`).

Checked against sums computed here from the documents themselves: counts, vector sums,
unit-vector sums after upserts, moves between rings and galaxies, changed vectors,
deletes, replays (idempotent on `(document_id, revision)`), stale revisions and drops.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from contracts.index import IndexDocument
from projector.adapters.sqlite_ring_stats import SqliteRingStatistics
from projector.ports import RingStatistics
from query.adapters.sqlite_ring_stats import SqliteRingStats
from query.ports import RingStatistics as RingReader
from tests.conformance.corpus import doc

DIM = 4
GEN = "g-ring"


@dataclass
class Pair:
    writer: RingStatistics
    reader: RingReader
    close_reader: Callable[[], None] | None = None
    # Another writer on the same tables (a second process of the deployment).
    another: Callable[[], RingStatistics] | None = None


def _sqlite(request: pytest.FixtureRequest, path: Path) -> Pair:
    db = path / "orrery.sqlite"
    return Pair(
        SqliteRingStatistics(db), SqliteRingStats(db), another=lambda: SqliteRingStatistics(db)
    )


def _postgres(request: pytest.FixtureRequest, path: Path) -> Pair:
    from ingest.adapters.postgres_db import migrate
    from projector.adapters.postgres_migrations import COMPONENT, migrations
    from projector.adapters.postgres_ring_stats import PostgresRingStatistics
    from query.adapters.postgres_ring_stats import PostgresRingStats
    from query.adapters.postgres_routing import open_reads

    url: str = request.getfixturevalue("postgres_url")
    migrate(url, migrations(), component=COMPONENT)
    reads = open_reads(url, pool_size=2)
    return Pair(
        PostgresRingStatistics(url),
        PostgresRingStats(reads),
        reads.close,
        another=lambda: PostgresRingStatistics(url),
    )


ADAPTERS: dict[str, Callable[[pytest.FixtureRequest, Path], Pair]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(ADAPTERS)])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    made = ADAPTERS[request.param](request, tmp_path)
    yield made
    made.writer.close()
    if made.close_reader is not None:
        made.close_reader()


def d(
    doc_id: str, revision: int, ring: str, vector: tuple[float, ...], galaxy: str = "g"
) -> IndexDocument:
    return doc(doc_id, revision, ring=ring, galaxy=galaxy, vector=vector)


def expected(
    live: dict[str, IndexDocument], galaxy: str
) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
    out: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
    for document in live.values():
        if document.galaxy != galaxy:
            continue
        v = np.asarray(document.vector, dtype=np.float32).astype(np.float64)
        n, s, u = out.get(document.ring, (0, np.zeros(DIM), np.zeros(DIM)))
        out[document.ring] = (n + 1, s + v, u + v / np.linalg.norm(v))
    return out


def read(
    pair: Pair, galaxy: str, generation: str = GEN
) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
    return {
        s.ring: (s.documents, s.vector_sum, s.unit_sum)
        for s in pair.reader.rings(generation, galaxy)
    }


def assert_matches(pair: Pair, live: dict[str, IndexDocument], galaxy: str = "g") -> None:
    want = expected(live, galaxy)
    got = read(pair, galaxy)
    assert sorted(got) == sorted(want)
    for ring, (n, s, u) in want.items():
        assert got[ring][0] == n
        np.testing.assert_allclose(got[ring][1], s, atol=1e-9)
        np.testing.assert_allclose(got[ring][2], u, atol=1e-9)


def test_upserts_moves_and_deletes_keep_the_sums(pair: Pair) -> None:
    a = d("a", 1, "ai", (1.0, 0.0, 0.0, 0.0))
    b = d("b", 1, "ai", (3.0, 4.0, 0.0, 0.0))
    c = d("c", 1, "db", (0.0, 0.0, 2.0, 0.0))
    pair.writer.apply(GEN, [a, b, c], [])
    live = {"a": a, "b": b, "c": c}
    assert_matches(pair, live)
    # b moves to db with a new vector; a is deleted; the ring ai disappears.
    b2 = d("b", 2, "db", (0.0, 1.0, 1.0, 0.0))
    pair.writer.apply(GEN, [b2], [("a", 2)])
    live = {"b": b2, "c": c}
    assert_matches(pair, live)
    assert "ai" not in read(pair, "g")


def test_replays_and_stale_revisions_change_nothing(pair: Pair) -> None:
    a1 = d("a", 1, "ai", (1.0, 0.0, 0.0, 0.0))
    a3 = d("a", 3, "db", (0.0, 1.0, 0.0, 0.0))
    pair.writer.apply(GEN, [a3], [])
    pair.writer.apply(GEN, [a3], [])  # replay
    pair.writer.apply(GEN, [a1], [])  # older revision
    assert_matches(pair, {"a": a3})
    pair.writer.apply(GEN, [], [("a", 2)])  # a delete older than the present revision
    assert_matches(pair, {"a": a3})
    pair.writer.apply(GEN, [], [("a", 3)])
    pair.writer.apply(GEN, [a1], [])  # an upsert older than the tombstone stays out
    assert read(pair, "g") == {}
    a4 = d("a", 4, "ai", (0.0, 0.0, 0.0, 5.0))
    pair.writer.apply(GEN, [a4], [])
    assert_matches(pair, {"a": a4})


def test_one_call_keeps_the_newest_change_per_document(pair: Pair) -> None:
    a1 = d("a", 1, "ai", (1.0, 0.0, 0.0, 0.0))
    a2 = d("a", 2, "db", (0.0, 1.0, 0.0, 0.0))
    pair.writer.apply(GEN, [a2, a1], [])
    assert_matches(pair, {"a": a2})
    pair.writer.apply(GEN, [d("a", 3, "ai", (1.0, 1.0, 0.0, 0.0))], [("a", 3)])
    assert read(pair, "g") == {}


def test_galaxies_and_generations_are_apart(pair: Pair) -> None:
    x = d("x", 1, "ai", (1.0, 0.0, 0.0, 0.0), galaxy="g")
    y = d("y", 1, "ai", (0.0, 1.0, 0.0, 0.0), galaxy="h")
    pair.writer.apply(GEN, [x, y], [])
    pair.writer.apply("other", [x], [])
    assert_matches(pair, {"x": x}, "g")
    assert_matches(pair, {"y": y}, "h")
    # y moves to galaxy g (a write there is another document in Orrery, but the
    # statistics follow whatever the engine was given).
    y2 = d("y", 2, "ai", (0.0, 1.0, 0.0, 0.0), galaxy="g")
    pair.writer.apply(GEN, [y2], [])
    assert_matches(pair, {"x": x, "y": y2}, "g")
    assert read(pair, "h") == {}
    pair.writer.drop(GEN)
    assert read(pair, "g") == {}
    assert read(pair, "g", "other")["ai"][0] == 1


def test_random_histories_match_the_documents(pair: Pair) -> None:
    rng = random.Random(20261201)
    live: dict[str, IndexDocument] = {}
    revisions: dict[str, int] = {}
    for _ in range(40):
        upserts: list[IndexDocument] = []
        deletes: list[tuple[str, int]] = []
        for doc_id in rng.sample([f"d{i}" for i in range(12)], 5):
            revisions[doc_id] = revisions.get(doc_id, 0) + 1
            if rng.random() < 0.25:
                deletes.append((doc_id, revisions[doc_id]))
                live.pop(doc_id, None)
            else:
                vector = tuple(rng.uniform(-1, 1) for _ in range(DIM))
                document = d(doc_id, revisions[doc_id], rng.choice(["a", "a/b", "c", ""]), vector)
                upserts.append(document)
                live[doc_id] = document
        pair.writer.apply(GEN, upserts, deletes)
        if rng.random() < 0.3:  # a replay of the same batch
            pair.writer.apply(GEN, upserts, deletes)
    assert_matches(pair, live)


def test_concurrent_writers_of_one_generation_lose_no_contribution(pair: Pair) -> None:
    """Two writers (the projector and a hand-over replay, say) adding documents to the
    same rings at once: each ring's read-modify-write is serialized, no sum is lost."""
    assert pair.another is not None
    second = pair.another()
    live: dict[str, IndexDocument] = {}
    batches: dict[int, list[list[IndexDocument]]] = {0: [], 1: []}
    rng = random.Random(7)
    for writer in (0, 1):
        for batch in range(15):
            docs = [
                d(
                    f"w{writer}-{batch}-{i}",
                    1,
                    rng.choice(["a", "b"]),
                    tuple(rng.uniform(0.1, 1) for _ in range(DIM)),
                )
                for i in range(4)
            ]
            batches[writer].append(docs)
            live.update({x.document_id: x for x in docs})
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(writer: RingStatistics, mine: list[list[IndexDocument]]) -> None:
        try:
            barrier.wait()
            for docs in mine:
                writer.apply(GEN, docs, [])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(pair.writer, batches[0])),
        threading.Thread(target=run, args=(second, batches[1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    second.close()
    assert errors == []
    assert_matches(pair, live)


def _finite(pair: Pair) -> bool:
    return all(
        np.isfinite(s.vector_sum).all() and np.isfinite(s.unit_sum).all()
        for s in pair.reader.rings(GEN, "g")
    )


def test_a_vector_non_finite_in_float32_never_makes_the_sums_non_finite(pair: Pair) -> None:
    """Issue 22: a 1e39 component is infinite as float32. Such a vector counts in no
    sum — neither when it is written nor when it leaves (a delete, a move, a new
    vector) — so the ring's statistics stay those of its other members."""
    a = d("a", 1, "ai", (1.0, 0.0, 0.0, 0.0))
    b = d("b", 1, "ai", (0.0, 1.0, 0.0, 0.0))
    bad = d("bad", 1, "ai", (1e39, 1.0, 0.0, 0.0))
    pair.writer.apply(GEN, [a, b, bad], [])
    assert _finite(pair)
    assert_matches(pair, {"a": a, "b": b})
    pair.writer.apply(GEN, [], [("bad", 2)])
    assert _finite(pair)
    assert_matches(pair, {"a": a, "b": b})
    # Moved into another ring with a poison vector, then given a finite one.
    moved = d("a", 2, "db", (float("inf"), 0.0, 0.0, 0.0))
    pair.writer.apply(GEN, [moved], [])
    assert _finite(pair)
    assert_matches(pair, {"b": b})
    fixed = d("a", 3, "db", (0.0, 0.0, 1.0, 0.0))
    pair.writer.apply(GEN, [fixed], [])
    assert _finite(pair)
    assert_matches(pair, {"b": b, "a": fixed})


def test_a_failed_apply_writes_nothing_and_the_next_one_applies(pair: Pair) -> None:
    """An `apply` that raises inside its transaction leaves no trace, and the same writer
    (its connection: in PostgreSQL the first transaction also creates the session's
    temporary table of member rows, which a rollback takes with it) applies the next
    batch whole."""
    a = d("a", 1, "ai", (1.0, 0.0, 0.0, 0.0))
    for _ in range(2):  # twice: the rolled-back state must not stick to the writer
        with pytest.raises(ValueError, match="no vector"):
            pair.writer.apply(
                GEN, [a, d("v", 1, "ai", (0.0,)).model_copy(update={"vector": None})], []
            )
        assert read(pair, "g") == {}
    b = d("b", 1, "db", (0.0, 2.0, 0.0, 0.0))
    pair.writer.apply(GEN, [a, b], [])
    pair.writer.apply(GEN, [d("a", 2, "db", (0.0, 0.0, 3.0, 0.0))], [])
    assert_matches(pair, {"a": d("a", 2, "db", (0.0, 0.0, 3.0, 0.0)), "b": b})
