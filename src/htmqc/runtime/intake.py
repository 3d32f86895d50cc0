"""Intake: a consumed batch becomes work for the workers.

Errors are dropped (a fatal one stops the run); the rest is grouped by
partition; each partition's run goes through the gate (is it ours, fetchable,
not draining), the retry topic's due time, the core (``fetched`` leaves out
offsets the sink already holds, ``started_many``), and is handed to the workers
in one command per partition and lane: the hand-off costs per batch, not per
message.

Commit-metadata budget: where the offsets finished out of order travel in Kafka's
offset-commit metadata (the exactly-once Kafka sink; at-least-once), a batch is
cut to the leading offsets the core's :func:`~htmqc.core.metadata_budget.admissible`
allows; the partition is rewound to the first offset left out and paused (the
gate's Waiting state, as for a retry-topic record). :meth:`Intake.release`, each
turn, resumes it once its live work drained enough (or after
:data:`THROTTLE_RECHECK_SECONDS`, a safety net); no busy loop, and nothing is
fetched for it meanwhile. Exactly-once into a database has no such limit.

Offsets between the core's ``next`` and a batch's first record are a gap (the
broker skipped them), but only if the batch was read from where the partition
now stands: records of a consume call that returned before the partition's latest
seek (a claim after a rollback moves it back) are taken only from ``next`` on;
otherwise they are set aside and the partition is sought to ``next`` again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from itertools import groupby, repeat
from operator import is_, methodcaller
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message

from htmqc.core.decisions import TopicPartition
from htmqc.core.gate import GateState
from htmqc.core.metadata_budget import admissible
from htmqc.errors import RuntimeFailure
from htmqc.runtime.options import EXACTLY_ONCE, KAFKA, RunOptions
from htmqc.runtime.retry_topic import retry_after_ms

if TYPE_CHECKING:
    from htmqc.runtime.loop import Engine
    from htmqc.runtime.workers import Run

log = logging.getLogger("htmqc.runtime")

#: How intake reads a message's error, partition and offset: a consume batch is all
#: ``confluent_kafka.Message`` (whose unbound methods ``map`` calls straight from C);
#: anything else (test fakes, whose batches may mix types) is asked by name.
READERS: dict[type, tuple[Callable[[Any], Any], ...]] = {
    Message: (Message.error, Message.partition, Message.offset)
}
ANY_READERS: tuple[Callable[[Any], Any], ...] = (
    methodcaller("error"),
    methodcaller("partition"),
    methodcaller("offset"),
)


#: Seconds a throttled partition waits at most before it is fetched again (it is
#: normally resumed earlier, by :meth:`Intake.release`, when its live work drains).
THROTTLE_RECHECK_SECONDS = 1.0
#: A throttled partition resumes once this many more offsets would be admitted
#: (or nothing is live): resuming for one offset at a time would refetch per offset.
RELEASE_AT = 64


def metadata_budget(engine: Engine) -> tuple[int, int | None] | None:
    """``(limit, soft)`` for :func:`~htmqc.core.metadata_budget.admissible`, or
    ``None`` when commits carry no Kafka metadata (exactly-once into a database).
    Exactly-once Kafka->Kafka: the worst case must fit (too long is fatal there);
    at-least-once: only once the text passes half the limit (too long a commit is
    refused, and the delivery truncates it, :func:`~htmqc.core.metadata_budget.fitting_prefix`)."""
    options = engine.options
    limit = options.commit_metadata_bytes
    if options.source != KAFKA:
        return None  # NATS keeps its positions in a KV bucket: no metadata limit
    if options.mode == EXACTLY_ONCE:
        sink = engine.sink
        if sink is None or not sink.writes_kafka:
            return None
        # the sink's own guard (KafkaSink.metadata_max_bytes) must never trip
        cap = sink.metadata_max_bytes
        return (limit if cap is None else min(limit, cap)), None
    return limit, limit // 2


class Intake:
    """Turns consumed batches into worker commands (see module docs)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._log_error = ErrorLog(time.monotonic)
        #: Clock reading of the last error saying the broker is unreachable.
        self.broker_error_at = 0.0
        self.budget = metadata_budget(engine)
        #: Partitions held back by the metadata budget, and the tracker's
        #: ``(processed, live_count)`` when last looked at.
        self.throttled: dict[TopicPartition, tuple[int, int]] = {}
        #: Partitions whose first throttle was logged (at info; later ones at debug).
        self._told: set[TopicPartition] = set()

    def _error(self, err: Any) -> None:
        """A consumer error that is not fatal: rate-limited to the log; a broker
        that is unreachable is remembered until the next message arrives, or
        until no such error came for :data:`BROKER_QUIET_SECONDS`. librdkafka
        hands these to ``error_cb`` (:meth:`Engine.on_consumer_error`), not
        ``consume``, and repeats them at every failed reconnect."""
        e = self.engine
        if err.code() in BROKER_DOWN:
            self.broker_error_at = e.clock.monotonic()
            if e.broker_down is None:
                e.broker_down = self.broker_error_at
        self._log_error(err)

    def error(self, err: Any) -> None:
        """A consumer error from librdkafka's ``error_cb`` (inside ``consume``).
        Only "all brokers are down" says the broker is gone: a lone transport
        error (one broker of several, an idle connection closed) does not, but
        while it is gone each failed reconnect says it again."""
        e = self.engine
        if err.code() == KafkaError._TRANSPORT and e.broker_down is None:
            self._log_error(err)
            return
        self._error(err)

    def dispatch(self, msgs: list[Any], number: int) -> None:
        """Hand a consumed batch to the core and the workers; ``number``: the
        consume call that returned it (:attr:`Engine.consumes`)."""
        e = self.engine
        n = len(msgs)
        e.stats.received += n
        if not n:
            if (
                e.broker_down is not None
                and e.clock.monotonic() - self.broker_error_at > BROKER_QUIET_SECONDS
            ):
                e.broker_down = None  # reconnected: librdkafka stopped failing
            return
        now = e.clock.monotonic()
        e.last_message = now
        if e.stats.first_message_at is None:
            e.stats.first_message_at = now
        error, partition, offset = READERS.get(type(msgs[0]), ANY_READERS)
        # Identity, not ==: a KafkaError compared with None raises (confluent-kafka 2.16).
        if not all(map(is_, map(error, msgs), repeat(None))):
            msgs = drop_errors(msgs, e.options, self._error)
            if not msgs:
                return
        e.broker_down = None
        core = e.core
        gate = e.ownership
        breaker = e.breaker
        allowance = breaker.allowance()
        budget = self.budget
        runs: list[Run] = []
        for tp, batch in self.by_partition(msgs, partition):
            lease = gate.lease(tp)
            if lease is None or not gate.fetchable(tp) or core.tracker(tp).draining:
                continue
            if tp[0] in e.retry_sources:
                batch = self.due_prefix(tp, batch)
                if not batch:
                    continue
            offsets = list(map(offset, batch))
            first = core.tracker(tp).next
            if offsets[0] < first:
                # Buffered before a seek: already covered by this assignment.
                batch = [m for m in batch if m.offset() >= first]
                offsets = [m.offset() for m in batch]
                if not batch:
                    continue
            if offsets[0] != first and gate.read_before_seek(tp, number):
                # Read from the old position: the offsets up to it are no gap (a
                # rollback re-reads them). Fetch again from next.
                gate.seek(tp, first)
                continue
            if allowance is not None:
                # The breaker is not closed: hand out nothing (or its one probe);
                # the rest is fetched again once it lets work out.
                if allowance == 0:
                    gate.seek(tp, offsets[0])
                    continue
                if len(batch) > 1:
                    gate.seek(tp, offsets[1])
                    batch, offsets = batch[:1], offsets[:1]
            if budget is not None:
                tracker = core.tracker(tp)
                k = admissible(tracker, offsets, *budget)
                if k < len(offsets):
                    self.throttle(tp, offsets[k], now, tracker.processed, tracker.live_count)
                    if not k:
                        continue
                    batch, offsets = batch[:k], offsets[:k]
            run = core.fetched(tp, lease.epoch, offsets)
            if len(run) != len(batch):
                if e.metrics is not None:
                    e.metrics.duplicates_suppressed(len(batch) - len(run))
                wanted = set(run)
                batch = [m for m in batch if m.offset() in wanted]
            if not run:
                continue
            core.started_many(tp, lease.epoch, run)
            if allowance is not None:
                e.failures.breaker_event(breaker.probe_started(tp, run[0], now))
                allowance = 0
            nbytes = sum(map(len, batch))
            lease.count += len(run)
            lease.nbytes += nbytes
            e.stats.started(len(run), nbytes)
            runs.append((lease, batch, (list(run), nbytes)))
        if runs:
            e.workers.submit_many(runs)

    def throttle(
        self, tp: TopicPartition, offset: int, now: float, processed: int, live: int
    ) -> None:
        """Hold ``tp`` back from ``offset`` on: rewind to it and pause (module docs)."""
        e = self.engine
        e.ownership.wait_until(tp, offset, now + THROTTLE_RECHECK_SECONDS)
        if tp not in self.throttled:
            told = tp in self._told
            self._told.add(tp)
            (log.debug if told else log.info)(
                "%s/%d held back at offset %d: the offsets finished out of order could "
                "outgrow the commit metadata (%d bytes); it goes on as its %d running "
                "messages finish", tp[0], tp[1], offset, e.options.commit_metadata_bytes, live,
            )  # fmt: skip
        self.throttled[tp] = (processed, live)
        e.stats.throttled += 1
        if e.metrics is not None:
            e.metrics.metadata_throttled()

    def release(self, now: float) -> None:
        """Each turn: resume the held-back partitions whose live work drained enough
        (looked at only when their watermark or live count moved)."""
        e = self.engine
        budget = self.budget
        gate = e.ownership.gate
        for tp, seen in list(self.throttled.items()):
            if budget is None or gate.state(tp) is not GateState.WAITING:
                del self.throttled[tp]  # resumed by its timer, or gone
                continue
            tracker = e.core.tracker(tp)
            mark = (tracker.processed, tracker.live_count)
            if mark == seen:
                continue
            self.throttled[tp] = mark
            nxt = tracker.next
            if (
                tracker.live_count == 0
                or admissible(tracker, range(nxt, nxt + RELEASE_AT), *budget) == RELEASE_AT
            ):
                del self.throttled[tp]
                e.ownership.wait_until(tp, nxt, now)  # due now: this turn's tick resumes it

    def by_partition(
        self, msgs: list[Any], partition: Callable[[Any], Any]
    ) -> Iterable[tuple[TopicPartition, list[Any]]]:
        """``msgs`` grouped by partition, in order within each.

        librdkafka hands a fetch response out partition by partition, so a batch is
        a few long runs: with one topic subscribed (no retry topic) they are found by
        :func:`itertools.groupby` in C (one call per message, no tuple, no dict
        step); with a retry topic or several topics, each message is looked at in
        Python."""
        if not msgs:
            return ()
        e = self.engine
        topic = e.subscription.single
        if not e.retry_sources and topic is not None:
            runs = [(p, list(run)) for p, run in groupby(msgs, partition)]
            if len(runs) == len({p for p, _ in runs}):
                return [((topic, p), run) for p, run in runs]
            by_tp: dict[TopicPartition, list[Any]] = {}
            for p, run in runs:
                by_tp.setdefault((topic, p), []).extend(run)
            return by_tp.items()
        by_tp = {}
        for msg in msgs:
            by_tp.setdefault((msg.topic(), msg.partition()), []).append(msg)
        return by_tp.items()

    def due_prefix(self, tp: TopicPartition, batch: list[Any]) -> list[Any]:
        """The retry-topic records of ``batch`` whose time has come, up to the first
        that has not: from that one on, the partition is rewound and waits
        (paused) until it is due (the gate's Waiting state)."""
        e = self.engine
        now_ms = e.clock.wall() * 1000.0
        for i, msg in enumerate(batch):
            due_ms = retry_after_ms(msg)
            if due_ms > now_ms:
                # The gate times in the loop's clock; the header is unix time.
                until = e.clock.monotonic() + (due_ms - now_ms) / 1000.0
                e.ownership.wait_until(tp, msg.offset(), until)
                return batch[:i]
        return batch


#: librdkafka's text for Kafka's UNRELEASED_INSTANCE_ID (KIP-848): a live member holds
#: the group.instance.id this consumer joined with.
_INSTANCE_ID_IN_USE = "instance ID is still used by another member"


def consumer_failure(text: str, options: RunOptions) -> RuntimeFailure:
    """The one-line failure for a fatal consumer error ``text``."""
    if _INSTANCE_ID_IN_USE in text and options.member_id:
        return RuntimeFailure(
            f"--member-id {options.member_id!r} is held by a live member of group "
            f"{options.group!r}; under --group-protocol consumer the new member is fenced",
            "give each live member its own --member-id; after a crash, start again once "
            "the broker's group.consumer.session.timeout.ms (45 s by default) has passed",
        )
    return RuntimeFailure(f"Kafka consumer failed: {text}", "restart htmqc run")


def drop_errors(
    msgs: list[Any], options: RunOptions, on_error: Callable[[Any], None] | None = None
) -> list[Any]:
    """The messages of ``msgs`` that are not errors; a fatal error stops the run,
    any other goes to ``on_error`` (default: logged).

    librdkafka hands a fatal error to ``consume`` as a ``_FATAL`` event whose
    ``fatal()`` is false (the flag is on the original error), so the code counts.
    """
    out = []
    for msg in msgs:
        err = msg.error()
        if err is None:
            out.append(msg)
        elif err.fatal() or err.code() == KafkaError._FATAL:
            raise consumer_failure(err.str(), options)
        elif on_error is not None:
            on_error(err)
        else:
            log.warning("consumer error: %s", err.str())
    return out


#: Error codes that say the broker cannot be reached (``/readyz``, the state page).
BROKER_DOWN = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
#: The broker counts as reachable again once no error said otherwise for this
#: long: more than librdkafka's longest reconnect backoff (``reconnect.backoff.max.ms``,
#: 10 s), between whose failures a broker still down is said again.
BROKER_QUIET_SECONDS = 15.0
#: Seconds between two log lines for the same consumer error code.
ERROR_LOG_EVERY = 30.0


class ErrorLog:
    """Consumer errors, rate-limited: the first of a code is logged, the same
    code again only after :data:`ERROR_LOG_EVERY` seconds, with how many were
    left out. A broker that is down makes librdkafka repeat itself many times a
    second; the log should say it once, and the state should show it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[int, float] = {}
        self._quiet: dict[int, int] = {}

    def __call__(self, err: Any) -> None:
        code, now = err.code(), self._clock()
        last = self._last.get(code)
        if last is not None and now - last < ERROR_LOG_EVERY:
            self._quiet[code] = self._quiet.get(code, 0) + 1
            return
        self._last[code] = now
        quiet = self._quiet.pop(code, 0)
        more = f" ({quiet} more like it in {now - last:.0f} s)" if quiet and last else ""
        log.warning("consumer error: %s%s", err.str(), more)
