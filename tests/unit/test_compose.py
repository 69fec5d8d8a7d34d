"""compose/ cannot drift: the file is valid Compose, Prometheus scrapes every role's
metrics port, the dashboard asks only for metrics Orrery exposes, and the image holds
every package the project installs. (`tests/e2e/test_compose.py` runs the same roles.)"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orrery.telemetry import Metrics, state_collector

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((COMPOSE / "docker-compose.yml").read_text()))


def orrery_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("build", {}).get("dockerfile") == "compose/Dockerfile"
    }


def test_the_compose_file_is_valid_against_the_compose_spec_schema() -> None:
    schema = json.loads((COMPOSE / "schema" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_a_broken_compose_file_is_refused_by_the_schema() -> None:
    schema = json.loads((COMPOSE / "schema" / "compose-spec.json").read_text())
    broken = compose()
    broken["services"]["relay"]["depends_on"] = {"kafka": {"condition": "when_it_feels_like"}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_prometheus_scrapes_every_role_on_its_metrics_port() -> None:
    services = orrery_services()
    assert set(services) == {"ingest-api", "relay", "projector", "query-worker"}
    ports = {name: int(s["environment"]["ORRERY_METRICS_PORT"]) for name, s in services.items()}
    assert len(set(ports.values())) == len(ports)  # one port per role: they share a host in e2e
    config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {f"{name}:{port}" for name, port in ports.items()}
    for service in services.values():
        assert service["environment"]["ORRERY_METRICS_HOST"] == "0.0.0.0"


def exposed_metric_names() -> set[str]:
    metrics = Metrics(["query"])
    state_collector(
        metrics,
        readiness=lambda: {
            "log_high_water": 1,
            "scopes": [
                {"namespace": "n", "snapshot_kind": "k", "lag_events": 0, "lag_seconds": 0.0}
            ],
            "projector_log": {"lag_events": 0, "dead_letters": 0},
        },
        generations=lambda: [("n", "k", "live")],
        builds=lambda: [("load", 1, 2)],
        outbox_depth=lambda: 0,
    )
    names = set()
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        names.add(family.name)
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            names.add(family.name + suffix)
    return names


def test_the_dashboard_asks_only_for_metrics_orrery_exposes() -> None:
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "orrery.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\borrery_[a-z_]+", expr)}
    assert used and used <= exposed_metric_names(), used - exposed_metric_names()
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("lag", "throughput", "stage latency", "cache hit", "generations"):
        assert topic in titles, topic


def test_grafana_provisions_the_dashboard_from_prometheus() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./grafana/dashboards"] == "/var/lib/grafana/dashboards"
    provider = yaml.safe_load(
        (COMPOSE / "grafana" / "provisioning" / "dashboards" / "orrery.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasource = yaml.safe_load(
        (COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_the_image_holds_every_package_the_project_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.MULTILINE))
    assert packages <= copied, packages - copied
