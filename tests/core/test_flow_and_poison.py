"""Flow-control window and poison detection, as properties.

The window tests state each step exactly (``observe`` and ``should_pause`` read
as the module docs say, in integers), with draws that land on the boundaries: an
error rate equal to ``max_error_rate``, a latency equal to the target, loads equal
to the limit and to the resume marks, tiny limits where the marks bottom out at 1.

The window and the poison detector are core decisions, so these properties are
part of the proof gate (``make verify`` runs ``-m formal``): a one-line change to
``observe`` that Z3's restatement of it cannot see fails here.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core.flow import FlowPolicy, FlowWindow
from htmqc.core.poison import PoisonDetector

pytestmark = pytest.mark.formal

BOUNDS: dict[str, Any] = {
    "min_window": 16, "initial_window": 1000, "max_window": 10_000, "increase": 50,
    "latency_target": 1.0, "max_in_flight": 10_000, "max_in_flight_bytes": 256 << 20,
}


def policy_of(**changes: Any) -> FlowPolicy:
    """A valid policy (:data:`BOUNDS`, documented gains) with ``changes``."""
    return FlowPolicy(**{**BOUNDS, **changes})


policies = st.builds(
    lambda lo, extra, init, inc, dec, cap, nbytes, rate, resume: FlowPolicy(
        min_window=lo,
        max_window=lo + extra,
        initial_window=lo + min(init, extra),
        increase=inc,
        decrease=dec,
        latency_target=0.5,
        max_error_rate=rate,
        max_in_flight=cap,
        max_in_flight_bytes=nbytes,
        resume_fraction=resume,
    ),
    st.integers(1, 100),
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.integers(1, 500),
    st.floats(0.05, 0.95),
    st.integers(1, 10**6),
    st.integers(1, 2**30),
    st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    st.sampled_from([0.01, 0.3, 0.5, 0.8, 1.0]),
)
intervals = st.lists(
    st.tuples(st.integers(0, 1000), st.floats(0, 1), st.floats(0, 10)), max_size=60
)
@given(policies, intervals)
def test_the_window_stays_within_bounds_under_any_latency_sequence(policy, seq) -> None:
    w = FlowWindow(policy)
    for completed, error_share, latency in seq:
        before = w.window
        healthy = w.observe(completed, int(completed * error_share), latency)
        assert policy.min_window <= w.window <= policy.max_window
        assert (w.window >= before) if healthy else (w.window <= before)


def test_aimd_grows_additively_and_halves_on_slowness() -> None:
    w = FlowWindow(policy_of(min_window=10, initial_window=100, max_window=1000, increase=10))
    assert w.observe(completed=50, errors=0, latency=0.1) and w.window == 110
    assert not w.observe(completed=50, errors=0, latency=5.0) and w.window == 55
    assert not w.observe(completed=50, errors=1, latency=0.1) and w.window == 27
    for _ in range(5):
        w.observe(completed=50, errors=50, latency=9.0)
    assert w.window == 10  # floor
    w.observe(completed=0, errors=0, latency=0.0)
    assert w.window == 10  # an idle interval is no evidence of health


@given(policies, st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 2**30)), max_size=80))
def test_pause_at_the_limit_and_resume_only_below_the_mark(policy, loads) -> None:
    w = FlowWindow(policy)
    for in_flight, nbytes in loads:
        paused = w.should_pause(in_flight, nbytes)
        if in_flight >= w.limit or nbytes >= policy.max_in_flight_bytes:
            assert paused
        if in_flight < w.resume_mark() and nbytes < w.resume_bytes_mark():
            assert not paused


def test_hysteresis_keeps_partitions_paused_between_the_marks() -> None:
    w = FlowWindow(policy_of(min_window=1, initial_window=100, max_window=100))
    assert not w.should_pause(99, 0)
    assert w.should_pause(100, 0)
    assert w.should_pause(90, 0)  # still above the resume mark (80)
    assert not w.should_pause(79, 0)


def broken_rules(f: dict[str, Any]) -> set[str]:
    """The rules of :class:`FlowPolicy`'s docstring that the fields ``f`` break,
    each named by the field its error message names first."""
    rules = {
        "min_window": 1 <= f["min_window"] <= f["initial_window"] <= f["max_window"],
        "increase": f["increase"] >= 1,
        "decrease": 0 < f["decrease"] < 1,
        "latency_target": f["latency_target"] > 0,
        "max_error_rate": 0 <= f["max_error_rate"] < 1,
        "max_in_flight": f["max_in_flight"] >= 1 and f["max_in_flight_bytes"] >= 1,
        "resume_fraction": 0 < f["resume_fraction"] <= 1,
    }
    return {name for name, holds in rules.items() if not holds}


#: Values at and around every boundary of the rules.
EDGES: dict[str, list[Any]] = {
    "min_window": [-1, 0, 1, 2, 16],
    "initial_window": [0, 1, 16, 1000],
    "max_window": [1, 16, 1000, 10_000],
    "increase": [-1, 0, 1, 2],
    "decrease": [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5],
    "latency_target": [-1.0, -0.5, 0.0, 0.5, 1.0],
    "max_error_rate": [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5],
    "max_in_flight": [-1, 0, 1, 2],
    "max_in_flight_bytes": [-1, 0, 1, 2],
    "resume_fraction": [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0],
}


@given(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in EDGES.items()}))
def test_a_policy_is_accepted_exactly_when_every_rule_holds(fields: dict[str, Any]) -> None:
    broken = broken_rules(fields)
    if not broken:
        FlowPolicy(**fields)
        return
    with pytest.raises(ValueError) as raised:
        FlowPolicy(**fields)
    named = {rule for rule in broken if rule in str(raised.value)}
    assert named == broken, f"{raised.value} (broken: {sorted(broken)})"


@pytest.mark.parametrize("field", sorted(EDGES))
def test_each_rule_alone_rejects_its_edges(field: str) -> None:
    """Every edge value of one field, the others valid: the rule alone decides."""
    base = {**BOUNDS, "decrease": 0.5, "max_error_rate": 0.0, "resume_fraction": 0.8}
    for value in EDGES[field]:
        fields = {**base, field: value}
        if broken_rules(fields):
            with pytest.raises(ValueError):
                FlowPolicy(**fields)
        else:
            FlowPolicy(**fields)


def test_a_policy_cannot_change_once_built() -> None:
    """The runtime shares one policy between its window and its reports."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy_of().min_window = 1  # type: ignore[misc]


def test_the_documented_gains_are_the_defaults() -> None:
    """README: the window halves on trouble, any error is trouble, and paused
    partitions resume below 80 % of the limit."""
    w = FlowWindow(policy_of(initial_window=1000))
    assert not w.observe(completed=1000, errors=1, latency=0.0) and w.window == 500
    assert w.should_pause(500, 0) and w.should_pause(400, 0) and not w.should_pause(399, 0)


def expected_window(policy: FlowPolicy, window: int, completed: int, errors: int,
                    latency: float) -> tuple[bool, int]:
    """The module docs' step, in exact arithmetic: healthy when the latency is at
    most the target and the error share at most ``max_error_rate`` (an idle
    interval has no errors); a healthy interval with completions adds
    ``increase`` (capped at ``max_window``), an unhealthy one multiplies by
    ``decrease`` and rounds down (floored at ``min_window``)."""
    share = Fraction(errors, completed) if completed else Fraction(0)
    healthy = latency <= policy.latency_target and share <= Fraction(policy.max_error_rate)
    if not healthy:
        return False, max(policy.min_window, math.floor(window * policy.decrease))
    return True, min(policy.max_window, window + policy.increase) if completed else window


@st.composite
def boundary_intervals(draw: st.DrawFn, policy: FlowPolicy) -> tuple[int, int, float]:
    """An interval whose error share or latency often sits exactly on the policy's."""
    completed = draw(st.integers(0, 400))
    rate = Fraction(policy.max_error_rate).limit_denominator(1000)
    on_edge = completed * rate.numerator // rate.denominator if completed else 0
    errors = draw(st.sampled_from([0, on_edge, min(completed, on_edge + 1), completed]))
    errors = min(errors, completed)
    t = policy.latency_target
    latency = draw(st.sampled_from([0.0, t, math.nextafter(t, math.inf), t * 3]))
    return completed, errors, latency


@given(st.data(), policies)
def test_each_observation_moves_the_window_exactly_as_documented(
    data: st.DataObject, policy: FlowPolicy
) -> None:
    w = FlowWindow(policy)
    for _ in range(data.draw(st.integers(1, 30))):
        completed, errors, latency = data.draw(boundary_intervals(policy))
        want = expected_window(policy, w.window, completed, errors, latency)
        assert (w.observe(completed, errors, latency), w.window) == want


def expected_pause(policy: FlowPolicy, window: int, paused: bool, in_flight: int,
                   nbytes: int) -> bool:
    """The module docs' hysteresis: pause at the limit (the window capped by
    ``max_in_flight``) or at ``max_in_flight_bytes``; once paused, stay paused
    until both loads fall below ``resume_fraction`` of their limit (rounded down,
    at least 1)."""
    limit = min(window, policy.max_in_flight)
    if in_flight >= limit or nbytes >= policy.max_in_flight_bytes:
        return True
    mark = max(1, math.floor(limit * policy.resume_fraction))
    bytes_mark = max(1, math.floor(policy.max_in_flight_bytes * policy.resume_fraction))
    return paused and (in_flight >= mark or nbytes >= bytes_mark)


@given(st.data(), policies)
def test_pausing_follows_the_documented_hysteresis(
    data: st.DataObject, policy: FlowPolicy
) -> None:
    w = FlowWindow(policy)
    limit = min(w.window, policy.max_in_flight)
    marks = {0, 1, 2, limit - 1, limit, limit + 1}
    marks |= {m + d for m in (max(1, int(limit * policy.resume_fraction)),) for d in (-1, 0, 1)}
    top = policy.max_in_flight_bytes
    byte_marks = {0, 1, 2, top - 1, top}
    byte_marks |= {m + d for m in (max(1, int(top * policy.resume_fraction)),) for d in (-1, 0, 1)}
    for _ in range(data.draw(st.integers(1, 40))):
        in_flight = data.draw(st.sampled_from(sorted(x for x in marks if x >= 0)))
        nbytes = data.draw(st.sampled_from(sorted(x for x in byte_marks if x >= 0)))
        want = expected_pause(policy, w.window, w.paused, in_flight, nbytes)
        assert w.should_pause(in_flight, nbytes) == want and w.paused == want


def test_tiny_limits_resume_only_when_empty() -> None:
    """A limit of 1 with any resume fraction: the marks bottom out at 1."""
    w = FlowWindow(policy_of(min_window=1, initial_window=1, max_window=1,
                             max_in_flight_bytes=1, resume_fraction=0.5))
    assert w.resume_mark() == 1 and w.resume_bytes_mark() == 1
    assert w.should_pause(1, 0) and not w.should_pause(0, 0)


@given(st.integers(1, 20), st.floats(0.1, 100))
def test_poison_triggers_exactly_at_the_threshold(threshold: int, window: float) -> None:
    d = PoisonDetector(threshold, window)
    step = window / (threshold + 1)
    results = [d.failed("m", i * step) for i in range(threshold)]
    assert results == [False] * (threshold - 1) + [True]


@given(st.integers(2, 20), st.floats(0.1, 100))
def test_failures_spread_wider_than_the_window_are_not_poison(threshold, window) -> None:
    d = PoisonDetector(threshold, window)
    assert not any(d.failed("m", i * window * 1.01) for i in range(threshold * 3))


@pytest.mark.parametrize(("threshold", "window"), [(0, 1.0), (-1, 1.0), (1, 0.0), (1, -0.5)])
def test_a_detector_that_could_not_count_is_refused(threshold: int, window: float) -> None:
    """At least one failure, within a window longer than no time at all."""
    with pytest.raises(ValueError, match=r"threshold must be >= 1|window must be > 0"):
        PoisonDetector(threshold, window)
    assert PoisonDetector(1, 1e-9).failed("m", 0.0)  # the smallest accepted counts


def test_a_failure_exactly_a_window_old_no_longer_counts() -> None:
    """The window is half-open: a failure ``window`` seconds before ``now`` has
    left it, one a moment less old has not (the oldest goes first)."""
    d = PoisonDetector(threshold=2, window=10.0)
    assert not d.failed("m", 0.0) and not d.failed("m", 10.0)  # 0.0 left as 10.0 came
    assert d.failed("m", 19.5)  # 10.0 is still inside
    d = PoisonDetector(threshold=3, window=10.0)
    assert not d.failed("m", 0.0) and not d.failed("m", 5.0)
    assert not d.failed("m", 12.0)  # 0.0 left; 5.0 and 12.0 count
    assert d.failed("m", 13.0)


def test_a_message_past_its_threshold_stays_poison() -> None:
    d = PoisonDetector(threshold=2, window=10.0)
    assert [d.failed("m", t) for t in (0.0, 1.0, 2.0, 3.0)] == [False, True, True, True]


def test_poison_counts_each_message_alone_and_forgets() -> None:
    d = PoisonDetector(threshold=2, window=10)
    assert not d.failed("a", 0.0)
    assert not d.failed("b", 1.0)
    assert d.failed("a", 2.0)
    d.forget("a")
    assert d.tracked() == 1
    assert not d.failed("a", 3.0)
