"""The only module of the projector that picks adapters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.embedding import Embedder
from projector.adapters.qdrant_edge_vectors import QdrantEdgeVectorIndex
from projector.adapters.sqlite_outbox_log import SqliteOutboxLog
from projector.adapters.sqlite_state import SqliteProjectorState
from projector.adapters.tantivy_lexical import TantivyLexicalIndex
from projector.ports import EventLog, LexicalIndex, VectorIndex
from projector.service import BatchReport, project_batch

__all__ = [
    "EmbeddedProjector",
    "ServerProjector",
    "default_embedder",
    "embedded_projector",
    "server_projector",
]

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


@dataclass(slots=True)
class ServerProjector:
    """The server-mode projector: Kafka in, OpenSearch + Qdrant out, registry in SQLite."""

    state: SqliteProjectorState
    log: EventLog
    lexical: LexicalIndex
    vectors: VectorIndex
    embedder: Embedder
    step: Callable[[], BatchReport]

    def close(self) -> None:
        self.log.close()
        self.vectors.close()
        self.lexical.close()
        self.state.close()


def server_projector(
    db_path: Path,
    *,
    embedder: Embedder,
    batch_size: int,
    kafka_bootstrap: str,
    kafka_topic_prefix: str,
    kafka_group: str,
    kafka_session_timeout_ms: int,
    opensearch_url: str,
    opensearch_index_prefix: str,
    opensearch_refresh_interval: str,
    qdrant: Any,
    qdrant_collection_prefix: str,
) -> ServerProjector:
    """Kafka consumer group as the log; OpenSearch and Qdrant (a `QdrantClient`) as the
    indexes. `qdrant` is shared with the query side when both run in one process
    (qdrant-client's local mode allows one client per path)."""
    # Imported here: the embedded deployment never loads these drivers.
    from projector.adapters.kafka_log import KafkaEventLog, KafkaLogSettings
    from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
    from projector.adapters.qdrant_vectors import QdrantServerVectorIndex

    state = SqliteProjectorState(db_path)
    log = KafkaEventLog(
        KafkaLogSettings(
            bootstrap_servers=kafka_bootstrap,
            group_id=kafka_group,
            topic_prefix=kafka_topic_prefix,
            session_timeout_ms=kafka_session_timeout_ms,
            heartbeat_interval_ms=max(1_000, kafka_session_timeout_ms // 6),
        )
    )
    lexical = OpenSearchLexicalIndex(
        opensearch_url,
        index_prefix=opensearch_index_prefix,
        refresh_interval=opensearch_refresh_interval,
    )
    vectors = QdrantServerVectorIndex(qdrant, collection_prefix=qdrant_collection_prefix)
    step = functools.partial(
        project_batch,
        log=log,
        state=state,
        lexical=lexical,
        vectors=vectors,
        embedder=embedder,
        cache=state,
        lexical_engine="opensearch",
        vector_engine="qdrant",
        consumer=kafka_group,
        batch_size=batch_size,
    )
    return ServerProjector(state, log, lexical, vectors, embedder, step)
