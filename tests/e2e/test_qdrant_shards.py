"""Sharded, replicated vector generations on a real 3-peer Qdrant cluster (issue 23).

One private cluster (`tests/harness/servers.py`: three peers on loopback, peer 1 the one
Orrery talks to) and one server-mode `orrery serve` over it (Kafka, OpenSearch, Redis
from the shared harness; the registry in SQLite under its data dir, so the test can run
a qualification in-process with a test-only vector source and store its receipt).

The projector's first generation of the scope is the N=1 reference; a 3-shard,
1-replica generation keeps one shard key per copy (`s{shard}c{copy}`, copy c of shard s
on peer (s + c) mod 3 of the peers sorted by id). The tests run in file order: the
spread generation is compared, refused with a bad receipt, qualified and promoted, one
copy is made stale and repaired, then peers are stopped.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from contracts.index import Candidate, SearchFilter
from contracts.qualification import QualificationReceipt, QualifyRequest
from contracts.records import derive_document_id
from contracts.shards import copy_key, shard_of
from tests.conftest import require_server
from tests.e2e.conftest import start_server
from tests.e2e.qdrant_cluster import QdrantClusterDeployment, qdrant_cluster_deployment
from tests.e2e.test_shards import (
    KIND,
    MARKER,
    NS,
    PROFILES,
    corpus,
    in_process_qualifier,
    ok,
)
from tests.harness.servers import stop_qdrant_peer

pytestmark = [pytest.mark.servers, pytest.mark.slow]

SHARDS = 3


@dataclass
class Deployment(QdrantClusterDeployment):
    """Over a 3-peer Qdrant cluster."""

    def copies(self) -> dict[str, dict[str, Any]]:
        """The live scope's per-copy eligibility, as readiness shows it."""
        ready = self.server.client.get("/v1/readiness").json()
        scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
        listed = scope.get("eligibility", {}).get("copies", [])
        return {c["key"]: c for c in listed if c["engine"] == "qdrant"}

    def wait_copies(self, want: Callable[[dict[str, dict[str, Any]]], bool]) -> None:
        deadline = time.monotonic() + 120
        while not want(seen := self.copies()):
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with qdrant_cluster_deployment(
        Deployment,
        tmp_path_factory,
        corpus(),
        name="qshards",
        # Every 2 s, unchanged or not: the tests time how soon a copy's change is seen.
        env={
            "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "2",
            "ORRERY_ELIGIBILITY_MAX_INTERVAL_SECONDS": "2",
        },
        project_timeout_s=180,
    ) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def spread(deployment: Deployment) -> str:
    """A generation of 3 shards with one replica each, verified (not promoted yet)."""
    return deployment.build(SHARDS, 1)


def _queries() -> list[str]:
    rng = random.Random(5)
    return [r["text"]["title"] for r in rng.sample(corpus(), 6)] + [f"{MARKER} marker"]


SLICES: list[dict[str, Any]] = [
    {},
    {"galaxy": "north"},
    {"status": ["active"], "visibility": ["public"]},
]


def answers(dep: Deployment, generation_id: str | None) -> list[list[tuple[str, float]]]:
    out = []
    for text in _queries():
        for filters in SLICES:
            for profile in PROFILES:
                body = ok(
                    dep.topk(
                        generation_id,
                        query_text=text,
                        result_limit=10,
                        filters=filters,
                        profile=profile,
                        include={"query_plan": True},
                    )
                )
                assert body["query_plan"]["cache"] != "hit"
                out.append([(r["document_id"], r["score"]) for r in body["results"]])
    return out


def assert_same(one: list[list[tuple[str, float]]], other: list[list[tuple[str, float]]]) -> None:
    """Same ids in the same order, scores equal to a relative 1e-6. Answers carry six
    decimals and float32 cosines computed in other segments (another copy) may round to
    a neighbouring last digit, so one unit there is allowed too."""
    assert len(one) == len(other)
    for a, b in zip(one, other, strict=True):
        assert [d for d, _ in b] == [d for d, _ in a]
        for (_, x), (_, y) in zip(a, b, strict=True):
            assert y == pytest.approx(x, rel=1e-6, abs=1.01e-6)


def plan_of(dep: Deployment, generation_id: str | None = None) -> dict[str, Any]:
    body = ok(dep.topk(generation_id, query_text="amber basalt", include={"query_plan": True}))
    return dict(body["query_plan"])


# -- tests ----------------------------------------------------------------------------------


def test_one_shard_key_per_copy_on_distinct_peers(deployment: Deployment, spread: str) -> None:
    info = deployment.qdrant(f"/collections/{deployment.collection(spread)}/cluster")
    where: dict[str, int] = {s["shard_key"]: info["peer_id"] for s in info["local_shards"]}
    where.update({s["shard_key"]: s["peer_id"] for s in info["remote_shards"]})
    assert set(where) == {copy_key(s, c) for s in range(SHARDS) for c in range(2)}
    for shard in range(SHARDS):
        assert where[copy_key(shard, 0)] != where[copy_key(shard, 1)]
    assert len(set(where.values())) == 3
    # Every copy holds exactly its shard's documents.
    for shard in range(SHARDS):
        expected = sum(1 for r in corpus() if shard_of(_doc_id(r), SHARDS) == shard)
        for copy in range(2):
            counted = httpx.post(
                f"{deployment.cluster['url']}/collections/{deployment.collection(spread)}"
                "/points/count",
                json={"exact": True, "shard_key": copy_key(shard, copy)},
                timeout=10,
            ).json()["result"]["count"]
            assert counted == expected, (shard, copy)


def _doc_id(record: dict[str, Any]) -> str:
    return derive_document_id(
        record["namespace"], record["snapshot_kind"], record["item_id"], record["galaxy"]
    )


def test_three_shards_answer_exactly_what_one_shard_does(
    deployment: Deployment, spread: str
) -> None:
    one, three = answers(deployment, deployment.first), answers(deployment, spread)
    assert_same(one, three)
    assert sum(len(a) for a in one) > 300
    vector = plan_of(deployment, spread)["shards"]["vector"]
    assert vector["shards"] == SHARDS and vector["copies"] == 2
    assert sorted(int(k[1]) for k in vector["searched"]) == list(range(SHARDS))
    assert vector["bypassed"] == [] and vector["cap"] >= 10
    assert "vector" not in plan_of(deployment, deployment.first)["shards"]


# -- in-process qualification with a test-only vector source --------------------------------


def per_shard_cap(client: Any, prefix: str) -> Any:
    """TEST ONLY — a vector cap too small for N shards: each shard is asked for
    cap // N candidates by itself and the lists merged by score, as if the cap were
    spread evenly over the shards."""
    from contracts.vector_payload import RETURNED_FIELDS, VECTOR_NAME, best_first, candidate_of
    from query.adapters.qdrant_vectors import QdrantServerVectorSearch, qdrant_filter

    class PerShardCap(QdrantServerVectorSearch):
        def search(
            self, generation_id: str, vector: Sequence[float], filter: SearchFilter, limit: int
        ) -> list[Candidate]:
            found: list[Candidate] = []
            for shard in range(SHARDS):
                points = client.query_points(
                    f"{prefix}-{generation_id}",
                    query=list(vector),
                    using=VECTOR_NAME,
                    query_filter=qdrant_filter(filter),
                    limit=max(1, limit // SHARDS),
                    with_payload=list(RETURNED_FIELDS),
                    shard_key_selector=copy_key(shard, 0),
                ).points
                found += [candidate_of(p.payload or {}, p.score) for p in points]
            return best_first(found, limit)

    return PerShardCap(client, collection_prefix=prefix)


def qualify_in_process(
    dep: Deployment, generation_id: str, vectors: Any, request: QualifyRequest
) -> QualificationReceipt:
    """A qualification run in this process with `vectors(qdrant, prefix)` as the
    production vector source; its receipt stored in the server's registry."""
    with in_process_qualifier(
        dep.data_dir,
        dep.prefix,
        opensearch_url=require_server("opensearch"),
        qdrant_url=dep.cluster["url"],
    ) as run:
        return run(
            generation_id,
            lambda ports, qdrant: replace(ports, vectors=vectors(qdrant, dep.prefix)),
            request,
        )


def test_a_vector_cap_too_small_for_the_shards_fails_inclusion_and_promote_answers_409(
    deployment: Deployment, spread: str
) -> None:
    receipt = qualify_in_process(deployment, spread, per_shard_cap, QualifyRequest(sample_size=24))
    assert not receipt.passed
    assert any("inclusion" in failure for failure in receipt.failures), receipt.failures
    worst = min(
        s.sources["vector"].inclusion_min
        for s in receipt.slices
        if s.queries and "vector" in s.sources
    )
    assert worst is not None and worst < 0.95
    refused = deployment.admin_post(f"/{spread}/promote")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "qualification_failed"
    assert error["details"]["receipt_id"] == receipt.receipt_id


def test_qualified_and_promoted_readiness_shows_every_copy_eligible(
    deployment: Deployment, spread: str
) -> None:
    receipt = ok(deployment.admin_post(f"/{spread}/qualify", {"sample_size": 24}))["receipt"]
    assert receipt["passed"], receipt["failures"]
    for figures in receipt["slices"]:
        for source in figures["sources"].values():
            assert source["inclusion_min"] in (None, 1.0), figures
    ok(deployment.admin_post(f"/{spread}/promote"))
    deployment.wait_copies(
        lambda c: len(c) == 2 * SHARDS and all(x["eligible"] for x in c.values())
    )
    assert ok(deployment.topk(query_text="amber"))["generation_id"] == spread


def test_a_stale_copy_is_bypassed_and_answers_stay_the_same(
    deployment: Deployment, spread: str
) -> None:
    from qdrant_client import QdrantClient, models

    from contracts.vector_payload import point_id

    before = answers(deployment, None)
    victim = next(_doc_id(r) for r in corpus() if shard_of(_doc_id(r), SHARDS) == 0)
    stale, good = copy_key(0, 0), copy_key(0, 1)
    client = QdrantClient(url=deployment.cluster["url"], check_compatibility=False)
    collection = deployment.collection(spread)
    try:
        kept = client.retrieve(
            collection,
            [str(point_id(victim))],
            with_payload=True,
            with_vectors=True,
            shard_key_selector=good,
        )
        assert len(kept) == 1
        client.delete(
            collection,
            models.PointIdsList(points=[str(point_id(victim))]),
            shard_key_selector=stale,
            wait=True,
        )
        deployment.wait_copies(lambda c: c.get(stale, {}).get("eligible") is False)
        shown = deployment.copies()
        assert "1 missing" in shown[stale]["reason"], shown[stale]
        assert all(c["eligible"] for k, c in shown.items() if k != stale)
        assert_same(before, answers(deployment, None))
        bypassed = plan_of(deployment)["shards"]["vector"]["bypassed"]
        assert [b["copy"] for b in bypassed] == [stale]
        assert "ineligible" in bypassed[0]["reason"]
    finally:
        # Repaired from the good copy, so the peer tests start from six eligible copies.
        point = kept[0]
        client.upsert(
            collection,
            [models.PointStruct(id=point.id, vector=point.vector, payload=point.payload)],
            shard_key_selector=stale,
            wait=True,
        )
        client.close()
    deployment.wait_copies(lambda c: all(x["eligible"] for x in c.values()))
    assert plan_of(deployment)["shards"]["vector"]["bypassed"] == []


def _changes(start: int) -> list[dict[str, Any]]:
    """Revision 2 of 20 documents of the corpus and 20 new documents."""
    base = corpus()
    updated = [
        {**r, "revision": 2, "payload": {"n": i, "updated": True}}
        for i, r in enumerate(base[start : start + 20], start)
    ]
    added = [
        {**r, "item_id": f"new-{start + i:03d}", "payload": {"n": 1000 + start + i}}
        for i, r in enumerate(base[start + 80 : start + 100])
    ]
    return updated + added


def _copy_pairs(dep: Deployment, generation_id: str, key: str) -> list[tuple[str, int]]:
    pairs: list[tuple[str, int]] = []
    offset: Any = None
    while True:
        body: dict[str, Any] = {
            "limit": 500,
            "with_payload": ["document_id", "revision"],
            "shard_key": key,
        }
        if offset is not None:
            body["offset"] = offset
        response = httpx.post(
            f"{dep.cluster['url']}/collections/{dep.collection(generation_id)}/points/scroll",
            json=body,
            timeout=30,
        )
        response.raise_for_status()
        result = response.json()["result"]
        pairs += [(p["payload"]["document_id"], p["payload"]["revision"]) for p in result["points"]]
        offset = result.get("next_page_offset")
        if offset is None:
            return pairs


def test_a_projector_killed_mid_batch_loses_and_duplicates_nothing_in_any_copy(
    deployment: Deployment, spread: str
) -> None:
    """The live generation is the 3-shard one: the projector dies between its two
    engines' writes, then after both and before its commit; after a restart every copy
    of every shard holds exactly the canonical store's pairs of that shard, once."""
    from contracts.faults import CRASH_ENV
    from tests.e2e.conftest import canonical_heads
    from tests.e2e.test_crash_points import post_until_crash

    dep = deployment
    dep.server.stop()
    for start, point in ((0, "projector.lexical_applied"), (20, "projector.engines_written")):
        crashing = start_server(dep.data_dir, env={**dep.env, CRASH_ENV: point})
        post_until_crash(crashing, _changes(start))
    dep.server = start_server(dep.data_dir, env=dep.env)
    # The second batch's answer may have been lost with the process: sent again.
    again = dep.server.post_records(_changes(20))
    assert again.status_code in (200, 409), again.text[:500]
    dep.server.wait_projected(timeout=180, documents={(NS, KIND): 200})
    heads = dict(canonical_heads(dep.data_dir, NS, KIND))
    assert len(heads) == 200 and sum(1 for r in heads.values() if r == 2) == 40
    for shard in range(SHARDS):
        expected = {d: r for d, r in heads.items() if shard_of(d, SHARDS) == shard}
        for copy in range(2):
            pairs = _copy_pairs(dep, spread, copy_key(shard, copy))
            assert len(pairs) == len({d for d, _ in pairs}), (shard, copy)
            assert dict(pairs) == expected, (shard, copy)
    dep.wait_copies(
        lambda c: (
            len(c) == 2 * SHARDS
            and all(x["eligible"] for x in c.values())
            and all(x["reason"] == "" for x in c.values())
        )
    )


def _peer_ids(dep: Deployment) -> dict[int, int]:
    """Harness peer index -> Qdrant peer id (matched by P2P port)."""
    status = dep.qdrant("/cluster")
    by_port = {
        int(p["uri"].rstrip("/").rsplit(":", 1)[1]): int(i) for i, p in status["peers"].items()
    }
    out = {}
    for index in (1, 2, 3):
        config = json.loads((dep.cluster_dir / f"qdrant-{index}" / "config.yaml").read_text())
        out[index] = by_port[config["cluster"]["p2p"]["port"]]
    return out


def test_one_peer_down_changes_no_answer_two_down_fail_naming_the_shard(
    deployment: Deployment, spread: str
) -> None:
    before = answers(deployment, None)
    peers = _peer_ids(deployment)
    ordered = sorted(peers.values())
    assert stop_qdrant_peer(deployment.cluster_dir, 3)
    assert_same(before, answers(deployment, None))
    on_three = {
        copy_key(s, c) for s in range(SHARDS) for c in range(2) if ordered[(s + c) % 3] == peers[3]
    }
    # Once the gate read every copy back, all of peer 3's are ineligible and bypassed.
    deployment.wait_copies(lambda c: {k for k, x in c.items() if not x["eligible"]} == on_three)
    bypassed = plan_of(deployment)["shards"]["vector"]["bypassed"]
    assert {b["copy"] for b in bypassed} == on_three
    assert_same(before, answers(deployment, None))
    # The second peer down: the shard whose two copies lived on peers 2 and 3 is gone.
    lost = next(
        s for s in range(SHARDS) if {ordered[s % 3], ordered[(s + 1) % 3]} == {peers[2], peers[3]}
    )
    assert stop_qdrant_peer(deployment.cluster_dir, 2)
    for text in _queries():
        response = deployment.topk(query_text=text)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "coverage_unavailable", error
        assert error["details"]["shard"] == lost, error
