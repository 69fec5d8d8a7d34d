"""Conformance of `SearchProfiles` and `EnvelopeLog` (the KoutenDB envelope's query-side
stores) for every adapter: `SqliteKoutenStore` (`DATA_DIR/koutendb.sqlite`: embedded, and
server mode without `ORRERY_DATABASE_URL`) and `PostgresKoutenStore` (server mode with
it; marked `servers`)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from query.adapters.sqlite_koutendb import PRUNE_EVERY, SqliteKoutenStore
from query.ports import KeptEnvelope, StoredProfile

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _sqlite(request: pytest.FixtureRequest, path: Path) -> tuple[Any, Callable[[], None]]:
    made = SqliteKoutenStore(path / "koutendb.sqlite")
    return made, made.close


def _postgres(request: pytest.FixtureRequest, path: Path) -> tuple[Any, Callable[[], None]]:
    from ingest.adapters.postgres_db import migrate
    from query.adapters.postgres_koutendb import PostgresKoutenStore
    from query.adapters.postgres_migrations import COMPONENT, migrations
    from query.adapters.postgres_routing import open_reads

    url: str = request.getfixturevalue("postgres_url")
    migrate(url, migrations(), component=COMPONENT)
    reads = open_reads(url, pool_size=2)
    made = PostgresKoutenStore(reads)

    def close() -> None:
        made.close()
        reads.close()

    return made, close


ADAPTERS: dict[str, Callable[[pytest.FixtureRequest, Path], tuple[Any, Callable[[], None]]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}
MARKS = {"postgres": [pytest.mark.servers]}


@pytest.fixture(params=[pytest.param(n, marks=MARKS.get(n, [])) for n in sorted(ADAPTERS)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made, close = ADAPTERS[request.param](request, tmp_path)
    yield made
    close()


def kept(request_id: str, at: datetime, galaxy: str = "g", **fields: Any) -> KeptEnvelope:
    return KeptEnvelope(
        request_id=request_id,
        namespace=fields.pop("namespace", "ns"),
        galaxy=galaxy,
        base_ring=fields.pop("base_ring", "docs"),
        profile="default",
        budget=8,
        created_at=at,
        chunk_ids=fields.pop("chunk_ids", ("a", "b")),
        chunk_rings=fields.pop("chunk_rings", ("docs", "docs/x")),
    )


def test_profiles_are_replaced_listed_by_name_and_deleted(store: Any) -> None:
    store.put("ns", StoredProfile("wide", "raMany", "ssWide", "sdDeep", "note"))
    store.put("ns", StoredProfile("alpha", "raFew", "ssTight", "sdNormal"))
    store.put("other", StoredProfile("wide", "raFew", "ssTight", "sdNormal"))
    store.put("ns", StoredProfile("wide", "raAllUseful", "ssAll", "sdVeryDeep", "new"))
    assert store.profiles("ns") == [
        StoredProfile("alpha", "raFew", "ssTight", "sdNormal", ""),
        StoredProfile("wide", "raAllUseful", "ssAll", "sdVeryDeep", "new"),
    ]
    assert store.delete("ns", "wide") is True
    assert store.delete("ns", "wide") is False
    assert [p.name for p in store.profiles("ns")] == ["alpha"]
    assert [p.name for p in store.profiles("other")] == ["wide"]


def one(store: Any, request_id: str, since: datetime, namespace: str = "ns", galaxy: str = "g"):
    found = [e for e in store.envelopes(namespace, request_id, since) if e.galaxy == galaxy]
    assert len(found) <= 1
    return found[0] if found else None


def test_envelopes_round_trip_and_feedback_replaces(store: Any) -> None:
    envelope = kept("r1", T0)
    store.keep(envelope)
    assert one(store, "r1", T0 - timedelta(hours=1)) == envelope
    assert one(store, "r1", T0 + timedelta(seconds=1)) is None
    assert one(store, "nope", T0 - timedelta(days=9)) is None
    store.feedback("ns", "g", "r1", ["a"], ["b"])
    got = one(store, "r1", T0)
    assert (got.used, got.ignored) == (("a",), ("b",))
    store.feedback("ns", "g", "r1", ["b"], [])
    got = one(store, "r1", T0)
    assert (got.used, got.ignored) == (("b",), ())
    # Keeping the same request id again replaces the envelope and drops its feedback.
    again = kept("r1", T0 + timedelta(minutes=1), chunk_ids=("c",), chunk_rings=("docs",))
    store.keep(again)
    assert one(store, "r1", T0) == again


def test_the_same_request_id_in_another_tenant_is_another_envelope(store: Any) -> None:
    """Issue 22: tenant B's request id "req-1" never replaces tenant A's envelope, nor a
    galaxy's another galaxy's; feedback reaches exactly one of them."""
    mine = kept("req-1", T0, chunk_ids=("a",), chunk_rings=("docs",))
    theirs = kept(
        "req-1",
        T0 + timedelta(minutes=1),
        namespace="other",
        chunk_ids=("z",),
        chunk_rings=("docs",),
    )
    sibling = kept(
        "req-1", T0 + timedelta(minutes=2), galaxy="h", chunk_ids=("y",), chunk_rings=("docs",)
    )
    for envelope in (mine, theirs, sibling):
        store.keep(envelope)
    assert store.envelopes("ns", "req-1", T0) == [mine, sibling]
    assert store.envelopes("other", "req-1", T0) == [theirs]
    store.feedback("other", "g", "req-1", ["z"], [])
    assert one(store, "req-1", T0) == mine
    assert one(store, "req-1", T0, galaxy="h") == sibling
    assert one(store, "req-1", T0, namespace="other").used == ("z",)
    assert [e.request_id for e in store.window("ns", "g", T0)] == ["req-1"]


def test_window_is_per_namespace_and_galaxy_oldest_first(store: Any) -> None:
    store.keep(kept("r2", T0 + timedelta(minutes=2)))
    store.keep(kept("r1", T0 + timedelta(minutes=1)))
    store.keep(kept("r3", T0 + timedelta(minutes=3), galaxy="h"))
    store.keep(kept("r4", T0 + timedelta(minutes=4), namespace="other"))
    assert [e.request_id for e in store.window("ns", "g", T0)] == ["r1", "r2"]
    assert [e.request_id for e in store.window("ns", "g", T0 + timedelta(minutes=2))] == ["r2"]
    assert [e.request_id for e in store.window("ns", "h", T0)] == ["r3"]


def test_envelopes_older_than_a_day_are_purged_when_one_is_kept(store: Any) -> None:
    store.keep(kept("old", T0))
    store.keep(kept("new", T0 + timedelta(hours=25)))
    assert one(store, "old", T0 - timedelta(days=2)) is None
    assert one(store, "new", T0) is not None


def test_each_galaxy_keeps_at_most_its_bound_and_never_evicts_another(store: Any) -> None:
    """One tenant's flood of requests drops its own oldest envelopes only."""
    store._max_per_galaxy = 5
    store.keep(kept("quiet", T0, namespace="a"))
    for i in range(PRUNE_EVERY + 20):
        store.keep(kept(f"flood-{i:04d}", T0 + timedelta(seconds=i + 1), namespace="b"))
    flood = store.window("b", "g", T0)
    assert len(flood) <= 5 + PRUNE_EVERY
    assert flood[-1].request_id == f"flood-{PRUNE_EVERY + 19:04d}"
    assert "flood-0000" not in {e.request_id for e in flood}
    assert [e.request_id for e in store.window("a", "g", T0)] == ["quiet"]


_names = st.sampled_from(["a", "b", "c"])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    operations=st.lists(
        st.tuples(
            st.sampled_from(["keep", "feedback"]),
            _names,
            st.sampled_from(["g", "h"]),
            st.sampled_from(["req-1", "req-2"]),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_tenants_envelopes_never_meet(store: Any, operations: list[tuple[str, ...]]) -> None:
    """Property (issue 22): keeps and feedback of any tenants, in any order, over the
    same request ids: each (namespace, galaxy, request id) reads back exactly what its
    own last keep and feedback wrote, as a model keyed that way says."""
    run = uuid.uuid4().hex[:8]
    model: dict[tuple[str, str, str], KeptEnvelope] = {}
    for step, (op, namespace, galaxy, request_id) in enumerate(operations):
        ns = f"{run}-{namespace}"
        key = (ns, galaxy, request_id)
        if op == "keep":
            envelope = kept(
                request_id,
                T0 + timedelta(seconds=step),
                galaxy=galaxy,
                namespace=ns,
                chunk_ids=(f"{key}-{step}",),
                chunk_rings=("docs",),
            )
            store.keep(envelope)
            model[key] = envelope
        elif key in model:
            chunk = model[key].chunk_ids[0]
            store.feedback(ns, galaxy, request_id, [chunk], [])
            model[key] = dataclasses.replace(model[key], used=(chunk,), ignored=())
        else:
            store.feedback(ns, galaxy, request_id, ["x"], [])  # nothing kept: a no-op
    for namespace in ("a", "b", "c"):
        ns = f"{run}-{namespace}"
        for request_id in ("req-1", "req-2"):
            expected = sorted(
                (e for (n, _, r), e in model.items() if (n, r) == (ns, request_id)),
                key=lambda e: e.galaxy,
            )
            assert store.envelopes(ns, request_id, T0) == expected


def test_a_file_keyed_by_request_id_alone_is_migrated_rows_kept(tmp_path: Path) -> None:
    """`DATA_DIR/koutendb.sqlite` written before envelopes were keyed per tenant."""
    import sqlite3

    path = tmp_path / "koutendb.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE kouten_envelopes (request_id TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
        "galaxy TEXT NOT NULL, base_ring TEXT NOT NULL, profile TEXT NOT NULL, "
        "budget INTEGER NOT NULL, created_at TEXT NOT NULL, chunks_json TEXT NOT NULL, "
        "used_json TEXT, ignored_json TEXT);"
        "CREATE INDEX kouten_envelopes_by_galaxy ON kouten_envelopes "
        "(namespace, galaxy, created_at);"
    )
    conn.execute(
        "INSERT INTO kouten_envelopes VALUES ('req-1','ns','g','docs','default',8,?,?,?,NULL)",
        (T0.isoformat(), '[["a"],["docs"]]', '["a"]'),
    )
    conn.commit()
    conn.close()
    store = SqliteKoutenStore(path)
    try:
        [old] = store.envelopes("ns", "req-1", T0)
        assert (old.chunk_ids, old.used) == (("a",), ("a",))
        store.keep(kept("req-1", T0, namespace="other"))
        assert store.envelopes("ns", "req-1", T0) == [old]
    finally:
        store.close()
    SqliteKoutenStore(path).close()  # opening a migrated file again changes nothing
