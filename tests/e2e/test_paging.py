"""Scopes, generation pins and signed continuation cursors end to end over HTTP, in the
embedded deployment and in server mode (Kafka, OpenSearch, Redis from the harness).

Every error code of the continuation contract is exercised: `400 invalid_continuation`
(tampered, wrong key, other request), `410 expired_continuation`, `410
generation_unavailable` (retired or unknown generation); and a cursor keeps paging the
generation of its first page after a promote.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import (
    ADMIN_KEY,
    admin_post,
    build_sealed,
    live_generation,
    ok,
    promote,
    vectors,
    verify,
)

NS = "gens"  # `live_generation` and the build helpers read this namespace
KIND = "objects"
SCOPE = "longterm:objects:current"
DOCS = 60
PAGING_DEPTH = 25
KEYS = {"k2": "second-secret-0123456789", "k1": "first-secret-0123456789"}
ENV = {
    "ORRERY_ADMIN_KEY": ADMIN_KEY,
    "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "2",
    "ORRERY_ELIGIBILITY_MAX_INTERVAL_SECONDS": "2",  # every 2 s, unchanged or not
    "ORRERY_CURSOR_KEYS": ",".join(f"{kid}:{secret}" for kid, secret in KEYS.items()),
    "ORRERY_PAGING_CANDIDATE_DEPTH": str(PAGING_DEPTH),
    "ORRERY_SCOPES": json.dumps(
        {NS: {"items:active": {"snapshot_kind": KIND, "filters": {"status": ["active"]}}}}
    ),
}
QUERY = "item number shelf"


def corpus() -> list[dict[str, Any]]:
    """Every record matches QUERY lexically (many BM25 ties); every third is a candidate."""
    return [
        {
            "namespace": NS,
            "snapshot_kind": KIND,
            "item_id": f"obj-{i}",
            "revision": 1,
            "payload": {"n": i},
            "text": {
                "title": f"item number {i}",
                "body": f"The item {i} rests in box {i % 7} on shelf {i % 3}.",
            },
            "metadata": {
                "status": "candidate" if i % 3 == 0 else "active",
                "updated_at": "2026-06-01T10:00:00Z",
            },
            "vector": vector,
        }
        for i, vector in zip(range(DOCS), vectors(DOCS, 7), strict=True)
    ]


# -- helpers --------------------------------------------------------------------------------


def query(srv: Server, path: str = "topk", **body: Any) -> httpx.Response:
    base = {"namespace": NS, "scope_ref": SCOPE, "query_text": QUERY, **body}
    if path == "retrieve":
        return srv.client.post("/v1/external/retrieve", json=base)
    return srv.client.post("/v1/external/retrieve/topk_records", json=base)


def items(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body["results"] if "results" in body else body["candidates"])


def walk(srv: Server, sizes: list[int], path: str = "topk", **body: Any) -> list[dict[str, Any]]:
    """Page through a request with the given page sizes (the last one repeats); returns
    every page's body."""
    pages: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        size = sizes[min(len(pages), len(sizes) - 1)]
        extra = {"cursor": cursor} if cursor else {}
        page = ok(query(srv, path, page_size=size, **body, **extra))
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "paging does not end"


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    return dict(body["error"])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def resign(cursor: str, kid: str, **changes: Any) -> str:
    """The cursor with payload fields changed, signed again with a key the server has."""
    version, _, payload, _ = cursor.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(changes)
    head = f"{version}.{kid}.{_b64(json.dumps(body).encode())}"
    signature = hmac.new(KEYS[kid].encode(), head.encode(), hashlib.sha256).digest()
    return f"{head}.{_b64(signature)}"


# -- the contract, run against either deployment ---------------------------------------------


def reference_walk(srv: Server) -> list[str]:
    """Every document id the paging window holds, in order (pages of PAGING_DEPTH)."""
    pages = walk(srv, [PAGING_DEPTH])
    return [r["document_id"] for page in pages for r in page["results"]]


def check_pages_cover_the_window_once(srv: Server) -> None:
    first = ok(query(srv, page_size=PAGING_DEPTH))
    window = first["query_plan"]["continuation"]["window"]
    reference = reference_walk(srv)
    assert PAGING_DEPTH < window == len(reference) < DOCS  # the window, not the corpus
    for sizes in ([1], [7], [3, 11, 2, 5], [PAGING_DEPTH, 1]):
        pages = walk(srv, sizes)
        flat = [r["document_id"] for page in pages for r in items(page)]
        assert flat == reference, sizes  # same order, nothing twice, nothing skipped
        ranks = [r["rank"] for page in pages for r in items(page)]
        assert ranks == list(range(1, len(reference) + 1))
        assert {page["generation_id"] for page in pages} == {first["generation_id"]}
        plans = [page["query_plan"]["continuation"] for page in pages]
        assert [p["page"] for p in plans] == list(range(1, len(pages) + 1))
        assert all(not p["window_exhausted"] for p in plans[:-1])
        assert plans[-1]["window_exhausted"] and pages[-1]["next_cursor"] is None
        assert all(p["expires_at"] for p in plans[:-1]) and plans[-1]["expires_at"] is None
    # A first page larger than the paging depth widens the window to hold it.
    whole = ok(query(srv, page_size=DOCS))
    assert len(whole["results"]) == DOCS and whole["next_cursor"] is None
    assert whole["query_plan"]["continuation"]["window_exhausted"] is True
    # The generic API pages the same way, with allowed_doc_ids bound into the cursor.
    allowed = reference[::2]
    pages = walk(srv, [4], path="retrieve", allowed_doc_ids=allowed)
    flat = [c["document_id"] for page in pages for c in items(page)]
    assert sorted(flat) == sorted(allowed) and len(set(flat)) == len(flat)
    first = ok(query(srv, "retrieve", page_size=4, allowed_doc_ids=allowed))
    moved = query(srv, "retrieve", cursor=first["next_cursor"], allowed_doc_ids=allowed[1:])
    error(moved, 400, "invalid_continuation")
    # A topk cursor does not continue a retrieve request.
    topk_cursor = ok(query(srv, page_size=4))["next_cursor"]
    error(query(srv, "retrieve", cursor=topk_cursor), 400, "invalid_continuation")


def check_cursor_errors(srv: Server) -> None:
    first = ok(query(srv, page_size=5, filters={"status": ["active", "candidate"]}))
    cursor = first["next_cursor"]
    same = {"filters": {"status": ["candidate", "active"]}}  # any-of order does not matter
    assert ok(query(srv, cursor=cursor, page_size=5, **same))["results"]
    # page_size may change from page to page; include and timeout may too.
    assert (
        len(ok(query(srv, cursor=cursor, page_size=2, timeout_seconds=5, **same))["results"]) == 2
    )

    version, kid, payload, signature = cursor.split(".")
    tampered = f"{version}.{kid}.{payload[:-3]}AAA.{signature}"
    for bad in (tampered, cursor + "x", "not-a-cursor", f"{version}.k9.{payload}.{signature}"):
        details = error(query(srv, cursor=bad, **same), 400, "invalid_continuation")
        assert "start again" in details["message"]
    # The same cursor with another request: another text, scope filter, profile or weights.
    for other in (
        {"query_text": "item number"},
        {"filters": {"status": ["active"]}},
        {"profile": "rrf@1", **same},
        {"ranking": {"vector_weight": 0.5}, **same},
        {"scope_ref": "items:active", **same},
    ):
        error(query(srv, cursor=cursor, **other), 400, "invalid_continuation")
    # Re-signed after a change: the fingerprint (keyed like the signature) no longer fits.
    error(query(srv, cursor=resign(cursor, "k1"), **same), 400, "invalid_continuation")
    expired = resign(cursor, "k2", exp=int(time.time()) - 1)
    details = error(query(srv, cursor=expired, **same), 410, "expired_continuation")
    assert details["details"]["expired_at"]
    # A cursor naming a generation that does not exist.
    error(
        query(srv, cursor=resign(cursor, "k2", gen="g999"), **same), 410, "generation_unavailable"
    )
    # page_size replaces result_limit; giving both differently is refused.
    error(query(srv, page_size=5, result_limit=6), 422, "invalid_request")
    error(query(srv, page_size=1_000), 422, "result_limit_exceeded")


def check_response_cache_reissues_cursors(srv: Server) -> None:
    first = ok(query(srv, query_text="box 3 shelf", page_size=4))
    cursor = first["next_cursor"]
    second = ok(query(srv, query_text="box 3 shelf", cursor=cursor, page_size=4))
    again = ok(query(srv, query_text="box 3 shelf", cursor=cursor, page_size=4))
    assert again["query_plan"]["cache"] == "hit"
    assert again["results"] == second["results"]
    assert again["results"][0]["rank"] == 5
    # Issued afresh (never the stored one's older expiry), for the same position.
    expiry = [b["query_plan"]["continuation"]["expires_at"] for b in (second, again)]
    assert expiry[1] >= expiry[0]
    third = ok(query(srv, query_text="box 3 shelf", cursor=again["next_cursor"], page_size=4))
    assert third["results"][0]["rank"] == 9


def check_operator_scope_and_pins(srv: Server) -> None:
    active = walk(srv, [9], scope_ref="items:active")
    flat = [r for page in active for r in page["results"]]
    assert flat and all(r["metadata"]["status"] == "active" for r in flat)
    narrowed = ok(query(srv, scope_ref="items:active", filters={"status": ["candidate"]}))
    assert narrowed["results"] == []  # fixed and request filters intersect
    # The scope's fixed filters narrow on their own: no text is needed to list them.
    listed = ok(query(srv, scope_ref="items:active", query_text="", result_limit=50))
    assert len(listed["results"]) == DOCS - DOCS // 3
    error(query(srv, query_text=""), 422, "empty_query")
    live = live_generation(srv)
    pinned = ok(query(srv, scope_ref=f"longterm:objects@{live}", result_limit=3))
    assert pinned["generation_id"] == live == pinned["query_plan"]["pinned_generation"]
    assert ok(query(srv, result_limit=3))["query_plan"]["pinned_generation"] is None
    error(query(srv, scope_ref="longterm:objects@g999"), 410, "generation_unavailable")
    error(query(srv, scope_ref="graph@" + live), 410, "generation_unavailable")
    error(query(srv, scope_ref="items:nope"), 404, "unknown_scope")
    ids = srv.client.get(
        "/v1/scopes/document_ids", params={"namespace": NS, "scope_ref": f"{SCOPE}@{live}"}
    )
    assert ok(ids)["generation_id"] == live and len(ids.json()["document_ids"]) == DOCS


def check_writes_between_pages_are_declared(srv: Server) -> None:
    page1 = ok(query(srv, query_text="box 5 shelf", page_size=3))
    assert page1["query_plan"]["continuation"]["generation_changed"] is False
    rewrite = corpus()[5]
    rewrite["revision"] = 2
    assert srv.post_records([rewrite]).status_code == 200
    srv.wait_projected(timeout=120, documents={(NS, KIND): DOCS})
    page2 = ok(query(srv, query_text="box 5 shelf", cursor=page1["next_cursor"], page_size=3))
    continuation = page2["query_plan"]["continuation"]
    assert continuation["generation_changed"] is True and continuation["page"] == 2
    assert page2["generation_id"] == page1["generation_id"]


def check_paging_across_a_promote(srv: Server) -> None:
    old = live_generation(srv)
    reference = reference_walk(srv)
    page1 = ok(query(srv, page_size=5))
    assert page1["generation_id"] == old
    new = build_sealed(srv)
    assert verify(srv, new)["verified"]
    assert promote(srv, new)["generation_id"] == new
    assert ok(query(srv, result_limit=3))["generation_id"] == new

    page2 = ok(query(srv, cursor=page1["next_cursor"], page_size=5))
    assert page2["generation_id"] == old  # the cursor's generation, not the live one
    plan = page2["query_plan"]
    assert plan["pinned_generation"] == old and plan["continuation"]["generation_id"] == old
    assert plan["continuation"]["generation_changed"] is False
    walked = [r["document_id"] for r in page1["results"] + page2["results"]]
    assert walked == reference[:10]
    # The old generation also answers when pinned explicitly; a new first page reads the new.
    assert ok(query(srv, scope_ref=f"longterm:objects@{old}"))["generation_id"] == old

    ok(admin_post(srv, f"/{old}/retire"))
    error(query(srv, cursor=page2["next_cursor"]), 410, "generation_unavailable")
    error(query(srv, scope_ref=f"longterm:objects@{old}"), 410, "generation_unavailable")
    fresh = walk(srv, [PAGING_DEPTH])
    assert {p["generation_id"] for p in fresh} == {new}
    assert [r["document_id"] for p in fresh for r in p["results"]] == reference


# -- embedded -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("paging") / "data", env=ENV)
    try:
        assert srv.post_records(corpus()).status_code == 200
        srv.wait_projected(documents={(NS, KIND): DOCS})
        yield srv
    finally:
        srv.stop()


def test_pages_cover_the_window_once(embedded: Server) -> None:
    check_pages_cover_the_window_once(embedded)


def test_cursor_errors(embedded: Server) -> None:
    check_cursor_errors(embedded)


def test_response_cache_reissues_cursors(embedded: Server) -> None:
    check_response_cache_reissues_cursors(embedded)


def test_operator_scope_and_pins(embedded: Server) -> None:
    check_operator_scope_and_pins(embedded)


def test_key_rotation_and_workers_without_the_keys(embedded: Server, tmp_path: Path) -> None:
    """A worker still on the old key set issues cursors the rotated worker accepts (the
    first key signs, all verify); a worker without a key refuses the others' cursors,
    and one without any configured key signs with a random key of its own."""
    new_cursor = ok(query(embedded, page_size=5))["next_cursor"]
    assert new_cursor.split(".")[1] == "k2"
    old_keys = {**ENV, "ORRERY_CURSOR_KEYS": f"k1:{KEYS['k1']}"}
    no_keys = {k: v for k, v in ENV.items() if k != "ORRERY_CURSOR_KEYS"}
    for env, name in ((old_keys, "old"), (no_keys, "none")):
        (tmp_path / name).mkdir()
        other = start_server(tmp_path / name / "data", env=env)
        try:
            assert other.post_records(corpus()).status_code == 200
            other.wait_projected(documents={(NS, KIND): DOCS})
            assert live_generation(other) == live_generation(embedded)
            error(query(other, cursor=new_cursor), 400, "invalid_continuation")
            own = ok(query(other, page_size=5))["next_cursor"]
            assert ok(query(other, cursor=own))["results"]
            if name == "old":
                assert own.split(".")[1] == "k1"
                continued = ok(query(embedded, cursor=own))
                assert continued["results"][0]["rank"] == 6
            else:
                assert own.split(".")[1] not in KEYS
                error(query(embedded, cursor=own), 400, "invalid_continuation")
                assert "ORRERY_CURSOR_KEYS is unset" in other.log_path.read_text()
        finally:
            other.stop()


def test_writes_between_pages_are_declared(embedded: Server) -> None:
    check_writes_between_pages_are_declared(embedded)


def test_paging_across_a_promote(embedded: Server) -> None:
    # Last in the module: it retires the first generation.
    check_paging_across_a_promote(embedded)


# -- server mode ----------------------------------------------------------------------------


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_paging_pins_and_errors(tmp_path: Path) -> None:
    from tests.e2e.test_servers_http import server_env

    tag = run_tag()
    opensearch = require_server("opensearch")
    srv = start_server(tmp_path / "data", env={**server_env(tag), **ENV})
    try:
        assert srv.post_records(corpus()).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): DOCS})
        check_pages_cover_the_window_once(srv)
        check_cursor_errors(srv)
        check_response_cache_reissues_cursors(srv)
        check_operator_scope_and_pins(srv)
        check_writes_between_pages_are_declared(srv)
        check_paging_across_a_promote(srv)
    finally:
        srv.stop()
        httpx.delete(f"{opensearch}/orrery-test-{tag}-*", timeout=30)
