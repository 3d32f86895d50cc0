"""What becomes of a failure: the rule table keeps the promises of the spec.

The outcome is read from the code's table, :data:`htmqc.core.failures.RULES`
(the first fact that holds decides; none: ``OTHERWISE``), over facts stated as
in ``spec/README.md`` (the failure rules) from the failure's inputs, as Z3
terms: ``too_large``, ``held`` (the breaker is open), ``poison``, ``fatal``,
``permanent``, ``from_topic`` (a retry-topic record), ``topic`` (a retry
topic is configured), ``attempts``, ``max_retries``, ``delay``, ``min_delay``.

The promises (restated from the spec, not from the code):

* ``too_large``: a message over the size limit is dead-lettered as too large,
  whatever else holds (it never ran; the breaker says nothing about it);
* ``held``: while the breaker is open nothing else leaves memory: the failure
  is held;
* ``poison``: a poison failure (or one that killed its worker) is
  dead-lettered as poison unless the breaker holds it;
* ``spent``: with the breaker closed, a message past its retries is
  dead-lettered: retries end (with the breaker's own bounded backoff, every
  message is eventually finished: ``AllFinished`` in TLA+);
* ``record``: a retry-topic record never waits in memory unless held.

Mutants (each a changed rule order): ``held`` before ``too_large``;
``to_topic`` before ``spent`` (a spent message goes round the retry topic for
ever).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import z3

from htmqc.core.decisions import DeadLetterKind
from htmqc.core.failures import OTHERWISE, RULES, Later, Outcome
from proofs.obligation import Obligation

OUTCOMES: list[Outcome] = [*DeadLetterKind, *Later]
SORT, VALUES = z3.EnumSort("FailureOutcome", [o.value for o in OUTCOMES])


def _o(outcome: Outcome) -> z3.ExprRef:
    return VALUES[OUTCOMES.index(outcome)]


B = {
    n: z3.Bool(n)
    for n in ("too_large", "held", "poison", "fatal", "permanent", "from_topic", "topic")
}
ATTEMPTS, MAX_RETRIES = z3.Int("attempts"), z3.Int("max_retries")
DELAY, MIN_DELAY = z3.Real("delay"), z3.Real("min_delay")

#: The facts, as ``spec/README.md`` states them.
FACTS: dict[str, z3.BoolRef] = {
    "too_large": B["too_large"],
    "held": B["held"],
    "poison": z3.Or(B["poison"], B["fatal"]),
    "permanent": B["permanent"],
    "spent": ATTEMPTS > MAX_RETRIES,
    "to_topic": z3.And(B["topic"], z3.Or(B["from_topic"], DELAY >= MIN_DELAY)),
}
#: What a failure can be: at least one attempt, a record only with a topic.
DOMAIN = [
    ATTEMPTS >= 1, MAX_RETRIES >= 0, DELAY >= 0, MIN_DELAY >= 0,
    z3.Implies(B["from_topic"], B["topic"]),
]


def outcome(rules: Sequence[tuple[str, Outcome]] = RULES) -> z3.ExprRef:
    """The outcome of the first rule whose fact holds."""
    result = _o(OTHERWISE)
    for name, out in reversed(rules):
        result = z3.If(FACTS[name], _o(out), result)
    return result


def _dead(out: z3.ExprRef) -> z3.BoolRef:
    return z3.Or([out == _o(k) for k in DeadLetterKind])


Promise = tuple[list[z3.BoolRef], z3.BoolRef, str]


def promises(rules: Sequence[tuple[str, Outcome]] = RULES) -> dict[str, Promise]:
    """``name -> (premises, goal, doc)`` of each promise (module docs)."""
    out = outcome(rules)
    held, too_large = B["held"], B["too_large"]
    return {
        "too_large": ([too_large], out == _o(DeadLetterKind.TOO_LARGE),
                      "a message over the size limit is dead-lettered as too large"),
        "held": ([held, z3.Not(too_large)], out == _o(Later.HOLD),
                 "while the breaker is open, nothing but a too-large message leaves memory"),
        "poison": ([z3.Or(B["poison"], B["fatal"]), z3.Not(held), z3.Not(too_large)],
                   out == _o(DeadLetterKind.POISON), "a poison failure is dead-lettered as poison"),
        "spent": ([ATTEMPTS > MAX_RETRIES, z3.Not(held)], _dead(out),
                  "with the breaker closed, a message past its retries is dead-lettered"),
        "record": ([B["from_topic"], z3.Not(held)], out != _o(Later.RETRY),
                   "a retry-topic record never waits in memory"),
    }


def _shown() -> dict[str, z3.ExprRef]:
    return {**B, "attempts": ATTEMPTS, "max_retries": MAX_RETRIES}


def obligations() -> Iterator[Obligation]:
    """One obligation per promise of the code's rule table."""
    for name, (premises, goal, doc) in promises().items():
        yield Obligation(f"failures:{name}", [*DOMAIN, *premises], goal, doc, shown=_shown())


def _moved(name: str, before: str) -> list[tuple[str, Outcome]]:
    """RULES with rule ``name`` moved just before rule ``before``."""
    rules = [r for r in RULES if r[0] != name]
    at = [r[0] for r in rules].index(before)
    return [*rules[:at], *(r for r in RULES if r[0] == name), *rules[at:]]


def mutants() -> Iterator[Obligation]:
    """Changed rule orders, each refuted by the promise it breaks."""
    chosen = {
        "mutant:failures_held_beats_too_large": (
            _moved("held", "too_large"), "too_large",
            "the breaker's hold beats a message over the size limit",
        ),
        "mutant:failures_topic_before_spent": (
            _moved("to_topic", "spent"), "spent",
            "a spent message goes back to the retry topic for ever",
        ),
    }
    for name, (rules, promise, what) in chosen.items():
        premises, goal, _ = promises(rules)[promise]
        yield Obligation(
            name, [*DOMAIN, *premises], goal, f"MUTANT: {what}", expect="COUNTEREXAMPLE",
            shown=_shown(),
        )
