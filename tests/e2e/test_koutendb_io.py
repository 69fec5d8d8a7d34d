"""KoutenDB import / dump and the store's backup / compact routes over HTTP, in both
deployments (issue 12, acceptance scenario 7 and the robustness promises): one running
server per deployment, each test in galaxies of its own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import DEPLOYMENTS, SERVERS

pytestmark = [pytest.mark.slow]

NS = "kouten-io"
SCOPE = "longterm:objects:current"
ADMIN_KEY = "kouten-io-admin"
DIM = 384  # the default embedder's dimension: imported vectors must match it
KEYS = {"key-open": NS, "key-ga": f"{NS}/ga"}
OPEN = {"x-api-key": "key-open"}
BOUND = {"x-api-key": "key-ga"}
ADMIN = {"x-admin-key": ADMIN_KEY}
NDJSON = {"content-type": "application/x-ndjson"}


def unit(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(DIM)]


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env = {
        "ORRERY_API_KEYS": ",".join(f"{k}={v}" for k, v in KEYS.items()),
        "ORRERY_ADMIN_KEY": ADMIN_KEY,
    }
    if request.param == SERVERS:
        from tests.e2e.test_servers_http import server_env

        # Backups and compaction are Orrery's only for the SQLite store (PostgreSQL ones
        # are refused, naming pg_dump): single-host server mode.
        env.update(server_env(run_tag(), database=False))
    server = start_server(tmp_path_factory.mktemp("kouten-io") / "data", env=env)
    try:
        yield server
    finally:
        server.stop()


def galaxy() -> str:
    return f"g{uuid.uuid4().hex[:10]}"


def import_lines(
    srv: Server, body: bytes | str, headers: dict[str, str] | None = None, **params: Any
) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else body
    return srv.client.post(
        "/v1/koutendb/import",
        params={"namespace": NS, **params},
        content=content,
        headers={**NDJSON, **(headers or OPEN)},
    )


def dump(srv: Server, headers: dict[str, str] | None = None, **params: Any) -> httpx.Response:
    return srv.client.get(
        "/v1/koutendb/dump", params={"namespace": NS, **params}, headers=headers or OPEN
    )


def parse_dump(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def search(srv: Server, text: str, galaxy_name: str) -> list[dict[str, Any]]:
    response = srv.client.post(
        "/v1/external/retrieve/topk_records",
        json={
            "namespace": NS,
            "scope_ref": SCOPE,
            "query_text": text,
            "result_limit": 10,
            "filters": {"galaxy": galaxy_name},
        },
        headers=OPEN,
    )
    assert response.status_code == 200, response.text
    return list(response.json()["results"])


# KoutenDB's own import test (tests/tapi.nim), vectors widened to the embedder's dimension.
KOUTEN_EXPORT = "".join(
    json.dumps(row) + "\n"
    for row in (
        {"tenant": "a", "kind": "article", "body": {"title": "alpha"}, "embedding": unit(0)},
        {"tenant": "b", "kind": "article", "body": {"title": "beta"}, "embedding": unit(1)},
        {"kind": "fallback", "body": "plain text", "embedding": unit(0)},
    )
)
KOUTEN_PARAMS = {
    "defaultRing": "misc",
    "ringField": "tenant",
    "ringPrefix": "tenant/",
    "payloadField": "body",
    "vecField": "embedding",
}


def test_scenario_7_import_then_dump_round_trips_into_another_galaxy(srv: Server) -> None:
    source, target = galaxy(), galaxy()
    response = import_lines(srv, KOUTEN_EXPORT, galaxy=source, **KOUTEN_PARAMS)
    assert response.status_code == 200, response.text
    stats = response.json()
    assert (stats["read"], stats["imported"], stats["rings"]) == (3, 3, 3)
    assert (stats["skipped"], stats["errors"], stats["batches"]) == (0, 0, 1)
    assert (stats["galaxy"], stats["defaultRing"], stats["batchSize"]) == (source, "misc", 1000)

    first = dump(srv, galaxy=source)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"].startswith("application/x-ndjson")
    lines = parse_dump(first.text)
    meta, rings, docs = lines[0], lines[1:5], lines[5:]
    assert meta == {
        "type": "meta",
        "format": "koutendb.dump.v1",
        "galaxy": source,
        "namespace": NS,
        "snapshotKind": "objects",
        "documents": 3,
        "rings": 4,
    }
    assert [r["name"] for r in rings] == ["tenant", "tenant/a", "tenant/b", "tenant/misc"]
    by_ring = {d["ring"]: d for d in docs}
    assert json.loads(by_ring["tenant/a"]["payload"]) == {"title": "alpha"}
    assert by_ring["tenant/a"]["codec"] == "json"
    assert by_ring["tenant/misc"]["payload"] == "plain text"
    assert by_ring["tenant/misc"]["codec"] == "raw"
    assert by_ring["tenant/b"]["vec"] == unit(1)

    again = import_lines(srv, first.text, galaxy=target)
    assert again.status_code == 200, again.text
    assert (again.json()["read"], again.json()["imported"], again.json()["skipped"]) == (8, 3, 5)
    second = parse_dump(dump(srv, galaxy=target).text)
    assert second[0] == {**meta, "galaxy": target}
    assert second[1:] == lines[1:]  # rings, ids, payloads, codecs and vectors unchanged

    # Projected and searchable in its galaxy only, payloads as imported.
    srv.wait_projected(timeout=120, headers=OPEN)
    hits = search(srv, "alpha", target)
    assert hits[0]["payload"] == {"title": "alpha"}
    assert {h["item_id"].partition(":")[0] for h in hits} == {target}
    assert {"raw": "plain text"} in [h["payload"] for h in search(srv, "plain text", target)]


def test_import_never_stops_on_a_bad_line(srv: Server) -> None:
    body = "\n".join(
        [
            json.dumps({"id": "one", "text": "first good line"}),
            "{not json",
            "[1, 2, 3]",
            "",
            json.dumps({"id": "bad-vec", "text": "short vector", "v": [1.0, 0.0]}),
            json.dumps({"id": "two", "ring": "a//b", "text": "empty ring segment"}),
            json.dumps({"id": "three", "text": "last good line, no newline"}),
        ]
    )
    response = import_lines(
        srv, body, galaxy=galaxy(), idField="id", vecField="v", ringField="ring", batchSize=2
    )
    assert response.status_code == 200, response.text
    stats = response.json()
    assert (stats["read"], stats["imported"], stats["skipped"], stats["errors"]) == (7, 2, 1, 4)
    assert [(e["line"], e["code"]) for e in stats["errorLines"]] == [
        (2, "invalid_json"),
        (3, "invalid_request"),
        (5, "embedder_mismatch"),
        (6, "invalid_request"),
    ]


def test_import_and_dump_refuse_bad_requests(srv: Server) -> None:
    assert import_lines(srv, "{}\n", bogus="1").json()["error"]["code"] == "unknown_field"
    assert import_lines(srv, "{}\n", batchSize="0").status_code == 422
    assert import_lines(srv, "{}\n", scopeRef="no:such:scope").status_code == 404
    assert import_lines(srv, "{}\n", galaxy="not a name").status_code == 422
    assert dump(srv, includeVectors="maybe").status_code == 422
    assert dump(srv, namespace="other").status_code == 403
    assert srv.client.get("/v1/koutendb/dump", params={"namespace": NS}).status_code == 401


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(asked=st.sampled_from([None, "ga", "gb", "default", "GA", "ga2"]))
def test_a_galaxy_bound_key_stays_in_its_galaxy(srv: Server, asked: str | None) -> None:
    params = {} if asked is None else {"galaxy": asked}
    item = uuid.uuid4().hex
    line = json.dumps({"id": item, "text": f"bound key line {item}"}) + "\n"
    written = import_lines(srv, line, headers=BOUND, idField="id", **params)
    read = dump(srv, headers=BOUND, **params)
    if asked not in (None, "ga"):
        assert written.status_code == 403, written.text
        assert written.json()["error"]["code"] == "forbidden"
        assert read.status_code == 403, read.text
        return
    assert written.status_code == 200, written.text
    assert written.json()["galaxy"] == "ga"
    lines = parse_dump(read.text)
    assert lines[0]["galaxy"] == "ga"
    ids = {d["id"] for d in lines if d["type"] == "document"}
    assert item in ids
    # An open key sees the same galaxy's dump, and nothing of it in another galaxy.
    assert item not in dump(srv, galaxy="gb").text


def admin(srv: Server, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return srv.client.post(f"/v1/admin{path}", json=body, headers=ADMIN)


def test_backup_verify_and_names(srv: Server) -> None:
    assert import_lines(srv, KOUTEN_EXPORT, galaxy=galaxy(), **KOUTEN_PARAMS).status_code == 200
    name = f"b-{uuid.uuid4().hex[:8]}"
    taken = admin(srv, "/backups", {"name": name})
    assert taken.status_code == 200, taken.text
    body = taken.json()
    assert body["name"] == name and body["items"] >= 3 and body["bytes"] > 0
    verified = admin(srv, f"/backups/{name}/verify")
    assert verified.status_code == 200, verified.text
    assert {k: verified.json()[k] for k in ("items", "liveItems", "generations")} == {
        k: body[k] for k in ("items", "liveItems", "generations")
    }
    assert verified.json()["verified"] is True
    for bad in ("../escape", "a/b", "/abs", ".hidden", ""):
        answer = admin(srv, "/backups", {"name": bad})
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
    assert admin(srv, "/backups", {"name": name}).status_code == 409  # taken
    assert admin(srv, "/backups/nothing-here/verify").status_code == 404
    assert srv.client.post("/v1/admin/compact").status_code == 401
    assert srv.client.post("/v1/admin/compact", headers={"x-admin-key": "x"}).status_code == 403


def test_compaction_keeps_every_live_record_retrievable(srv: Server) -> None:
    g = galaxy()
    words = ["amber", "basalt", "cobalt", "dolomite", "emerald", "feldspar"]
    rows = [{"id": w, "text": f"{w} mineral v1"} for w in words]
    assert import_lines(srv, "".join(json.dumps(r) + "\n" for r in rows), galaxy=g, idField="id")
    # Second revisions of every row, then tombstones for two of them.
    rows2 = [{"id": w, "text": f"{w} mineral v2"} for w in words]
    assert import_lines(srv, "".join(json.dumps(r) + "\n" for r in rows2), galaxy=g, idField="id")
    srv.wait_projected(timeout=120, headers=OPEN)
    deleted = words[:2]
    tombstones = [
        {
            "namespace": NS,
            "galaxy": g,
            "snapshot_kind": "objects",
            "item_id": f"{g}:{w}",
            "revision": 3,
            "deleted": True,
        }
        for w in deleted
    ]
    assert srv.client.post("/v1/records", json=tombstones, headers=OPEN).status_code == 200
    srv.wait_projected(timeout=120, headers=OPEN)
    before = dump(srv, galaxy=g).text

    compacted = admin(srv, "/compact")
    assert compacted.status_code == 200, compacted.text
    result = compacted.json()
    # Every first revision is superseded, projected and published: all of them go, and
    # the deleted items' second revisions too (their tombstones stay).
    assert result["droppedRevisions"] >= len(words) + len(deleted), result
    assert result["tombstones"] >= len(deleted)
    assert result["afterBytes"] > 0 and result["items"] >= result["liveItems"]

    assert dump(srv, galaxy=g).text == before
    for word in words[2:]:
        hits = search(srv, word, g)
        assert hits and hits[0]["payload"] == {"id": word, "text": f"{word} mineral v2"}, word
    for word in deleted:
        assert all(h["payload"].get("id") != word for h in search(srv, word, g))
    # Writes after a compaction still reach the index; a deleted item comes back above
    # its tombstone's revision.
    again = json.dumps({"id": deleted[0], "text": f"{deleted[0]} mineral back"}) + "\n"
    assert import_lines(srv, again, galaxy=g, idField="id").json()["imported"] == 1
    back = [d for d in parse_dump(dump(srv, galaxy=g).text) if d.get("id") == deleted[0]]
    assert len(back) == 1
    srv.wait_projected(timeout=120, headers=OPEN)
    assert search(srv, deleted[0], g)[0]["payload"]["text"] == f"{deleted[0]} mineral back"
