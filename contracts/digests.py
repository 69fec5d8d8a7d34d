"""Canonical JSON and the sha256 digests built on it.

Every digest in Orrery is sha256 over canonical JSON (sorted keys, no spaces, UTF-8,
non-ASCII kept as is). This module is the one place that computes them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from typing import Any

__all__ = ["canonical_json", "id_set_digest", "sha256_hex", "sha256_json"]


def canonical_json(value: Any) -> bytes:
    """Serialize `value` deterministically: sorted keys, no spaces, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(value: Any) -> str:
    """sha256 hex digest of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))


def id_set_digest(pairs: Iterable[tuple[str, int]]) -> str:
    """Digest of a set of live documents: sha256 over sorted `(document_id, revision)`.

    The order of `pairs` does not matter; duplicates are an error because a document
    has exactly one revision in any one snapshot.
    """
    ordered = sorted(pairs)
    for before, after in itertools.pairwise(ordered):
        if before[0] == after[0]:
            raise ValueError(f"document {before[0]!r} appears twice in an id set")
    digest = hashlib.sha256()
    for document_id, revision in ordered:
        digest.update(canonical_json([document_id, revision]))
        digest.update(b"\n")
    return digest.hexdigest()
