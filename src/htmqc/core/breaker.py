"""The circuit breaker: stop handing out work while the handler is broken.

Runtime API
-----------
One :class:`Breaker` per consumer, on the poll thread, with the monotonic clock::

    breaker = Breaker(BreakerPolicy())                    # defaults below
    # a handler call ended (not a too-large message: the handler never ran)
    event = breaker.succeeded(tp, offsets, now)          # a batch of successes
    event = breaker.failed(tp, offset, error_class, now)  # "module.QualName" of the exception
    event = breaker.tick(now)                             # every turn
    # event: a BreakerEvent when the state changed (log it, count it), else None;
    # then: gate.hold(Hold.BREAKER) while breaker.fetch_paused, else gate.unhold(...)
    n = breaker.allowance()          # None: no limit; 0: hand out nothing; 1: one probe
    breaker.probe_started(tp, offset, now)   # when handing out that one message
    held = breaker.held_for(now)     # pass to core.failed(..., held_for=held)
    breaker.closed                   # /readyz; breaker.snapshot(now) for the state page

Theory of operation
-------------------
::

    Closed --tripped--> Open --cooled_down--> HalfOpen --probe_started--> Probing
    Probing --probe_succeeded--> Closed
    Probing --probe_failed--> Open (backoff doubled, at most max_backoff)
    Probing --probe_lost--> HalfOpen (no outcome within probe_timeout)

*Closed*: work flows; every handler outcome is counted. The breaker trips when

* ``consecutive`` different messages in a row fail with the same error class
  (a success, or a failure of another class, starts the count again; a
  message failing again counts once, so one bad message retried many times
  cannot trip it alone: that is the retry budget's and the poison detector's
  job), or
* at least ``min_calls`` handler calls ended within the last ``window``
  seconds and a share of at least ``failure_rate`` of them failed (any class:
  an intermittent fault interleaves successes that would reset the streak).

The window is counted in 10 buckets of ``window / 10`` seconds: bucket ``k``
holds the calls that ended in ``[k·w, (k+1)·w)``, and the window is the
current bucket and the 9 before it. Recording a batch of successes is O(1).

*Open* for the backoff: :meth:`allowance` is 0 (hand out nothing: no new
message, no due retry), fetching is paused (:attr:`fetch_paused`), and a
failure is *held* (:meth:`held_for`; :mod:`htmqc.core.failures` then retries it
after the backoff instead of dead-lettering it): the stream is not
dead-lettered while the handler is broken. Outcomes of calls that were
already running are ignored: they say nothing new.

*HalfOpen*: one message may go (:meth:`allowance` is 1) and fetching resumes,
so there is something to probe with even if the held messages went away with
their partitions; *Probing*: that message is out, nothing else goes. Its
success closes the breaker (the backoff starts again at ``first_backoff``);
its failure opens it again for twice the last backoff. A probe that reports
nothing for ``probe_timeout`` seconds (its partition was revoked, it was
handed off without running) is forgotten, and another may go.

Defaults (:class:`BreakerPolicy`), and why:

* ``consecutive=10``: a healthy consumer's bad messages are rare and
  scattered, so ten *different* messages failing in a row with one error class
  means the handler or a dependency is broken; a broken handler gets there
  within milliseconds, after at most ``consecutive / (max_retries + 1)``
  messages were dead-lettered. One message cannot trip it alone with the
  other defaults either: the poison detector takes it out after 5 fast
  failures and the retry budget after 4, far below 20 calls in 30 s.
* ``failure_rate=0.5`` over ``min_calls=20`` in ``window=30`` s: half the
  calls failing is an outage, not bad data; 20 calls keep a quiet topic's two
  or three bad messages from tripping it; 30 s is half the poison window, long
  enough to see a flapping dependency, short enough to react within seconds.
* ``first_backoff=1`` s doubling to ``max_backoff=60`` s: a fail-over or a
  restarting dependency is often back within seconds; at the cap a broken
  deploy costs one probe a minute, and a fix is picked up within a minute.
* ``probe_timeout=60`` s: well above a normal handler call; only a lost probe
  waits that long.

Invariant (:func:`breaker_invariant`): Open exactly when ``open_until`` is set,
Probing exactly when a probe is out, the backoff within its bounds, and in
Closed the streak below ``consecutive``.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import icontract

from htmqc.core.contracts import ENABLED, capture_old, keeps_invariant
from htmqc.core.decisions import TopicPartition
from htmqc.core.errors import IllegalTransition

#: Buckets the failure-rate window is counted in.
BUCKETS: Final[int] = 10


class BreakerState(enum.Enum):
    """Where the breaker is (see module docs)."""

    CLOSED = "Closed"
    OPEN = "Open"
    HALF_OPEN = "HalfOpen"
    PROBING = "Probing"


class BreakerEvent(enum.Enum):
    """State changes; values are the names used in logs and metrics."""

    TRIPPED = "tripped"
    COOLED_DOWN = "cooled_down"
    PROBE_STARTED = "probe_started"
    PROBE_SUCCEEDED = "probe_succeeded"
    PROBE_FAILED = "probe_failed"
    PROBE_LOST = "probe_lost"


B = BreakerState
BE = BreakerEvent

#: ``TRANSITIONS[state][event] -> new state``; a missing entry is illegal.
TRANSITIONS: Final[Mapping[BreakerState, Mapping[BreakerEvent, BreakerState]]] = (
    MappingProxyType(
        {
            B.CLOSED: MappingProxyType({BE.TRIPPED: B.OPEN}),
            B.OPEN: MappingProxyType({BE.COOLED_DOWN: B.HALF_OPEN}),
            B.HALF_OPEN: MappingProxyType({BE.PROBE_STARTED: B.PROBING}),
            B.PROBING: MappingProxyType(
                {
                    BE.PROBE_SUCCEEDED: B.CLOSED,
                    BE.PROBE_FAILED: B.OPEN,
                    BE.PROBE_LOST: B.HALF_OPEN,
                }
            ),
        }
    )
)

#: Work the breaker lets out per state (``None``: no limit).
ALLOWANCE: Final[Mapping[BreakerState, int | None]] = MappingProxyType(
    {B.CLOSED: None, B.OPEN: 0, B.HALF_OPEN: 1, B.PROBING: 0}
)


def _check_table() -> None:
    if set(TRANSITIONS) != set(BreakerState) or set(ALLOWANCE) != set(BreakerState):
        raise AssertionError("every breaker state needs a row and an allowance")
    edges = [event for row in TRANSITIONS.values() for event in row]
    if sorted(e.value for e in edges) != sorted(e.value for e in BreakerEvent):
        raise AssertionError("every breaker event needs exactly one edge")


_check_table()


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite double (an integer too large for one is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerPolicy:
    """When to trip and how long to stay open (module docs: the defaults)."""

    consecutive: int = 10
    failure_rate: float = 0.5
    min_calls: int = 20
    window: float = 30.0
    first_backoff: float = 1.0
    max_backoff: float = 60.0
    backoff_factor: float = 2.0
    probe_timeout: float = 60.0

    def __post_init__(self) -> None:
        problems = []
        doubles = ("failure_rate", "window", "first_backoff", "max_backoff", "backoff_factor",
                   "probe_timeout")
        infinite = [name for name in doubles if not _finite(getattr(self, name))]
        if infinite:
            # NaN passes every comparison below (a NaN window broke the buckets' floor)
            problems.append(f"{', '.join(infinite)} must be finite")
        if self.consecutive < 1:
            problems.append("consecutive must be >= 1")
        if not 0 < self.failure_rate <= 1:
            problems.append("failure_rate must be in (0, 1]")
        if self.min_calls < 1:
            problems.append("min_calls must be >= 1")
        if self.window <= 0:
            problems.append("window must be > 0")
        if not 0 < self.first_backoff <= self.max_backoff:
            problems.append("need 0 < first_backoff <= max_backoff")
        if self.backoff_factor < 1:
            problems.append("backoff_factor must be >= 1")
        if self.probe_timeout <= 0:
            problems.append("probe_timeout must be > 0")
        if problems:
            raise ValueError("; ".join(problems))


def breaker_invariant(b: Breaker) -> bool:
    """The breaker's invariant (module docs)."""
    p = b.policy
    return (
        (b._open_until is not None) == (b._state is B.OPEN)
        and (b._probe is not None) == (b._state is B.PROBING)
        and p.first_backoff <= b._backoff <= p.max_backoff
        and (b._state is not B.CLOSED or len(b._streak) < p.consecutive)
        and len(b._buckets) <= BUCKETS
    )


_keeps_invariant = keeps_invariant(breaker_invariant, "breaker")


def _not_before(self: Breaker, now: float) -> bool:
    return math.isfinite(now) and now >= self._last


class Breaker:
    """A circuit breaker over handler outcomes (see module docs)."""

    def __init__(self, policy: BreakerPolicy | None = None) -> None:
        self.policy = policy if policy is not None else BreakerPolicy()
        self._state = B.CLOSED
        self._open_until: float | None = None
        self._backoff = self.policy.first_backoff
        self._probe: tuple[TopicPartition, int] | None = None
        self._probe_since = 0.0
        #: Closed: the error class of the current streak and its messages.
        self._streak_class = ""
        self._streak: set[tuple[TopicPartition, int]] = set()
        #: Closed: ``[bucket index, calls, failures]``, oldest first.
        self._buckets: deque[list[int]] = deque()
        self._last = -math.inf
        #: Why it last tripped, and on what error class (reports).
        self.reason = ""
        self.error_class = ""
        #: How often it tripped (reports).
        self.trips = 0

    # -- views ---------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state."""
        return self._state

    @property
    def closed(self) -> bool:
        """Work flows normally (``/readyz`` is true only then)."""
        return self._state is B.CLOSED

    @property
    def fetch_paused(self) -> bool:
        """Whether fetching must be held (``Hold.BREAKER`` on the gate): while Open."""
        return self._state is B.OPEN

    def allowance(self) -> int | None:
        """How many messages may be handed out now: ``None`` (no limit) when
        Closed, 1 when HalfOpen, else 0."""
        return ALLOWANCE[self._state]

    def held_for(self, now: float) -> float | None:
        """``None`` when Closed; else the seconds until work may go again (0 once
        HalfOpen): a failure now is held that long, not dead-lettered."""
        if self._state is B.CLOSED:
            return None
        if self._open_until is None:
            return 0.0
        return max(0.0, self._open_until - now)

    def window_counts(self, now: float) -> tuple[int, int]:
        """``(calls, failures)`` in the failure-rate window at ``now`` (Closed)."""
        oldest = self._bucket(now) - BUCKETS + 1
        calls = failures = 0
        for index, c, f in self._buckets:
            if index >= oldest:
                calls += c
                failures += f
        return calls, failures

    def snapshot(self, now: float) -> dict[str, Any]:
        """Plain data for metrics and the state page."""
        calls, failures = self.window_counts(now)
        return {
            "state": self._state.value,
            "reason": self.reason,
            "error_class": self.error_class,
            "trips": self.trips,
            "backoff": self._backoff,
            "held_for": self.held_for(now),
            "streak": len(self._streak),
            "window_calls": calls,
            "window_failures": failures,
        }

    # -- events --------------------------------------------------------------------------

    @icontract.require(_not_before, "time is finite and does not go back", enabled=ENABLED)
    @_keeps_invariant
    def succeeded(
        self, tp: TopicPartition, offsets: Sequence[int], now: float
    ) -> BreakerEvent | None:
        """Handler calls on ``offsets`` of ``tp`` succeeded at ``now``."""
        self._last = now
        state = self._state
        if state is B.CLOSED:
            if offsets:
                self._streak.clear()
                self._count(now, len(offsets), 0)
            return None
        probe = self._probe
        if state is B.PROBING and probe is not None and probe[0] == tp and probe[1] in offsets:
            self._backoff = self.policy.first_backoff
            return self._step(BE.PROBE_SUCCEEDED)
        return None

    @icontract.require(_not_before, "time is finite and does not go back", enabled=ENABLED)
    @capture_old(lambda self: (self._state, self._backoff), name="before")
    @icontract.ensure(
        lambda self, result, OLD: result is not BE.PROBE_FAILED
        or self._backoff
        == min(self.policy.max_backoff, OLD.before[1] * self.policy.backoff_factor),
        "a failed probe opens the breaker for longer",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, OLD: OLD.before[0] is B.CLOSED or self._state is not B.CLOSED,
        "only a probe's success closes the breaker",
        enabled=ENABLED,
    )
    @_keeps_invariant
    def failed(
        self, tp: TopicPartition, offset: int, error_class: str, now: float
    ) -> BreakerEvent | None:
        """The handler call on ``offset`` of ``tp`` raised ``error_class`` at ``now``."""
        self._last = now
        state = self._state
        if state is B.CLOSED:
            message = (tp, offset)
            if error_class != self._streak_class:
                self._streak_class = error_class
                self._streak.clear()
            self._streak.add(message)
            self._count(now, 1, 1)
            p = self.policy
            if len(self._streak) >= p.consecutive:
                return self._trip(now, "consecutive", error_class)
            calls, failures = self.window_counts(now)
            if calls >= p.min_calls and failures >= p.failure_rate * calls:
                return self._trip(now, "failure_rate", error_class)
            return None
        if state is B.PROBING and self._probe == (tp, offset):
            self._backoff = min(self.policy.max_backoff, self._backoff * self.policy.backoff_factor)
            self.error_class = error_class
            self._open_until = now + self._backoff
            return self._step(BE.PROBE_FAILED)
        return None

    @icontract.require(_not_before, "time is finite and does not go back", enabled=ENABLED)
    @icontract.ensure(
        lambda self, now: not (
            (self._state is B.OPEN and self._open_until is not None and now >= self._open_until)
            or (self._state is B.PROBING and now - self._probe_since >= self.policy.probe_timeout)
        ),
        "nothing stays open past its backoff, no probe is awaited past its timeout",
        enabled=ENABLED,
    )
    @_keeps_invariant
    def tick(self, now: float) -> BreakerEvent | None:
        """Time passed: Open -> HalfOpen after the backoff; a probe that reported
        nothing for ``probe_timeout`` is forgotten."""
        self._last = now
        if self._state is B.OPEN and self._open_until is not None and now >= self._open_until:
            self._open_until = None
            return self._step(BE.COOLED_DOWN)
        if self._state is B.PROBING and now - self._probe_since >= self.policy.probe_timeout:
            self._probe = None
            return self._step(BE.PROBE_LOST)
        return None

    @icontract.require(_not_before, "time is finite and does not go back", enabled=ENABLED)
    @icontract.ensure(lambda self: self.allowance() == 0, enabled=ENABLED)
    @_keeps_invariant
    def probe_started(self, tp: TopicPartition, offset: int, now: float) -> BreakerEvent:
        """The one message HalfOpen allows, ``offset`` of ``tp``, was handed out.

        :raises IllegalTransition: the breaker is not HalfOpen.
        """
        if self._state is not B.HALF_OPEN:
            raise IllegalTransition(f"breaker: can't start a probe when {self._state.value}")
        self._last = now
        self._probe = (tp, offset)
        self._probe_since = now
        return self._step(BE.PROBE_STARTED)

    # -- internals -----------------------------------------------------------------------

    def _step(self, event: BreakerEvent) -> BreakerEvent:
        target = TRANSITIONS[self._state].get(event)
        if target is None:
            raise AssertionError(f"breaker: {event.value} when {self._state.value}")
        if self._state is B.PROBING:
            self._probe = None
        self._state = target
        return event

    def _trip(self, now: float, reason: str, error_class: str) -> BreakerEvent:
        self.reason = reason
        self.error_class = error_class
        self.trips += 1
        self._streak.clear()
        self._streak_class = ""
        self._buckets.clear()
        self._open_until = now + self._backoff
        return self._step(BE.TRIPPED)

    def _bucket(self, now: float) -> int:
        return math.floor(now / (self.policy.window / BUCKETS))

    def _count(self, now: float, calls: int, failures: int) -> None:
        index = self._bucket(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == index:
            buckets[-1][1] += calls
            buckets[-1][2] += failures
        else:
            buckets.append([index, calls, failures])
        oldest = index - BUCKETS + 1
        while buckets[0][0] < oldest:
            buckets.popleft()
