"""Conformance vectors of the circuit breaker (``"kind": "breaker"``, spec §4c).

Generated from the independent naive model
(:class:`model_checks.reference_breaker.RefBreaker`, which keeps every outcome
in a list and recounts): hand-written scenarios (one reading of the spec each)
and seeded random walks; replayed through :class:`htmqc.core.breaker.Breaker`.
The format is in ``spec/conformance/README.md``: each step is one breaker
method with its ``now``, its answer (the event's name or ``null``) or the error
``IllegalTransition``, and ``Breaker.snapshot(now)`` afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from htmqc.core.breaker import Breaker, BreakerEvent, BreakerPolicy
from htmqc.core.errors import IllegalTransition
from model_checks.reference_breaker import RefBreaker, RefBreakerError
from spec.conformance.replay import parse_tp as _tp
from spec.conformance.replay import step_mismatches

KIND = "breaker"
RANDOM_SEEDS = (1, 2, 3)
#: The policy of a scenario unless it says otherwise.
POLICY: dict[str, Any] = {
    "consecutive": 3, "failure_rate": 0.5, "min_calls": 100, "window": 10.0,
    "first_backoff": 1.0, "max_backoff": 8.0, "backoff_factor": 2.0, "probe_timeout": 5.0,
}
A, B = "orders/0", "orders/1"
DOWN, BAD = "db.Down", "ValueError"


# -- generating ----------------------------------------------------------------------------


class BreakerRecorder:
    """Drives the reference breaker and records every step."""

    def __init__(self, **policy: Any) -> None:
        self.policy = {**POLICY, **policy}
        BreakerPolicy(**self.policy)  # a valid policy
        for name in ("failure_rate", "window", "first_backoff", "max_backoff",
                     "backoff_factor", "probe_timeout"):
            assert isinstance(self.policy[name], float), f"{name} must be written as a double"
        self.ref = RefBreaker(**self.policy)
        self.steps: list[dict[str, Any]] = []
        self.now = 0.0

    def _do(self, op: str, args: dict[str, Any], call: Callable[[], str | None]) -> str | None:
        now = args["now"]
        assert isinstance(now, float) and now >= self.now, "time is a double and never goes back"
        before = self.ref.snapshot(now)
        step: dict[str, Any] = {"op": op, "args": args}
        result: str | None = None
        try:
            result = call()
            step["result"] = result
        except RefBreakerError:
            if self.ref.snapshot(now) != before:
                raise AssertionError(f"the reference breaker changed on a refused {op}") from None
            step["error"] = "IllegalTransition"
        else:
            self.now = now  # a refused call does not move the breaker's clock
        step["state"] = self.ref.snapshot(now)
        self.steps.append(step)
        return result

    def succeeded(self, tp: str, offsets: Sequence[int], now: float) -> str | None:
        args = {"tp": tp, "offsets": list(offsets), "now": now}
        return self._do("succeeded", args, lambda: self.ref.succeeded(_tp(tp), offsets, now))

    def failed(self, tp: str, offset: int, error_class: str, now: float) -> str | None:
        args = {"tp": tp, "offset": offset, "error_class": error_class, "now": now}
        return self._do("failed", args,
                        lambda: self.ref.failed(_tp(tp), offset, error_class, now))

    def tick(self, now: float) -> str | None:
        return self._do("tick", {"now": now}, lambda: self.ref.tick(now))

    def probe_started(self, tp: str, offset: int, now: float) -> str | None:
        args = {"tp": tp, "offset": offset, "now": now}
        return self._do("probe_started", args,
                        lambda: self.ref.probe_started(_tp(tp), offset, now))


# -- scenarios: one reading of the spec each ------------------------------------------------


def breaker_streak_trip(r: BreakerRecorder) -> None:
    """consecutive different messages in a row failing with one error class trip it: a
    message failing again counts once, the same offset on another partition is another
    message, a success (not an empty batch) or another class starts the count again; the
    trip opens for first_backoff and clears the streak and the window."""
    r.failed(A, 1, DOWN, 0.5)
    r.failed(A, 1, DOWN, 0.6)
    r.failed(A, 1, DOWN, 0.7)
    r.failed(B, 1, DOWN, 0.8)
    r.succeeded(A, [], 0.9)
    r.succeeded(A, [5, 6], 1.0)
    r.failed(A, 2, DOWN, 1.1)
    r.failed(A, 3, DOWN, 1.2)
    r.failed(A, 4, BAD, 1.3)
    r.failed(A, 5, DOWN, 1.4)
    r.failed(A, 6, DOWN, 1.5)
    r.failed(B, 6, DOWN, 1.6)
    r.tick(1.7)
    r.failed(A, 7, DOWN, 2.0)
    r.succeeded(A, [8], 2.1)


def breaker_rate_trip(r: BreakerRecorder) -> None:
    """At least min_calls calls in the window and failures >= failure_rate x calls trip it,
    any error class; a batch of successes counts one call per offset; only a failure trips
    (a success that leaves the rate above never does), and the trip says failure_rate; a
    closed breaker counts afresh."""
    r.failed(A, 1, DOWN, 0.0)
    r.failed(A, 2, BAD, 0.1)
    r.failed(A, 3, DOWN, 0.2)
    r.succeeded(A, [4], 0.3)
    r.tick(0.4)
    r.failed(A, 5, BAD, 0.5)
    r.tick(1.5)
    r.probe_started(A, 6, 1.5)
    r.succeeded(A, [6], 2.5)
    r.succeeded(B, [1, 2, 3, 4, 5, 6], 3.0)
    r.failed(B, 7, DOWN, 3.1)
    r.failed(B, 8, BAD, 3.2)
    r.failed(B, 9, DOWN, 3.3)
    r.failed(B, 10, BAD, 3.4)
    r.failed(B, 11, DOWN, 3.5)
    r.failed(B, 12, BAD, 3.6)


def breaker_rate_exact(r: BreakerRecorder) -> None:
    """The rate test is failures >= failure_rate x calls with the product rounded to a
    double: at failure_rate 0.28, 7 failures of 25 calls do not trip it (0.28 x 25 is
    7.000000000000001; 7 / 25 >= 0.28 would), the 8th failure does."""
    r.succeeded(A, list(range(18)), 0.0)
    for i in range(8):
        r.failed(A, 100 + i, BAD if i % 2 else DOWN, 1.0 + 0.125 * i)


def breaker_rate_all_fail(r: BreakerRecorder) -> None:
    """failure_rate 1.0 needs every call in the window to fail: a success keeps it closed
    until the window has passed the success's bucket by, then the next failure trips it."""
    r.succeeded(A, [1], 0.0)
    r.failed(A, 2, DOWN, 1.0)
    r.failed(A, 3, BAD, 2.0)
    r.failed(A, 4, DOWN, 9.9)
    r.failed(A, 5, BAD, 10.0)
    r.tick(11.0)
    r.failed(A, 6, DOWN, 11.5)


def breaker_window_buckets(r: BreakerRecorder) -> None:
    """The window is 10 buckets of window / 10 seconds, bucket floor(now / (window / 10))
    in doubles (0.3 / 0.1 is 2.9999999999999996: bucket 2), the current one and the 9
    before it: a call leaves the window at a bucket boundary, 9 to 10 widths after it."""
    r.failed(A, 1, DOWN, 0.05)
    r.failed(A, 2, BAD, 0.3)
    r.succeeded(A, [3], 0.35)
    r.tick(0.95)
    r.tick(0.9999)
    r.tick(1.0)
    r.tick(1.2)
    r.tick(1.25)
    r.tick(1.3)
    r.tick(1.35)
    r.failed(A, 4, DOWN, 1.4)
    r.failed(A, 5, BAD, 1.4)
    for i in range(5):
        r.failed(A, 6 + i, BAD if i % 2 else DOWN, 5.0 + 0.01 * i)


def breaker_half_open_probe(r: BreakerRecorder) -> None:
    """Open until trip time + backoff (tick at exactly that time cools it down, >=); HalfOpen
    ignores outcomes and lets one probe go; Probing ignores every outcome but the probe's
    (same partition and offset); a batch holding the probe closes it, counting nothing."""
    r.failed(A, 1, DOWN, 2.0)
    r.failed(A, 2, DOWN, 2.0)
    r.failed(A, 3, DOWN, 2.25)
    r.tick(2.5)
    r.failed(A, 4, DOWN, 3.0)
    r.succeeded(A, [5], 3.1)
    r.tick(3.25)
    r.failed(A, 6, DOWN, 3.5)
    r.succeeded(A, [6], 3.5)
    r.probe_started(A, 9, 4.0)
    r.failed(A, 10, DOWN, 4.1)
    r.succeeded(B, [9], 4.2)
    r.succeeded(A, [8, 10], 4.3)
    r.failed(B, 9, DOWN, 4.35)
    r.tick(4.4)
    r.succeeded(A, [8, 9, 10], 4.5)
    r.failed(A, 11, BAD, 4.6)
    r.failed(A, 12, BAD, 4.7)
    r.failed(A, 13, BAD, 4.8)


def breaker_probe_backoff(r: BreakerRecorder) -> None:
    """A failed probe opens it again for min(max_backoff, backoff x backoff_factor) from the
    failure and takes its error class (the reason stays); a successful probe brings the
    backoff back to first_backoff; a trip never changes the backoff."""
    r.failed(A, 1, DOWN, 0.0)
    r.failed(A, 2, DOWN, 0.0)
    r.failed(A, 3, DOWN, 0.0)
    now = 0.0
    for i in range(5):
        now += 10.0
        r.tick(now)
        r.probe_started(A, 100 + i, now + 0.5)
        r.failed(A, 100 + i, BAD if i % 2 else DOWN, now + 1.0)
        r.tick(now + 1.5)
    r.tick(now + 20.0)
    r.probe_started(B, 7, now + 20.0)
    r.succeeded(B, [7], now + 20.0)
    for offset in (20, 21, 22):
        r.failed(A, offset, DOWN, now + 30.0)
    r.tick(now + 30.5)
    r.tick(now + 31.0)


def breaker_probe_lost(r: BreakerRecorder) -> None:
    """A probe with no outcome for probe_timeout (now - since >= probe_timeout, in doubles:
    2.9 - 0.7 >= 2.2 holds) is forgotten: HalfOpen again, backoff unchanged; the lost
    probe's late outcome is ignored, another probe may go."""
    r.failed(A, 1, DOWN, 0.0)
    r.failed(A, 2, DOWN, 0.0)
    r.failed(A, 3, DOWN, 0.2)
    r.tick(0.7)
    r.probe_started(A, 4, 0.7)
    r.tick(2.8)
    r.tick(2.9)
    r.failed(A, 4, DOWN, 3.0)
    r.succeeded(A, [4], 3.0)
    r.probe_started(B, 5, 3.1)
    r.tick(5.0)
    r.failed(B, 5, BAD, 5.2)


def breaker_open_time_bits(r: BreakerRecorder) -> None:
    """Open until is trip time + backoff in doubles, compared with now >= it: 0.3 + 0.6 is
    0.8999999999999999, so a tick then cools it down; held_for is max(0, until - now)."""
    r.failed(A, 1, DOWN, 0.1)
    r.failed(A, 2, DOWN, 0.2)
    r.failed(A, 3, DOWN, 0.3)
    r.tick(0.5)
    r.tick(0.8999999999999999)
    r.probe_started(A, 4, 0.8999999999999999)
    r.failed(A, 4, DOWN, 1.1)
    r.tick(2.2)
    r.tick(2.3)
    r.probe_started(A, 5, 2.3)
    r.succeeded(A, [5], 2.3)


def breaker_refused_and_ignored(r: BreakerRecorder) -> None:
    """probe_started is refused (IllegalTransition, nothing changes) unless HalfOpen;
    outcomes while Open or HalfOpen, and ticks with nothing due, answer null; an empty
    batch of successes changes nothing."""
    r.probe_started(A, 1, 0.0)
    r.tick(0.5)
    r.succeeded(A, [], 0.5)
    r.failed(A, 1, DOWN, 1.0)
    r.failed(A, 2, DOWN, 1.0)
    r.failed(A, 3, DOWN, 1.0)
    r.probe_started(A, 4, 1.5)
    r.failed(A, 5, DOWN, 1.5)
    r.succeeded(A, [6, 7], 1.6)
    r.tick(2.0)
    r.failed(A, 8, DOWN, 2.0)
    r.succeeded(A, [9], 2.1)
    r.probe_started(A, 10, 2.2)
    r.probe_started(A, 11, 2.3)
    r.probe_started(A, 10, 2.3)
    r.tick(2.4)
    r.succeeded(A, [10], 2.5)
    r.probe_started(A, 12, 2.6)


SCENARIOS: dict[str, tuple[dict[str, Any], Callable[[BreakerRecorder], None]]] = {
    f.__name__: (policy, f)
    for policy, f in (
        ({}, breaker_streak_trip),
        ({"consecutive": 100, "min_calls": 4}, breaker_rate_trip),
        ({"consecutive": 100, "min_calls": 25, "failure_rate": 0.28}, breaker_rate_exact),
        ({"consecutive": 100, "min_calls": 3, "failure_rate": 1.0}, breaker_rate_all_fail),
        ({"consecutive": 100, "min_calls": 5, "window": 1.0}, breaker_window_buckets),
        ({}, breaker_half_open_probe),
        ({"max_backoff": 5.0}, breaker_probe_backoff),
        ({"probe_timeout": 2.2, "first_backoff": 0.5}, breaker_probe_lost),
        ({"first_backoff": 0.6, "probe_timeout": 1.0}, breaker_open_time_bits),
        ({}, breaker_refused_and_ignored),
    )
}

#: The random walks' policies, by seed.
WALK_POLICIES: dict[int, dict[str, Any]] = {
    1: {"consecutive": 3, "failure_rate": 0.5, "min_calls": 6, "window": 3.0,
        "first_backoff": 0.5, "max_backoff": 4.0, "backoff_factor": 2.0, "probe_timeout": 5.0},
    2: {"consecutive": 2, "failure_rate": 0.25, "min_calls": 8, "window": 1.0,
        "first_backoff": 1.0, "max_backoff": 1.0, "backoff_factor": 1.0, "probe_timeout": 0.5},
    3: {"consecutive": 4, "failure_rate": 0.75, "min_calls": 3, "window": 30.0,
        "first_backoff": 0.3, "max_backoff": 7.0, "backoff_factor": 3.0, "probe_timeout": 2.0},
}
#: What every random walk must meet.
WALK_COVERS = frozenset({e.value for e in BreakerEvent} | {"IllegalTransition"})


def random_walk(r: BreakerRecorder, seed: int, steps: int = 150) -> None:
    """Outcomes, ticks and probes at random, time moving forward."""
    rng = random.Random(seed)
    offset = 0
    seen: set[str] = set()
    for _ in range(steps):
        now = r.now + rng.choice([0.0, 0.0, 0.1, 0.3, 0.5, 1.0, 2.5, 7.0])
        tp = rng.choice([A, B])
        probe = r.ref.probe
        choice = rng.choices(
            ["success", "failure", "again", "probe_outcome", "probe", "tick"],
            [3.0, 4.0, 1.0, 3.0 if probe else 0.0, 2.0 if r.ref.state == "HalfOpen" else 0.3,
             2.0],
        )[0]
        if choice == "success":
            offsets = list(range(offset + 1, offset + 1 + rng.randint(0, 3)))
            offset += len(offsets)
            answer = r.succeeded(tp, offsets, now)
        elif choice in ("failure", "again"):
            offset += choice == "failure"
            answer = r.failed(tp, offset, rng.choice([DOWN, BAD]), now)
        elif choice == "probe_outcome":
            assert probe is not None
            name = f"{probe[0][0]}/{probe[0][1]}"
            if rng.random() < 0.5:
                answer = r.succeeded(name, [probe[1], offset + 1], now)
                offset += 1
            else:
                answer = r.failed(name, probe[1], rng.choice([DOWN, BAD]), now)
        elif choice == "probe":
            offset += 1
            answer = r.probe_started(tp, offset, now)
        else:
            answer = r.tick(now)
        seen.add(r.steps[-1].get("error", answer))
    missing = WALK_COVERS - seen
    if missing:
        raise AssertionError(f"random walk {seed} misses {sorted(missing)}")


def vectors(fmt: int) -> dict[str, dict[str, Any]]:
    """Every breaker vector, by file stem, generated afresh."""
    runs: list[tuple[str, str, dict[str, Any], Callable[[BreakerRecorder], None]]] = [
        (name, (scenario.__doc__ or "").strip(), policy, scenario)
        for name, (policy, scenario) in SCENARIOS.items()
    ]
    runs += [
        (f"breaker_random_{seed}",
         f"Seeded random walk of the circuit breaker, seed {seed}: outcomes of fresh and "
         "repeated messages, probes (legal and refused), ticks, time passing.",
         WALK_POLICIES[seed], lambda r, seed=seed: random_walk(r, seed))
        for seed in RANDOM_SEEDS
    ]
    out = {}
    for name, description, policy, run in runs:
        r = BreakerRecorder(**policy)
        run(r)
        out[name] = {
            "format": fmt, "kind": KIND, "name": name,
            "description": " ".join(description.split()), "policy": r.policy,
            "steps": r.steps,
        }
    return out


# -- replaying -----------------------------------------------------------------------------


def call(breaker: Breaker, op: str, args: dict[str, Any]) -> BreakerEvent | None:
    """Perform one step on ``breaker``."""
    now = args["now"]
    if op == "succeeded":
        return breaker.succeeded(_tp(args["tp"]), args["offsets"], now)
    if op == "failed":
        return breaker.failed(_tp(args["tp"]), args["offset"], args["error_class"], now)
    if op == "tick":
        return breaker.tick(now)
    if op == "probe_started":
        return breaker.probe_started(_tp(args["tp"]), args["offset"], now)
    raise ValueError(f"unknown breaker op {op!r}")


def mismatches(vector: dict[str, Any]) -> Iterator[str]:
    """Every difference between ``Breaker`` and a breaker vector (stops at the first state)."""
    breaker = Breaker(BreakerPolicy(**vector["policy"]))
    clock = [0.0]

    def perform(op: str, args: dict[str, Any]) -> str | None:
        clock[0] = args["now"]
        event = call(breaker, op, args)
        return None if event is None else event.value

    yield from step_mismatches(
        vector, perform, lambda: breaker.snapshot(clock[0]), (IllegalTransition,)
    )
