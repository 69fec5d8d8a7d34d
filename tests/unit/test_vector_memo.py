"""`VectorMemo`: the re-score's stored vectors by (tenant, generation, document, revision),
as rows of one matrix per tenant and generation, dropped a generation at a time."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given
from hypothesis import strategies as st

from query.adapters.qdrant_edge_vectors import VectorMemo

DIMENSION = 4
ROW = 64 + 4 * DIMENSION  # what a row of DIMENSION float32 counts against a tenant's bound


def vector(*key: object) -> npt.NDArray[np.float32]:
    """A vector that tells which (generation, document, revision) it was put for."""
    seed = abs(hash(key)) % (2**32)
    return np.random.default_rng(seed).standard_normal(DIMENSION).astype(np.float32)


def rows(block: npt.NDArray[np.float32] | None) -> list[list[float]]:
    return [] if block is None else block.tolist()


def test_a_row_answers_only_the_revision_it_holds() -> None:
    memo = VectorMemo()
    memo.put("t", "g1", "d1", 3, vector("d1", 3))
    held, block, missing = memo.get_many("t", "g1", ["d1"], {"d1": 3})
    assert (held, rows(block), missing) == (["d1"], [vector("d1", 3).tolist()], [])
    assert memo.get_many("t", "g1", ["d1"], {"d1": 2}) == ([], None, ["d1"])
    assert memo.get_many("t", "g1", ["d1"], {"d1": 4}) == ([], None, ["d1"])
    assert memo.get_many("t", "g1", ["d1"], {}) == ([], None, ["d1"])
    assert memo.get_many("t", "g2", ["d1"], {"d1": 3}) == ([], None, ["d1"])
    memo.put("t", "g1", "d1", 4, vector("d1", 4))
    assert memo.get_many("t", "g1", ["d1"], {"d1": 3}) == ([], None, ["d1"])
    held, block, missing = memo.get_many("t", "g1", ["d1"], {"d1": 4})
    assert (held, rows(block), missing) == (["d1"], [vector("d1", 4).tolist()], [])
    assert len(memo) == 1
    # The earlier revision's row still counts until its generation is dropped.
    assert memo.held_bytes("t") == 2 * ROW


def test_missing_documents_keep_the_order_asked() -> None:
    memo = VectorMemo()
    memo.put("t", "g", "b", 1, vector("b", 1))
    memo.put("t", "g", "e", 1, vector("e", 1))
    asked = ["c", "b", "a", "e", "d"]
    revisions = {"c": 1, "b": 1, "a": 1, "e": 2, "d": 1}
    assert memo.get_many("t", "g", asked, revisions)[0::2] == (["b"], ["c", "a", "e", "d"])


def test_a_row_answers_only_the_tenant_that_put_it() -> None:
    memo = VectorMemo()
    memo.put("a", "g", "d", 1, vector("d", 1))
    assert memo.get_many("b", "g", ["d"], {"d": 1}) == ([], None, ["d"])
    assert memo.get_many("a", "g", ["d"], {"d": 1})[0] == ["d"]


def test_a_generation_that_fills_the_bound_alone_is_dropped_whole() -> None:
    """Four rows fit: the fifth document of the generation starts it again from empty."""
    memo = VectorMemo(max_bytes=4 * ROW)
    for number in range(5):
        memo.put("t", "g", f"d{number}", 1, vector(number))
    asked = [f"d{number}" for number in range(5)]
    assert memo.get_many("t", "g", asked, dict.fromkeys(asked, 1))[0::2] == (
        ["d4"],
        ["d0", "d1", "d2", "d3"],
    )
    assert memo.held_bytes("t") == ROW


def test_room_is_made_from_the_least_recently_used_other_generation_whole() -> None:
    memo = VectorMemo(max_bytes=4 * ROW)
    memo.put("t", "g1", "a", 1, vector("a"))
    memo.put("t", "g1", "b", 1, vector("b"))
    memo.put("t", "g2", "c", 1, vector("c"))
    memo.get_many("t", "g1", ["a"], {"a": 1})  # g1 is now more recent than g2
    memo.put("t", "g3", "d", 1, vector("d"))
    memo.put("t", "g3", "e", 1, vector("e"))  # 5 rows: g2 (one row) goes, g1 stays whole
    assert memo.get_many("t", "g2", ["c"], {"c": 1})[0] == []
    assert memo.get_many("t", "g1", ["a", "b"], {"a": 1, "b": 1})[0] == ["a", "b"]
    memo.put("t", "g3", "f", 1, vector("f"))  # 5 rows again: g1 goes whole (both rows)
    assert memo.get_many("t", "g1", ["a", "b"], {"a": 1, "b": 1})[0] == []
    assert memo.get_many("t", "g3", ["d", "e", "f"], dict.fromkeys("def", 1))[0] == ["d", "e", "f"]
    assert memo.held_bytes("t") == 3 * ROW


# One step of a tenant: a put (generation, document, revision) or a lookup of one document.
_STEP = st.tuples(
    st.sampled_from(["put", "get"]),
    st.sampled_from(["g1", "g2", "h"]),
    st.integers(0, 6),
    st.integers(1, 3),
)


@given(bound=st.integers(0, 9), steps=st.lists(_STEP, max_size=200))
def test_the_bound_holds_and_generations_go_whole(
    bound: int, steps: list[tuple[str, str, int, int]]
) -> None:
    """Whatever the puts and lookups: a tenant's rows never count past its bound; every
    row answered is the very vector put for that generation, document and revision; the
    last put is held (when a row fits the bound at all); and a put drops rows only
    generation by generation: a generation that loses any row loses all of them (the
    document just put and rows superseded by its new revision aside)."""
    memo = VectorMemo(max_bytes=bound * ROW + bound)  # a few bytes past: rows still count
    documents = [f"d{number}" for number in range(7)]
    known: dict[tuple[str, str], int] = {}  # the latest revision put, by (generation, doc)

    def latest(generation: str) -> dict[str, int]:
        return {d: r for (g, d), r in known.items() if g == generation}

    for kind, generation, number, revision in steps:
        document = f"d{number}"
        before = {g: set(memo.get_many("t", g, documents, latest(g))[0]) for g in ("g1", "g2", "h")}
        if kind == "get":
            memo.get_many("t", generation, [document], {document: revision})
            continue
        memo.put("t", generation, document, revision, vector(generation, document, revision))
        known[(generation, document)] = revision
        assert memo.held_bytes("t") <= memo.max_bytes
        held, block, _ = memo.get_many("t", generation, [document], {document: revision})
        assert held == ([document] if bound else [])
        for g in ("g1", "g2", "h"):
            held, block, _ = memo.get_many("t", g, documents, latest(g))
            assert rows(block) == [vector(g, d, known[(g, d)]).tolist() for d in held]
            kept = before[g] - ({document} if g == generation else set())
            now = set(held) - ({document} if g == generation else set())
            assert now in (kept, set()), (g, kept, now)


# One step of another tenant: a put (generation, document, revision) or a lookup.
_OTHER = st.tuples(
    st.sampled_from(["put", "get"]),
    st.sampled_from(["g1", "g2", "h"]),
    st.integers(0, 40),
    st.integers(1, 3),
)


@given(
    held=st.lists(st.integers(0, 40), min_size=1, max_size=4, unique=True),
    steps=st.lists(st.tuples(st.sampled_from(["b", "c", "d"]), _OTHER), max_size=300),
)
def test_another_tenants_fills_never_evict_a_tenants_entries(
    held: list[int], steps: list[tuple[str, tuple[str, str, int, int]]]
) -> None:
    """Tenant A fills its bound (up to four rows, in the same generations and documents
    the others use); whatever three other tenants then put and look up, in any order and
    up to their own bounds, every row of A still answers at its revision."""
    memo = VectorMemo(max_bytes=4 * ROW, max_tenants=4)
    for number in held:
        memo.put("a", "g1", f"d{number}", 7, vector(number))
    for tenant, (kind, generation, number, revision) in steps:
        if kind == "put":
            memo.put(tenant, generation, f"d{number}", revision, vector(tenant, number))
        else:
            memo.get_many(tenant, generation, [f"d{number}"], {f"d{number}": revision})
    documents = [f"d{number}" for number in held]
    found, block, missing = memo.get_many("a", "g1", documents, dict.fromkeys(documents, 7))
    assert (found, rows(block), missing) == (
        documents,
        [vector(number).tolist() for number in held],
        [],
    )


def test_past_max_tenants_the_least_recently_used_tenant_goes_whole() -> None:
    memo = VectorMemo(max_bytes=4 * ROW, max_tenants=2)
    memo.put("a", "g", "d", 1, vector("d"))
    memo.put("b", "g", "d", 1, vector("d"))
    memo.get_many("a", "g", ["d"], {"d": 1})  # a is now more recent than b
    memo.put("c", "g", "d", 1, vector("d"))
    assert memo.get_many("a", "g", ["d"], {"d": 1})[0] == ["d"]
    assert memo.get_many("b", "g", ["d"], {"d": 1})[0] == []
    assert len(memo) == 2


def test_a_row_larger_than_the_bound_is_not_kept() -> None:
    memo = VectorMemo(max_bytes=ROW - 1)
    memo.put("t", "g", "d", 1, vector("d"))
    assert len(memo) == 0 and memo.held_bytes("t") == 0


def test_a_vector_of_another_dimension_than_the_generations_rows_is_not_kept() -> None:
    memo = VectorMemo()
    memo.put("t", "g", "a", 1, vector("a"))
    memo.put("t", "g", "b", 1, np.zeros(DIMENSION + 1, dtype=np.float32))
    assert memo.get_many("t", "g", ["a", "b"], {"a": 1, "b": 1})[0::2] == (["a"], ["b"])
