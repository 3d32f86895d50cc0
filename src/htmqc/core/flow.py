"""Adaptive flow control: an AIMD window of in-flight messages, and when to pause.

Theory of operation
-------------------
The runtime counts messages (and bytes) fetched but not finished. It may fetch
more only while that count is below the *window*. After each observation
interval it reports what it saw (completions, errors, a latency figure) and the
window moves like TCP's congestion window:

* additive increase: a healthy interval (no errors, latency at or under target)
  grows the window by ``increase``;
* multiplicative decrease: errors above ``max_error_rate`` or latency above target
  shrink it to ``window * decrease`` (rounded down);

always clamped to ``[min_window, max_window]``. The hard bounds
(``max_in_flight`` messages, ``max_in_flight_bytes``) cap the window whatever it
says. Pausing uses hysteresis: pause at the limit, resume only once the load has
fallen to ``resume_fraction`` of it, so partitions do not flap. The poll loop
keeps polling while partitions are paused, so the group stays healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import icontract

from htmqc.core.contracts import ENABLED, capture_old


@dataclass(frozen=True, slots=True)
class FlowPolicy:
    """Bounds and gains of the window (see module docs). Accepted exactly when
    ``1 <= min_window <= initial_window <= max_window``, ``increase >= 1``,
    ``0 < decrease < 1``, ``latency_target > 0``, ``0 <= max_error_rate < 1``,
    ``max_in_flight >= 1``, ``max_in_flight_bytes >= 1`` and
    ``0 < resume_fraction <= 1``; otherwise ``ValueError`` names every rule broken.

    The bounds and the latency target have no defaults here: the runtime's
    options own them (``--min-in-flight``, ``--max-in-flight``, ...). The gains
    default to what the README documents: halve on trouble, any error is
    trouble, resume at 80 % of the limit."""

    min_window: int
    initial_window: int
    max_window: int
    increase: int
    latency_target: float
    max_in_flight: int
    max_in_flight_bytes: int
    decrease: float = 0.5
    max_error_rate: float = 0.0
    resume_fraction: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.min_window <= self.initial_window <= self.max_window:
            problems.append("need 1 <= min_window <= initial_window <= max_window")
        if self.increase < 1:
            problems.append("increase must be >= 1")
        if not 0 < self.decrease < 1:
            problems.append("decrease must be in (0, 1)")
        if self.latency_target <= 0:
            problems.append("latency_target must be > 0")
        if not 0 <= self.max_error_rate < 1:
            problems.append("max_error_rate must be in [0, 1)")
        if self.max_in_flight < 1 or self.max_in_flight_bytes < 1:
            problems.append("max_in_flight and max_in_flight_bytes must be >= 1")
        if not 0 < self.resume_fraction <= 1:
            problems.append("resume_fraction must be in (0, 1]")
        if problems:
            raise ValueError("; ".join(problems))


class FlowWindow:
    """The window and the pause state (see module docs)."""

    def __init__(self, policy: FlowPolicy) -> None:
        self.policy = policy
        self.window = self.policy.initial_window
        self.paused = False

    @property
    def limit(self) -> int:
        """Messages that may be in flight now: the window, capped by the hard bound."""
        return min(self.window, self.policy.max_in_flight)

    @icontract.require(lambda completed, errors: 0 <= errors <= completed, enabled=ENABLED)
    @icontract.require(lambda latency: latency >= 0, enabled=ENABLED)
    @capture_old(lambda self: self.window, name="window")
    @icontract.ensure(
        lambda self: self.policy.min_window <= self.window <= self.policy.max_window,
        "the window stays within its bounds",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, result, OLD: (result and self.window >= OLD.window)
        or (not result and self.window <= OLD.window),
        "the result says whether the interval counted as healthy",
        enabled=ENABLED,
    )
    def observe(self, completed: int, errors: int, latency: float) -> bool:
        """Report one interval: ``completed`` messages, of which ``errors`` failed, at
        ``latency`` seconds (the runtime's choice of figure, e.g. p90 of the interval).
        Returns True if the interval was healthy (the window grew or stayed at max)."""
        p = self.policy
        error_rate = errors / completed if completed else 0.0
        healthy = latency <= p.latency_target and error_rate <= p.max_error_rate
        if healthy:
            if completed:
                self.window = min(p.max_window, self.window + p.increase)
        else:
            self.window = max(p.min_window, int(self.window * p.decrease))
        return healthy

    @icontract.require(
        lambda in_flight, in_flight_bytes: in_flight >= 0 and in_flight_bytes >= 0,
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, in_flight, in_flight_bytes, result: not result
        or in_flight >= self.resume_mark() or in_flight_bytes >= self.resume_bytes_mark(),
        "never paused while well under both limits",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, in_flight, in_flight_bytes, result: result
        or (in_flight < self.limit and in_flight_bytes < self.policy.max_in_flight_bytes),
        "always paused at a limit",
        enabled=ENABLED,
    )
    def should_pause(self, in_flight: int, in_flight_bytes: int) -> bool:
        """Whether fetching must be paused now (with hysteresis); updates :attr:`paused`."""
        at_limit = in_flight >= self.limit or in_flight_bytes >= self.policy.max_in_flight_bytes
        if at_limit:
            self.paused = True
        elif self.paused:
            self.paused = (
                in_flight >= self.resume_mark() or in_flight_bytes >= self.resume_bytes_mark()
            )
        return self.paused

    def resume_mark(self) -> int:
        """Paused partitions resume once in-flight messages fall below this."""
        return max(1, int(self.limit * self.policy.resume_fraction))

    def resume_bytes_mark(self) -> int:
        """Paused partitions resume once in-flight bytes fall below this."""
        return max(1, int(self.policy.max_in_flight_bytes * self.policy.resume_fraction))
