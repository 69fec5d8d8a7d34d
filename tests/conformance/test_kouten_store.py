"""Conformance of `SearchProfiles` and `EnvelopeLog` (the KoutenDB envelope's query-side
stores) for every adapter: `SqliteKoutenStore` (`DATA_DIR/koutendb.sqlite`: embedded, and
server mode without `ORRERY_DATABASE_URL`) and `PostgresKoutenStore` (server mode with
it; marked `servers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from query.adapters.sqlite_koutendb import SqliteKoutenStore
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


def test_envelopes_round_trip_and_feedback_replaces(store: Any) -> None:
    envelope = kept("r1", T0)
    store.keep(envelope)
    assert store.envelope("r1", T0 - timedelta(hours=1)) == envelope
    assert store.envelope("r1", T0 + timedelta(seconds=1)) is None
    assert store.envelope("nope", T0 - timedelta(days=9)) is None
    store.feedback("r1", ["a"], ["b"])
    got = store.envelope("r1", T0)
    assert (got.used, got.ignored) == (("a",), ("b",))
    store.feedback("r1", ["b"], [])
    got = store.envelope("r1", T0)
    assert (got.used, got.ignored) == (("b",), ())
    # Keeping the same request id again replaces the envelope and drops its feedback.
    again = kept("r1", T0 + timedelta(minutes=1), chunk_ids=("c",), chunk_rings=("docs",))
    store.keep(again)
    assert store.envelope("r1", T0) == again


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
    assert store.envelope("old", T0 - timedelta(days=2)) is None
    assert store.envelope("new", T0) is not None
