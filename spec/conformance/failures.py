"""Conformance vectors of the failure decision (``"kind": "failures"``, spec §4b).

Generated from the independent reference
(:func:`model_checks.reference_failures.decide`, the engine's old decision plus
the breaker hold): hand-written scenarios (one reading of the rule table each)
and seeded random sweeps; replayed through :func:`htmqc.core.failures.decide`.
The format is in ``spec/conformance/README.md``: each step is one call with all
its inputs and the decision the reference gives; the decision is a pure
function, so steps have no ``state`` and do not depend on each other.

A record only comes from the retry topic when one is configured (the core
refuses anything else), and only such a record has prior attempts; it may have
none (its attempt header was missing).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from htmqc.core import Failure, FailureKind, RetryPolicy, RetryTopic
from htmqc.core.failures import decide
from model_checks import reference_failures
from spec.conformance.replay import answer, parse_tp, step_mismatches

KIND = "failures"
RANDOM_SEEDS = (1, 2, 3)
TOPIC = "orders.retry"
#: The retry policy of a step unless it says otherwise (``RetryPolicy``'s defaults).
POLICY = (3, 0.1, 30.0)
#: Every row of the rule table (spec §4b), as the random sweeps must cover them.
ROWS = ("too_large", "hold", "poison", "permanent", "failed", "hand_off", "retry")


def _row(result: dict[str, Any], held: bool) -> str:
    """The row of the table a reference answer comes from (for coverage only)."""
    if result["type"] == "DeadLetter":
        return str(result["kind"])
    if result["type"] == "HandOff":
        return "hand_off"
    return "hold" if held else "retry"


class FailuresRecorder:
    """Asks the reference decision and records every call."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.rows: set[str] = set()

    def decide(
        self,
        *,
        kind: str = "retryable",
        poison: bool = False,
        fatal: bool = False,
        too_large: bool = False,
        prior: int = 0,
        from_topic: bool | None = None,
        count: int = 1,
        policy: tuple[int, float, float] = POLICY,
        min_delay: float | None = None,
        now: float = 1000.0,
        jitter: float = 0.5,
        held_for: float | None = None,
        tp: str = "orders/0",
        epoch: int = 1,
        offset: int = 7,
        per_source: tuple[tuple[str, str], ...] = (),
    ) -> dict[str, Any]:
        """One call: ``count`` is this assignment's failure count (this one included),
        ``prior`` the attempts on a retry-topic record, ``from_topic`` whether it was read
        from the retry topic (default: ``prior > 0``), ``min_delay`` ``None`` for no
        retry topic; ``per_source`` the retry topic's ``(source, retry)`` pairs."""
        max_retries, base, cap = policy
        from_topic = prior > 0 if from_topic is None else from_topic
        if from_topic and min_delay is None:
            raise AssertionError("a retry-topic record needs the retry topic configured")
        if prior and not from_topic:
            raise AssertionError("only a retry-topic record has prior attempts")
        for value in (base, cap, now, jitter, *(() if held_for is None else (held_for,))):
            assert isinstance(value, float), f"{value!r} must be written as a double"
        args = {
            "tp": tp,
            "epoch": epoch,
            "offset": offset,
            "failure": {
                "kind": kind,
                "poison": poison,
                "fatal": fatal,
                "too_large": too_large,
                "from_retry_topic": from_topic,
                "prior_attempts": prior,
            },
            "failure_count": count,
            "retry": {"max_retries": max_retries, "base_delay": base, "max_delay": cap},
            "retry_topic": None if min_delay is None else {
                "name": TOPIC, "min_delay": min_delay,
                **({"per_source": [list(pair) for pair in per_source]} if per_source else {}),
            },
            "now": now,
            "jitter": jitter,
            "held_for": held_for,
        }
        ref = reference_failures.decide(
            classified=kind,
            poison=poison,
            fatal=fatal,
            too_large=too_large,
            from_retry_topic=from_topic,
            prior=prior,
            failures_here=count,
            max_retries=max_retries,
            base=base,
            cap=cap,
            retry_topic=None if min_delay is None else destination(tp, per_source),
            min_delay=0.0 if min_delay is None else min_delay,
            now=now,
            jitter=jitter,
            held_for=held_for,
        )
        result = result_json(ref, tp, epoch, offset)
        self.rows.add(_row(result, held_for is not None and not too_large))
        self.steps.append({"op": "decide", "args": args, "result": result})
        return result


def destination(tp: str, per_source: tuple[tuple[str, str], ...]) -> str:
    """Where a hand-off of a message read from ``tp`` goes (spec §4b, row 6): the
    retry topic of the pair naming its topic as source or retry, else ``TOPIC``."""
    topic = tp.rsplit("/", 1)[0]
    return next((retry for source, retry in per_source if topic in (source, retry)), TOPIC)


def result_json(ref: tuple[object, ...], tp: str, epoch: int, offset: int) -> dict[str, Any]:
    """The reference's answer as the core's decision object (spec §4b)."""
    head = {"tp": tp, "epoch": epoch, "offset": offset}
    if ref[0] == "retry":
        _, at, attempts = ref
        assert isinstance(at, float)
        return {"type": "RetryAt", **head, "attempt": attempts, "at": at}
    if ref[0] == "hand_off":
        _, topic, due, attempts = ref
        assert isinstance(due, float)
        return {"type": "HandOff", **head, "topic": topic, "attempt": attempts, "due": due}
    _, kind, attempts = ref
    return {"type": "DeadLetter", **head, "attempts": attempts, "kind": kind}


# -- scenarios: one reading of the rule table each ------------------------------------------


def failures_too_large_first(r: FailuresRecorder) -> None:
    """too_large is the first rule: it beats the breaker hold, poison, fatal, permanent, a
    spent budget and a retry-topic record, and is dead-lettered at the first failure."""
    r.decide(too_large=True)
    r.decide(too_large=True, held_for=5.0)
    r.decide(too_large=True, held_for=0.0)
    r.decide(too_large=True, poison=True, fatal=True, kind="permanent", count=9)
    r.decide(too_large=True, prior=2, min_delay=0.0)
    r.decide(too_large=True, kind="unknown", min_delay=0.0, jitter=1.0)


def failures_breaker_hold(r: FailuresRecorder) -> None:
    """While the breaker holds (held_for not null, 0.0 included) every failure but a too-large
    one is retried in memory at now + held_for, whatever its poison, kind, budget or retry
    topic; the attempts still count (failure_count + prior_attempts)."""
    r.decide(held_for=2.5)
    r.decide(held_for=0.0)
    r.decide(held_for=0.0, now=1764000000.1)
    r.decide(held_for=3.25, poison=True)
    r.decide(held_for=3.25, fatal=True)
    r.decide(held_for=3.25, kind="permanent")
    r.decide(held_for=3.25, count=4)
    r.decide(held_for=3.25, count=50, kind="permanent", poison=True)
    r.decide(held_for=3.25, prior=2, min_delay=0.0)
    r.decide(held_for=3.25, prior=6, count=3, min_delay=0.0)
    r.decide(held_for=120.0, min_delay=0.0, jitter=1.0)
    r.decide(held_for=0.1, now=0.2)


def failures_poison_and_fatal(r: FailuresRecorder) -> None:
    """poison (the detector's verdict) and fatal (it killed its worker) both dead-letter as
    "poison", before permanent, a spent budget and the retry topic."""
    r.decide(poison=True)
    r.decide(fatal=True)
    r.decide(poison=True, fatal=True)
    r.decide(poison=True, kind="permanent")
    r.decide(fatal=True, kind="permanent", count=4)
    r.decide(poison=True, count=4)
    r.decide(poison=True, prior=1, min_delay=0.0)
    r.decide(fatal=True, kind="unknown", min_delay=0.0)


def failures_permanent(r: FailuresRecorder) -> None:
    """A permanent failure is dead-lettered as "permanent" at once, with budget left, from
    the retry topic, and when its budget is spent too; "unknown" is treated as "retryable"."""
    r.decide(kind="permanent")
    r.decide(kind="permanent", count=4)
    r.decide(kind="permanent", count=2, prior=5, min_delay=0.0)
    r.decide(kind="permanent", min_delay=0.0)
    r.decide(kind="unknown")
    r.decide(kind="retryable")
    r.decide(kind="unknown", count=4)
    r.decide(kind="retryable", count=4)


def failures_budget(r: FailuresRecorder) -> None:
    """The budget is spent when attempts > max_retries, attempts = failure_count +
    prior_attempts: a message runs max_retries + 1 times in all; max_retries 0 dead-letters
    the first failure; a spent retry-topic record is dead-lettered "failed", not handed off."""
    for count in (1, 2, 3, 4, 5):
        r.decide(count=count, jitter=1.0)
    r.decide(count=1, policy=(0, 0.1, 30.0))
    r.decide(count=1, policy=(1, 0.1, 30.0))
    r.decide(count=2, policy=(1, 0.1, 30.0))
    r.decide(count=1, prior=2, min_delay=0.0)
    r.decide(count=1, prior=3, min_delay=0.0)
    r.decide(count=2, prior=2, min_delay=100.0)
    r.decide(count=4, min_delay=0.0)
    r.decide(count=4, min_delay=1e9)
    r.decide(count=1, prior=1, policy=(0, 0.1, 30.0), min_delay=0.0)


def failures_retry_topic(r: FailuresRecorder) -> None:
    """With a retry topic a failure is handed off when it came from that topic (whatever its
    backoff) or when its backoff is >= min_delay (equal included; the backoff as a double:
    0.1 x 0.1 is 0.010000000000000002 >= 0.01, 0.7 x 0.1 is 0.06999999999999999 < 0.07),
    due at now + backoff; a shorter backoff, or no retry topic at all, retries in memory. A
    record read from the retry topic is known by where it was read, not by its attempt header:
    without one (prior_attempts 0) it is still handed off, never retried in memory."""
    r.decide(policy=(3, 1.0, 30.0), jitter=0.5, count=2)
    r.decide(policy=(3, 1.0, 30.0), jitter=0.5, count=2, min_delay=5.0)
    r.decide(policy=(3, 1.0, 30.0), jitter=1.0, count=3, min_delay=5.0)
    r.decide(policy=(3, 1.0, 30.0), jitter=1.0, count=3, min_delay=4.0)
    r.decide(policy=(3, 1.0, 30.0), jitter=0.999, count=3, min_delay=4.0)
    r.decide(policy=(3, 0.1, 30.0), jitter=1.0, count=1, min_delay=0.1)
    r.decide(policy=(3, 0.1, 30.0), jitter=0.3, count=2, min_delay=0.06)
    r.decide(policy=(3, 0.1, 30.0), jitter=0.1, count=1, min_delay=0.01)
    r.decide(policy=(3, 0.1, 30.0), jitter=0.7, count=1, min_delay=0.07)
    r.decide(jitter=0.0, min_delay=0.0)
    r.decide(jitter=0.0, min_delay=1e-300)
    r.decide(prior=1, jitter=0.0, min_delay=1e9)
    r.decide(prior=2, count=1, policy=(5, 1.0, 30.0), jitter=0.75, min_delay=1e9)
    r.decide(prior=1, count=2, policy=(5, 1.0, 30.0), jitter=0.75, min_delay=1e9)
    r.decide(prior=3, count=1, policy=(5, 1.0, 30.0), jitter=1.0, min_delay=0.5, now=0.1)
    # a retry-topic record without its attempt header: still never retried in memory
    r.decide(from_topic=True, jitter=0.0, min_delay=1e9)
    r.decide(from_topic=True, count=2, policy=(3, 1.0, 30.0), jitter=0.5, min_delay=1e9)
    r.decide(from_topic=True, count=4, jitter=0.5, min_delay=1e9)


def failures_retry_topic_per_source(r: FailuresRecorder) -> None:
    """Several source topics, each with its own retry topic (``per_source``): a hand-off
    goes to the retry topic of the topic the message was read from, whether that is the
    source or its retry topic; from a topic no pair names, to ``name``. Decisions that
    are not hand-offs do not depend on it."""
    pairs = (("orders", "orders.retry"), ("refunds", "refunds.retry"))
    r.decide(tp="refunds/1", jitter=0.0, min_delay=0.0, per_source=pairs)
    r.decide(tp="orders/0", jitter=0.0, min_delay=0.0, per_source=pairs)
    r.decide(tp="refunds.retry/0", prior=1, jitter=0.5, min_delay=1e9, per_source=pairs)
    r.decide(tp="orders.retry/2", from_topic=True, jitter=0.5, min_delay=1e9, per_source=pairs)
    r.decide(tp="audit/0", jitter=0.0, min_delay=0.0, per_source=pairs)
    r.decide(tp="refunds/1", jitter=0.5, min_delay=1e9, per_source=pairs)
    r.decide(tp="refunds.retry/0", prior=3, count=1, jitter=0.5, min_delay=1e9,
             per_source=pairs)  # fmt: skip


def failures_backoff_bits(r: FailuresRecorder) -> None:
    """The backoff and its due time bit for bit: jitter x min(max_delay, base_delay x
    2^min(n-1, 1000)), then now + it, in doubles, n the attempts; the cap before the jitter,
    the exponent bound (2^1000, not infinity), jitter 0 and 1, base_delay 0."""
    big = (10**6, 0.1, 30.0)
    for count in (1, 2, 3, 4, 9, 10, 11):
        r.decide(count=count, policy=big, jitter=0.7, now=1764000000.123)
    r.decide(count=3, policy=(5, 0.1, 0.3), jitter=0.9, now=0.1)
    r.decide(count=2, policy=(5, 0.1, 0.3), jitter=0.1, now=0.2)
    r.decide(count=1, policy=(5, 0.0, 0.0), jitter=0.8)
    r.decide(count=1, policy=(5, 0.0, 30.0), jitter=1.0)
    r.decide(count=6, policy=big, jitter=0.0)
    r.decide(count=6, policy=big, jitter=1.0)
    tiny = (10**6, 5e-324, 30.0)
    for count in (1001, 1002, 1025, 5000):
        r.decide(count=count, policy=tiny, jitter=1.0, now=0.0)
    r.decide(count=1, policy=(3, 1e-5, 1e-3), jitter=0.333, now=1e10)
    r.decide(count=2, prior=3, policy=(9, 0.1, 30.0), jitter=0.7, min_delay=1e9, now=0.3)
    r.decide(count=1, policy=(3, 1.5, 1.5), jitter=0.1, now=0.0)


def failures_echo(r: FailuresRecorder) -> None:
    """Every decision carries its message (tp, epoch, offset, echoed exactly, topic names may
    hold "/") and the retry topic's name; attempt/attempts is the whole count."""
    r.decide(tp="eu/orders/7", epoch=3, offset=2**63 - 1)
    r.decide(tp="eu/orders/7", epoch=3, offset=2**63 - 1, min_delay=0.0)
    r.decide(tp="eu/orders/7", epoch=3, offset=2**63 - 1, count=4)
    r.decide(tp="t/12", epoch=2**31, offset=0, kind="permanent")
    r.decide(tp="t/12", epoch=2**31, offset=0, held_for=1.0, prior=4, min_delay=0.0)


SCENARIOS: dict[str, Callable[[FailuresRecorder], None]] = {
    f.__name__: f
    for f in (failures_too_large_first, failures_breaker_hold, failures_poison_and_fatal,
              failures_permanent, failures_budget, failures_retry_topic,
              failures_retry_topic_per_source, failures_backoff_bits, failures_echo)
}


def random_sweep(r: FailuresRecorder, seed: int, steps: int = 120) -> None:
    """Random inputs in the decision's domain; facts often hold together."""
    rng = random.Random(seed)
    policies = [(0, 0.1, 30.0), (1, 0.5, 4.0), (3, 0.1, 30.0), (3, 1.0, 8.0), (5, 0.25, 2.0)]
    for _ in range(steps):
        policy = rng.choice(policies)
        min_delay = rng.choice([None, None, 0.0, 0.05, 0.4, 2.0, 100.0])
        from_topic = min_delay is not None and rng.random() < 0.35
        prior = rng.randint(0, 5) if from_topic else 0
        r.decide(
            kind=rng.choice(["retryable", "unknown", "permanent", "retryable"]),
            poison=rng.random() < 0.12,
            fatal=rng.random() < 0.08,
            too_large=rng.random() < 0.1,
            prior=prior,
            from_topic=from_topic,
            count=rng.randint(1, policy[0] + 2),
            policy=policy,
            min_delay=min_delay,
            now=rng.choice([0.0, 1.5, 1764000000.0]) + rng.random() * 100,
            jitter=rng.choice([0.0, 1.0, rng.random(), rng.random()]),
            held_for=rng.choice([None, None, None, None, 0.0, 0.75, 45.0]),
            tp=rng.choice(["orders/0", "orders/3", "eu/orders/1"]),
            epoch=rng.randint(1, 9),
            offset=rng.randrange(0, 10**6),
        )
    missing = set(ROWS) - r.rows
    if missing:
        raise AssertionError(f"random sweep {seed} misses rows {sorted(missing)}")


def vectors(fmt: int) -> dict[str, dict[str, Any]]:
    """Every failures vector, by file stem, generated afresh."""
    runs: list[tuple[str, str, Callable[[FailuresRecorder], None]]] = [
        (name, (scenario.__doc__ or "").strip(), scenario) for name, scenario in SCENARIOS.items()
    ]
    runs += [
        (f"failures_random_{seed}",
         f"Seeded random sweep of the failure decision, seed {seed}: every row of the rule "
         "table, facts holding together, policies, retry topics and breaker holds mixed.",
         lambda r, seed=seed: random_sweep(r, seed))
        for seed in RANDOM_SEEDS
    ]
    out = {}
    for name, description, run in runs:
        r = FailuresRecorder()
        run(r)
        out[name] = {
            "format": fmt, "kind": KIND, "name": name,
            "description": " ".join(description.split()), "steps": r.steps,
        }
    return out


# -- replaying -----------------------------------------------------------------------------


def call(op: str, args: dict[str, Any]) -> Any:
    """One call of the decision, answered in the vectors' vocabulary."""
    if op != "decide":
        raise ValueError(f"unknown failures op {op!r}")
    f = args["failure"]
    failure = Failure(
        kind=FailureKind(f["kind"]),
        poison=f["poison"],
        fatal=f["fatal"],
        too_large=f["too_large"],
        from_retry_topic=f["from_retry_topic"],
        prior_attempts=f["prior_attempts"],
    )
    topic = args["retry_topic"]
    return answer(decide(
        failure,
        tp=parse_tp(args["tp"]),
        epoch=args["epoch"],
        offset=args["offset"],
        attempts=args["failure_count"] + f["prior_attempts"],
        retry=RetryPolicy(**args["retry"]),
        retry_topic=None if topic is None else RetryTopic(
            **{**topic, "per_source": tuple(map(tuple, topic.get("per_source", ())))}
        ),
        now=args["now"],
        jitter=args["jitter"],
        held_for=args["held_for"],
    ))


def mismatches(vector: dict[str, Any]) -> Iterator[str]:
    """Every difference between ``decide`` and a failures vector."""
    yield from step_mismatches(vector, call, None, ())
