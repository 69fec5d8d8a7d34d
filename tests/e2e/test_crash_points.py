"""The crash-point matrix: a process dies exactly between the two writes of a step, and a
restart converges without an operator.

Each trial starts `orrery serve` with `ORRERY_CRASH_AT=<point>` (`contracts.faults`: the
process exits at once with status 137, as after SIGKILL), drives it until it dies there,
restarts it without the hook, writes a few more records and then requires:
- every acknowledged record is in the live generation exactly once (the generation's
  document ids equal the canonical store's live ids, no duplicates);
- the engines' ID-set digests equal the canonical store's (an admin `verify` of the live
  generation reads both engines back and compares them with the store);
- readiness catches up and a query finds the newest record.
Steps × deployments are listed in `docs/reliability.md`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.faults import CRASH_ENV, CRASH_EXIT_CODE
from tests.conftest import require_server, run_tag
from tests.e2e.conftest import Server, canonical_heads, start_server
from tests.e2e.test_generations import (
    BASE_ENV,
    KIND,
    NS,
    SCOPE,
    admin_get,
    admin_post,
    ok,
    records,
    start_build,
    verify,
    wait_state,
)

pytestmark = [pytest.mark.slow]

EMBEDDED = "embedded"
SERVERS = "servers"

# (step, crash point, deployments it exists in). The relay runs only in server mode
# (embedded, the projector reads the outbox itself).
STEPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("ingest: record + outbox committed, no answer yet", "ingest.committed", (EMBEDDED, SERVERS)),
    ("relay: published to Kafka, not marked", "relay.published", (SERVERS,)),
    (
        "projector: generation registered, no engine index",
        "projector.generation_registered",
        (EMBEDDED, SERVERS),
    ),
    (
        "projector: lexical index created, vector index not",
        "projector.lexical_created",
        (EMBEDDED, SERVERS),
    ),
    (
        # The vector write runs beside the lexical one: none, part or all of it is done.
        "projector: lexical written, vectors not (or in part)",
        "projector.lexical_applied",
        (EMBEDDED, SERVERS),
    ),
    (
        "projector: engines written, registry not committed",
        "projector.engines_written",
        (EMBEDDED, SERVERS),
    ),
    (
        "projector: registry committed, log not acknowledged",
        "projector.committed",
        (EMBEDDED, SERVERS),
    ),
    (
        "build: generation registered, indexes not created",
        "build.generation_registered",
        (EMBEDDED, SERVERS),
    ),
    ("promote: pointer switched, aliases not mirrored", "promote.switched", (EMBEDDED, SERVERS)),
]

MATRIX = [
    pytest.param(
        deployment,
        point,
        id=f"{deployment}-{point}",
        marks=[pytest.mark.servers] if deployment == SERVERS else [],
    )
    for _, point, deployments in STEPS
    for deployment in deployments
]


class Deployment:
    """One data directory (and, in server mode, one set of Kafka topics and engine
    names) that `orrery serve` is started on again and again."""

    def __init__(self, kind: str, data_dir: Path) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.tag = run_tag()
        self.env: dict[str, str] = {**BASE_ENV, "ORRERY_PROJECTOR_BATCH_SIZE": "40"}
        if kind == SERVERS:
            from tests.e2e.test_servers_http import server_env

            self.env.update(server_env(self.tag))

    def start(self, crash_at: str | None = None) -> Server:
        env = dict(self.env)
        if crash_at is not None:
            env[CRASH_ENV] = crash_at
        return start_server(self.data_dir, env=env)

    def cleanup(self) -> None:
        if self.kind == SERVERS:
            opensearch = require_server("opensearch")
            httpx.delete(f"{opensearch}/orrery-test-{self.tag}-*", timeout=30)


@contextlib.contextmanager
def deployment(kind: str, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(kind, tmp_path / "data")
    try:
        yield deployed
    finally:
        deployed.cleanup()


def wait_crashed(srv: Server, timeout: float = 90.0) -> None:
    """The process died at its crash point (exit status 137), not otherwise."""
    try:
        code = srv.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        srv.stop()
        log = srv.log_path.read_text()[-3000:]
        raise AssertionError(f"never reached the crash point: {log}") from exc
    srv.client.close()
    assert code == CRASH_EXIT_CODE, srv.log_path.read_text()[-3000:]
    assert "crash point" in srv.log_path.read_text()


def post_until_crash(srv: Server, batch: list[dict[str, Any]]) -> None:
    """Post the batch; the answer may be lost when the point is inside the request."""
    try:
        response = srv.post_records(batch)
        assert response.status_code == 200, response.text
    except httpx.TransportError:
        pass
    wait_crashed(srv)


def canonical_ids(srv: Server) -> dict[str, int]:
    return dict(canonical_heads(srv.data_dir, NS, KIND, srv.database_url))


def live_generation(srv: Server) -> str:
    ready = srv.client.get("/v1/readiness").json()
    return str(next(s for s in ready["scopes"] if s["namespace"] == NS)["generation_id"])


def converged(srv: Server, data_dir: Path, expected: int) -> str:
    """Every check of the module docstring; returns the live generation."""
    srv.wait_projected(timeout=120, documents={(NS, KIND): expected})
    store = canonical_ids(srv)
    assert len(store) == expected
    generation_id = live_generation(srv)
    listed = srv.client.get(
        "/v1/scopes/document_ids", params={"namespace": NS, "scope_ref": SCOPE}
    ).json()["document_ids"]
    assert len(listed) == len(set(listed)), "a document is in the live generation twice"
    assert set(listed) == set(store)
    check = verify(srv, generation_id)
    assert check["verified"], check["check"]
    newest = srv.topk(namespace=NS, scope_ref=SCOPE, query_text="after restart", result_limit=3)
    assert newest.status_code == 200, newest.text
    assert any(r["payload"].get("after") for r in newest.json()["results"])
    return generation_id


def after_restart(start: int, count: int) -> list[dict[str, Any]]:
    batch = records(start, count, word="after restart")
    for record in batch:
        record["payload"]["after"] = True
    return batch


@pytest.mark.parametrize(("kind", "point"), MATRIX)
def test_a_restart_after_a_crash_at_each_point_converges(
    tmp_path: Path, kind: str, point: str
) -> None:
    with deployment(kind, tmp_path) as deployed:
        if point.startswith(("ingest.", "relay.", "projector.")):
            _crash_while_writing(deployed, point)
        elif point == "build.generation_registered":
            _crash_while_building(deployed, point)
        else:
            _crash_while_promoting(deployed, point)


def _crash_while_writing(deployed: Deployment, point: str) -> None:
    srv = deployed.start(crash_at=point)
    post_until_crash(srv, records(0, 120))
    srv = deployed.start()
    try:
        if point == "ingest.committed":
            # The answer was lost: the client sends the batch again. What the crashed
            # process committed answers 409 naming the same revision (the write landed).
            again = srv.post_records(records(0, 120))
            assert again.status_code in (200, 409), again.text[:500]
            items = again.json().get("items") or again.json()["error"]["details"]["items"]
            assert all(
                i["status"] == 201 or i["error"]["details"]["current_revision"] == 1 for i in items
            )
        assert srv.post_records(after_restart(1000, 5)).status_code == 200
        converged(srv, deployed.data_dir, 125)
    finally:
        srv.stop()


def _first_generation(deployed: Deployment, *, and_a_second: bool = False) -> tuple[str, str]:
    """The projector's generation of 120 records, and (asked for) a second one built,
    sealed and verified in the same process: `(first, second or "")`."""
    srv = deployed.start()
    try:
        assert srv.post_records(records(0, 120)).status_code == 200
        srv.wait_projected(timeout=120, documents={(NS, KIND): 120})
        first, second = live_generation(srv), ""
        if and_a_second:
            second = start_build(srv)
            assert wait_state(srv, second)["row"]["state"] == "sealed"
            assert verify(srv, second)["verified"]
        return first, second
    finally:
        srv.stop()


def _crash_while_building(deployed: Deployment, point: str) -> None:
    first, _ = _first_generation(deployed)
    srv = deployed.start(crash_at=point)
    with contextlib.suppress(httpx.TransportError):
        admin_post(srv, "/build", {"namespace": NS, "snapshot_kind": KIND})
    wait_crashed(srv)
    srv = deployed.start()
    try:
        rows = ok(admin_get(srv))["generations"]
        half = [r for r in rows if r["generation_id"] != first]
        assert len(half) == 1 and half[0]["state"] in ("failed", "building"), rows
        assert srv.post_records(after_restart(1000, 5)).status_code == 200
        assert converged(srv, deployed.data_dir, 125) == first
        # A new build after the crashed one completes and verifies.
        rebuilt = start_build(srv)
        view = wait_state(srv, rebuilt)
        assert view["row"]["state"] == "sealed", view["descriptor"]["history"]
        assert verify(srv, rebuilt)["verified"]
    finally:
        srv.stop()


def _crash_while_promoting(deployed: Deployment, point: str) -> None:
    first, second = _first_generation(deployed, and_a_second=True)
    srv = deployed.start(crash_at=point)
    with contextlib.suppress(httpx.TransportError):
        admin_post(srv, f"/{second}/promote")
    wait_crashed(srv)
    srv = deployed.start()
    try:
        assert live_generation(srv) == second
        assert srv.post_records(after_restart(1000, 5)).status_code == 200
        assert converged(srv, deployed.data_dir, 125) == second
        if deployed.kind == SERVERS:
            _assert_aliases_name(deployed, second)
        assert first != second
    finally:
        srv.stop()


def _assert_aliases_name(deployed: Deployment, generation_id: str) -> None:
    """OpenSearch's native alias of the scope names the promoted generation's index."""
    opensearch = require_server("opensearch")
    deadline = time.monotonic() + 30
    while True:
        aliases = httpx.get(f"{opensearch}/_alias", timeout=30).json()
        named = {
            alias: index
            for index, body in aliases.items()
            if index.startswith(f"orrery-test-{deployed.tag}")
            for alias in body.get("aliases", {})
        }
        if named and all(index.endswith(generation_id) for index in named.values()):
            return
        assert time.monotonic() < deadline, named
        time.sleep(0.5)
