"""A deterministic sample corpus: the household memory of a home assistant ("Twinr").

Margarete (78) lives alone with her cat Minka in a house with a garden; her daughter Anna
(her own galaxy, `anna`) lives in Hamburg with Thomas and the children Lukas and Mia. The
assistant remembers where things are, preferences, routines, appointments, medication,
device settings, the garden, the pets and recipes, in German and English.

The records are data (`ingest/data/sample_records.jsonl`: one record per line, without
`namespace` and `document_id`, which are set per load) and so are the example queries
(`ingest/data/sample_queries.json`). Loading is pure and deterministic: the same
namespace always yields equal records in the same order.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from contracts.records import Record

__all__ = [
    "CONFLICT_SCHEMA",
    "EPISODE_SCHEMA",
    "OBJECT_SCHEMA",
    "RELATION_SCHEMA",
    "SAMPLE_NAMESPACE",
    "sample_queries",
    "sample_records",
]

SAMPLE_NAMESPACE = "demo"

OBJECT_SCHEMA = "twinr_memory_object_record_v2"
CONFLICT_SCHEMA = "twinr_memory_conflict_record_v1"
EPISODE_SCHEMA = "twinr_midterm_episode_record_v1"
RELATION_SCHEMA = "twinr_graph_edge_record_v1"


@cache
def _read(name: str) -> str:
    return resources.files("ingest").joinpath("data", name).read_text(encoding="utf-8")


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in _read("sample_records.jsonl").splitlines() if line]


def sample_records(namespace: str = SAMPLE_NAMESPACE) -> list[Record]:
    """The sample household memory of `namespace`: ~300 records over five snapshot kinds.

    Deterministic: two calls with the same namespace return equal records in the same
    order. Every item id appears once; no record carries a vector.
    """
    return [Record.model_validate({**row, "namespace": namespace}) for row in _rows()]


def sample_queries() -> list[dict[str, str]]:
    """Example queries over `sample_records()`: scope ref, query text, expected best item."""
    queries: list[dict[str, str]] = json.loads(_read("sample_queries.json"))
    return queries
