"""`VectorMemo`: the re-score's stored vectors by (generation, document, revision)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from query.adapters.qdrant_edge_vectors import VectorMemo

VECTOR = bytes(16)  # four float32 zeros: the memo keeps bytes as given


def test_an_entry_answers_only_the_revision_it_holds() -> None:
    memo = VectorMemo()
    memo.put("g1", "d1", 3, VECTOR)
    assert memo.get_many("g1", [("d1", 3)]) == (["d1"], [VECTOR], [])
    assert memo.get_many("g1", [("d1", 2), ("d1", 4)]) == ([], [], ["d1", "d1"])
    assert memo.get_many("g2", [("d1", 3)]) == ([], [], ["d1"])
    memo.put("g1", "d1", 4, b"\x01" * 16)
    assert memo.get_many("g1", [("d1", 3), ("d1", 4)]) == (["d1"], [b"\x01" * 16], ["d1"])
    assert len(memo) == 1


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 3)), max_size=200))
def test_the_bound_holds_and_the_least_recently_used_go_first(puts: list[tuple[int, int]]) -> None:
    """Each entry counts its bytes plus 64: a bound of 4 entries of 16 bytes keeps the
    last four documents touched, whatever the order of puts and gets."""
    memo = VectorMemo(max_bytes=4 * (64 + 16))
    recent: list[str] = []
    for number, revision in puts:
        document = f"d{number}"
        memo.put("g", document, revision, VECTOR)
        if document in recent:
            recent.remove(document)
        recent.append(document)
        recent = recent[-4:]
        assert len(memo) == len(recent)
    for document in recent:
        # Any revision: held documents answer `missing` for a revision they do not hold.
        held, _vectors, missing = memo.get_many("g", [(document, -1)])
        assert missing == [document] and held == []
    assert len(memo) == len(recent)


def test_a_vector_larger_than_the_bound_is_not_kept() -> None:
    memo = VectorMemo(max_bytes=100)
    memo.put("g", "d", 1, bytes(64))
    assert len(memo) == 0
