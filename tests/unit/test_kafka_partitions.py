"""The relay hashes a batch's keys at once and must pick kafka-python's partitions.

`ingest.adapters.kafka_publisher` sends every event with an explicit partition computed
by `murmur2_many` (numpy, all keys of a length at once): a document's events must keep
going to the partition the default partitioner always chose (`murmur2(key) & 0x7fffffff`
modulo the partition count), or a relay upgrade would split a document's events over two
partitions and lose their order.
"""

from __future__ import annotations

import warnings
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.adapters.kafka_publisher import _partitions, murmur2_many

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from kafka.partitioner.default import DefaultPartitioner, murmur2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=40))
def test_murmur2_many_is_kafkas_murmur2(keys: list[bytes]) -> None:
    assert murmur2_many(keys).tolist() == [murmur2(key) for key in keys]


class _Cluster:
    """What `DefaultPartitioner` and `_partitions` read of the metadata."""

    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self._partitions = partitions

    def topics(self) -> set[str]:
        return set(self._partitions)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions[topic]

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions[topic]

    def partitions_for(self, topic: str) -> set[int]:  # the producer's method
        return self._partitions[topic]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(("a", "b")), st.uuids().map(lambda u: str(u).encode()))),
    st.sets(st.integers(0, 30), min_size=1, max_size=12),
    st.integers(1, 7),
)
def test_the_partitions_are_the_default_partitioners(
    events: list[tuple[str, bytes]], partitions: set[int], other: int
) -> None:
    cluster: Any = _Cluster({"a": partitions, "b": set(range(other))})
    topics = [topic for topic, _ in events]
    keys = [key for _, key in events]
    expected = [
        DefaultPartitioner().partition(topic, None, key, None, None, cluster)
        for topic, key in events
    ]
    assert _partitions(cluster, topics, keys) == expected
