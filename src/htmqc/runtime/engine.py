"""The poll loop: drives the core with a real (or fake) Kafka consumer.

Theory of operation
-------------------
One thread, the *poll thread*, owns the :class:`~htmqc.core.ConsumerCore`:
every core call happens here, so the core stays single-threaded. Each turn of
the loop:

1. ``consume(batch_size, timeout)``; rebalance and commit callbacks run inside
   it, on this thread;
2. every message batch of a partition goes through ``core.fetched`` (which
   leaves out offsets the sink already holds), ``core.started_many``, and to a
   lane (:mod:`htmqc.runtime.lanes`): queued to worker threads when
   ``workers > 1`` (at-least-once), else put on the *backlog*, which the poll
   thread runs in time slices of at most ``_SLICE`` seconds between polls (so
   ``max.poll.interval.ms`` is never exceeded because of a slow handler; only
   one handler call longer than the interval could), committing a full
   exactly-once transaction in the middle of a batch when it is due; in
   exactly-once mode each piece runs first in one sink scope and, only if a
   message in it fails, again one isolated message at a time (:meth:`Engine._run_eo`);
3. worker reports are drained and turned into ``succeeded_many`` / ``failed``;
   ``RetryAt`` decisions go on a timer heap (only that key is held back),
   ``DeadLetter`` decisions are written by the delivery, then ``dead_lettered``;
   a message that failed ``poison_threshold`` times within ``poison_window``
   seconds, or raised a ``BaseException`` that is not an ``Exception`` (it
   would kill its worker), is poison: dead-lettered to ``<topic>.dlq.poison``
   at once (:class:`~htmqc.core.poison.PoisonDetector`);
4. offsets the broker skipped (transaction markers, aborted records) are
   reported as gaps from ``consumer.position`` when the partition is idle;
5. the delivery commits what the core asks for (``commits``) and reports
   ``commit_acked`` / ``commit_failed``;
6. flow control (:class:`~htmqc.core.flow.FlowWindow`): once a second the
   window sees the interval's completions, failures and mean handler time
   (AIMD with ``--flow adaptive``); when in-flight messages reach the window or
   in-flight value bytes reach ``max_in_flight_bytes``, all partitions are
   paused (polling goes on, so the group stays healthy) and resumed below the
   window's resume marks. ``consume`` never asks for more messages than the
   window has room for, so in-flight messages never exceed the window (bytes
   may overshoot by one consume batch: sizes are known only once fetched).

Observability reads, never steers: the core is mutated only under
:attr:`Engine.lock`, which the HTTP server's threads take to read it
(:meth:`Engine.state_source`); the poll loop releases it while it waits in
``consume``, and rebalance callbacks take it themselves. Metric events are
pushed once per lane report (a batch), not per message.

The runtime holds no offset logic: positions on assignment come from Kafka's
committed offsets (at-least-once) or ``sink.claim`` (exactly-once) and go to
``core.assign``; every commit is one the core asked for. Revoke: ``revoking``,
wait (bounded) for the partition's running work, commit the watermark,
``revoked``. Lost: ``revoked`` without a Kafka commit (exactly-once still tries
the fenced sink commit, which the sink rejects if the partition moved).
A stale fence (:class:`~htmqc.sinks.Fenced`) rolls back the whole transaction:
the core forgets every partition; the ones still ours are claimed again and
re-read from the stored position; the stale ones are paused until the group
takes them away.
"""

from __future__ import annotations

import heapq
import logging
import random
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from itertools import groupby, repeat
from operator import is_, methodcaller
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message

from htmqc.core import ConsumerCore, DeadLetter, FailureKind, RetryAt, classify
from htmqc.core.decisions import TopicPartition
from htmqc.core.flow import FlowPolicy, FlowWindow
from htmqc.core.poison import PoisonDetector
from htmqc.core.retry import Permanent, RetryPolicy
from htmqc.dlq.record import DeadLetterInfo
from htmqc.errors import RuntimeFailure
from htmqc.kafka_defaults import consumer_config
from htmqc.observe.tracing import batch_spans, commit_spans
from htmqc.runtime.delivery import AtLeastOnce, ExactlyOnce
from htmqc.runtime.lanes import Done, Lane, LanePool
from htmqc.runtime.options import EXACTLY_ONCE, RunOptions
from htmqc.runtime.retry_topic import prior_attempts, retry_after_ms, retry_headers, retry_topic
from htmqc.runtime.trace import TracingCore
from htmqc.sinks import Fenced, Sink
from htmqc.sinks.encoding import decode_metadata

if TYPE_CHECKING:
    from htmqc.observe.metrics import Metrics
    from htmqc.observe.state import CoreStateSource

log = logging.getLogger("htmqc.runtime")

_POSITION_EVERY = 0.2
_JOIN_GRACE = 30.0
#: Longest stretch of inline handler work between two polls, seconds.
_SLICE = 0.25
#: Inline messages run between two looks at the clock and the transaction.
_CHUNK = 250
#: How often the flow window sees an interval's figures, seconds.
_FLOW_INTERVAL = 1.0
#: How dispatch reads a message's error, partition and offset: a consume batch is all
#: ``confluent_kafka.Message`` (whose unbound methods ``map`` calls straight from C);
#: anything else (test fakes, whose batches may mix types) is asked by name.
_READERS = {Message: (Message.error, Message.partition, Message.offset)}
_ANY_READERS = (methodcaller("error"), methodcaller("partition"), methodcaller("offset"))


class MessageTooLarge(Permanent):
    """A message's value is larger than ``--max-message-bytes``."""


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


class TransactionLost(BaseException):
    """The sink transaction was rolled back under a running batch (fatal)."""


class _Work:
    """A fetched batch of one partition waiting on the backlog: its messages, their
    offsets and value sizes (read once, at dispatch), and how far it has run."""

    __slots__ = ("epoch", "msgs", "offsets", "pos", "sizes", "tp")

    def __init__(
        self, tp: TopicPartition, epoch: int, msgs: list[Any], offsets: list[int], sizes: list[int]
    ) -> None:
        self.tp = tp
        self.epoch = epoch
        self.msgs = msgs
        self.offsets = offsets
        self.sizes = sizes
        self.pos = 0


class Engine:
    """One consumer-group member running ``handler`` (see module docs).

    ``consumer``: a ``confluent_kafka.Consumer`` (or a fake with the same
    methods), not yet subscribed. ``sink``: the opened exactly-once sink, or
    ``None`` for at-least-once. ``producer_factory`` makes the dead-letter
    producer (at-least-once). ``metrics``: where events are counted (optional).
    ``error_kinds``: the user's exception types and how to treat them
    (:func:`~htmqc.core.classify`).
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        options: RunOptions,
        consumer: Any,
        *,
        sink: Sink | None = None,
        producer_factory: Callable[[], Any] | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        metrics: Metrics | None = None,
        error_kinds: Mapping[type[BaseException], FailureKind] | None = None,
    ) -> None:
        self.options = options
        self.error_kinds = dict(error_kinds or {})
        self.consumer = consumer
        if retry is None:
            retry = RetryPolicy(
                max_retries=options.max_retries,
                base_delay=options.backoff_ms / 1000.0,
                max_delay=options.backoff_max_ms / 1000.0,
            )
        self.retry_policy = retry
        self.retry_topic = retry_topic(options.topic) if options.retry_topic else None
        #: Retry-topic partitions paused until a record's due time (unix seconds).
        self._waiting: dict[TopicPartition, float] = {}
        #: Messages moved to the retry topic (tests).
        self.retries_forwarded = 0
        self.core = (
            TracingCore(open(options.trace, "a", encoding="utf-8"), retry)  # noqa: SIM115
            if options.trace
            else ConsumerCore(retry)
        )
        self.clock = clock
        self.rng = random.Random(seed)
        self.metrics = metrics
        self.lock = threading.RLock()
        self.exactly_once = options.mode == EXACTLY_ONCE
        self._handler: Callable[..., Any] | None = handler if self.exactly_once else None
        self.sink = sink
        self.eo: ExactlyOnce | None = None
        self.alo: AtLeastOnce | None = None
        if self.exactly_once:
            if sink is None:
                raise ValueError("exactly-once needs a sink")
            self.eo = ExactlyOnce(sink, options.txn_messages, options.txn_ms)
            if isinstance(self.core, TracingCore):
                self.core.fences = self.eo.fences  # the trace records fence tokens
            call = self._eo_call(handler)
        else:
            self.alo = AtLeastOnce(consumer, producer_factory or _no_producer)
            call = self._alo_call(handler)
        timed = metrics is not None
        span = batch_spans() if options.otel else None
        self._commit_span = commit_spans(options.mode) if options.otel else None
        threaded = not self.exactly_once and options.workers > 1
        self.pool: LanePool | None = (
            LanePool(options.workers, call, timed=timed, sized=True, span=span)
            if threaded
            else None
        )
        self.lane = Lane(call, timed=timed, sized=True, span=span)
        #: Inline work not run yet (no pool).
        self.backlog: deque[_Work] = deque()
        low = min(options.min_in_flight, options.max_in_flight)
        adaptive = options.flow == "adaptive"
        self.window = FlowWindow(
            FlowPolicy(
                min_window=low if adaptive else options.max_in_flight,
                initial_window=options.max_in_flight,
                max_window=options.max_in_flight,
                increase=max(1, options.max_in_flight // 100),
                latency_target=options.latency_target_ms / 1000.0,
                max_in_flight=options.max_in_flight,
                max_in_flight_bytes=options.max_in_flight_bytes,
            )
        )
        self.adaptive = adaptive
        #: Seconds a fenced partition stays paused before it is claimed again if the
        #: group still assigns it to us: the session timeout (by then the group
        #: has evicted a real zombie).
        session_ms = consumer_config(
            options.bootstrap,
            options.group,
            dict(options.kafka_config),
            group_protocol=options.group_protocol,
        )  # under group.protocol=consumer the broker's session timeout: 45 s by default
        self._fence_grace = float(session_ms.get("session.timeout.ms", 45_000)) / 1000
        self.poison = PoisonDetector(options.poison_threshold, options.poison_window)
        self.assigned: set[TopicPartition] = set()
        self.fenced: set[TopicPartition] = set()
        #: When each fenced partition was fenced (``clock()``), for :meth:`_reclaim_fenced`.
        self._fenced_at: dict[TopicPartition, float] = {}
        self.paused = False
        self.in_flight = 0
        self.in_flight_bytes = 0
        #: Highest in-flight message count and bytes seen (tests, benchmarks).
        self.peak_in_flight = 0
        self.peak_in_flight_bytes = 0
        self.finished = 0
        self.received = 0
        #: Rebalance callbacks that gave this member partitions (tests: no rebalance storm).
        self.assignments = 0
        self.dlq_counts: dict[str, int] = {}
        self.stopping = threading.Event()
        self._timers: list[tuple[float, int, TopicPartition, int, Any]] = []
        self._failures: dict[tuple[TopicPartition, int], float] = {}
        #: Timed reports not yet in the histograms (:meth:`_flush_metrics`).
        self._timed: list[Done] = []
        self._bytes: dict[tuple[TopicPartition, int], int] = {}
        self._seq = 0
        self._last_commit = clock()
        self._last_position = clock()
        self._last_message = clock()
        self._last_flow = clock()
        self._iv_done = 0
        self._iv_errors = 0
        self._iv_elapsed = 0.0
        self._ever_assigned = False
        #: clock() when the first message arrived, and when the loop stopped (benchmarks).
        self.first_message_at: float | None = None
        self.stopped_at: float | None = None

    # -- handler wrappers ---------------------------------------------------------------

    def _alo_call(self, handler: Callable[..., Any]) -> Callable[[Any], Any]:
        limit = self.options.max_message_bytes
        if limit is None:
            return handler

        def call(msg: Any) -> Any:
            _check_size(msg, limit)
            return handler(msg)

        return call

    def _eo_call(self, handler: Callable[..., Any]) -> Callable[[Any], Any]:
        eo = self.eo
        assert eo is not None
        limit = self.options.max_message_bytes

        def call(msg: Any) -> None:
            if limit is not None:
                _check_size(msg, limit)
            txn = eo.current()
            try:
                with txn.message():
                    handler(msg, txn.handle)
            except Exception:
                if getattr(txn, "_done", False):
                    # The sink could not undo just this message and rolled the whole
                    # transaction back: the effects of messages the core counts as
                    # succeeded are gone, so this process must not commit again.
                    raise TransactionLost() from None
                raise
            eo.count += 1

        return call

    def on_commit(self, err: Any, partitions: list[Any]) -> None:
        """confluent-kafka's ``on_commit`` (set it in the consumer config); runs
        inside ``consume`` on the poll thread and is queued for the core."""
        if self.alo is not None:
            self.alo.on_commit(err, partitions)

    # -- observability ------------------------------------------------------------------

    def state_source(self) -> CoreStateSource:
        """A :class:`~htmqc.observe.state.CoreStateSource` reading this engine under
        :attr:`lock` (for ``/state.json``, ``/metrics`` and the Redis mirror)."""
        from htmqc.observe.state import CoreStateSource

        return CoreStateSource(
            self.core,
            lock=self.lock,
            flow=self.window,
            paused=self._paused_partitions,
            dlq_counts=lambda: dict(self.dlq_counts),
            high_watermarks=self._high_watermarks,
            extra=lambda: {
                "mode": self.options.mode,
                "group": self.options.group,
                "in_flight_bytes": self.in_flight_bytes,
                "peak_in_flight": self.peak_in_flight,
                "peak_in_flight_bytes": self.peak_in_flight_bytes,
                "assignments": self.assignments,
                "finished": self.finished,
                "retries_waiting": len(self._timers),
            },
        )

    def _paused_partitions(self) -> set[TopicPartition]:
        return set(self.assigned) if self.paused else set(self.fenced)

    def _high_watermarks(self) -> Mapping[TopicPartition, int]:
        """Broker high watermarks from librdkafka's cache (no broker round trip)."""
        from confluent_kafka import TopicPartition as KafkaTP

        out: dict[TopicPartition, int] = {}
        for tp in list(self.assigned):
            try:
                _low, high = self.consumer.get_watermark_offsets(
                    KafkaTP(tp[0], tp[1]), cached=True
                )
            except Exception:
                continue
            if high is not None and high >= 0:
                out[tp] = int(high)
        return out

    # -- reports from lanes (always on the poll thread) ---------------------------------

    def succeeded(self, tp: TopicPartition, epoch: int, done: Done) -> None:
        """Lane report: ``done.offsets`` ran successfully."""
        offsets = done.offsets
        if len(offsets) == 1 and self._failures:
            self._forget_failure(tp, offsets[0])
        if not self.core.succeeded_many(tp, epoch, offsets):
            return
        n = len(offsets)
        self.in_flight -= n
        self.in_flight_bytes -= done.nbytes
        self.finished += n
        self._iv_done += n
        self._iv_elapsed += done.elapsed
        if self.metrics is not None:
            self.metrics.processed(tp[0], tp[1], "succeeded", n)
            if done.ticks:
                self._timed.append(done)

    def _flush_metrics(self) -> None:
        """Put the latencies of the timed reports into the histograms, all at once
        (a histogram update has a fixed cost, so it is paid per turn, not per run)."""
        timed, self._timed = self._timed, []
        m = self.metrics
        if m is None or not timed:
            return
        stamps: list[float] = []
        histogram = m.processing_latency
        for done in timed:
            if done.ticks:
                histogram.observe_ticks(done.ticks)
            if done.stamps_ms:
                stamps += done.stamps_ms
        if stamps:
            m.observe_end_to_end(time.time(), stamps)

    def _forget_failure(self, tp: TopicPartition, offset: int) -> None:
        if self._failures.pop((tp, offset), None) is not None:
            self.poison.forget((tp, offset))

    def failed(self, tp: TopicPartition, epoch: int, msg: Any, exc: BaseException) -> None:
        """Lane report: ``msg`` raised ``exc``; ask the core what to do."""
        if isinstance(exc, TransactionLost):
            raise RuntimeFailure(
                "the sink rolled back the open transaction after a failed message",
                "restart htmqc run: it resumes from the stored positions",
            )
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        offset = msg.offset()
        if self.core.epoch(tp) != epoch:
            return  # late: the partition moved on
        wall = time.time()
        first = self._failures.setdefault((tp, offset), wall)
        poison = self.poison.failed((tp, offset), self.clock()) or not isinstance(exc, Exception)
        too_large = isinstance(exc, MessageTooLarge)
        kind = (
            FailureKind.PERMANENT
            if poison or too_large or not isinstance(exc, Exception)
            else classify(exc, self.error_kinds)
        )
        jitter = self.rng.random()
        # The retry topic (module htmqc.runtime.retry_topic): decide before the core
        # does, and if the message leaves, tell the core it failed for good here.
        prior = prior_attempts(msg) if tp[0] == self.retry_topic else 0
        attempts = self.core.tracker(tp).failures(offset) + 1 + prior
        hand_off: float | None = None
        over_budget = False
        if self.retry_topic is not None and kind is not FailureKind.PERMANENT:
            if attempts > self.retry_policy.max_retries:
                over_budget = prior > 0
            else:
                delay = self.retry_policy.delay(attempts, jitter)
                if prior or delay >= self.options.retry_topic_ms / 1000.0:
                    hand_off = wall + delay
        core_kind = FailureKind.PERMANENT if hand_off is not None or over_budget else kind
        decision = self.core.failed(tp, epoch, offset, core_kind, wall, jitter)
        if decision is None:
            return
        self._iv_errors += 1
        self._iv_done += 1
        if self.metrics is not None:
            self.metrics.processed(tp[0], tp[1], "failed")
        log.warning(
            "handler failed on %s/%d@%d: %s",
            tp[0],
            tp[1],
            offset,
            type(exc).__name__,
            extra={"topic": tp[0], "partition": tp[1], "offset": offset},
        )
        if isinstance(decision, RetryAt):
            if self.metrics is not None:
                self.metrics.retried()
            self._seq += 1
            delay = max(0.0, decision.at - wall)
            heapq.heappush(self._timers, (self.clock() + delay, self._seq, tp, epoch, msg))
            return
        if hand_off is not None:
            self._to_retry_topic(decision, msg, attempts, hand_off, first)
            return
        if too_large:
            dlq_kind = "too_large"
        elif poison:
            dlq_kind = "poison"
        else:
            dlq_kind = "permanent" if kind is FailureKind.PERMANENT else "failed"
        info = DeadLetterInfo(
            kind=dlq_kind,
            error_class=f"{type(exc).__module__}.{type(exc).__qualname__}",
            error_message=str(exc),
            stack="".join(traceback.format_exception(exc))[-8000:],
            retries=attempts - 1,
            first_failure_at=first,
            last_failure_at=wall,
            group=self.options.group,
        )
        self._dead_letter(decision, msg, info)

    def _to_retry_topic(
        self, decision: DeadLetter, msg: Any, attempts: int, due: float, first: float
    ) -> None:
        """Move ``msg`` to the retry topic; for its partition it is finished."""
        assert self.retry_topic is not None
        headers = retry_headers(
            msg, attempt=attempts, due_ms=int(due * 1000), first_failure_ms=int(first * 1000)
        )
        self._forward(self.retry_topic, msg, headers)
        tp, epoch = decision.tp, decision.epoch
        self._forget_failure(tp, msg.offset())
        if self.core.dead_lettered(tp, epoch, msg.offset()):
            self.in_flight -= 1
            self.in_flight_bytes -= len(msg)
            self.finished += 1
            self.retries_forwarded += 1
            if self.metrics is not None:
                self.metrics.retried()
        self._release(tp, msg.key())

    def _forward(self, topic: str, msg: Any, headers: list[tuple[str, bytes]]) -> None:
        """Write ``msg`` (value, key, ``headers``) to ``topic``: in the open sink
        transaction (exactly-once Kafka->Kafka), else with a producer, waiting for
        the broker's ack (so the offset is never finished before its copy exists).

        :raises RuntimeFailure: the broker did not take it.
        """
        if self.eo is not None:
            txn = self.eo.current()
            with txn.message():
                txn.handle.send(topic, msg.value(), key=msg.key(), headers=headers)
            return
        assert self.alo is not None
        self.alo.send(topic, msg.value(), msg.key(), headers)

    def _release(self, tp: TopicPartition, key: Any) -> None:
        """Let the messages parked behind ``key``'s finished message run."""
        if self.pool is not None:
            self.pool.release(tp, key)
        else:
            self.lane.release(tp, key, self)

    def _dead_letter(self, decision: DeadLetter, msg: Any, info: DeadLetterInfo) -> None:
        tp, epoch = decision.tp, decision.epoch
        # Dead letters of the retry topic's records go to the main topic's DLQ.
        if self.eo is not None:
            self.eo.dead_letter(self.options.topic, msg, info)
        else:
            assert self.alo is not None
            self.alo.dead_letter(self.options.topic, msg, info)
        self._forget_failure(tp, msg.offset())
        if self.core.dead_lettered(tp, epoch, msg.offset()):
            self.in_flight -= 1
            self.in_flight_bytes -= len(msg)
            self.finished += 1
            self.dlq_counts[info.kind] = self.dlq_counts.get(info.kind, 0) + 1
            if self.metrics is not None:
                self.metrics.processed(tp[0], tp[1], "dead_lettered")
                self.metrics.dead_lettered(info.kind)
        log.warning(
            "dead-lettered %s/%d@%d to %s: %s",
            tp[0],
            tp[1],
            msg.offset(),
            info.target(self.options.topic),
            info.kind,
            extra={"topic": tp[0], "partition": tp[1], "offset": msg.offset()},
        )
        self._release(tp, msg.key())

    def _drain_completions(self) -> None:
        if self.pool is None:
            return
        q = self.pool.completions
        while not q.empty():
            report = q.get_nowait()
            if report[0] == "ok":
                self.succeeded(report[1], report[2], report[3])
            else:
                self.failed(report[1], report[2], report[3], report[4])

    def _fire_timers(self) -> None:
        timers = self._timers
        now = self.clock()
        while timers and timers[0][0] <= now:
            _, _, tp, epoch, msg = heapq.heappop(timers)
            if not self.core.retry_due(tp, epoch, msg.offset()):
                continue
            if self.pool is not None:
                self.pool.retry(tp, epoch, msg)
            else:
                self.lane.retry(tp, epoch, msg, self)

    # -- dispatch -----------------------------------------------------------------------

    def dispatch(self, msgs: list[Any]) -> None:
        """Hand a consumed batch to the core and the lanes (or the backlog)."""
        n = len(msgs)
        self.received += n
        if not n:
            return
        self._last_message = self.clock()
        if self.first_message_at is None:
            self.first_message_at = self._last_message
        error, partition, offset = _READERS.get(type(msgs[0]), _ANY_READERS)
        # Identity, not ==: a KafkaError compared with None raises (confluent-kafka 2.16).
        if not all(map(is_, map(error, msgs), repeat(None))):
            msgs = self._drop_errors(msgs)
        core = self.core
        for tp, batch in self._by_partition(msgs, partition):
            epoch = core.epoch(tp)
            if epoch is None or tp in self.fenced or core.tracker(tp).draining:
                continue
            if tp[0] == self.retry_topic:
                batch = self._due_prefix(tp, batch)
                if not batch:
                    continue
            offsets = list(map(offset, batch))
            if offsets[0] < core.tracker(tp).next:
                # Buffered before a seek: already covered by this assignment.
                keep = core.tracker(tp).next
                batch = [m for m in batch if m.offset() >= keep]
                offsets = [m.offset() for m in batch]
                if not batch:
                    continue
            run = core.fetched(tp, epoch, offsets)
            if len(run) != len(batch):
                if self.metrics is not None:
                    self.metrics.duplicates_suppressed(len(batch) - len(run))
                wanted = set(run)
                batch = [m for m in batch if m.offset() in wanted]
            if not run:
                continue
            core.started_many(tp, epoch, run)
            self.in_flight += len(run)
            sizes = list(map(len, batch))
            self.in_flight_bytes += sum(sizes)
            if self.pool is not None:
                self.pool.submit(tp, epoch, batch)
            else:
                self.backlog.append(_Work(tp, epoch, batch, list(run), sizes))
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        if self.in_flight_bytes > self.peak_in_flight_bytes:
            self.peak_in_flight_bytes = self.in_flight_bytes

    def _drop_errors(self, msgs: list[Any]) -> list[Any]:
        """The messages of ``msgs`` that are not errors; a fatal error stops the run.

        librdkafka hands a fatal error to ``consume`` as a ``_FATAL`` event whose
        ``fatal()`` is false (the flag is on the original error), so the code counts.
        """
        out = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                out.append(msg)
            elif err.fatal() or err.code() == KafkaError._FATAL:
                raise consumer_failure(err.str(), self.options)
            else:
                log.warning("consumer error: %s", err.str())
        return out

    def _by_partition(
        self, msgs: list[Any], partition: Callable[[Any], Any]
    ) -> Iterable[tuple[TopicPartition, list[Any]]]:
        """``msgs`` grouped by partition, in order within each.

        librdkafka hands a fetch response out partition by partition, so a batch is
        a few long runs: with one topic subscribed they are found by
        :func:`itertools.groupby` in C (one call per message, no tuple, no dict
        step); with the retry topic too, each message is looked at in Python."""
        if not msgs:
            return ()
        if self.retry_topic is None:
            topic = self.options.topic
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

    def _due_prefix(self, tp: TopicPartition, batch: list[Any]) -> list[Any]:
        """The retry-topic records of ``batch`` whose time has come, up to the first
        that has not: from that one on, the partition is rewound and paused until
        it is due (:meth:`_wake_retries`)."""
        from confluent_kafka import TopicPartition as KafkaTP

        now_ms = time.time() * 1000.0
        for i, msg in enumerate(batch):
            due_ms = retry_after_ms(msg)
            if due_ms > now_ms:
                kafka_tp = KafkaTP(tp[0], tp[1], msg.offset())
                self.consumer.pause([kafka_tp])
                self.consumer.seek(kafka_tp)
                self._waiting[tp] = due_ms / 1000.0
                return batch[:i]
        return batch

    def _wake_retries(self) -> None:
        """Resume retry-topic partitions whose next record is due (unless flow
        control holds everything paused; it resumes them itself)."""
        from confluent_kafka import TopicPartition as KafkaTP

        now = time.time()
        due = [tp for tp, at in self._waiting.items() if at <= now]
        for tp in due:
            del self._waiting[tp]
        parts = [KafkaTP(t, p) for t, p in due if (t, p) in self.assigned]
        if parts and not self.paused:
            self.consumer.resume(parts)

    def run_backlog(self, budget: float = _SLICE) -> None:
        """Run inline work for at most about ``budget`` seconds (see module docs).

        In exactly-once mode a transaction that becomes full or old is committed
        between chunks, so one transaction never holds more than ``txn_messages``."""
        backlog = self.backlog
        if not backlog:
            return
        lane = self.lane
        eo = self.eo
        deadline = time.monotonic() + budget
        while backlog:
            work = backlog[0]
            tp, epoch, batch, pos = work.tp, work.epoch, work.msgs, work.pos
            if self.core.epoch(tp) != epoch:
                backlog.popleft()  # revoked or fenced meanwhile: not ours to run
                continue
            end = min(len(batch), pos + _CHUNK)
            if eo is not None:
                end = min(end, pos + max(1, self.options.txn_messages - eo.count))
            whole = not pos and end >= len(batch)
            piece = batch if whole else batch[pos:end]
            if eo is not None:
                self._run_eo(tp, epoch, piece)
            else:
                offsets = work.offsets if whole else work.offsets[pos:end]
                sizes = work.sizes if whole else work.sizes[pos:end]
                lane.run(tp, epoch, piece, self, known=(offsets, sum(sizes)))
            if end >= len(batch):
                backlog.popleft()
            else:
                work.pos = end
            if eo is not None and eo.due(self.clock()):
                self._finish_txn()
            if time.monotonic() >= deadline:
                return

    def _run_eo(self, tp: TopicPartition, epoch: int, piece: list[Any]) -> None:
        """Exactly-once: try the whole piece in one sink scope (one savepoint, not one
        per message: most of the cost of a small handler); if anything in it fails,
        the scope is undone and the piece runs again one isolated message at a time,
        so a failure costs a re-run of its piece and nothing else changes."""
        eo = self.eo
        assert eo is not None and self._handler is not None
        txn = eo.current()
        if not self.lane.holds(tp):
            handler, handle, limit = self._handler, txn.handle, self.options.max_message_bytes

            def call(msg: Any) -> None:
                if limit is not None:
                    _check_size(msg, limit)
                handler(msg, handle)

            try:
                with txn.message():
                    done = self.lane.run_atomic(tp, epoch, piece, call)
            except Exception:
                if getattr(txn, "_done", False):
                    raise TransactionLost() from None
            else:
                eo.count += len(done.offsets)
                self.succeeded(tp, epoch, done)
                return
        self.lane.run(tp, epoch, piece, self)

    def _report_gaps(self) -> None:
        """Offsets the broker skipped (markers, aborted records) are gaps."""
        from confluent_kafka import TopicPartition as KafkaTP

        held = [(tp, epoch, t) for tp, epoch, t in self.core.partitions() if not t.draining]
        if not held:
            return
        try:
            positions = self.consumer.position([KafkaTP(tp[0], tp[1]) for tp, _, _ in held])
        except Exception:
            return
        for (tp, epoch, tracker), pos in zip(held, positions, strict=True):
            if pos.offset is not None and pos.offset > tracker.next:
                self.core.fetched(tp, epoch, [], end=pos.offset)

    # -- commits ------------------------------------------------------------------------

    def commit(self, *, force: bool = False, sync: bool = False) -> None:
        """Commit what the core asks for, if due (or ``force``)."""
        now = self.clock()
        if self.eo is not None:
            if force or self.eo.due(now):
                self._finish_txn()
            return
        assert self.alo is not None
        self.alo.drain_acks(self.core)
        if force or now - self._last_commit >= self.options.commit_ms / 1000.0:
            self._last_commit = now
            commits = self.core.commits()
            if self._commit_span is None or not commits:
                self.alo.commit(self.core, commits, sync=sync)
            else:
                with self._commit_span(len(commits)):
                    self.alo.commit(self.core, commits, sync=sync)

    def _finish_txn(self) -> None:
        assert self.eo is not None
        started = time.perf_counter()
        try:
            if self._commit_span is None:
                self.eo.finish(self.core)
            else:
                with self._commit_span(len(self.eo.fences)):
                    self.eo.finish(self.core)
        except Fenced as exc:
            self._fenced(exc)
            return
        if self.metrics is not None:
            self.metrics.observe_commit_latencies([time.perf_counter() - started])

    def _fenced(self, exc: Fenced) -> None:
        """The transaction was rolled back: every partition restarts from the sink."""
        from confluent_kafka import TopicPartition as KafkaTP

        stale = set(exc.tps) if exc.tps else set(self.assigned)
        log.warning("fenced: %s", exc.line())
        held = [tp for tp, _, _ in self.core.partitions()]
        for tp in held:
            self.core.revoked(tp)
            self._drop_lanes(tp)
        self._recount()
        stale &= self.assigned
        self.fenced |= stale
        now = self.clock()
        for tp in stale:
            self._fenced_at[tp] = now
        if stale:
            self.consumer.pause([KafkaTP(t, p) for t, p in stale])
        again = [tp for tp in held if tp in self.assigned and tp not in self.fenced]
        if again:
            for tp, committed in self._claim(again).items():
                self.consumer.seek(KafkaTP(tp[0], tp[1], committed))

    def _reclaim_fenced(self) -> None:
        """Claim again the fenced partitions the group still gives us after a
        session timeout. Normally the group takes a stale partition away within
        that time (we were a zombie); if it did not, another process claimed it
        in a race and was itself a zombie, or the group still trusts us: either
        way claiming is safe (the fence rejects whoever is stale) and pausing for
        ever would stall the partition."""
        from confluent_kafka import TopicPartition as KafkaTP

        now = self.clock()
        due = [tp for tp, at in self._fenced_at.items() if now - at >= self._fence_grace]
        if not due:
            return
        for tp in due:
            del self._fenced_at[tp]
            self.fenced.discard(tp)
        mine = [tp for tp in due if tp in self.assigned and self.core.epoch(tp) is None]
        if not mine:
            return
        if self.eo is not None:
            self._finish_txn()  # claim is not allowed with a transaction open
        log.warning("claiming again, still assigned after being fenced: %s",
                    ", ".join(f"{t}/{p}" for t, p in mine))
        for tp, committed in self._claim(mine).items():
            self.consumer.seek(KafkaTP(tp[0], tp[1], committed))
        if not self.paused:
            self.consumer.resume([KafkaTP(t, p) for t, p in mine])

    def _drop_lanes(self, tp: TopicPartition) -> None:
        if self.pool is not None:
            self.pool.drop(tp)
        else:
            self.lane.drop(tp)
            self.backlog = deque(work for work in self.backlog if work.tp != tp)
        self._timers = [t for t in self._timers if t[2] != tp]
        heapq.heapify(self._timers)
        for key in [k for k in self._failures if k[0] == tp]:
            self._forget_failure(*key)

    def _recount(self) -> None:
        """In-flight figures from the core after partitions went away (bytes are
        recounted from the work still queued inline; with a pool, dropped work's
        bytes are let go with it)."""
        self.in_flight = sum(len(t.in_flight()) for _, _, t in self.core.partitions())
        if self.in_flight == 0:
            self.in_flight_bytes = 0
        elif self.pool is None:
            self.in_flight_bytes = sum(sum(work.sizes[work.pos :]) for work in self.backlog)

    # -- assignment ---------------------------------------------------------------------

    def _low(self, tp: TopicPartition) -> int:
        from confluent_kafka import TopicPartition as KafkaTP

        low, _high = self.consumer.get_watermark_offsets(KafkaTP(tp[0], tp[1]), timeout=10)
        return max(0, int(low))

    def _claim(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Positions for ``tps``, assigned in the core; returns ``tp -> committed``."""
        from confluent_kafka import TopicPartition as KafkaTP

        out: dict[TopicPartition, int] = {}
        if self.eo is not None:
            assert self.sink is not None
            positions = self.sink.claim(tps, default_start=self._low)
            for tp in tps:
                pos = positions[tp]
                self.eo.fences[tp] = pos.fence
                self.core.assign(tp, pos.committed, pos.finished_above)
                out[tp] = pos.committed
            return out
        committed = self.consumer.committed([KafkaTP(t, p) for t, p in tps], timeout=30)
        for part in committed:
            tp = (part.topic, part.partition)
            if part.offset is not None and part.offset >= 0:
                start = part.offset
                above = decode_metadata(start, part.metadata)
            else:
                start, above = self._low(tp), ()
            self.core.assign(tp, start, above)
            out[tp] = start
        return out

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback: take new partitions at their durable positions."""
        from confluent_kafka import TopicPartition as KafkaTP

        tps = [(p.topic, p.partition) for p in partitions]
        if not tps:
            consumer.incremental_assign([])
            return
        with self.lock:
            if self.metrics is not None:
                self.metrics.rebalanced()
            if self.eo is not None:
                self._finish_txn()  # claim is not allowed with a transaction open
            for tp in tps:
                self.fenced.discard(tp)
                self._fenced_at.pop(tp, None)
                if self.core.epoch(tp) is not None:
                    self.core.revoked(tp)
                    self._drop_lanes(tp)
            starts = self._claim(tps)
            self.assignments += 1
            self.assigned.update(tps)
            self._ever_assigned = True
            self._last_message = self.clock()
        log.info("assigned %s", ", ".join(f"{t}/{p}@{starts[(t, p)]}" for t, p in tps))
        consumer.incremental_assign([KafkaTP(t, p, starts[(t, p)]) for t, p in tps])
        if self.paused:
            consumer.pause([KafkaTP(t, p) for t, p in tps])
        else:
            # librdkafka keeps a partition's pause across unassign and assign: one
            # paused when it was fenced (or waiting for a retry) would stay paused.
            consumer.resume([KafkaTP(t, p) for t, p in tps])

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback: finish (bounded), commit the watermark, let go."""
        self._let_go(consumer, partitions, lost=False)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback: the partitions are already someone else's."""
        self._let_go(consumer, partitions, lost=True)

    def _let_go(self, consumer: Any, partitions: list[Any], *, lost: bool) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        with self.lock:
            if self.metrics is not None and tps:
                self.metrics.rebalanced()
            core = self.core
            for tp in tps:
                core.revoking(tp)
            if not lost:
                self._wait_for_lanes(self.options.shutdown_seconds)
            if self.eo is not None:
                # The sink's fence check makes this safe even for lost partitions.
                self._finish_txn()
                for tp in tps:
                    core.revoked(tp)
            else:
                assert self.alo is not None
                self.alo.drain_acks(core)
                final = [c for c in (core.revoked(tp) for tp in tps) if c is not None]
                if final and not lost:
                    self.alo.commit(core, final, sync=True)
            for tp in tps:
                self._drop_lanes(tp)
                self.assigned.discard(tp)
                self.fenced.discard(tp)
                self._fenced_at.pop(tp, None)
                self._waiting.pop(tp, None)
            self._recount()
        log.info("%s %s", "lost" if lost else "revoked", ", ".join(f"{t}/{p}" for t, p in tps))
        consumer.incremental_unassign(partitions)

    def _wait_for_lanes(self, seconds: float) -> None:
        if self.pool is None:
            return
        deadline = time.monotonic() + seconds
        while True:
            idle = self.pool.wait_idle(0.05)
            self._drain_completions()
            if idle and self.pool.completions.empty():
                return
            if time.monotonic() >= deadline:
                log.warning("running work did not finish in %.1f s; dropping it", seconds)
                return

    # -- flow control -------------------------------------------------------------------

    def _flow(self) -> None:
        from confluent_kafka import TopicPartition as KafkaTP

        now = self.clock()
        if self.adaptive and now - self._last_flow >= _FLOW_INTERVAL:
            self._last_flow = now
            done, errors = self._iv_done, self._iv_errors
            if done:
                self.window.observe(done, errors, self._iv_elapsed / done)
            self._iv_done = self._iv_errors = 0
            self._iv_elapsed = 0.0
        pause = self.window.should_pause(max(0, self.in_flight), max(0, self.in_flight_bytes))
        if pause == self.paused:
            return
        self.paused = pause
        parts = [
            KafkaTP(t, p)
            for t, p in self.assigned
            if (t, p) not in self.fenced and (t, p) not in self._waiting
        ]
        if not parts:
            return
        if pause:
            self.consumer.pause(parts)
        else:
            self.consumer.resume(parts)

    # -- the loop -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop (thread- and signal-safe)."""
        self.stopping.set()

    def _done(self) -> bool:
        o = self.options
        if o.max_messages is not None and self.finished >= o.max_messages:
            return True
        idle = self.in_flight <= 0 and not self._timers and not self._waiting
        if o.idle_exit is not None and idle:
            # Before the first assignment, allow for the group join.
            grace = 0.0 if self._ever_assigned else _JOIN_GRACE
            return self.clock() - self._last_message >= o.idle_exit + grace
        return False

    def run(self, *, install_signals: bool = True) -> int:
        """Subscribe, loop until stopped, shut down; return the messages finished."""
        previous = self._install_signals() if install_signals else {}
        consumer = self.consumer
        lock = self.lock
        try:
            if self.sink is not None and hasattr(self.sink, "bind"):
                self.sink.bind(consumer)
            topics = [self.options.topic]
            if self.retry_topic is not None:
                topics.append(self.retry_topic)
            consumer.subscribe(
                topics,
                on_assign=self.on_assign,
                on_revoke=self.on_revoke,
                on_lost=self.on_lost,
            )
            batch_size = self.options.batch_size
            while not self.stopping.is_set() and not self._done():
                busy = self._timers or self.backlog
                # Never fetch past the window: in-flight stays within its bound.
                room = self.window.limit - self.in_flight
                wanted = batch_size if room >= batch_size else max(1, room)
                msgs = consumer.consume(wanted, 0.01 if busy else 0.1)
                with lock:
                    self._drain_completions()
                    if msgs:
                        self.dispatch(msgs)
                    if self._timers:
                        self._fire_timers()
                    if self._waiting:
                        self._wake_retries()
                    if self._fenced_at:
                        self._reclaim_fenced()
                    if self.backlog:
                        self.run_backlog()
                    now = self.clock()
                    if len(msgs) < batch_size and now - self._last_position >= _POSITION_EVERY:
                        self._last_position = now
                        self._report_gaps()
                    self.commit()
                    self._flow()
                    if self._timed:
                        self._flush_metrics()
            with lock:
                self._shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.pool is not None:
                self.pool.close()
        return self.finished

    def _shutdown(self) -> None:
        self.stopped_at = self.clock()
        log.info("stopping: %d messages finished", self.finished)
        self._wait_for_lanes(self.options.shutdown_seconds)
        self._flush_metrics()
        self._report_gaps()
        self.commit(force=True, sync=True)
        if self.alo is not None:
            self.alo.close()
        self.consumer.close()
        if self.eo is not None:
            self.eo.close()
        if isinstance(self.core, TracingCore):
            self.core.close()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda _s, _f: self.stop())
        return previous


def _check_size(msg: Any, limit: int) -> None:
    value = msg.value()
    if value is not None and len(value) > limit:
        raise MessageTooLarge(
            f"message of {len(value)} bytes is larger than --max-message-bytes {limit}"
        )


def _no_producer() -> Any:
    raise RuntimeFailure("no dead-letter producer configured", "pass producer_factory")
