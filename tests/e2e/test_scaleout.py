"""Server mode across machines (issue 13): every role in its own process, all state in
PostgreSQL, Kafka, OpenSearch, the Qdrant server and Redis.

One ingest API, two relays, two projectors (one Kafka consumer group) and two query
workers, each process with its own data dir and none sharing a file: both workers answer
every query identically, a cursor from one pages on the other, a promote through one is
served by the other, SIGKILLing a projector and a relay mid-stream loses and duplicates
nothing, and no process wrote a file.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from contracts.digests import id_set_digest
from tests.conftest import new_database, require_server, run_tag
from tests.e2e.conftest import Server, start_server
from tests.e2e.test_generations import vectors
from tests.e2e.test_servers_http import _spawn, server_env

pytestmark = [pytest.mark.servers, pytest.mark.slow]

NS = "scale"
KIND = "objects"
SCOPE = "longterm:objects:current"
ADMIN_KEY = "scaleout-admin-key"
CURSOR_KEYS = "k1:scaleout-secret-0123456789"
VOCABULARIES = {
    NS: {
        "household": {
            "thermos": ["red thermos"],
            "hose": ["garden hose"],
            "cupboard": ["hall cupboard", "kitchen cupboard"],
        }
    }
}
FIRST = 240  # records before the comparisons
BULK = 600  # records written while a projector and a relay are killed
PLACES = ["hall cupboard", "kitchen cupboard", "garden shed", "car boot", "attic", "cellar"]
THINGS = ["red thermos", "garden hose", "spare keys", "reading glasses", "umbrella", "toolbox"]
STATUSES = ["active", "active", "candidate", "superseded"]
PROFILES = ["weighted@1", "weighted@2", "weighted@3", "rrf@1", "rrf@2"]


def record(i: int, vector: list[float], *, word: str = "item") -> dict[str, Any]:
    thing, place = THINGS[i % len(THINGS)], PLACES[(i // 2) % len(PLACES)]
    return {
        "namespace": NS,
        "snapshot_kind": KIND,
        "item_id": f"obj-{i}",
        "revision": 1,
        "galaxy": "anna" if i % 5 == 0 else "ben",
        "payload": {"n": i, "thing": thing},
        "text": {
            "title": f"{thing} {word} {i}",
            "body": f"The {thing} is in the {place}, box {i % 7}.",
            "tags": [place.split()[0]],
        },
        "metadata": {
            "status": STATUSES[i % len(STATUSES)],
            "updated_at": f"2026-0{1 + i % 9}-1{i % 10}T10:00:00Z",
        },
        "vector": vector,
    }


def records(start: int, count: int, *, word: str = "item") -> list[dict[str, Any]]:
    return [
        record(i, vector, word=word)
        for i, vector in zip(range(start, start + count), vectors(count, start), strict=True)
    ]


def queries() -> list[dict[str, Any]]:
    """Over 50 requests: every profile, filters, a filter-only query, weights, phrase
    plans."""
    texts = [
        "red thermos",
        "garden hose shed",
        "where are the spare keys",
        "umbrella attic",
        "reading glasses cellar box",
        "toolbox in the car boot",
    ]
    out: list[dict[str, Any]] = []
    for text in texts:
        for profile in PROFILES:
            out.append({"query_text": text, "profile": profile})
    for text in texts:
        out.append({"query_text": text, "filters": {"status": ["active"]}})
        out.append({"query_text": text, "filters": {"galaxy": "anna"}})
        out.append({"query_text": text, "filters": {"status": ["candidate", "superseded"]}})
        out.append({"query_text": text, "ranking": {"vector_weight": 0.0}})
        out.append({"query_text": text, "ranking": {"lexical_weight": 0.0}, "result_limit": 25})
    out.append({"query_text": "", "filters": {"status": ["candidate"]}})
    for groups in (["thermos"], ["hose"], ["cupboard"]):
        plan = {
            "vocabulary": "household",
            "groups": [{"alternatives": groups, "required": True}],
        }
        out.append({"query_text": "where is it", "phrase_plan": plan})
    return out


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """What must be equal across workers: the generation, the profile and every result
    (ids, revisions, ranks, scores, breakdowns, payloads, `payload_sha256`)."""
    return {k: body[k] for k in ("generation_id", "profile", "results")}


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return dict(response.json())


def topk(worker: Server, **body: Any) -> dict[str, Any]:
    body = {"namespace": NS, "scope_ref": SCOPE, "result_limit": 10, **body}
    return ok(worker.topk(**body))


def admin(worker: Server, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return worker.client.post(
        f"/v1/admin/generations{path}", json=body or {}, headers={"x-admin-key": ADMIN_KEY}
    )


def canonical(url: str) -> tuple[int, str, list[str]]:
    """The live documents of the scope in the canonical store: count, id-set digest, ids."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT document_id, revision FROM heads WHERE namespace = %s AND "
            "snapshot_kind = %s AND NOT deleted ORDER BY document_id",
            (NS, KIND),
        ).fetchall()
    pairs = [(str(d), int(r)) for d, r in rows]
    return len(pairs), id_set_digest(pairs), [d for d, _ in pairs]


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if not p.is_dir()) if path.exists() else []


@dataclass
class Deployment:
    url: str
    tag: str
    root: Path
    ingest: Server
    relays: list[subprocess.Popen[bytes]]
    projectors: list[subprocess.Popen[bytes]]
    workers: list[Server]
    dirs: list[Path] = field(default_factory=list)

    def wait_all(self, count: int, timeout: float = 120.0) -> None:
        for worker in self.workers:
            worker.wait_projected(timeout=timeout, documents={(NS, KIND): count})


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("scaleout")
    tag = run_tag()
    with new_database() as url:
        env = server_env(
            tag,
            ORRERY_DATABASE_URL=url,
            ORRERY_CURSOR_KEYS=CURSOR_KEYS,
            ORRERY_ADMIN_KEY=ADMIN_KEY,
            ORRERY_VOCABULARIES=__import__("json").dumps(VOCABULARIES),
            # Both workers really compute every answer (no shared response cache).
            ORRERY_CACHE_RESPONSES="false",
            # Freshness decays with the wall clock of the answering moment, so two answers
            # a few ms apart can differ in its 6th decimal: with a half-life of 10^6 days
            # it moves 10^-11 a second, and every score of both workers must be equal.
            ORRERY_FRESHNESS_HALF_LIFE_DAYS="1000000",
            ORRERY_ELIGIBILITY_INTERVAL_SECONDS="5",
            ORRERY_ELIGIBILITY_MAX_INTERVAL_SECONDS="5",  # every 5 s, unchanged or not
            ORRERY_PROJECTOR_BATCH_SIZE="40",
            ORRERY_RELAY_BATCH_SIZE="40",
            ORRERY_KAFKA_PARTITIONS="4",
        )
        dirs = {name: root / name for name in ("ingest", "relay1", "relay2", "p1", "p2")}
        worker_dirs = [root / "w1", root / "w2"]
        for path in worker_dirs:
            path.mkdir()  # empty, and checked to stay so
        started: list[Server] = []
        spawned: list[subprocess.Popen[bytes]] = []
        try:
            ingest = start_server(dirs["ingest"], env=env, command="ingest-api")
            started.append(ingest)
            relays = [
                _spawn(["relay"], dirs[name], env, root / f"{name}.log")
                for name in ("relay1", "relay2")
            ]
            projectors = [
                _spawn(["project"], dirs[name], env, root / f"{name}.log") for name in ("p1", "p2")
            ]
            spawned += relays + projectors
            workers = []
            for path in worker_dirs:
                workers.append(start_server(path, env=env, command="query-worker"))
                started.append(workers[-1])
            yield Deployment(
                url,
                tag,
                root,
                ingest,
                relays,
                projectors,
                workers,
                [*dirs.values(), *worker_dirs],
            )
        finally:
            for server in started:
                server.stop()
            for process in spawned:
                _kill(process)
            opensearch = require_server("opensearch")
            httpx.delete(f"{opensearch}/orrery-test-{tag}-*", timeout=30)
            qdrant = require_server("qdrant")
            listed = httpx.get(f"{qdrant}/collections", timeout=10).json()
            for collection in listed["result"]["collections"]:
                if collection["name"].startswith(f"orrery-test-{tag}"):
                    httpx.delete(f"{qdrant}/collections/{collection['name']}", timeout=30)


@pytest.fixture(scope="module")
def loaded(deployment: Deployment) -> Deployment:
    batch = records(0, FIRST)
    for start in range(0, len(batch), 80):
        assert deployment.ingest.post_records(batch[start : start + 80]).status_code == 200
    deployment.wait_all(FIRST)
    return deployment


def test_both_workers_give_identical_answers(loaded: Deployment) -> None:
    first, second = loaded.workers
    asked = queries()
    assert len(asked) > 50
    for query in asked:
        one, other = topk(first, **query), topk(second, **query)
        assert one["results"], query
        assert comparable(one) == comparable(other), query
        assert one["query_plan"]["cache"] != "hit" and other["query_plan"]["cache"] != "hit"
    # A phrase plan restricts the candidates to its documents.
    plan = {"vocabulary": "household", "groups": [{"alternatives": ["thermos"]}]}
    restricted = topk(first, query_text="where is it", phrase_plan=plan)
    assert {r["payload"]["thing"] for r in restricted["results"]} == {"red thermos"}


def test_a_cursor_of_one_worker_pages_on_the_other(loaded: Deployment) -> None:
    first, second = loaded.workers
    body = {"query_text": "box cupboard shed", "page_size": 7, "result_limit": 7}
    alone = [topk(first, **body)]
    while alone[-1]["next_cursor"] is not None and len(alone) < 3:
        alone.append(topk(first, **body, cursor=alone[-1]["next_cursor"]))
    assert len(alone) == 3
    page_1 = topk(first, **body)
    page_2 = topk(second, **body, cursor=page_1["next_cursor"])
    page_3 = topk(first, **body, cursor=page_2["next_cursor"])
    mixed = [page_1, page_2, page_3]
    assert [comparable(p) for p in mixed] == [comparable(p) for p in alone]


def test_a_promote_through_one_worker_is_served_by_the_other(loaded: Deployment) -> None:
    first, second = loaded.workers
    before = topk(second, query_text="red thermos")["generation_id"]
    built = ok(admin(first, "/build", {"namespace": NS, "snapshot_kind": KIND}), 202)
    generation_id = str(built["row"]["generation_id"])
    deadline = time.monotonic() + 120
    while (
        view := ok(
            first.client.get(
                f"/v1/admin/generations/{generation_id}", headers={"x-admin-key": ADMIN_KEY}
            )
        )
    )["row"]["state"] == "building":
        assert time.monotonic() < deadline, view
        time.sleep(0.1)
    assert view["row"]["state"] == "sealed", view["descriptor"]["history"]
    assert ok(admin(first, f"/{generation_id}/verify"))["verified"]
    ok(admin(first, f"/{generation_id}/promote"))
    served = topk(second, query_text="red thermos")
    assert served["generation_id"] == generation_id != before
    assert comparable(served) == comparable(topk(first, query_text="red thermos"))


def test_killing_a_projector_and_a_relay_mid_stream_loses_nothing(loaded: Deployment) -> None:
    deployment = loaded
    bulk = records(FIRST, BULK, word="bulk")
    for start in range(0, len(bulk), 100):
        response = deployment.ingest.post_records(bulk[start : start + 100])
        assert response.status_code == 200, response.text
    # Mid-stream: once the workers see part of the batch applied, but not all of it.
    deadline = time.monotonic() + 60
    worker = deployment.workers[0]
    while True:
        scopes = worker.client.get("/v1/readiness").json()["scopes"]
        count = next(s["document_count"] for s in scopes if s["namespace"] == NS)
        if count > FIRST:
            break
        assert time.monotonic() < deadline, "nothing of the bulk batch was applied"
        time.sleep(0.02)
    for process in (deployment.projectors[0], deployment.relays[0]):
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    expected, digest, ids = canonical(deployment.url)
    assert expected == FIRST + BULK
    # The survivors take over the dead relay's claimed rows and the dead projector's
    # partitions (after the consumer group's session timeout).
    deployment.wait_all(expected, timeout=120)
    generation_id = topk(worker, query_text="bulk")["generation_id"]
    from projector.adapters.opensearch_lexical import OpenSearchLexicalIndex
    from projector.adapters.qdrant_vectors import QdrantServerVectorIndex

    prefix = f"orrery-test-{deployment.tag}"
    lexical = OpenSearchLexicalIndex(require_server("opensearch"), index_prefix=prefix)
    vectors_ = QdrantServerVectorIndex(url=require_server("qdrant"), collection_prefix=prefix)
    try:
        for engine in (lexical, vectors_):
            evidence = engine.evidence(generation_id)
            # Every acknowledged record once: a duplicate would count twice.
            assert (evidence.document_count, evidence.id_set_digest) == (expected, digest)
    finally:
        lexical.close()
        vectors_.close()
    for each in deployment.workers:
        listed = ok(
            each.client.get("/v1/scopes/document_ids", params={"namespace": NS, "scope_ref": SCOPE})
        )
        assert sorted(listed["document_ids"]) == ids
    hit = topk(
        deployment.workers[1], query_text=f"bulk {FIRST + 17}", ranking={"vector_weight": 0.0}
    )
    # The text names exactly one record (freshness and metadata may reorder the fused list).
    best = max(hit["results"], key=lambda r: r["score_breakdown"]["lexical"])
    assert best["item_id"] == f"obj-{FIRST + 17}"


def test_no_process_wrote_a_file(loaded: Deployment) -> None:
    for path in loaded.dirs:
        assert files_under(path) == [], path
