"""The compose topology, started from the test harness: the same Orrery roles with the
same commands, environment and ports as `compose/docker-compose.yml` (there is no Docker
engine here), only the engines' addresses swapped for the harness's, names made unique
to this run, and every port moved by one offset (the machine is shared: 8080 is someone
else's). Prometheus' targets (`compose/prometheus/prometheus.yml`) are then scraped as
Prometheus would, and each role shows what it did."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import new_database, require_server, run_tag
from tests.e2e.test_servers_http import server_env

pytestmark = [pytest.mark.servers, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
# What only the harness knows: where the engines are, and this run's resource names.
HARNESS_SET = (
    "ORRERY_DATABASE_URL",
    "ORRERY_KAFKA_BOOTSTRAP",
    "ORRERY_OPENSEARCH_URL",
    "ORRERY_QDRANT_URL",
    "ORRERY_REDIS_URL",
)


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` as `docker compose` resolves it."""
    return re.sub(
        r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1)) or m.group(2), value
    )


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ports(service: dict[str, Any]) -> list[int]:
    out = [int(p.rsplit(":", 1)[1]) for p in service.get("ports", [])]
    metrics = service["environment"].get("ORRERY_METRICS_PORT")
    return out + ([int(metrics)] if metrics else [])


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


class Topology:
    def __init__(self, tmp: Path, database_url: str) -> None:
        spec = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
        self.services = {
            name: s
            for name, s in spec["services"].items()
            if s.get("build", {}).get("dockerfile") == "compose/Dockerfile"
        }
        wanted = [p for s in self.services.values() for p in _ports(s)]
        # Below the kernel's ephemeral range (32768-60999 by default): a port there found
        # free now can be taken by any outgoing connection before the role binds it.
        self.offset = next(o for o in range(20_000, 23_000, 7) if all(_free(p + o) for p in wanted))
        tag = run_tag()
        harness = server_env(tag, database=False)
        harness["ORRERY_DATABASE_URL"] = database_url
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.env: dict[str, dict[str, str]] = {}
        for name, service in self.services.items():
            env = {k: _interpolate(str(v)) for k, v in service["environment"].items()}
            assert set(HARNESS_SET) <= set(env), f"{name}: compose names no {HARNESS_SET}"
            env.update(harness)  # engines' addresses and this run's names only
            env["ORRERY_DATA_DIR"] = str(tmp / name)
            env["ORRERY_METRICS_HOST"] = "127.0.0.1"  # loopback here; the network there
            if "ORRERY_METRICS_PORT" in env:
                env["ORRERY_METRICS_PORT"] = str(int(env["ORRERY_METRICS_PORT"]) + self.offset)
            command = [
                str(int(a) + self.offset) if a.isdigit() else ("127.0.0.1" if a == "0.0.0.0" else a)
                for a in service["command"]
            ]  # fmt: skip
            self.env[name] = env
            self.logs[name] = tmp / f"{name}.log"
            with self.logs[name].open("ab") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "orrery.cli", *command],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                )

    def url(self, service: str) -> str:
        (mapping,) = self.services[service]["ports"]
        return f"http://127.0.0.1:{int(mapping.rsplit(':', 1)[1]) + self.offset}"

    def wait_healthy(self, service: str, deadline: float) -> None:
        while True:
            process = self.processes[service]
            assert process.poll() is None, self.logs[service].read_text()[-3000:]
            try:
                if httpx.get(self.url(service) + "/healthz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, self.logs[service].read_text()[-3000:]
            time.sleep(0.2)

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    for engine in ("kafka", "opensearch", "qdrant", "redis", "postgres"):
        require_server(engine)
    with new_database() as database_url:
        started = Topology(tmp_path, database_url)
        try:
            yield started
        finally:
            started.stop()


def test_the_compose_roles_run_here_and_prometheus_sees_each(topology: Topology) -> None:
    deadline = time.monotonic() + 240
    topology.wait_healthy("ingest-api", deadline)
    topology.wait_healthy("query-worker", deadline)
    env = topology.env["query-worker"]
    api_key, _, namespace = env["ORRERY_API_KEYS"].split(",")[0].partition("=")
    headers = {"x-api-key": api_key}
    records = [
        {
            "namespace": namespace,
            "snapshot_kind": "objects",
            "item_id": f"compose:{i}",
            "revision": 1,
            "payload": {"n": i},
            "text": {"title": f"compose record {i}", "body": "kept by the compose topology"},
        }
        for i in range(5)
    ]
    written = httpx.post(topology.url("ingest-api") + "/v1/records", json=records, headers=headers)
    assert written.status_code == 200, written.text
    query = topology.url("query-worker")
    while True:
        ready = httpx.get(query + "/v1/readiness", headers=headers, timeout=10).json()
        scopes = ready.get("scopes", [])
        if ready.get("ready") and scopes and scopes[0]["document_count"] == len(records):
            break
        assert time.monotonic() < deadline, ready
        time.sleep(0.2)
    answer = httpx.post(
        query + "/v1/external/retrieve/topk_records",
        json={"namespace": namespace, "scope_ref": "longterm:objects:current",
              "query_text": "compose record"},
        headers=headers,
    )  # fmt: skip
    assert answer.status_code == 200 and answer.json()["results"], answer.text
    # The query worker's own port serves /metrics to the operator key only.
    assert httpx.get(query + "/metrics").status_code == 401
    admin = {"x-admin-key": env["ORRERY_ADMIN_KEY"]}
    assert httpx.get(query + "/metrics", headers=admin).status_code == 200

    config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    scraped = {}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                _, _, port = target.partition(":")
                url = f"http://127.0.0.1:{int(port) + topology.offset}/metrics"
                scraped[static["labels"]["role"]] = _scrape(url)
    assert set(scraped) == {"ingest", "relay", "projector", "query"}
    requests = "orrery_http_request_duration_seconds_count"
    assert _value(scraped["ingest"], requests, route="/v1/records", status="200") == 1
    assert _value(scraped["ingest"], "orrery_roles", role="ingest") == 1
    assert _value(scraped["relay"], "orrery_relay_published_total") >= len(records)
    assert _value(scraped["relay"], "orrery_relay_outbox_depth") == 0
    # At-least-once delivery may apply an event twice, never fewer than were written.
    assert _value(scraped["projector"], "orrery_projector_events_applied_total") >= len(records)
    assert _value(scraped["projector"], "orrery_embedder_texts_total", use="documents") >= 5
    topk = "/v1/external/retrieve/topk_records"
    assert _value(scraped["query"], requests, route=topk, status="200") == 1
    assert _value(scraped["query"], "orrery_scope_lag_events", snapshot_kind="objects") == 0
    assert _value(scraped["query"], "orrery_generations", state="live") == 1
