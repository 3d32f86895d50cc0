"""An independent reference for :func:`htmqc.core.failures.decide`.

Deliberately not the rule table: this is the decision as ``Engine.failed`` made
it before issue 16 moved it into the core (poison, size and classification
folded into one "permanent" kind; the retry topic decided before the core;
the core's own retry budget counting this assignment's failures only),
restated with plain values, plus the two rules that are new: while the circuit
breaker holds, a failure that is not ``too_large`` is retried after the hold;
and a record read from the retry topic is told apart by where it was read
(``from_retry_topic``), not by its attempt header: the engine took a record
without the header (``prior == 0``) for a fresh one and could retry it in
memory, which a record of the retry topic must never do. Agreement with the
core therefore shows that moving the decision changed nothing else.

Inputs are plain values; the answer is a tuple:
``("retry", at, attempts)``, ``("hand_off", topic, due, attempts)`` or
``("dead_letter", kind, attempts)``.
"""

from __future__ import annotations


def backoff(attempt: int, jitter: float, base: float, cap: float) -> float:
    """Full jitter: ``jitter * min(cap, base * 2**(attempt - 1))``, clamped to ``[0, cap]``."""
    return min(cap, max(0.0, jitter * min(cap, base * 2.0 ** min(attempt - 1, 1000))))


def decide(
    *,
    classified: str,
    poison: bool,
    fatal: bool,
    too_large: bool,
    from_retry_topic: bool,
    prior: int,
    failures_here: int,
    max_retries: int,
    base: float,
    cap: float,
    retry_topic: str | None,
    min_delay: float,
    now: float,
    jitter: float,
    held_for: float | None,
) -> tuple[object, ...]:
    """The answer for a message that has now failed ``failures_here`` times in this
    assignment (this failure included) after ``prior`` failures recorded on its
    retry-topic record (``from_retry_topic``: it was read from the retry topic;
    its header may be missing, ``prior == 0``). ``classified``: ``"retryable"``, ``"permanent"`` or
    ``"unknown"``."""
    attempts = failures_here + prior
    if held_for is not None and not too_large:
        return ("retry", now + held_for, attempts)
    permanent = poison or too_large or fatal or classified == "permanent"
    hand_off_due = None
    over_budget = False
    if retry_topic is not None and not permanent:
        if attempts > max_retries:
            over_budget = from_retry_topic
        else:
            delay = backoff(attempts, jitter, base, cap)
            if from_retry_topic or delay >= min_delay:
                hand_off_due = now + delay
    core_permanent = permanent or hand_off_due is not None or over_budget
    if not core_permanent and failures_here <= max_retries:
        return ("retry", now + backoff(failures_here, jitter, base, cap), attempts)
    if hand_off_due is not None:
        return ("hand_off", retry_topic, hand_off_due, attempts)
    if too_large:
        kind = "too_large"
    elif poison or fatal:
        kind = "poison"
    elif classified == "permanent":
        kind = "permanent"
    else:
        kind = "failed"
    return ("dead_letter", kind, attempts)
