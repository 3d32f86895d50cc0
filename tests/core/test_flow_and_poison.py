"""Flow-control window and poison detection, as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core.flow import FlowPolicy, FlowWindow
from htmqc.core.poison import PoisonDetector

policies = st.builds(
    lambda lo, extra, init, inc, dec: FlowPolicy(
        min_window=lo,
        max_window=lo + extra,
        initial_window=lo + min(init, extra),
        increase=inc,
        decrease=dec,
        latency_target=0.5,
        max_in_flight=10**6,
    ),
    st.integers(1, 100),
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.integers(1, 500),
    st.floats(0.05, 0.95),
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
    w = FlowWindow(FlowPolicy(min_window=10, initial_window=100, max_window=1000, increase=10))
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
    policy = FlowPolicy(min_window=1, initial_window=100, max_window=100, resume_fraction=0.8)
    w = FlowWindow(policy)
    assert not w.should_pause(99, 0)
    assert w.should_pause(100, 0)
    assert w.should_pause(90, 0)  # still above the resume mark (80)
    assert not w.should_pause(79, 0)


@pytest.mark.parametrize(
    "kwargs", [{"min_window": 0}, {"decrease": 1.0}, {"initial_window": 10**9}, {"increase": 0}]
)
def test_bad_flow_policies_are_rejected(kwargs) -> None:
    with pytest.raises(ValueError):
        FlowPolicy(**kwargs)


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


def test_poison_counts_each_message_alone_and_forgets() -> None:
    d = PoisonDetector(threshold=2, window=10)
    assert not d.failed("a", 0.0)
    assert not d.failed("b", 1.0)
    assert d.failed("a", 2.0)
    d.forget("a")
    assert d.tracked() == 1
    assert not d.failed("a", 3.0)
