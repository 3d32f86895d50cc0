"""Key-ordered execution: lanes that run handlers, keeping each key's order.

Theory of operation
-------------------
A :class:`Lane` runs batches of messages in order, one at a time. Messages with
the same key never run concurrently or out of order because every message of a
key goes to the same lane (keys are hashed to lanes by
:class:`~htmqc.runtime.workers.LanePool`) and a lane runs one message at a time.

Every batch carries the :class:`Lease` of the partition assignment it belongs
to. The poll thread ends a lease (:meth:`Lease.end`) when the partition is
revoked, lost, fenced, or the process shuts down; a lane looks at the lease
before *each* handler call, so no call starts after that, and what remains of
the batch is dropped without a report.

When a handler fails, its key is *held* inside the lane: later messages of
that key that reach the lane are parked (in order) instead of running, while
other keys go on. The poll loop decides what happens to the failed message
(the core answers :class:`~htmqc.core.RetryAt` or
:class:`~htmqc.core.DeadLetter`) and tells the lane: :meth:`Lane.retry` runs
it again, and on success the parked messages follow; :meth:`Lane.release`
(after a dead letter) lets the parked messages run. So only the failed
message's key is held back.

A lane never touches the core: it reports to a :class:`Report` (succeeded
offsets in batches as :class:`Done`, failures one by one); the poll loop turns
reports into core events on its own thread. A handler's exception whose type
is in ``passthrough`` is not the message's failure (a sink that lost its
connection, a handler that does not fit the runtime): it propagates out of the
lane to its worker, which reports it whole.
"""

from __future__ import annotations

import operator
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from htmqc.core.decisions import TopicPartition
from htmqc.observe.tracing import BatchSpan
from htmqc.runtime.handlers import HandlerMisuse, check_result

#: With timing on, one message in this many gives its Kafka timestamp (end-to-end latency).
STAMP_EVERY = 16


class Lease:
    """One assignment of a partition, as the workers see it: ``tp`` and the
    core's ``epoch``; ``live`` until the poll thread ends it (module docs).
    ``attention``: set by the poll thread when it wants something of the lanes
    running this lease: stop (the lease ended) or report what finished so far
    (a commit is due); the one flag a lane reads before each call. ``count``
    and ``nbytes``: messages and value bytes handed out under this lease and
    not finished (kept by the poll thread only)."""

    __slots__ = ("attention", "count", "epoch", "live", "nbytes", "tp")

    def __init__(self, tp: TopicPartition, epoch: int) -> None:
        self.tp = tp
        self.epoch = epoch
        self.live = True
        self.attention = False
        self.count = 0
        self.nbytes = 0

    def end(self) -> None:
        """No call starts under this lease any more."""
        self.live = False
        self.attention = True

    def __repr__(self) -> str:
        return f"Lease({self.tp[0]}/{self.tp[1]}#{self.epoch}{'' if self.live else ' ended'})"


#: A held key: the lease and the message key (``None`` for keyless messages).
HeldKey = tuple[Lease, Any]


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

    def succeeded(self, lease: Lease, done: Done) -> None:
        """``done.offsets`` of ``lease.tp`` ran successfully (in order)."""

    def failed(self, lease: Lease, msg: Any, exc: BaseException) -> None:
        """``msg`` raised ``exc``; its key is now held in the lane."""


def _never() -> bool:
    return False


class Lane:
    """Runs messages in order, holding back the key of a failed message.

    ``timed``: read the clock after each handler call and sample message
    timestamps (for the latency histograms); ``sized``: add up value bytes (for
    the in-flight byte bound). Both cost a little per message, so they are off
    unless needed. ``passthrough``: exception types that are not a message's
    failure (module docs). ``batch``: a batch handler (at-least-once ``--batch``)
    that runs a whole run in one call when no key is held; ``call`` is then its
    one-message form, for the run again one message at a time after it raised.
    """

    def __init__(
        self,
        call: Callable[[Any], Any],
        *,
        timed: bool = False,
        sized: bool = False,
        span: BatchSpan | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
        batch: Callable[[Sequence[Any]], Any] | None = None,
    ):
        self.call = call
        self.batch = batch
        self.timed = timed
        self.sized = sized
        self.span = span
        self.passthrough: tuple[type[BaseException], ...] = (HandlerMisuse, *passthrough)
        self._held: dict[HeldKey, deque[Any]] = {}

    @property
    def held(self) -> int:
        """Messages parked behind a failed message of their key."""
        return sum(len(q) for q in self._held.values())

    def run(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        report: Report,
        known: tuple[list[int], int] | None = None,
        interrupt: Callable[[], bool] | None = None,
    ) -> int:
        """Run ``msgs`` (all of ``lease.tp``) in order (inside a tracing span when
        the lane has one); return how many of them were dealt with (run,
        failed or parked): fewer than ``len(msgs)`` when the lease ended or
        ``interrupt()`` said so before a call. ``known``: the messages' offsets
        and their total value bytes, if the caller has them already."""
        if self.span is None:
            return self._run(lease, msgs, report, known, interrupt)
        with self.span(lease.tp, msgs):
            return self._run(lease, msgs, report, known, interrupt)

    def _run(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        report: Report,
        known: tuple[list[int], int] | None,
        interrupt: Callable[[], bool] | None,
    ) -> int:
        if self.batch is not None and len(msgs) > 1 and not self._held and interrupt is None:
            return self._run_batch(lease, msgs, report, known)
        if self.timed or self._held or interrupt is not None:
            return self._run_each(lease, msgs, report, interrupt)
        # The usual case, no held key and no timing: nothing to do per message but
        # the attention check and the call; offsets and sizes come from the caller
        # or are read afterwards. A plain def that returns awaitables returns one
        # every time: looking at the first result of a run is enough.
        call = self.call
        started = time.perf_counter()
        first = 0
        checked = False
        try:
            for msg in msgs:
                if lease.attention:
                    i = _index(msgs, msg, first)
                    if i > first:
                        report.succeeded(
                            lease, self._done(msgs[first:i], time.perf_counter() - started)
                        )
                        first, started, known = i, time.perf_counter(), None
                    if not lease.live:
                        return i
                    lease.attention = False  # a progress report was asked for: given
                if checked:
                    call(msg)
                    continue
                checked = True
                result = call(msg)
                if result is not None:
                    check_result(result)
        except self.passthrough:
            raise
        except BaseException as exc:
            i = _index(msgs, msg, first)
            ok = msgs[first:i]
            if ok:
                report.succeeded(lease, self._done(ok, time.perf_counter() - started))
            self._held[(lease, msg.key())] = deque()
            report.failed(lease, msg, exc)
            if i + 1 < len(msgs):
                return i + 1 + self._run_each(lease, msgs[i + 1 :], report, None)
            return len(msgs)
        if len(msgs) > first:
            elapsed = time.perf_counter() - started
            done = (
                self._done(msgs[first:], elapsed)
                if known is None or first
                else Done(known[0], elapsed, known[1] if self.sized else 0)
            )
            report.succeeded(lease, done)
        return len(msgs)

    def _run_batch(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        report: Report,
        known: tuple[list[int], int] | None,
    ) -> int:
        """One batch call for the run; if it raises, the run again one message per
        call (:meth:`_run_each`), so only the failing message fails and keys are
        held as usual. The messages before it then ran twice: at-least-once."""
        if not lease.live:
            return 0
        assert self.batch is not None
        started = time.perf_counter()
        try:
            result = self.batch(msgs)
            if result is not None:
                check_result(result)
        except self.passthrough:
            raise
        except BaseException:
            return self._run_each(lease, msgs, report, None)
        ended = time.perf_counter()
        done = (
            self._done(msgs, ended - started)
            if known is None
            else Done(known[0], ended - started, known[1] if self.sized else 0)
        )
        if self.timed:
            self._spread(done, msgs, started, ended)
        report.succeeded(lease, done)
        return len(msgs)

    @staticmethod
    def _spread(done: Done, msgs: Sequence[Any], started: float, ended: float) -> None:
        """A batch call's time charged to its messages in equal shares."""
        step = (ended - started) / len(msgs)
        done.ticks = [started + k * step for k in range(len(msgs))] + [ended]
        done.stamps_ms = [m.timestamp()[1] for m in msgs[::STAMP_EVERY]]

    def _done(self, msgs: Sequence[Any], elapsed: float) -> Done:
        """The report of ``msgs``, which all succeeded (untimed lanes)."""
        return Done([m.offset() for m in msgs], elapsed, sum(map(len, msgs)) if self.sized else 0)

    def _run_each(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        report: Report,
        interrupt: Callable[[], bool] | None,
    ) -> int:
        """The general case: a held key to park behind, a clock read per message,
        or an ``interrupt`` to ask before each call."""
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
        seen = 0
        for msg in msgs:
            if lease.attention:
                if not lease.live:
                    break
                lease.attention = False
                if done:  # a progress report was asked for
                    report.succeeded(lease, Done(done, clock() - started, nbytes, ticks))
                    done, nbytes = [], 0
                    started = clock()
                    ticks = [started] if timed else None
                    tick = ticks.append if ticks is not None else None
                    failed = True  # the stamps below would not match the report
            if interrupt is not None and interrupt():
                break
            seen += 1
            if held and (lease, msg.key()) in held:
                held[(lease, msg.key())].append(msg)
                continue
            try:
                result = call(msg)
                if result is not None:
                    check_result(result)
            except self.passthrough:
                if done:
                    report.succeeded(lease, Done(done, clock() - started, nbytes, ticks))
                raise
            except BaseException as exc:
                failed = True
                if done:
                    report.succeeded(lease, Done(done, clock() - started, nbytes, ticks))
                    done, nbytes = [], 0
                held[(lease, msg.key())] = deque()
                report.failed(lease, msg, exc)
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
            if timed and not failed and seen == len(msgs):
                stamps = [m.timestamp()[1] for m in msgs[::STAMP_EVERY]]
            report.succeeded(lease, Done(done, clock() - started, nbytes, ticks, stamps))
        return seen

    def holds(self, lease: Lease) -> bool:
        """Whether a key of ``lease`` is held (a failed message awaits its retry)."""
        return any(k[0] is lease for k in self._held)

    def run_atomic(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        call: Callable[[Any], Any],
        interrupt: Callable[[], bool] = _never,
    ) -> Done:
        """Run ``msgs`` in order with ``call`` and no per-message isolation: the first
        exception propagates, and the caller's scope (one sink savepoint around the
        whole run) undoes them all; nothing is reported. The caller then runs the
        same messages again with :meth:`run`, one isolated message at a time. Only
        for a lease with no held key (:meth:`holds`). Stops before a call when the
        lease ended or ``interrupt()`` says so: the returned :class:`Done` lists
        the prefix that ran."""
        clock = time.perf_counter
        timed = self.timed
        ticks = [clock()]
        ran = 0
        for msg in msgs:
            if not lease.live or interrupt():
                break
            result = call(msg)
            if result is not None:
                check_result(result)
            ran += 1
            if timed:
                ticks.append(clock())
        if not timed:
            return self._done(msgs[:ran], clock() - ticks[0])
        done = self._done(msgs[:ran], ticks[-1] - ticks[0])
        done.ticks = ticks
        done.stamps_ms = [m.timestamp()[1] for m in msgs[:ran:STAMP_EVERY]]
        return done

    def run_whole(
        self,
        lease: Lease,
        msgs: Sequence[Any],
        call: Callable[[Sequence[Any]], Any],
        interrupt: Callable[[], bool] = _never,
    ) -> Done:
        """:meth:`run_atomic` for a batch handler: ``call(msgs)`` once, unless the
        lease ended or ``interrupt()`` says so first (then nothing ran: an empty
        :class:`Done`). Each message is charged an equal share of the call's time."""
        clock = time.perf_counter
        started = clock()
        if not msgs or not lease.live or interrupt():
            return self._done(msgs[:0], 0.0)
        result = call(msgs)
        if result is not None:
            check_result(result)
        ended = clock()
        done = self._done(msgs, ended - started)
        if self.timed:
            self._spread(done, msgs, started, ended)
        return done

    def run_whole_many(
        self,
        pieces: Sequence[tuple[Lease, Sequence[Any]]],
        call: Callable[[Sequence[Any]], Any],
        interrupt: Callable[[], bool] = _never,
    ) -> list[Done]:
        """:meth:`run_whole` for pieces of several leases in one call: ``call`` once
        with every piece's messages in order; one :class:`Done` per piece, all empty
        (nothing ran) if a lease ended or ``interrupt()`` says so first. Each message
        is charged an equal share of the call's time."""
        clock = time.perf_counter
        started = clock()
        msgs = [m for _, piece in pieces for m in piece]
        if not msgs or not all(lease.live for lease, _ in pieces) or interrupt():
            return [self._done(piece[:0], 0.0) for _, piece in pieces]
        result = call(msgs)
        if result is not None:
            check_result(result)
        share = (clock() - started) / len(msgs)
        dones = []
        for _, piece in pieces:
            done = self._done(piece, share * len(piece))
            if self.timed:
                self._spread(done, piece, started, started + done.elapsed)
            started += done.elapsed
            dones.append(done)
        return dones

    def retry(self, lease: Lease, msg: Any, report: Report) -> None:
        """Run the failed ``msg`` again; on success its parked followers run too."""
        if not lease.live:
            return
        started = time.perf_counter()
        try:
            result = self.call(msg)
            if result is not None:
                check_result(result)
        except self.passthrough:
            raise
        except BaseException as exc:
            report.failed(lease, msg, exc)
            return
        ended = time.perf_counter()
        timed = self.timed
        report.succeeded(
            lease,
            Done(
                [msg.offset()],
                ended - started,
                len(msg) if self.sized else 0,
                [started, ended] if timed else None,
                [msg.timestamp()[1]] if timed else None,
            ),
        )
        self.release(lease, msg.key(), report)

    def release(self, lease: Lease, key: Any, report: Report) -> None:
        """The held message of ``key`` is finished (dead-lettered or retried): run
        its parked followers, in order, until one fails again."""
        parked = self._held.pop((lease, key), None)
        while parked and lease.live:
            msg = parked.popleft()
            self.run(lease, [msg], report)
            if (lease, key) in self._held:
                # It failed again: the rest stays parked behind it, in order.
                self._held[(lease, key)].extend(parked)
                return

    def drop(self, lease: Lease) -> None:
        """Forget every parked message of ``lease`` (it ended)."""
        for k in [k for k in self._held if k[0] is lease]:
            del self._held[k]


def _index(msgs: Sequence[Any], msg: Any, start: int = 0) -> int:
    """The position of ``msg`` (by identity) in ``msgs``, from ``start`` on."""
    return next(i for i in range(start, len(msgs)) if msgs[i] is msg)
