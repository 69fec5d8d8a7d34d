"""Structured logs of a running server: one JSON access line per request, ids and error
codes in it, never the body or the query text (`orrery.logs`, `orrery.telemetry`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Server, start_server

SECRET = "margarete's thermos behind the flour tin"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        tmp_path_factory.mktemp("logs") / "data",
        env={"ORRERY_LOG_FORMAT": "json", "ORRERY_ACCESS_LOG": "true"},
    )
    yield server
    server.stop()


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def lines_of(srv: Server, request_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        found = [e for e in json_lines(srv.log_path) if e.get("request_id") == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_failing_request_logs_one_json_line_with_its_id_and_code(srv: Server) -> None:
    response = srv.client.post(
        "/v1/external/retrieve/topk_records",
        json={"namespace": "nobody_here", "scope_ref": "longterm:objects:current",
              "query_text": SECRET, "result_limit": 100_000},
        headers={"x-request-id": "req-failing-1"},
    )  # fmt: skip
    assert response.status_code == 422, response.text
    code = response.json()["error"]["code"]
    assert response.headers["x-request-id"] == "req-failing-1"
    (line,) = lines_of(srv, "req-failing-1")
    assert line["level"] == "INFO" and line["logger"] == "orrery.access"
    assert line["role"] == "serve"
    assert line["http"]["status"] == 422 and line["http"]["error_code"] == code
    assert line["http"]["route"] == "/v1/external/retrieve/topk_records"
    assert line["namespace"] == "nobody_here"
    # Neither the query text nor the body is logged at INFO.
    assert SECRET not in srv.log_path.read_text(encoding="utf-8")


def test_every_request_gets_an_id_and_one_line(srv: Server) -> None:
    ids = set()
    for _ in range(3):
        response = srv.client.get("/healthz", headers={"x-request-id": "not a token!"})
        ids.add(response.headers["x-request-id"])
    assert len(ids) == 3 and "not a token!" not in ids  # a malformed id is replaced
    for request_id in ids:
        (line,) = lines_of(srv, request_id)
        assert line["http"]["route"] == "/healthz" and line["http"]["status"] == 200
        assert "error_code" not in line["http"] or line["http"]["error_code"] is None
