"""What becomes of a failed message: one decision, as a table of rules.

Runtime API
-----------
The runtime computes the facts it alone can see and hands them over as a
:class:`Failure`; the core decides::

    core = ConsumerCore(retry_policy, retry_topic=RetryTopic(name="orders.retry", min_delay=5.0))
    failure = Failure(
        kind=classify(exc, error_kinds),           # FailureKind, never the exception
        poison=poison_detector.failed((tp, offset), clock()),
        fatal=not isinstance(exc, Exception),       # it would kill its worker
        too_large=isinstance(exc, MessageTooLarge),
        from_retry_topic=tp[0] == retry_topic_name,
        prior_attempts=prior_attempts(msg),         # the record's attempt header, else 0
    )
    decision = core.failed(tp, epoch, offset, failure, wall_now, rng.random(),
                           held_for=breaker.held_for(clock()))
    # RetryAt  -> run again at decision.at (in memory, only its key waits), then core.retry_due
    # HandOff  -> write to decision.topic with due/attempt headers, then core.handed_off
    # DeadLetter -> write to the DLQ as decision.kind.value, then core.dead_lettered
    # None     -> late (the partition moved on): do nothing

:func:`decide` is the same decision without a tracker (the tests and the
reference model call it directly); :meth:`ConsumerCore.failed
<htmqc.core.consumer.ConsumerCore.failed>` applies ``failed`` to the tracker,
counts the attempts, calls :func:`decide`, and moves the message to
``Retrying`` when the answer is :class:`~htmqc.core.decisions.RetryAt`.

Theory of operation
-------------------
A failure is reduced to yes/no *facts* (:class:`Facts`), and :data:`RULES`
lists, in priority order, which fact settles the outcome; the first fact that
holds wins, and a failure that none settles is retried in memory:

=============  =========================================================  ===================
fact           holds when                                                 outcome
=============  =========================================================  ===================
``too_large``  the value is over ``--max-message-bytes`` (never ran)      dead letter
``held``       the breaker is open (``held_for`` is not ``None``)         retry after hold
``poison``     the poison detector says so, or it killed its worker       dead letter
``permanent``  the failure is classified ``PERMANENT``                    dead letter
``spent``      attempts > ``max_retries``                                 dead letter
``to_topic``   a retry topic is configured and the message came from it,  hand off
               or its backoff is at least the topic's ``min_delay``
(none)                                                                    retry after backoff
=============  =========================================================  ===================

A dead letter's kind is named after its fact (``spent`` is ``failed``):
:class:`~htmqc.core.decisions.DeadLetterKind`.

*Attempts* count every failure of the message: this assignment's (the
tracker's count, this one included) plus ``prior_attempts`` carried by a
retry-topic record. The backoff is :meth:`RetryPolicy.delay
<htmqc.core.retry.RetryPolicy.delay>` of the attempt number, with the caller's
``jitter``. A record from the retry topic never waits in memory: it goes back
to the topic until its retries are spent.

``held`` comes second on purpose: while the breaker is open the handler is
presumed broken (a bad deploy, a dependency down), so a failure says nothing
about the message. Such a failure is not dead-lettered, poisoned or handed
off, whatever its budget says; it is retried ``held_for`` seconds later, when
the breaker lets work out again (:mod:`htmqc.core.breaker`). Attempts still
count, so a message that keeps failing once the breaker has closed is
dead-lettered at its next failure. Only ``too_large`` beats it: that failure
is the message's, not the handler's.

Times: ``now`` and the answers' ``at``/``due`` are in the caller's clock (unix
seconds when a retry topic is configured: ``due`` goes into a record header);
``held_for`` is a duration, so it needs no common clock with the breaker.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Final

import icontract

from htmqc.core.contracts import ENABLED
from htmqc.core.decisions import DeadLetter, DeadLetterKind, HandOff, RetryAt, TopicPartition
from htmqc.core.retry import FailureKind, RetryPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """What the runtime knows about one failed handler call (see module docs).

    ``kind``: the exception's classification (:func:`~htmqc.core.retry.classify`).
    ``poison``: the :class:`~htmqc.core.poison.PoisonDetector`'s verdict.
    ``fatal``: the handler raised a ``BaseException`` that is not an ``Exception``.
    ``too_large``: the value was over the size limit (the handler never ran).
    ``from_retry_topic``: the message was read from the retry topic.
    ``prior_attempts``: failures recorded on that retry-topic record (0 otherwise).
    """

    kind: FailureKind = FailureKind.UNKNOWN
    poison: bool = False
    fatal: bool = False
    too_large: bool = False
    from_retry_topic: bool = False
    prior_attempts: int = 0

    def __post_init__(self) -> None:
        if self.prior_attempts < 0:
            raise ValueError(f"prior_attempts must be >= 0, got {self.prior_attempts}")
        if self.prior_attempts and not self.from_retry_topic:
            raise ValueError("prior_attempts come from a retry-topic record only")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryTopic:
    """``--retry-topic``: the topic's name, and the shortest backoff (seconds)
    that is waited there instead of in memory (``--retry-topic-ms`` / 1000).

    ``per_source``: with several source topics, each one's own retry topic, as
    ``(source, retry)`` pairs; a message is handed off to :meth:`for_source` of
    the topic it was read from (its source's retry topic, or the retry topic
    itself when it came from one), ``name`` when neither is listed (the
    single-topic case, where ``per_source`` is empty)."""

    name: str
    min_delay: float
    per_source: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not all(s and r for s, r in self.per_source):
            raise ValueError("the retry topic needs a name")
        if self.min_delay < 0:
            raise ValueError(f"min_delay must be >= 0, got {self.min_delay}")
        sources = [s for s, _ in self.per_source]
        retries = {r for _, r in self.per_source}
        if len(set(sources)) != len(sources) or len(retries) != len(sources):
            raise ValueError("each source topic needs its own retry topic")
        if retries & set(sources):
            raise ValueError("a retry topic cannot also be a source topic")

    def for_source(self, topic: str) -> str:
        """The retry topic a message read from ``topic`` is handed off to."""
        for source, retry in self.per_source:
            if topic in (source, retry):
                return retry
        return self.name


class Later(enum.Enum):
    """Outcomes that run the message again."""

    #: In memory, once the circuit breaker lets work out again.
    HOLD = "hold"
    #: From the retry topic.
    HAND_OFF = "hand_off"
    #: In memory, after the backoff.
    RETRY = "retry"


Outcome = DeadLetterKind | Later


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """The yes/no facts :data:`RULES` look at."""

    too_large: bool
    held: bool
    poison: bool
    permanent: bool
    spent: bool
    to_topic: bool


#: ``(fact, outcome)`` in priority order: the first fact that holds decides; a
#: failure that none settles is retried (:attr:`Later.RETRY`).
RULES: Final[tuple[tuple[str, Outcome], ...]] = (
    ("too_large", DeadLetterKind.TOO_LARGE),
    ("held", Later.HOLD),
    ("poison", DeadLetterKind.POISON),
    ("permanent", DeadLetterKind.PERMANENT),
    ("spent", DeadLetterKind.FAILED),
    ("to_topic", Later.HAND_OFF),
)
OTHERWISE: Final[Outcome] = Later.RETRY


def _check_rules() -> None:
    names = sorted(f.name for f in fields(Facts))
    if sorted(name for name, _ in RULES) != names:
        raise AssertionError(f"RULES must name each of the facts {names} once")
    outcomes = [outcome for _, outcome in RULES] + [OTHERWISE]
    if set(outcomes) != set(DeadLetterKind) | set(Later):
        raise AssertionError("every outcome must be reachable by exactly one rule")
    if len(outcomes) != len(set(outcomes)):
        raise AssertionError("two rules share an outcome")


_check_rules()


def outcome(facts: Facts) -> Outcome:
    """The outcome of the first rule whose fact holds (:data:`RULES`)."""
    for name, result in RULES:
        if getattr(facts, name):
            return result
    return OTHERWISE


def facts(
    failure: Failure,
    *,
    attempts: int,
    delay: float,
    retry: RetryPolicy,
    retry_topic: RetryTopic | None,
    held: bool,
) -> Facts:
    """The facts of ``failure`` after ``attempts`` failures, with backoff ``delay``."""
    return Facts(
        too_large=failure.too_large,
        held=held,
        poison=failure.poison or failure.fatal,
        permanent=failure.kind is FailureKind.PERMANENT,
        spent=attempts > retry.max_retries,
        to_topic=retry_topic is not None
        and (failure.from_retry_topic or delay >= retry_topic.min_delay),
    )


def _within_bounds(
    result: RetryAt | HandOff | DeadLetter, now: float, retry: RetryPolicy, held_for: float | None
) -> bool:
    if isinstance(result, DeadLetter):
        return True
    at = result.at if isinstance(result, RetryAt) else result.due
    return now <= at <= now + max(retry.max_delay, held_for or 0.0)


@icontract.require(lambda attempts: attempts >= 1, enabled=ENABLED)
@icontract.require(lambda failure, attempts: failure.prior_attempts < attempts, enabled=ENABLED)
@icontract.require(lambda jitter: 0.0 <= jitter <= 1.0, enabled=ENABLED)
@icontract.require(lambda now: math.isfinite(now), "the clock reads a finite time", enabled=ENABLED)
@icontract.require(lambda held_for: held_for is None or held_for >= 0.0, enabled=ENABLED)
@icontract.require(
    lambda failure, retry_topic: retry_topic is not None or not failure.from_retry_topic,
    "a retry-topic record needs the retry topic configured",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda result, tp, epoch, offset, attempts: (result.tp, result.epoch, result.offset)
    == (tp, epoch, offset)
    and (result.attempt if isinstance(result, (RetryAt, HandOff)) else result.attempts)
    == attempts,
    "the decision is about this message and counts its attempts",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda result, now, retry, held_for: _within_bounds(result, now, retry, held_for),
    "a retry or hand-off is due within the backoff cap (or the breaker's hold)",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda failure, held_for, result: held_for is None
    or failure.too_large
    or isinstance(result, RetryAt),
    "nothing but a too-large message leaves memory while the breaker holds",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda failure, held_for, result: held_for is not None
    or not failure.from_retry_topic
    or not isinstance(result, RetryAt),
    "a retry-topic record never waits in memory",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda tp, retry_topic, result: not isinstance(result, HandOff)
    or (retry_topic is not None and result.topic == retry_topic.for_source(tp[0])),
    "a hand-off goes to the retry topic of the message's source topic",
    enabled=ENABLED,
)
def decide(
    failure: Failure,
    *,
    tp: TopicPartition,
    epoch: int,
    offset: int,
    attempts: int,
    retry: RetryPolicy,
    retry_topic: RetryTopic | None,
    now: float,
    jitter: float,
    held_for: float | None = None,
) -> RetryAt | HandOff | DeadLetter:
    """What becomes of ``offset`` after its ``attempts``-th failure (module docs).

    ``held_for``: ``None`` while the circuit breaker is closed, else the seconds
    until it lets work out again. ``jitter`` in ``[0, 1]`` is the caller's draw.
    """
    delay = retry.delay(attempts, jitter)
    held = held_for is not None
    result = outcome(
        facts(
            failure,
            attempts=attempts,
            delay=delay,
            retry=retry,
            retry_topic=retry_topic,
            held=held,
        )
    )
    if isinstance(result, DeadLetterKind):
        return DeadLetter(tp=tp, epoch=epoch, offset=offset, attempts=attempts, kind=result)
    if result is Later.HAND_OFF:
        assert retry_topic is not None  # the to_topic fact says so
        return HandOff(
            tp=tp,
            epoch=epoch,
            offset=offset,
            topic=retry_topic.for_source(tp[0]),
            attempt=attempts,
            due=now + delay,
        )
    wait = held_for if result is Later.HOLD and held_for is not None else delay
    return RetryAt(tp=tp, epoch=epoch, offset=offset, attempt=attempts, at=now + wait)
