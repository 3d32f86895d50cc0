"""The failure decision: its rule table, the engine's old decision, the lifecycle.

Three layers: every combination of the table's facts, built into concrete
inputs, answers the first rule that holds (and what the pre-issue-16 engine
answered, restated in ``model_checks/reference_failures.py``); random inputs
agree with that reference; and a Hypothesis state machine runs failures,
retries, hand-offs and dead letters through :class:`ConsumerCore` beside the
naive :class:`~model_checks.reference.ReferenceConsumer` and compares their
whole observable state after every step.
"""

from __future__ import annotations

import itertools
from dataclasses import fields, make_dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from htmqc.core import (
    ConsumerCore,
    DeadLetter,
    DeadLetterKind,
    Failure,
    FailureKind,
    HandOff,
    MessageState,
    RetryAt,
    RetryPolicy,
    RetryTopic,
)
from htmqc.core import failures as failures_module
from htmqc.core.failures import OTHERWISE, RULES, Facts, Later, decide
from model_checks import reference_failures
from model_checks.reference import ReferenceConsumer

TP = ("t", 0)
TOPIC = "t.retry"
FACT_NAMES = [f.name for f in fields(Facts)]


def answer(decision: RetryAt | HandOff | DeadLetter) -> tuple[object, ...]:
    """A core decision in the reference's vocabulary."""
    if isinstance(decision, RetryAt):
        return ("retry", decision.at, decision.attempt)
    if isinstance(decision, HandOff):
        return ("hand_off", decision.topic, decision.due, decision.attempt)
    return ("dead_letter", decision.kind.value, decision.attempts)


def reference(
    failure: Failure,
    *,
    attempts: int,
    retry: RetryPolicy,
    retry_topic: RetryTopic | None,
    now: float,
    jitter: float,
    held_for: float | None,
) -> tuple[object, ...]:
    return reference_failures.decide(
        classified=failure.kind.value,
        poison=failure.poison,
        fatal=failure.fatal,
        too_large=failure.too_large,
        from_retry_topic=failure.from_retry_topic,
        prior=failure.prior_attempts,
        failures_here=attempts - failure.prior_attempts,
        max_retries=retry.max_retries,
        base=retry.base_delay,
        cap=retry.max_delay,
        retry_topic=retry_topic.name if retry_topic else None,
        min_delay=retry_topic.min_delay if retry_topic else 0.0,
        now=now,
        jitter=jitter,
        held_for=held_for,
    )


# -- the table, every combination of its facts ---------------------------------------------


def first_rule(values: dict[str, bool]) -> DeadLetterKind | Later:
    """What the table says: the outcome of the first rule whose fact holds."""
    return next((out for name, out in RULES if values[name]), OTHERWISE)


# Each combination is built three ways where it can be: `to_topic` holds because
# the message came from the retry topic or because its backoff is long enough,
# and fails with a short backoff or with no retry topic at all.
COMBINATIONS = [
    (dict(zip(FACT_NAMES, bits, strict=True)), how)
    for bits in itertools.product([False, True], repeat=len(FACT_NAMES))
    for how in ("record", "delay", "no_topic")
    if not (how == "no_topic" and bits[FACT_NAMES.index("to_topic")])
    and not (how == "record" and not bits[FACT_NAMES.index("to_topic")])
]


@pytest.mark.parametrize(("values", "how"), COMBINATIONS)
def test_every_combination_of_facts_follows_the_first_rule_that_holds(
    values: dict[str, bool], how: str
) -> None:
    retry = RetryPolicy(max_retries=2, base_delay=1.0, max_delay=8.0)
    record = how == "record"
    prior = 1 if record else 0
    attempts = 3 if values["spent"] else 2
    min_delay = 0.0 if values["to_topic"] and not record else 99.0
    topic = None if how == "no_topic" else RetryTopic(name=TOPIC, min_delay=min_delay)
    failure = Failure(
        kind=FailureKind.PERMANENT if values["permanent"] else FailureKind.RETRYABLE,
        poison=values["poison"],
        too_large=values["too_large"],
        from_retry_topic=record,
        prior_attempts=prior,
    )
    held_for = 2.5 if values["held"] else None
    decision = decide(
        failure,
        tp=TP,
        epoch=1,
        offset=7,
        attempts=attempts,
        retry=retry,
        retry_topic=topic,
        now=100.0,
        jitter=0.5,
        held_for=held_for,
    )
    expected = first_rule(values)
    delay = retry.delay(attempts, 0.5)
    if isinstance(expected, DeadLetterKind):
        assert decision == DeadLetter(tp=TP, epoch=1, offset=7, attempts=attempts, kind=expected)
    elif expected is Later.HOLD:
        assert decision == RetryAt(tp=TP, epoch=1, offset=7, attempt=attempts, at=102.5)
    elif expected is Later.HAND_OFF:
        assert decision == HandOff(
            tp=TP, epoch=1, offset=7, topic=TOPIC, attempt=attempts, due=100.0 + delay
        )
    else:
        assert decision == RetryAt(tp=TP, epoch=1, offset=7, attempt=attempts, at=100.0 + delay)
    kw = {"retry": retry, "retry_topic": topic, "now": 100.0, "jitter": 0.5}
    assert answer(decision) == reference(failure, attempts=attempts, held_for=held_for, **kw)


def test_a_fatal_error_is_poison_like_the_detectors_verdict() -> None:
    decision = decide(
        Failure(fatal=True),
        tp=TP, epoch=1, offset=0, attempts=1, retry=RetryPolicy(), retry_topic=None,
        now=0.0, jitter=0.0,
    )
    assert isinstance(decision, DeadLetter) and decision.kind is DeadLetterKind.POISON


# -- random inputs against the engine's old decision ------------------------------------------

policies = st.builds(
    lambda n, base, extra: RetryPolicy(max_retries=n, base_delay=base, max_delay=base + extra),
    st.integers(0, 6),
    st.floats(0, 10),
    st.floats(0, 50),
)
topics = st.none() | st.builds(
    lambda d: RetryTopic(name=TOPIC, min_delay=d), st.floats(0, 60)
)


@st.composite
def failures(draw: st.DrawFn, topic: RetryTopic | None) -> Failure:
    from_topic = topic is not None and draw(st.booleans())
    return Failure(
        kind=draw(st.sampled_from(FailureKind)),
        poison=draw(st.booleans()),
        fatal=draw(st.integers(0, 5)) == 0,
        too_large=draw(st.integers(0, 5)) == 0,
        from_retry_topic=from_topic,
        # a retry-topic record may lack its attempt header (0 prior attempts)
        prior_attempts=draw(st.integers(0, 3)) if from_topic else 0,
    )


@given(
    data=st.data(),
    retry=policies,
    topic=topics,
    here=st.integers(1, 4),
    now=st.floats(0, 1e9),
    jitter=st.floats(0, 1),
    held_for=st.none() | st.floats(0, 120),
)
def test_the_decision_is_the_engines_old_one_plus_the_breaker_hold(
    data: st.DataObject,
    retry: RetryPolicy,
    topic: RetryTopic | None,
    here: int,
    now: float,
    jitter: float,
    held_for: float | None,
) -> None:
    failure = data.draw(failures(topic))
    attempts = here + failure.prior_attempts
    got = decide(
        failure, tp=TP, epoch=1, offset=0, attempts=attempts, retry=retry, retry_topic=topic,
        now=now, jitter=jitter, held_for=held_for,
    )
    kw = {"retry": retry, "retry_topic": topic, "now": now, "jitter": jitter}
    assert answer(got) == reference(failure, attempts=attempts, held_for=held_for, **kw)


@pytest.mark.parametrize("prior", [0, 1])
@pytest.mark.parametrize("here", [1, 2, 5])
def test_a_retry_topic_record_never_waits_in_memory_even_without_its_header(
    prior: int, here: int
) -> None:
    """Told apart by where it was read, not by its attempt header (prior 0): a backoff far
    below min_delay still hands it off (or dead-letters it once spent), as the reference says."""
    failure = Failure(kind=FailureKind.RETRYABLE, from_retry_topic=True, prior_attempts=prior)
    retry = RetryPolicy(max_retries=3, base_delay=0.1, max_delay=30.0)
    topic = RetryTopic(name=TOPIC, min_delay=1e9)
    kw = {"retry": retry, "retry_topic": topic, "now": 5.0, "jitter": 0.5}
    attempts = here + prior
    got = decide(failure, tp=TP, epoch=1, offset=0, attempts=attempts, **kw)
    assert not isinstance(got, RetryAt)
    assert answer(got) == reference(failure, attempts=attempts, held_for=None, **kw)


def test_bad_failure_values_are_refused() -> None:
    with pytest.raises(ValueError, match="retry-topic record only"):
        Failure(prior_attempts=2)
    with pytest.raises(ValueError, match=">= 0"):
        Failure(from_retry_topic=True, prior_attempts=-1)
    with pytest.raises(ValueError, match="min_delay"):
        RetryTopic(name=TOPIC, min_delay=-1.0)


@given(
    sources=st.lists(st.sampled_from("abcde"), min_size=1, max_size=5, unique=True),
    read_from=st.sampled_from(["a", "b", "c", "d", "e", "a.retry", "c.retry", "x"]),
)
def test_a_hand_off_goes_to_the_retry_topic_of_the_messages_source(
    sources: list[str], read_from: str
) -> None:
    """Several source topics, each with its own retry topic: a message read from a
    source, or from that source's retry topic, goes to that retry topic; from any
    other topic, to ``name`` (the single-topic case)."""
    topic = RetryTopic(name="fallback", min_delay=0.0,
                       per_source=tuple((t, f"{t}.retry") for t in sources))  # fmt: skip
    base = read_from.removesuffix(".retry")
    expected = f"{base}.retry" if base in sources else "fallback"
    got = decide(Failure(kind=FailureKind.RETRYABLE), tp=(read_from, 0), epoch=1, offset=0,
                 attempts=1, retry=RetryPolicy(max_retries=3), retry_topic=topic,
                 now=0.0, jitter=0.5)  # fmt: skip
    assert isinstance(got, HandOff) and got.topic == expected


def test_bad_retry_topics_are_refused() -> None:
    for pairs in ((("a", "r"), ("b", "r")), (("a", "r"), ("a", "s")), (("a", "b"), ("b", "c")),
                  (("a", ""),)):
        with pytest.raises(ValueError, match="retry topic"):
            RetryTopic(name=TOPIC, min_delay=0.0, per_source=pairs)


def test_many_source_topics_each_with_its_own_retry_topic_are_accepted() -> None:
    """300 pairs: counts past CPython's cached small ints, where ``is not`` stops
    meaning ``!=`` (a mutation survivor once compared the counts so)."""
    pairs = tuple((f"t{i}", f"t{i}.retry") for i in range(300))
    topic = RetryTopic(name=TOPIC, min_delay=0.0, per_source=pairs)
    assert [topic.for_source(s) for s, _ in pairs] == [r for _, r in pairs]


# -- the decision inside the core, against the reference consumer -----------------------------

class FailuresVersusReference(RuleBasedStateMachine):
    """One partition's messages fail, retry, go to the retry topic or the DLQ, in
    :class:`ConsumerCore` and in the reference consumer plus the reference decision."""

    @initialize(retry=policies, topic=topics, from_topic=st.booleans())
    def setup(self, retry: RetryPolicy, topic: RetryTopic | None, from_topic: bool) -> None:
        self.retry = retry
        self.topic = topic
        # the partition is the retry topic's own: its records carry prior attempts
        self.from_topic = from_topic and topic is not None
        self.core = ConsumerCore(retry, retry_topic=topic)
        self.ref = ReferenceConsumer(max_retries=retry.max_retries)
        self.epoch = self.core.assign(TP, 0)
        assert self.ref.assign(TP, 0) == self.epoch
        self.here: dict[int, int] = {}
        self.reports: dict[int, str] = {}  # offset -> the event that finishes it
        self.now = 0.0

    def in_state(self, state: str) -> list[int]:
        return sorted(o for o, s in self.ref.parts[TP].states.items() if s == state)

    def prior(self, offset: int) -> int:
        """Failures recorded on the record (a retry topic's records carry some)."""
        return offset % 4 + 1 if self.from_topic else 0

    @rule(n=st.integers(1, 3))
    def fetch(self, n: int) -> None:
        start = self.ref.parts[TP].next
        batch = list(range(start, start + n))
        assert list(self.core.fetched(TP, self.epoch, batch)) == self.ref.fetched(
            TP, self.epoch, batch
        )

    @precondition(lambda self: self.in_state("Pending") or self.in_state("Retrying"))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        o = data.draw(st.sampled_from(self.in_state("Pending") + self.in_state("Retrying")))
        if self.ref.parts[TP].states[o] == "Pending":
            ok = self.core.started(TP, self.epoch, o)
            assert ok == self.ref.event("started", TP, self.epoch, [o])
        else:
            assert self.core.retry_due(TP, self.epoch, o) == self.ref.event(
                "retry_due", TP, self.epoch, [o]
            )

    @precondition(lambda self: self.in_state("Processing"))
    @rule(data=st.data())
    def succeed(self, data: st.DataObject) -> None:
        o = data.draw(st.sampled_from(self.in_state("Processing")))
        ok = self.core.succeeded(TP, self.epoch, o)
        assert ok == self.ref.event("succeeded", TP, self.epoch, [o])

    @precondition(lambda self: self.in_state("Processing"))
    @rule(
        data=st.data(),
        kind=st.sampled_from(FailureKind),
        flags=st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 7)),
        jitter=st.floats(0, 1),
        held_for=st.none() | st.floats(0, 60),
    )
    def fail(self, data, kind, flags, jitter, held_for) -> None:
        o = data.draw(st.sampled_from(self.in_state("Processing")))
        poison, fatal, too_large = flags[0], flags[1] == 0, flags[2] == 0
        failure = Failure(
            kind=kind, poison=poison, fatal=fatal, too_large=too_large,
            from_retry_topic=self.from_topic, prior_attempts=self.prior(o),
        )
        decision = self.core.failed(TP, self.epoch, o, failure, self.now, jitter, held_for=held_for)
        assert self.ref.event("failed", TP, self.epoch, [o])
        self.here[o] = self.here.get(o, 0) + 1
        expected = reference(
            failure, attempts=self.here[o] + self.prior(o), retry=self.retry,
            retry_topic=self.topic, now=self.now, jitter=jitter, held_for=held_for,
        )
        assert decision is not None and answer(decision) == expected
        if expected[0] == "retry":
            assert self.ref.event("retry_scheduled", TP, self.epoch, [o])
        else:
            self.reports[o] = "handed_off" if expected[0] == "hand_off" else "dead_lettered"
        self.now += 1.0

    @precondition(lambda self: self.in_state("Failed"))
    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        """The runtime wrote the hand-off or the dead letter; the offset finishes."""
        o = data.draw(st.sampled_from(self.in_state("Failed")))
        event = self.reports.pop(o)
        method = self.core.handed_off if event == "handed_off" else self.core.dead_lettered
        assert method(TP, self.epoch, o) == self.ref.event(event, TP, self.epoch, [o])
        self.here.pop(o, None)

    @invariant()
    def SameObservableState(self) -> None:
        assert self.core.snapshot() == self.ref.snapshot()

    @invariant()
    def FailedOnlyWhileAReportIsDue(self) -> None:
        live = self.core.tracker(TP).in_flight()
        failed = sorted(o for o, s in live.items() if s is MessageState.FAILED)
        assert failed == sorted(self.reports)


TestFailuresVersusReference = pytest.mark.formal(FailuresVersusReference.TestCase)


# -- the import-time rules guard -----------------------------------------------


#: Facts with one more field, so that seven rules can name them all.
SevenFacts = make_dataclass(
    "SevenFacts", [*((f.name, bool) for f in fields(Facts)), ("extra", bool)], frozen=True
)


#: Each way to break the rules: (what to patch, the guard's message).
RULES_BREAKS: dict[str, tuple[dict[str, object], str]] = {
    "a fact without a rule": ({"RULES": RULES[:-1]}, "name each of the facts"),
    "a rule for no fact": ({"RULES": (*RULES, ("nothing", Later.HOLD))}, "name each of the facts"),
    "a fact named twice": (
        {"RULES": ((RULES[1][0], RULES[0][1]), *RULES[1:])}, "name each of the facts"
    ),
    "an outcome no rule reaches": (
        {"RULES": (*RULES[:-1], (RULES[-1][0], OTHERWISE))}, "reachable by exactly one rule"
    ),
    "an outcome that is no outcome": (
        {"RULES": (*RULES[:-1], (RULES[-1][0], "nowhere"))}, "reachable by exactly one rule"
    ),
    "two rules with one outcome": (
        {"Facts": SevenFacts, "RULES": (*RULES, ("extra", RULES[0][1]))}, "share an outcome"
    ),
}  # fmt: skip


@pytest.mark.parametrize("broken", sorted(RULES_BREAKS))
def test_the_rules_guard_refuses_broken_rules(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-time guard refuses each way to break :data:`RULES`, by its own
    check's message (the shipped rules pass: the module imported)."""
    patches, says = RULES_BREAKS[broken]
    for name, value in patches.items():
        monkeypatch.setattr(failures_module, name, value)
    with pytest.raises(AssertionError, match=says):
        failures_module._check_rules()


def test_the_postcondition_bounds_a_retry_between_now_and_its_cap() -> None:
    """``decide``'s postcondition on time: a retry or hand-off is due no earlier
    than now and no later than now plus the backoff cap, or plus the breaker's hold
    when that is longer; a dead letter has no due time. Exact at both edges (every
    real decision falls inside the bounds, so only decisions placed outside them
    show that a loosened check would let them through)."""
    within = failures_module._within_bounds
    retry = RetryPolicy(max_retries=3, base_delay=0.1, max_delay=0.5)
    now = 100.0

    def at(t: float) -> RetryAt:
        return RetryAt(tp=("t", 0), epoch=1, offset=7, attempt=1, at=t)

    def due(t: float) -> HandOff:
        return HandOff(tp=("t", 0), epoch=1, offset=7, topic="t.retry", attempt=1, due=t)

    for make in (at, due):
        assert within(make(now), now, retry, None)
        assert within(make(now + 0.5), now, retry, None)
        assert not within(make(now - 0.25), now, retry, None)  # in the past
        assert not within(make(now + 0.75), now, retry, None)  # past the cap
        assert not within(make(now + 0.75), now, retry, 0.0)
        assert within(make(now + 0.75), now, retry, 2.0)  # the breaker holds longer
        assert not within(make(now + 2.25), now, retry, 2.0)
    dead = DeadLetter(tp=("t", 0), epoch=1, offset=7, attempts=4, kind=DeadLetterKind.FAILED)
    assert within(dead, now, retry, None)
