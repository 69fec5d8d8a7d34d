"""The candidate fields of a generation's points, kept in memory by point id.

A vector search needs, per hit, the fields of a `contracts.index.Candidate`: document id,
revision, `updated_at` and status. Asked for them as payload, qdrant-edge converts a
payload dict per point: ~0.4 ms of a ~1.3 ms top-101 search at 100k points
(docs/bench/README.md). `PointTable` holds those fields by point id instead, so the
search asks the engine for ids and scores only; filters are still the engine's, so
what a search selects is unchanged.

The projector's vector adapter keeps it equal to its shard: every write's effect
(resolved upserts and removals) goes into the table under the shard's write lock, in a
*write window* (`writing`) that surrounds the shard's own update; a table is built by
reading the shard (`QdrantEdgeVectorIndex.points_for`). A reader never locks: it takes a
`stamp` before its engine call and hands it to `candidates`, which answers None if any
write window opened since (a seqlock; the caller then asks the engine for the payload,
as it did before the table). So a search's candidates are always the fields its points
had when the engine scored them. Pure: the stdlib only, no engine.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from contracts.index import Candidate
from contracts.index_fields import DOCUMENT_ID
from contracts.vector_payload import candidate_of, with_id

__all__ = ["Hit", "PointFields", "PointTable"]

PointFields = tuple[str, int, datetime, str]
"""`(document_id, revision, updated_at, status)` of a point: a `Candidate` less its score."""


class Hit(Protocol):
    """What `PointTable.hits` reads of an engine hit (qdrant-edge's `ScoredPoint`)."""

    @property
    def id(self) -> object: ...

    @property
    def score(self) -> float: ...


class PointTable:
    """Point key -> `PointFields`, for one generation's shard: the key is
    `contracts.point_ids.table_key` (`uuid.UUID.int` in a UUID-id generation, the point id
    itself, an `int` or a fallback point's `uuid.UUID`, in an integer-id one:
    `integer_ids`).

    Guarantees:
    - `put` and `remove` change it only inside `writing()` (one writer at a time: the
      caller holds the shard's write lock), whose window opens before the shard's update
      and closes after the table's.
    - `candidates(ids, scores, stamp)` returns the candidates of those points exactly as
      `candidate_of(payload, score)` builds them from the payload the engine stores, or
      None when a write window opened after `stamp` was taken (or was open then), or a
      point is not held: the caller then reads the payload from the engine.
    Thread-safe for one writer and any number of readers (readers take no lock).
    """

    def __init__(self, *, integer_ids: bool = False) -> None:
        self.integer_ids = integer_ids
        self._fields: dict[Hashable, PointFields] = {}
        self._statuses: dict[str, str] = {}
        # Even: no write window open; odd: one is. Bumped on entering and on leaving it.
        self._version = 0
        self._writer = threading.Lock()

    def __len__(self) -> int:
        return len(self._fields)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write window: readers whose stamp predates it get None from `candidates`.

        Left open for good when the body raises (what the shard holds is then unknown):
        every later `stamp` is None; the owner drops the table."""
        with self._writer:
            self._version += 1
            yield
            self._version += 1

    def put(self, points: Iterable[tuple[Hashable, Mapping[str, Any]]]) -> None:
        """Hold each `(point key, payload)` as its point's fields (`contracts.vector_payload`
        layout); call within `writing()`."""
        fields = self._fields
        # One string object per distinct status (the engine hands a new one per point).
        statuses = self._statuses
        for pid, payload in points:
            if DOCUMENT_ID not in payload:  # `payload_of(implied_id=True)`: the point id
                assert isinstance(pid, int)  # only UUID-id generations leave it out
                payload = with_id(payload, uuid.UUID(int=pid))
            candidate = candidate_of(payload, 0.0)
            status = statuses.setdefault(candidate[4], candidate[4])
            fields[pid] = (candidate[0], candidate[1], candidate[3], status)

    def remove(self, pids: Iterable[Hashable]) -> None:
        """Forget the points (absent ones are ignored); call within `writing()`."""
        fields = self._fields
        for pid in pids:
            fields.pop(pid, None)

    def stamp(self) -> int | None:
        """The table's version for a read that starts now; None while a window is open."""
        version = self._version
        return None if version & 1 else version

    def get(self, pid: Hashable) -> PointFields | None:
        return self._fields.get(pid)

    def fields(self, ids: Sequence[Hashable], stamp: int) -> list[PointFields] | None:
        """The fields of points `ids`, in order; None as for `candidates`."""
        get = self._fields.get
        out = [get(pid) for pid in ids]
        if self._version != stamp or None in out:
            return None
        return out  # type: ignore[return-value]  # no None in it

    def candidates(
        self, ids: Sequence[Hashable], scores: Sequence[float], stamp: int
    ) -> list[Candidate] | None:
        """The candidates of points `ids` scored `scores` (clamped to [-1, 1], as
        `candidate_of` clamps), in order; None if the table changed since `stamp` or
        holds no fields for one of them."""
        get = self._fields.get
        new = tuple.__new__  # the named tuple's generated `__new__` costs twice this
        out: list[Candidate] = []
        append = out.append
        for pid, score in zip(ids, scores, strict=True):
            fields = get(pid)
            if fields is None:
                return None
            value = float(score)
            if not -1.0 <= value <= 1.0:
                value = min(1.0, max(-1.0, value))
            append(new(Candidate, (fields[0], fields[1], value, fields[2], fields[3])))
        # Read after the lookups: a window opened meanwhile (or since the engine call
        # that `stamp` preceded) may have changed what was read.
        if self._version != stamp:
            return None
        return out

    def hits(self, points: Iterable[Hit], stamp: int) -> list[Candidate] | None:
        """`candidates` of engine hits, each point's `id` (an `int`, in an integer-id
        table its own key; a `uuid.UUID`, keyed by its `int` or, in an integer-id table,
        by itself; any other id is no key: None) and `score` read once, in one pass: the
        engine's `ScoredPoint.id` builds a new `uuid.UUID` on every read of a UUID point
        (~1.4 us; an integer point's is a plain `int`), and a second pass over the hits
        plus a key function per hit cost ~10 us of ~240 at 101 hits (100k points,
        docs/bench/README.md)."""
        get = self._fields.get
        new = tuple.__new__
        uuid_type = uuid.UUID
        integer = self.integer_ids
        out: list[Candidate] = []
        append = out.append
        for point in points:
            pid = point.id
            if type(pid) is int:
                fields = get(pid) if integer else None
            elif isinstance(pid, uuid_type):
                fields = get(pid if integer else pid.int)
            else:
                fields = None
            if fields is None:
                return None
            value = float(point.score)
            if not -1.0 <= value <= 1.0:
                value = min(1.0, max(-1.0, value))
            append(new(Candidate, (fields[0], fields[1], value, fields[2], fields[3])))
        # As `candidates`: read after the lookups.
        if self._version != stamp:
            return None
        return out
