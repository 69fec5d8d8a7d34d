"""`FlatLexical.add` appends a batch's postings in one pass over its tokens
(`contracts.flat_lexical._add_postings`); it must keep exactly what the loop over each
row's `Counter` kept: per field and term, the rows ascending with their term
frequencies, terms in first-occurrence order, each row's field length id and the
field's token count, and the same filter columns, through any sequence of batches."""

from __future__ import annotations

from array import array
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.flat_lexical import FlatLexical, LexicalRow, _micros, fieldnorm_id
from contracts.index import Candidate

_FIELDS = ("title", "body", "text")
# A few common words and many rare ones, so batches share terms and bring new ones.
_WORDS = st.sampled_from(("a", "b", "the", "é", "")) | st.text("xyzé\u00df", min_size=1, max_size=3)
_T0 = datetime(2026, 1, 1, tzinfo=UTC)

_ROWS = st.lists(
    st.tuples(
        st.dictionaries(
            st.sampled_from(_FIELDS),
            # Up to a few hundred tokens: field length ids past the exact range (40).
            st.lists(_WORDS, max_size=30)
            | st.lists(st.sampled_from(("a", "b", "c")), min_size=41, max_size=90),
            max_size=3,
        ),
        st.sampled_from(("g1", "g2")),
        st.sampled_from(("", "r", "r/s")),
        st.sampled_from(("active", "draft")),
        st.integers(0, 10_000),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


def _rows(specs: list[tuple[object, ...]], first: int) -> list[LexicalRow]:
    rows = []
    for offset, (tokens, galaxy, ring, status, minutes, hidden) in enumerate(specs):
        rows.append(
            LexicalRow(
                candidate=Candidate(
                    f"d{first + offset}",
                    1,
                    0.0,
                    _T0 + timedelta(minutes=minutes),  # type: ignore[arg-type]
                    status,  # type: ignore[arg-type]
                ),
                galaxy=galaxy,  # type: ignore[arg-type]
                ring=ring,  # type: ignore[arg-type]
                hidden=hidden,  # type: ignore[arg-type]
                tokens=tokens,  # type: ignore[arg-type]
            )
        )
    return rows


def _reference_add(flat: FlatLexical, batch: list[LexicalRow]) -> None:
    """What `FlatLexical.add` did before: one `Counter` a row and field, term by term
    (the checks for held and repeated documents left out)."""
    flat._version += 1
    for row in batch:
        position = len(flat._candidates)
        flat._rows[row.candidate.document_id] = position
        flat._candidates.append(row.candidate)
        flat._galaxy.append(flat._code(row.galaxy))
        flat._status.append(flat._code(row.candidate.status))
        flat._ring.append(flat._code(row.ring or None))
        flat._updated.append(_micros(row.candidate.updated_at))
        flat._hidden.append(row.hidden)
        for name, field in flat._fields.items():
            tokens = row.tokens.get(name, ())
            field.lengths.append(fieldnorm_id(len(tokens)))
            field.tokens += len(tokens)
            postings = field.postings
            for term, count in Counter(tokens).items():
                posting = postings.get(term)
                if posting is None:
                    posting = postings[term] = (array("i"), array("i"))
                posting[0].append(position)
                posting[1].append(count)


def _state(flat: FlatLexical) -> dict[str, object]:
    """Everything `add` writes, postings as lists and in their dict order."""
    return {
        "rows": flat._rows,
        "candidates": flat._candidates,
        "codes": list(flat._codes.items()),
        "galaxy": flat._galaxy,
        "status": flat._status,
        "ring": flat._ring,
        "updated": flat._updated,
        "hidden": flat._hidden,
        "version": flat._version,
        "fields": {
            name: (
                [(term, list(rows), list(counts)) for term, (rows, counts) in f.postings.items()],
                f.lengths,
                f.tokens,
            )
            for name, f in flat._fields.items()
        },
    }


@settings(max_examples=100, deadline=None)
@given(st.lists(_ROWS, min_size=1, max_size=4))
def test_a_batch_adds_what_the_per_row_loop_added(batches: list[list[tuple[object, ...]]]) -> None:
    flat = FlatLexical(_FIELDS, max_rows=10_000)
    reference = FlatLexical(_FIELDS, max_rows=10_000)
    first = 0
    for specs in batches:
        rows = _rows(specs, first)
        first += len(rows)
        assert flat.add(rows)
        _reference_add(reference, rows)
        assert _state(flat) == _state(reference)


def test_a_batch_with_a_held_or_repeated_document_adds_nothing() -> None:
    flat = FlatLexical(("text",), max_rows=10)
    rows = _rows([({"text": ["a"]}, "g1", "", "active", 0, False)], 0)
    assert flat.add(rows)
    before = {t: (list(r), list(c)) for t, (r, c) in flat._fields["text"].postings.items()}
    again = _rows([({"text": ["a", "b"]}, "g1", "", "active", 0, False)], 1) * 2
    assert not flat.add(again)  # d1 twice
    assert not flat.add(rows)  # d0 held
    assert len(flat) == 1
    assert {t: (list(r), list(c)) for t, (r, c) in flat._fields["text"].postings.items()} == before
