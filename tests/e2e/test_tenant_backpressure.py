"""Backpressure per namespace (issue 22), on a real `orrery serve`, in both deployments:
embedded (paced against its own projector, in memory) and server mode (PostgreSQL +
Kafka + OpenSearch + Qdrant: paced by the namespace's outbox rows after the projector's
applied position for it, `ingest.adapters.postgres_backlog`).

Tenant A floods, through every write route (`POST /v1/records`, the KoutenDB import,
ChonkyDB's bulk write), far faster than the projector applies, with a small backlog
bound. Tenant B meanwhile writes one record at a time. Before, the bound was global:
A's 20,000-line import made B's writes answer 503 for ~126 s. Now A is paced and
refused on its own backlog, and every one of B's writes is acknowledged while A is being
refused; B's readiness shows B's own positions, never the global counter; nothing
acknowledged is lost (B's writes become searchable).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow]

A, B = "flood-a", "quiet-b"
KEYS = {A: "key-a", B: "key-b"}
MAX_LAG = 200
DIM = 384


def record(namespace: str, item: str, rng: random.Random) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "snapshot_kind": "objects",
        "item_id": item,
        "revision": 1,
        "payload": {"n": item},
        "text": {"body": f"note {item}"},
        # A vector of its own: the projector does not embed it (the flood stays cheap).
        "vector": [rng.uniform(-1.0, 1.0) for _ in range(DIM)],
    }


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env = {
        "ORRERY_API_KEYS": f"{KEYS[A]}={A},{KEYS[B]}={B}",
        "ORRERY_INGEST_MAX_LAG_EVENTS": str(MAX_LAG),
        "ORRERY_INGEST_BACKLOG_WAIT_SECONDS": "0.5",
    }
    if request.param == "servers":
        env.update(server_env(run_tag()))
    server = start_server(tmp_path_factory.mktemp("backpressure") / "data", env=env)
    yield server
    server.stop()


def test_one_tenants_flood_never_refuses_another_tenants_writes(srv: Server) -> None:
    rng = random.Random(22)
    stop = threading.Event()
    a_statuses: list[int] = []
    a_refused = threading.Event()

    errors: list[BaseException] = []

    def flood(route: str) -> None:
        try:
            flood_on(route)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)
            stop.set()

    def flood_on(route: str) -> None:
        client = httpx.Client(base_url=srv.client.base_url, timeout=120.0)
        headers = {"x-api-key": KEYS[A]}
        n = 0
        while not stop.is_set():
            batch = [record(A, f"{route}-{n + i}", rng) for i in range(250)]
            n += len(batch)
            if route == "records":
                answer = client.post("/v1/records", json=batch, headers=headers)
            elif route == "import":
                lines = "\n".join(
                    json.dumps({**r["payload"], "id": r["item_id"], "vec": r["vector"]})
                    for r in batch
                )
                answer = client.post(
                    "/v1/koutendb/import",
                    params={
                        "namespace": A,
                        "idField": "id",
                        "vecField": "vec",
                        "batchSize": "50",
                    },
                    content=lines.encode(),
                    headers={**headers, "content-type": "application/x-ndjson"},
                )
            else:
                # ChonkyDB items carry no vector (the projector embeds them): fewer.
                items = [
                    {
                        "payload": r["payload"],
                        "content": r["text"]["body"],
                        "item_id": r["item_id"],
                        "snapshot_kind": "objects",
                    }
                    for r in batch[:25]
                ]
                answer = client.post(
                    "/v1/external/records/bulk",
                    json={"items": items, "execution_mode": "sync"},
                    headers=headers,
                )
            a_statuses.append(answer.status_code)
            if answer.status_code == 503:
                assert answer.json()["error"]["code"] == "ingest_backlog", answer.text
                assert answer.json()["error"]["details"]["namespace"] == A
                assert answer.headers["retry-after"] == "1"
                a_refused.set()
            else:
                assert answer.status_code == 200, answer.text[:500]
        client.close()

    floods = [threading.Thread(target=flood, args=(r,)) for r in ("records", "import", "bulk")]
    for thread in floods:
        thread.start()
    b_answers: list[httpx.Response] = []
    try:
        # B writes until A has been refused at least once, and 20 more writes after.
        after_refusal = 0
        for n in range(2_000):
            if errors:
                break
            answer = srv.client.post(
                "/v1/records", json=[record(B, f"b-{n}", rng)], headers={"x-api-key": KEYS[B]}
            )
            b_answers.append(answer)
            assert answer.status_code == 200, answer.text[:500]
            if a_refused.is_set():
                after_refusal += 1
                if after_refusal >= 20:
                    break
    finally:
        stop.set()
        for thread in floods:
            thread.join(180)
    assert not errors, errors
    assert a_refused.is_set(), f"tenant A was never refused: {a_statuses}"
    assert after_refusal >= 20
    # B's own positions: its write answers' high_water are its records' positions, and
    # its readiness shows its newest one, not the log's (A wrote far more).
    own = [int(a.json()["high_water"]) for a in b_answers]
    assert own == [a.json()["items"][0]["position"] for a in b_answers]
    ready = srv.wait_projected(timeout=600, headers={"x-api-key": KEYS[B]})
    assert ready["log_high_water"] == max(own)
    assert all(s["namespace"] == B for s in ready["scopes"])
    assert [s["lag_events"] for s in ready["scopes"]] == [0]
    # Nothing B wrote was lost: every acknowledged write is in the store, read by id.
    ids = [a.json()["items"][0]["document_id"] for a in b_answers][:500]
    found = srv.client.post(
        "/v1/external/retrieve/topk_records",
        json={
            "namespace": B,
            "allowed_doc_ids": ids,
            "query_text": "__allowed_doc_ids__",
            "result_limit": len(ids),
        },
        headers={"x-api-key": KEYS[B]},
    )
    assert found.status_code == 200, found.text[:500]
    assert [r["document_id"] for r in found.json()["results"]] == ids
    # And searchable: the last one is found by its text.
    last = srv.client.post(
        "/v1/external/retrieve/topk_records",
        json={
            "namespace": B,
            "scope_ref": "longterm:objects:current",
            "query_text": f"note b-{len(b_answers) - 1}",
            "result_limit": 5,
        },
        headers={"x-api-key": KEYS[B]},
    )
    assert last.status_code == 200, last.text[:500]
    assert f"b-{len(b_answers) - 1}" in {r["item_id"] for r in last.json()["results"]}
