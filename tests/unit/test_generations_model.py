"""The generation lifecycle's pure logic: descriptors, transitions, diffs, rollback and
gc choices; the eligibility gate and the admin key check with fakes."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.digests import id_set_digest
from contracts.errors import ErrorCode, OrreryError
from contracts.generations import (
    BuildReceipt,
    EvidenceCheck,
    GenerationDescriptor,
    GenerationState,
    SourceManifest,
    Topology,
)
from contracts.pacing import Activity, DutyCycle, Pace, no_pace
from projector import model
from projector.entrypoints.admin_http import check_admin_key
from projector.model import (
    ALLOWED_TRANSITIONS,
    WRITABLE_STATES,
    diff_pairs,
    engine_evidence,
    gc_plan,
    mismatch_reason,
    rollback_target,
    transition,
)
from query import eligibility
from query.eligibility import EligibilityGate, Verdict
from query.ports import Route, ScopeReadiness

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
S = GenerationState


def descriptor(
    generation_id: str = "g1",
    state: GenerationState = S.BUILDING,
    *,
    created: datetime = NOW,
    namespace: str = "ns",
) -> GenerationDescriptor:
    return GenerationDescriptor(
        generation_id=generation_id,
        namespace=namespace,
        snapshot_kind="objects",
        state=state,
        created_at=created,
        embedder_id="e@1",
        embedder_dim=4,
        topology=Topology(
            lexical_engine="tantivy",
            lexical_index=generation_id,
            vector_engine="qdrant-edge",
            vector_index=generation_id,
        ),
        schema_digest="s",
    ).with_digest()


# -- descriptors ---------------------------------------------------------------------------


def test_descriptor_digest_is_its_content_identity() -> None:
    first = descriptor()
    assert first.digest_is_valid()
    again = GenerationDescriptor.model_validate_json(first.model_dump_json())
    assert again.descriptor_digest == first.descriptor_digest and again.digest_is_valid()
    changed = first.model_copy(update={"document_count": 1})
    assert not changed.digest_is_valid()
    assert changed.with_digest().descriptor_digest != first.descriptor_digest


def test_manifest_and_receipt_digests_are_deterministic() -> None:
    manifest = SourceManifest(
        namespace="ns", snapshot_kind="objects", high_water=7, document_count=2, id_set_digest="d"
    )
    assert manifest.manifest_id == manifest.model_copy().manifest_id
    assert manifest.manifest_id != manifest.model_copy(update={"high_water": 8}).manifest_id
    receipt = BuildReceipt(
        snapshot_documents=2,
        written=2,
        skipped=0,
        failed=0,
        batches=1,
        high_water=7,
        caught_up_to=9,
        durations_s={"load": 0.1},
    )
    assert receipt.digest == BuildReceipt.model_validate_json(receipt.model_dump_json()).digest


# -- transitions ---------------------------------------------------------------------------


def test_the_lifecycle_path_appends_history_and_re_digests() -> None:
    current = descriptor()
    seen = {current.descriptor_digest}
    for state in (S.SEALED, S.VERIFIED, S.LIVE, S.VERIFIED, S.LIVE):
        current = transition(current, state, at=NOW, position=3, reason=f"to {state}")
        assert current.state is state and current.history[-1].state is state
        assert current.digest_is_valid() and current.descriptor_digest not in seen
        seen.add(current.descriptor_digest)
    assert [c.state for c in current.history] == [S.SEALED, S.VERIFIED, S.LIVE, S.VERIFIED, S.LIVE]


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (S.BUILDING, S.LIVE),
        (S.BUILDING, S.VERIFIED),
        (S.SEALED, S.LIVE),
        (S.FAILED, S.VERIFIED),
        (S.RETIRED, S.LIVE),
        (S.LIVE, S.RETIRED),
    ],
)
def test_forbidden_transitions_raise_invalid_state(start: S, to: S) -> None:
    with pytest.raises(OrreryError) as caught:
        transition(descriptor(state=start), to, at=NOW, position=0)
    assert caught.value.code is ErrorCode.INVALID_STATE


def test_every_writable_state_can_fail_and_nothing_leaves_retired() -> None:
    for state in WRITABLE_STATES:
        assert S.FAILED in ALLOWED_TRANSITIONS[state]
    assert ALLOWED_TRANSITIONS[S.RETIRED] == frozenset()
    assert S.RETIRED not in WRITABLE_STATES and S.FAILED not in WRITABLE_STATES


def test_transition_updates_validate_nested_models() -> None:
    manifest = SourceManifest(
        namespace="ns", snapshot_kind="objects", high_water=1, document_count=0, id_set_digest="x"
    )
    sealed = transition(
        descriptor(), S.SEALED, at=NOW, position=1, source_manifest=manifest, document_count=0
    )
    assert sealed.source_manifest == manifest and sealed.digest_is_valid()


# -- diffs ---------------------------------------------------------------------------------


def test_diff_pairs_names_every_kind_of_difference() -> None:
    expected = {"a": 1, "b": 2, "c": 1, "d": 1}
    observed = [("a", 1), ("b", 3), ("e", 1), ("c", 1), ("c", 1)]
    diff = diff_pairs(expected, observed)
    assert (diff.missing, diff.unexpected, diff.stale) == (("d",), ("e",), ("b",))
    assert (diff.missing_count, diff.unexpected_count, diff.stale_count) == (1, 1, 1)
    assert diff.duplicates == 1 and diff.count == 5 and not diff.matches
    evidence = engine_evidence("tantivy", diff)
    assert (
        mismatch_reason([evidence])
    ) == "tantivy: 1 missing, 1 unexpected, 1 at another revision, 1 duplicated"


def test_diff_pairs_matches_and_digests_the_observed_set() -> None:
    expected = {f"d{i}": i for i in range(100)}
    diff = diff_pairs(expected, reversed(list(expected.items())))
    assert diff.matches and diff.count == 100
    assert diff.digest == id_set_digest(expected.items())
    assert mismatch_reason([engine_evidence("x", diff)]) == ""


_ids = st.sampled_from([f"d{i}" for i in range(12)])


@given(
    st.dictionaries(_ids, st.integers(1, 3), max_size=12),
    st.lists(st.tuples(_ids, st.integers(1, 3)), max_size=16),
    st.booleans(),
    st.booleans(),
)
def test_diff_pairs_is_the_pairwise_comparison(
    expected: dict[str, int], observed: list[tuple[str, int]], same: bool, with_digest: bool
) -> None:
    if same:  # the common case: exactly the expected pairs, in any order
        observed = sorted(expected.items(), reverse=True)
    digest = id_set_digest(expected.items())
    paced: list[int] = []
    # Chunks of 2: the comparison of equal sets spans several (`_equal_pairs`).
    with mock.patch.object(model, "_COMPARE_CHUNK", 2):
        diff = diff_pairs(
            expected,
            iter(observed),
            expected_digest=digest if with_digest else None,
            pace=lambda: paced.append(1),
        )
    if same and with_digest:
        assert len(paced) == max(0, -(-len(observed) // 2) - 1)
    seen: dict[str, int] = {}
    for document_id, revision in observed:
        seen[document_id] = max(revision, seen.get(document_id, revision))
    missing = sorted(set(expected) - set(seen))
    unexpected = sorted(set(seen) - set(expected))
    stale = sorted(d for d in seen.keys() & expected.keys() if seen[d] != expected[d])
    assert (diff.missing_count, diff.unexpected_count, diff.stale_count) == (
        len(missing),
        len(unexpected),
        len(stale),
    )
    assert (list(diff.missing), list(diff.unexpected), list(diff.stale)) == (
        missing,
        unexpected,
        stale,
    )
    assert diff.duplicates == len(observed) - len(seen) and diff.count == len(observed)
    assert diff.digest == id_set_digest(seen.items())
    assert diff.matches == (seen == expected and len(seen) == len(observed))


def test_diff_samples_are_bounded_and_sorted() -> None:
    diff = diff_pairs({f"d{i:03d}": 1 for i in range(50)}, [], sample=5)
    assert diff.missing == ("d000", "d001", "d002", "d003", "d004")
    assert diff.missing_count == 50


# -- rollback and gc choices ---------------------------------------------------------------


def test_rollback_returns_to_the_most_recently_live_verified_generation() -> None:
    older = transition(
        transition(
            transition(descriptor("g1"), S.SEALED, at=NOW, position=0),
            S.VERIFIED,
            at=NOW,
            position=0,
        ),
        S.LIVE,
        at=NOW,
        position=0,
    )
    older = transition(older, S.VERIFIED, at=NOW + timedelta(minutes=1), position=0)
    recent = transition(
        transition(
            transition(
                descriptor("g2", created=NOW + timedelta(seconds=1)), S.SEALED, at=NOW, position=0
            ),
            S.VERIFIED,
            at=NOW,
            position=0,
        ),
        S.LIVE,
        at=NOW + timedelta(minutes=2),
        position=0,
    )
    recent = transition(recent, S.VERIFIED, at=NOW + timedelta(minutes=3), position=0)
    never = transition(
        transition(
            descriptor("g3", created=NOW + timedelta(hours=1)), S.SEALED, at=NOW, position=0
        ),
        S.VERIFIED,
        at=NOW,
        position=0,
    )
    live = descriptor("g4", S.LIVE)
    target = rollback_target([older, recent, never, live], "g4")
    assert target is not None and target.generation_id == "g2"
    only_never = rollback_target([never, live], "g4")
    assert only_never is not None and only_never.generation_id == "g3"
    assert rollback_target([live], "g4") is None


def test_gc_keeps_the_newest_retired_per_scope_and_drops_failed() -> None:
    def retired(gid: str, minutes: int, namespace: str = "ns") -> GenerationDescriptor:
        return descriptor(
            gid, S.RETIRED, created=NOW + timedelta(minutes=minutes), namespace=namespace
        )

    generations = [
        (retired("g1", 1), False),
        (retired("g2", 2), False),
        (retired("g3", 3), False),
        (retired("g4", 4, "other"), False),
        (descriptor("g5", S.FAILED), False),
        (descriptor("g6", S.FAILED), True),  # already dropped
        (descriptor("g7", S.VERIFIED), False),
        (descriptor("g8", S.LIVE), False),
    ]
    drop, kept = gc_plan(generations, keep=1)
    assert drop == ["g1", "g2", "g5"] and kept == ["g3", "g4"]
    drop, kept = gc_plan(generations, keep=0)
    assert drop == ["g1", "g2", "g3", "g4", "g5"] and kept == []


# -- admin key -------------------------------------------------------------------------


def test_admin_key_check() -> None:
    check_admin_key("k", "k", None)
    check_admin_key("k", None, "Bearer k")
    for configured, header, code in (
        ("k", None, ErrorCode.UNAUTHORIZED),
        ("k", "wrong", ErrorCode.FORBIDDEN),
        ("", "k", ErrorCode.FORBIDDEN),
    ):
        with pytest.raises(OrreryError) as caught:
            check_admin_key(configured, header, None)
        assert caught.value.code is code


# -- the eligibility gate --------------------------------------------------------------


def route(generation_id: str = "g2", state: str = "live") -> Route:
    return Route(
        namespace="ns",
        snapshot_kind="objects",
        generation_id=generation_id,
        applied_position=5,
        commit_seq=1,
        embedder_id="e@1",
        document_count=3,
        state=state,
    )


def check(generation_id: str, ok: bool, at: datetime, reason: str = "") -> EvidenceCheck:
    return EvidenceCheck(
        generation_id=generation_id,
        kind="eligibility",
        checked_at=at,
        state=S.LIVE,
        applied_position=5,
        commit_seq=1,
        expected_count=3,
        expected_digest="d",
        engines=(),
        ok=ok,
        reason=reason or ("" if ok else "tantivy: 1 missing"),
    )


class FakeSource:
    """Answers checks from a table; counts how often each generation was checked."""

    def __init__(self, ok: dict[str, bool]) -> None:
        self.ok = ok
        self.calls: dict[str, int] = {}
        self.recorded: list[tuple[int, EvidenceCheck]] = []
        self.release = threading.Event()
        self.release.set()
        self.paces: list[Pace] = []

    def check(self, generation_id: str, *, pace: Pace = no_pace) -> EvidenceCheck:
        self.release.wait(5)
        self.paces.append(pace)
        self.calls[generation_id] = self.calls.get(generation_id, 0) + 1
        return check(generation_id, self.ok[generation_id], datetime.now(UTC))

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]:
        return [(s, c) for s, c in self.recorded if s > sequence]


class FakeRouting:
    def __init__(self, fallbacks: list[Route]) -> None:
        self.fallbacks = fallbacks

    def route(self, namespace: str, snapshot_kind: str) -> Route | None:
        return route()

    def generation(self, generation_id: str) -> Route | None:
        return route(generation_id)

    def scopes(self) -> list[ScopeReadiness]:
        return [
            ScopeReadiness(
                namespace="ns",
                snapshot_kind="objects",
                generation_id="g2",
                state="live",
                document_count=3,
                applied_position=5,
            )
        ]

    def log_high_water(self) -> int:
        return 5

    def fallback_routes(self, namespace: str, snapshot_kind: str, exclude: str) -> list[Route]:
        return [r for r in self.fallbacks if r.generation_id != exclude]

    def oldest_unapplied_at(self, position: int) -> datetime | None:
        return None


def test_gate_admits_an_eligible_generation_and_caches_the_verdict() -> None:
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]))
    assert gate.admit(route(), "longterm:objects:current") == route()
    assert gate.admit(route(), "longterm:objects:current") == route()
    assert source.calls == {"g2": 1}
    assert gate.status("g2")["eligible"] is True


def test_gate_refuses_an_ineligible_generation_with_coverage_unavailable() -> None:
    gate = EligibilityGate(FakeSource({"g2": False}), FakeRouting([route("g1", "verified")]))
    with pytest.raises(OrreryError) as caught:
        gate.admit(route(), "longterm:objects:current")
    error = caught.value
    assert error.code is ErrorCode.COVERAGE_UNAVAILABLE and error.http_status == 503
    assert error.details["generation_id"] == "g2"
    assert error.details["scope_ref"] == "longterm:objects:current"
    assert "1 missing" in error.details["reason"]


def test_gate_takes_the_declared_fallback_only_when_configured() -> None:
    source = FakeSource({"g2": False, "g1": True})
    gate = EligibilityGate(
        source, FakeRouting([route("g1", "verified")]), fallback="previous_verified"
    )
    admitted = gate.admit(route(), "longterm:objects:current")
    assert admitted.generation_id == "g1"
    assert admitted.fallback is not None and admitted.fallback.live_generation_id == "g2"
    assert admitted.fallback.policy == "previous_verified"


def test_gate_fallback_never_routes_to_an_ineligible_generation() -> None:
    gate = EligibilityGate(
        FakeSource({"g2": False, "g1": False}),
        FakeRouting([route("g1", "verified")]),
        fallback="previous_verified",
    )
    with pytest.raises(OrreryError) as caught:
        gate.admit(route(), "longterm:objects:current")
    assert caught.value.code is ErrorCode.COVERAGE_UNAVAILABLE


def test_gate_never_admits_a_failed_generation_whatever_its_evidence() -> None:
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]))
    with pytest.raises(OrreryError):
        gate.admit(route(state="failed"), "longterm:objects:current")
    assert source.calls == {}


def test_gate_checks_once_for_concurrent_first_queries() -> None:
    source = FakeSource({"g2": True})
    source.release.clear()
    gate = EligibilityGate(source, FakeRouting([]))
    results: list[str] = []

    def ask() -> None:
        results.append(gate.admit(route(), "s").generation_id)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    source.release.set()
    for thread in threads:
        thread.join(5)
    assert results == ["g2"] * 4 and source.calls == {"g2": 1}


def test_gate_adopts_checks_recorded_after_it_started_only() -> None:
    source = FakeSource({"g2": True})
    source.recorded = [(1, check("g2", True, NOW - timedelta(days=1)))]
    gate = EligibilityGate(source, FakeRouting([]))
    source.recorded.append((2, check("g2", False, datetime.now(UTC) + timedelta(seconds=1))))
    with pytest.raises(OrreryError):
        gate.admit(route(), "s")
    assert source.calls == {}  # the recorded (newer) check was taken over, none run


def test_gate_rechecks_suspects_in_the_background() -> None:
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=3600)
    gate.admit(route(), "s")
    source.ok["g2"] = False
    gate.start()
    try:
        gate.suspect("g2")
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while gate.status("g2")["eligible"] and datetime.now(UTC) < deadline:
            threading.Event().wait(0.05)
        assert gate.status("g2")["eligible"] is False
    finally:
        gate.close()


def _eventually(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """Whether `condition` holds within `seconds` (polled; for background rounds)."""
    deadline = datetime.now(UTC) + timedelta(seconds=seconds)
    while not condition() and datetime.now(UTC) < deadline:
        threading.Event().wait(0.02)
    return condition()


def test_periodic_rechecks_of_an_eligible_generation_yield_and_others_run_flat_out() -> None:
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=0.05, background_share=0.2)
    gate.admit(route(), "s")  # the first check: a query waits for it
    gate.start()
    try:
        assert _eventually(lambda: len(source.paces) >= 3)
        assert source.paces[0] is no_pace
        assert all(isinstance(p, DutyCycle) for p in source.paces[1:3])
        source.ok["g2"] = False
        gate.suspect("g2")  # an engine failed: the verdict turns (flat out once asked)
        assert _eventually(lambda: gate.status("g2")["eligible"] is False)
        # Every check of a generation without a positive verdict runs flat out.
        negative = len(source.paces)
        assert _eventually(lambda: len(source.paces) >= negative + 2)
        assert all(p is no_pace for p in source.paces[negative : negative + 2])
    finally:
        gate.close()


class PacingSource(FakeSource):
    """Calls `pace` once between two chunks of each check; the check lasts what it took."""

    def __init__(self, ok: dict[str, bool]) -> None:
        super().__init__(ok)
        self.seconds: list[float] = []

    def check(self, generation_id: str, *, pace: Pace = no_pace) -> EvidenceCheck:
        started = time.perf_counter()
        pace()
        result = super().check(generation_id, pace=pace)
        self.seconds.append(time.perf_counter() - started)
        return result.model_copy(update={"seconds": self.seconds[-1]})


def test_a_recheck_waits_for_a_gap_between_requests_and_rests_on_its_own_time() -> None:
    """Given the process's requests in flight, a periodic re-check's chunks wait for a gap
    between them (at most `_MAX_YIELD_SECONDS` a chunk), also when it may work all the
    time; the time it waited is not what its verdict rests on."""
    activity = Activity()
    source = PacingSource({"g2": True})
    gate = EligibilityGate(
        source,
        FakeRouting([]),
        interval_seconds=3600.0,
        background_share=1.0,
        yield_to=activity,
    )
    gate.admit(route(), "s")  # the first check: flat out, a query waits for it
    assert source.paces == [no_pace]
    with activity.running():  # a request in flight all along
        gate.suspect("g2")  # asked for: flat out too
        gate.start()
        try:
            assert _eventually(lambda: len(source.paces) >= 2)
            assert source.paces[1] is no_pace
            # A re-check due by its age (not asked for), without waiting the hour.
            with gate._lock:
                gate._verdicts["g2"] = dataclasses.replace(
                    gate._verdicts["g2"],
                    checked_at=datetime.now(UTC) - timedelta(hours=2),
                )
            assert _eventually(lambda: len(source.paces) >= 3)
        finally:
            gate.close()
    recheck = source.paces[2]
    assert isinstance(recheck, DutyCycle)
    assert recheck.yielded_seconds >= eligibility._MAX_YIELD_SECONDS
    held = gate._verdicts["g2"]
    assert held.seconds == pytest.approx(
        max(0.0, source.seconds[2] - recheck.yielded_seconds), abs=1e-3
    )
    assert held.seconds < source.seconds[2]


def test_a_gate_that_may_work_all_the_time_never_paces() -> None:
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=0.05, background_share=1.0)
    gate.admit(route(), "s")
    gate.start()
    try:
        assert _eventually(lambda: len(source.paces) >= 3)
        assert all(p is no_pace for p in source.paces)
    finally:
        gate.close()


# -- verdicts keyed on registry facts (issue 15) ---------------------------------------------


def moved(commit_seq: int, state: str = "live") -> Route:
    return route(state=state).model_copy(update={"commit_seq": commit_seq})


def test_a_negative_verdict_taken_before_the_first_batch_is_retaken_on_the_query_path() -> None:
    source = FakeSource({"g2": False})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=3600)
    with pytest.raises(OrreryError):
        gate.admit(moved(0), "s")  # created, nothing applied yet: no index to read back
    assert gate.status("g2", state="live", commit_seq=0)["stale"] is False
    source.ok["g2"] = True
    # Readiness does not call the verdict current once the first batch is committed.
    assert gate.status("g2", state="live", commit_seq=1)["stale"] is True
    assert gate.admit(moved(1), "s").generation_id == "g2"
    assert source.calls == {"g2": 2}
    gate.admit(moved(1), "s")
    gate.admit(moved(7), "s")  # a positive verdict stands while batches come in
    assert source.calls == {"g2": 2}
    assert gate.status("g2", state="live", commit_seq=7)["eligible"] is True


def test_a_negative_verdict_is_retaken_when_the_generation_changes_state() -> None:
    source = FakeSource({"g2": False})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=3600)
    with pytest.raises(OrreryError):
        gate.admit(moved(3, "verified"), "s")
    source.ok["g2"] = True
    assert gate.admit(moved(3, "live"), "s").generation_id == "g2"  # promoted
    assert source.calls == {"g2": 2}


def test_an_unchanged_negative_verdict_costs_no_check_per_query() -> None:
    source = FakeSource({"g2": False})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=3600)
    for _ in range(5):
        with pytest.raises(OrreryError):
            gate.admit(moved(3), "s")
    # More batches into a generation that already held some: re-checked in the
    # background (throttled), not before each answer.
    with pytest.raises(OrreryError):
        gate.admit(moved(4), "s")
    assert source.calls == {"g2": 1}


def test_the_round_retakes_a_stale_negative_verdict_without_traffic() -> None:
    class Scopes(FakeRouting):
        commit_seq = 0

        def scopes(self) -> list[ScopeReadiness]:
            return [s.model_copy(update={"commit_seq": self.commit_seq}) for s in super().scopes()]

        def generation(self, generation_id: str) -> Route | None:
            return moved(self.commit_seq)

    source = FakeSource({"g2": False})
    routing = Scopes([])
    gate = EligibilityGate(source, routing, interval_seconds=3600)
    with pytest.raises(OrreryError):
        gate.admit(moved(0), "s")
    source.ok["g2"] = True
    routing.commit_seq = 1
    gate.start()
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while not gate.status("g2")["eligible"] and datetime.now(UTC) < deadline:
            threading.Event().wait(0.05)
        assert gate.status("g2", state="live", commit_seq=1)["eligible"] is True
    finally:
        gate.close()
    assert source.calls == {"g2": 2}


def test_a_negative_check_taken_over_from_another_worker_is_retaken_once_facts_move() -> None:
    # Workers share only the registry: the trigger is its facts, not a callback.
    source = FakeSource({"g2": True})
    gate = EligibilityGate(source, FakeRouting([]), interval_seconds=3600)
    before = check("g2", False, datetime.now(UTC) + timedelta(seconds=1), "no lexical index")
    source.recorded.append((1, before.model_copy(update={"commit_seq": 0})))
    with pytest.raises(OrreryError):
        gate.admit(moved(0), "s")
    assert source.calls == {}
    assert gate.admit(moved(1), "s").generation_id == "g2"
    assert source.calls == {"g2": 1}


def test_the_round_forgets_generations_no_query_can_reach_instead_of_rechecking_them() -> None:
    """A retired generation's verdict is dropped, not re-read every interval (a full
    read-back of its indexes); the live one keeps being re-checked, and a registry that
    cannot answer keeps the verdict."""

    class Retiring(FakeRouting):
        def __init__(self) -> None:
            super().__init__([])
            self.states = {"g1": "live", "g2": "live"}
            self.unreachable = False

        def generation(self, generation_id: str) -> Route | None:
            if self.unreachable:
                raise OrreryError(ErrorCode.DEPENDENCY_UNAVAILABLE, "registry down")
            return route(generation_id, self.states[generation_id])

    source = FakeSource({"g1": True, "g2": True})
    routing = Retiring()
    gate = EligibilityGate(source, routing, interval_seconds=0.05, background_share=1.0)
    gate.admit(route("g1"), "s")
    gate.admit(route("g2"), "s")
    routing.unreachable = True
    gate.start()
    try:
        # While the registry cannot answer, both verdicts stay and are re-checked.
        assert _eventually(lambda: source.calls["g1"] >= 3 and source.calls["g2"] >= 3)
        routing.unreachable = False
        routing.states["g1"] = "retired"
        assert _eventually(lambda: gate.status("g1")["eligible"] is None)
        settled = source.calls["g1"]
        live = source.calls["g2"]
        assert _eventually(lambda: source.calls["g2"] >= live + 3)
        # `status` schedules a check of a generation without a verdict (readiness asks):
        # at most that one; the periodic round does not take it up again.
        assert source.calls["g1"] <= settled + 1
        with pytest.raises(OrreryError):
            gate.admit(route("g1", "retired"), "s")
    finally:
        gate.close()


# -- re-checks rest in proportion to what a check costs (session 30) -------------------------


class _Clock:
    """A settable clock for the gate and the checks it records."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 7, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class _TimedSource(FakeSource):
    """Checks taken at the clock's time, each reported as lasting `seconds`; counts the
    gate's rounds (each begins by asking for checks recorded elsewhere)."""

    def __init__(self, ok: dict[str, bool], clock: _Clock, seconds: float) -> None:
        super().__init__(ok)
        self.clock = clock
        self.seconds = seconds
        self.rounds = 0

    def check(self, generation_id: str, *, pace: Pace = no_pace) -> EvidenceCheck:
        taken = super().check(generation_id, pace=pace)
        return taken.model_copy(update={"checked_at": self.clock(), "seconds": self.seconds})

    def checks_since(self, sequence: int) -> list[tuple[int, EvidenceCheck]]:
        self.rounds += 1
        return super().checks_since(sequence)


def _after_two_rounds(source: _TimedSource) -> None:
    """Returns once the gate's thread began two more rounds (each sees the clock as it is
    now), so what those rounds did not start was not due."""
    seen = source.rounds
    assert _eventually(lambda: source.rounds >= seen + 2)


@pytest.mark.parametrize(
    ("check_seconds", "first_recheck_at"),
    [(1.0, 60.0), (100.0, 400.0)],  # a 100 s check rests 4 x 100 s at share 0.2
)
def test_a_verdict_rests_the_interval_or_four_times_its_check_whichever_is_longer(
    check_seconds: float, first_recheck_at: float
) -> None:
    clock = _Clock()
    source = _TimedSource({"g2": True}, clock, check_seconds)
    gate = EligibilityGate(
        source, FakeRouting([]), interval_seconds=60.0, recheck_share=0.2, clock=clock
    )
    gate.admit(route(), "s")
    gate.start()
    try:
        clock.advance(first_recheck_at - 1.0)
        _after_two_rounds(source)
        assert source.calls == {"g2": 1}
        clock.advance(2.0)
        assert _eventually(lambda: source.calls == {"g2": 2})
        # The same rest again after the re-check.
        clock.advance(first_recheck_at - 1.0)
        _after_two_rounds(source)
        assert source.calls == {"g2": 2}
    finally:
        gate.close()


class _CommittingRouting(FakeRouting):
    """The live generation g2 at `commit_seq` committed batches (settable), as both the
    routes and the scopes the gate's rounds read show it."""

    def __init__(self) -> None:
        super().__init__([])
        self.commit_seq = 1

    def route(self, namespace: str, snapshot_kind: str) -> Route | None:
        return self.generation("g2")

    def generation(self, generation_id: str) -> Route | None:
        return route(generation_id).model_copy(update={"commit_seq": self.commit_seq})

    def scopes(self) -> list[ScopeReadiness]:
        return [s.model_copy(update={"commit_seq": self.commit_seq}) for s in super().scopes()]


def _rechecked_after(
    clock: _Clock, source: _TimedSource, rest: float, calls: int, gate: EligibilityGate
) -> None:
    """No re-check until `rest` seconds after the last, then one (the `calls`-th)."""
    clock.advance(rest - 1.0)
    _after_two_rounds(source)
    assert source.calls == {"g2": calls - 1}, f"re-checked before {rest} s"
    clock.advance(2.0)
    assert _eventually(lambda: source.calls == {"g2": calls}), f"not re-checked at {rest} s"
    assert _eventually(lambda: "g2" not in gate._inflight)


def test_unchanged_rechecks_rest_twice_as_long_each_up_to_the_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eligibility, "_TICK_SECONDS", 0.05)  # rounds come faster, same rule
    clock = _Clock()
    source = _TimedSource({"g2": True}, clock, 1.0)
    routing = _CommittingRouting()
    gate = EligibilityGate(
        source, routing, interval_seconds=60.0, max_interval_seconds=300.0, clock=clock
    )
    gate.admit(routing.generation("g2") or route(), "s")
    gate.start()
    try:
        assert gate.status("g2")["unchanged_rechecks"] == 0
        for calls, rest in enumerate((60.0, 120.0, 240.0, 300.0, 300.0), start=2):
            _rechecked_after(clock, source, rest, calls, gate)
        assert gate.status("g2")["unchanged_rechecks"] == 5
        # A batch committed: the base rest again from the last check, and the count
        # starts over with the check that sees it.
        routing.commit_seq = 2
        _rechecked_after(clock, source, 60.0, 7, gate)
        assert gate.status("g2")["unchanged_rechecks"] == 0
        _rechecked_after(clock, source, 60.0, 8, gate)
        _rechecked_after(clock, source, 120.0, 9, gate)
        # A negative verdict starts over too (and is re-taken as a negative one is).
        source.ok["g2"] = False
        _rechecked_after(clock, source, 240.0, 10, gate)
        assert gate.status("g2")["unchanged_rechecks"] == 0
    finally:
        gate.close()


def test_a_verdict_counts_the_unchanged_positive_verdicts_before_it() -> None:
    at = datetime(2026, 12, 7, tzinfo=UTC)
    held = Verdict.of(check("g2", True, at), ("live", 4))
    again = Verdict.of(check("g2", True, at), ("live", 4)).after(held)
    assert again.unchanged == 1 and again.after(again).unchanged == 2
    for other in (
        Verdict.of(check("g2", True, at), ("live", 5)),  # a batch since
        Verdict.of(check("g2", True, at), ("verified", 4)),
        Verdict.of(check("g2", False, at), ("live", 4)),
        Verdict.of(check("g2", True, at), ("", -1)),  # facts unknown
    ):
        assert other.after(again).unchanged == 0
    assert Verdict.of(check("g2", True, at), ("live", 4)).after(None).unchanged == 0
    fresh = Verdict.of(check("g2", True, at), ("live", 4))
    assert fresh.after(Verdict.of(check("g2", False, at), ("live", 4))).unchanged == 0
    # The rest: doubled per unchanged verdict, capped, never below the base.
    assert again.rests(60.0, 0.2, None) == 60.0
    assert again.rests(60.0, 0.2, 3600.0) == 120.0
    assert dataclasses.replace(again, unchanged=40).rests(60.0, 0.2, 3600.0) == 3600.0
    assert dataclasses.replace(again, unchanged=3).rests(60.0, 0.2, 30.0) == 60.0


def test_a_costly_negative_verdict_is_retaken_in_the_background_after_its_rest_not_5_s() -> None:
    clock = _Clock()
    taken = Verdict.of(
        check("g2", False, clock()).model_copy(update={"seconds": 30.0}), ("live", 4)
    )
    # The generation took batches since: a re-take in the background, once rested.
    clock.advance(10.0)
    assert taken.recheck("live", 5, clock, 0.2) is None
    clock.advance(111.0)  # 121 s > 4 x 30 s
    assert taken.recheck("live", 5, clock, 0.2) == "soon"
    # A cheap check keeps the 5 s floor, and a state change re-takes it at once.
    cheap = Verdict.of(check("g2", False, clock()), ("live", 4))
    assert cheap.recheck("live", 5, clock, 0.2) is None
    clock.advance(5.0)
    assert cheap.recheck("live", 5, clock, 0.2) == "soon"
    assert taken.recheck("verified", 5, clock, 0.2) == "now"


def test_the_recheck_share_is_a_share() -> None:
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="recheck_share"):
            EligibilityGate(FakeSource({}), FakeRouting([]), recheck_share=share)
    with pytest.raises(ValueError, match="max_interval_seconds"):
        EligibilityGate(FakeSource({}), FakeRouting([]), max_interval_seconds=0.0)
