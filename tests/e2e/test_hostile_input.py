"""Hostile input against a real `orrery serve` (embedded stack): a table of the inputs an
outside tester found or that belong to the same classes (issue 9, items 5-9).

Every case must answer 4xx with a code in Orrery's error shape — never 5xx, never an
acknowledged write. Afterwards the server still answers, the records written before and
after are searchable, the log's high water moved only for them (no hostile write was
acknowledged, none parked as a dead letter) and the server's memory stayed bounded
through the oversized bodies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS
from tests.e2e.test_servers_http import server_env

NS = "hostile"
KIND = "objects"
SCOPE = "longterm:objects:current"
ADMIN_KEY = "hostile-admin-key-0123456789"
DIMENSION = 384
MAX_BODY = 4 * 1024 * 1024  # the default ORRERY_MAX_BODY_BYTES
BIG = 6 * 1024 * 1024  # over it: 5 MB is enough, and keeps the test fast
HUGE = 50 * 1024 * 1024  # the outside tester's body, streamed (never held in memory)
RSS_BOUND = 150 * 1024 * 1024
TOPK = "/v1/external/retrieve/topk_records"
JSON = {"content-type": "application/json"}


def rec(item: str, body: str = "", **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": item,
        "revision": 1,
        "payload_schema": "hostile_v1",
        "payload": {"memory_id": item, "summary": body},
        "text": {"title": item, "body": body},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
    }
    record.update(fields)
    return record


def raw_records(*records: dict[str, Any]) -> bytes:
    """The body as `json.dumps` writes it: `NaN`/`Infinity` for non-finite floats."""
    return json.dumps(list(records), ensure_ascii=False).encode()


def topk_body(**fields: Any) -> dict[str, Any]:
    return {"namespace": NS, "scope_ref": SCOPE, "query_text": "kettle", **fields}


def nested_object(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


FILLER_HEAD = b'[{"namespace": "hostile", "payload": {"blob": "'


def filler(total: int, chunk: int = 1024 * 1024) -> Iterator[bytes]:
    """A streamed body of `FILLER_HEAD` and `total` more bytes (a multiple of `chunk`):
    valid JSON so far, never complete, never held in memory."""
    yield FILLER_HEAD
    sent = 0
    while sent < total:
        yield b"x" * chunk
        sent += chunk


@dataclass(frozen=True)
class Case:
    """One hostile request and the error it must get."""

    name: str
    status: int
    code: str
    path: str = "/v1/records"
    method: str = "POST"
    body: bytes | Callable[[], Iterator[bytes]] | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))


def record_with(raw_json_of_record: str) -> bytes:
    return b"[" + raw_json_of_record.encode() + b"]"


BASE = json.dumps(rec("hostile:x", "kettle"))
CASES = [
    # 5. 500 on client input: depth, huge integers, NaN.
    Case("10k-deep array", 400, "invalid_json", body=b"[" * 10_000 + b"]" * 10_000),
    Case(
        "10k-deep payload",
        400,
        "invalid_json",
        body=record_with(
            BASE.replace(
                '"payload": {', '"payload": {"deep": ' + nested_object(10_000).decode() + ", "
            )
        ),
    ),
    Case("10k-deep query", 400, "invalid_json", path=TOPK, body=nested_object(10_000)),
    Case(
        "5,001-digit revision",
        400,
        "invalid_json",
        body=record_with(BASE.replace('"revision": 1', '"revision": ' + "7" * 5_001)),
    ),
    Case(
        "5,001-digit result_limit",
        400,
        "invalid_json",
        path=TOPK,
        body=json.dumps(topk_body())
        .replace("}", ', "result_limit": ' + "9" * 5_001 + "}")
        .encode(),
    ),
    Case(
        "NaN in payload",
        400,
        "invalid_json",
        body=raw_records(rec("hostile:nan", payload={"v": float("nan")})),
    ),
    # 6. Non-finite numbers anywhere: never acknowledged, never parked.
    Case(
        "all-NaN vector",
        400,
        "invalid_json",
        body=raw_records(rec("hostile:nanvec", vector=[float("nan")] * DIMENSION)),
    ),
    Case(
        "Infinity in vector",
        400,
        "invalid_json",
        body=raw_records(rec("hostile:inf", vector=[0.1] * (DIMENSION - 1) + [float("inf")])),
    ),
    Case(
        "-Infinity in metadata",
        400,
        "invalid_json",
        body=raw_records(
            rec("hostile:minf", metadata={"status": "active", "score": float("-inf")})
        ),
    ),
    Case(
        "1e999 in vector",
        400,
        "invalid_json",
        body=record_with(
            BASE[:-1] + ', "vector": [' + ", ".join(["0.1"] * (DIMENSION - 1) + ["1e999"]) + "]}"
        ),
    ),
    Case(
        "Infinity in ranking",
        400,
        "invalid_json",
        path=TOPK,
        body=json.dumps(topk_body(ranking={"lexical_weight": float("inf")})).encode(),
    ),
    # 7. Body size: declared, and streamed without Content-Length.
    Case("6 MB with Content-Length", 413, "body_too_large", body=b" " * BIG),
    Case("6 MB chunked", 413, "body_too_large", body=lambda: filler(BIG)),
    Case(
        "50 MB streamed with Content-Length",
        413,
        "body_too_large",
        body=lambda: filler(HUGE),
        headers={**JSON, "content-length": str(len(FILLER_HEAD) + HUGE)},
    ),
    Case("50 MB chunked", 413, "body_too_large", body=lambda: filler(HUGE)),
    Case("6 MB chunked query", 413, "body_too_large", path=TOPK, body=lambda: filler(BIG)),
    # Encodings and shapes.
    Case(
        "invalid UTF-8",
        400,
        "invalid_json",
        body=record_with(BASE).replace(b"kettle", b"k\xffttle"),
    ),
    Case("UTF-16 body", 400, "invalid_json", body=record_with(BASE).decode().encode("utf-16")),
    Case(
        "lone surrogate escape",
        400,
        "invalid_json",
        body=record_with(BASE.replace("kettle", "\\ud800")),
    ),
    Case(
        "duplicate keys",
        400,
        "invalid_json",
        body=record_with(BASE.replace('"revision": 1', '"revision": 1, "revision": 2')),
    ),
    Case(
        "duplicate keys in query",
        400,
        "invalid_json",
        path=TOPK,
        body=b'{"namespace": "hostile", "namespace": "other", "scope_ref": "x"}',
    ),
    Case(
        "text/plain",
        415,
        "unsupported_media_type",
        body=record_with(BASE),
        headers={"content-type": "text/plain"},
    ),
    Case(
        "form-encoded",
        415,
        "unsupported_media_type",
        path=TOPK,
        body=b"namespace=hostile",
        headers={"content-type": "application/x-www-form-urlencoded"},
    ),
    # NUL in ids (item_id: see test_nul_in_item_id_is_refused).
    Case(
        "NUL in namespace",
        422,
        "invalid_request",
        body=raw_records(rec("hostile:nul", namespace="host\x00ile")),
    ),
    Case(
        "NUL in snapshot_kind",
        422,
        "invalid_request",
        body=raw_records(rec("hostile:nul", snapshot_kind="obj\x00ects")),
    ),
    Case(
        "NUL in galaxy",
        422,
        "invalid_request",
        body=raw_records(rec("hostile:nul", galaxy="g\x00")),
    ),
    Case(
        "NUL in document_id",
        422,
        "invalid_request",
        body=raw_records(rec("hostile:nul", document_id="doc\x00id")),
    ),
    Case(
        "NUL in a query's namespace",
        422,
        "invalid_request",
        path=TOPK,
        body=json.dumps(topk_body(namespace="host\x00ile")).encode(),
    ),
    Case(
        "NUL in a by-id namespace",
        422,
        "invalid_request",
        path="/v1/records/by_id",
        body=json.dumps({"namespace": "host\x00ile", "document_ids": ["x"]}).encode(),
    ),
    Case(
        "1 MB query text",
        422,
        "invalid_request",
        path=TOPK,
        body=json.dumps(topk_body(query_text="kettle " * 150_000)).encode(),
    ),
    # 9. Framework errors keep their own codes.
    Case("GET on a POST route", 405, "method_not_allowed", method="GET", headers={}),
    Case("PUT on the query route", 405, "method_not_allowed", path=TOPK, method="PUT", body=b"{}"),
    Case(
        "DELETE readiness",
        405,
        "method_not_allowed",
        path="/v1/readiness",
        method="DELETE",
        headers={},
    ),
    # The admin body parser (the third one) shares the strict loader.
    Case(
        "10k-deep admin body",
        400,
        "invalid_json",
        path="/v1/admin/generations/build",
        body=nested_object(10_000),
        headers={**JSON, "x-admin-key": ADMIN_KEY},
    ),
    Case(
        "NaN admin body",
        400,
        "invalid_json",
        path="/v1/admin/generations/gc",
        body=b'{"keep": NaN}',
        headers={**JSON, "x-admin-key": ADMIN_KEY},
    ),
]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def assert_error(response: httpx.Response, status: int, code: str, name: str) -> None:
    assert response.status_code < 500, f"{name}: {response.status_code} {response.text[:300]}"
    assert response.status_code == status, f"{name}: {response.status_code} {response.text[:300]}"
    body = response.json()
    assert body["success"] is False, f"{name}: {response.text[:300]}"
    assert set(body["error"]) == {"code", "message", "details"}, f"{name}: {response.text[:300]}"
    assert body["error"]["code"] == code, f"{name}: {response.text[:300]}"
    assert body["error"]["message"], name


def send(srv: Server, case: Case) -> httpx.Response:
    content = case.body() if callable(case.body) else case.body
    return srv.client.request(case.method, case.path, content=content, headers=case.headers)


def searchable(srv: Server, item: str, text: str) -> bool:
    response = srv.client.post(TOPK, json=topk_body(query_text=text, result_limit=10))
    assert response.status_code == 200, response.text[:300]
    return any(r["item_id"] == item for r in response.json()["results"])


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The same table against both deployments: embedded, and server mode (ingest, relay
    to Kafka, projector, query on OpenSearch + the Qdrant server in one process)."""
    env = {"ORRERY_ADMIN_KEY": ADMIN_KEY}
    if request.param == "servers":
        env.update(server_env(run_tag()))
    server = start_server(tmp_path_factory.mktemp("hostile") / "data", env=env)
    yield server
    server.stop()


def test_hostile_inputs_are_4xx_and_nothing_accepted_is_lost(srv: Server) -> None:
    before = srv.post_records([rec("hostile:kettle", "the copper kettle is on the stove")])
    assert before.status_code == 200, before.text[:300]
    high_water = srv.wait_projected()["log_high_water"]
    assert searchable(srv, "hostile:kettle", "copper kettle")
    rss_start = rss_bytes(srv.process.pid)
    failures = []
    for case in CASES:
        try:
            assert_error(send(srv, case), case.status, case.code, case.name)
        except (AssertionError, httpx.HTTPError) as exc:
            failures.append(f"{case.name}: {str(exc)[:400]}")
    assert not failures, "\n".join(failures)
    grown = rss_bytes(srv.process.pid) - rss_start
    assert grown < RSS_BOUND, f"RSS grew by {grown / 2**20:.0f} MiB over the hostile bodies"
    assert srv.client.get("/healthz").status_code == 200
    # Nothing hostile was acknowledged: the log holds only the normal writes.
    after = srv.post_records([rec("hostile:teapot", "a blue teapot on the windowsill")])
    assert after.status_code == 200, after.text[:300]
    ready = srv.wait_projected()
    assert ready["log_high_water"] == high_water + 1
    assert ready.get("projector", {}).get("dead_letters_parked", 0) == 0
    assert searchable(srv, "hostile:kettle", "copper kettle")
    assert searchable(srv, "hostile:teapot", "blue teapot")
    assert "unhandled error" not in srv.log_path.read_text()


def test_cursor_spellings_are_invalid_continuation(srv: Server) -> None:
    """8. A valid cursor with `=` appended, or in the standard base64 alphabet, or with
    other trailing bits, is tampering: 400 invalid_continuation."""
    records = [rec(f"hostile:page{i}", f"paging kettle number {i}") for i in range(6)]
    assert srv.post_records(records).status_code == 200
    srv.wait_projected()
    standard = str.maketrans("-_", "+/")
    swapped = 0
    for attempt in range(40):  # until a signature holds '-' or '_' (about 3 in 4 do)
        body = topk_body(query_text=f"paging kettle {attempt}", page_size=2)
        first = srv.client.post(TOPK, json=body)
        assert first.status_code == 200, first.text[:300]
        cursor = first.json()["next_cursor"]
        assert cursor, first.text[:300]
        head, signature = cursor.rsplit(".", 1)
        variants = [cursor + "=", cursor + "=="]
        if signature.translate(standard) != signature:
            variants.append(f"{head}.{signature.translate(standard)}")
            swapped += 1
        for variant in variants:
            response = srv.client.post(TOPK, json={**body, "cursor": variant})
            assert_error(response, 400, "invalid_continuation", variant)
        following = srv.client.post(TOPK, json={**body, "cursor": cursor})
        assert following.status_code == 200, following.text[:300]
        if swapped:
            break
    assert swapped, "no cursor signature held '-' or '_'"


def test_nul_in_item_id_is_refused(srv: Server) -> None:
    response = srv.post_records([rec("hostile:\x00nul", "nul item")])
    assert_error(response, 422, "invalid_request", "NUL in item_id")
