"""A spread generation searched through real HNSW graphs is qualified at the HNSW ef its
receipt records, and only at that ef (issue 23).

Sessions 13-14 found that a 3-shard generation searched at the old ef (max(128, cap + 1)
per shard key) can never pass its receipt once its keys have HNSW graphs: vector
inclusion 0.94-0.97 against the 0.99 threshold at 100k documents. The other shard tests
never built a graph (160 documents, under Qdrant's indexing threshold: exact search
everywhere, every figure 1.0), so nothing caught it.

Here a private 3-peer cluster whose collections index from the first kilobyte
(`optimizers.indexing_threshold_kb` and `hnsw_index.full_scan_threshold_kb` 1: every
segment gets a graph and is searched through it, filtered or not) holds 6,000 documents
with seeded random 384-d vectors — 2,000 per shard key, where HNSW (m 16, ef_construct
100) at ef 128 finds ~0.97 of a key's exact top 101 (measured: mean 0.969, min 0.88) and
at ef 404 all of it. Every document has the same galaxy, status and visibility, so the
receipt's filtered slices select every point and search the same graphs as the
unfiltered one: this test is about the ef, not about Qdrant's filtered graph walk (forced
onto small selections by the 1 KB threshold, that misses more at any ef — a tenant of a
third of the points: inclusion mean 0.92, min 0.66 at ef 404; with the default threshold
such selections are searched exactly). The server runs with
`ORRERY_VECTOR_SPREAD_EF_FACTOR=1` first (the old rule): its receipt fails on vector
inclusion and promote answers 409; started again with the default factor, that receipt
no longer vouches for the generation (another ef), a new one passes and promote succeeds.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from contracts.vector_payload import DEFAULT_HNSW_EF, DEFAULT_SPREAD_EF_FACTOR
from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_shards import (
    ADMIN_KEY,
    DIM,
    KIND,
    NS,
    PROFILES,
    WORDS,
    ClusterDeployment,
    ok,
)
from tests.harness.servers import start_qdrant_cluster, stop_qdrant_cluster

pytestmark = [pytest.mark.servers, pytest.mark.slow]

DOCUMENTS = 6_000
SHARDS = 3
SAMPLE = 60
CAP = 100  # the default candidate depth: the receipt's vector cap
# Every new collection of the cluster gets HNSW graphs and searches them.
STORAGE = {
    "optimizers": {"indexing_threshold_kb": 1},
    "hnsw_index": {"full_scan_threshold_kb": 1},
}


def corpus() -> list[dict[str, Any]]:
    rng = random.Random(14)
    matrix = np.random.default_rng(14).standard_normal((DOCUMENTS, DIM))
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return [
        {
            "namespace": NS,
            "snapshot_kind": KIND,
            "item_id": f"doc-{i:05d}",
            "galaxy": "north",
            "revision": 1,
            "payload": {"n": i},
            "text": {
                "title": " ".join(rng.sample(WORDS, 3)),
                "body": " ".join(rng.choices(WORDS, k=rng.randint(4, 12))),
            },
            "metadata": {
                "status": "active",
                "visibility": ["public"],
                "updated_at": "2026-06-01T10:00:00Z",
            },
            "vector": [round(float(x), 6) for x in matrix[i]],
        }
        for i in range(DOCUMENTS)
    ]


@dataclass
class Deployment(ClusterDeployment):
    env: dict[str, str]

    def collection_info(self, generation_id: str) -> dict[str, Any]:
        response = httpx.get(
            f"{self.cluster['url']}/collections/{self.prefix}-{generation_id}", timeout=30
        )
        response.raise_for_status()
        return dict(response.json()["result"])

    def restart(self, **env: str) -> None:
        self.server.stop()
        self.server = start_server(self.data_dir, env={**self.env, **env})

    def qualify(self) -> dict[str, Any]:
        body = ok(self.admin_post(f"/{self.spread}/qualify", {"sample_size": SAMPLE}))
        return dict(body["receipt"])

    spread: str = ""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    from tests.e2e.test_servers_http import server_env

    for name in ("kafka", "opensearch", "redis"):
        require_server(name)
    cluster_dir = Path(tempfile.mkdtemp(prefix="orrery-qhnsw-", dir="/tmp"))
    deployed: Deployment | None = None
    server: Server | None = None
    try:
        cluster = start_qdrant_cluster(cluster_dir, 3, timeout_s=180, storage=STORAGE)
        tag = run_tag()
        data_dir = tmp_path_factory.mktemp("qhnsw") / "data"
        env = server_env(
            tag,
            database=False,
            ORRERY_QDRANT_URL=cluster["url"],
            ORRERY_ADMIN_KEY=ADMIN_KEY,
            ORRERY_QUALIFY_PROFILES=",".join(PROFILES),
            ORRERY_CACHE_RESPONSES="false",
        )
        # First the old rule: each shard key searched at ef max(128, cap + 1).
        server = start_server(data_dir, env={**env, "ORRERY_VECTOR_SPREAD_EF_FACTOR": "1"})
        records = corpus()
        for start in range(0, len(records), 500):
            assert server.post_records(records[start : start + 500]).status_code == 200
        server.wait_projected(timeout=300, documents={(NS, KIND): DOCUMENTS})
        ready = server.client.get("/v1/readiness").json()
        first = next(s["generation_id"] for s in ready["scopes"] if s["namespace"] == NS)
        deployed = Deployment(
            server, cluster, cluster_dir, f"orrery-test-{tag}", data_dir, first, env
        )
        deployed.spread = deployed.build(SHARDS, 0, timeout_s=600)
        wait_graphs(deployed, deployed.spread)
        yield deployed
    finally:
        last = deployed.server if deployed is not None else server
        if last is not None and last.process.poll() is None:
            last.stop()
        stop_qdrant_cluster(cluster_dir)
        shutil.rmtree(cluster_dir, ignore_errors=True)


def wait_graphs(dep: Deployment, generation_id: str) -> None:
    """Until every point of the generation is in an HNSW graph and the optimizers are
    idle, twice in a row (an optimizer starts a moment after the last write)."""
    deadline = time.monotonic() + 600
    steady = 0
    while steady < 2:
        info = dep.collection_info(generation_id)
        done = (
            info["status"] == "green"
            and str(info["optimizer_status"]) == "ok"
            and info["points_count"] == DOCUMENTS
            and info["indexed_vectors_count"] == DOCUMENTS
        )
        steady = steady + 1 if done else 0
        assert time.monotonic() < deadline, info
        time.sleep(1)


def vector_plan(dep: Deployment) -> dict[str, Any]:
    body = ok(dep.topk(dep.spread, query_text="amber basalt", include={"query_plan": True}))
    return dict(body["query_plan"]["shards"]["vector"])


def vector_figures(receipt: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        s["sources"]["vector"]
        for s in receipt["slices"]
        if s["queries"] and s["sources"].get("vector", {}).get("inclusion_mean") is not None
    ]


# -- tests ----------------------------------------------------------------------------------


def test_every_shard_key_is_searched_through_an_hnsw_graph(deployment: Deployment) -> None:
    info = deployment.collection_info(deployment.spread)
    assert info["indexed_vectors_count"] == info["points_count"] == DOCUMENTS
    assert info["config"]["params"]["sharding_method"] == "custom"
    plan = vector_plan(deployment)
    assert plan["shards"] == SHARDS and len(plan["searched"]) == SHARDS
    assert plan["hnsw_ef"] == max(DEFAULT_HNSW_EF, CAP + 1)


def test_at_the_old_ef_the_receipt_fails_on_vector_inclusion_and_promote_answers_409(
    deployment: Deployment,
) -> None:
    receipt = deployment.qualify()
    assert receipt["search"] == {
        "vector_hnsw_ef": DEFAULT_HNSW_EF,
        "vector_spread_ef_factor": 1,
        "vector_ef": max(DEFAULT_HNSW_EF, CAP + 1),
    }
    assert not receipt["passed"]
    assert any("vector inclusion" in f for f in receipt["failures"]), receipt["failures"]
    # HNSW missed some of the exact top 100; lexical search (exact) missed nothing.
    assert min(f["inclusion_mean"] for f in vector_figures(receipt)) < 0.99
    for figures in receipt["slices"]:
        lexical = figures["sources"].get("lexical", {})
        assert lexical.get("inclusion_min") in (None, 1.0), figures
    refused = deployment.admin_post(f"/{deployment.spread}/promote")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "qualification_failed"
    assert error["details"]["receipt_id"] == receipt["receipt_id"]


def test_at_the_spread_ef_a_new_receipt_passes_and_only_it_lets_the_generation_be_promoted(
    deployment: Deployment,
) -> None:
    old = [
        r["receipt_id"]
        for r in ok(deployment.admin_get(f"/{deployment.spread}/receipts"))["receipts"]
    ]
    deployment.restart()  # the default ORRERY_VECTOR_SPREAD_EF_FACTOR
    ef = DEFAULT_SPREAD_EF_FACTOR * (CAP + 1)
    assert vector_plan(deployment)["hnsw_ef"] == ef
    # The failed receipt was made at another ef: it says nothing about this search.
    refused = deployment.admin_post(f"/{deployment.spread}/promote")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "qualification_required"
    assert error["details"]["stale_receipts"] == old
    receipt = deployment.qualify()
    assert receipt["search"]["vector_ef"] == ef
    assert receipt["passed"], receipt["failures"]
    figures = vector_figures(receipt)
    assert figures and all(f["inclusion_min"] >= 0.95 for f in figures)
    promoted = ok(deployment.admin_post(f"/{deployment.spread}/promote"))["report"]
    assert promoted["receipt_id"] == receipt["receipt_id"]
