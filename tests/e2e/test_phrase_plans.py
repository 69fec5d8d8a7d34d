"""Controlled-term phrase plans end to end over HTTP: a real `orrery serve` (embedded
stack, real embedder), and in server mode (OpenSearch, Qdrant server, Kafka, Redis)
the same plans giving the same answers.

Every error code of phrase plans is exercised: `unknown_vocabulary`,
`phrase_set_too_large`, `invalid_request` (malformed plan, too many phrases),
`unknown_field` and `empty_query` (a plan that narrows nothing).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_embedded_http import rec

NS = "phr"
SCOPE = "longterm:objects:current"
# Documents the required groups of one request may match when the vector source runs.
MAX_DOCUMENTS = 2

VOCABULARIES = {
    NS: {
        "household": {
            "thermos": ["red thermos", "Thermoskanne"],
            "Kühlschrank": ["fridge", "Kühlschrank", "refrigerator"],
            "cupboard": ["hall cupboard", "Flurschrank", "kitchen cupboard"],
            "hose": ["garden hose"],
        },
        "big": {f"t{n}": [f"phrase {n} word {m}" for m in range(8)] for n in range(9)},
    },
    "elsewhere": {"household": {"oven": ["oven"]}},
}
ENV = {
    "ORRERY_VOCABULARIES": json.dumps(VOCABULARIES),
    "ORRERY_PHRASE_MAX_DOCUMENTS": str(MAX_DOCUMENTS),
}


def doc(item: str, title: str, body: str, **fields: Any) -> dict[str, Any]:
    return rec(item, namespace=NS, title=title, body=body, **fields)


CORPUS = [
    doc("k1", "Rote Thermoskanne im Flurschrank", "Früher stand die rote Thermoskanne im Flur."),
    doc("k2", "Thermoskanne im Küchenregal", "Die rote Thermoskanne steht neben dem Tee."),
    doc("k3", "Milk", "The milk is in the fridge next to the cheese."),
    doc("k4", "Red thermos", "The red thermos is on the top shelf of the hall cupboard."),
    # Every word of "red thermos", never adjacent: a bag of words matches, a phrase not.
    doc("k5", "Thermos notes", "A thermos, dented and red, lies in the car."),
    doc("k6", "Kühlschrank", "Der Kühlschrank in der Küche ist voll."),
    doc("k7", "Garden hose", "The garden hose is coiled behind the shed."),
    doc("k8", "Tea", "The green tea is in the kitchen cupboard."),
    doc("k9", "Red thermos in the car", "Anna keeps a red thermos in her car.", galaxy="anna"),
]
EXPECTED = {(NS, "objects"): len(CORPUS)}
THERMOS = {"k1", "k2", "k4", "k9"}

LEXICAL_ONLY = {"vector_weight": 0.0}
VECTOR_ONLY = {"lexical_weight": 0.0}


def plan(*groups: list[str] | tuple[list[str], bool], vocabulary: str = "household") -> Any:
    out = []
    for group in groups:
        alternatives, required = group if isinstance(group, tuple) else (group, True)
        out.append({"alternatives": alternatives, "required": required})
    return {"vocabulary": vocabulary, "groups": out}


def query(server: Server, endpoint: str = "topk", **body: Any) -> httpx.Response:
    body = {"namespace": NS, "scope_ref": SCOPE, **body}
    if endpoint == "topk":
        body.setdefault("result_limit", 10)
        return server.topk(**body)
    return server.client.post("/v1/external/retrieve", json=body)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def items(response: httpx.Response) -> list[str]:
    return [r["item_id"] for r in ok(response)["results"]]


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    details: dict[str, Any] = body["error"]["details"]
    return details


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("phrases") / "data", env=ENV)
    try:
        assert srv.post_records(CORPUS).status_code == 200
        srv.wait_projected(documents=EXPECTED)
        yield srv
    finally:
        srv.stop()


# -- restriction ----------------------------------------------------------------------


def test_required_group_restricts_to_phrase_matches(loaded: Server) -> None:
    text = "where is the red thermos (Thermoskanne)"
    plain = set(items(query(loaded, query_text=text, ranking=LEXICAL_ONLY)))
    assert "k5" in plain  # its words match as a bag
    restricted = query(loaded, query_text=text, phrase_plan=plan(["thermos"]), ranking=LEXICAL_ONLY)
    assert set(items(restricted)) == THERMOS
    phrase_plan = ok(restricted)["query_plan"]["phrase_plan"]
    assert phrase_plan["vocabulary"] == "household"
    assert phrase_plan["resolved_terms"] == {"thermos": ["red thermos", "Thermoskanne"]}
    assert phrase_plan["matched_terms"] == {"thermos": ["red thermos", "Thermoskanne"]}
    assert phrase_plan["groups"] == [
        {
            "group": 0,
            "required": True,
            "terms": ["thermos"],
            "unknown_alternatives": 0,
            "restricted": True,
            "matched": True,
        }
    ]
    assert phrase_plan["unknown_groups"] == [] and phrase_plan["fallback"] is None


def test_groups_are_all_of_and_alternatives_any_of(loaded: Server) -> None:
    both = query(loaded, query_text="thermos", phrase_plan=plan(["thermos"], ["cupboard"]))
    assert set(items(both)) == {"k1", "k4"}
    assert ok(both)["query_plan"]["phrase_plan"]["phrase_document_count"] == 2
    either = query(
        loaded, query_text="where", phrase_plan=plan(["hose", "KÜHLSCHRANK"]), ranking=LEXICAL_ONLY
    )
    assert ok(either)["results"] == []  # "where" is no word of theirs: nothing scores
    filter_only = query(loaded, phrase_plan=plan(["hose", "KÜHLSCHRANK"]))
    assert set(items(filter_only)) == {"k3", "k6", "k7"}
    assert "filter" in ok(filter_only)["query_plan"]["indexes_used"]


def test_optional_groups_do_not_restrict_but_are_reported(loaded: Server) -> None:
    response = query(
        loaded,
        query_text="red thermos or Thermoskanne",
        phrase_plan=plan(["thermos"], (["cupboard"], False)),
        ranking=LEXICAL_ONLY,
    )
    assert set(items(response)) == THERMOS
    phrase_plan = ok(response)["query_plan"]["phrase_plan"]
    assert phrase_plan["matched_terms"]["cupboard"] == ["hall cupboard", "Flurschrank"]
    assert [g["restricted"] for g in phrase_plan["groups"]] == [True, False]


def test_unknown_group_takes_the_broad_lexical_fallback(loaded: Server) -> None:
    response = query(
        loaded,
        query_text="",
        phrase_plan=plan(["cupboard"], ["green tea", "Teekanne"]),
        ranking=LEXICAL_ONLY,
    )
    # The unknown group restricts nothing; its words rank within the known group.
    assert items(response)[0] == "k8"
    assert set(items(response)) <= {"k1", "k4", "k8"}
    phrase_plan = ok(response)["query_plan"]["phrase_plan"]
    assert phrase_plan["fallback"] == "broad_lexical" and phrase_plan["unknown_groups"] == [1]
    assert phrase_plan["groups"][1]["terms"] == []
    assert phrase_plan["groups"][1]["unknown_alternatives"] == 2
    assert "bm25" in ok(response)["query_plan"]["indexes_used"]
    # Diagnostics never echo what is not a vocabulary term.
    assert "Teekanne" not in json.dumps(phrase_plan) and "green" not in json.dumps(phrase_plan)


def test_galaxy_applies_to_phrase_matches_in_both_sources(loaded: Server) -> None:
    for ranking in (LEXICAL_ONLY, VECTOR_ONLY):
        response = query(
            loaded,
            query_text="red thermos or Thermoskanne",
            phrase_plan=plan(["thermos"]),
            filters={"galaxy": "default", "status": ["active"]},
            ranking={**ranking},
        )
        if ranking is VECTOR_ONLY:
            # Three documents match in galaxy "default": past the bound of two.
            error(response, 422, "phrase_set_too_large")
        else:
            assert set(items(response)) == THERMOS - {"k9"}


def test_vector_only_ranking_is_restricted_too(loaded: Server) -> None:
    response = query(
        loaded,
        query_text="where is the milk and the cheese",
        phrase_plan=plan(["Kühlschrank"]),
        ranking=VECTOR_ONLY,
    )
    body = ok(response)
    assert {r["item_id"] for r in body["results"]} == {"k3", "k6"}
    assert body["query_plan"]["indexes_used"][0] == "vector"
    assert "bm25" not in body["query_plan"]["indexes_used"]
    assert body["query_plan"]["phrase_plan"]["phrase_document_count"] == 2
    assert all(r["score_breakdown"]["lexical"] == 0.0 for r in body["results"])
    unrestricted = items(
        query(loaded, query_text="where is the milk and the cheese", ranking=VECTOR_ONLY)
    )
    assert len(unrestricted) > 2


def test_retrieve_takes_phrase_plans_with_allowed_doc_ids(loaded: Server) -> None:
    first = ok(query(loaded, query_text="thermos", phrase_plan=plan(["thermos"], ["cupboard"])))
    ids = {r["item_id"]: r["document_id"] for r in first["results"]}
    response = query(
        loaded,
        "retrieve",
        query_text="red thermos",
        phrase_plan=plan(["thermos"]),
        allowed_doc_ids=[ids["k1"], ids["k4"]],
        ranking=VECTOR_ONLY,
    )
    body = ok(response)
    assert {c["document_id"] for c in body["candidates"]} == {ids["k1"], ids["k4"]}
    assert body["query_plan"]["candidate_scope_mode"] == "allowed_doc_ids"
    assert body["query_plan"]["phrase_plan"]["phrase_document_count"] == 2


def test_cached_answers_keep_their_phrase_plan(loaded: Server) -> None:
    body = {"query_text": "hose", "phrase_plan": plan(["hose"], (["thermos"], False))}
    first = ok(query(loaded, **body))
    second = ok(query(loaded, **body))
    assert second["query_plan"]["cache"] == "hit"
    assert second["results"] == first["results"]
    assert second["query_plan"]["phrase_plan"] == first["query_plan"]["phrase_plan"]
    other = ok(
        query(loaded, query_text="hose", phrase_plan=plan(["thermos"]), ranking=LEXICAL_ONLY)
    )
    assert other["query_plan"]["cache"] == "miss"
    assert {r["item_id"] for r in other["results"]} <= THERMOS


def test_pages_keep_their_phrase_plan(loaded: Server) -> None:
    body = {
        "query_text": "red thermos or Thermoskanne",
        "phrase_plan": plan(["thermos"]),
        "ranking": LEXICAL_ONLY,
        "page_size": 2,
        "result_limit": 2,
    }
    first = ok(query(loaded, **body))
    assert first["next_cursor"]
    second = ok(query(loaded, **body, cursor=first["next_cursor"]))
    seen = [r["item_id"] for r in first["results"] + second["results"]]
    assert len(seen) == len(set(seen)) and set(seen) == THERMOS
    other = {**body, "phrase_plan": plan(["thermos", "cupboard"])}
    error(query(loaded, **other, cursor=first["next_cursor"]), 400, "invalid_continuation")


# -- errors -----------------------------------------------------------------------------


def test_unknown_vocabulary_is_422(loaded: Server) -> None:
    for vocabulary in ("nope", "household "):
        details = error(
            query(loaded, query_text="x", phrase_plan=plan(["thermos"], vocabulary=vocabulary)),
            422,
            "unknown_vocabulary",
        )
        assert details == {"namespace": NS, "vocabulary": vocabulary}
    # Vocabularies belong to a namespace: "big" is phr's, not elsewhere's.
    details = error(
        query(
            loaded,
            namespace="elsewhere",
            query_text="x",
            phrase_plan=plan(["t1"], vocabulary="big"),
        ),
        422,
        "unknown_vocabulary",
    )
    assert details == {"namespace": "elsewhere", "vocabulary": "big"}
    # Terms too: "oven" is a term of elsewhere's "household" only, so here it falls back.
    fallback = ok(query(loaded, query_text="x", phrase_plan=plan(["oven"]), ranking=LEXICAL_ONLY))
    assert fallback["query_plan"]["phrase_plan"]["unknown_groups"] == [0]


def test_phrase_set_too_large_is_422_only_when_vectors_need_it(loaded: Server) -> None:
    body = {"query_text": "red thermos or Thermoskanne", "phrase_plan": plan(["thermos"])}
    details = error(query(loaded, **body), 422, "phrase_set_too_large")
    assert details["max_documents"] == MAX_DOCUMENTS
    assert set(items(query(loaded, **body, ranking=LEXICAL_ONLY))) == THERMOS
    error(query(loaded, "retrieve", **body), 422, "phrase_set_too_large")


def test_malformed_plans_are_refused(loaded: Server) -> None:
    error(
        query(loaded, query_text="x", phrase_plan={"vocabulary": "household"}),
        422,
        "invalid_request",
    )
    error(
        query(loaded, query_text="x", phrase_plan={"vocabulary": "household", "groups": []}),
        422,
        "invalid_request",
    )
    error(query(loaded, query_text="x", phrase_plan="thermos AND cupboard"), 422, "invalid_request")
    error(
        query(
            loaded,
            query_text="x",
            phrase_plan={
                "vocabulary": "household",
                "groups": [{"alternatives": ["a"], "op": "or"}],
            },
        ),
        422,
        "unknown_field",
    )
    details = error(
        query(
            loaded, query_text="x", phrase_plan=plan([f"t{n}" for n in range(9)], vocabulary="big")
        ),
        422,
        "invalid_request",
    )
    assert details["max_phrases"] == 64


def test_a_plan_that_narrows_nothing_is_an_empty_query(loaded: Server) -> None:
    error(query(loaded, phrase_plan=plan((["thermos"], False))), 422, "empty_query")
    assert set(items(query(loaded, phrase_plan=plan(["thermos"])))) == THERMOS


def test_api_key_namespace_is_checked_before_the_vocabulary(tmp_path: Any) -> None:
    srv = start_server(tmp_path / "data", env={**ENV, "ORRERY_API_KEYS": "k-phr=phr"})
    try:
        response = srv.client.post(
            "/v1/external/retrieve/topk_records",
            json={
                "namespace": "elsewhere",
                "scope_ref": SCOPE,
                "query_text": "x",
                "phrase_plan": plan(["oven"], vocabulary="secret"),
            },
            headers={"x-api-key": "k-phr"},
        )
        error(response, 403, "forbidden")
    finally:
        srv.stop()


# -- server mode ------------------------------------------------------------------------

SERVER_QUERIES: list[dict[str, Any]] = [
    {"query_text": "red thermos", "phrase_plan": plan(["thermos"]), "ranking": LEXICAL_ONLY},
    {"query_text": "thermos", "phrase_plan": plan(["thermos"], ["cupboard"])},
    {"phrase_plan": plan(["hose", "KÜHLSCHRANK"])},
    {"query_text": "milk cheese", "phrase_plan": plan(["Kühlschrank"]), "ranking": VECTOR_ONLY},
    {"query_text": "", "phrase_plan": plan(["cupboard"], ["green tea"]), "ranking": LEXICAL_ONLY},
    {
        "query_text": "im Flur: die Thermoskanne",
        "phrase_plan": plan(["thermos"], (["cupboard"], False)),
        "ranking": LEXICAL_ONLY,
    },
]


@pytest.fixture(scope="module")
def server_pair(
    tmp_path_factory: pytest.TempPathFactory, loaded: Server
) -> Iterator[tuple[Server, Server]]:
    from tests.e2e.test_servers_http import server_env

    tag = run_tag()
    env = server_env(tag, **ENV)
    srv = start_server(tmp_path_factory.mktemp("phrases-servers") / "data", env=env)
    try:
        assert srv.post_records(CORPUS).status_code == 200
        srv.wait_projected(timeout=120, documents=EXPECTED)
        yield srv, loaded
    finally:
        srv.stop()


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_gives_the_same_answers(server_pair: tuple[Server, Server]) -> None:
    servers, embedded = server_pair
    for body in SERVER_QUERIES:
        mine, theirs = ok(query(servers, **body)), ok(query(embedded, **body))
        assert [r["item_id"] for r in mine["results"]] == [
            r["item_id"] for r in theirs["results"]
        ], body
        mine_plan = mine["query_plan"]["phrase_plan"]
        theirs_plan = theirs["query_plan"]["phrase_plan"]
        assert mine_plan == theirs_plan, body
        assert mine["results"], body


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_errors(server_pair: tuple[Server, Server]) -> None:
    servers, _ = server_pair
    error(
        query(servers, query_text="x", phrase_plan=plan(["thermos"], vocabulary="nope")),
        422,
        "unknown_vocabulary",
    )
    error(
        query(servers, query_text="red thermos", phrase_plan=plan(["thermos"])),
        422,
        "phrase_set_too_large",
    )
    restricted = ok(
        query(servers, query_text="milk", phrase_plan=plan(["Kühlschrank"]), ranking=VECTOR_ONLY)
    )
    assert {r["item_id"] for r in restricted["results"]} == {"k3", "k6"}
    error(query(servers, phrase_plan=plan((["hose"], False))), 422, "empty_query")
