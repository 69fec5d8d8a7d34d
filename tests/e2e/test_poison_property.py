"""One bad record never stops the world (issue 22), proved the way it failed: a real
`orrery serve`, embedded and in server mode (Kafka, OpenSearch, Qdrant, PostgreSQL).

Hypothesis interleaves poison records of one tenant — all-zero, float32-overflowing,
unnormalizable, wrongly sized vectors, keywords no engine indexes — with ordinary writes
of two other tenants. The door refuses poison now, so it is written the way the door
cannot see: straight into the canonical store (whose relay and projector carry it like
any write). Every ordinary write must become searchable within the freshness bound, and
every poison record must be dead-lettered, visible on its tenant's scope only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.admission import KEYWORD_MAX_BYTES
from contracts.records import Record
from ingest.ports import RecordStore
from tests.e2e.conftest import Server
from tests.e2e.test_generations import DEPLOYMENTS, EMBEDDED, deployed

DIM = 384  # the real embedder's
KIND = "objects"
SCOPE = "longterm:objects:current"
TENANTS = ("tenant-one", "tenant-two")
POISONER = "poisoner"
# Seconds within which an acknowledged write must be searchable, poison or not around it:
# far above the projector's poll interval and one batch, far below "retried forever".
FRESHNESS_BOUND = {EMBEDDED: 30.0, "servers": 60.0}
EXAMPLES = {EMBEDDED: 6, "servers": 3}


def _vector(first: float, rest: float = 0.0) -> list[float]:
    return [first, *[rest] * (DIM - 1)]


POISON: dict[str, dict[str, Any]] = {
    "zero": {"vector": [0.0] * DIM},
    "overflow": {"vector": _vector(1e39, 0.5)},
    "underflow": {"vector": [1e-46] * DIM},
    "unnormalizable": {"vector": [3e38] * DIM},
    "dimension": {"vector": [0.5] * (DIM // 2)},
    "long_facet": {"metadata": {"topic": "t" * (KEYWORD_MAX_BYTES + 100)}},
    "long_label": {"metadata": {"visibility": ["v" * (KEYWORD_MAX_BYTES + 1)]}},
}

# One write: (tenant index or None for the poisoner, poison kind or "text"/"vector").
Write = tuple[int | None, str]
writes = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([0, 1]), st.sampled_from(["text", "vector"])),
        st.tuples(st.none(), st.sampled_from(sorted(POISON))),
    ),
    min_size=1,
    max_size=8,
)


@dataclass
class Deployment:
    kind: str
    srv: Server
    store: RecordStore

    def dead_letter_ids(self) -> dict[str, int]:
        """The poisoner's dead letters: document id → revision."""
        if self.srv.database_url:
            from query.adapters.postgres_routing import PostgresRouting, open_reads

            reads = open_reads(self.srv.database_url, pool_size=1)
            try:
                letters = PostgresRouting(reads).dead_letters(10_000, namespace=POISONER)
            finally:
                reads.close()
        else:
            from query.adapters.sqlite_routing import SqliteRouting

            letters = SqliteRouting(self.srv.data_dir / "orrery.sqlite").dead_letters(
                10_000, namespace=POISONER
            )
        return {str(d["document_id"]): int(d["revision"]) for d in letters}


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    kind = str(request.param)
    with deployed(kind, tmp_path_factory.mktemp(f"poison-{kind}") / "data") as srv:
        store: RecordStore
        if srv.database_url:
            from ingest.adapters.postgres_store import PostgresRecordStore

            store = PostgresRecordStore(srv.database_url)
        else:
            from ingest.adapters.sqlite_store import SqliteRecordStore

            store = SqliteRecordStore(srv.data_dir / "orrery.sqlite")
        try:
            yield Deployment(kind, srv, store)
        finally:
            store.close()


def ordinary(namespace: str, item: str, token: str, shape: str, seed: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "namespace": namespace,
        "snapshot_kind": KIND,
        "item_id": item,
        "revision": 1,
        "text": {"title": f"{token} {item}", "body": f"an ordinary write {token}"},
        "metadata": {"status": "active", "updated_at": "2026-03-19T12:00:00Z"},
    }
    if shape == "vector":
        vector = np.random.default_rng(seed).standard_normal(DIM)
        record["vector"] = [round(float(x), 6) for x in vector / np.linalg.norm(vector)]
    return record


def poison(item: str, token: str, kind: str) -> Record:
    # Built without the door's checks (Record's own model accepts every one of these).
    return Record.model_validate(
        {
            "namespace": POISONER,
            "snapshot_kind": KIND,
            "item_id": item,
            "revision": 1,
            "text": {"title": f"{token} poison {kind}"},
            **POISON[kind],
        }
    )


def found(srv: Server, namespace: str, token: str) -> set[str]:
    answer = srv.topk(
        namespace=namespace, scope_ref=SCOPE, query_text=token, result_limit=50, timeout_seconds=30
    )
    if answer.status_code == 503:  # the scope's first generation is not there yet
        return set()
    assert answer.status_code == 200, answer.text
    return {r["item_id"] for r in answer.json()["results"]}


def _check(deployment: Deployment, batch: list[Write]) -> None:
    token = f"w{uuid.uuid4().hex[:10]}"
    expected: dict[str, set[str]] = {namespace: set() for namespace in TENANTS}
    poisoned: dict[str, int] = {}
    for index, (tenant, shape) in enumerate(batch):
        item = f"{token}-{index}"
        if tenant is None:
            record = poison(item, token, shape)
            deployment.store.write([record])
            poisoned[record.doc_id] = 1
            continue
        namespace = TENANTS[tenant]
        answer = deployment.srv.post_records([ordinary(namespace, item, token, shape, index)])
        assert answer.status_code == 200, answer.text
        expected[namespace].add(item)

    bound = FRESHNESS_BOUND[deployment.kind]
    deadline = time.monotonic() + bound
    while True:
        searchable = all(
            wanted <= found(deployment.srv, namespace, token)
            for namespace, wanted in expected.items()
            if wanted
        )
        letters = deployment.dead_letter_ids()
        parked = all(letters.get(doc_id) == revision for doc_id, revision in poisoned.items())
        if searchable and parked:
            break
        assert time.monotonic() < deadline, (
            f"after {bound}s: searchable={searchable} parked={parked} batch={batch}"
        )
        time.sleep(0.2)

    # No poison record is searchable, and readiness counts the dead letters on the
    # poisoner's scope alone.
    if poisoned:
        assert found(deployment.srv, POISONER, token) == set()
    scopes = deployment.srv.client.get("/v1/readiness").json()["scopes"]
    for scope in scopes:
        if scope["namespace"] in TENANTS:
            assert scope["dead_letters"] == 0, scope
    if poisoned:
        (mine,) = [s for s in scopes if s["namespace"] == POISONER]
        assert mine["dead_letters"] >= len(poisoned)


def test_poison_records_never_hold_back_another_tenants_writes(deployment: Deployment) -> None:
    @settings(
        max_examples=EXAMPLES[deployment.kind],
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(batch=writes)
    def run(batch: list[Write]) -> None:
        _check(deployment, batch)

    run()
