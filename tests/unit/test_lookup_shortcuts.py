"""The one-shot's shortcuts (session 25) answer exactly what the generic code answered:
`best_first` keeping an engine's order when its scores strictly decrease, and
`SearchFilter.with_ids` built without pydantic's copy."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from contracts.index import Candidate, SearchFilter
from contracts.vector_payload import best_first

_AT = datetime(2026, 1, 1, tzinfo=UTC)

_scores = st.one_of(
    st.floats(min_value=-1.0, max_value=1.0),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, -1.0]),
    st.just(float("nan")),
)
_candidates = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e", "f"]), _scores),
    max_size=12,
).map(lambda pairs: [Candidate(d, 1, s, _AT, "active") for d, s in pairs])


def _sorted(candidates: list[Candidate], limit: int) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.score, c.document_id))[: max(0, limit)]


def _same(a: list[Candidate], b: list[Candidate]) -> bool:
    # NaN != NaN: compare each score's representation (-0.0 and 0.0 differ there too).
    def key(candidates: list[Candidate]) -> list[tuple[str, str]]:
        return [(c.document_id, repr(c.score)) for c in candidates]

    return key(a) == key(b)


@given(_candidates, st.integers(min_value=-1, max_value=14))
def test_best_first_is_the_sort(candidates: list[Candidate], limit: int) -> None:
    assert _same(best_first(candidates, limit), _sorted(candidates, limit))
    # An engine's own order (best first already) takes the shortcut, same answer.
    ordered = _sorted(candidates, len(candidates))
    assert _same(best_first(ordered, limit), _sorted(candidates, limit))
    assert _same(best_first(iter(ordered), limit), _sorted(candidates, limit))


def test_best_first_sorts_ties_by_document_id() -> None:
    engine_order = [
        Candidate("b", 1, 0.9, _AT, "active"),
        Candidate("a", 1, 0.9, _AT, "active"),
        Candidate("c", 1, 0.5, _AT, "active"),
    ]
    assert [c.document_id for c in best_first(engine_order, 3)] == ["a", "b", "c"]


_filters = st.builds(
    SearchFilter,
    galaxy=st.one_of(st.none(), st.just("g")),
    status=st.one_of(st.none(), st.just(("active",))),
    facets=st.one_of(st.just({}), st.just({"k": ("v",)})),
    document_ids=st.one_of(st.none(), st.just(("x",))),
    phrases=st.one_of(st.just(()), st.just((("p q",),))),
)


@given(_filters, st.lists(st.text(max_size=4), max_size=5), st.booleans())
def test_with_ids_is_model_copy(base: SearchFilter, ids: list[str], phrases: bool) -> None:
    update: dict[str, object] = {"document_ids": tuple(ids)}
    if not phrases:
        update["phrases"] = ()
    before = base.model_dump()
    expected = base.model_copy(update=update)
    got = base.with_ids(tuple(ids), phrases=phrases)
    assert type(got) is SearchFilter
    assert got == expected
    assert got.__dict__ == expected.__dict__
    assert got.model_fields_set == expected.model_fields_set
    assert got.model_dump() == expected.model_dump()
    assert got.document_ids == tuple(ids)
    assert base.model_dump() == before


def test_engine_call_adds_each_block_to_its_clock_even_when_it_raises() -> None:
    from contracts.timing import engine_call, engine_clock

    with engine_clock() as totals:
        with engine_call("a"):
            pass
        try:
            with engine_call("b"):
                raise ValueError("inside")
        except ValueError:
            pass
        with engine_call("a"):
            pass
    assert set(totals) == {"a", "b"}
    assert all(ms >= 0.0 for ms in totals.values())
    # Outside a clock nothing is collected and nothing fails.
    with engine_call("c"):
        pass
    assert "c" not in totals
