"""The threads that run handlers, so that the poll thread never does.

Theory of operation
-------------------
The poll thread (:mod:`htmqc.runtime.loop`) owns the core and the consumer;
it hands work to worker threads *per batch*, as commands on each worker's FIFO
inbox, and hears back through one report queue, which it drains every turn.
Reports are tuples whose first item names them:

==================  ================================================================
report              meaning
==================  ================================================================
``ok``              ``(lease, Done)``: a run of messages succeeded
``fail``            ``(lease, msg, exc)``: a handler raised; its key is held
``dead``            ``(lease, msg, info)``: the dead letter is written
``moved``           ``(lease, msg)``: the message is on the retry topic
``commit_due``      exactly-once: the transaction waits for its commit payload
``committed``       ``(payload, seconds)``: the transaction is stored
``fenced``          ``(Fenced,)``: the sink rejected the transaction (rolled back)
``aborted``         the transaction was rolled back because the loop doomed it
``sink_lost``       ``(exc,)``: the sink failed; reconnecting
``sink_back``       the sink is connected again
``claimed``         ``(token, positions)``: partitions claimed in the sink
``fatal``           ``(exc,)``: the run cannot go on (one-line error)
==================  ================================================================

At-least-once: :class:`LanePool`, ``N >= 1`` lanes (:class:`~htmqc.runtime.lanes.Lane`)
on ``N`` threads, keys hashed to lanes, so per-key order holds and other keys
run in parallel. Dead letters and retry records are written by the lane of the
message's key (the producer waits for the broker; the poll thread never does).

Exactly-once: :class:`TransactionWorker`, one thread that owns the sink's
connection: claims, the open transaction, every handler call (handlers of one
transaction share the connection), dead letters (into the same transaction,
in order) and commits. The commit is coordinated with the core, which only the
poll thread may touch: when the transaction is due (``txn_messages`` run, or
``txn_ms`` passed on the injected clock, checked before every handler call) or
the loop asks for it, the worker reports ``commit_due`` *after* every report
of the work in the transaction and waits; the poll thread, having fed those
reports to the core, answers with the core's commits (offset and
``finished_above`` per partition) and their fences; the worker stores them in
the transaction and commits, and reports ``committed`` (the poll thread then
acks) or ``fenced``. So the payload covers exactly the effects in the
transaction: nothing else can finish while the worker waits.

Abandoned work. A revoke or a shutdown first ends the leases it lets go: no
call of theirs starts from then on, and what is queued for them is dropped
unrun (the next owner reads it again: it was never committed). It then waits
for the calls running (:meth:`Workers.running`; a shutdown: every worker's
barrier), at most ``--shutdown-seconds``, and lets the partitions go. A
handler still running then is abandoned: at-least-once, its late
report carries a stale epoch and the core ignores it. Exactly-once, the open
transaction may hold effects of the partition that was let go, whose position
the core no longer has; the loop *dooms* it (:meth:`TransactionWorker.doom`):
the worker rolls it back instead of committing (reporting ``aborted``) and the
loop claims its remaining partitions again from the stored positions. The
fence is the second line: had that transaction been committed anyway, its
payload would carry the fences of this member's claims, and the next owner's
claim bumps them, so the sink would reject the whole transaction.

Sink faults (:class:`~htmqc.sinks.base.SinkUnavailable`,
:class:`~htmqc.sinks.base.TransactionAborted`): the worker drops the
transaction, reports ``sink_lost``, and reconnects with exponential backoff
(0.1 s doubling to 5 s) until it works (``sink_back``) or ``reconnect_seconds``
passed (``fatal``, one line naming the cause).

Lockstep (``lockstep=True``, for replay and deterministic tests): the loop
waits after each turn until every worker is idle or waiting for it
(:meth:`Workers.settle`), so the order of every event is a function of the
input; the handlers still run on the worker threads.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from htmqc.core.decisions import Commit, TopicPartition
from htmqc.dlq.record import DeadLetterInfo
from htmqc.errors import RuntimeFailure
from htmqc.observe.tracing import BatchSpan
from htmqc.ports import Clock, Headers, Message, Position, Sink, SinkTransaction
from htmqc.runtime.lanes import Done, Lane, Lease
from htmqc.sinks.base import Fenced, SinkUnavailable, TransactionAborted

#: Exactly-once: most messages run in one sink scope (one savepoint) before the
#: transaction is looked at again; a failure re-runs its piece one at a time.
PIECE = 250

#: Sink reconnection backoff, seconds: first wait, cap.
BACKOFF = (0.1, 5.0)
#: The exceptions that mean the sink, not the message, failed.
SINK_FAULTS: tuple[type[BaseException], ...] = (SinkUnavailable, TransactionAborted)

Payload = list[tuple[Commit, int]]
#: One fetch's run of one partition: its lease, messages, and (offsets, bytes).
Run = tuple[Lease, Sequence[Any], tuple[list[int], int]]
Reports = queue.SimpleQueue[tuple[Any, ...]]


class Outbox(Protocol):
    """Where a lane writes what leaves a partition without an effect."""

    def dead_letter(self, topic: str, msg: Message, info: DeadLetterInfo) -> None:
        """Write ``msg``'s dead letter durably, to :meth:`dead_letter_destination`."""

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """Where :meth:`dead_letter` writes ``info``'s dead letter of a message
        from ``topic`` (the DLQ topic)."""

    def forward(self, topic: str, msg: Message, headers: Headers) -> None:
        """Write ``msg`` to ``topic`` with ``headers`` durably (the retry topic)."""


class Barrier:
    """Done once every worker has reached it (all work sent before it is done)."""

    def __init__(self, parties: int) -> None:
        self._left = parties
        self._lock = threading.Lock()

    def arrive(self) -> None:
        """One worker reached the barrier."""
        with self._lock:
            self._left -= 1

    @property
    def done(self) -> bool:
        """Whether every worker reached it."""
        return self._left <= 0


def _touches(command: tuple[Any, ...], leases: Sequence[Lease]) -> bool:
    """Whether ``command`` works under one of ``leases``: its second item is its
    lease, or (``runs``) a list of ``(lease, messages)``."""
    arg = command[1] if len(command) > 1 else None
    if isinstance(arg, Lease):
        return any(arg is lease for lease in leases)
    if isinstance(arg, list):
        return any(run[0] is lease for run in arg for lease in leases)
    return False


class _ReportTo:
    """A lane's :class:`~htmqc.runtime.lanes.Report`: onto the report queue."""

    def __init__(self, workers: Workers) -> None:
        self._workers = workers

    def succeeded(self, lease: Lease, done: Done) -> None:
        self._workers.report(("ok", lease, done))

    def failed(self, lease: Lease, msg: Any, exc: BaseException) -> None:
        self._workers.report(("fail", lease, msg, exc))


class Workers(ABC):
    """Threads with FIFO inboxes and one report queue (module docs)."""

    def __init__(self, count: int, name: str) -> None:
        self.reports: Reports = queue.SimpleQueue()
        #: Notified on every report and whenever a worker finishes a command or
        #: starts waiting for the loop: what the loop's waits wait on.
        self.changed = threading.Condition()
        self._outstanding = 0
        self._waiting = 0
        self._inbox: list[queue.SimpleQueue[tuple[Any, ...] | None]] = [
            queue.SimpleQueue() for _ in range(count)
        ]
        #: The command each worker is carrying out (None: between commands).
        self._current: list[tuple[Any, ...] | None] = [None] * count
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(count)
        ]
        self._started = False

    def start(self) -> None:
        """Start the threads (once)."""
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    # -- the loop's side -------------------------------------------------------------

    def send(self, index: int, command: tuple[Any, ...]) -> None:
        """Queue ``command`` for worker ``index``."""
        with self.changed:
            self._outstanding += 1
        self._inbox[index].put(command)

    def barrier(self) -> Barrier:
        """A barrier behind everything sent so far, on every worker."""
        barrier = Barrier(len(self._inbox))
        for i in range(len(self._inbox)):
            self.send(i, ("mark", barrier))
        return barrier

    def running(self, leases: Sequence[Lease]) -> bool:
        """Whether a worker is carrying out a command under one of ``leases``: a
        handler call of theirs may be running. Once the leases ended, a command of
        theirs that starts later calls no handler (module docs, abandoned work)."""
        return any(c is not None and _touches(c, leases) for c in self._current)

    @property
    def idle(self) -> bool:
        """No command queued or running."""
        return self._outstanding == 0

    @property
    def saturated(self) -> bool:
        """Every worker has a command running and another queued: fetching more
        now would only make it wait in memory."""
        return self._outstanding >= 2 * len(self._inbox) and not self.asking

    @property
    def asking(self) -> bool:
        """A worker waits for the loop's answer (:meth:`_ask_loop`)."""
        return self._waiting > 0

    def quiet(self) -> bool:
        """Nothing can happen without the loop: every command is done, or a
        worker waits for the loop's answer (the commands behind it wait too)."""
        return self.idle or self.asking

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a report or a worker to finish."""
        with self.changed:
            if self.reports.empty() and not self.quiet():
                self.changed.wait(timeout)

    def settle(self, serve: Callable[[], None]) -> None:
        """Lockstep: ``serve()`` (drain reports) until every worker is idle."""
        while True:
            with self.changed:
                self.changed.wait_for(self.quiet)
            serve()
            if self.idle and self.reports.empty():
                return

    def close(self) -> None:
        """Stop the threads after their queued commands (does not wait)."""
        for box in self._inbox:
            box.put(None)

    # -- the workers' side -----------------------------------------------------------

    def report(self, item: tuple[Any, ...], *, wake: bool = True) -> None:
        """Put ``item`` on the report queue and (``wake``) wake the loop. A
        report that need not wake it is served at the loop's next turn: at the
        latest when this command ends, the worker asks, or the busy wait ends."""
        self.reports.put(item)
        if wake:
            with self.changed:
                self.changed.notify_all()

    def _serve(self, index: int) -> None:
        inbox = self._inbox[index]
        while True:
            command = inbox.get()
            if command is None:
                return
            try:
                if command[0] == "mark":
                    command[1].arrive()
                else:
                    self._current[index] = command
                    self.handle(index, command)
            except BaseException as exc:  # a bug or a misuse: the run stops, in one line
                self.report(("fatal", exc))
            finally:
                self._current[index] = None
                with self.changed:
                    self._outstanding -= 1
                    self.changed.notify_all()

    def _ask_loop(self, question: tuple[Any, ...], box: queue.SimpleQueue[Any]) -> Any:
        """Report ``question`` and block for the loop's answer on ``box``: counted
        as waiting from before the report until the loop answers
        (:meth:`_answered`), not until this thread runs again."""
        with self.changed:
            self._waiting += 1
        self.report(question)
        return box.get()

    def _answered(self) -> None:
        """The loop answered a waiting worker."""
        with self.changed:
            self._waiting -= 1

    @abstractmethod
    def handle(self, index: int, command: tuple[Any, ...]) -> None:
        """Carry out ``command`` on worker ``index``."""

    # -- work, in the same words for both modes --------------------------------------

    @abstractmethod
    def submit(self, lease: Lease, msgs: Sequence[Any], known: tuple[list[int], int]) -> None:
        """Run ``msgs`` (one partition's batch, in order) under ``lease``."""

    def submit_many(self, runs: Sequence[Run]) -> None:
        """:meth:`submit` each of one fetch's runs ``(lease, msgs, known)``, in order."""
        for lease, msgs, known in runs:
            self.submit(lease, msgs, known)

    @abstractmethod
    def retry(self, lease: Lease, msg: Any) -> None:
        """Run the failed ``msg`` again (its key's followers after it)."""

    @abstractmethod
    def dead_letter(self, lease: Lease, msg: Any, info: DeadLetterInfo, topic: str) -> None:
        """Write ``msg``'s dead letter, report ``dead``, release its key."""

    @abstractmethod
    def forward(self, lease: Lease, msg: Any, topic: str, headers: Headers) -> None:
        """Write ``msg`` to the retry topic, report ``moved``, release its key."""

    @abstractmethod
    def end(self, lease: Lease) -> None:
        """Forget what is parked under the (ended) ``lease``."""

    @abstractmethod
    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """Where :meth:`dead_letter` writes ``info``'s dead letter of a message
        from ``topic``, as the log line names it: asked of whatever writes it
        (the outbox's DLQ topic, or the sink's topic or table), so the line
        and the write cannot disagree."""


class LanePool(Workers):
    """At-least-once: ``workers`` lanes on as many threads (module docs)."""

    def __init__(
        self,
        workers: int,
        call: Callable[[Any], Any],
        outbox: Outbox,
        *,
        timed: bool = False,
        sized: bool = False,
        span: BatchSpan | None = None,
        batch: Callable[[Sequence[Any]], Any] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        super().__init__(workers, "htmqc-lane")
        self.outbox = outbox
        self._out = _ReportTo(self)
        self._lanes = [Lane(call, timed=timed, sized=sized, span=span, batch=batch)
                       for _ in range(workers)]

    def lane_of(self, key: Any) -> int:
        """The lane index of a message key."""
        return hash(key) % len(self._lanes)

    def submit(self, lease: Lease, msgs: Sequence[Any], known: tuple[list[int], int]) -> None:
        """Split ``msgs`` by lane (keeping order) and queue them."""
        n = len(self._lanes)
        if n == 1:
            self.send(0, ("run", lease, msgs, known))
            return
        per: list[list[Any]] = [[] for _ in range(n)]
        for msg in msgs:
            per[hash(msg.key()) % n].append(msg)
        for i, part in enumerate(per):
            if part:
                self.send(i, ("run", lease, part, None))

    def retry(self, lease: Lease, msg: Any) -> None:
        self.send(self.lane_of(msg.key()), ("retry", lease, msg))

    def dead_letter(self, lease: Lease, msg: Any, info: DeadLetterInfo, topic: str) -> None:
        self.send(self.lane_of(msg.key()), ("dead", lease, msg, info, topic))

    def forward(self, lease: Lease, msg: Any, topic: str, headers: Headers) -> None:
        self.send(self.lane_of(msg.key()), ("moved", lease, msg, topic, headers))

    def end(self, lease: Lease) -> None:
        for i in range(len(self._lanes)):
            self.send(i, ("drop", lease))

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        return self.outbox.dead_letter_destination(topic, info)

    def handle(self, index: int, command: tuple[Any, ...]) -> None:
        lane, out = self._lanes[index], self._out
        kind, lease = command[0], command[1]
        if kind == "run":
            lane.run(lease, command[2], out, command[3])
        elif kind == "retry":
            lane.retry(lease, command[2], out)
        elif kind == "dead":
            _, _, msg, info, topic = command
            if lease.live:
                self.outbox.dead_letter(topic, msg, info)
                self.report(("dead", lease, msg, info))
                lane.release(lease, msg.key(), out)
        elif kind == "moved":
            _, _, msg, topic, headers = command
            if lease.live:
                self.outbox.forward(topic, msg, headers)
                self.report(("moved", lease, msg))
                lane.release(lease, msg.key(), out)
        else:
            lane.drop(lease)


class TransactionWorker(Workers):
    """Exactly-once: the one thread that owns the sink (module docs).

    ``handler(msg, handle)`` is the user's (already synchronous) handler;
    ``check(msg)`` raises for a message that must not run (too large). A
    ``claim`` request carries where each partition the sink never saw starts.
    """

    def __init__(
        self,
        sink: Sink,
        handler: Callable[[Any, Any], Any],
        *,
        clock: Clock,
        txn_messages: int,
        txn_seconds: float,
        reconnect_seconds: float,
        check: Callable[[Any], None] | None = None,
        timed: bool = False,
        sized: bool = False,
        span: BatchSpan | None = None,
        batch: bool = False,
    ) -> None:
        super().__init__(1, "htmqc-txn")
        self.sink = sink
        self.clock = clock
        self.txn_messages = txn_messages
        self.txn_seconds = txn_seconds
        self.reconnect_seconds = reconnect_seconds
        #: A batch handler takes a piece at once; isolated, a list of one message.
        self._batch: Callable[[Any, Any], Any] | None = handler if batch else None

        def one(msg: Any, handle: Any) -> Any:
            return handler([msg], handle)

        self._handler: Callable[[Any, Any], Any] = one if batch else handler
        self._check = check
        self._out = _CountingReport(self)
        self.lane = Lane(self._isolated, timed=timed, sized=sized, span=span,
                         passthrough=SINK_FAULTS)
        self.txn: SinkTransaction | None = None
        #: Messages (and dead letters) in the open transaction.
        self.count = 0
        self._deadline = float("inf")
        self._urgent: deque[tuple[Any, ...]] = deque()
        self._answers: queue.SimpleQueue[Payload | None] = queue.SimpleQueue()
        self._doom = False
        #: Set (by the loop) with every urgent request and doom, cleared by the
        #: worker before it looks at them: what :meth:`_interrupt` reads, so the
        #: check before each handler call is one flag and one clock reading.
        self._poked = False
        self._now = clock.monotonic
        self._stop = threading.Event()

    # -- the loop's side -------------------------------------------------------------

    def request(self, command: tuple[Any, ...]) -> None:
        """Run ``command`` (``commit``, ``claim``, ``close``) before any more handler
        call: at once when idle, else as soon as the running call returns."""
        self._urgent.append(command)
        self._poked = True
        self.send(0, ("wake",))

    def answer(self, payload: Payload | None) -> None:
        """The commit payload for the ``commit_due`` report (``None``: roll back)."""
        self._answered()
        self._answers.put(payload)

    def doom(self) -> None:
        """Roll the open transaction back instead of committing it (module docs)."""
        self._doom = True
        self._poked = True
        self.send(0, ("wake",))

    def stop(self) -> None:
        """Shutdown: give up reconnecting, and roll back instead of committing from
        now on: a ``commit_due`` asked (or still to be asked, for a commit requested
        while an abandoned call ran) gets ``None``, since the loop that would answer
        it is gone. So the worker gets to the ``close`` behind it and closes the sink
        once the abandoned call returns."""
        self._stop.set()
        self._answers.put(None)

    def submit(self, lease: Lease, msgs: Sequence[Any], known: tuple[list[int], int]) -> None:
        self.send(0, ("run", lease, msgs))

    def submit_many(self, runs: Sequence[Run]) -> None:
        """A batch handler gets the runs of several partitions in one call
        (:meth:`_run_together`); a per-message handler, each run as :meth:`submit`."""
        if self._batch is None or len(runs) < 2:
            super().submit_many(runs)
        else:
            self.send(0, ("runs", [(lease, msgs) for lease, msgs, _ in runs]))

    def retry(self, lease: Lease, msg: Any) -> None:
        self.send(0, ("retry", lease, msg))

    def dead_letter(self, lease: Lease, msg: Any, info: DeadLetterInfo, topic: str) -> None:
        self.send(0, ("dead", lease, msg, info, topic))

    def forward(self, lease: Lease, msg: Any, topic: str, headers: Headers) -> None:
        self.send(0, ("moved", lease, msg, topic, headers))

    def end(self, lease: Lease) -> None:
        self.send(0, ("drop", lease))

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        return self.sink.dead_letter_destination(topic, info)

    # -- the worker's side -----------------------------------------------------------

    def handle(self, index: int, command: tuple[Any, ...]) -> None:
        try:
            self._checkpoint()
            kind = command[0]
            if kind == "run":
                self._run(command[1], command[2])
            elif kind == "runs":
                self._run_together(command[1])
            elif kind == "retry":
                self.lane.retry(command[1], command[2], self._out)
            elif kind in ("dead", "moved"):
                self._leave(command)
            elif kind == "drop":
                self.lane.drop(command[1])
            self._checkpoint()
        except SINK_FAULTS as exc:
            self._recover(exc)

    def _interrupt(self) -> bool:
        """Asked before each handler call: something must happen first."""
        return self._poked or self._now() >= self._deadline

    def _open(self) -> SinkTransaction:
        txn = self.txn
        if txn is None:
            txn = self.txn = self.sink.begin()
            self.count = 0
            self._deadline = self.clock.monotonic() + self.txn_seconds
        return txn

    def _isolated(self, msg: Any) -> Any:
        """One message in its own scope of the open transaction."""
        if self._check is not None:
            self._check(msg)
        txn = self._open()
        with txn.message():
            return self._handler(msg, txn.handle)

    def _whole(self, handle: Any) -> Callable[[Sequence[Any]], Any]:
        """The batch handler with ``handle``: one call for a whole piece, each
        message checked first."""
        batch, check = self._batch, self._check
        assert batch is not None

        def call(msgs: Sequence[Any]) -> Any:
            if check is not None:
                for msg in msgs:
                    check(msg)
            return batch(list(msgs), handle)

        return call

    def _bare(self, handle: Any) -> Callable[[Any], Any]:
        """The handler with ``handle``, no scope of its own (an atomic piece's call)."""
        handler, check = self._handler, self._check
        if check is None:
            return lambda msg: handler(msg, handle)

        def call(msg: Any) -> Any:
            check(msg)
            return handler(msg, handle)

        return call

    def _run(self, lease: Lease, msgs: Sequence[Any]) -> None:
        """Run ``msgs``: a piece at a time in one scope (a batch handler: in one
        call); a piece in which anything failed runs again one isolated message at
        a time (a failure costs a re-run of its piece and nothing else changes)."""
        pos, n = 0, len(msgs)
        while pos < n and lease.live:
            self._checkpoint()
            txn = self._open()
            end = min(n, pos + min(PIECE, max(1, self.txn_messages - self.count)))
            piece = msgs[pos:end]
            if not self.lane.holds(lease):
                try:
                    with txn.message():
                        if self._batch is not None:
                            done = self.lane.run_whole(
                                lease, piece, self._whole(txn.handle), self._interrupt
                            )
                        else:
                            done = self.lane.run_atomic(
                                lease, piece, self._bare(txn.handle), self._interrupt
                            )
                except SINK_FAULTS:
                    raise
                except BaseException:
                    pass  # undone: run the piece again, isolated
                else:
                    if done.offsets:
                        self._out.succeeded(lease, done)
                    pos += len(done.offsets)
                    continue
            pos += self.lane.run(lease, piece, self._out, interrupt=self._interrupt)

    def _run_together(self, runs: list[tuple[Lease, Sequence[Any]]]) -> None:
        """Batch handler, several runs: one call for a piece of each run whose
        partition holds no key (up to :data:`PIECE` messages of each, and what the
        transaction still takes), in one scope; if anything failed, each run's piece
        again one isolated message at a time, as :meth:`_run` does. Once fewer than
        two runs can go together, the rest go through :meth:`_run` one by one."""
        left = [_Run(lease, msgs) for lease, msgs in runs]
        while True:
            left = [run for run in left if run.pos < len(run.msgs) and run.lease.live]
            together = [run for run in left if not self.lane.holds(run.lease)]
            if len(together) < 2:
                for run in left:
                    self._run(run.lease, run.msgs[run.pos :])
                return
            self._checkpoint()
            txn = self._open()
            room = max(1, self.txn_messages - self.count)
            parts: list[tuple[_Run, Sequence[Any]]] = []
            for run in together:
                if room <= 0:
                    break
                piece = run.msgs[run.pos : run.pos + min(PIECE, room)]
                parts.append((run, piece))
                room -= len(piece)
            try:
                with txn.message():
                    dones: list[Done] | None = self.lane.run_whole_many(
                        [(run.lease, piece) for run, piece in parts],
                        self._whole(txn.handle), self._interrupt,
                    )  # fmt: skip
            except SINK_FAULTS:
                raise
            except BaseException:
                dones = None  # undone: each piece again, isolated
            for k, (run, piece) in enumerate(parts):
                if dones is None:
                    run.pos += self.lane.run(run.lease, piece, self._out, interrupt=self._interrupt)
                elif dones[k].offsets:
                    self._out.succeeded(run.lease, dones[k])
                    run.pos += len(dones[k].offsets)

    def _leave(self, command: tuple[Any, ...]) -> None:
        """A dead letter (or a retry record) in the transaction, then its key goes on."""
        kind, lease, msg = command[0], command[1], command[2]
        if not lease.live:
            return
        txn = self._open()
        if kind == "dead":
            txn.dead_letter(command[4], msg, command[3])
            self.report(("dead", lease, msg, command[3]))
        else:
            txn.forward(command[3], msg, command[4])
            self.report(("moved", lease, msg))
        self.count += 1
        self.lane.release(lease, msg.key(), self._out)

    def _checkpoint(self) -> None:
        """Between handler calls: a doom, urgent requests, a due transaction."""
        self._poked = False  # before looking: a later poke is seen at the next call
        if self._doom:
            self._doom = False
            self._roll_back()
            self.report(("aborted",))
        while self._urgent:
            command = self._urgent.popleft()
            kind = command[0]
            if kind == "commit":
                self._commit()
            elif kind == "claim":
                if self.txn is not None:
                    self._commit()  # a claim is not allowed with a transaction open
                positions = self.sink.claim(command[1], default_start=command[3].__getitem__)
                self.report(("claimed", command[2], positions))
            elif kind == "close":
                self._roll_back()
                self.sink.close()
                self.report(("closed",))
        if self.txn is not None and (
            self.count >= self.txn_messages or self.clock.monotonic() >= self._deadline
        ):
            self._commit()

    def _commit(self) -> None:
        """The commit handshake (module docs)."""
        payload = self._ask_loop(("commit_due",), self._answers)
        txn, self.txn = self.txn, None
        self.count = 0
        self._deadline = float("inf")
        if payload is None or self._doom:
            if txn is not None:
                txn.abort()
            if self._doom:
                self._doom = False
                self.report(("aborted",))
            return
        if txn is None:
            if not payload:
                self.report(("committed", payload, 0.0))
                return
            txn = self.sink.begin()
        started = time.perf_counter()
        try:
            txn.commit(payload)
        except Fenced as exc:
            self.report(("fenced", exc))
            return
        self.report(("committed", payload, time.perf_counter() - started))

    def _roll_back(self) -> None:
        txn, self.txn = self.txn, None
        self.count = 0
        self._deadline = float("inf")
        if txn is not None:
            txn.abort()

    def _recover(self, fault: BaseException) -> None:
        """The sink failed: drop the transaction, reconnect with backoff (module docs)."""
        if self.txn is not None:
            with suppress(Exception):  # the connection is gone: the database rolls it back
                self.txn.abort()
        self.txn = None
        self.count = 0
        self._deadline = float("inf")
        self.report(("sink_lost", fault))
        wait, cap = BACKOFF
        give_up = time.monotonic() + self.reconnect_seconds
        last: BaseException = fault
        while not self._stop.is_set():
            try:
                self.sink.reconnect()
            except SinkUnavailable as exc:
                last = exc
            else:
                self.report(("sink_back",))
                return
            if time.monotonic() >= give_up:
                self.report(("fatal", SinkGaveUp(last, self.reconnect_seconds)))
                return
            self._stop.wait(min(wait, max(0.0, give_up - time.monotonic())))
            wait = min(wait * 2, cap)


@dataclass(slots=True)
class _Run:
    """One partition's run inside :meth:`TransactionWorker._run_together`: its
    messages and how many of them are done."""

    lease: Lease
    msgs: Sequence[Any]
    pos: int = 0


class _CountingReport(_ReportTo):
    """Reports of the transaction worker, counting what is in the transaction."""

    def __init__(self, workers: TransactionWorker) -> None:
        super().__init__(workers)
        self._txn = workers

    def succeeded(self, lease: Lease, done: Done) -> None:
        self._txn.count += len(done.offsets)
        # The loop needs successes by the commit handshake, which wakes it: a
        # wake per piece only costs both threads a context switch and the GIL.
        self._txn.report(("ok", lease, done), wake=False)


class SinkGaveUp(RuntimeFailure):
    """The sink stayed unavailable for ``--sink-retry-seconds``."""

    def __init__(self, cause: BaseException, seconds: float) -> None:
        text = cause.problem if isinstance(cause, RuntimeFailure) else f"{cause!r}"
        super().__init__(
            f"the sink stayed unavailable for {seconds:g} s: {text}",
            "restart htmqc run once the database is back (it resumes from the stored "
            "positions), or raise --sink-retry-seconds",
        )
        self.cause = cause


def positions_of(report: tuple[Any, ...]) -> dict[TopicPartition, Position]:
    """The positions of a ``claimed`` report."""
    positions: dict[TopicPartition, Position] = report[2]
    return positions
