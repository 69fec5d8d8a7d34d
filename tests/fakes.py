"""Test doubles for ports whose real adapters are slow or nondeterministic."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Any

from contracts.records import Record

__all__ = ["FakeHashingEmbedder", "titled_record"]

_TOKEN = re.compile(r"\w+", re.UNICODE)


class FakeHashingEmbedder:
    """A deterministic `contracts.embedding.Embedder` for unit tests: no model, no I/O.

    Each lowercase word token is hashed (blake2b) into one of `dimension` buckets with a
    sign; the bucket counts are L2-normalized. Texts sharing words are closer than texts
    that do not, and the same text always gives the same vector in every process. A text
    without tokens maps to a fixed unit vector (first bucket), so `embed("")` works.
    The id does not name the dimension: vectors are always stored with both.
    """

    def __init__(self, dimension: int = 32) -> None:
        if dimension <= 0:
            raise ValueError("dimension must be positive")
        self._dimension = dimension

    @property
    def embedder_id(self) -> str:
        return "fake-hashing@1"

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        return [self._embed_one(text) for text in texts]

    def _embed_one(self, text: str) -> tuple[float, ...]:
        buckets = [0.0] * self._dimension
        for token in _TOKEN.findall(text.lower()):
            digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "big")
            sign = 1.0 if value & 1 else -1.0
            buckets[(value >> 1) % self._dimension] += sign
        norm = math.sqrt(sum(x * x for x in buckets))
        if norm == 0.0:
            return tuple(1.0 if i == 0 else 0.0 for i in range(self._dimension))
        return tuple(x / norm for x in buckets)


def titled_record(
    namespace: str, snapshot_kind: str, item: str, revision: int = 1, **fields: Any
) -> Record:
    """A record of `item` with a title and a body made from its name, plus `fields`."""
    return Record.model_validate(
        {
            "namespace": namespace,
            "snapshot_kind": snapshot_kind,
            "item_id": item,
            "revision": revision,
            "text": {"title": f"{item} title", "body": f"body of {item}"},
            **fields,
        }
    )
