"""Replica eligibility: a query worker routes only to generations whose engines' evidence
matched their registry evidence — never to one that is merely open or healthy.

The gate keeps one verdict per generation, from an evidence check (`EvidenceSource.check`:
every engine read back and compared with the registry at the same position). Verdicts
are cached: a full read-back scrolls every document, so it runs on a schedule
(`interval_seconds`), after errors (`suspect`) and once on first use, never per query.
Checks recorded by other processes after this gate started (e.g. an operator's
`orrery gen verify`) are taken over within a second. A check recorded before the gate
started is never trusted: an engine may have been changed while no worker watched.

A verdict speaks for the registry facts its check started from: the generation's state
and `commit_seq` (its committed batches). The route of every query carries both (read
from the registry anyway), so a negative verdict whose facts moved — the generation was
sealed, verified, promoted, or got its first batch since — is re-taken on the query path
before a 503 is answered, and the background round re-takes it within a second without
traffic; only a negative verdict about a generation that already held batches and merely
took more is re-taken in the background (at most every `_NEGATIVE_RECHECK_SECONDS`).
Nothing extra is read per query while the facts stand, and every worker sees the same
facts in the shared registry. A positive verdict stands until the timer or an error: the
evidence does not depend on the state, and dead states are refused by the route's state.

A periodic re-check of an eligible generation shares the interpreter with the queries
it guards, so it yields to them: its engine reads and its comparison sleep between
chunks (`contracts.pacing.DutyCycle`, at most `background_share` of the wall time; ~0.5-0.8
s of CPU flat out at 100k documents, ~7 s at 1M since session 31), and — given the
process's requests in flight (`yield_to`, counted by the HTTP app) — each chunk waits
for a gap between requests (`_QUIET_SECONDS` without one, at most `_MAX_YIELD_SECONDS`
a chunk: under steady load a re-check still moves, slowly). No chunk holds the
interpreter for long (a few ms at 1M, session 33: the registry's pairs come in id
order and are hashed without a sort). First checks, suspects and negative verdicts run
flat out: a query may be waiting for them.

A check's cost grows with the generation, the interval does not: at 1M documents a paced
re-check outlasts a 60 s interval, and the next one was due as it ended — the serving
interpreter spent a steady share on re-reading an idle generation (docs/bench/README.md,
session 30). So a verdict also rests `(1 / recheck_share - 1)` times as long as the check
that took it lasted before its periodic re-check (and a negative verdict before its
background re-take): re-checks of one generation occupy at most `recheck_share` of the
wall time, whatever its size. Below that size (a check shorter than a quarter of the
interval at the default share) the interval alone decides, as before.

What a re-check of a generation nothing changed guards against is its engines changing
behind the registry's back (an operator deleting points, files lost or damaged), not
the writes, which move the facts. So each periodic re-check that finds a live
generation eligible at the same facts as the positive verdict before it doubles the
next rest (`Verdict.unchanged` counts them), up to `max_interval_seconds` (an hour by
default): a quiet 1M generation is read back once an hour instead of spending a fifth
of a core on it for good. Once a batch is committed to it (or its state changes) it
rests the base time again, from its last check; a negative verdict starts over; an
engine error still has it re-checked at once (`suspect`). Generations that are not live
(fallbacks) rest the base time.

When the live generation is not eligible, `admit` either raises `503
coverage_unavailable` naming the scope and the generation, or — only when configured
(`fallback="previous_verified"`) — routes to the scope's previous verified generation
that is eligible, and the route (so `query_plan.fallback`) says so. Never a silently
partial answer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from contracts.errors import ErrorCode, OrreryError
from contracts.generations import CopyEvidence, CoverageFallback, EvidenceCheck
from contracts.index import Candidate, SearchFilter
from contracts.pacing import Activity, DutyCycle, Pace, no_pace
from query.ports import EvidenceSource, LexicalSearch, Route, Routing, VectorSearch

__all__ = [
    "EligibilityGate",
    "FallbackPolicy",
    "ReportingLexicalSearch",
    "ReportingVectorSearch",
    "Verdict",
]

log = logging.getLogger("orrery.eligibility")

FallbackPolicy = Literal["none", "previous_verified"]
# States whose generations can never be eligible, whatever their engines hold.
_DEAD_STATES = frozenset({"failed", "retired", "building"})
_TICK_SECONDS = 1.0
# A negative verdict about a generation that held batches when it was taken and only took
# more since is re-taken in the background at most this often: a broken replica that keeps
# taking writes must not cost a full read-back per batch.
_NEGATIVE_RECHECK_SECONDS = 5.0
# The least a verdict rests after its check: this many times the check's own duration
# (`EligibilityGate(recheck_share=…)`: 0.2 -> 4x, re-checks at most a fifth of the time).
_DEFAULT_RECHECK_SHARE = 0.2
# A periodic re-check's next chunk waits for a gap between requests this long (none ran
# or started meanwhile), at most `_MAX_YIELD_SECONDS` a chunk (`DutyCycle(yield_to=…)`).
_QUIET_SECONDS = 0.005
_MAX_YIELD_SECONDS = 0.1
# The longest a positive verdict of an unchanged generation rests (`max_interval_seconds`).
_DEFAULT_MAX_INTERVAL_SECONDS = 3600.0
# The facts a verdict speaks for when they could not be read.
_UNKNOWN = ("", -1)

Recheck = Literal["now", "soon"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a generation may be queried, from one evidence check.

    `state` and `commit_seq` are the registry facts the verdict speaks for, read before
    its check began (a batch committed during the check makes the verdict stale, never
    the reverse); `""` and -1 when they could not be read.
    """

    generation_id: str
    eligible: bool
    checked_at: datetime
    reason: str
    applied_position: int
    commit_seq: int
    state: str = ""
    # Per copy of each shard, for engines that address copies (`EngineEvidence.copies`).
    copies: tuple[tuple[str, CopyEvidence], ...] = ()
    # How long the check took (`EvidenceCheck.seconds`): what the verdict rests on.
    seconds: float = 0.0
    # Positive verdicts in a row, before this one, about the same facts: each doubles
    # the rest before the next periodic re-check (`rests`).
    unchanged: int = 0

    @classmethod
    def of(cls, check: EvidenceCheck, facts: tuple[str, int] | None = None) -> Verdict:
        state, commit_seq = facts if facts is not None else (check.state.value, check.commit_seq)
        return cls(
            generation_id=check.generation_id,
            eligible=check.ok,
            checked_at=check.checked_at,
            reason=check.reason,
            applied_position=check.applied_position,
            commit_seq=commit_seq,
            state=state,
            copies=tuple((e.engine, c) for e in check.engines for c in e.copies),
            seconds=check.seconds,
        )

    def uncovered_shards(self) -> list[int]:
        """Shards of an engine that addresses copies with no eligible copy."""
        shards = {(e, c.shard) for e, c in self.copies}
        covered = {(e, c.shard) for e, c in self.copies if c.eligible}
        return sorted({shard for _, shard in shards - covered})

    def speaks_for(self, state: str, commit_seq: int) -> bool:
        return self.state == state and self.commit_seq == commit_seq

    def rests(
        self,
        floor: float,
        recheck_share: float = _DEFAULT_RECHECK_SHARE,
        max_rest: float | None = None,
    ) -> float:
        """Seconds this verdict stands before a periodic re-take: `floor`, and at least
        `(1 / recheck_share - 1)` times its check's duration; with `max_rest`, that
        doubled for each unchanged verdict before it, up to `max_rest` (never below the
        undoubled rest; see the module docstring)."""
        rest = max(floor, self.seconds * (1.0 / recheck_share - 1.0))
        if max_rest is None or self.unchanged <= 0:
            return rest
        return max(rest, min(max_rest, rest * 2.0 ** min(self.unchanged, 32)))

    def after(self, held: Verdict | None) -> Verdict:
        """This verdict, counting `held` (the one it replaces) as unchanged before it
        when both are positive and speak for the same known facts."""
        if (
            held is None
            or not (held.eligible and self.eligible)
            or self.state == ""
            or self.commit_seq < 0
            or not held.speaks_for(self.state, self.commit_seq)
        ):
            return self
        return dataclasses.replace(self, unchanged=held.unchanged + 1)

    def recheck(
        self,
        state: str,
        commit_seq: int,
        clock: Callable[[], datetime],
        recheck_share: float = _DEFAULT_RECHECK_SHARE,
    ) -> Recheck | None:
        """Whether the registry now showing `state` at `commit_seq` calls for a new
        check: "now" (before answering), "soon" (in the background) or None."""
        if self.eligible or self.speaks_for(state, commit_seq):
            return None
        if self.state != state or self.commit_seq <= 0:
            return "now"
        age = (clock() - self.checked_at).total_seconds()
        rest = self.rests(_NEGATIVE_RECHECK_SECONDS, recheck_share)
        return "soon" if age >= rest else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "eligible": self.eligible,
            "checked_at": self.checked_at.isoformat(),
            "reason": self.reason,
            "checked_position": self.applied_position,
            "checked_commit_seq": self.commit_seq,
            "unchanged_rechecks": self.unchanged,
        }
        if self.copies:
            out["copies"] = [
                {
                    "engine": engine,
                    "shard": c.shard,
                    "copy": c.copy_index,
                    "key": c.key,
                    "eligible": c.eligible,
                    "reason": c.reason,
                }
                for engine, c in self.copies
            ]
        return out


class EligibilityGate:
    """Admits routes to eligible generations only (see the module docstring).

    Guarantees: `admit` returns the live route only if its latest verdict is eligible
    and its registry state is not failed/retired; without any verdict yet, or with a
    negative one whose generation changed state or got its first batch since, it checks
    first (one check per generation at a time; concurrent callers wait for it, at most
    `first_check_wait_seconds`). A failing or unreadable check is an ineligible verdict,
    never an exception of `admit` other than `coverage_unavailable`. Thread-safe.
    """

    def __init__(
        self,
        source: EvidenceSource,
        routing: Routing,
        *,
        interval_seconds: float = 60.0,
        fallback: FallbackPolicy = "none",
        first_check_wait_seconds: float = 30.0,
        background_share: float = 0.25,
        recheck_share: float = _DEFAULT_RECHECK_SHARE,
        max_interval_seconds: float = _DEFAULT_MAX_INTERVAL_SECONDS,
        yield_to: Activity | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not 0.0 < recheck_share <= 1.0:
            raise ValueError(f"recheck_share must be in (0, 1], not {recheck_share}")
        if not max_interval_seconds > 0.0:
            raise ValueError(f"max_interval_seconds must be > 0, not {max_interval_seconds}")
        self._source = source
        self._routing = routing
        self._interval = interval_seconds
        self._background_share = background_share
        self._recheck_share = recheck_share
        self._max_interval = max_interval_seconds
        self._yield_to = yield_to
        self._fallback = fallback
        self._first_wait = first_check_wait_seconds
        self._clock = clock
        self._started_at = clock()
        self._lock = threading.Lock()
        self._verdicts: dict[str, Verdict] = {}
        self._inflight: dict[str, threading.Event] = {}
        self._due: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sequence = self._latest_sequence()

    @property
    def fallback(self) -> FallbackPolicy:
        return self._fallback

    # -- the query path ----------------------------------------------------------------

    def admit(self, route: Route, scope_ref: str) -> Route:
        """`route` if its generation is eligible; else the declared fallback; else 503."""
        verdict = self._verdict_of(route)
        if verdict.eligible:
            return route
        if self._fallback == "previous_verified":
            for candidate in self._routing.fallback_routes(
                route.namespace, route.snapshot_kind, route.generation_id
            ):
                if self._verdict_of(candidate).eligible:
                    return candidate.model_copy(
                        update={
                            "fallback": CoverageFallback(
                                policy="previous_verified",
                                live_generation_id=route.generation_id,
                                reason=verdict.reason,
                            )
                        }
                    )
        uncovered = verdict.uncovered_shards()
        raise OrreryError(
            ErrorCode.COVERAGE_UNAVAILABLE,
            f"no eligible generation covers scope {scope_ref!r} of namespace "
            f"{route.namespace!r}: generation {route.generation_id} is not eligible "
            f"({verdict.reason})",
            {
                **({"shard": uncovered[0]} if uncovered else {}),
                "namespace": route.namespace,
                "scope_ref": scope_ref,
                "snapshot_kind": route.snapshot_kind,
                "generation_id": route.generation_id,
                "reason": verdict.reason,
                "checked_at": verdict.checked_at.isoformat(),
                "fallback": self._fallback,
            },
        )

    def _verdict_of(self, route: Route) -> Verdict:
        if route.state in _DEAD_STATES:
            return Verdict(
                route.generation_id,
                False,
                self._clock(),
                f"generation is {route.state}",
                route.applied_position,
                route.commit_seq,
                route.state,
            )
        facts = (route.state, route.commit_seq)
        verdict = self._verdict(route.generation_id, facts)
        # Twice at most: the first wait may end with a check that began before the change.
        for _ in range(2):
            again = verdict.recheck(*facts, self._clock, self._recheck_share)
            if again is None:
                break
            if again == "soon":
                self._schedule(route.generation_id)
                break
            verdict = self._check_now(route.generation_id, wait=self._first_wait, facts=facts)
        return verdict

    def _verdict(self, generation_id: str, facts: tuple[str, int]) -> Verdict:
        with self._lock:
            verdict = self._verdicts.get(generation_id)
        if verdict is not None:
            return verdict
        self._take_over_recorded()
        with self._lock:
            verdict = self._verdicts.get(generation_id)
        if verdict is not None:
            return verdict
        return self._check_now(generation_id, wait=self._first_wait, facts=facts)

    def copy_verdicts(self, generation_id: str, engine: str) -> dict[str, bool] | None:
        """Whether each copy of `engine`'s shards is eligible, by the latest verdict
        (None: no verdict, or the engine keeps one copy)."""
        with self._lock:
            verdict = self._verdicts.get(generation_id)
        if verdict is None:
            return None
        found = {c.key: c.eligible for e, c in verdict.copies if e == engine}
        return found or None

    def suspect(self, generation_id: str) -> None:
        """An engine failed for this generation: re-check it soon (not on this thread)."""
        with self._lock:
            self._due.add(generation_id)
        self._wake.set()

    # -- readiness ---------------------------------------------------------------------

    def status(
        self, generation_id: str, *, state: str | None = None, commit_seq: int | None = None
    ) -> dict[str, Any]:
        """The cached verdict as JSON (`eligible: null` while none exists: a check is
        then scheduled). Given the generation's registry `state` and `commit_seq`, a
        negative verdict taken before they moved is `stale: true` (and re-taken in the
        background): `admit` would not answer from it either."""
        with self._lock:
            verdict = self._verdicts.get(generation_id)
        if verdict is None:
            self._schedule(generation_id)
            return {"eligible": None, "checked_at": None, "reason": "not checked yet"}
        out = verdict.as_dict()
        if state is not None and commit_seq is not None:
            out["stale"] = not verdict.eligible and not verdict.speaks_for(state, commit_seq)
            if verdict.recheck(state, commit_seq, self._clock, self._recheck_share) is not None:
                self._schedule(generation_id)
        return out

    def _schedule(self, generation_id: str) -> None:
        """Re-check in the background (unless a check is running already)."""
        with self._lock:
            if generation_id in self._inflight:
                return
            self._due.add(generation_id)
        self._wake.set()

    # -- checks ------------------------------------------------------------------------

    def _check_now(
        self,
        generation_id: str,
        *,
        wait: float,
        facts: tuple[str, int] | None = None,
        pace: Pace = no_pace,
    ) -> Verdict:
        """Run one check (or wait for the one already running) and cache its verdict,
        keyed on `facts` (the registry's state and commit_seq; read here when not given);
        the check's engine reads call `pace` between chunks."""
        with self._lock:
            running = self._inflight.get(generation_id)
            if running is None:
                done = threading.Event()
                self._inflight[generation_id] = done
        if running is not None:
            running.wait(wait)
            with self._lock:
                verdict = self._verdicts.get(generation_id)
            return verdict or Verdict(
                generation_id, False, self._clock(), "eligibility not established yet", 0, 0
            )
        try:
            if facts is None:
                facts = self._facts(generation_id)
            try:
                verdict = Verdict.of(self._source.check(generation_id, pace=pace), facts)
                if isinstance(pace, DutyCycle) and pace.yielded_seconds:
                    # What the check rests on is its own time (and its sleeps), not the
                    # requests it let run first: else a busy hour would space re-checks
                    # out by the traffic's length.
                    seconds = max(0.0, verdict.seconds - pace.yielded_seconds)
                    verdict = dataclasses.replace(verdict, seconds=seconds)
            except OrreryError as exc:
                state, commit_seq = facts or _UNKNOWN
                reason = f"check failed: {exc.message}"
                verdict = Verdict(generation_id, False, self._clock(), reason, 0, commit_seq, state)
            if not verdict.eligible:
                log.warning("generation %s is not eligible: %s", generation_id, verdict.reason)
            with self._lock:
                verdict = verdict.after(self._verdicts.get(generation_id))
                self._verdicts[generation_id] = verdict
            return verdict
        finally:
            with self._lock:
                self._inflight.pop(generation_id, None)
            done.set()

    def _pace_for(self, generation_id: str) -> Pace:
        """How a periodic check of `generation_id` runs: re-checking an eligible
        generation, it yields to queries (`DutyCycle` at the background share: a full
        read-back holds the interpreter for seconds at 100k documents; and, given the
        process's requests in flight (`yield_to`), each chunk waits for a gap between
        them); without a positive verdict (a first check, a negative one), queries may
        be waiting for it (`admit`), so it runs flat out, as do suspects'."""
        with self._lock:
            held = self._verdicts.get(generation_id)
        if held is None or not held.eligible:
            return no_pace
        if self._background_share >= 1.0 and self._yield_to is None:
            return no_pace
        return DutyCycle(
            self._background_share,
            yield_to=self._yield_to,
            quiet_seconds=_QUIET_SECONDS,
            max_wait_seconds=_MAX_YIELD_SECONDS,
        )

    def _forgets(self, generation_id: str) -> bool:
        """Drop the verdict of a generation no query can be admitted to (retired, failed,
        building, or gone from the registry) instead of re-checking it: a full read-back
        of a retired 100k generation every interval cost seconds of the interpreter for
        nothing. Its routes are refused on their state alone (`_verdict_of`); one that
        comes back (a rollback) is checked again when first asked, as any new one."""
        try:
            route = self._routing.generation(generation_id)
        except OrreryError:
            return False  # the registry is unreachable: keep it, check as before
        if route is not None and route.state not in _DEAD_STATES:
            return False
        with self._lock:
            self._verdicts.pop(generation_id, None)
        return True

    def _facts(self, generation_id: str) -> tuple[str, int] | None:
        try:
            route = self._routing.generation(generation_id)
        except OrreryError:
            return None
        return None if route is None else (route.state, route.commit_seq)

    def _latest_sequence(self) -> int:
        try:
            recorded = self._source.checks_since(0)
        except OrreryError:
            return 0
        return recorded[-1][0] if recorded else 0

    def _take_over_recorded(self) -> None:
        """Adopt checks other processes recorded since the last look (and after start)."""
        try:
            recorded = self._source.checks_since(self._sequence)
        except OrreryError as exc:
            log.debug("cannot read recorded checks: %s", exc.message)
            return
        with self._lock:
            for sequence, check in recorded:
                self._sequence = max(self._sequence, sequence)
                if check.checked_at < self._started_at:
                    continue
                held = self._verdicts.get(check.generation_id)
                # Strictly newer: this gate's own checks come back here too, and their
                # verdicts are keyed on the facts read before the check.
                if held is None or held.checked_at < check.checked_at:
                    self._verdicts[check.generation_id] = Verdict.of(check).after(held)

    # -- schedule ----------------------------------------------------------------------

    def start(self) -> None:
        """Check every live generation now, then keep verdicts fresh in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="orrery-eligibility", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30.0)

    def _run(self) -> None:
        self._round(initial=True)
        while not self._stop.is_set():
            self._wake.wait(_TICK_SECONDS)
            self._wake.clear()
            if not self._stop.is_set():
                self._round(initial=False)

    def _round(self, *, initial: bool) -> None:
        try:
            self._take_over_recorded()
            now = self._clock()
            scopes = self._routing.scopes()
            with self._lock:
                asked = set(self._due)  # suspects and scheduled re-checks: flat out
                self._due.clear()
                due = set(asked)
                live = {scope.generation_id: scope for scope in scopes}
                for generation_id, verdict in self._verdicts.items():
                    age = (now - verdict.checked_at).total_seconds()
                    # Backing off is for a live generation still at its verdict's facts;
                    # one that took a batch since (or is not live) rests the base time.
                    scope = live.get(generation_id)
                    steady = (
                        scope is not None
                        and scope.commit_seq is not None
                        and verdict.speaks_for(scope.state, scope.commit_seq)
                    )
                    max_rest = self._max_interval if steady else None
                    if age >= verdict.rests(self._interval, self._recheck_share, max_rest):
                        due.add(generation_id)
                for scope in scopes:
                    held = self._verdicts.get(scope.generation_id)
                    if held is None or (
                        scope.commit_seq is not None
                        and held.recheck(
                            scope.state, scope.commit_seq, self._clock, self._recheck_share
                        )
                    ):
                        due.add(scope.generation_id)
            for generation_id in sorted(due):
                if self._stop.is_set():
                    return
                if generation_id not in asked and self._forgets(generation_id):
                    continue
                pace = no_pace if generation_id in asked else self._pace_for(generation_id)
                self._check_now(generation_id, wait=0.0, pace=pace)
        except OrreryError as exc:
            log.warning("eligibility round failed: %s", exc.message)
        except Exception:
            log.exception("eligibility round failed")
        if initial:
            log.info("eligibility: first round done")


class ReportingLexicalSearch:
    """A `LexicalSearch` that makes the gate re-check a generation whose engine failed."""

    def __init__(self, inner: LexicalSearch, gate: EligibilityGate) -> None:
        self._inner = inner
        self._gate = gate

    def search(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        limit: int,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> list[Candidate]:
        try:
            return self._inner.search(
                generation_id, query_text, filter, limit, field_boosts=field_boosts
            )
        except OrreryError as exc:
            _report(self._gate, generation_id, exc)
            raise

    def scores(
        self,
        generation_id: str,
        query_text: str,
        filter: SearchFilter,
        *,
        field_boosts: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        try:
            return self._inner.scores(generation_id, query_text, filter, field_boosts=field_boosts)
        except OrreryError as exc:
            _report(self._gate, generation_id, exc)
            raise


class ReportingVectorSearch:
    """A `VectorSearch` that makes the gate re-check a generation whose engine failed."""

    def __init__(self, inner: VectorSearch, gate: EligibilityGate) -> None:
        self._inner = inner
        self._gate = gate

    def search(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        limit: int,
    ) -> list[Candidate]:
        try:
            return self._inner.search(generation_id, vector, filter, limit)
        except OrreryError as exc:
            _report(self._gate, generation_id, exc)
            raise

    def scores(
        self,
        generation_id: str,
        vector: Sequence[float],
        filter: SearchFilter,
        *,
        revisions: Mapping[str, int] | None = None,
        tenant: str = "",
    ) -> dict[str, float]:
        try:
            return self._inner.scores(
                generation_id, vector, filter, revisions=revisions, tenant=tenant
            )
        except OrreryError as exc:
            _report(self._gate, generation_id, exc)
            raise


def _report(gate: EligibilityGate, generation_id: str, exc: OrreryError) -> None:
    if exc.code in (ErrorCode.COVERAGE_UNAVAILABLE, ErrorCode.DEPENDENCY_UNAVAILABLE):
        gate.suspect(generation_id)
