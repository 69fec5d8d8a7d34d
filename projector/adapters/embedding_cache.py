"""Vectors kept across data dirs and processes: an opt-in store (`ORRERY_EMBEDDING_CACHE_DIR`).

The projector's own `vector_cache` lives in one data dir. This store outlives it: a fresh
data dir loading texts some process embedded before (the sample corpus at every
`orrery serve --sample`, a rebuilt deployment re-reading its corpus) skips the model.

- Content-addressed: a vector is kept under `text_digest(embedder_id, text)`. The embedder
  id names the model file and the pipeline version that shaped its vectors, so a hit is
  the vector that embedder gives that exact text.
- Exact: vectors are stored as float64, so a hit returns the same floats the embedder
  returned (the ONNX embedder's are float32 values).
- One SQLite file (WAL) in the directory; several processes may share it.
- A cache only: a store that cannot be read or written is logged and the texts are
  embedded as without it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from array import array
from collections.abc import Sequence
from pathlib import Path

from contracts.embedding import Embedder, text_digest

__all__ = ["CACHE_FILE", "CachingEmbedder"]

CACHE_FILE = "embeddings.sqlite"
_CHUNK = 500  # keys per SELECT (SQLite's bound-parameter limit is 32,766)

log = logging.getLogger(__name__)


class CachingEmbedder:
    """`inner` behind a content-addressed vector store in `directory` (an `Embedder`).

    Guarantees: `embed` returns what `inner.embed` returns for the same texts, in order;
    `inner` is asked only for texts whose `(embedder_id, text)` the store does not hold,
    each distinct text once per call. Thread-safe.
    """

    def __init__(self, inner: Embedder, directory: Path) -> None:
        self.inner = inner
        self.directory = directory
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    @property
    def embedder_id(self) -> str:
        return self.inner.embedder_id

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one str")
        if not texts:
            return []
        embedder_id = self.inner.embedder_id
        keys = [text_digest(embedder_id, text) for text in texts]
        found = self._read(sorted(set(keys)))
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in found:
                missing.setdefault(key, text)
        if missing:
            vectors = self.inner.embed(list(missing.values()))
            made = dict(zip(missing, vectors, strict=True))
            self._write(made)
            found.update(made)
        return [found[key] for key in keys]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.directory / CACHE_FILE, timeout=30.0, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB NOT NULL)"
            )
            conn.commit()
            self._conn = conn
        return self._conn

    def _read(self, keys: list[str]) -> dict[str, tuple[float, ...]]:
        found: dict[str, tuple[float, ...]] = {}
        width = self.inner.dimension * 8
        try:
            with self._lock:
                conn = self._connection()
                for start in range(0, len(keys), _CHUNK):
                    chunk = keys[start : start + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    rows = conn.execute(
                        f"SELECT key, vector FROM vectors WHERE key IN ({marks})", chunk
                    ).fetchall()
                    for key, blob in rows:
                        if len(blob) == width:  # else: not this embedder's shape, a miss
                            found[str(key)] = tuple(array("d", blob))
        except (sqlite3.Error, OSError) as error:
            log.warning("embedding cache %s not read: %s", self.directory, error)
        return found

    def _write(self, vectors: dict[str, tuple[float, ...]]) -> None:
        try:
            with self._lock:
                conn = self._connection()
                with conn:
                    conn.executemany(
                        "INSERT OR IGNORE INTO vectors VALUES (?, ?)",
                        [(key, array("d", v).tobytes()) for key, v in vectors.items()],
                    )
        except (sqlite3.Error, OSError) as error:
            log.warning("embedding cache %s not written: %s", self.directory, error)
