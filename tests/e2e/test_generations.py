"""Generations end to end: build → verify → promote → rollback over the admin API and
`orrery gen`, against a real `orrery serve` (embedded), plus the server-mode main flow.

Records carry precomputed 384-d vectors (nothing is embedded but query texts), so builds
are quick; slow builds (for mid-build aborts and kills) use a batch size and a pause.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.events import LogEntry
from contracts.records import Record
from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, canonical_heads, start_server
from tests.fakes import FakeHashingEmbedder

ADMIN_KEY = "test-admin-key"
ADMIN = "/v1/admin/generations"
NS = "gens"
KIND = "objects"
SCOPE = "longterm:objects:current"
DIM = 384
BASE_ENV = {
    "ORRERY_ADMIN_KEY": ADMIN_KEY,
    "ORRERY_ELIGIBILITY_INTERVAL_SECONDS": "2",
    # Every 2 s, unchanged or not: these tests time how soon a change is seen.
    "ORRERY_ELIGIBILITY_MAX_INTERVAL_SECONDS": "2",
    "ORRERY_MAX_RESULT_LIMIT": "500",
}


# -- helpers --------------------------------------------------------------------------------


def vectors(count: int, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((count, DIM))
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return [[round(float(x), 6) for x in row] for row in matrix]


def records(
    start: int, count: int, *, revision: int = 1, word: str = "item", namespace: str = NS
) -> list[dict[str, Any]]:
    return [
        {
            "namespace": namespace,
            "snapshot_kind": KIND,
            "item_id": f"obj-{i}",
            "revision": revision,
            "payload": {"n": i, "revision": revision},
            "text": {
                "title": f"{word} number {i}",
                "body": f"The {word} {i} rests in box {i % 7} on shelf {i % 3}.",
            },
            "metadata": {"status": "active", "updated_at": "2026-06-01T10:00:00Z"},
            "vector": vector,
        }
        for i, vector in zip(
            range(start, start + count), vectors(count, start + revision), strict=True
        )
    ]


def tombstones(items: Sequence[int], revision: int) -> list[dict[str, Any]]:
    return [
        {
            "namespace": NS,
            "snapshot_kind": KIND,
            "item_id": f"obj-{i}",
            "revision": revision,
            "deleted": True,
        }
        for i in items
    ]


def start(data_dir: Path, **env: str) -> Server:
    return start_server(data_dir, env={**BASE_ENV, **env})


def admin_post(srv: Server, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return srv.client.post(ADMIN + path, json=body or {}, headers={"x-admin-key": ADMIN_KEY})


def admin_get(srv: Server, path: str = "") -> httpx.Response:
    return srv.client.get(ADMIN + path, headers={"x-admin-key": ADMIN_KEY})


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return dict(response.json())


def start_build(srv: Server, namespace: str = NS) -> str:
    body = ok(admin_post(srv, "/build", {"namespace": namespace, "snapshot_kind": KIND}), 202)
    return str(body["row"]["generation_id"])


def wait_state(srv: Server, generation_id: str, timeout: float = 120.0) -> dict[str, Any]:
    """Poll until the generation left `building`; returns its view."""
    deadline = time.monotonic() + timeout
    while True:
        view = ok(admin_get(srv, f"/{generation_id}"))
        if view["row"]["state"] != "building":
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


def wait_loading(srv: Server, generation_id: str, done: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        build = ok(admin_get(srv, f"/{generation_id}"))["build"] or {}
        if build.get("phase") == "load" and build.get("done", 0) >= done:
            return
        assert build.get("phase") in (None, "starting", "snapshot", "load"), build
        assert time.monotonic() < deadline, build
        time.sleep(0.02)


def build_sealed(srv: Server) -> str:
    generation_id = start_build(srv)
    view = wait_state(srv, generation_id)
    assert view["row"]["state"] == "sealed", view["descriptor"]["history"]
    return generation_id


def verify(srv: Server, generation_id: str) -> dict[str, Any]:
    return ok(admin_post(srv, f"/{generation_id}/verify"))


def promote(srv: Server, generation_id: str) -> dict[str, Any]:
    return dict(ok(admin_post(srv, f"/{generation_id}/promote"))["report"])


def rollback(srv: Server, namespace: str = NS) -> dict[str, Any]:
    body = {"namespace": namespace, "snapshot_kind": KIND}
    return dict(ok(admin_post(srv, "/rollback", body))["report"])


def best_lexical(answer: dict[str, Any]) -> str:
    """The item the text matched best. The test vectors are random, so the fused order
    may put another document sharing most words first; the text names exactly one."""
    results = answer["results"]
    assert results, answer
    return str(max(results, key=lambda r: r["score_breakdown"].get("lexical", 0.0))["item_id"])


def topk(srv: Server, text: str, limit: int = 10, **extra: Any) -> httpx.Response:
    return srv.topk(namespace=NS, scope_ref=SCOPE, query_text=text, result_limit=limit, **extra)


def gen_cli(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run `orrery gen ARGS --data-dir DATA_DIR --json`; returns (exit code, JSON or None)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "orrery.cli",
            "gen",
            *args,
            "--data-dir",
            str(data_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ORRERY_ADMIN_KEY": ADMIN_KEY, **(env or {})},
        timeout=180,
    )
    try:
        body = json.loads(result.stdout) if result.stdout.strip() else None
    except json.JSONDecodeError:
        body = None
    return result.returncode, body, result.stderr


def canonical(
    data_dir: Path, namespace: str = NS, database_url: str | None = None
) -> tuple[int, str]:
    """The canonical store's live set of the scope: count and ID-set digest."""
    pairs = canonical_heads(data_dir, namespace, KIND, database_url)
    return len(pairs), id_set_digest(pairs)


def live_generation(srv: Server) -> str:
    ready = srv.client.get("/v1/readiness").json()
    return str(next(s for s in ready["scopes"] if s["namespace"] == NS)["generation_id"])


# -- main flow: HTTP + CLI ------------------------------------------------------------------


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start(tmp_path_factory.mktemp("generations") / "data")
    try:
        assert srv.post_records(records(0, 200)).status_code == 200
        srv.wait_projected(documents={(NS, KIND): 200})
        yield srv
    finally:
        srv.stop()


def test_build_verify_promote_rollback_via_cli_and_http(flow: Server) -> None:
    data_dir = flow.data_dir
    first = live_generation(flow)
    code, built, err = gen_cli(data_dir, "build", NS, KIND)
    assert code == 0, err
    generation_id = built["row"]["generation_id"]
    assert built["row"]["state"] == "sealed" and generation_id != first
    descriptor = built["descriptor"]
    assert descriptor["document_count"] == 200
    assert descriptor["source_manifest"]["document_count"] == 200
    assert descriptor["source_manifest_id"] and descriptor["build_receipt_digest"]
    assert descriptor["build_receipt"]["written"] + descriptor["build_receipt"]["skipped"] == 200

    refused = admin_post(flow, f"/{generation_id}/promote")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_state"

    code, verified, err = gen_cli(data_dir, "verify", generation_id)
    assert code == 0, err
    assert verified["verified"] is True and verified["state"] == "verified"
    check = verified["check"]
    assert {e["engine"] for e in check["engines"]} == {"tantivy", "qdrant-edge"}
    assert all(e["id_set_digest"] == check["expected_digest"] for e in check["engines"])
    assert check["coverage"]["matches"] and check["expected_count"] == 200

    code, promoted, err = gen_cli(data_dir, "promote", generation_id)
    assert code == 0, err
    report = promoted["report"]
    assert report["generation_id"] == generation_id and report["previous_generation_id"] == first
    assert all(v.startswith("skipped") for v in report["aliases"].values())

    answer = ok(topk(flow, "item number 17"))
    assert answer["generation_id"] == generation_id == answer["query_plan"]["generation_id"]
    assert best_lexical(answer) == "obj-17"
    assert answer["query_plan"]["fallback"] is None

    ready = flow.client.get("/v1/readiness").json()
    scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
    view = ok(admin_get(flow, f"/{generation_id}"))
    assert scope["generation_id"] == generation_id
    assert scope["descriptor_digest"] == view["row"]["descriptor_digest"]
    assert scope["eligible"] is True and scope["lag_events"] == 0
    assert scope["lag_seconds"] == 0.0 and scope["log_high_water"] == ready["log_high_water"]

    code, back, err = gen_cli(data_dir, "rollback", NS, KIND)
    assert code == 0, err
    assert back["report"]["generation_id"] == first
    assert ok(topk(flow, "item number 17"))["generation_id"] == first

    code, rows, err = gen_cli(data_dir, "list")
    assert code == 0, err
    states = {r["generation_id"]: (r["state"], r["live"]) for r in rows}
    assert states[first] == ("live", True) and states[generation_id] == ("verified", False)
    code, shown, err = gen_cli(data_dir, "show", generation_id)
    assert code == 0, err
    assert [c["state"] for c in shown["descriptor"]["history"]] == [
        "building",
        "sealed",
        "verified",
        "live",
        "verified",
    ]


def test_admin_api_needs_the_admin_key(flow: Server) -> None:
    assert flow.client.get(ADMIN).status_code == 401
    wrong = flow.client.get(ADMIN, headers={"x-admin-key": "nope"})
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "forbidden"
    assert flow.client.get(ADMIN, headers={"authorization": f"Bearer {ADMIN_KEY}"}).is_success


def test_direct_cli_refuses_a_data_dir_a_server_operates(flow: Server) -> None:
    from orrery.gen_cli import DirectAdmin
    from query.settings import QuerySettings

    settings = QuerySettings().model_copy(update={"data_dir": flow.data_dir})
    with pytest.raises(OrreryError) as caught:
        DirectAdmin.open(settings)
    assert caught.value.code is ErrorCode.INVALID_STATE


def test_flips_under_concurrent_query_load(flow: Server) -> None:
    """2 query threads while promote and rollback alternate 10 times each: no failed or
    empty answer, and every answer names exactly one generation."""
    rows = ok(admin_get(flow))["generations"]
    live = next(r["generation_id"] for r in rows if r["live"] and r["namespace"] == NS)
    verified = [r["generation_id"] for r in rows if r["state"] == "verified"]
    if verified:
        standby = verified[-1]
    else:
        standby = build_sealed(flow)
        assert verify(flow, standby)["verified"]
    flip_under_load(flow, live, standby)


def flip_under_load(srv: Server, live: str, standby: str) -> None:
    """Promote `standby` and roll back to `live` ten times each while two threads send
    queries over the scope's 200 documents, from before the first flip until after the
    last; every answer succeeds, is not empty and names one of the two generations, and
    both served some (the standby only during the flips)."""
    failures: list[str] = []
    seen: dict[str, int] = {}
    sent = [0, 0]
    lock = threading.Lock()
    answering = [threading.Event(), threading.Event()]
    flipped = threading.Event()

    def load(worker: int) -> None:
        rng = random.Random(worker + 1)
        with httpx.Client(base_url=f"http://127.0.0.1:{srv.port}", timeout=30) as client:
            # Queries after the last flip prove nothing the flips did: the load runs from
            # its first answer (the flips wait for it) until the flips are done.
            while not flipped.is_set():
                i = rng.randrange(200)
                response = client.post(
                    "/v1/external/retrieve/topk_records",
                    json={
                        "namespace": NS,
                        "scope_ref": SCOPE,
                        "query_text": f"item number {i}",
                        "result_limit": 5,
                    },
                )
                body = response.json()
                with lock:
                    sent[worker] += 1
                    if response.status_code != 200:
                        failures.append(f"{response.status_code}: {response.text[:200]}")
                    elif not body["results"]:
                        failures.append("empty")
                    elif body["generation_id"] != body["query_plan"]["generation_id"] or (
                        body["generation_id"] not in (live, standby)
                    ):
                        failures.append(f"generation {body['generation_id']}")
                    else:
                        seen[body["generation_id"]] = seen.get(body["generation_id"], 0) + 1
                answering[worker].set()

    threads = [threading.Thread(target=load, args=(worker,)) for worker in (0, 1)]
    for thread in threads:
        thread.start()
    flips = 0
    try:
        for event in answering:
            assert event.wait(120), "no answer to the query load"
        for _ in range(10):
            assert promote(srv, standby)["generation_id"] == standby
            time.sleep(0.05)
            assert rollback(srv)["generation_id"] == live
            time.sleep(0.05)
            flips += 2
    finally:
        flipped.set()
        for thread in threads:
            thread.join(300)
    assert flips == 20
    assert failures == []
    assert sum(seen.values()) == sum(sent) and set(seen) == {live, standby}, (seen, sent)


# -- dual write, aborts, crashes ------------------------------------------------------------


EMBEDDED = "embedded"
SERVERS = "servers"
DEPLOYMENTS = [
    pytest.param(EMBEDDED, id=EMBEDDED),
    pytest.param(SERVERS, id=SERVERS, marks=[pytest.mark.servers, pytest.mark.slow]),
]


@contextlib.contextmanager
def deployed(kind: str, data_dir: Path, **env: str) -> Iterator[Server]:
    """A running `orrery serve` of either deployment; server mode gets names unique to
    the test and its OpenSearch indexes are deleted afterwards."""
    if kind == EMBEDDED:
        srv = start(data_dir, **env)
        try:
            yield srv
        finally:
            srv.stop()
        return
    from tests.e2e.test_servers_http import server_env

    tag = run_tag()
    opensearch = require_server("opensearch")
    srv = start_server(data_dir, env={**server_env(tag), **BASE_ENV, **env})
    try:
        yield srv
    finally:
        srv.stop()
        httpx.delete(f"{opensearch}/orrery-test-{tag}-*", timeout=30)


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_writes_during_a_build_reach_the_new_generation(tmp_path: Path, deployment: str) -> None:
    """Embedded: the bulk load runs in a child process and the projector defers the new
    generation's writes until the hand-over replays them. Server mode: the projector
    dual-writes into the generation while this process loads it. Either way nothing
    written during the build is missing after promote."""
    with deployed(
        deployment,
        tmp_path / "data",
        ORRERY_GEN_BUILD_BATCH_SIZE="25",
        ORRERY_GEN_BUILD_PAUSE_SECONDS="0.1",
    ) as srv:
        assert srv.post_records(records(0, 300)).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): 300})
        generation_id = start_build(srv)
        wait_loading(srv, generation_id, 50)
        # New documents, updates, deletes (of loaded and not yet loaded documents), a
        # stale revision (409) and a re-upsert after a delete, all while it builds.
        assert srv.post_records(records(300, 20, word="zebra")).status_code == 200
        assert srv.post_records(records(0, 10, revision=2, word="giraffe")).status_code == 200
        assert srv.post_records(tombstones([20, 21, 250, 251], revision=2)).status_code == 200
        stale = srv.post_records(records(5, 1, revision=1))
        assert stale.status_code == 409
        assert srv.post_records(records(250, 1, revision=3, word="phoenix")).status_code == 200
        if deployment == EMBEDDED:
            # The writes arrived while the child was still loading.
            assert ok(admin_get(srv, f"/{generation_id}"))["build"]["phase"] == "load"
        view = wait_state(srv, generation_id)
        assert view["row"]["state"] == "sealed", view["descriptor"]["history"]
        receipt = view["descriptor"]["build_receipt"]
        # Only the child process builds the vector index's graph as part of the load.
        assert ("optimize" in receipt["durations_s"]) is (deployment == EMBEDDED)
        srv.wait_projected(timeout=60, documents={(NS, KIND): 317})
        check = verify(srv, generation_id)
        assert check["verified"], check
        count, digest = canonical(srv.data_dir, database_url=srv.database_url)
        assert check["check"]["expected_digest"] == digest and count == 300 + 20 - 3
        promote(srv, generation_id)
        answer = ok(topk(srv, "zebra number 310"))
        assert answer["generation_id"] == generation_id
        assert best_lexical(answer) == "obj-310"
        # Ten documents say "giraffe number": the random test vectors, not the text,
        # may rank another one first. What matters: obj-3 is there, at revision 2.
        updated = ok(topk(srv, "giraffe number 3", limit=5))
        hit = next(r for r in updated["results"] if r["item_id"] == "obj-3")
        assert hit["payload"]["revision"] == 2 and hit["score_breakdown"]["lexical"] == 1.0
        reborn = ok(topk(srv, "phoenix number 250"))
        assert best_lexical(reborn) == "obj-250"
        gone = ok(topk(srv, "item number 21", limit=50))
        assert "obj-21" not in [r["item_id"] for r in gone["results"]]
        everything = ok(topk(srv, "", limit=400, filters={"status": ["active"]}))
        assert len(everything["results"]) == 317


def bulk_load_children(data_dir: Path) -> list[int]:
    """Pids of the bulk-load child processes working on `data_dir`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"projector.entrypoints.bulk_load" in argv and str(data_dir).encode() in argv:
            found.append(int(entry.name))
    return found


def wait_gone(pids: Sequence[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.05)


def test_a_killed_bulk_load_child_fails_its_generation_only(tmp_path: Path) -> None:
    """SIGKILL the child mid-load: its generation fails (never promotable), the live
    one keeps serving every document, the projector goes on, and a rebuild succeeds."""
    data_dir = tmp_path / "data"
    srv = start(data_dir, ORRERY_GEN_BUILD_BATCH_SIZE="20", ORRERY_GEN_BUILD_PAUSE_SECONDS="0.2")
    try:
        assert srv.post_records(records(0, 300)).status_code == 200
        srv.wait_projected(documents={(NS, KIND): 300})
        live = live_generation(srv)
        killed = start_build(srv)
        wait_loading(srv, killed, 40)
        children = bulk_load_children(data_dir)
        assert len(children) == 1
        os.kill(children[0], signal.SIGKILL)
        view = wait_state(srv, killed)
        assert view["row"]["state"] == "failed"
        reason = view["descriptor"]["history"][-1]["reason"]
        assert "killed by signal 9" in reason, reason
        refused = admin_post(srv, f"/{killed}/promote")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_state"
        assert srv.post_records(records(300, 5, word="otter")).status_code == 200
        srv.wait_projected(documents={(NS, KIND): 305})
        answer = ok(topk(srv, "", limit=400, filters={"status": ["active"]}))
        assert answer["generation_id"] == live and len(answer["results"]) == 305
        rebuilt = build_sealed(srv)
        assert verify(srv, rebuilt)["verified"]
        promote(srv, rebuilt)
        answer = ok(topk(srv, "otter number 302"))
        assert answer["generation_id"] == rebuilt and best_lexical(answer) == "obj-302"
        report = ok(admin_post(srv, "/gc", {"keep": 0}))["report"]
        assert report["dropped"] == [killed]
        assert not (data_dir / "generations" / "vectors" / killed).exists()
        assert bulk_load_children(data_dir) == []
    finally:
        srv.stop()


# A build slow enough to be caught mid-load.
SLOW_BUILD = {"ORRERY_GEN_BUILD_BATCH_SIZE": "20", "ORRERY_GEN_BUILD_PAUSE_SECONDS": "0.2"}


def abort_mid_build(srv: Server, live: str) -> str:
    """Start a build, abort it mid-load: it is failed, refused for promotion, and the
    live generation keeps answering. Returns the aborted generation's id."""
    aborted = start_build(srv)
    wait_loading(srv, aborted, 20)
    body = ok(admin_post(srv, f"/{aborted}/abort"))
    assert body["descriptor"]["state"] == "failed"
    refused = admin_post(srv, f"/{aborted}/promote")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_state"
    assert ok(topk(srv, "item number 5"))["generation_id"] == live
    return aborted


def test_aborted_and_killed_builds_are_never_promotable(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = start(data_dir, **SLOW_BUILD)
    try:
        assert srv.post_records(records(0, 300)).status_code == 200
        srv.wait_projected(documents={(NS, KIND): 300})
        live = live_generation(srv)

        aborted = abort_mid_build(srv, live)

        killed = start_build(srv)
        wait_loading(srv, killed, 20)
        children = bulk_load_children(data_dir)
        assert len(children) == 1
        srv.process.kill()  # SIGKILL, mid-build
        srv.process.wait(30)
        srv.client.close()
        wait_gone(children)  # its stdin closed: a child never outlives its server
    finally:
        if srv.process.poll() is None:
            srv.stop()
    srv = start(data_dir)
    try:
        view = ok(admin_get(srv, f"/{killed}"))
        assert view["row"]["state"] == "failed"
        assert "builder stopped" in view["descriptor"]["history"][-1]["reason"]
        refused = admin_post(srv, f"/{killed}/promote")
        assert refused.status_code == 409
        assert ok(topk(srv, "item number 5"))["generation_id"] == live
        rebuilt = build_sealed(srv)
        assert verify(srv, rebuilt)["verified"]
        promote(srv, rebuilt)
        answer = ok(topk(srv, "item number 5"))
        assert answer["generation_id"] == rebuilt and best_lexical(answer) == "obj-5"
        report = ok(admin_post(srv, "/gc", {"keep": 0}))["report"]
        assert set(report["dropped"]) == {aborted, killed}
        assert not (data_dir / "generations" / "lexical" / killed).exists()
    finally:
        srv.stop()


# -- a corrupted replica --------------------------------------------------------------------


def _corrupt(data_dir: Path, generation_id: str, items: Sequence[int]) -> list[str]:
    """Delete documents from the generation's tantivy index behind the registry's back."""
    from projector.adapters.tantivy_lexical import TantivyLexicalIndex

    doc_ids = [
        Record(namespace=NS, snapshot_kind=KIND, item_id=f"obj-{i}", revision=1).doc_id
        for i in items
    ]
    index = TantivyLexicalIndex(data_dir / "generations" / "lexical")
    try:
        index.apply(generation_id, [], [(d, 1) for d in doc_ids])
    finally:
        index.close()
    return sorted(doc_ids)


def test_a_corrupt_replica_is_bypassed_never_served_partially(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = start(data_dir)
    try:
        assert srv.post_records(records(0, 60)).status_code == 200
        srv.wait_projected(documents={(NS, KIND): 60})
        previous = live_generation(srv)
        generation_id = build_sealed(srv)
        assert verify(srv, generation_id)["verified"]
        promote(srv, generation_id)
        full = ok(topk(srv, "", limit=100, filters={"status": ["active"]}))
        assert len(full["results"]) == 60
    finally:
        srv.stop()
    deleted = _corrupt(data_dir, generation_id, [3, 4, 5])

    srv = start(data_dir)
    try:
        refused = topk(srv, "item number 7")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "coverage_unavailable"
        assert error["details"]["generation_id"] == generation_id
        assert error["details"]["scope_ref"] == SCOPE and error["details"]["namespace"] == NS
        ready = srv.client.get("/v1/readiness").json()
        scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
        assert scope["eligible"] is False and ready["ready"] is False

        code, result, err = gen_cli(data_dir, "verify", generation_id)
        assert code == 1, err
        assert result["verified"] is False and result["state"] == "failed"
        tantivy = next(e for e in result["check"]["engines"] if e["engine"] == "tantivy")
        assert tantivy["missing_count"] == 3 and list(tantivy["missing"]) == deleted
        vector = next(e for e in result["check"]["engines"] if e["engine"] == "qdrant-edge")
        assert vector["matches"]
    finally:
        srv.stop()

    srv = start(data_dir, ORRERY_COVERAGE_FALLBACK="previous_verified")
    try:
        check_previous_verified_fallback(srv, previous, generation_id)
    finally:
        srv.stop()


def check_previous_verified_fallback(srv: Server, previous: str, corrupt: str) -> None:
    """With the live generation `corrupt` ineligible, the declared fallback answers from
    `previous` with every document (never fewer), says so, and a rollback ends it."""
    answer = ok(topk(srv, "", limit=100, filters={"status": ["active"]}))
    assert answer["generation_id"] == previous
    fallback = answer["query_plan"]["fallback"]
    assert fallback["policy"] == "previous_verified"
    assert fallback["live_generation_id"] == corrupt
    assert len(answer["results"]) == 60  # never fewer
    assert rollback(srv)["generation_id"] == previous
    again = ok(topk(srv, "item number 7"))
    assert again["generation_id"] == previous and again["query_plan"]["fallback"] is None


# -- duplicated and out-of-order delivery, in process ---------------------------------------


class ChaoticLog:
    """An `EventLog` that re-delivers old entries, duplicates and shuffles each batch
    (what an at-least-once transport may do), over the real outbox log."""

    def __init__(self, inner: Any, seed: int) -> None:
        self._inner = inner
        self._rng = random.Random(seed)
        self._seen: list[LogEntry] = []

    def fetch(self, limit: int) -> list[LogEntry]:
        fresh = list(self._inner.fetch(limit))
        if not fresh:
            return []
        replays = self._rng.sample(self._seen, min(len(self._seen), 5))
        self._seen.extend(fresh)
        batch = fresh + [self._rng.choice(fresh) for _ in range(3)] + replays
        self._rng.shuffle(batch)
        return batch

    def acknowledge(self, entries: Sequence[LogEntry]) -> None:
        self._inner.acknowledge(entries)

    def reset(self) -> None:
        self._inner.reset()

    def high_water(self) -> int:
        return int(self._inner.high_water())

    def close(self) -> None:
        self._inner.close()


def _record(i: int, revision: int, *, deleted: bool = False) -> Record:
    return Record(
        namespace=NS,
        snapshot_kind=KIND,
        item_id=f"obj-{i}",
        revision=revision,
        deleted=deleted,
        text={"title": f"thing {i} rev {revision}", "body": f"body {i}"},
    )


@dataclass
class Pipeline:
    """An embedded store, projector and generation admin in this process; `step` runs
    one projector batch over the (wrapped) log."""

    data_dir: Path
    store: Any
    projector: Any
    admin: Any
    step: Callable[[], Any]

    def parts(self) -> tuple[Path, Any, Any, Any, Callable[[], Any]]:
        return self.data_dir, self.store, self.projector, self.admin, self.step


@contextlib.contextmanager
def in_process_pipeline(
    tmp_path: Path, wrap_log: Callable[[Any], Any], *, build_batch: int, in_child: bool
) -> Iterator[Pipeline]:
    from ingest.adapters.sqlite_store import SqliteRecordStore
    from projector.bootstrap import EmbedderFactory, embedded_generation_admin, embedded_projector
    from projector.generations import GenerationOptions
    from projector.service import project_batch

    data_dir = tmp_path / "data"
    db = data_dir / "orrery.sqlite"
    store = SqliteRecordStore(db)
    projector = embedded_projector(data_dir, db, embedder=FakeHashingEmbedder(16), batch_size=40)
    step: Callable[[], Any] = functools.partial(
        project_batch,
        log=wrap_log(projector.log),
        state=projector.deferred.wrap(projector.state),
        lexical=projector.lexical,
        vectors=projector.vectors,
        embedder=projector.embedder,
        cache=projector.state,
        lexical_engine="tantivy",
        vector_engine="qdrant-edge",
        batch_size=40,
        lock=projector.lock,
    )
    admin = embedded_generation_admin(
        projector,
        db,
        drive_log=None,
        options=GenerationOptions(batch_size=build_batch, load_in_child=in_child),
        embedder_factory=EmbedderFactory("tests.fakes:FakeHashingEmbedder", {"dimension": 16}),
    )
    try:
        yield Pipeline(data_dir, store, projector, admin, step)
    finally:
        admin.close()
        projector.close()
        store.close()


@pytest.mark.parametrize("in_child", [True, False], ids=["child-process-load", "in-process-load"])
def test_duplicates_reordering_and_conflicts_converge_to_the_canonical_set(
    tmp_path: Path, in_child: bool
) -> None:
    """A build while the log re-delivers, duplicates and reorders events and producers
    hit revision conflicts. The snapshot loaded by a child process (the projector's
    writes deferred, then replayed from the outbox) or in this one (dual writes)."""
    from contracts.admin import BuildRequest
    from projector.generations import BuildControl

    rng = random.Random(3)
    revisions = {i: 1 for i in range(200)}
    with in_process_pipeline(
        tmp_path, lambda log: ChaoticLog(log, seed=7), build_batch=30, in_child=in_child
    ) as pipe:
        data_dir, store, projector, admin, step = pipe.parts()
        store.write([_record(i, 1) for i in range(200)])
        while step().events:
            pass
        built: list[Any] = []
        failure: list[BaseException] = []

        def build() -> None:
            try:
                built.append(
                    admin.build(BuildRequest(namespace=NS, snapshot_kind=KIND), BuildControl())
                )
            except BaseException as exc:
                failure.append(exc)

        builder = threading.Thread(target=build)
        builder.start()
        rounds = 0
        while builder.is_alive() and rounds < 2_000:
            rounds += 1
            batch: list[Record] = []
            for i in rng.sample(range(220), 8):
                current = revisions.get(i, 0)
                if rng.random() < 0.2 and current:
                    batch.append(_record(i, current))  # a revision conflict: refused
                    continue
                revisions[i] = current + 1
                batch.append(_record(i, current + 1, deleted=rng.random() < 0.25))
            store.write(batch)
            step()
        builder.join(60)
        assert not failure, failure
        assert built and built[0].state.value == "sealed"
        assert built[0].build_receipt is not None
        assert ("optimize" in built[0].build_receipt.durations_s) is in_child
        assert rounds > 0  # the chaos went on while it built
        while step().events:
            pass
        count, digest = canonical(data_dir)
        for generation_id in (g for g in ("g1", built[0].generation_id)):
            registry = projector.state.registry_pairs(generation_id)
            assert id_set_digest(registry.pairs.items()) == digest
            assert len(registry.pairs) == count
            assert projector.lexical.evidence(generation_id).id_set_digest == digest
            assert projector.vectors.evidence(generation_id).id_set_digest == digest
        check = admin.verify(built[0].generation_id)
        assert check.ok, check.reason


class ReplayingLog(ChaoticLog):
    """Delivers in order, and once `replay_all` is set, every entry seen so far again
    (an at-least-once consumer rewound to the start)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, seed=0)
        self.replay_all = False

    def fetch(self, limit: int) -> list[LogEntry]:
        if self.replay_all:
            self.replay_all = False
            return list(self._seen)
        fresh = list(self._inner.fetch(limit))
        self._seen.extend(fresh)
        return fresh


@pytest.mark.parametrize("in_child", [True, False], ids=["child-process-load", "in-process-load"])
def test_a_rebuilt_generation_keeps_deletes_made_before_its_snapshot(
    tmp_path: Path, in_child: bool
) -> None:
    """Documents deleted before the snapshot are not in it; when the log later delivers
    their old upserts again, the new generation must refuse them like the one that saw
    the deletes (the snapshot carries tombstones)."""
    from contracts.admin import BuildRequest
    from projector.generations import BuildControl

    logs: list[ReplayingLog] = []

    def wrap(inner: Any) -> ReplayingLog:
        logs.append(ReplayingLog(inner))
        return logs[0]

    with in_process_pipeline(tmp_path, wrap, build_batch=7, in_child=in_child) as pipe:
        data_dir, store, projector, admin, step = pipe.parts()
        log = logs[0]
        store.write([_record(i, 1) for i in range(30)])
        store.write([_record(i, 2, deleted=True) for i in range(0, 30, 3)])
        while step().events:
            pass
        built = admin.build(BuildRequest(namespace=NS, snapshot_kind=KIND), BuildControl())
        assert built.state.value == "sealed"
        log.replay_all = True
        assert step().events == 40  # every old upsert and delete, once more
        count, digest = canonical(data_dir)
        assert count == 20
        for generation_id in ("g1", built.generation_id):
            registry = projector.state.registry_pairs(generation_id)
            assert id_set_digest(registry.pairs.items()) == digest, generation_id
            assert projector.lexical.evidence(generation_id).id_set_digest == digest
            assert projector.vectors.evidence(generation_id).id_set_digest == digest
        assert admin.verify(built.generation_id).ok


# -- server mode ----------------------------------------------------------------------------


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_build_verify_promote_rollback(tmp_path: Path) -> None:
    """The main flow over OpenSearch + Qdrant server + Kafka: the
    same admin API, with native aliases mirrored on promote and rollback."""
    from tests.e2e.test_servers_http import server_env

    tag = run_tag()
    opensearch = require_server("opensearch")
    srv = start_server(tmp_path / "data", env={**server_env(tag), **BASE_ENV})
    try:
        assert srv.post_records(records(0, 120)).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): 120})
        first = live_generation(srv)
        generation_id = build_sealed(srv)
        check = verify(srv, generation_id)
        assert check["verified"], check
        assert {e["engine"] for e in check["check"]["engines"]} == {"opensearch", "qdrant"}
        report = promote(srv, generation_id)
        alias = f"orrery-test-{tag}-live.{NS}.{KIND}"
        assert report["aliases"]["opensearch"] == f"{alias} -> {generation_id}"
        assert report["aliases"]["qdrant"] == f"{alias} -> {generation_id}"
        mirrored = httpx.get(f"{opensearch}/_alias/{alias}", timeout=10).json()
        assert list(mirrored) == [f"orrery-test-{tag}-{generation_id}"]
        answer = ok(topk(srv, "item number 17"))
        assert answer["generation_id"] == generation_id
        assert best_lexical(answer) == "obj-17"
        assert srv.post_records(records(500, 3, word="walrus")).status_code == 200
        srv.wait_projected(timeout=60, documents={(NS, KIND): 123})
        assert best_lexical(ok(topk(srv, "walrus number 501"))) == "obj-501"
        assert rollback(srv)["generation_id"] == first
        back = ok(topk(srv, "walrus number 501"))
        assert back["generation_id"] == first and best_lexical(back) == "obj-501"
        mirrored = httpx.get(f"{opensearch}/_alias/{alias}", timeout=10).json()
        assert list(mirrored) == [f"orrery-test-{tag}-{first}"]
    finally:
        srv.stop()
        httpx.delete(f"{opensearch}/orrery-test-{tag}-*", timeout=30)


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_flips_under_concurrent_query_load_and_aborts(tmp_path: Path) -> None:
    """Server mode: an aborted build is failed and never promotable; then promote and
    rollback alternate ten times each under two query threads."""
    with deployed(SERVERS, tmp_path / "data", **SLOW_BUILD) as srv:
        assert srv.post_records(records(0, 200)).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): 200})
        live = live_generation(srv)

        abort_mid_build(srv, live)

        standby = build_sealed(srv)
        assert verify(srv, standby)["verified"]
        flip_under_load(srv, live, standby)
        assert live_generation(srv) == live


@pytest.mark.servers
@pytest.mark.slow
def test_server_mode_corrupt_replica_is_bypassed_never_served_partially(tmp_path: Path) -> None:
    """Documents deleted directly in OpenSearch behind the registry's back: the query
    worker's scheduled evidence check fails the live generation, so queries get 503
    `coverage_unavailable` (never fewer results); verify fails it with the missing
    ids; with `ORRERY_COVERAGE_FALLBACK=previous_verified` the previous verified
    generation answers in full, declared in the plan."""
    from tests.e2e.test_servers_http import server_env

    tag = run_tag()
    opensearch = require_server("opensearch")
    data_dir = tmp_path / "data"
    env = {**server_env(tag), **BASE_ENV}
    srv = start_server(data_dir, env=env)
    try:
        assert srv.post_records(records(0, 60)).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): 60})
        previous = live_generation(srv)
        generation_id = build_sealed(srv)
        assert verify(srv, generation_id)["verified"]
        promote(srv, generation_id)
        full = ok(topk(srv, "", limit=100, filters={"status": ["active"]}))
        assert full["generation_id"] == generation_id and len(full["results"]) == 60

        index = ok(admin_get(srv, f"/{generation_id}"))["descriptor"]["topology"]["lexical_index"]
        deleted = sorted(
            Record(namespace=NS, snapshot_kind=KIND, item_id=f"obj-{i}", revision=1).doc_id
            for i in (3, 4, 5)
        )
        for doc_id in deleted:
            gone = httpx.delete(f"{opensearch}/{index}/_doc/{doc_id}?refresh=true", timeout=10)
            assert gone.status_code == 200, gone.text
        deadline = time.monotonic() + 60
        while (refused := topk(srv, "item number 7")).status_code == 200:
            # Until the next scheduled check, the replica still looks eligible.
            assert len(refused.json()["results"]) > 0
            assert time.monotonic() < deadline, "the corrupt replica was never bypassed"
            time.sleep(0.2)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "coverage_unavailable"
        assert error["details"]["generation_id"] == generation_id
        assert error["details"]["scope_ref"] == SCOPE
        ready = srv.client.get("/v1/readiness").json()
        scope = next(s for s in ready["scopes"] if s["namespace"] == NS)
        assert scope["eligible"] is False and ready["ready"] is False

        result = verify(srv, generation_id)
        assert result["verified"] is False and result["state"] == "failed"
        engines = {e["engine"]: e for e in result["check"]["engines"]}
        assert engines["opensearch"]["missing_count"] == 3
        assert list(engines["opensearch"]["missing"]) == deleted
        assert engines["qdrant"]["matches"]
    finally:
        srv.stop()

    srv = start_server(data_dir, env={**env, "ORRERY_COVERAGE_FALLBACK": "previous_verified"})
    try:
        check_previous_verified_fallback(srv, previous, generation_id)
    finally:
        srv.stop()
        httpx.delete(f"{opensearch}/orrery-test-{tag}-*", timeout=30)
