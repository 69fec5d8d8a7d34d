"""Shard routing and per-copy evidence (issue 23): pure functions, no engine."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contracts.shards import copy_key, parse_copy_key, report_shards, shard_of, shard_report
from projector.adapters.opensearch_lexical import (
    default_routing_shards,
    murmur3_32,
    opensearch_shard,
)
from projector.generations import copy_evidence
from projector.ports import CopyRead


def test_murmur3_matches_the_reference_vectors() -> None:
    # MurmurHash3_x86_32 test vectors (seed 0), as Java's signed int.
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert murmur3_32(b"\xff\xff\xff\xff") == 0x76293B50
    assert murmur3_32(b"abc") == -1277324294  # 0xB3DD93FA


def test_default_routing_shards_leave_room_to_split_to_1024() -> None:
    assert [default_routing_shards(n) for n in (1, 2, 3, 4, 5)] == [1, 1024, 768, 1024, 640]


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=12))
def test_every_document_has_one_shard_in_range(document_id: str, shards: int) -> None:
    assert 0 <= shard_of(document_id, shards) < shards
    assert shard_of(document_id, shards) == shard_of(document_id, shards)
    routing = default_routing_shards(shards)
    assert 0 <= opensearch_shard(document_id, shards, routing) < shards


@given(st.integers(min_value=0, max_value=9999), st.integers(min_value=0, max_value=999))
def test_copy_keys_round_trip(shard: int, copy: int) -> None:
    assert parse_copy_key(copy_key(shard, copy)) == (shard, copy)


def test_parse_copy_key_refuses_other_names() -> None:
    assert parse_copy_key("s01c0") is None
    assert parse_copy_key("shard0") is None


def test_shard_report_collects_only_inside_the_block() -> None:
    report_shards("vector", {"shards": 3})
    with shard_report() as report:
        report_shards("vector", {"shards": 2})
    assert report == {"vector": {"shards": 2}}


def _split(expected: dict[str, int], shards: int) -> list[list[tuple[str, int]]]:
    out: list[list[tuple[str, int]]] = [[] for _ in range(shards)]
    for document_id, revision in expected.items():
        out[shard_of(document_id, shards)].append((document_id, revision))
    return out


@given(
    st.dictionaries(st.text(min_size=1, max_size=8), st.integers(1, 5), max_size=30),
    st.integers(min_value=1, max_value=4),
)
def test_exact_copies_match_and_cover_every_shard(expected: dict[str, int], shards: int) -> None:
    parts = _split(expected, shards)
    copies = [CopyRead(s, c, copy_key(s, c), list(parts[s])) for s in range(shards) for c in (0, 1)]
    evidence = copy_evidence("qdrant", expected, copies, lambda d: shard_of(d, shards))
    assert evidence.matches and evidence.document_count == len(expected)
    assert all(c.eligible for c in evidence.copies) and len(evidence.copies) == 2 * shards


def test_a_stale_copy_is_ineligible_and_its_twin_carries_the_shard() -> None:
    expected = {f"d{i}": 1 for i in range(40)}
    parts = _split(expected, 2)
    stale = [(d, r) for d, r in parts[0][1:]] + [(parts[0][0][0], 0)]
    copies = [
        CopyRead(0, 0, "s0c0", stale),
        CopyRead(0, 1, "s0c1", list(parts[0])),
        CopyRead(1, 0, "s1c0", list(parts[1])),
        CopyRead(1, 1, "s1c1", None, "peer down"),
    ]
    evidence = copy_evidence("qdrant", expected, copies, lambda d: shard_of(d, 2))
    assert evidence.matches
    verdicts = {c.key: c for c in evidence.copies}
    assert not verdicts["s0c0"].eligible and "1 at another revision" in verdicts["s0c0"].reason
    assert not verdicts["s1c1"].eligible and "peer down" in verdicts["s1c1"].reason
    assert verdicts["s0c1"].eligible and verdicts["s1c0"].eligible


def test_a_shard_without_an_eligible_copy_fails_the_engine() -> None:
    expected = {f"d{i}": 1 for i in range(40)}
    parts = _split(expected, 2)
    copies = [
        CopyRead(0, 0, "s0c0", list(parts[0])),
        CopyRead(1, 0, "s1c0", list(parts[1][1:])),
        CopyRead(1, 1, "s1c1", None, "peer down"),
    ]
    evidence = copy_evidence("qdrant", expected, copies, lambda d: shard_of(d, 2))
    assert not evidence.matches and evidence.missing_count == 1
