"""The circuit breaker: its table edge by edge, scenarios, and a naive model.

The table-driven test is generated from :data:`htmqc.core.breaker.TRANSITIONS`:
every (state, event) pair is tried. The Hypothesis state machine drives the
breaker and ``model_checks/reference_breaker.py`` (which keeps every outcome in
a list and recounts) with the same outcomes and clock, and compares them after
every step; its ``settle`` rule is a bounded liveness check: whatever state it
is in, a fixed handler closes the breaker within one maximal backoff. A
breaker that never half-opens is kept as a mutant the machine must catch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import icontract
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from htmqc.core import IllegalTransition, breaker
from htmqc.core.breaker import (
    ALLOWANCE,
    TRANSITIONS,
    Breaker,
    BreakerEvent,
    BreakerPolicy,
    BreakerState,
)
from model_checks.reference_breaker import RefBreaker, RefBreakerError
from tests.core.mutants.stateful import assert_rejected
from tests.core.tables import row_edit, shortest_paths, with_entry, without

B, BE = BreakerState, BreakerEvent
PROBE = (("t", 0), 0)
OTHER = ("t", 1)
POLICY = BreakerPolicy()


# -- table-driven: every (state, event) pair ---------------------------------------------------


def _trip(b: Breaker, now: float) -> BreakerEvent | None:
    last = None
    for offset in range(b.policy.consecutive):
        last = b.failed(OTHER, offset, "db.Down", now)
    return last


def _cool(b: Breaker, now: float) -> BreakerEvent | None:
    held = b.held_for(now) if b.state is B.OPEN else None
    return b.tick(now if held is None else now + held)


def _lose(b: Breaker, now: float) -> BreakerEvent | None:
    return b.tick(now + b.policy.probe_timeout if b.state is B.PROBING else now)


# How a test makes each event happen at `now`; where the table has no edge the
# breaker ignores the outcome (or refuses a probe).
DRIVE: dict[BreakerEvent, Callable[[Breaker, float], BreakerEvent | None]] = {
    BE.TRIPPED: _trip,
    BE.COOLED_DOWN: _cool,
    BE.PROBE_STARTED: lambda b, now: b.probe_started(*PROBE, now),
    BE.PROBE_SUCCEEDED: lambda b, now: b.succeeded(PROBE[0], [PROBE[1]], now),
    BE.PROBE_FAILED: lambda b, now: b.failed(*PROBE, "db.Down", now),
    BE.PROBE_LOST: _lose,
}


def breaker_in(state: BreakerState) -> tuple[Breaker, float]:
    b, now = Breaker(POLICY), 0.0
    for event in shortest_paths(TRANSITIONS, B.CLOSED)[state]:
        assert DRIVE[event](b, now) is event
        now = b._last + (0.0 if b.state is B.OPEN else 0.5)  # the breaker's clock, on
    assert b.state is state
    return b, now


@pytest.mark.parametrize("source", list(BreakerState))
@pytest.mark.parametrize("event", list(BreakerEvent))
def test_the_breaker_follows_exactly_the_tables_edges(
    source: BreakerState, event: BreakerEvent
) -> None:
    b, now = breaker_in(source)
    target = TRANSITIONS[source].get(event)
    if target is not None:
        assert DRIVE[event](b, now) is event
        assert b.state is target
    elif event is BE.PROBE_STARTED:
        with pytest.raises(IllegalTransition):
            DRIVE[event](b, now)
        assert b.state is source
    else:
        assert DRIVE[event](b, now) is None
        assert b.state is source
    assert b.allowance() == ALLOWANCE[b.state]
    assert (b.held_for(now) is None) == (b.state is B.CLOSED)


# -- scenarios ---------------------------------------------------------------------------------


def test_the_streak_counts_messages_not_attempts() -> None:
    b = Breaker(BreakerPolicy(min_calls=1000))  # the failure rate out of the way
    for attempt in range(50):
        assert b.failed(OTHER, 7, "db.Down", float(attempt)) is None
    for offset in range(8):
        assert b.failed(OTHER, 100 + offset, "db.Down", 50.0) is None
    assert b.failed(OTHER, 200, "db.Down", 50.0) is BE.TRIPPED  # the tenth message


def test_a_streak_longer_than_the_small_ints_trips_it() -> None:
    """The count is compared by value: 300 is past the integers CPython caches
    (an ``is`` comparison would never trip)."""
    b = Breaker(BreakerPolicy(consecutive=300, min_calls=10**6))
    for offset in range(299):
        assert b.failed(OTHER, offset, "db.Down", 0.0) is None
    assert b.failed(OTHER, 299, "db.Down", 0.0) is BE.TRIPPED


def test_calls_at_one_time_share_one_bucket_far_from_zero() -> None:
    """Bucket indices far past the cached small integers still match: many calls
    at one time are one bucket, counted once each."""
    b = Breaker(BreakerPolicy(min_calls=10**6, consecutive=10**6))
    now = 100_000.0  # bucket 33,333 with the 30 s window
    for offset in range(30):
        b.failed(OTHER, offset, "db.Down", now)
    b.succeeded(OTHER, list(range(100, 110)), now)
    assert len(b._buckets) == 1
    assert b.window_counts(now) == (40, 30)


def test_only_the_probe_of_its_own_partition_closes_it() -> None:
    """A success of the probe's offset on another partition says nothing about
    the probe, whichever way the partitions compare."""
    for probe_tp, other_tp in ((("t", 1), ("t", 0)), (("t", 0), ("t", 1))):
        b, now = breaker_in(B.HALF_OPEN)
        b.probe_started(probe_tp, 7, now)
        assert b.succeeded(other_tp, [7], now) is None
        assert b.state is B.PROBING
        assert b.succeeded(probe_tp, [7], now) is BE.PROBE_SUCCEEDED


def test_ten_messages_in_a_row_with_one_error_class_trip_it() -> None:
    b = Breaker(POLICY)
    for offset in range(9):
        assert b.failed(OTHER, offset, "db.Down", 0.0) is None
    assert b.failed(OTHER, 99, "ValueError", 0.0) is None  # another class: a new streak
    for offset in range(9):
        b.failed(OTHER, 10 + offset, "db.Down", 0.0)
    assert b.failed(OTHER, 19, "db.Down", 0.0) is BE.TRIPPED
    assert (b.reason, b.error_class, b.allowance(), b.held_for(0.25)) == (
        "consecutive",
        "db.Down",
        0,
        0.75,
    )


def test_half_the_calls_failing_within_the_window_trips_it() -> None:
    b = Breaker(POLICY)
    now = 0.0
    for i in range(10):  # alternating: the streak never passes 1
        b.succeeded(OTHER, [2 * i], now)
        event = b.failed(OTHER, 2 * i + 1, f"E{i % 2}", now)
        now += 0.5
    assert event is BE.TRIPPED and b.reason == "failure_rate"


def test_failures_older_than_the_window_do_not_count() -> None:
    b = Breaker(POLICY)
    for i in range(9):
        b.failed(OTHER, i, f"E{i}", 0.0)  # 9 failures, 9 classes
    b.succeeded(OTHER, list(range(100, 110)), 0.0)
    # 40 s later the old calls are outside the window: 20 new calls, 9 failing
    b.succeeded(OTHER, list(range(200, 211)), 40.0)
    for i in range(9):
        assert b.failed(OTHER, 300 + i, f"E{i}", 40.0) is None
    assert b.window_counts(40.0) == (20, 9)


def test_probe_failures_back_off_doubling_up_to_the_cap_then_a_success_closes() -> None:
    b = Breaker(POLICY)
    _trip(b, 0.0)
    now, waits = 0.0, []
    for offset in range(8):
        wait = b.held_for(now)
        assert wait is not None
        waits.append(wait)
        now += wait
        assert b.tick(now) is BE.COOLED_DOWN and b.allowance() == 1
        b.probe_started(OTHER, offset, now)
        assert b.failed(OTHER, offset, "db.Down", now) is BE.PROBE_FAILED
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    now += 60.0
    b.tick(now)
    b.probe_started(OTHER, 100, now)
    assert b.succeeded(OTHER, [99, 100], now) is BE.PROBE_SUCCEEDED
    assert b.closed and b.held_for(now) is None
    _trip(b, now)
    assert b.held_for(now) == 1.0  # the backoff starts again


def test_a_probe_that_never_reports_is_forgotten() -> None:
    b = Breaker(POLICY)
    _trip(b, 0.0)
    b.tick(1.0)
    b.probe_started(OTHER, 5, 1.0)
    assert b.tick(60.9) is None and b.allowance() == 0
    assert b.tick(61.0) is BE.PROBE_LOST and b.allowance() == 1


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="first_backoff"):
        BreakerPolicy(first_backoff=5.0, max_backoff=1.0)
    for first in (0.0, -0.5, -1.0):
        with pytest.raises(ValueError, match="first_backoff"):
            BreakerPolicy(first_backoff=first)
    assert BreakerPolicy(first_backoff=1e-9).first_backoff == 1e-9
    assert BreakerPolicy(first_backoff=5.0, max_backoff=5.0).max_backoff == 5.0
    with pytest.raises(ValueError, match="failure_rate"):
        BreakerPolicy(failure_rate=0.0)


@pytest.mark.parametrize(
    ("field", "refused", "accepted"),
    [
        ("consecutive", [0, -1], [1]),
        ("failure_rate", [0.0, -0.5, 1.000001, 1.5], [1e-9, 1.0]),
        ("min_calls", [0, -1], [1]),
        ("window", [0.0, -1.0], [1e-9]),
        ("probe_timeout", [0.0, -1.0], [1e-9]),
        ("backoff_factor", [0.999], [1.0]),
    ],
)
def test_each_policy_bound_is_where_its_message_says(
    field: str, refused: list[float], accepted: list[float]
) -> None:
    """Every bound of a policy, on both sides of its edge."""
    for value in refused:
        with pytest.raises(ValueError, match=field):
            BreakerPolicy(**{field: value})
    for value in accepted:
        assert getattr(BreakerPolicy(**{field: value}), field) == value


def test_the_readme_states_the_breaker_defaults() -> None:
    """The defaults users read are the core's (the window is not an option, so
    the README is where it is stated)."""
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    p = BreakerPolicy()
    for stated in (f"`--breaker-consecutive` ({p.consecutive})",
                   f"`--breaker-failure-rate` ({p.failure_rate:g})",
                   f"`--breaker-min-calls` ({p.min_calls})",
                   f"the calls of the last {p.window:g} s"):
        assert stated in readme, stated


@pytest.mark.parametrize(
    "name", ["failure_rate", "window", "first_backoff", "max_backoff", "backoff_factor",
             "probe_timeout"],
)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10**400])
def test_non_finite_policy_doubles_are_refused(name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        BreakerPolicy(**{name: bad})


@pytest.mark.parametrize("state", list(BreakerState))
def test_the_views_are_exactly_the_state(state: BreakerState) -> None:
    """``closed``, ``fetch_paused`` and ``held_for`` are plain values of the
    state (``is True``: a view that stopped being a property is a bound
    method, which is truthy)."""
    b, now = breaker_in(state)
    assert b.closed is (state is B.CLOSED)
    assert b.fetch_paused is (state is B.OPEN)
    held = b.held_for(now)
    assert (held is None) is (state is B.CLOSED)
    if state in (B.HALF_OPEN, B.PROBING):
        assert held == 0.0


def _invariant_holds(b: Breaker) -> bool:
    return breaker.breaker_invariant(b)


@pytest.mark.parametrize("state", list(BreakerState))
def test_the_invariant_holds_in_every_reachable_state(state: BreakerState) -> None:
    b, _ = breaker_in(state)
    assert _invariant_holds(b)
    if state is not B.CLOSED:  # the streak is bounded only while closed
        b._streak = {(OTHER, k) for k in range(2 * b.policy.consecutive)}
        assert _invariant_holds(b)


@pytest.mark.parametrize(
    ("state", "corrupt"),
    [
        (B.CLOSED, lambda b: setattr(b, "_open_until", 5.0)),
        (B.OPEN, lambda b: setattr(b, "_open_until", None)),
        (B.CLOSED, lambda b: setattr(b, "_probe", PROBE)),
        (B.PROBING, lambda b: setattr(b, "_probe", None)),
        (B.CLOSED, lambda b: setattr(b, "_backoff", b.policy.max_backoff * 2)),
        (B.CLOSED, lambda b: setattr(b, "_backoff", b.policy.first_backoff / 2)),
        (B.CLOSED, lambda b: setattr(
            b, "_streak", {(OTHER, k) for k in range(b.policy.consecutive)})),
        (B.CLOSED, lambda b: setattr(
            b, "_streak", {(OTHER, k) for k in range(b.policy.consecutive + 1)})),
        (B.CLOSED, lambda b: b._buckets.extend([k, 1, 0] for k in range(breaker.BUCKETS + 1))),
    ],
    ids=["open_until-closed", "no-open_until-open", "probe-closed", "no-probe-probing",
         "backoff-above", "backoff-below", "streak-at-trigger", "streak-past-trigger",
         "buckets"],
)
def test_the_invariant_refuses_each_broken_field(
    state: BreakerState, corrupt: Callable[[Breaker], None]
) -> None:
    """Each conjunct on its own: one field out of line, the rest as reached."""
    b, _ = breaker_in(state)
    corrupt(b)
    assert not _invariant_holds(b)


def test_time_may_start_anywhere_finite_and_never_goes_back() -> None:
    b = Breaker(POLICY)
    assert b.tick(-5.0) is None  # any finite start: a clock's zero is arbitrary
    assert b.tick(-5.0) is None
    if breaker.ENABLED:
        for bad in (-6.0, math.inf, math.nan):
            with pytest.raises(icontract.ViolationError, match="time is finite"):
                b.tick(bad)


# -- the breaker against the naive model -------------------------------------------------------

TPS = [("t", 0), ("t", 1)]
CLASSES = ["db.Down", "ValueError"]


class BreakerVersusReference(RuleBasedStateMachine):
    """The breaker and the naive model side by side (see module docstring)."""

    breaker_class: type[Breaker] = Breaker

    @initialize(
        consecutive=st.integers(1, 4),
        rate=st.sampled_from([0.25, 0.5, 1.0]),
        min_calls=st.integers(1, 8),
        window=st.sampled_from([1.0, 3.0, 30.0]),
        backoff=st.sampled_from([(0.5, 4.0), (1.0, 1.0), (1.0, 60.0)]),
        factor=st.sampled_from([1.0, 2.0, 3.0]),
        probe_timeout=st.sampled_from([0.5, 5.0]),
    )
    def setup(self, consecutive, rate, min_calls, window, backoff, factor, probe_timeout) -> None:
        kw = {
            "consecutive": consecutive,
            "failure_rate": rate,
            "min_calls": min_calls,
            "window": window,
            "first_backoff": backoff[0],
            "max_backoff": backoff[1],
            "backoff_factor": factor,
            "probe_timeout": probe_timeout,
        }
        self.policy = BreakerPolicy(**kw)
        self.breaker = self.breaker_class(self.policy)
        self.ref = RefBreaker(**kw)
        self.now = 0.0
        self.offset = 0

    def both(self, event: object, expected: object) -> None:
        assert (event.value if isinstance(event, BreakerEvent) else event) == expected

    def fresh(self) -> int:
        self.offset += 1
        return self.offset

    @rule(tp=st.sampled_from(TPS), n=st.integers(0, 3))
    def succeed(self, tp, n) -> None:
        offsets = [self.fresh() for _ in range(n)]
        got = self.breaker.succeeded(tp, offsets, self.now)
        self.both(got, self.ref.succeeded(tp, offsets, self.now))

    @rule(tp=st.sampled_from(TPS), cls=st.sampled_from(CLASSES), again=st.booleans())
    def fail(self, tp, cls, again) -> None:
        offset = self.offset if again else self.fresh()  # a message failing again
        got = self.breaker.failed(tp, offset, cls, self.now)
        self.both(got, self.ref.failed(tp, offset, cls, self.now))

    @precondition(lambda self: self.ref.probe is not None)
    @rule(ok=st.booleans(), cls=st.sampled_from(CLASSES))
    def probe_outcome(self, ok, cls) -> None:
        assert self.ref.probe is not None
        tp, offset = self.ref.probe
        if ok:
            got, want = self.breaker.succeeded(tp, [offset], self.now), self.ref.succeeded(
                tp, [offset], self.now
            )
        else:
            got, want = self.breaker.failed(tp, offset, cls, self.now), self.ref.failed(
                tp, offset, cls, self.now
            )
        self.both(got, want)

    @rule(tp=st.sampled_from(TPS))
    def probe(self, tp) -> None:
        offset = self.fresh()
        try:
            got = self.breaker.probe_started(tp, offset, self.now)
        except IllegalTransition:
            with pytest.raises(RefBreakerError):
                self.ref.probe_started(tp, offset, self.now)
            return
        self.both(got, self.ref.probe_started(tp, offset, self.now))

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.5, 7.0, 31.0]))
    def time_passes(self, dt) -> None:
        self.now += dt
        self.both(self.breaker.tick(self.now), self.ref.tick(self.now))

    @rule()
    def settle(self) -> None:
        """Bounded liveness: once the handler works again, the breaker closes within
        one maximal backoff (and a probe timeout, if a probe was lost)."""
        for _ in range(3):
            self.time_passes(self.policy.max_backoff + self.policy.probe_timeout)
            if self.breaker.allowance() == 1:
                self.probe(TPS[0])
            if self.ref.probe is not None:
                self.probe_outcome(ok=True, cls=CLASSES[0])
        assert self.breaker.closed

    @invariant()
    def SameState(self) -> None:
        b, r = self.breaker, self.ref
        assert b.state.value == r.state
        assert b.allowance() == r.allowance()
        assert b.held_for(self.now) == r.held_for(self.now)
        assert b.snapshot(self.now) == r.snapshot(self.now)

    @invariant()
    def NoWorkWhileOpen(self) -> None:
        assert (self.breaker.allowance() == 0) == (self.breaker.state in (B.OPEN, B.PROBING))


TestBreakerVersusReference = pytest.mark.formal(BreakerVersusReference.TestCase)


class NeverHalfOpens(Breaker):
    """A mutant: once open, it never lets a probe through."""

    def tick(self, now: float) -> BreakerEvent | None:
        return None if self.state is B.OPEN else super().tick(now)


@pytest.mark.formal
def test_the_model_comparison_catches_a_breaker_that_never_half_opens() -> None:
    assert_rejected(BreakerVersusReference, breaker_class=NeverHalfOpens)


# -- the import-time table guard ---------------------------------------------

B, BE = breaker.BreakerState, breaker.BreakerEvent
#: Each way to break the breaker's tables, and the guard's message that names it.
BREAKER_BREAKS: dict[str, dict[str, Any]] = {
    "a state without a row": {"TRANSITIONS": without(breaker.TRANSITIONS, B.OPEN)},
    "a row for no state": {"TRANSITIONS": with_entry(breaker.TRANSITIONS, "Extra", {})},
    "a state without an allowance": {"ALLOWANCE": without(breaker.ALLOWANCE, B.PROBING)},
    "an allowance for no state": {"ALLOWANCE": with_entry(breaker.ALLOWANCE, "Extra", 0)},
    "an event without an edge": {
        "TRANSITIONS": row_edit(breaker.TRANSITIONS, B.PROBING,
                                 lambda row: without(row, BE.PROBE_LOST)),
    },
    "an event with two edges": {
        "TRANSITIONS": row_edit(breaker.TRANSITIONS, B.CLOSED,
                                 lambda row: with_entry(row, BE.PROBE_LOST, B.OPEN)),
    },
}  # fmt: skip
BREAKER_SAYS = {
    "a state without a row": "needs a row and an allowance",
    "a row for no state": "needs a row and an allowance",
    "a state without an allowance": "needs a row and an allowance",
    "an allowance for no state": "needs a row and an allowance",
    "an event without an edge": "exactly one edge",
    "an event with two edges": "exactly one edge",
}


@pytest.mark.parametrize("broken", sorted(BREAKER_BREAKS))
def test_the_breaker_guard_refuses_a_broken_table(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import-time guard refuses each way to break the tables, by its own
    check's message (the shipped tables pass: the module imported)."""
    for name, value in BREAKER_BREAKS[broken].items():
        monkeypatch.setattr(breaker, name, value)
    with pytest.raises(AssertionError, match=BREAKER_SAYS[broken]):
        breaker._check_table()


def test_the_policy_is_a_frozen_keyword_only_value() -> None:
    """A policy is shared by the runtime and its reports: it cannot change under
    them, takes no stray attributes, and is built by name (the options are many
    numbers of the same type, so positions would be a trap)."""
    import dataclasses

    policy = BreakerPolicy(consecutive=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.consecutive = 4  # type: ignore[misc]
    assert not hasattr(policy, "__dict__")
    with pytest.raises(TypeError):
        BreakerPolicy(3)  # type: ignore[misc]
