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
offsets in batches, failures one by one); the poll loop turns reports into
core events on its own thread. :class:`LanePool` runs ``N`` lanes on ``N``
threads and hands the reports back through a queue; with ``workers <= 1`` the
engine calls one lane directly on the poll thread (no thread hand-off at all).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from htmqc.core.decisions import TopicPartition

#: A held key: the partition and the message key (``None`` for keyless messages).
HeldKey = tuple[TopicPartition, Any]


class Report(Protocol):
    """Where a lane reports what happened (see module docs)."""

    def succeeded(self, tp: TopicPartition, epoch: int, offsets: list[int]) -> None:
        """These offsets of ``tp`` ran successfully (in order)."""

    def failed(self, tp: TopicPartition, epoch: int, msg: Any, exc: BaseException) -> None:
        """``msg`` raised ``exc``; its key is now held in the lane."""


class Lane:
    """Runs messages in order, holding back the key of a failed message."""

    def __init__(self, call: Callable[[Any], Any]) -> None:
        self.call = call
        self._held: dict[HeldKey, deque[tuple[int, Any]]] = {}

    @property
    def held(self) -> int:
        """Messages parked behind a failed message of their key."""
        return sum(len(q) for q in self._held.values())

    def run(self, tp: TopicPartition, epoch: int, msgs: Sequence[Any], report: Report) -> None:
        """Run ``msgs`` (all of ``tp``, epoch ``epoch``) in order."""
        call = self.call
        held = self._held
        done: list[int] = []
        for msg in msgs:
            if held and (tp, msg.key()) in held:
                held[(tp, msg.key())].append((epoch, msg))
                continue
            try:
                call(msg)
            except BaseException as exc:
                if done:
                    report.succeeded(tp, epoch, done)
                    done = []
                held[(tp, msg.key())] = deque()
                report.failed(tp, epoch, msg, exc)
            else:
                done.append(msg.offset())
        if done:
            report.succeeded(tp, epoch, done)

    def retry(self, tp: TopicPartition, epoch: int, msg: Any, report: Report) -> None:
        """Run the failed ``msg`` again; on success its parked followers run too."""
        try:
            self.call(msg)
        except BaseException as exc:
            report.failed(tp, epoch, msg, exc)
            return
        report.succeeded(tp, epoch, [msg.offset()])
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

    def succeeded(self, tp: TopicPartition, epoch: int, offsets: list[int]) -> None:
        """Queue ``("ok", tp, epoch, offsets)``."""
        self.out.put(("ok", tp, epoch, offsets))

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

    def __init__(self, workers: int, call: Callable[[Any], Any]) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.completions: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._report = QueueReport(self.completions)
        self._lanes = [Lane(call) for _ in range(workers)]
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
