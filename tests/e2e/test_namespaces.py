"""Twinr-style namespaces (`twinr_longterm_v1:<root>:<sha1>`) end to end, in both
deployments: written over HTTP, projected (server mode: through a Kafka topic named by
`contracts.names.namespace_token`), queried back, isolated from a namespace whose name
differs only in case, and reachable by an API key bound to them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from contracts.events import topic_for
from contracts.records import derive_document_id
from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS, SERVERS
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.slow]

TWINR_NS = "twinr_longterm_v1:Mein Zuhause (alt):a7f1ed265838"
# A case twin with the same root: OpenSearch folds case, Orrery must not.
TWIN_NS = "twinr_longterm_v1:mein zuhause (alt):a7f1ed265838"
KEYS = {"key-twinr": TWINR_NS, "key-twin": TWIN_NS}
SCOPE = "longterm:objects:current"


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Server, dict[str, str]]]:
    env = {"ORRERY_API_KEYS": ",".join(f"{k}={ns}" for k, ns in KEYS.items())}
    if request.param == SERVERS:
        env.update(server_env(run_tag()))
    srv = start_server(tmp_path_factory.mktemp("namespaces") / "data", env=env)
    try:
        yield request.param, srv, env
    finally:
        srv.stop()


def _record(namespace: str, summary: str) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "snapshot_kind": "objects",
        "item_id": "fact:thermos",
        "revision": 1,
        "payload": {"summary": summary},
        "text": {"body": summary},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
    }


def test_twinr_namespace_write_and_query(deployment: tuple[str, Server, dict[str, str]]) -> None:
    kind, srv, env = deployment
    for key, namespace, summary in (
        ("key-twinr", TWINR_NS, "Die rote Thermoskanne steht im Flurschrank"),
        ("key-twin", TWIN_NS, "Die blaue Thermoskanne steht in der Küche"),
    ):
        written = srv.client.post(
            "/v1/records", json=[_record(namespace, summary)], headers={"x-api-key": key}
        )
        assert written.status_code == 200, written.text
    for key, namespace in KEYS.items():
        srv.wait_projected(
            timeout=120, documents={(namespace, "objects"): 1}, headers={"x-api-key": key}
        )

    answers = {}
    for key, namespace in KEYS.items():
        response = srv.topk(namespace=namespace, scope_ref=SCOPE, query_text="Thermoskanne")
        assert response.status_code == 401, response.text  # keys are configured
        response = srv.client.post(
            "/v1/external/retrieve/topk_records",
            json={"namespace": namespace, "scope_ref": SCOPE, "query_text": "Thermoskanne"},
            headers={"x-api-key": key},
        )
        assert response.status_code == 200, response.text
        answers[namespace] = response.json()
    for namespace, answer in answers.items():
        [hit] = answer["results"]
        assert hit["document_id"] == derive_document_id(namespace, "objects", "fact:thermos")
    assert answers[TWINR_NS]["results"][0]["payload"]["summary"].startswith("Die rote")
    assert answers[TWIN_NS]["results"][0]["payload"]["summary"].startswith("Die blaue")

    # A key bound to one namespace cannot read its case twin.
    crossed = srv.client.post(
        "/v1/external/retrieve/topk_records",
        json={"namespace": TWIN_NS, "scope_ref": SCOPE, "query_text": "Thermoskanne"},
        headers={"x-api-key": "key-twinr"},
    )
    assert crossed.status_code == 403, crossed.text

    if kind == SERVERS:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=require_server("kafka"))
        try:
            topics = set(admin.list_topics())
        finally:
            admin.close()
        prefix = env["ORRERY_KAFKA_TOPIC_PREFIX"]
        expected = {topic_for(prefix, ns) for ns in KEYS.values()}
        assert {t for t in topics if t.startswith(prefix + ".")} == expected


def test_hostile_namespaces_are_refused_before_anything_is_named(
    deployment: tuple[str, Server, dict[str, str]],
) -> None:
    _, srv, _ = deployment
    for namespace in ("../etc", "a/b", "nul\x00", " padded", "x" * 256):
        response = srv.client.post(
            "/v1/records", json=[_record(namespace, "x")], headers={"x-api-key": "key-twinr"}
        )
        assert response.status_code == 422, (namespace, response.text)
