"""Integer point ids: how a qdrant-edge generation created since session 27 keys its points.

qdrant-edge-py builds a new `uuid.UUID` (in Python) on every read of a UUID point's
`ScoredPoint.id`, and hands a plain `int` for an integer point: ~0.13-0.15 ms of a top-101
search (docs/bench/README.md, "what integer point ids would save"). So a new generation
keys a document's point by `int_point_id(document_id)`, a 63-bit hash of the document id
(the top 64 bits of its BLAKE2b, top bit cleared): a pure function of the id, which every
reader and writer computes alike.

Two documents of a generation may share a hash (probability ~n²/2⁶⁴: 5·10⁻⁸ at 1M points).
The writer detects it (it reads the `document_id` of the point at the hash before writing
or deleting there: a point held by another document is never replaced nor deleted) and the
document that came second keeps its UUID point id (`contracts.vector_payload.point_id`,
which never collides; qdrant-edge holds integer and UUID points in one shard) for the
generation's life: its *fallback* set, kept in a small file beside the shard directories
(`PointIds` here is its in-memory form). A reader that goes from listed document ids to
points must take the returned points' documents from the point table or the payload and
drop a point whose document is not the one listed: an absent document's hash may be held
by another's point.

Generations created before keep UUID ids (`PointIds(integer=False)`): no marker file.
Pure: the stdlib only, no engine.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable

from contracts.vector_payload import point_id

__all__ = ["INT_ID_SCHEME", "PointIds", "int_point_id", "table_key"]

INT_ID_SCHEME = "int63-blake2b"
"""The name of `int_point_id`'s mapping, as a generation's marker file names it."""

_MASK = (1 << 63) - 1

PointIdValue = int | uuid.UUID
"""A point id as this project writes it: a 63-bit `int` or a `uuid.UUID`."""


def int_point_id(document_id: str) -> int:
    """The integer point id of a document: the first 8 bytes of the BLAKE2b of its UTF-8,
    big-endian, top bit cleared (so it is a non-negative i64 as well as a u64)."""
    digest = hashlib.blake2b(document_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK


def table_key(pid: object, integer: bool) -> object:
    """A point's key in a generation's point table and id sets: in a UUID-id generation
    `uuid.UUID.int` (as before session 27); in an integer-id one the id itself (an `int`,
    or a fallback point's `uuid.UUID`: a canonical UUID document id's `.int` can be small,
    so it is never keyed by it there)."""
    if integer:
        return pid
    assert isinstance(pid, uuid.UUID)
    return pid.int


class PointIds:
    """How one generation maps document ids to point ids.

    `integer` False: every document's point is `point_id(document_id)` (UUID). True: it is
    `hash(document_id)`, except for the documents of `fallback`, which keep their UUID
    point. `fallback` only grows (the owner adds to it under the generation's write lock,
    after writing it down); readers read it without a lock: a document added meanwhile is
    looked up where it was before, which the document check of every listed lookup
    covers.
    """

    __slots__ = ("fallback", "hash", "integer")

    def __init__(
        self,
        integer: bool,
        fallback: Iterable[str] = (),
        hash: Callable[[str], int] = int_point_id,
    ) -> None:
        self.integer = integer
        self.fallback: set[str] = set(fallback)
        self.hash = hash

    def of(self, document_id: str) -> PointIdValue:
        """The point id `document_id` is written at."""
        if self.integer and document_id not in self.fallback:
            return self.hash(document_id)
        return point_id(document_id)

    def key(self, pid: object) -> object:
        """`table_key` in this generation."""
        return table_key(pid, self.integer)
