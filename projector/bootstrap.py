"""The only module of the projector that picks adapters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contracts.embedding import Embedder
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.service import BatchReport, project_batch

__all__ = ["EmbeddedProjector", "default_embedder", "embedded_projector"]

LEXICAL_ENGINE = "tantivy"
VECTOR_ENGINE = "qdrant-edge"
CONSUMER = "projector"


@dataclass(slots=True)
class EmbeddedProjector:
    """The embedded projector's parts; `step` applies one batch of the log."""

    state: SqliteProjectorState
    log: SqliteOutboxLog
    lexical: TantivyLexicalIndex
    vectors: QdrantEdgeVectorIndex
    embedder: Embedder
    step: Callable[[], BatchReport]

    def close(self) -> None:
        self.vectors.close()
        self.lexical.close()
        self.log.close()
        self.state.close()


def default_embedder(threads: int = 2) -> Embedder:
    """all-MiniLM-L6-v2 (int8 ONNX) from its PyPI package; loaded on first use."""
    from projector.adapters.onnx_embedder import OnnxMiniLMEmbedder

    return OnnxMiniLMEmbedder(intra_op_num_threads=threads)


def embedded_projector(
    data_dir: Path, db_path: Path, *, embedder: Embedder, batch_size: int
) -> EmbeddedProjector:
    """SQLite outbox as the log, tantivy + qdrant-edge generation directories."""
    state = SqliteProjectorState(db_path)
    log = SqliteOutboxLog(db_path, start_after=state.position(CONSUMER))
    lexical = TantivyLexicalIndex(data_dir / "generations" / "lexical")
    vectors = QdrantEdgeVectorIndex(data_dir / "generations" / "vectors")
    step = functools.partial(
        project_batch,
        log=log,
        state=state,
        lexical=lexical,
        vectors=vectors,
        embedder=embedder,
        cache=state,
        lexical_engine=LEXICAL_ENGINE,
        vector_engine=VECTOR_ENGINE,
        consumer=CONSUMER,
        batch_size=batch_size,
    )
    return EmbeddedProjector(state, log, lexical, vectors, embedder, step)
