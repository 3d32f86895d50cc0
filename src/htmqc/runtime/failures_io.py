"""A handler raised: hand the facts to the core, carry out its decision.

Theory of operation
-------------------
The decision is the core's (:mod:`htmqc.core.failures`: a table of facts to
RetryAt / HandOff / DeadLetter(kind)); this module only gathers the facts it
alone can see (the exception's class and classification, the poison
detector's verdict, a too-large value, a record that does not decode
(:class:`~htmqc.runtime.decode.DecodeError`: permanent whatever the user's
classification, and like a too-large value not a breaker failure, since the
handler never ran), a retry-topic record's prior attempts,
how long the circuit breaker holds work) and does the I/O the answer asks
for, on the poll thread: :class:`Failures` keeps the retry timers on the
injected clock (only the failed key is held back, in its lane), and sends
dead letters and retry-topic records to the worker of the message's key,
which writes them (and, exactly-once, inside the transaction, in order) and
reports ``dead`` / ``moved``; only then does the core hear ``dead_lettered``
/ ``handed_off``.

The circuit breaker (:class:`~htmqc.core.breaker.Breaker`) hears every
handler outcome here but a retry's failure while it is closed (the message was
known to fail: its first failure was the evidence; a probe's failure always
counts); while it is not closed a failure is held (retried when
it lets work out again), never dead-lettered, and the intake hands out no
work (:mod:`~htmqc.runtime.intake`).
"""

from __future__ import annotations

import heapq
import logging
import random
import traceback
from typing import TYPE_CHECKING, Any

from htmqc.core import Breaker, DeadLetter, Failure, HandOff, RetryAt, classify
from htmqc.core.breaker import BreakerEvent
from htmqc.core.decisions import TopicPartition
from htmqc.core.gate import Hold
from htmqc.core.poison import PoisonDetector
from htmqc.core.retry import FailureKind, Permanent
from htmqc.dlq.record import DeadLetterInfo
from htmqc.logs import describe, error_text
from htmqc.runtime.decode import DecodeError
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


def error_class(exc: BaseException) -> str:
    """``module.QualName`` of ``exc``'s type (dead letters, the breaker)."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class Failures:
    """Failure handling on the poll thread (module docs)."""

    def __init__(self, engine: Engine, seed: int | None, breaker: Breaker) -> None:
        self.engine = engine
        self.breaker = breaker
        self.rng = random.Random(seed)
        self.poison = PoisonDetector(engine.options.poison_threshold, engine.options.poison_window)
        #: Retry timers: (due on the loop's clock, sequence, lease, message).
        self.timers: list[tuple[float, int, Lease, Any]] = []
        self._first: dict[tuple[TopicPartition, int], float] = {}
        self._seq = 0

    def failed(self, lease: Lease, msg: Any, exc: BaseException) -> None:
        """A worker's ``fail`` report: the facts to the core, then its answer."""
        e = self.engine
        tp, epoch, offset = lease.tp, lease.epoch, msg.offset()
        if e.core.epoch(tp) != epoch:
            return  # late: the partition moved on
        wall = e.clock.wall()
        now = e.clock.monotonic()
        again = (tp, offset) in self._first
        first = self._first.setdefault((tp, offset), wall)
        too_large = isinstance(exc, MessageTooLarge)
        # A record that does not decode is dead-lettered at once, whatever the
        # user's classification says, and the handler never ran on it.
        undecodable = isinstance(exc, DecodeError)
        from_retry_topic = tp[0] in e.retry_sources
        failure = Failure(
            kind=FailureKind.PERMANENT if undecodable else classify(exc, e.error_kinds),
            poison=self.poison.failed((tp, offset), now),
            fatal=not isinstance(exc, Exception),
            too_large=too_large,
            from_retry_topic=from_retry_topic,
            prior_attempts=prior_attempts(msg) if from_retry_topic else 0,
        )
        again = again or failure.prior_attempts > 0
        # The handler never ran on a too-large or undecodable record. A message
        # failing again was known to fail: only its first failure is evidence
        # about the handler (scattered bad records retried one after another
        # would trip the breaker, and then fail every probe). A probe's failure
        # always counts.
        if not (too_large or undecodable) and (not again or not self.breaker.closed):
            self.breaker_event(self.breaker.failed(tp, offset, error_class(exc), now))
        decision = e.core.failed(
            tp, epoch, offset, failure, wall, self.rng.random(),
            held_for=self.breaker.held_for(now),
        )
        if decision is None:
            return
        e.stats.failed(tp)
        attempt = decision.attempts if isinstance(decision, DeadLetter) else decision.attempt
        error = describe(exc)
        log.warning(
            "handler failed on %s/%d@%d (attempt %d): %s",
            tp[0],
            tp[1],
            offset,
            attempt,
            error,
            extra={"topic": tp[0], "partition": tp[1], "offset": offset,
                   "error": error, "attempt": attempt},
        )
        if isinstance(decision, RetryAt):
            if e.metrics is not None:
                e.metrics.retried()
            self._seq += 1
            due = now + max(0.0, decision.at - wall)
            heapq.heappush(self.timers, (due, self._seq, lease, msg))
            return
        if isinstance(decision, HandOff):
            headers = retry_headers(
                msg,
                attempt=decision.attempt,
                due_ms=int(decision.due * 1000),
                first_failure_ms=int(first * 1000),
            )
            e.workers.forward(lease, msg, decision.topic, headers)
            return
        assert isinstance(decision, DeadLetter)
        info = DeadLetterInfo(
            kind=decision.kind.value,
            error_class=error_class(exc),
            error_message=str(exc),
            stack="".join(traceback.format_exception(exc))[-8000:],
            retries=decision.attempts - 1,
            first_failure_at=first,
            last_failure_at=wall,
            group=e.options.group,
        )
        # Dead letters of the retry topic's records go to the main topic's DLQ.
        e.workers.dead_letter(lease, msg, info, e.source_of(lease.tp[0]))

    def breaker_event(self, event: BreakerEvent | None) -> None:
        """Report a change of the breaker's state (log line, metric) and hold or
        release fetching with it."""
        if event is None:
            return
        b = self.breaker
        e = self.engine
        if b.closed:
            log.warning("circuit breaker closed: the probe succeeded; work flows again")
        elif b.fetch_paused:
            log.warning(
                "circuit breaker open (%s, %s): no new work for %.2f s, then one probe",
                b.reason, b.error_class, b.held_for(e.clock.monotonic()) or 0.0,
            )
        if e.metrics is not None:
            e.metrics.breaker(event.value)
        e.ownership.set_hold(Hold.BREAKER, b.fetch_paused)

    def _left(self, lease: Lease, msg: Any, *, handed_off: bool = False) -> bool:
        """``msg`` left its partition without an effect (dead-lettered, or handed
        off to the retry topic): tell the core (True if it was still current)."""
        e = self.engine
        self.forget(lease.tp, msg.offset())
        report = e.core.handed_off if handed_off else e.core.dead_lettered
        if not report(lease.tp, lease.epoch, msg.offset()):
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
        destination = e.workers.dead_letter_destination(e.source_of(tp[0]), info)
        error = error_text(info.error_class, info.error_message)
        log.warning(
            "dead-lettered %s/%d@%d to %s (%s): %s",
            tp[0],
            tp[1],
            offset,
            destination,
            info.kind,
            error,
            extra={"topic": tp[0], "partition": tp[1], "offset": offset,
                   "error": error, "attempt": info.retries + 1,
                   "destination": destination},
        )

    def moved(self, lease: Lease, msg: Any) -> None:
        """A worker's ``moved`` report: the message is on the retry topic; for its
        partition it is finished."""
        e = self.engine
        if self._left(lease, msg, handed_off=True):
            e.stats.retries_forwarded += 1
            if e.metrics is not None:
                e.metrics.retried()

    def fire(self, now: float) -> None:
        """Run again the failed messages whose backoff passed, as many as the
        breaker allows (while it is open they wait; half-open one is the probe)."""
        timers = self.timers
        e = self.engine
        breaker = self.breaker
        while timers and timers[0][0] <= now:
            allowance = breaker.allowance()
            if allowance == 0:
                return
            _, _, lease, msg = heapq.heappop(timers)
            if lease.live and e.core.retry_due(lease.tp, lease.epoch, msg.offset()):
                if allowance is not None:
                    self.breaker_event(breaker.probe_started(lease.tp, msg.offset(), now))
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
