"""An in-memory copy of a small, append-only generation's lexical index, scored exactly.

tantivy answers a weighted query's lexical side with two calls: the top `depth` by BM25,
then the scores of the vector candidates it did not return, by id — and the second costs
as much as the first (tantivy's union scores every matching document of a segment once
per lookup; docs/bench/README.md). On a generation of a few thousand documents both are
cheaper as one pass over a forward copy: every document's BM25 in numpy, once, from which
the top `depth` and any lookup are read. SciFact (5,183 documents), session 15: 0.33 ms
per query against ~1.4 ms for tantivy's two calls; scores within 2e-7 (relative) of
tantivy's, the same ranking for all 300 test queries.

Scores are tantivy's BM25 (tantivy 0.27, `src/query/bm25.rs`), in float32 as tantivy
computes them: per term and field, idf = ln(1 + (N - n + 0.5) / (n + 0.5)) with N the
documents and n those holding the term, weight = idf · (1 + k1) · boost, and a document
adds weight · tf / (tf + k1 · (1 - b + b · fieldnorm / avg_fieldnorm)), its field length
quantized as tantivy stores it (`fieldnorm_id`). They equal the engine's to float32
rounding (the engine sums a document's terms in its own order).

Exact only while tantivy's statistics are the live documents' own: tantivy counts a
deleted or replaced document in N, n and the field lengths until a merge drops it, and
when is not observable from here. So a copy takes additions only; the projector drops it
for good at the first replacement or deletion, or past its size (`add` returns False),
or when a compaction (`TantivyLexicalIndex.compact`) leaves a deleted document behind (a
compaction without one keeps it: the same documents, the same statistics),
and the query side then asks the engine, as it does for anything the copy cannot answer
(filters on visibility, facets, ring trees or phrases; text without tokens; blank text).
"""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, compress, count, pairwise
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from contracts.flat_vectors import any_of, candidate_fields, candidates_at, flat_answerable
from contracts.index import Candidate, SearchFilter

__all__ = ["FlatLexical", "LexicalRow", "fieldnorm_id"]

_BY_ID = attrgetter("document_id")
_BY_SCORE = attrgetter("score")

_K1 = np.float32(1.2)
_B = np.float32(0.75)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_ABSENT = -1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Passes kept per copy (`FlatLexical._scored`): a few queries in flight at once.
_SCORED = 8
# A term in at least this share of a copy's rows is added as a dense array (`_contribution`).
_DENSE_SHARE = 0.125
# `_top_rows` bounds the `limit`-th best score from every this-many-th row first.
_SAMPLE_STEP = 16
# What one copy keeps of its terms' BM25 arrays at most (then it starts again).
_BM25_MAX_BYTES = 16 * 1024 * 1024


def _fieldnorm_table() -> list[int]:
    """tantivy's field length quantization (`src/fieldnorm/code.rs`): lengths up to 40
    are exact, then each id covers a range growing by an eighth, as a float with a
    3-bit mantissa."""
    table = list(range(41))
    # 40, then steps of 2, 4, 8, ... eight at a time, offset by the top of the last run.
    value, step = 40, 2
    while len(table) < 256:
        for _ in range(8):
            if len(table) == 256:
                break
            value += step
            table.append(value)
        step *= 2
    return table


_FIELDNORMS = _fieldnorm_table()
_FIELDNORMS_F32 = np.asarray(_FIELDNORMS, dtype=np.float32)


def fieldnorm_id(length: int) -> int:
    """The id tantivy stores for a field of `length` tokens (the largest table value not
    above it)."""
    return bisect.bisect_right(_FIELDNORMS, length) - 1


@dataclass(frozen=True, slots=True)
class LexicalRow:
    """One document as the copy keeps it: its candidate fields, its filter columns, and
    the analyzed tokens of each text field (as the generation's analyzer yields them)."""

    candidate: Candidate
    galaxy: str
    ring: str
    hidden: bool
    tokens: Mapping[str, Sequence[str]]


class _Field:
    """One text field: postings (term -> rows, term frequencies), each row's field
    length id, and the tokens of all rows."""

    __slots__ = ("lengths", "postings", "tokens")

    def __init__(self) -> None:
        # 4 bytes a row and a frequency per posting (`array`), made numpy arrays per term
        # when a query first needs them after a write.
        self.postings: dict[str, tuple[array[int], array[int]]] = {}
        self.lengths: list[int] = []
        self.tokens = 0


class FlatLexical:
    """A generation's documents as rows with per-field postings (see the module).

    Thread-safe: one lock, held for `add` and for a query's scoring."""

    def __init__(self, fields: Sequence[str], *, max_rows: int) -> None:
        self._fields = {name: _Field() for name in fields}
        self._max_rows = max_rows
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._candidates: list[Candidate] = []
        self._codes: dict[str, int] = {}
        self._galaxy: list[int] = []
        self._status: list[int] = []
        self._ring: list[int] = []
        self._updated: list[int] = []
        self._hidden: list[bool] = []
        # Arrays of the lists above and of each posting, rebuilt after a write.
        self._version = 0
        self._arrays: dict[object, npt.NDArray[np.generic]] = {}
        self._arrays_version = -1
        # The last queries' scores, by (terms, boosts): a weighted query's lookup (on the
        # request's thread) follows its search (on the source pool's) with the same
        # terms; both read one pass. Kept with the arrays: gone after a write.
        self._scored: dict[object, npt.NDArray[np.float32]] = {}
        # Each queried term's BM25 per row (`_contribution`), by (field, term, boost).
        self._bm25: dict[
            tuple[str, str, float], tuple[npt.NDArray[np.intp] | None, npt.NDArray[np.float32]]
        ] = {}
        self._bm25_bytes = 0

    def __len__(self) -> int:
        return len(self._candidates)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self._fields)

    def add(self, rows: Iterable[LexicalRow]) -> bool:
        """Keep `rows` (documents new to the copy); False, keeping nothing of them, when
        one is already held or they would pass the copy's size: the caller drops it."""
        batch = list(rows)
        with self._lock:
            if len(self._candidates) + len(batch) > self._max_rows:
                return False
            ids = [row.candidate.document_id for row in batch]
            if len(set(ids)) != len(ids) or any(d in self._rows for d in ids):
                return False
            self._version += 1
            start = len(self._candidates)
            self._rows.update(zip(ids, range(start, start + len(batch)), strict=True))
            self._candidates.extend(row.candidate for row in batch)
            code = self._code
            for row in batch:  # codes numbered as the values come, row by row
                self._galaxy.append(code(row.galaxy))
                self._status.append(code(row.candidate.status))
                self._ring.append(code(row.ring or None))
            self._updated.extend(_micros(row.candidate.updated_at) for row in batch)
            self._hidden.extend(row.hidden for row in batch)
            for name, field in self._fields.items():
                _add_postings(field, [row.tokens.get(name, ()) for row in batch], start)
        return True

    def search(
        self, terms: Sequence[str], boosts: Mapping[str, float], filter: SearchFilter, limit: int
    ) -> list[Candidate] | None:
        """The best `limit` documents matching a term under `filter`, best first, ties by
        `document_id` (across the `limit` boundary too); None if `filter` has a clause
        the copy has no column for, or a boosted field it does not hold."""
        if not flat_answerable(filter) or any(name not in self._fields for name in boosts):
            return None
        if limit <= 0 or filter.matches_nothing():
            return []
        with self._lock:
            scores = self._scores(terms, boosts)
            mask = self._mask(filter, with_ids=True)
            if mask is None:
                return []
            # Rows the filter drops count as 0.0, as rows no term matches do.
            eligible = (
                scores if self._all_visible(mask) else np.where(mask, scores, np.float32(0.0))
            )
            # At least the `limit` best matching rows (and their ties): those at or above
            # the `limit`-th score of all rows when that is a match, else every match.
            rows = _top_rows(eligible, limit)
            if rows.size == 0:
                return []
            picked = candidates_at(self._candidate_fields(), rows, eligible[rows])
        # Best first, ties by id: two stable sorts on C-level keys (a tuple key per
        # candidate cost twice as much).
        picked.sort(key=_BY_ID)
        picked.sort(key=_BY_SCORE, reverse=True)
        return picked[:limit]

    def scores(
        self, terms: Sequence[str], boosts: Mapping[str, float], filter: SearchFilter
    ) -> dict[str, float] | None:
        """`LexicalSearch.scores` of the documents `filter.document_ids` lists: those that
        match the rest of `filter` and a term; None as for `search`."""
        if filter.document_ids is None:
            return None
        if not flat_answerable(filter) or any(name not in self._fields for name in boosts):
            return None
        if filter.matches_nothing():
            return {}
        with self._lock:
            # Each listed id's row in one pass over the (large) id dict; ids not held drop.
            ids: Sequence[str] = filter.document_ids
            found = list(map(self._rows.get, ids))
            if None in found:
                ids = [d for d, row in zip(ids, found, strict=True) if row is not None]
                found = [row for row in found if row is not None]
            if not ids:
                return {}
            mask = self._mask(filter, with_ids=False)
            if mask is None:
                return {}
            scores = self._scores(terms, boosts)
            rows = np.array(found, dtype=np.intp)
            values = scores[rows]
            keep = mask[rows] & (values > 0.0)
            # A document listed twice is one key with its one score.
            return dict(zip(compress(ids, keep.tolist()), values[keep].tolist(), strict=True))

    # -- scoring ------------------------------------------------------------------------

    def _scores(self, terms: Sequence[str], boosts: Mapping[str, float]) -> npt.NDArray[np.float32]:
        """Every row's BM25 for `terms` over the boosted fields (lock held), summed term
        by term, field by field, as the engine's query lists its clauses."""
        key = (tuple(terms), tuple(boosts.items()))
        self._fresh_arrays()  # passes of an older version are gone
        scored = self._scored.get(key)
        if scored is not None:
            return scored
        scores: npt.NDArray[np.float32] | None = None
        for term in terms:
            for name, boost in boosts.items():
                field = self._fields[name]
                posting = field.postings.get(term)
                if posting is None:
                    continue
                rows, contribution = self._contribution(name, term, posting, field, boost)
                if scores is None:
                    if rows is None:
                        # 0.0 + x is x for every contribution (none is -0.0): a copy is
                        # the same sum without a pass over a new zeroed array.
                        scores = contribution.copy()
                        continue
                    scores = np.zeros(len(self._candidates), dtype=np.float32)
                if rows is None:
                    scores += contribution  # dense: 0.0 where the term is absent
                else:
                    scores[rows] += contribution
        if scores is None:
            scores = np.zeros(len(self._candidates), dtype=np.float32)
        if len(self._scored) >= _SCORED:
            del self._scored[next(iter(self._scored))]
        self._scored[key] = scores
        scores.flags.writeable = False  # shared by the readers of this pass
        return scores

    def _contribution(
        self,
        name: str,
        term: str,
        posting: tuple[array[int], array[int]],
        field: _Field,
        boost: float,
    ) -> tuple[npt.NDArray[np.intp] | None, npt.NDArray[np.float32]]:
        """The rows holding `term` in field `name` and the term's BM25 in each (boosted),
        kept until the next write: queries share terms, so a long query's pass adds
        kept arrays instead of computing each term's again (the same float32 values).
        A term in at least `_DENSE_SHARE` of the rows comes as one value per row (rows
        None, 0.0 where the term is absent): adding a whole array costs a fraction of a
        scatter through its rows, and adding 0.0 changes no sum of positive float32s."""
        self._fresh_arrays()
        key = (name, term, boost)
        kept = self._bm25.get(key)
        if kept is not None:
            return kept
        rows, frequencies = self._posting(posting)
        total = len(self._candidates)
        n = np.float32(total)
        df = np.float32(rows.size)
        x = (n - df + _HALF) / (df + _HALF)
        idf = np.float32(math.log(float(_ONE + x)))
        weight = idf * (_ONE + _K1)
        if boost != 1.0:
            weight = weight * np.float32(boost)
        norms = self._norms(name, field)[rows]
        contribution: npt.NDArray[np.float32] = weight * (frequencies / (frequencies + norms))
        if rows.size >= _DENSE_SHARE * total:
            dense = np.zeros(total, dtype=np.float32)
            dense[rows] = contribution
            kept = (None, dense)
        else:
            kept = (rows, contribution)
        size = contribution.nbytes + (0 if kept[0] is None else rows.nbytes)
        if self._bm25_bytes + size > _BM25_MAX_BYTES:
            self._bm25, self._bm25_bytes = {}, 0  # bounded: start again
        self._bm25[key] = kept
        self._bm25_bytes += size
        return kept

    @staticmethod
    def _posting(
        posting: tuple[array[int], array[int]],
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
        """A posting's rows and term frequencies as arrays: copies (`astype`), so no view
        keeps the growable buffers exported. Kept by `_contribution` alone (bounded)."""
        rows = np.frombuffer(posting[0], dtype=np.int32).astype(np.intp)
        return rows, np.frombuffer(posting[1], dtype=np.int32).astype(np.float32)

    def _norms(self, name: str, field: _Field) -> npt.NDArray[np.float32]:
        """`k1 · (1 - b + b · fieldnorm / avg_fieldnorm)` of each row's length id."""
        arrays = self._fresh_arrays()
        key = (name, "norms")
        norms = arrays.get(key)
        if norms is None:
            average = np.float32(field.tokens) / np.float32(len(self._candidates))
            cache = _K1 * (_ONE - _B + _B * _FIELDNORMS_F32 / average)
            norms = arrays[key] = cache.astype(np.float32)[np.asarray(field.lengths)]
        return norms  # type: ignore[return-value]

    def _fresh_arrays(self) -> dict[object, npt.NDArray[np.generic]]:
        if self._arrays_version != self._version:
            self._arrays = {}
            self._scored = {}
            self._bm25, self._bm25_bytes = {}, 0
            self._arrays_version = self._version
        return self._arrays

    def _candidate_fields(self) -> npt.NDArray[np.object_]:
        """The rows' candidate fields (`candidate_fields`), kept until the next write."""
        arrays = self._fresh_arrays()
        fields = arrays.get("candidates")
        if fields is None:
            fields = arrays["candidates"] = candidate_fields(self._candidates)
        return fields  # type: ignore[return-value]

    def _column(self, name: str, values: list[int] | list[bool], dtype: type) -> npt.NDArray:  # type: ignore[type-arg]
        arrays = self._fresh_arrays()
        column = arrays.get(name)
        if column is None:
            column = arrays[name] = np.asarray(values, dtype=dtype)
        return column

    # -- filters ------------------------------------------------------------------------

    def _mask(self, filter: SearchFilter, *, with_ids: bool) -> npt.NDArray[np.bool_] | None:
        """The visible rows `filter` keeps; None if none can (a value no row holds).
        Read-only: without a clause it is the copy's one visible-rows array (kept until
        the next write), not a new one."""
        visible = self._visible()
        if (
            filter.galaxy is None
            and filter.status is None
            and filter.rings is None
            and filter.updated_after is None
            and filter.updated_before is None
            and (not with_ids or filter.document_ids is None)
        ):
            return visible
        mask = visible.copy()
        if filter.galaxy is not None:
            code = self._codes.get(filter.galaxy)
            if code is None:
                return None
            mask &= self._column("galaxy", self._galaxy, np.int32) == code
        for name, column, values in (
            ("status", self._status, filter.status),
            ("ring", self._ring, filter.rings),
        ):
            if values is not None:
                codes = [self._codes[v] for v in values if v in self._codes]
                if not codes:
                    return None
                mask &= any_of(self._column(name, column, np.int32), codes)
        updated = self._column("updated", self._updated, np.int64)
        if filter.updated_after is not None:
            mask &= updated >= _micros(filter.updated_after)
        if filter.updated_before is not None:
            mask &= updated <= _micros(filter.updated_before)
        if with_ids and filter.document_ids is not None:
            listed = np.zeros(mask.size, dtype=np.bool_)
            listed[[self._rows[d] for d in filter.document_ids if d in self._rows]] = True
            mask &= listed
        return mask

    def _visible(self) -> npt.NDArray[np.bool_]:
        """The rows not hidden from this lane (read-only, kept until the next write)."""
        arrays = self._fresh_arrays()
        visible = arrays.get("visible")
        if visible is None:
            visible = arrays["visible"] = ~self._column("hidden", self._hidden, np.bool_)
            visible.flags.writeable = False
            # Whether every row is visible: a query then reads its scores as they are.
            arrays["all_visible"] = np.asarray(bool(visible.all()))
        return visible  # type: ignore[return-value]

    def _all_visible(self, mask: npt.NDArray[np.bool_]) -> bool:
        """`mask.all()`, known without a pass when `mask` is the visible-rows array."""
        if mask is self._arrays.get("visible"):
            return bool(self._arrays["all_visible"])
        return bool(mask.all())

    def _code(self, value: str | None) -> int:
        if value is None:
            return _ABSENT
        return self._codes.setdefault(value, len(self._codes))


def _add_postings(field: _Field, tokens: list[Sequence[str]], start: int) -> None:
    """Append the postings of rows `start`, `start + 1`, ... whose tokens in `field` are
    `tokens`: per term, its rows ascending with their term frequencies, new terms in the
    order they first occur (what a loop over each row's `Counter` appends). One pass over
    the batch's tokens in C and numpy and one Python step per distinct term of the batch,
    not per term of each row (~36 distinct of ~50 tokens a corpus document)."""
    lengths = list(map(len, tokens))
    field.lengths.extend(map(fieldnorm_id, lengths))
    total = sum(lengths)
    field.tokens += total
    if total == 0:
        return
    # Each token's term numbered in first-occurrence order, in one pass in C (a missing
    # key takes the counter's next number).
    numbering: defaultdict[str, int] = defaultdict(count().__next__)
    term_of_token = np.fromiter(
        map(numbering.__getitem__, chain.from_iterable(tokens)), dtype=np.int64, count=total
    )
    terms = list(numbering)
    size = len(tokens)
    row_of_token = np.repeat(np.arange(size, dtype=np.int64), lengths)
    # One key per (term, row) occurrence, ordered by term then row: unique keys are the
    # postings in order, their multiplicities the term frequencies.
    keys, frequencies = np.unique(term_of_token * size + row_of_token, return_counts=True)
    term_of_key = keys // size
    rows = (keys - term_of_key * size + start).astype(np.int32)
    counts = frequencies.astype(np.int32)
    # Byte offsets (4 a value) of each term's run.
    ends = (np.flatnonzero(term_of_key[1:] != term_of_key[:-1]) + 1) * 4
    bounds = [0, *ends.tolist(), keys.size * 4]
    row_bytes, count_bytes = memoryview(rows).cast("B"), memoryview(counts).cast("B")
    postings = field.postings
    # `term_of_key` runs through 0 .. len(terms) - 1 in order: every term occurs.
    for term, (low, high) in zip(terms, pairwise(bounds), strict=True):
        posting = postings.get(term)
        if posting is None:
            posting = postings[term] = (array("i"), array("i"))
        posting[0].frombytes(row_bytes[low:high])
        posting[1].frombytes(count_bytes[low:high])


def _top_rows(eligible: npt.NDArray[np.float32], limit: int) -> npt.NDArray[np.intp]:
    """The rows scoring at least the `limit`-th best score of `eligible` when that score
    is positive (ties included), else every positive row; ascending."""
    total = eligible.size
    if total <= limit:
        return np.flatnonzero(eligible > 0.0)
    if total >= _SAMPLE_STEP * limit * 2:
        # The `limit`-th best of every `_SAMPLE_STEP`-th row is at most the `limit`-th
        # best of all rows, so the rows at or above it hold every row at or above the
        # latter, and the `limit`-th best among them is the `limit`-th best of all:
        # exact, with a partition of ~1/16 of the rows and one of a few `limit`s
        # (100k rows: ~545 -> ~60 us) instead of one of all rows.
        sample = eligible[::_SAMPLE_STEP]
        bound = np.partition(sample, sample.size - limit)[sample.size - limit]
        if bound > 0.0:
            above = np.flatnonzero(eligible >= bound)
            values = eligible[above]
            kth = np.partition(values, values.size - limit)[values.size - limit]
            top: npt.NDArray[np.intp] = above[values >= kth]
            return top
    kth = np.partition(eligible, total - limit)[total - limit]
    return np.flatnonzero(eligible >= kth if kth > 0.0 else eligible > 0.0)


def _micros(instant: datetime) -> int:
    """Microseconds since the epoch, exactly; a naive datetime is taken as UTC (as the
    engine's adapter takes it)."""
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    delta = instant - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
