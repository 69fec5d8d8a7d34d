"""`OpenSearchLexicalIndex.mirror_alias`: the native alias that mirrors the live pointer.

Only the OpenSearch adapter has aliases (tantivy has no equivalent), so this is not part
of the lexical port's conformance suite. Every index gets a prefix unique to this run and
is dropped afterwards.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opensearchpy import OpenSearch

from contracts.errors import ErrorCode, OrreryError
from contracts.names import live_alias_name
from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
from tests.conformance.corpus import CORPUS, HOSTILE_NAMESPACES, doc
from tests.conftest import require_server, run_tag

pytestmark = pytest.mark.servers


@dataclass
class AliasHarness:
    index: OpenSearchLexicalIndex
    client: OpenSearch
    prefix: str
    alias: str

    def name(self, generation_id: str) -> str:
        return f"{self.prefix}-{generation_id}"

    def holders(self) -> set[str]:
        """The indexes the alias points at, read straight from the engine."""
        answer = self.client.indices.get_alias(name=self.alias, ignore=[404])
        return {name for name in answer if name not in ("error", "status")}


@pytest.fixture
def aliases() -> Iterator[AliasHarness]:
    url = require_server("opensearch")
    prefix = f"orrery-test-{run_tag()}"
    harness = AliasHarness(
        index=OpenSearchLexicalIndex(url, index_prefix=prefix),
        client=OpenSearch(hosts=[url], timeout=10),
        prefix=prefix,
        alias=f"{prefix}-live",
    )
    for generation_id in ("g1", "g2"):
        harness.index.create(generation_id)
    try:
        yield harness
    finally:
        for generation_id in ("g1", "g2"):
            harness.index.drop(generation_id)
        harness.index.close()
        harness.client.close()


def test_alias_points_at_exactly_one_generation(aliases: AliasHarness) -> None:
    aliases.index.mirror_alias(aliases.alias, "g1")
    assert aliases.holders() == {aliases.name("g1")}
    aliases.index.mirror_alias(aliases.alias, "g2")
    assert aliases.holders() == {aliases.name("g2")}
    aliases.index.mirror_alias(aliases.alias, "g2")  # idempotent
    assert aliases.holders() == {aliases.name("g2")}


def test_outside_readers_search_the_aliased_generation(aliases: AliasHarness) -> None:
    aliases.index.apply("g1", CORPUS, [])
    aliases.index.apply("g2", [doc("only-in-g2", title="thermos")], [])
    for generation_id, expected in (("g1", len(CORPUS)), ("g2", 1), ("g1", len(CORPUS))):
        aliases.index.mirror_alias(aliases.alias, generation_id)
        assert aliases.client.count(index=aliases.alias)["count"] == expected


def test_alias_is_moved_atomically(aliases: AliasHarness) -> None:
    aliases.index.mirror_alias(aliases.alias, "g1")
    seen: list[set[str]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(aliases.holders())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for flip in range(20):
            aliases.index.mirror_alias(aliases.alias, ("g1", "g2")[flip % 2])
    finally:
        done.set()
        watcher.join()
    assert seen
    assert all(len(holders) == 1 for holders in seen), [h for h in seen if len(h) != 1][:3]


def test_alias_to_an_unknown_generation_changes_nothing(aliases: AliasHarness) -> None:
    aliases.index.mirror_alias(aliases.alias, "g1")
    with pytest.raises(OrreryError) as raised:
        aliases.index.mirror_alias(aliases.alias, f"missing-{uuid.uuid4().hex[:8]}")
    assert raised.value.code is ErrorCode.COVERAGE_UNAVAILABLE
    assert aliases.holders() == {aliases.name("g1")}


@pytest.mark.parametrize("alias", ["", "Upper", "with space", "star*", "_leading", "a,b"])
def test_invalid_alias_names_are_rejected(aliases: AliasHarness, alias: str) -> None:
    with pytest.raises(OrreryError) as raised:
        aliases.index.mirror_alias(alias, "g1")
    assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_an_alias_named_like_an_index_is_rejected(aliases: AliasHarness) -> None:
    with pytest.raises(OrreryError) as raised:
        aliases.index.mirror_alias(aliases.name("g2"), "g1")
    assert raised.value.code is ErrorCode.INVALID_REQUEST
    assert aliases.client.indices.exists(index=aliases.name("g2"))


def test_aliases_of_hostile_namespaces_are_valid_and_distinct(aliases: AliasHarness) -> None:
    aliases.index.apply("g1", CORPUS, [])
    # As `projector.bootstrap` names them for OpenSearch.
    names = {
        ns: live_alias_name(ns, "objects", aliases.prefix).lower()
        for ns in ("ns", *HOSTILE_NAMESPACES)
    }
    assert len(set(names.values())) == len(names)
    for ns, alias in names.items():
        aliases.index.mirror_alias(alias, "g1" if ns != "NS" else "g2")
    for ns, alias in names.items():
        answer = aliases.client.indices.get_alias(name=alias)
        assert set(answer) == {aliases.name("g1" if ns != "NS" else "g2")}, ns
        expected = len(CORPUS) if ns != "NS" else 0
        assert aliases.client.count(index=alias)["count"] == expected, ns
