"""Stored records a query answered with, kept per tenant for the next answers.

A record at `(document_id, revision)` never changes (`RecordReader`: revisions are never
rewritten; compaction removes only revisions no generation holds, and a restore runs
offline), so a copy read once is the store's answer for as long as it is kept: no
invalidation, never stale. Keeping them spares the store's read on the one-shot path —
the largest part of materializing a page (SciFact, SQLite: ~0.4-0.6 ms of ~0.7 for ten
records; parsing their JSON is the rest and still happens per answer, so no caller can
change a kept record).

Per tenant (`query.tenant_lru`): a record is kept under the namespace it belongs to and
only when that is the namespace that asked, so one tenant's answers never evict another's
records and a tenant is never answered from another's entries. Bounded by `max_bytes` of
memory per tenant (each record's JSON text and a fixed cost) and `max_tenants` tenants.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from query.ports import RecordReader, StoredRecord, answer_too_large
from query.tenant_lru import TenantLru

__all__ = ["DEFAULT_RECORD_CACHE_BYTES", "ENTRY_OVERHEAD_BYTES", "RecordCache"]

# Per tenant: ~2,300 SciFact records (~7 KB each kept); at most 16 tenants, so 256 MiB
# at worst over all of them.
DEFAULT_RECORD_CACHE_BYTES = 16 * 1024 * 1024
_MAX_TENANTS = 16
_MAX_ENTRIES = 100_000
# What a kept record costs beyond its JSON text's own size (`sys.getsizeof`: a text with
# one non-ASCII character takes 2-4 bytes a character): the model, its other strings and
# the LRU's entry (~1.7 KB measured with tracemalloc over 2,000 SciFact records).
ENTRY_OVERHEAD_BYTES = 2048

Key = tuple[str, int]


def _answer_bytes(record: StoredRecord) -> int:
    # What the readers count against `max_answer_bytes` (`len` of the JSON text).
    return len(record.record_json)


def _kept_bytes(record: StoredRecord) -> int:
    return sys.getsizeof(record.record_json) + ENTRY_OVERHEAD_BYTES


class RecordCache:
    """`fetch` through a per-tenant LRU of stored records (see the module).

    Guarantees: `fetch(reader, namespace, keys)` returns what `reader.fetch(keys)` would,
    including `413 answer_too_large` when the records returned pass `max_answer_bytes`
    (counted over kept and read records alike); a tenant holds at most `max_bytes` of
    record JSON and per-record cost. Thread-safe."""

    def __init__(
        self,
        *,
        max_answer_bytes: int,
        max_bytes: int = DEFAULT_RECORD_CACHE_BYTES,
        max_tenants: int = _MAX_TENANTS,
    ) -> None:
        self._max_answer_bytes = max_answer_bytes
        self._lru: TenantLru[Key, StoredRecord] = TenantLru(
            max_entries=_MAX_ENTRIES,
            max_bytes=max_bytes,
            max_tenants=max_tenants,
            size=_kept_bytes,
        )

    def fetch(
        self, reader: RecordReader, namespace: str, keys: Sequence[Key]
    ) -> dict[Key, StoredRecord]:
        """The stored records at `keys` (those that exist), kept ones first."""
        out: dict[Key, StoredRecord] = {}
        missing: list[Key] = []
        for key, record in zip(keys, self._lru.get_many(namespace, keys), strict=True):
            if record is None:
                missing.append(key)
            else:
                out[key] = record
        held = sum(map(_answer_bytes, out.values()))
        if held > self._max_answer_bytes:
            raise answer_too_large(self._max_answer_bytes)
        if missing:
            read = reader.fetch(missing)
            if held + sum(map(_answer_bytes, read.values())) > self._max_answer_bytes:
                raise answer_too_large(self._max_answer_bytes)
            for key, record in read.items():
                if record.namespace == namespace:
                    self._lru.put(namespace, key, record)
            out.update(read)
        return out

    def __len__(self) -> int:
        """Records kept, over all tenants."""
        return len(self._lru)
