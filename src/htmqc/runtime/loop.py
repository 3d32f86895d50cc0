"""The poll loop: one :meth:`Engine.step` turn at a time, handlers elsewhere.

Theory of operation
-------------------
One thread, the *poll thread*, owns the :class:`~htmqc.core.ConsumerCore` and
the consumer: every core call happens on it, so the core stays
single-threaded. It never runs a handler: handlers run on worker threads
(:mod:`htmqc.runtime.workers`: lanes for at-least-once, the transaction worker
for exactly-once), so whatever a handler does, the poll thread polls,
dispatches, commits and serves rebalance and commit callbacks on a bounded
cadence, and ``max.poll.interval.ms`` is never exceeded because of a handler.
Each turn, :meth:`Engine.step`:

1. ``consume`` (at most what the flow window has room for); rebalance and
   commit callbacks run inside it (:mod:`~htmqc.runtime.ownership`);
2. serve the workers' reports: successes to the core, failures to
   :mod:`~htmqc.runtime.failures_io` (retry timer, dead letter, retry topic),
   exactly-once commit handshakes (:class:`~htmqc.runtime.delivery.ExactlyOnce`),
   claims, fences and sink faults (:class:`~htmqc.runtime.ownership.Ownership`);
3. intake (:mod:`~htmqc.runtime.intake`): the batch through the gate and the
   core to the workers, one hand-off per partition and lane;
4. retries that are due, retry-topic partitions to wake, fenced partitions to
   claim again, gaps the broker skipped (``position``), commits that are due,
   flow control (the window pauses every partition at its bound and resumes
   below its marks; polling goes on), metrics (:mod:`~htmqc.runtime.stats`).

Shutdown (SIGTERM, SIGINT, :meth:`Engine.stop`): no new handler call starts;
running ones get ``--shutdown-seconds`` (the loop keeps polling, all
partitions paused, so the member stays in the group); then everything
finished is committed (at-least-once: the watermark, synchronously;
exactly-once: the open transaction, and into a database the lag copy of its
watermarks, asynchronously: see :mod:`~htmqc.runtime.delivery`), the consumer
leaves the group and the run returns. A handler still running at the deadline
is abandoned: its message is not committed, and exactly-once its transaction
is never committed (see :mod:`~htmqc.runtime.workers`).

Time: every timer (commit interval, transaction age, retry backoff, flow
interval, fence grace, idle exit) reads the one injected
:class:`~htmqc.ports.Clock`; waits for threads (a revoke's or the shutdown's
bound) are real time, since they bound how long a real thread may take.
Observability reads, never steers: the core is mutated only under
:attr:`Engine.lock`, which the HTTP server's threads take to read it.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.core import Breaker, BreakerPolicy, ConsumerCore, FailureKind, RetryTopic
from htmqc.core.decisions import TopicPartition
from htmqc.core.flow import FlowPolicy, FlowWindow
from htmqc.core.gate import Hold
from htmqc.core.retry import RetryPolicy
from htmqc.errors import HtmqcError, RuntimeFailure
from htmqc.kafka_defaults import consumer_config
from htmqc.observe.tracing import batch_spans, commit_spans
from htmqc.ports import Clock, ConsumerPort, ProducerPort, Sink, SystemClock
from htmqc.runtime import affinity
from htmqc.runtime.decode import Decoders, decoding, wants_decoding
from htmqc.runtime.delivery import AtLeastOnce, ExactlyOnce
from htmqc.runtime.failures_io import Failures, MessageTooLarge, check_size
from htmqc.runtime.handlers import EventLoopThread, check_handler, is_async, synchronous
from htmqc.runtime.intake import Intake
from htmqc.runtime.lanes import Done, Lease
from htmqc.runtime.options import EXACTLY_ONCE, KAFKA, RunOptions
from htmqc.runtime.ownership import Ownership
from htmqc.runtime.stats import Stats
from htmqc.runtime.subscription import Subscription
from htmqc.runtime.trace import TracingCore
from htmqc.runtime.workers import LanePool, TransactionWorker, Workers

if TYPE_CHECKING:
    from htmqc.observe.metrics import Metrics
    from htmqc.observe.state import CoreStateSource

__all__ = ["Engine", "MessageTooLarge"]

log = logging.getLogger("htmqc.runtime")

_POSITION_EVERY = 0.2
_JOIN_GRACE = 30.0
#: How often the flow window sees an interval's figures, seconds.
_FLOW_INTERVAL = 1.0
#: Real seconds between two polls at most while the workers are saturated.
_POLL_EVERY = 0.1
#: Real seconds between two snapshots of the state for readers (HTTP, Redis).
_PUBLISH_EVERY = 0.5
#: Seconds a busy turn (workers busy or retries waiting) waits at most, in
#: consume() (woken by records) or for a worker's report (woken by the report):
#: see :meth:`Engine._wait_in_consume`; an idle turn waits in consume(), up to
#: ``--poll-wait-ms``.
_BUSY_WAIT = 0.01


class _Monotonic:
    """A :class:`~htmqc.ports.Clock` from a bare ``monotonic`` function."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.wall = time.time


class Engine:
    """One consumer-group member running ``handler`` (see module docs).

    ``consumer``: a ``confluent_kafka.Consumer`` (or a fake of
    :mod:`htmqc.testing`), not yet subscribed. ``sink``: the opened
    exactly-once sink, or ``None`` for at-least-once. ``producer_factory``
    makes the dead-letter producer (at-least-once). ``clock``: a
    :class:`~htmqc.ports.Clock` (or a bare monotonic function). ``metrics``:
    where events are counted (optional). ``error_kinds``: the user's exception
    types and how to treat them (:func:`~htmqc.core.classify`). ``lockstep``:
    after each turn wait until the workers are idle (replay, deterministic
    tests; see :mod:`htmqc.runtime.workers`). ``decoders``: what decodes keys and
    values before each handler call (:mod:`htmqc.runtime.decode`); by default
    :func:`htmqc.serde.build_decoders` of ``options`` (none for ``bytes``); the
    engine closes them when it ends.

    :raises UsageError: the handler's signature does not fit the mode, or the
        formats cannot work (:func:`~htmqc.runtime.decode.check_formats`).
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        options: RunOptions,
        consumer: ConsumerPort,
        *,
        sink: Sink | None = None,
        producer_factory: Callable[[], ProducerPort] | None = None,
        retry: RetryPolicy | None = None,
        clock: Clock | Callable[[], float] | None = None,
        seed: int | None = None,
        metrics: Metrics | None = None,
        error_kinds: Mapping[type[BaseException], FailureKind] | None = None,
        lockstep: bool = False,
        breaker: BreakerPolicy | None = None,
        decoders: Decoders | None = None,
    ) -> None:
        check_handler(handler, options.mode)
        if decoders is None and wants_decoding(options):
            from htmqc.serde import build_decoders

            decoders = build_decoders(options)
        self.decoders = decoders
        self.options = options
        self.consumer = consumer
        self.sink = sink
        self.metrics = metrics
        self.lockstep = lockstep
        self.error_kinds = dict(error_kinds or {})
        self.clock: Clock = (
            SystemClock() if clock is None
            else clock if isinstance(clock, Clock)
            else _Monotonic(clock)
        )
        if retry is None:
            retry = RetryPolicy(
                max_retries=options.max_retries,
                base_delay=options.backoff_ms / 1000.0,
                max_delay=options.backoff_max_ms / 1000.0,
            )
        self.retry_policy = retry
        self.subscription = Subscription.of(options.topic, options.retry_topic)
        #: ``--retry-topic``: each retry topic read, and the source topic it serves.
        self.retry_sources: dict[str, str] = (
            {r: s for s, r in self.subscription.retry_topics().items()}
            if options.retry_topic else {}
        )  # fmt: skip
        to_topic = (
            RetryTopic(
                name=next(iter(self.retry_sources)),
                min_delay=options.retry_topic_ms / 1000.0,
                per_source=tuple((s, r) for r, s in self.retry_sources.items()),
            )
            if self.retry_sources
            else None
        )
        self.core: ConsumerCore = (
            TracingCore(
                open(options.trace, "a", encoding="utf-8"),  # noqa: SIM115
                retry,
                retry_topic=to_topic,
            )
            if options.trace
            else ConsumerCore(retry, retry_topic=to_topic)
        )
        self.breaker = Breaker(
            breaker if breaker is not None
            else BreakerPolicy(
                consecutive=options.breaker_consecutive,
                failure_rate=options.breaker_failure_rate,
                min_calls=options.breaker_min_calls,
            )
        )
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.stats = Stats(metrics)
        self._event_loop = EventLoopThread() if is_async(handler) else None
        call = synchronous(handler, self._event_loop)
        if decoders is not None:  # the handler gets DecodedMessages (htmqc.runtime.decode)
            call = decoding(call, decoders, batch=options.batch)
        timed = metrics is not None
        span = batch_spans() if options.otel else None
        self._commit_span = commit_spans(options.mode) if options.otel else None
        limit = options.max_message_bytes
        check = check_size(limit) if limit is not None else None
        self.eo: ExactlyOnce | None = None
        self.alo: AtLeastOnce
        self.workers: Workers
        if options.mode == EXACTLY_ONCE:
            if sink is None:
                raise ValueError("exactly-once needs a sink")
            if self._event_loop is not None:  # an awaitable tx if the sink has one
                sink.serve_async_handler(self._event_loop.loop())
            worker = TransactionWorker(
                sink,
                call,
                clock=self.clock,
                txn_messages=options.txn_messages,
                txn_seconds=options.txn_ms / 1000.0,
                reconnect_seconds=options.sink_retry_seconds,
                check=check,
                timed=timed,
                sized=True,
                span=span,
                batch=options.batch,
            )
            self.workers = worker
            self.alo = AtLeastOnce(
                consumer, _no_producer, options.commit_metadata_bytes, metrics=metrics
            )
            # Lag tools read the group's offsets: copy the stored watermarks there,
            # unless the sink's transactions commit them already (Kafka->Kafka), or
            # the source is not Kafka (NATS: no group offsets that lag tools read).
            lag = (options.kafka_lag_commits and options.source == KAFKA
                   and not sink.commits_group_offsets)
            self.eo = ExactlyOnce(
                self, worker, options.txn_ms / 1000.0, lag=self.alo if lag else None,
                lag_seconds=options.commit_ms / 1000.0,
            )
        else:
            self.alo = AtLeastOnce(
                consumer, producer_factory or _no_producer,
                # NATS keeps positions in a KV bucket, which has no metadata limit
                options.commit_metadata_bytes if options.source == KAFKA else sys.maxsize,
                metrics=metrics,
            )
            batch = None
            if options.batch:
                batch = whole = call

                def call(msg: Any) -> Any:
                    return whole([msg])

                if check is not None:

                    def batch(msgs: Sequence[Any]) -> Any:
                        for msg in msgs:
                            check(msg)
                        return whole(msgs)

            if check is not None:
                bare = call

                def call(msg: Any) -> Any:
                    check(msg)
                    return bare(msg)

            self.workers = LanePool(
                max(1, options.workers), call, self.alo, timed=timed, sized=True, span=span,
                batch=batch,
            )
        low = min(options.min_in_flight, options.max_in_flight)
        adaptive = options.flow == "adaptive"
        self.adaptive = adaptive
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
        session = consumer_config(
            options.bootstrap,
            options.group,
            dict(options.kafka_config),
            group_protocol=options.group_protocol,
        )  # under group.protocol=consumer the broker's session timeout: 45 s by default
        grace = float(session.get("session.timeout.ms", 45_000)) / 1000
        self.ownership = Ownership(self, grace)
        if isinstance(self.core, TracingCore):
            self.core.fences = self.ownership.fences  # the trace records fence tokens
        self.failures = Failures(self, seed, self.breaker)
        self.intake = Intake(self)
        now = self.clock.monotonic()
        self._last_commit = self._last_position = self._last_flow = now
        self.last_message = now
        self.ever_assigned = False
        self._shutdown_deadline: float | None = None
        self._started = False
        #: The poll thread's CPU affinity before ``--python-cpu`` pinned it.
        self._affinity: set[int] | None = None
        #: Real time of the last poll (``/healthz``).
        self._polled = time.monotonic()
        #: How many ``consume`` calls have started: a batch's number, and the time
        #: stamp of each seek (:meth:`Ownership.read_before_seek`).
        self.consumes = 0
        self._published = -_PUBLISH_EVERY
        #: Clock reading since when the broker has been unreachable, or ``None``.
        self.broker_down: float | None = None
        from htmqc.observe.state import LastSnapshot

        #: What readers see (never the live core: they must not wait for the lock).
        self.snapshot = LastSnapshot(self.state_source())

    # -- compatibility views (tests, benchmarks) -------------------------------------------

    @property
    def finished(self) -> int:
        """Messages finished (succeeded, dead-lettered, moved to the retry topic)."""
        return self.stats.finished

    @property
    def in_flight(self) -> int:
        """Messages fetched and not finished."""
        return self.stats.in_flight

    @property
    def dlq_counts(self) -> dict[str, int]:
        """Dead letters written, by kind."""
        return self.stats.dlq_counts

    @property
    def fenced(self) -> set[TopicPartition]:
        """Fenced partitions (waiting for the group's decision)."""
        return self.ownership.fenced

    @property
    def first_message_at(self) -> float | None:
        """Clock reading when the first message arrived."""
        return self.stats.first_message_at

    @property
    def stopped_at(self) -> float | None:
        """Clock reading when the loop stopped."""
        return self.stats.stopped_at

    # -- callbacks (run inside consume, on the poll thread) ---------------------------------

    def on_commit(self, err: Any, partitions: list[Any]) -> None:
        """confluent-kafka's ``on_commit`` (set it in the consumer config)."""
        self.alo.on_commit(err, partitions)

    def on_consumer_error(self, err: Any) -> None:
        """confluent-kafka's ``error_cb`` (set it in the consumer config): a broker
        that cannot be reached shows on ``/readyz`` and the state page."""
        self.intake.error(err)

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback (:meth:`Ownership.on_assign`)."""
        self.ownership.on_assign(consumer, self._read(partitions))

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback (:meth:`Ownership.on_revoke`)."""
        read = self._read(partitions)
        if partitions and not read:
            consumer.incremental_unassign([])  # handled: none of them was ever read
            return
        self.ownership.on_revoke(consumer, read)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Rebalance callback (:meth:`Ownership.on_lost`)."""
        read = self._read(partitions)
        if partitions and not read:
            consumer.incremental_unassign([])
            return
        self.ownership.on_lost(consumer, read)

    def _read(self, partitions: list[Any]) -> list[Any]:
        """The partitions this member reads of those the group gave or took: a
        pattern's matches of htmqc's own topics are left alone (never assigned
        locally, so never revoked either: :mod:`htmqc.runtime.subscription`)."""
        if not self.subscription.pattern:
            return partitions
        return [p for p in partitions if self.subscription.wants(p.topic)]

    def source_of(self, topic: str) -> str:
        """The topic a message of ``topic`` came from first: the source topic of the
        retry topic, else ``topic`` itself (its DLQ topics are named after it)."""
        return self.retry_sources.get(topic, topic)

    # -- observability ----------------------------------------------------------------------

    def state_source(self) -> CoreStateSource:
        """A :class:`~htmqc.observe.state.CoreStateSource` reading this engine under
        :attr:`lock` (for ``/state.json``, ``/metrics`` and the Redis mirror)."""
        from htmqc.observe.state import CoreStateSource

        stats = self.stats
        return CoreStateSource(
            self.core,
            lock=self.lock,
            flow=self.window,
            paused=lambda: set(self.ownership.paused),
            dlq_counts=lambda: dict(stats.dlq_counts),
            high_watermarks=self._high_watermarks,
            extra=lambda: {
                "mode": self.options.mode,
                "group": self.options.group,
                "in_flight_bytes": stats.in_flight_bytes,
                "peak_in_flight": stats.peak_in_flight,
                "peak_in_flight_bytes": stats.peak_in_flight_bytes,
                "assignments": stats.assignments,
                "finished": stats.finished,
                "retries_waiting": len(self.failures.timers),
                "metadata_throttled": stats.throttled,
                "throttled_partitions": sorted(f"{t}/{p}" for t, p in self.intake.throttled),
                "max_poll_gap_s": round(stats.max_poll_gap, 4),
                "breaker": self.breaker.snapshot(self.clock.monotonic()),
                "broker_down_s": (
                    None if self.broker_down is None
                    else round(self.clock.monotonic() - self.broker_down, 1)
                ),
                "sink_down": self.ownership.sink_down,
                "gate": self.ownership.gate.snapshot(),
            },
        )

    def _high_watermarks(self) -> Mapping[TopicPartition, int]:
        """Broker high watermarks from librdkafka's cache (no broker round trip)."""
        out: dict[TopicPartition, int] = {}
        for tp in list(self.ownership.assigned):
            try:
                got = self.consumer.get_watermark_offsets(KafkaTP(tp[0], tp[1]), cached=True)
            except Exception:
                continue
            if got is not None and got[1] is not None and got[1] >= 0:
                out[tp] = int(got[1])
        return out

    # -- reports ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Feed the workers' reports to the core, in order (module docs, step 2)."""
        reports = self.workers.reports
        while not reports.empty():
            report = reports.get_nowait()
            kind = report[0]
            if kind == "ok":
                self._succeeded(report[1], report[2])
            elif kind == "fail":
                self.failures.failed(report[1], report[2], report[3])
            elif kind == "dead":
                self.failures.dead(report[1], report[2], report[3])
            elif kind == "moved":
                self.failures.moved(report[1], report[2])
            elif kind == "claimed":
                self.ownership.claimed(report[1], report[2])
            elif kind == "sink_lost":
                if self.eo is not None:
                    self.eo.asked = self.eo.in_flight = False
                self.ownership.sink_lost(report[1])
            elif kind == "sink_back":
                self.ownership.sink_ready()
            elif kind == "fatal":
                raise _fatal(report[1])
            elif kind != "closed":
                assert self.eo is not None, report
                self.eo.serve(report)

    def _succeeded(self, lease: Lease, done: Done) -> None:
        offsets = done.offsets
        if len(offsets) == 1:
            self.failures.forget(lease.tp, offsets[0])
        if self.core.succeeded_many(lease.tp, lease.epoch, offsets):
            self.failures.breaker_event(
                self.breaker.succeeded(lease.tp, offsets, self.clock.monotonic())
            )
            lease.count -= len(offsets)
            lease.nbytes -= done.nbytes
            self.stats.succeeded(lease.tp, done)

    def finish(self, lease: Lease, count: int, nbytes: int) -> None:
        """``count`` messages of ``lease`` finished without a run report."""
        lease.count -= count
        lease.nbytes -= nbytes

    def deadline(self, seconds: float) -> float:
        """``seconds`` from now in real time, but not past the shutdown's bound."""
        at = time.monotonic() + seconds
        cap = self._shutdown_deadline
        return at if cap is None else min(at, cap)

    def await_(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Serve reports until ``predicate()`` holds (True) or the real time
        ``deadline`` passes (False)."""
        while True:
            with self.lock:
                self.serve()
            if predicate():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.workers.wait(min(0.05, left))

    def settle(self) -> None:
        """Lockstep: serve until every worker is idle."""

        def serve() -> None:
            with self.lock:
                self.serve()

        self.workers.settle(serve)

    # -- the turn ---------------------------------------------------------------------------

    def dispatch(self, msgs: list[Any], batch: int | None = None) -> None:
        """Hand a consumed batch to the core and the workers (:mod:`.intake`).

        ``batch``: the number of the ``consume`` call that returned ``msgs``
        (:attr:`consumes` then); ``None``: a batch consumed just now, after every
        seek so far."""
        with self.lock:
            if batch is None:
                self.consumes += 1
                batch = self.consumes
            self.intake.dispatch(msgs, batch)

    def step(self, now: float | None = None) -> None:
        """One turn of the loop (module docs). ``now``: the loop's clock reading
        for this turn's timers (read from the clock if not given)."""
        o = self.options
        batch = o.batch_size
        workers = self.workers
        busy = not workers.idle or bool(self.failures.timers)
        if workers.asking and not self.lockstep:
            # A worker blocks until the loop answers (an exactly-once commit
            # handshake): answer before fetching and dispatching a batch, which
            # would keep it waiting that long for nothing.
            with self.lock:
                self.serve()
        real = time.monotonic()
        polled = not (workers.saturated and real - self._polled < _POLL_EVERY)
        if not polled:
            # The workers have enough to do: leave the messages in librdkafka's
            # prefetch queue rather than fetch them into the window (reaching the
            # window pauses the partitions, which drops that queue).
            msgs, wait = [], 0.0
        else:
            room = self.window.limit - self.stats.in_flight
            wanted = batch if room >= batch else max(1, room)
            self.stats.polled(self.clock.monotonic())
            self._polled = real
            wait = o.poll_wait_ms / 1000.0
            if busy:
                wait = min(wait, _BUSY_WAIT) if self._wait_in_consume(wait) else 0.0
            self.consumes += 1
            msgs = self.consumer.consume(wanted, wait)
        with self.lock:
            # Reports may seek (a claim, a rollback): intake then knows this batch
            # was read before the seek.
            self.serve()
            if msgs:
                self.intake.dispatch(msgs, self.consumes)
        if self.lockstep:
            # The turn's timers and commits see the batch done, as if it had run
            # inline: the order of events is a function of the input alone.
            self.settle()
            if msgs:
                # The workers' own clock readings are not idle time: in lockstep
                # the batch counts as arriving when it is done.
                self.last_message = self.clock.monotonic()
        with self.lock:
            self._turn(self.clock.monotonic() if now is None else now, len(msgs) < batch)
        if self.lockstep:
            self.settle()
        elif busy and not msgs and (not polled or not wait):
            self.workers.wait(_BUSY_WAIT)

    def _wait_in_consume(self, wait: float) -> bool:
        """Whether a busy turn waits for records in consume() (up to ``wait``, at
        most _BUSY_WAIT) rather than on the workers' reports. librdkafka cannot be
        woken by a report, so: when the workers are idle (only retry timers wait,
        no report can come); else at-least-once (nothing waits on the loop; waiting
        on the reports, the lanes ran dry while the fetcher caught up), unless
        fetching is held (flow control, the breaker: no record can come, and the
        reports free the window) or ``wait`` is under librdkafka's millisecond.
        Exactly-once with the worker busy, never: its commit handshake waits on
        the loop."""
        if self.workers.idle:
            return True
        return self.eo is None and not self.ownership.gate.holds and wait >= 0.001

    def _turn(self, now: float, short: bool) -> None:
        own = self.ownership
        failures = self.failures
        failures.breaker_event(self.breaker.tick(now))
        if failures.timers:
            failures.fire(now)
        if self.intake.throttled:
            self.intake.release(now)
        own.tick(now)
        if short and now - self._last_position >= _POSITION_EVERY:
            self._last_position = now
            self.report_gaps()
        self.commit(now)
        self._flow(now)
        self.stats.flush_metrics()
        real = time.monotonic()
        if real - self._published >= _PUBLISH_EVERY:
            self._published = real
            self.snapshot.publish()

    # -- health (read from HTTP threads: plain attributes, no lock) --------------------------

    def live(self) -> tuple[bool, str]:
        """``/healthz``: the poll loop turned within ``--liveness-seconds`` plus
        ``--shutdown-seconds`` (a revoke may wait that long inside a callback)."""
        bound = self.options.liveness_seconds + self.options.shutdown_seconds
        gap = time.monotonic() - self._polled
        if gap > bound:
            return False, f"the poll loop has not turned for {gap:.1f} s (bound {bound:g} s)"
        return True, ""

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: partitions assigned, broker and sink reachable, breaker closed."""
        if not self.ownership.any_assigned:
            return False, "no partitions assigned"
        if self.broker_down is not None:
            return False, "the broker is unreachable"
        if self.ownership.sink_down:
            what = "the sink" if self.sink is None else f"the {self.sink.name} sink"
            return False, f"{what} is unreachable; reconnecting"
        if not self.breaker.closed:
            return False, f"the circuit breaker is {self.breaker.state.value}"
        return True, ""

    def report_gaps(self) -> None:
        """Offsets the broker skipped (markers, aborted records) are gaps.

        Only for partitions being fetched: ``position`` is one past the last record
        ``consume`` returned, so it says nothing of the log while a partition waits
        for a claim or a seek, or while the records it returned were set aside."""
        fetchable = self.ownership.fetchable
        held = [
            (tp, epoch, t)
            for tp, epoch, t in self.core.partitions()
            if not t.draining and fetchable(tp)
        ]
        if not held:
            return
        try:
            positions = self.consumer.position([KafkaTP(tp[0], tp[1]) for tp, _, _ in held])
        except Exception:
            return
        for (tp, epoch, tracker), pos in zip(held, positions, strict=True):
            if pos.offset is not None and pos.offset > tracker.next:
                self.core.fetched(tp, epoch, [], end=pos.offset)

    def commit(self, now: float | None = None, *, force: bool = False, sync: bool = False) -> None:
        """Commit what the core asks for, if due (or ``force``: now, and for
        exactly-once wait for the outcome within the shutdown bound)."""
        now = self.clock.monotonic() if now is None else now
        if self.eo is not None:
            with self.lock:
                self.alo.drain_acks(self.core)  # lag commits' outcomes: counted only
            if force:
                if not self.eo.commit_now(self.deadline(self.options.shutdown_seconds)):
                    log.warning("the open transaction could not be committed in time")
            else:
                self.eo.tick(now)
            return
        alo = self.alo
        with self.lock:
            alo.drain_acks(self.core)
            if force or now - self._last_commit >= self.options.commit_ms / 1000.0:
                self._last_commit = now
                for lease in self.ownership.leases.values():
                    if lease.count:
                        lease.attention = True  # a long batch reports its progress
                commits = self.core.commits()
                if self._commit_span is None or not commits:
                    alo.commit(self.core, commits, sync=sync)
                else:
                    with self._commit_span(len(commits)):
                        alo.commit(self.core, commits, sync=sync)

    def _flow(self, now: float) -> None:
        if self.adaptive and now - self._last_flow >= _FLOW_INTERVAL:
            self._last_flow = now
            done, errors, elapsed = self.stats.take_interval()
            if done:
                self.window.observe(done, errors, elapsed / done)
        s = self.stats
        pause = self.window.should_pause(max(0, s.in_flight), max(0, s.in_flight_bytes))
        self.ownership.set_hold(Hold.FLOW, pause)

    # -- the run ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop (thread- and signal-safe). No handler call starts
        from now on: the leases end here, not when the loop next looks."""
        self.stopping.set()
        for lease in list(self.ownership.leases.values()):
            lease.end()

    def _done(self) -> bool:
        o = self.options
        if o.max_messages is not None and self.stats.finished >= o.max_messages:
            return True
        own = self.ownership
        idle = (
            self.stats.in_flight <= 0
            and not self.failures.timers
            and own.settled()
        )
        if o.idle_exit is not None:
            if not idle:
                self.last_message = self.clock.monotonic()  # idle time starts when idle
                return False
            # Before the first assignment, allow for the group join.
            grace = 0.0 if self.ever_assigned else _JOIN_GRACE
            return self.clock.monotonic() - self.last_message >= o.idle_exit + grace
        return False

    def start(self) -> None:
        """Start the workers and subscribe (once; :meth:`run` does it)."""
        if self._started:
            return
        self._started = True
        if self.sink is not None:
            self.sink.bind(self.consumer)
        if self.options.python_cpu is not None:
            self._affinity = affinity.pin(self.options.python_cpu)  # the workers inherit it
        self.workers.start()
        topics = [*self.subscription.topics, *self.retry_sources]
        self.consumer.subscribe(
            topics, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )
        self._polled = time.monotonic()
        with self.lock:
            self.snapshot.publish()

    def run(self, *, install_signals: bool = True) -> int:
        """Subscribe, loop until stopped, shut down; return the messages finished."""
        previous = self._install_signals() if install_signals else {}
        try:
            self.start()
            while not self.stopping.is_set() and not self._done():
                self.step()
            self.shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close_threads()
            if self._affinity is not None:
                affinity.unpin(self._affinity)
                self._affinity = None
        return self.stats.finished

    def shutdown(self) -> None:
        """Stop within the bound (module docs)."""
        o = self.options
        self.stats.stopped_at = self.clock.monotonic()
        log.info("stopping: %d messages finished", self.stats.finished)
        deadline = self._shutdown_deadline = time.monotonic() + o.shutdown_seconds
        with self.lock:
            for lease in self.ownership.leases.values():
                lease.end()  # no new handler call starts
            self.report_gaps()  # before the pause below: it may drop fetched markers
            self.ownership.set_hold(Hold.FLOW, True)
        barrier = self.workers.barrier()
        while not barrier.done and time.monotonic() < deadline:
            # Keep polling (everything is paused) so the member stays in the group.
            self.consumer.consume(1, min(0.05, max(0.0, deadline - time.monotonic())))
            with self.lock:
                self.serve()
            if not barrier.done:
                self.workers.wait(0.01)
        if not barrier.done:
            log.warning(
                "handlers still running after %.1f s are abandoned; their messages are "
                "not committed", o.shutdown_seconds,
            )
        with self.lock:
            self.serve()
            self.stats.flush_metrics()
            self.report_gaps()
        self.commit(force=True, sync=True)
        if self.eo is not None:
            with self.lock:  # what the last commits stored, whatever their outcome
                self.eo.copy_lag(self.clock.monotonic(), force=True)
        self.alo.close()
        self.consumer.close()
        if self.eo is not None:
            self.alo.drain_acks(self.core)  # lag commits answered during close: counted
        if self.eo is not None:
            # Idle: closed now. A call still running (abandoned): not waited for; the
            # worker rolls its transaction back and closes the sink when it returns.
            idle = self.workers.idle
            self.eo.worker.request(("close",))
            if idle:
                self.await_(lambda: self.workers.idle, time.monotonic() + 1.0)
        if isinstance(self.core, TracingCore):
            self.core.close()

    def discard(self) -> None:
        """Close what was opened for an engine that will never run (its consumer and
        sink): the caller failed between building it and :meth:`run`."""
        with suppress(Exception):
            self.consumer.close()
        if self.sink is not None:
            with suppress(Exception):
                self.sink.close()
        if self.decoders is not None:
            with suppress(Exception):
                self.decoders.close()

    def _close_threads(self) -> None:
        if self.eo is not None:
            self.eo.worker.stop()
        self.workers.close()
        if self._event_loop is not None:
            self._event_loop.close()
        if self.decoders is not None:
            self.decoders.close()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda _s, _f: self.stop())
        return previous


def _fatal(exc: BaseException) -> BaseException:
    """A worker's ``fatal`` report as the exception the run ends with: an
    :class:`~htmqc.errors.HtmqcError` as it is, anything else in one line
    (the cause is chained, for ``--debug``)."""
    if isinstance(exc, HtmqcError):
        return exc
    failure = RuntimeFailure(
        f"a worker thread failed: {type(exc).__name__}: {exc}",
        "run again with --debug for the traceback",
    )
    failure.__cause__ = exc
    return failure


def _no_producer() -> ProducerPort:
    raise RuntimeFailure("no dead-letter producer configured", "pass producer_factory")
