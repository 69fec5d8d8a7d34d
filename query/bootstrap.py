"""The only module of the query worker that picks adapters."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.embedding import Embedder
from query.adapters.memory_cache import MemoryCache
from query.adapters.qdrant_edge_vectors import QdrantEdgeVectorSearch
from query.adapters.sqlite_routing import SqliteRecordReader, SqliteRouting
from query.adapters.tantivy_lexical import TantivyLexicalSearch
from query.service import QueryEmbeddingCache, QueryPorts

__all__ = ["embedded_query_ports"]


def embedded_query_ports(
    db_path: Path,
    *,
    embedder: Embedder,
    lexical_index_provider: Callable[[str], Any],
    vector_shard_provider: Callable[[str], Any],
    cache_responses: bool = True,
) -> QueryPorts:
    """Query ports over the embedded stack.

    tantivy indexes and qdrant-edge shards are opened once per process by the
    projector's adapters; the query side reads the same objects through providers.
    """
    return QueryPorts(
        routing=SqliteRouting(db_path),
        lexical=TantivyLexicalSearch(lexical_index_provider),
        vectors=QdrantEdgeVectorSearch(vector_shard_provider),
        records=SqliteRecordReader(db_path),
        query_vectors=QueryEmbeddingCache(embedder),
        responses=MemoryCache() if cache_responses else None,
    )
