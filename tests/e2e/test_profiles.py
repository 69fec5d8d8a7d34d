"""Fusion profiles, request overrides and deadlines over HTTP against real `orrery serve`
processes (embedded, and one server-mode case), plus the quality bench end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.topk import Ranking
from query.profiles import ProfileRegistry, derive_profile
from query.settings import QuerySettings
from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_embedded_http import CORPUS, NS, SCOPE
from tests.e2e.test_servers_http import EXPECTED, server_env

REPO = Path(__file__).resolve().parents[2]
TINY_BEIR = REPO / "tests" / "data" / "beir-tiny"
DEFAULT = QuerySettings.model_fields["default_profile"].default
OPERATOR_PROFILES = [
    {
        "kind": "weighted",
        "id": "lexical-only@1",
        "lexical_weight": 1.0,
        "vector_weight": 0.0,
        "lexical_depth": 5,
    },
    {"kind": "rrf", "id": "wide-rrf@1", "rrf_k": 10, "rank_window": 300, "vector_depth": 300},
]
QUERY = {"namespace": NS, "scope_ref": SCOPE, "query_text": "spare house keys", "result_limit": 3}
TOPK = "/v1/external/retrieve/topk_records"
RETRIEVE = "/v1/external/retrieve"


def request_for(path: str, **fields: Any) -> dict[str, Any]:
    """QUERY shaped for `path` (the generic API calls `result_limit` `limit`)."""
    body = {**QUERY, **fields}
    if path == RETRIEVE:
        body["limit"] = body.pop("result_limit")
    return body


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("profiles") / "data",
        env={"ORRERY_PROFILES": json.dumps(OPERATOR_PROFILES)},
    )
    try:
        assert srv.post_records(CORPUS).status_code == 200
        srv.wait_projected(documents=EXPECTED)
        yield srv
    finally:
        srv.stop()


def plan_of(body: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = body["query_plan"]
    assert plan["profile"] == body["profile"]
    return plan


def test_default_profile_is_named_with_depths(profiled: Server) -> None:
    body = profiled.topk(**QUERY).json()
    assert body["profile"] == DEFAULT
    plan = plan_of(body)
    assert plan["candidate_depths"] == {"lexical": 100, "vector": 100}
    assert plan["candidate_depth"] == 100
    assert plan["source_counts"]["lexical"] >= 1 and plan["source_counts"]["vector"] >= 1
    assert plan["candidate_count"] == plan["reranked_count"] >= len(body["results"])
    assert body["results"][0]["item_id"] == "fact:keys"


def test_rescoring_profile_fills_missing_components(profiled: Server) -> None:
    body = profiled.topk(**{**QUERY, "result_limit": 7}, profile="weighted@2").json()
    plan = plan_of(body)
    assert body["profile"] == "weighted@2"
    # Vector search returns every document of this tiny corpus, lexical only a few: the
    # vector-only ones were looked up in the lexical index by id.
    assert plan["rescored_count"] > 0
    assert plan["candidate_count"] == len(CORPUS)
    scores = [r["score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)


def test_rrf_profile_selected_by_request(profiled: Server) -> None:
    body = profiled.topk(**QUERY, profile="rrf@1").json()
    assert body["profile"] == "rrf@1"
    first = body["results"][0]
    assert first["item_id"] == "fact:keys"
    breakdown = first["score_breakdown"]
    assert breakdown["freshness"] == 0.0 and breakdown["metadata"] == 0.0
    assert 0.0 < first["score"] <= 1.0
    assert breakdown["lexical"] == pytest.approx(1.0)  # rank 1 in BM25: (k+1)/(k+1)


def test_weighted_1_stays_available(profiled: Server) -> None:
    body = profiled.topk(**QUERY, profile="weighted@1").json()
    assert body["profile"] == "weighted@1" and plan_of(body)["rescored_count"] == 0
    assert body["results"][0]["item_id"] == "fact:keys"


@pytest.mark.parametrize("profile", ["weighted@3", "rrf@2"])
def test_combined_text_profiles_find_word_forms(profiled: Server, profile: str) -> None:
    # No exact word of "hanging key" is in the corpus: the stemmed text field has hang, key.
    body = profiled.topk(
        **{**QUERY, "query_text": "hanging key"}, profile=profile, ranking={"vector_weight": 0}
    ).json()
    assert body["profile"].startswith(f"{profile}+w:")
    assert "vector" not in plan_of(body)["indexes_used"]
    assert [r["item_id"] for r in body["results"]] == ["fact:keys"]
    assert body["results"][0]["score_breakdown"]["lexical"] > 0.0


def test_operator_profiles_from_config(profiled: Server) -> None:
    lexical = profiled.topk(**QUERY, profile="lexical-only@1").json()
    plan = plan_of(lexical)
    assert "vector" not in plan["indexes_used"]
    assert plan["candidate_depths"]["lexical"] == 5 and plan["source_counts"]["vector"] == 0
    wide = profiled.topk(**QUERY, profile="wide-rrf@1").json()
    # rank_window 300: both sources are read that deep, so every rank in it is known.
    assert plan_of(wide)["candidate_depths"] == {"lexical": 300, "vector": 300}


def test_request_weights_derive_a_stable_profile_id(profiled: Server) -> None:
    override = {"vector_weight": 0.5, "freshness_weight": 0.0}
    first = profiled.topk(**QUERY, ranking=override).json()
    second = profiled.topk(**QUERY, ranking=override, client_request_id="again").json()
    expected = derive_profile(ProfileRegistry().get(DEFAULT), override).id
    assert first["profile"] == second["profile"] == expected
    assert expected.startswith(f"{DEFAULT}+w:")
    assert plan_of(second)["cache"] == "hit"
    # Weights equal to the profile's change nothing: the base id is named.
    base = ProfileRegistry().get(DEFAULT)
    same = {"lexical_weight": base.lexical_weight, "vector_weight": base.vector_weight}
    assert profiled.topk(**QUERY, ranking=same).json()["profile"] == DEFAULT
    rrf = profiled.topk(**QUERY, profile="rrf@1", ranking={"vector_weight": 0}).json()
    assert rrf["profile"].startswith("rrf@1+w:")
    assert "vector" not in plan_of(rrf)["indexes_used"]


def test_cache_binds_the_profile(profiled: Server) -> None:
    body = {**QUERY, "query_text": "reading glasses nightstand"}
    answers = [profiled.topk(**body, profile=p).json() for p in ("rrf@1", "weighted@1", "rrf@1")]
    assert [a["profile"] for a in answers] == ["rrf@1", "weighted@1", "rrf@1"]
    assert [plan_of(a)["cache"] for a in answers] == ["miss", "miss", "hit"]
    assert answers[0]["results"] != answers[1]["results"]  # different scores


@pytest.mark.parametrize("path", [TOPK, RETRIEVE])
def test_unknown_profile_is_refused(profiled: Server, path: str) -> None:
    response = profiled.client.post(path, json=request_for(path, profile="weighted@99"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "unknown_profile"
    assert "weighted@99" in error["message"]
    assert {"rrf@1", "weighted@1", "lexical-only@1"} <= set(error["details"]["known"])


def test_rrf_refuses_freshness_weight(profiled: Server) -> None:
    response = profiled.topk(**QUERY, profile="rrf@1", ranking={"freshness_weight": 0.2})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_generic_retrieve_names_the_profile(profiled: Server) -> None:
    body = profiled.client.post(
        RETRIEVE, json=request_for(RETRIEVE, profile="rrf@1", result_limit=2)
    ).json()
    assert body["profile"] == "rrf@1" and body["query_plan"]["profile"] == "rrf@1"
    assert len(body["candidates"]) == 2


@pytest.mark.parametrize("path", [TOPK, RETRIEVE])
def test_deadline_exceeded_carries_the_plan_so_far(profiled: Server, path: str) -> None:
    body = request_for(path, query_text="a fresh text", timeout_seconds=0.000001, profile="rrf@1")
    response = profiled.client.post(path, json=body)
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded"
    details = error["details"]
    assert details["stage"] == "scope_resolve" and details["timeout_seconds"] == 0.000001
    plan = details["query_plan"]
    assert plan["profile"] == "rrf@1"
    assert plan["generation_id"].startswith("g")
    assert plan["candidate_depths"] == {"lexical": 100, "vector": 100}
    assert plan["latency_ms"]["total"] > 0.0
    assert "results" not in response.json()


def test_zero_timeout_is_invalid(profiled: Server) -> None:
    response = profiled.topk(**QUERY, timeout_seconds=0)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_bad_profile_config_stops_startup(tmp_path: Path) -> None:
    redefined = [{"kind": "rrf", "id": "rrf@1", "rrf_k": 5}]
    with pytest.raises(AssertionError, match="built in and cannot be redefined"):
        start_server(tmp_path / "data", env={"ORRERY_PROFILES": json.dumps(redefined)})


@pytest.mark.servers
@pytest.mark.slow
def test_profiles_in_server_mode(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data", env=server_env(run_tag()))
    try:
        assert srv.post_records(CORPUS).status_code == 200
        srv.wait_projected(timeout=120, documents=EXPECTED)
        default = srv.topk(**QUERY).json()
        assert default["profile"] == DEFAULT and plan_of(default)["rescored_count"] > 0
        assert default["results"][0]["item_id"] == "fact:keys"
        rrf = srv.topk(**QUERY, profile="rrf@1", ranking={"lexical_weight": 2.0}).json()
        assert (
            rrf["profile"]
            == derive_profile(
                ProfileRegistry().get("rrf@1"), Ranking(lexical_weight=2.0).overrides()
            ).id
        )
        unknown = srv.topk(**QUERY, profile="nope@1")
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "unknown_profile"
        late = srv.topk(**QUERY, timeout_seconds=0.000001)
        assert late.status_code == 504
        assert late.json()["error"]["details"]["query_plan"]["profile"] == DEFAULT
    finally:
        srv.stop()


def test_quality_bench_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    done = subprocess.run(
        [sys.executable, "bench/quality.py", str(TINY_BEIR), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert (report["dataset"], report["corpus_size"], report["queries"]) == ("beir-tiny", 10, 3)
    runs = {run["name"]: run for run in report["runs"]}
    assert {"lexical", "lexical-text", "vector", "rrf@1", "rrf@2", "weighted@1"} <= set(runs)
    assert {"weighted@2", "weighted@3", "default"} <= set(runs)
    for run in runs.values():
        assert 0.0 <= run["ndcg@10"] <= 1.0 and 0.0 <= run["recall@100"] <= 1.0
    # Every query shares rare words with its one relevant document: perfect retrieval.
    assert runs["lexical"]["ndcg@10"] == 1.0 and runs["lexical"]["recall@100"] == 1.0
    assert runs["default"]["profile"] == DEFAULT
