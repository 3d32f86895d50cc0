"""Key-ordered execution: lanes that run handlers, keeping each key's order.

Theory of operation
-------------------
A :class:`Lane` runs batches of messages of one ``(partition, epoch)`` in
order. Messages with the same key never run concurrently or out of order
because every message of a key goes to the same lane (keys are hashed to lanes
by :class:`LanePool`) and a lane runs one message at a time.

When a handler fails, its key is *held* inside the lane: later messages of
that key that reach the lane are parked (in order) instead of running, while
other keys go on. The poll loop decides what happens to the failed message
(the core answers :class:`~htmqc.core.RetryAt` or
:class:`~htmqc.core.DeadLetter`) and tells the lane: :meth:`Lane.retry` runs
it again, and on success the parked messages follow; :meth:`Lane.release`
(after a dead letter) lets the parked messages run. So only the failed
message's key is held back.

A lane never touches the core: it reports to a :class:`Report` (succeeded
offsets in batches as :class:`Done`, failures one by one); the poll loop turns reports into
core events on its own thread. :class:`LanePool` runs ``N`` lanes on ``N``
threads and hands the reports back through a queue; with ``workers <= 1`` the
engine calls one lane directly on the poll thread (no thread hand-off at all).
"""

from __future__ import annotations

import operator
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from htmqc.core.decisions import TopicPartition
from htmqc.observe.tracing import BatchSpan

#: A held key: the partition and the message key (``None`` for keyless messages).
HeldKey = tuple[TopicPartition, Any]


#: With timing on, one message in this many gives its Kafka timestamp (end-to-end latency).
STAMP_EVERY = 16


class Done:
    """What a lane reports for a run of messages that succeeded, in order.

    ``elapsed``: handler seconds for the run (always measured, once per run).
    ``nbytes``: value bytes of the messages (when the lane is ``sized``).
    ``ticks``: when the lane is ``timed`` (metrics are on), ``perf_counter``
    readings: the run's start, then one after each successful message, so
    message ``i`` took ``ticks[i + 1] - ticks[i]`` (:meth:`latencies`); one clock
    read per message instead of two. ``stamps_ms``: Kafka timestamps of a sample
    of the messages (the first, then every :data:`STAMP_EVERY`-th), for the
    end-to-end histogram, which is therefore a sample.
    """

    __slots__ = ("elapsed", "nbytes", "offsets", "stamps_ms", "ticks")

    def __init__(
        self,
        offsets: list[int],
        elapsed: float,
        nbytes: int = 0,
        ticks: list[float] | None = None,
        stamps_ms: list[float] | None = None,
    ) -> None:
        self.offsets = offsets
        self.elapsed = elapsed
        self.nbytes = nbytes
        self.ticks = ticks
        self.stamps_ms = stamps_ms

    def latencies(self) -> list[float]:
        """Per-message handler seconds (empty unless timed)."""
        ticks = self.ticks
        if not ticks:
            return []
        return list(map(operator.sub, ticks[1:], ticks[:-1]))


class Report(Protocol):
    """Where a lane reports what happened (see module docs)."""

    def succeeded(self, tp: TopicPartition, epoch: int, done: Done) -> None:
        """``done.offsets`` of ``tp`` ran successfully (in order)."""

    def failed(self, tp: TopicPartition, epoch: int, msg: Any, exc: BaseException) -> None:
        """``msg`` raised ``exc``; its key is now held in the lane."""


class Lane:
    """Runs messages in order, holding back the key of a failed message.

    ``timed``: read the clock after each handler call and sample message
    timestamps (for the latency histograms); ``sized``: add up value bytes (for
    the in-flight byte bound). Both cost a little per message, so they are off
    unless needed.
    """

    def __init__(
        self,
        call: Callable[[Any], Any],
        *,
        timed: bool = False,
        sized: bool = False,
        span: BatchSpan | None = None,
    ):
        self.call = call
        self.timed = timed
        self.sized = sized
        self.span = span
        self._held: dict[HeldKey, deque[tuple[int, Any]]] = {}

    @property
    def held(self) -> int:
        """Messages parked behind a failed message of their key."""
        return sum(len(q) for q in self._held.values())

    def run(
        self,
        tp: TopicPartition,
        epoch: int,
        msgs: Sequence[Any],
        report: Report,
        known: tuple[list[int], int] | None = None,
    ) -> None:
        """Run ``msgs`` (all of ``tp``, epoch ``epoch``) in order (inside a tracing
        span when the lane has one). ``known``: the messages' offsets and their
        total value bytes, if the caller has them already (saves reading them)."""
        if self.span is None:
            self._run(tp, epoch, msgs, report, known)
        else:
            with self.span(tp, msgs):
                self._run(tp, epoch, msgs, report, known)

    def _run(
        self,
        tp: TopicPartition,
        epoch: int,
        msgs: Sequence[Any],
        report: Report,
        known: tuple[list[int], int] | None,
    ) -> None:
        if self.timed or self._held:
            self._run_each(tp, epoch, msgs, report)
            return
        # The usual case, no held key and no timing: nothing to do per message but
        # the call; offsets and sizes come from the caller or are read afterwards.
        call = self.call
        started = time.perf_counter()
        try:
            for msg in msgs:
                call(msg)
        except BaseException as exc:
            i = next(i for i, m in enumerate(msgs) if m is msg)
            ok = msgs[:i]
            if ok:
                report.succeeded(tp, epoch, self._done(ok, time.perf_counter() - started))
            self._held[(tp, msg.key())] = deque()
            report.failed(tp, epoch, msg, exc)
            if i + 1 < len(msgs):
                self._run_each(tp, epoch, msgs[i + 1 :], report)
            return
        if msgs:
            elapsed = time.perf_counter() - started
            done = (
                self._done(msgs, elapsed)
                if known is None
                else Done(known[0], elapsed, known[1] if self.sized else 0)
            )
            report.succeeded(tp, epoch, done)

    def _done(self, msgs: Sequence[Any], elapsed: float) -> Done:
        """The report of ``msgs``, which all succeeded (untimed lanes)."""
        return Done([m.offset() for m in msgs], elapsed, sum(map(len, msgs)) if self.sized else 0)

    def _run_each(
        self, tp: TopicPartition, epoch: int, msgs: Sequence[Any], report: Report
    ) -> None:
        """The general case: a held key to park behind, or a clock read per message."""
        call = self.call
        held = self._held
        clock = time.perf_counter
        timed = self.timed
        sized = self.sized
        done: list[int] = []
        started = clock()
        ticks: list[float] | None = [started] if timed else None
        tick = ticks.append if ticks is not None else None
        nbytes = 0
        failed = False
        for msg in msgs:
            if held and (tp, msg.key()) in held:
                held[(tp, msg.key())].append((epoch, msg))
                continue
            try:
                call(msg)
            except BaseException as exc:
                failed = True
                if done:
                    report.succeeded(tp, epoch, Done(done, clock() - started, nbytes, ticks))
                    done, nbytes = [], 0
                held[(tp, msg.key())] = deque()
                report.failed(tp, epoch, msg, exc)
                started = clock()
                ticks = [started] if timed else None
                tick = ticks.append if ticks is not None else None
            else:
                done.append(msg.offset())
                if tick is not None:
                    tick(clock())
                if sized:
                    nbytes += len(msg)
        if done:
            stamps = None
            if timed and not failed:
                stamps = [m.timestamp()[1] for m in msgs[::STAMP_EVERY]]
            report.succeeded(tp, epoch, Done(done, clock() - started, nbytes, ticks, stamps))

    def holds(self, tp: TopicPartition) -> bool:
        """Whether a key of ``tp`` is held (a failed message awaits its retry)."""
        return any(k[0] == tp for k in self._held)

    def run_atomic(
        self, tp: TopicPartition, epoch: int, msgs: Sequence[Any], call: Callable[[Any], Any]
    ) -> Done:
        """Run ``msgs`` in order with ``call`` and no per-message isolation: the first
        exception propagates, and the caller's scope (one sink savepoint around the
        whole run) undoes them all; nothing is reported. The caller then runs the
        same messages again with :meth:`run`, one isolated message at a time. Only
        for a partition with no held key (:meth:`holds`)."""
        if not self.timed:
            started = time.perf_counter()
            for msg in msgs:
                call(msg)
            return self._done(msgs, time.perf_counter() - started)
        clock = time.perf_counter
        ticks = [clock()]
        tick = ticks.append
        for msg in msgs:
            call(msg)
            tick(clock())
        done = self._done(msgs, ticks[-1] - ticks[0])
        done.ticks = ticks
        done.stamps_ms = [m.timestamp()[1] for m in msgs[::STAMP_EVERY]]
        return done

    def retry(self, tp: TopicPartition, epoch: int, msg: Any, report: Report) -> None:
        """Run the failed ``msg`` again; on success its parked followers run too."""
        started = time.perf_counter()
        try:
            self.call(msg)
        except BaseException as exc:
            report.failed(tp, epoch, msg, exc)
            return
        ended = time.perf_counter()
        timed = self.timed
        report.succeeded(
            tp,
            epoch,
            Done(
                [msg.offset()],
                ended - started,
                len(msg) if self.sized else 0,
                [started, ended] if timed else None,
                [msg.timestamp()[1]] if timed else None,
            ),
        )
        self.release(tp, msg.key(), report)

    def release(self, tp: TopicPartition, key: Any, report: Report) -> None:
        """The held message of ``key`` is finished (dead-lettered or retried): run
        its parked followers, in order, until one fails again."""
        parked = self._held.pop((tp, key), None)
        while parked:
            epoch, msg = parked.popleft()
            self.run(tp, epoch, [msg], report)
            if (tp, key) in self._held:
                # It failed again: the rest stays parked behind it, in order.
                self._held[(tp, key)].extend(parked)
                return

    def drop(self, tp: TopicPartition) -> None:
        """Forget every parked message of ``tp`` (revoked or lost)."""
        for k in [k for k in self._held if k[0] == tp]:
            del self._held[k]


class QueueReport:
    """A :class:`Report` that puts each report on a queue for the poll loop."""

    def __init__(self, out: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        self.out = out

    def succeeded(self, tp: TopicPartition, epoch: int, done: Done) -> None:
        """Queue ``("ok", tp, epoch, done)``."""
        self.out.put(("ok", tp, epoch, done))

    def failed(self, tp: TopicPartition, epoch: int, msg: Any, exc: BaseException) -> None:
        """Queue ``("fail", tp, epoch, msg, exc)``."""
        self.out.put(("fail", tp, epoch, msg, exc))


class LanePool:
    """``workers`` lanes, each on its own thread; keys are hashed to lanes.

    Commands reach a lane through its FIFO queue, so everything sent for one key
    (batches, retries, releases) happens in the order it was sent. Reports come
    back on :attr:`completions` (see :class:`QueueReport`). :attr:`outstanding`
    counts commands not yet finished, so the engine can wait for a partition's
    work on revoke and for everything on shutdown.
    """

    def __init__(
        self,
        workers: int,
        call: Callable[[Any], Any],
        *,
        timed: bool = False,
        sized: bool = False,
        span: BatchSpan | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.completions: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._report = QueueReport(self.completions)
        self._lanes = [Lane(call, timed=timed, sized=sized, span=span) for _ in range(workers)]
        self._inbox: list[queue.SimpleQueue[tuple[Any, ...] | None]] = [
            queue.SimpleQueue() for _ in range(workers)
        ]
        self._lock = threading.Lock()
        self._outstanding = 0
        self._idle = threading.Condition(self._lock)
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"htmqc-lane-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def lane_of(self, key: Any) -> int:
        """The lane index of a message key."""
        return hash(key) % len(self._lanes)

    def submit(self, tp: TopicPartition, epoch: int, msgs: Sequence[Any]) -> None:
        """Split ``msgs`` by lane (keeping order) and queue them."""
        n = len(self._lanes)
        if n == 1:
            self._send(0, ("run", tp, epoch, msgs))
            return
        per: list[list[Any]] = [[] for _ in range(n)]
        for msg in msgs:
            per[hash(msg.key()) % n].append(msg)
        for i, part in enumerate(per):
            if part:
                self._send(i, ("run", tp, epoch, part))

    def retry(self, tp: TopicPartition, epoch: int, msg: Any) -> None:
        """Queue a retry of ``msg`` on its key's lane."""
        self._send(self.lane_of(msg.key()), ("retry", tp, epoch, msg))

    def release(self, tp: TopicPartition, key: Any) -> None:
        """Queue the release of ``key``'s parked messages on its lane."""
        self._send(self.lane_of(key), ("release", tp, key))

    def drop(self, tp: TopicPartition) -> None:
        """Queue forgetting ``tp``'s parked messages on every lane."""
        for i in range(len(self._lanes)):
            self._send(i, ("drop", tp))

    @property
    def outstanding(self) -> int:
        """Commands queued or running."""
        with self._lock:
            return self._outstanding

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no command is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self) -> None:
        """Stop the threads after the queued commands (does not wait for them)."""
        for box in self._inbox:
            box.put(None)

    def _send(self, lane: int, command: tuple[Any, ...]) -> None:
        with self._lock:
            self._outstanding += 1
        self._inbox[lane].put(command)

    def _work(self, index: int) -> None:
        lane = self._lanes[index]
        inbox = self._inbox[index]
        report = self._report
        while True:
            command = inbox.get()
            if command is None:
                return
            try:
                kind = command[0]
                if kind == "run":
                    lane.run(command[1], command[2], command[3], report)
                elif kind == "retry":
                    lane.retry(command[1], command[2], command[3], report)
                elif kind == "release":
                    lane.release(command[1], command[2], report)
                else:
                    lane.drop(command[1])
            finally:
                with self._idle:
                    self._outstanding -= 1
                    if self._outstanding == 0:
                        self._idle.notify_all()
