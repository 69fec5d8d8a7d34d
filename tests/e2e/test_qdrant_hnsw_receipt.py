"""A spread generation searched through real HNSW graphs is qualified at the search
settings its receipt records, and only at those (issue 23).

Sessions 13-14 found that a 3-shard generation searched at the old ef (max(128, cap + 1)
per shard key) can never pass its receipt once its keys have HNSW graphs: vector
inclusion 0.94-0.97 against the 0.99 threshold at 100k documents. Session 15 found that
at the spread ef the receipt's status + visibility slice still fails (100k: mean 0.984,
min 0.71 at ef 1,010): Qdrant's filtered graph walk only steps on points the filter
keeps, and a condition on two fields keeps too few linked points to reach them all, at
any ef; ACORN (Qdrant >= 1.16) also steps over rejected neighbours. The other shard
tests never built a graph (160 documents, under Qdrant's indexing threshold: exact
search everywhere, every figure 1.0), so nothing caught either.

Here a private 3-peer cluster whose collections index from the first kilobyte
(`optimizers.indexing_threshold_kb` 1, `hnsw_index.full_scan_threshold_kb` 10: every
segment gets a graph, walked unless a filter keeps fewer than ~7 of its points) holds
6,000 documents with seeded random 384-d vectors — 2,000 per shard key, where HNSW (m 16,
ef_construct 100) at ef 128 finds ~0.97 of a key's exact top 101 (measured: mean 0.969,
min 0.88) and at ef 404 all of it — in one galaxy (the tenant slice selects every
point), with statuses and one or two visibility labels drawn so that a status +
visibility filter keeps 6-28 % of the points. The server runs with
`ORRERY_VECTOR_SPREAD_EF_FACTOR=1` first (the old rule): its receipt fails on vector
inclusion and promote answers 409.
Started again at the spread ef with ACORN off (`ORRERY_VECTOR_SPREAD_ACORN_SELECTIVITY=0`,
session 14's rule), the unfiltered slices pass and the status + visibility one fails;
with the defaults, the earlier receipts no longer vouch for the generation (other search
settings), a new one passes and promote succeeds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from contracts.vector_payload import (
    DEFAULT_HNSW_EF,
    DEFAULT_SPREAD_ACORN_SELECTIVITY,
    DEFAULT_SPREAD_EF_FACTOR,
)
from tests.e2e.qdrant_cluster import QdrantClusterDeployment, qdrant_cluster_deployment
from tests.e2e.test_shards import (
    DIM,
    KIND,
    NS,
    WORDS,
    ok,
)

pytestmark = [pytest.mark.servers, pytest.mark.slow]

DOCUMENTS = 6_000
SHARDS = 3
SAMPLE = 60
CAP = 100  # the default candidate depth: the receipt's vector cap
# Every new collection of the cluster gets HNSW graphs and searches them.
STORAGE = {
    "optimizers": {"indexing_threshold_kb": 1},
    # The least Qdrant takes through its API (~7 points): a filter keeping more of a
    # segment walks its graph. At 1 KB (under one vector) filtered walks found about half
    # of the exact top 100, ACORN or not.
    "hnsw_index": {"full_scan_threshold_kb": 10},
}


STATUSES = ("active", "archived", "draft")
STATUS_WEIGHTS = (0.5, 0.3, 0.2)
VISIBILITY = ("public", "staff", "family", "care", "household")


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
                "status": rng.choices(STATUSES, weights=STATUS_WEIGHTS)[0],
                "visibility": sorted(rng.sample(VISIBILITY, rng.randint(1, 2))),
                "updated_at": "2026-06-01T10:00:00Z",
            },
            "vector": [round(float(x), 6) for x in matrix[i]],
        }
        for i in range(DOCUMENTS)
    ]


@dataclass
class Deployment(QdrantClusterDeployment):
    spread: str = ""

    def collection_info(self, generation_id: str) -> dict[str, Any]:
        return dict(self.qdrant(f"/collections/{self.collection(generation_id)}"))

    def qualify(self) -> dict[str, Any]:
        body = ok(self.admin_post(f"/{self.spread}/qualify", {"sample_size": SAMPLE}))
        return dict(body["receipt"])


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    # First the old rule: each shard key searched at ef max(128, cap + 1).
    with qdrant_cluster_deployment(
        Deployment,
        tmp_path_factory,
        corpus(),
        name="qhnsw",
        storage=STORAGE,
        first_env={"ORRERY_VECTOR_SPREAD_EF_FACTOR": "1"},
    ) as deployed:
        deployed.spread = deployed.build(SHARDS, 0, timeout_s=600)
        wait_graphs(deployed, deployed.spread)
        yield deployed


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


def vector_plan(dep: Deployment, **filters: Any) -> dict[str, Any]:
    body = ok(
        dep.topk(
            dep.spread, query_text="amber basalt", filters=filters, include={"query_plan": True}
        )
    )
    return dict(body["query_plan"]["shards"]["vector"])


def slice_of(receipt: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in receipt["slices"] if s["slice"] == name)


ACORN_PERMILLE = round(DEFAULT_SPREAD_ACORN_SELECTIVITY * 1000)


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
        "vector_spread_acorn_permille": ACORN_PERMILLE,
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


def test_at_the_spread_ef_without_acorn_the_status_visibility_slice_fails(
    deployment: Deployment,
) -> None:
    deployment.restart(ORRERY_VECTOR_SPREAD_ACORN_SELECTIVITY="0")
    plan = vector_plan(deployment, status=["active"], visibility=["staff"])
    assert plan["hnsw_ef"] == DEFAULT_SPREAD_EF_FACTOR * (CAP + 1)
    assert plan["acorn_max_selectivity"] is None
    receipt = deployment.qualify()
    assert receipt["search"]["vector_spread_acorn_permille"] == 0
    assert not receipt["passed"]
    # The slices whose filter keeps every point pass at this ef; the conjunction of a
    # status and visibility labels misses documents however wide the graph walk.
    for name in ("unfiltered", "tenant"):
        vector = slice_of(receipt, name)["sources"]["vector"]
        assert vector["inclusion_min"] >= 0.95 and vector["inclusion_mean"] >= 0.99, vector
    filtered = slice_of(receipt, "status_visibility")["sources"]["vector"]
    assert filtered["inclusion_min"] < 0.95, filtered
    assert any(f.startswith("status_visibility: vector inclusion") for f in receipt["failures"])
    refused = deployment.admin_post(f"/{deployment.spread}/promote")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "qualification_failed"


def test_at_the_spread_settings_a_new_receipt_passes_and_only_it_lets_the_generation_be_promoted(
    deployment: Deployment,
) -> None:
    old = [
        r["receipt_id"]
        for r in ok(deployment.admin_get(f"/{deployment.spread}/receipts"))["receipts"]
    ]
    deployment.restart()  # the default ef factor and ACORN selectivity
    ef = DEFAULT_SPREAD_EF_FACTOR * (CAP + 1)
    assert vector_plan(deployment)["hnsw_ef"] == ef
    plan = vector_plan(deployment, status=["active"], visibility=["staff"])
    assert plan["acorn_max_selectivity"] == DEFAULT_SPREAD_ACORN_SELECTIVITY
    # The failed receipts were made with other settings: they say nothing about this
    # search.
    refused = deployment.admin_post(f"/{deployment.spread}/promote")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "qualification_required"
    assert error["details"]["stale_receipts"] == old
    receipt = deployment.qualify()
    assert receipt["search"]["vector_ef"] == ef
    assert receipt["search"]["vector_spread_acorn_permille"] == ACORN_PERMILLE
    assert receipt["passed"], receipt["failures"]
    assert slice_of(receipt, "status_visibility")["queries"] > 0
    figures = vector_figures(receipt)
    assert figures and all(f["inclusion_min"] >= 0.95 for f in figures)
    promoted = ok(deployment.admin_post(f"/{deployment.spread}/promote"))["report"]
    assert promoted["receipt_id"] == receipt["receipt_id"]
