"""What the relay's Kafka publishers share, whichever client library they drive.

The wire format (read by the projector's Kafka event logs):

- topic: `contracts.events.topic_for` = `f"{topic_prefix}.{namespace_token(namespace)}"`,
  e.g. `orrery.records.demo`, created on first use with `partitions` partitions;
- key: the document id (UTF-8), so every event of a document goes to one partition and
  keeps its order there; the partition is Kafka's default for a key (murmur2 of the key,
  positive, modulo the partition count), the same for every client;
- value: the outbox row's `event_json` byte for byte, i.e. a `RecordChanged` JSON
  document, so outside readers see the contract event and nothing else;
- header `orrery-position`: the outbox position as ASCII decimal digits (and the
  write's trace context when it was traced);
- header `orrery-vector-f32` (`contracts.events.VECTOR_HEADER`), when the canonical
  store kept them: the record's vector as little-endian float32 bytes, which the
  projector reads instead of parsing the vector's decimals in the value.

No Kafka client is imported here, so a publisher loads only its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contracts.bootstrap_probe import unreachable
from contracts.events import POSITION_HEADER, TRACE_HEADER, VECTOR_HEADER
from ingest.relay_ports import OutboxRow

__all__ = ["KafkaPublisherSettings", "headers_of", "murmur2_many", "unreachable"]


@dataclass(frozen=True, slots=True)
class KafkaPublisherSettings:
    """How the relay talks to Kafka. Defaults are for production; tests shrink the timeouts.

    - `partitions` / `replication_factor`: for topics the relay creates (-1 = the
      broker's `default.replication.factor`). Existing topics are used as they are.
    - `ack_timeout_ms`: the longest one attempt waits for the broker's acknowledgement
      of a batch (it is also the producer's delivery timeout).
    - `attempts`, `backoff_*`: bounded retry of transient failures inside one `publish`
      (exponential backoff); after the last attempt `publish` raises.
    - `batch_size_bytes`: the producer's per-partition batch. kafka-python wakes its
      sender thread for every new batch, so 256 KiB batches publish ~1.7x more 1 KB
      events per second than the 16 KiB default.
    """

    bootstrap_servers: str
    topic_prefix: str = "orrery.records"
    partitions: int = 6
    replication_factor: int = -1
    linger_ms: int = 5
    batch_size_bytes: int = 262_144
    request_timeout_ms: int = 15_000
    ack_timeout_ms: int = 30_000
    bootstrap_timeout_ms: int = 10_000
    connect_timeout_s: float = 2.0
    attempts: int = 4
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    client_id: str = "orrery-relay"


_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """Kafka's murmur2 (the Java client's `Utils.murmur2`, seed 0x9747b28c) of each key,
    in numpy for all keys of one length at a time; equal to
    `kafka.partitioner.default.murmur2` for every input."""
    out = np.zeros(len(keys), dtype=np.uint64)
    by_length: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(index)
    m = np.uint64(_M)
    mask = np.uint64(_MASK)
    for length, indexes in by_length.items():
        data = np.frombuffer(b"".join(keys[i] for i in indexes), dtype=np.uint8)
        data = data.reshape(len(indexes), length).astype(np.uint64)
        h = np.full(len(indexes), (0x9747B28C ^ length) & _MASK, dtype=np.uint64)
        # 32-bit products in 64-bit lanes: exact, then masked back to 32 bits.
        for i in range(length // 4):
            k = (
                data[:, 4 * i]
                | (data[:, 4 * i + 1] << np.uint64(8))
                | (data[:, 4 * i + 2] << np.uint64(16))
                | (data[:, 4 * i + 3] << np.uint64(24))
            )
            k = (k * m) & mask
            k ^= k >> np.uint64(24)
            k = (k * m) & mask
            h = ((h * m) & mask) ^ k
        tail = length & ~3
        extra = length % 4
        if extra >= 3:
            h ^= data[:, tail + 2] << np.uint64(16)
        if extra >= 2:
            h ^= data[:, tail + 1] << np.uint64(8)
        if extra >= 1:
            h ^= data[:, tail]
            h = (h * m) & mask
        h ^= h >> np.uint64(13)
        h = (h * m) & mask
        h ^= h >> np.uint64(15)
        out[indexes] = h
    return out


def headers_of(row: OutboxRow) -> list[tuple[str, bytes]]:
    """The outbox position, the write's trace context when it was traced, and the
    vector's float32 bytes when the canonical store kept them."""
    headers = [(POSITION_HEADER, str(row.position).encode("ascii"))]
    if row.trace_context:
        headers.append((TRACE_HEADER, row.trace_context.encode("ascii")))
    if row.vector_f32:
        headers.append((VECTOR_HEADER, row.vector_f32))
    return headers
