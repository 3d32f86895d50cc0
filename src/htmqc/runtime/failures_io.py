"""A handler raised: decide what happens, then carry it out.

Theory of operation
-------------------
:func:`decide` is the *decision*: from the exception, the poison detector's
verdict and the attempts so far, the kind the core is told
(:class:`~htmqc.core.FailureKind`), the dead-letter kind if the message ends
in the DLQ, and whether it leaves for the retry topic. It is pure and is the
one place that chooses; it is kept small so that swapping it for
``htmqc.core.failures`` (a table answering RetryAt / HandOff / DeadLetter) is a
local change. Everything else in this module is I/O on the poll thread:
:class:`Failures` asks the core (``core.failed``), keeps the retry timers on
the injected clock (only the failed key is held back, in its lane), and sends
dead letters and retry-topic records to the worker of the message's key, which
writes them (and, exactly-once, inside the transaction, in order) and reports
``dead`` / ``moved``; only then does the core hear ``dead_lettered``.

A message that failed ``poison_threshold`` times within ``poison_window``
seconds, or raised a ``BaseException`` that is not an ``Exception`` (it would
kill its worker), is poison: dead-lettered to ``<topic>.dlq.poison`` at once.
"""

from __future__ import annotations

import heapq
import logging
import random
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from htmqc.core import DeadLetter, FailureKind, RetryAt, classify
from htmqc.core.decisions import TopicPartition
from htmqc.core.poison import PoisonDetector
from htmqc.core.retry import Permanent, RetryPolicy
from htmqc.dlq.record import DeadLetterInfo
from htmqc.runtime.lanes import Lease
from htmqc.runtime.retry_topic import prior_attempts, retry_headers

if TYPE_CHECKING:
    from htmqc.runtime.loop import Engine

log = logging.getLogger("htmqc.runtime")


class MessageTooLarge(Permanent):
    """A message's value is larger than ``--max-message-bytes``."""


def check_size(limit: int) -> Any:
    """A check that raises :class:`MessageTooLarge` for values above ``limit``."""

    def check(msg: Any) -> None:
        value = msg.value()
        if value is not None and len(value) > limit:
            raise MessageTooLarge(
                f"message of {len(value)} bytes is larger than --max-message-bytes {limit}"
            )

    return check


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`decide` chose for one failure.

    ``core_kind``: what ``core.failed`` hears. ``dlq_kind``: the dead-letter
    kind, should the core answer :class:`~htmqc.core.DeadLetter`.
    ``hand_off_at``: unix seconds when the message is due again, if it moves to
    the retry topic (then the core is told PERMANENT: it leaves the partition).
    """

    core_kind: FailureKind
    dlq_kind: str
    hand_off_at: float | None


# -- DECISION: to be replaced by htmqc.core.failures ------------------------------------


def decide(
    exc: BaseException,
    *,
    poison: bool,
    kinds: dict[type[BaseException], FailureKind],
    attempts: int,
    prior: int,
    policy: RetryPolicy,
    retry_topic_seconds: float | None,
    jitter: float,
    wall: float,
) -> Plan:
    """The failure decision (module docs). ``attempts``: failures of this message
    including this one (and ``prior`` ones recorded on a retry-topic record);
    ``retry_topic_seconds``: the shortest backoff that leaves for the retry topic,
    ``None`` without ``--retry-topic``."""
    too_large = isinstance(exc, MessageTooLarge)
    poison = poison or not isinstance(exc, Exception)
    kind = FailureKind.PERMANENT if poison or too_large else classify(exc, kinds)
    hand_off: float | None = None
    over_budget = False
    if retry_topic_seconds is not None and kind is not FailureKind.PERMANENT:
        if attempts > policy.max_retries:
            over_budget = prior > 0
        else:
            delay = policy.delay(attempts, jitter)
            if prior or delay >= retry_topic_seconds:
                hand_off = wall + delay
    if too_large:
        dlq_kind = "too_large"
    elif poison:
        dlq_kind = "poison"
    else:
        dlq_kind = "permanent" if kind is FailureKind.PERMANENT else "failed"
    core_kind = FailureKind.PERMANENT if hand_off is not None or over_budget else kind
    return Plan(core_kind, dlq_kind, hand_off)


# -- I/O ----------------------------------------------------------------------------------


class Failures:
    """Failure handling on the poll thread (module docs)."""

    def __init__(self, engine: Engine, seed: int | None) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.poison = PoisonDetector(engine.options.poison_threshold, engine.options.poison_window)
        #: Retry timers: (due on the loop's clock, sequence, lease, message).
        self.timers: list[tuple[float, int, Lease, Any]] = []
        self._first: dict[tuple[TopicPartition, int], float] = {}
        self._seq = 0

    def failed(self, lease: Lease, msg: Any, exc: BaseException) -> None:
        """A worker's ``fail`` report: ask the core, then act on its answer."""
        e = self.engine
        tp, epoch, offset = lease.tp, lease.epoch, msg.offset()
        if e.core.epoch(tp) != epoch:
            return  # late: the partition moved on
        wall = e.clock.wall()
        first = self._first.setdefault((tp, offset), wall)
        poison = self.poison.failed((tp, offset), e.clock.monotonic())
        jitter = self.rng.random()
        prior = prior_attempts(msg) if tp[0] == e.retry_topic else 0
        attempts = e.core.tracker(tp).failures(offset) + 1 + prior
        o = e.options
        plan = decide(
            exc,
            poison=poison,
            kinds=e.error_kinds,
            attempts=attempts,
            prior=prior,
            policy=e.retry_policy,
            retry_topic_seconds=o.retry_topic_ms / 1000.0 if e.retry_topic else None,
            jitter=jitter,
            wall=wall,
        )
        decision = e.core.failed(tp, epoch, offset, plan.core_kind, wall, jitter)
        if decision is None:
            return
        e.stats.failed(tp)
        log.warning(
            "handler failed on %s/%d@%d: %s",
            tp[0],
            tp[1],
            offset,
            type(exc).__name__,
            extra={"topic": tp[0], "partition": tp[1], "offset": offset},
        )
        if isinstance(decision, RetryAt):
            if e.metrics is not None:
                e.metrics.retried()
            self._seq += 1
            due = e.clock.monotonic() + max(0.0, decision.at - wall)
            heapq.heappush(self.timers, (due, self._seq, lease, msg))
            return
        assert isinstance(decision, DeadLetter)
        if plan.hand_off_at is not None and e.retry_topic is not None:
            headers = retry_headers(
                msg,
                attempt=attempts,
                due_ms=int(plan.hand_off_at * 1000),
                first_failure_ms=int(first * 1000),
            )
            e.workers.forward(lease, msg, e.retry_topic, headers)
            return
        info = DeadLetterInfo(
            kind=plan.dlq_kind,
            error_class=f"{type(exc).__module__}.{type(exc).__qualname__}",
            error_message=str(exc),
            stack="".join(traceback.format_exception(exc))[-8000:],
            retries=attempts - 1,
            first_failure_at=first,
            last_failure_at=wall,
            group=o.group,
        )
        # Dead letters of the retry topic's records go to the main topic's DLQ.
        e.workers.dead_letter(lease, msg, info, o.topic)

    def _left(self, lease: Lease, msg: Any) -> bool:
        """``msg`` left its partition without an effect: tell the core (True if
        it was still current)."""
        e = self.engine
        self.forget(lease.tp, msg.offset())
        if not e.core.dead_lettered(lease.tp, lease.epoch, msg.offset()):
            return False
        e.finish(lease, 1, len(msg))
        e.stats.left(len(msg))
        return True

    def dead(self, lease: Lease, msg: Any, info: DeadLetterInfo) -> None:
        """A worker's ``dead`` report: the dead letter is written."""
        e = self.engine
        tp, offset = lease.tp, msg.offset()
        if self._left(lease, msg):
            e.stats.dead_lettered(tp, info.kind)
        log.warning(
            "dead-lettered %s/%d@%d to %s: %s",
            tp[0],
            tp[1],
            offset,
            info.target(e.options.topic),
            info.kind,
            extra={"topic": tp[0], "partition": tp[1], "offset": offset},
        )

    def moved(self, lease: Lease, msg: Any) -> None:
        """A worker's ``moved`` report: the message is on the retry topic; for its
        partition it is finished."""
        e = self.engine
        if self._left(lease, msg):
            e.stats.retries_forwarded += 1
            if e.metrics is not None:
                e.metrics.retried()

    def fire(self, now: float) -> None:
        """Run again the failed messages whose backoff passed."""
        timers = self.timers
        e = self.engine
        while timers and timers[0][0] <= now:
            _, _, lease, msg = heapq.heappop(timers)
            if lease.live and e.core.retry_due(lease.tp, lease.epoch, msg.offset()):
                e.workers.retry(lease, msg)

    def forget(self, tp: TopicPartition, offset: int) -> None:
        """``offset`` finished: drop its failure history."""
        if self._first.pop((tp, offset), None) is not None:
            self.poison.forget((tp, offset))

    def drop(self, tp: TopicPartition) -> None:
        """``tp`` went away: its timers and failure histories too."""
        self.timers = [t for t in self.timers if t[2].tp != tp]
        heapq.heapify(self.timers)
        for key in [k for k in self._first if k[0] == tp]:
            self.forget(*key)
