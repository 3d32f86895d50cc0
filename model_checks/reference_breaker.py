"""An independent reference model of :class:`htmqc.core.breaker.Breaker`.

Deliberately naive: every handler outcome since the breaker last tripped is
kept in a list, and the streak and the failure-rate window are recounted from
that list on every failure (the breaker keeps a set and ten rolling buckets).
States are plain names; answers are the event names the breaker returns.
The reports (why it last tripped, on what error class, how often) are kept as
plain fields, and :meth:`RefBreaker.snapshot` writes what
``Breaker.snapshot(now)`` must show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TP = tuple[str, int]


class RefBreakerError(Exception):
    """The model refuses an event (the breaker must refuse it too)."""


class RefBreaker:
    """The naive twin of :class:`htmqc.core.breaker.Breaker`."""

    def __init__(
        self,
        *,
        consecutive: int,
        failure_rate: float,
        min_calls: int,
        window: float,
        first_backoff: float,
        max_backoff: float,
        backoff_factor: float,
        probe_timeout: float,
    ) -> None:
        self.consecutive = consecutive
        self.failure_rate = failure_rate
        self.min_calls = min_calls
        self.window = window
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.factor = backoff_factor
        self.probe_timeout = probe_timeout
        self.state = "Closed"
        self.until: float | None = None
        self.backoff = first_backoff
        self.probe: tuple[TP, int] | None = None
        self.probe_since = 0.0
        # (time, calls, failures, message or None, error class or None)
        self.outcomes: list[tuple[float, int, int, object, str | None]] = []
        # reports: why it last tripped, the error class of the last trip or failed
        # probe, and how many times it tripped
        self.reason = ""
        self.error_class = ""
        self.trips = 0

    def allowance(self) -> int | None:
        return {"Closed": None, "Open": 0, "HalfOpen": 1, "Probing": 0}[self.state]

    def held_for(self, now: float) -> float | None:
        if self.state == "Closed":
            return None
        if self.state == "Open":
            assert self.until is not None
            return max(0.0, self.until - now)
        return 0.0

    def snapshot(self, now: float) -> dict[str, object]:
        """What ``Breaker.snapshot(now)`` shows (the conformance vectors' state)."""
        calls, failures = self._window(now)
        return {
            "state": self.state,
            "reason": self.reason,
            "error_class": self.error_class,
            "trips": self.trips,
            "backoff": self.backoff,
            "held_for": self.held_for(now),
            "streak": self._streak(),
            "window_calls": calls,
            "window_failures": failures,
        }

    def _streak(self) -> int:
        messages: set[object] = set()
        error_class = None
        for _, _, failures, message, cls in reversed(self.outcomes):
            if failures == 0:
                break
            if error_class is None:
                error_class = cls
            if cls != error_class:
                break
            messages.add(message)
        return len(messages)

    def _window(self, now: float) -> tuple[int, int]:
        width = self.window / 10
        oldest = math.floor(now / width) - 9
        calls = failures = 0
        for t, c, f, _, _ in self.outcomes:
            if math.floor(t / width) >= oldest:
                calls += c
                failures += f
        return calls, failures

    def succeeded(self, tp: TP, offsets: Sequence[int], now: float) -> str | None:
        if self.state == "Closed":
            if offsets:
                self.outcomes.append((now, len(offsets), 0, None, None))
            return None
        probe = self.probe
        if self.state == "Probing" and probe is not None and probe[0] == tp and probe[1] in offsets:
            self.state = "Closed"
            self.probe = None
            self.backoff = self.first_backoff
            return "probe_succeeded"
        return None

    def failed(self, tp: TP, offset: int, error_class: str, now: float) -> str | None:
        if self.state == "Closed":
            self.outcomes.append((now, 1, 1, (tp, offset), error_class))
            calls, failures = self._window(now)
            streak = self._streak() >= self.consecutive
            if streak or (calls >= self.min_calls and failures >= self.failure_rate * calls):
                self.reason = "consecutive" if streak else "failure_rate"
                self.error_class = error_class
                self.trips += 1
                self.state = "Open"
                self.until = now + self.backoff
                self.outcomes = []
                return "tripped"
            return None
        if self.state == "Probing" and self.probe == (tp, offset):
            self.backoff = min(self.max_backoff, self.backoff * self.factor)
            self.error_class = error_class
            self.state = "Open"
            self.until = now + self.backoff
            self.probe = None
            return "probe_failed"
        return None

    def tick(self, now: float) -> str | None:
        if self.state == "Open":
            assert self.until is not None
            if now >= self.until:
                self.state = "HalfOpen"
                self.until = None
                return "cooled_down"
        if self.state == "Probing" and now - self.probe_since >= self.probe_timeout:
            self.state = "HalfOpen"
            self.probe = None
            return "probe_lost"
        return None

    def probe_started(self, tp: TP, offset: int, now: float) -> str:
        if self.state != "HalfOpen":
            raise RefBreakerError(f"no probe when {self.state}")
        self.state = "Probing"
        self.probe = (tp, offset)
        self.probe_since = now
        return "probe_started"
