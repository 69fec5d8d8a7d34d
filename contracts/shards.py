"""Where a document lives in a spread generation, and what a query learned about shards.

`shard_of(document_id, shards)` is the one routing function of Orrery's own sharding
(the Qdrant server layout: one shard key per copy, `copy_key(shard, copy)`): the first
8 bytes of sha256(document_id) as a big-endian integer, modulo the shard count. Stable
across processes and versions; the registry's pairs of a shard are those it selects.

`shard_report()` collects, for one request, what each source's adapter reports about
the shards it searched (`report_shards`): shards searched, the cap asked of each, the
copies searched and the copies bypassed and why — `QueryPlan.shards`. Stdlib only.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["copy_key", "parse_copy_key", "report_shards", "shard_of", "shard_report"]

_KEY = re.compile(r"^s(0|[1-9][0-9]{0,3})c(0|[1-9][0-9]{0,2})$")


def shard_of(document_id: str, shards: int) -> int:
    """The shard (0 … shards-1) that holds `document_id`."""
    if shards <= 1:
        return 0
    digest = hashlib.sha256(document_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def copy_key(shard: int, copy: int) -> str:
    """The name of copy `copy` of shard `shard` (a Qdrant shard key): `s{shard}c{copy}`."""
    return f"s{shard}c{copy}"


def parse_copy_key(key: str) -> tuple[int, int] | None:
    """`(shard, copy)` of a key made by `copy_key`, None for anything else."""
    match = _KEY.fullmatch(key)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


_REPORT: ContextVar[dict[str, dict[str, Any]] | None] = ContextVar(
    "orrery_shard_report", default=None
)
_ADD = threading.Lock()


@contextmanager
def shard_report() -> Iterator[dict[str, dict[str, Any]]]:
    """Collect in the returned dict, per source, what `report_shards` calls said during
    the block (the latest call of a source wins)."""
    report: dict[str, dict[str, Any]] = {}
    token = _REPORT.set(report)
    try:
        yield report
    finally:
        _REPORT.reset(token)


def report_shards(source: str, facts: dict[str, Any]) -> None:
    """Record `facts` for `source` in the current report, if one is open."""
    report = _REPORT.get()
    if report is not None:
        with _ADD:
            report[source] = facts
