"""The embedder port and the text an embedder sees for a record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from contracts.digests import sha256_hex
from contracts.records import RecordText

__all__ = ["Embedder", "embedding_text", "text_digest"]


class Embedder(Protocol):
    """Turns texts into L2-normalized vectors of `dimension` floats.

    Guarantees: deterministic for one `embedder_id` (same text, same vector up to float
    rounding); `embed` returns one vector per input text, in order.
    """

    @property
    def embedder_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...


def embedding_text(text: RecordText) -> str:
    """The text a record is embedded from: title, then body, then tags."""
    parts = [text.title.strip(), text.body.strip(), " ".join(t.strip() for t in text.tags)]
    return "\n".join(part for part in parts if part)


def text_digest(embedder_id: str, text: str) -> str:
    """Key of a cached vector: the embedder id and the exact text it embedded."""
    return sha256_hex(f"{embedder_id}\x1f{text}".encode())
