"""The per-namespace backlog of server mode on PostgreSQL (issue 22,
`ingest.adapters.postgres_backlog`): a namespace's outbox rows after the projector's
applied position for it (stored by `PostgresProjectorState.commit(namespaces=…)`) or
after the newest position its lag measurement vouches for (lag 0), whichever is later.

The property runs writes of three namespaces interleaved with projector commits that
report some of them applied, and compares each namespace's backlog with a model: one
namespace's writes never show in another's backlog, and applying one namespace never
shrinks another's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.records import Record
from ingest.adapters.postgres_backlog import PostgresBacklog
from ingest.adapters.postgres_store import PostgresRecordStore
from orrery.servers import migrate_all
from projector.adapters.postgres_state import PostgresProjectorState

pytestmark = pytest.mark.servers

NAMESPACES = ("ns-a", "ns-b", "ns-c")
LIMIT = 50


class Stack:
    def __init__(self, url: str) -> None:
        migrate_all(url)
        self.url = url
        self.store = PostgresRecordStore(url)
        self.state = PostgresProjectorState(url)
        self.backlog = PostgresBacklog(url, count_limit=LIMIT)
        self.items = 0
        self.examples = 0

    def write(self, namespace: str, count: int) -> list[int]:
        records = []
        for _ in range(count):
            self.items += 1
            records.append(
                Record.model_validate(
                    {
                        "namespace": namespace,
                        "snapshot_kind": "objects",
                        "item_id": f"i{self.items}",
                        "revision": 1,
                        "payload": {"n": self.items},
                    }
                )
            )
        return [int(o.position) for o in self.store.write(records) if o.position is not None]

    def close(self) -> None:
        self.backlog.close()
        self.state.close()
        self.store.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.conftest import session_database

    made = Stack(session_database())
    yield made
    made.close()


def test_a_namespace_counts_its_own_rows_after_its_applied_position(stack: Stack) -> None:
    # A fresh set of namespaces for this test (the module's database is shared).
    a, b = "solo-a", "solo-b"
    a_positions = stack.write(a, 30)
    b_positions = stack.write(b, 5)
    assert (stack.backlog.lag(a), stack.backlog.lag(b)) == (30, 5)
    # The projector applied A up to its 20th event: 10 left; B untouched.
    stack.state.commit("c1", a_positions[19], {}, namespaces={a: a_positions[19]})
    assert (stack.backlog.lag(a), stack.backlog.lag(b)) == (10, 5)
    # An older report never moves a namespace back.
    stack.state.commit("c1", a_positions[19], {}, namespaces={a: a_positions[3]})
    assert stack.backlog.lag(a) == 10
    # Counting stops at the limit: a bound check reads no more rows than it needs.
    stack.write(b, LIMIT + 20)
    assert stack.backlog.lag(b) == LIMIT
    # A lag of 0 measured at a position vouches for every event up to it, in every
    # namespace (also those whose own position was never stored).
    high = max(b_positions)
    stack.state.record_lag("c1", position=high, lag_events=0)
    assert stack.backlog.lag(b) == LIMIT  # the 70 written after `high` still count
    assert stack.backlog.applied >= high
    stack.state.record_lag("c1", position=stack.store.high_water(), lag_events=0)
    assert (stack.backlog.lag(a), stack.backlog.lag(b)) == (0, 0)
    # A newer measurement above 0 vouches for nothing: A's own position counts again
    # (the 10 events after it and 3 new ones).
    more = stack.write(a, 3)
    stack.state.record_lag("c1", position=more[-1], lag_events=3)
    assert stack.backlog.lag(a) == 13
    stack.state.commit("c1", more[-1], {}, namespaces={a: more[-1]})
    assert (stack.backlog.lag(a), stack.backlog.lag(b)) == (0, LIMIT)


step = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMESPACES), st.integers(1, 6)),
    st.tuples(st.just("apply"), st.sampled_from(NAMESPACES), st.integers(0, 12)),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_backlogs_are_per_namespace(stack: Stack, steps: list[tuple[str, str, int]]) -> None:
    # Namespaces of this example only; no lag-0 measurement in it (the floor stays put).
    stack.state.record_lag("c1", position=stack.store.high_water(), lag_events=1)
    stack.examples += 1
    tag = f"ex{stack.examples}"
    written: dict[str, list[int]] = {ns: [] for ns in NAMESPACES}
    applied: dict[str, int] = {ns: 0 for ns in NAMESPACES}
    floor = stack.backlog.applied
    for action, ns, n in steps:
        if action == "write":
            written[ns] += stack.write(f"{tag}-{ns}", n)
        elif written[ns]:
            # The projector applied this namespace up to one of its events.
            position = written[ns][min(n, len(written[ns]) - 1)]
            stack.state.commit("c1", position, {}, namespaces={f"{tag}-{ns}": position})
            applied[ns] = max(applied[ns], position)
        for other in NAMESPACES:
            expected = sum(1 for p in written[other] if p > max(applied[other], floor))
            assert stack.backlog.lag(f"{tag}-{other}") == min(expected, LIMIT), (other, steps)


def test_an_event_held_by_another_partition_is_in_the_backlog(stack: Stack) -> None:
    """On Kafka a namespace's newest applied position may run ahead of an event another
    partition still holds: the backlog counts it by its partition's applied offset (the
    relay's placement of each row), not by position."""
    from ingest.adapters.postgres_outbox_relay import PostgresOutboxReader

    ns = "split-backlog"
    stack.state.record_lag("c1", position=stack.store.high_water(), lag_events=1)
    first, second, third = stack.write(ns, 3)
    source = PostgresOutboxReader(stack.url)
    try:
        rows = [r.position for r in source.unpublished(1000) if r.namespace == ns]
        assert rows == [first, second, third]
        source.mark_published([first, second], [(0, 0), (1, 0)])  # third: not yet
    finally:
        source.close()
    stack.state.commit("c1", second, {}, namespaces={ns: second}, partitions={(ns, 1): 0})
    assert stack.backlog.lag(ns) == 2  # first (partition 0, not applied) and third
    stack.state.commit("c1", second, {}, namespaces={ns: first}, partitions={(ns, 0): 0})
    assert stack.backlog.lag(ns) == 1  # third


def test_the_projectors_commits_and_lag_reports_notify_waiting_writers(stack: Stack) -> None:
    """The projector's migration 0007: what a backlog is counted from notifies channel
    `orrery_projected` when committed, which wakes the ingest API's paced writers
    (`ingest.bootstrap.server_write_flow`) instead of a 50 ms poll."""
    import threading

    from ingest.adapters.postgres_db import PostgresListener
    from ingest.bootstrap import PROJECTED_CHANNEL

    woken = threading.Event()
    listener = PostgresListener(
        stack.url, PROJECTED_CHANNEL, woken.set, name="test-projected", wait_seconds=0.1
    )
    listener.start()
    try:
        assert woken.wait(30), "told once listening"
        woken.clear()
        positions = stack.write("told-a", 3)
        stack.state.commit("c-told", positions[-1], {}, namespaces={"told-a": positions[-1]})
        assert woken.wait(30), "told of the batch's commit"
        woken.clear()
        stack.state.record_lag("c-told", position=positions[-1], lag_events=0)
        assert woken.wait(30), "told of the lag measured"
    finally:
        listener.close()
