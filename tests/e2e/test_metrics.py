"""`GET /metrics` after a known sequence shows exactly that sequence; labels stay bounded.

An embedded stack in this process (hashing embedder: builds run in process), driven
over its HTTP app: N write batches, M distinct queries plus one repeated (a cache hit),
one build → verify → promote, one refused request. The scrape must count exactly those.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from orrery.embedded import EmbeddedStack
from query.settings import QuerySettings
from tests.e2e.test_embedded_http import rec
from tests.fakes import FakeHashingEmbedder

ADMIN_KEY = "metrics-admin-key"
API_KEY = "metrics-key"
NS = "metrics_ns"
SCOPE = "longterm:objects:current"
HEADERS = {"x-api-key": API_KEY}
ADMIN = {"x-admin-key": ADMIN_KEY}
N_BATCHES = 3
PER_BATCH = 4
QUERIES = ["thermos", "house keys", "garden hose", "reading glasses"]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = QuerySettings(
        data_dir=tmp_path / "data",
        api_keys=f"{API_KEY}={NS}",
        admin_key=ADMIN_KEY,
        projector_poll_seconds=0.02,
        gen_build_in_child=False,
    )
    stack = EmbeddedStack.open(settings, embedder=FakeHashingEmbedder(dimension=32))
    stack.start()
    try:
        with TestClient(stack.app) as test_client:
            yield test_client
    finally:
        stack.close()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics", headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wait_caught_up(client: TestClient, documents: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        body = client.get("/v1/readiness", headers=HEADERS).json()
        scopes = body["scopes"]
        if body["ready"] and scopes and scopes[0]["document_count"] == documents:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def admin(client: TestClient, path: str, body: dict[str, Any] | None = None) -> Any:
    response = client.post(f"/v1/admin/generations{path}", json=body or {}, headers=ADMIN)
    assert response.status_code in (200, 202), response.text
    return response.json()


def test_a_scrape_counts_exactly_the_sequence(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 401  # the operator key is needed
    assert client.get("/metrics", headers=HEADERS).status_code == 401  # a tenant's is not it
    for batch in range(N_BATCHES):
        records = [
            rec(f"doc:{batch}:{i}", namespace=NS, title=f"{QUERIES[i]} {batch}", body="x")
            for i in range(PER_BATCH)
        ]
        response = client.post("/v1/records", json=records, headers=HEADERS)
        assert response.status_code == 200, response.text
    wait_caught_up(client, N_BATCHES * PER_BATCH)
    for text in [*QUERIES, QUERIES[0]]:  # the repeat is answered from the response cache
        response = client.post(
            "/v1/external/retrieve/topk_records",
            json={"namespace": NS, "scope_ref": SCOPE, "query_text": text},
            headers=HEADERS,
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"]
    refused = client.post(
        "/v1/records", content=b"x", headers={**HEADERS, "content-type": "text/plain"}
    )
    assert refused.status_code == 415

    generation_id = admin(client, "/build", {"namespace": NS, "snapshot_kind": "objects"})["row"][
        "generation_id"
    ]
    deadline = time.monotonic() + 60
    while client.get(f"/v1/admin/generations/{generation_id}", headers=ADMIN).json()["row"][
        "state"
    ] in ("building",):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    admin(client, f"/{generation_id}/verify")
    admin(client, f"/{generation_id}/promote")

    s = scrape(client)
    requests = "orrery_http_request_duration_seconds_count"
    assert value(s, requests, route="/v1/records", method="POST", status="200") == N_BATCHES
    # The request guard refuses before any route matched.
    assert value(s, requests, route="<unmatched>", method="POST", status="415") == 1
    topk = "/v1/external/retrieve/topk_records"
    assert value(s, requests, route=topk, status="200") == len(QUERIES) + 1
    assert value(s, requests, route=topk) == len(QUERIES) + 1
    promote = "/v1/admin/generations/{generation_id}/promote"
    assert value(s, requests, route=promote, status="200") == 1
    assert value(s, "orrery_errors_total", code="unsupported_media_type") == 1
    assert value(s, "orrery_errors_total", code="unauthorized") == 2  # the two keyless scrapes
    assert value(s, "orrery_errors_total") == 3
    # Every stage of every answered query, once per query.
    for stage in ("scope_resolve", "candidate_fetch", "index_search", "rerank"):
        count = value(s, "orrery_query_stage_duration_seconds_count", endpoint="topk", stage=stage)
        assert count == len(QUERIES) + 1, stage
    assert value(s, "orrery_query_cache_total", result="miss") == len(QUERIES)
    assert value(s, "orrery_query_cache_total", result="hit") == 1
    # A cache hit searches nothing: candidates are counted for the misses only.
    assert value(s, "orrery_query_candidates_count", source="lexical") == len(QUERIES)
    assert value(s, "orrery_embedder_texts_total", use="queries") == len(QUERIES)
    assert value(s, "orrery_embedder_texts_in_flight") == 0
    # The projector applied each written record once (the build loads its own snapshot).
    assert value(s, "orrery_projector_events_applied_total") == N_BATCHES * PER_BATCH
    assert value(s, "orrery_projector_batch_failures_total") == 0
    assert value(s, "orrery_scope_lag_events", snapshot_kind="objects") == 0
    assert value(s, "orrery_generations", snapshot_kind="objects", state="live") == 1
    assert value(s, "orrery_generations", snapshot_kind="objects") == 2
    # One scope, eligible or (its new generation's first check still running) not yet.
    assert value(s, "orrery_scopes_eligible", snapshot_kind="objects") == 1
    # The queried generation is small: scanned from its in-memory copy, which reserves
    # at most its engine's 10 MB indexing threshold (the new generation was never asked).
    assert value(s, "orrery_flat_vector_copies") == 1
    assert 0 < value(s, "orrery_flat_vector_bytes") <= 10_000 * 1024
    # No label holds the namespace (ORRERY_METRICS_NAMESPACE_LABELS is off).
    assert not [key for key in s if ("namespace", NS) in key[1]]
    # A second scrape changes no counter of the sequence (a scrape is not a request of
    # the counted routes; it counts itself under /metrics).
    again = scrape(client)
    assert value(again, requests, route=topk) == len(QUERIES) + 1
    assert value(again, requests, route="/metrics", status="200") == 1


def series(samples: Samples) -> dict[str, int]:
    """Series per metric name."""
    out: dict[str, int] = {}
    for name, _ in samples:
        out[name] = out.get(name, 0) + 1
    return out


def test_label_cardinality_is_bounded_with_1000_namespaces(tmp_path: Path) -> None:
    settings = QuerySettings(data_dir=tmp_path / "data", projector_poll_seconds=0.02)
    stack = EmbeddedStack.open(settings, embedder=FakeHashingEmbedder(dimension=32))
    stack.start()
    try:
        with TestClient(stack.app) as http:
            before = series(scrape(http))
            for i in range(1_000):
                namespace = f"tenant_{i:04d}"
                answer = http.post(
                    "/v1/external/retrieve/topk_records",
                    json={"namespace": namespace, "scope_ref": SCOPE, "query_text": "x"},
                )
                # Asked before anything was written to it: an unknown namespace.
                assert answer.status_code == 404, answer.text
                if i % 500 == 0:
                    written = http.post("/v1/records", json=[rec("a", namespace=namespace)])
                    assert written.status_code == 200
            after = scrape(http)
    finally:
        stack.close()
    grown = {name: n - before.get(name, 0) for name, n in series(after).items()}
    # 1,000 namespaces add a handful of series (the new routes and statuses), none per
    # namespace: no label value names one.
    assert sum(max(0, n) for n in grown.values()) < 200, grown
    assert not [key for key in after if any(k == "namespace" for k, _ in key[1])]
    assert value(after, "orrery_errors_total", code="unknown_namespace") == 1_000


def test_namespace_labels_only_when_asked() -> None:
    from prometheus_client import generate_latest

    from orrery.telemetry import Metrics, state_collector

    body = {
        "log_high_water": 10,
        "scopes": [
            {"namespace": f"tenant_{i:04d}", "snapshot_kind": "objects", "lag_events": i % 7,
             "lag_seconds": i / 1000.0, "eligible": True}
            for i in range(1_000)
        ],
    }  # fmt: skip
    rows = [(f"tenant_{i:04d}", "objects", "live") for i in range(1_000)]
    for labelled, expected in ((False, 1), (True, 1_000)):
        metrics = Metrics(["query"], namespace_labels=labelled)
        state_collector(metrics, readiness=lambda: body, generations=lambda: rows)
        parsed = {
            f.name: f
            for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        }
        assert len(parsed["orrery_scope_lag_events"].samples) == expected
        assert len(parsed["orrery_generations"].samples) == expected
        if not labelled:
            (lag,) = parsed["orrery_scope_lag_events"].samples
            assert lag.value == 6  # the worst namespace's lag
            (seconds,) = parsed["orrery_scope_lag_seconds"].samples
            assert seconds.value == pytest.approx(0.999)


class TcpProxy:
    """A loopback TCP forwarder to `target` that can be taken down (every connection
    cut, new ones refused) and brought back on the same port: Redis "down once"."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import socket

        self.target = (target_host, target_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._sockets: list[Any] = []
        self._server: Any = None
        self.up()

    def up(self) -> None:
        import socket
        import threading

        server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._server = server

        def pump(src: Any, dst: Any) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.close()

        def accept() -> None:
            while True:
                try:
                    client, _ = server.accept()
                except OSError:
                    return
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
                threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
                threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def down(self) -> None:
        import socket

        # shutdown() first: it wakes the accept() blocked on the socket (close alone leaves
        # the kernel socket listening until that accept returns).
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self._sockets.clear()


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_scrape_counts_writes_queries_and_redis_down_once(tmp_path: Path) -> None:
    from urllib.parse import urlparse

    from orrery.servers import Role, ServerStack
    from tests.conftest import require_server, run_tag
    from tests.e2e.test_servers_http import server_env

    redis = urlparse(require_server("redis"))
    proxy = TcpProxy(redis.hostname or "127.0.0.1", redis.port or 6379)
    env = server_env(run_tag(), database=False)
    fields: dict[str, Any] = {k.removeprefix("ORRERY_").lower(): v for k, v in env.items()}
    fields.update(
        data_dir=tmp_path / "data",
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        api_keys=f"{API_KEY}={NS}",
        admin_key=ADMIN_KEY,
    )
    settings = QuerySettings(**fields)
    stack = ServerStack.open(settings, frozenset(Role), embedder=FakeHashingEmbedder(dimension=32))
    stack.start()
    try:
        assert stack.app is not None
        with TestClient(stack.app) as client:
            for batch in range(N_BATCHES):
                records = [
                    rec(f"doc:{batch}:{i}", namespace=NS, title=f"{QUERIES[i]} {batch}")
                    for i in range(PER_BATCH)
                ]
                response = client.post("/v1/records", json=records, headers=HEADERS)
                assert response.status_code == 200, response.text
            wait_caught_up(client, N_BATCHES * PER_BATCH)
            states: list[str] = []

            def ask(text: str) -> None:
                answer = client.post(
                    "/v1/external/retrieve/topk_records",
                    json={"namespace": NS, "scope_ref": SCOPE, "query_text": text},
                    headers=HEADERS,
                )
                assert answer.status_code == 200, answer.text  # degraded, never failed
                states.append(answer.json()["query_plan"]["cache"])

            for text in QUERIES:
                ask(text)
            proxy.down()
            ask("redis is down")
            assert states[-1] == "unavailable"
            proxy.up()
            s = scrape(client)
    finally:
        stack.close()
        proxy.down()
    # Exactly what the answers said, state by state (a Redis reply slower than the cache's
    # 50 ms timeout on a loaded machine is `unavailable` too: it is counted as answered).
    for state in ("hit", "miss", "unavailable"):
        assert value(s, "orrery_query_cache_total", result=state) == states.count(state), state
    assert value(s, "orrery_query_cache_total", result="unavailable") >= 1
    requests = "orrery_http_request_duration_seconds_count"
    assert value(s, requests, route="/v1/records", status="200") == N_BATCHES
    topk = "/v1/external/retrieve/topk_records"
    assert value(s, requests, route=topk, status="200") == len(QUERIES) + 1
    assert value(s, "orrery_errors_total") == 0  # a cache outage is no error answer
    assert value(s, "orrery_relay_published_total") == N_BATCHES * PER_BATCH
    assert value(s, "orrery_relay_outbox_depth") == 0
    assert value(s, "orrery_projector_events_applied_total") >= N_BATCHES * PER_BATCH
    assert value(s, "orrery_scope_lag_events", snapshot_kind="objects") == 0
