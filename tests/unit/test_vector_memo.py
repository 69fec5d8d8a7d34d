"""`VectorMemo`: the re-score's stored vectors by (tenant, generation, document, revision)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from query.adapters.qdrant_edge_vectors import VectorMemo

VECTOR = bytes(16)  # four float32 zeros: the memo keeps bytes as given
ENTRY = 64 + 16  # what an entry of VECTOR counts against a tenant's bound


def test_an_entry_answers_only_the_revision_it_holds() -> None:
    memo = VectorMemo()
    memo.put("t", "g1", "d1", 3, VECTOR)
    assert memo.get_many("t", "g1", [("d1", 3)]) == (["d1"], [VECTOR], [])
    assert memo.get_many("t", "g1", [("d1", 2), ("d1", 4)]) == ([], [], ["d1", "d1"])
    assert memo.get_many("t", "g2", [("d1", 3)]) == ([], [], ["d1"])
    memo.put("t", "g1", "d1", 4, b"\x01" * 16)
    assert memo.get_many("t", "g1", [("d1", 3), ("d1", 4)]) == (["d1"], [b"\x01" * 16], ["d1"])
    assert len(memo) == 1


def test_an_entry_answers_only_the_tenant_that_put_it() -> None:
    memo = VectorMemo()
    memo.put("a", "g", "d", 1, VECTOR)
    assert memo.get_many("b", "g", [("d", 1)]) == ([], [], ["d"])
    assert memo.get_many("a", "g", [("d", 1)]) == (["d"], [VECTOR], [])


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 3)), max_size=200))
def test_the_bound_holds_and_the_least_recently_used_go_first(puts: list[tuple[int, int]]) -> None:
    """Each entry counts its bytes plus 64: a bound of 4 entries of 16 bytes keeps the
    last four documents touched, whatever the order of puts and gets."""
    memo = VectorMemo(max_bytes=4 * ENTRY)
    recent: list[str] = []
    for number, revision in puts:
        document = f"d{number}"
        memo.put("t", "g", document, revision, VECTOR)
        if document in recent:
            recent.remove(document)
        recent.append(document)
        recent = recent[-4:]
        assert len(memo) == len(recent)
    for document in recent:
        # Any revision: held documents answer `missing` for a revision they do not hold.
        held, _vectors, missing = memo.get_many("t", "g", [(document, -1)])
        assert missing == [document] and held == []
    assert len(memo) == len(recent)


# One step of another tenant: a put (generation, document, revision, vector length) or a
# lookup of a few documents of a generation.
_OTHER = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(["g1", "g2", "h"]),
        st.integers(0, 40),
        st.integers(1, 3),
        st.sampled_from([0, 16, 200]),
    ),
    st.tuples(
        st.just("get"),
        st.sampled_from(["g1", "g2", "h"]),
        st.integers(0, 40),
        st.integers(1, 3),
        st.just(0),
    ),
)


@given(
    held=st.lists(st.integers(0, 40), min_size=1, max_size=4, unique=True),
    steps=st.lists(st.tuples(st.sampled_from(["b", "c", "d"]), _OTHER), max_size=300),
)
def test_another_tenants_fills_never_evict_a_tenants_entries(
    held: list[int], steps: list[tuple[str, tuple[str, str, int, int, int]]]
) -> None:
    """Tenant A fills its bound (up to four entries, in the same generations and
    documents the others use); whatever three other tenants then put and look up, in any
    order and up to their own bounds, every entry of A still answers at its revision."""
    memo = VectorMemo(max_bytes=4 * ENTRY, max_tenants=4)
    for number in held:
        memo.put("a", "g1", f"d{number}", 7, VECTOR)
    for tenant, (kind, generation, number, revision, length) in steps:
        if kind == "put":
            memo.put(tenant, generation, f"d{number}", revision, bytes(length))
        else:
            memo.get_many(tenant, generation, [(f"d{number}", revision)])
    documents = [f"d{number}" for number in held]
    assert memo.get_many("a", "g1", [(d, 7) for d in documents]) == (
        documents,
        [VECTOR] * len(documents),
        [],
    )


def test_past_max_tenants_the_least_recently_used_tenant_goes_whole() -> None:
    memo = VectorMemo(max_bytes=4 * ENTRY, max_tenants=2)
    memo.put("a", "g", "d", 1, VECTOR)
    memo.put("b", "g", "d", 1, VECTOR)
    memo.get_many("a", "g", [("d", 1)])  # a is now more recent than b
    memo.put("c", "g", "d", 1, VECTOR)
    assert memo.get_many("a", "g", [("d", 1)])[0] == ["d"]
    assert memo.get_many("b", "g", [("d", 1)])[0] == []
    assert len(memo) == 2


def test_a_vector_larger_than_the_bound_is_not_kept() -> None:
    memo = VectorMemo(max_bytes=100)
    memo.put("t", "g", "d", 1, bytes(64))
    assert len(memo) == 0
