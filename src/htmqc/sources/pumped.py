"""The blocking :class:`~htmqc.ports.ConsumerPort` shared by the non-Kafka sources
(:mod:`htmqc.sources.nats`, :mod:`htmqc.sources.rabbitmq`, :mod:`htmqc.sources.pulsar`).

Contract
--------
A :class:`PumpedConsumer` runs its client library on a private asyncio thread.
Each assigned, unpaused partition has a *pump* task there that reads the
partition's stream from its position on into a bounded buffer;
:meth:`PumpedConsumer.consume` hands buffered messages out on the caller's
thread, round robin over the partitions, and moves each partition's position
one past the last message handed out. ``seek`` (and a new assignment) bump the
partition's *generation*, drop its buffer and start a new pump from the new
position; a pump of an older generation stops. ``pause`` hides the buffer and
stops fetching. Commits are stored by the subclass (:meth:`_store_commits`) and
their outcome is reported through ``on_commit(err, parts)`` inside a later
``consume``, as confluent-kafka does. One member holds the group's *lease*
(:meth:`_hold_lease`): until it does, nothing is assigned; while it is in
doubt (``_lease_until`` passed), nothing is handed out; once lost,
``consume`` raises. A source that shares a topic's partitions between members
calls :meth:`_change_assignment` as its membership moves them: a partition lost
goes to ``on_revoke`` at the start of the next ``consume`` (before anything is
handed out, and before any ``on_assign``), and :meth:`_released` hears when the
runtime let go of it.

A subclass supplies the source's own parts: ``SOURCE`` and ``OPTION`` (names in
messages), :meth:`_stream` and :meth:`_check_topic`, :meth:`partitions`,
:meth:`_session` (one reading session of a pump), :meth:`_hold_lease`,
:meth:`_read_commits`, :meth:`_store_commits`, :meth:`_watermarks_of`,
:meth:`_lost_lease` and :meth:`_close`. No offset *decision* is taken here: the
positions are the ones the runtime asks for and the ones handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.dlq.record import retry_topic
from htmqc.errors import HtmqcError, RuntimeFailure, UsageError

log = logging.getLogger("htmqc.sources")

T = TypeVar("T")

#: librdkafka's "no offset" (``OFFSET_INVALID``).
OFFSET_INVALID = -1001
#: Kafka's CreateTime timestamp type.
TIMESTAMP_CREATE_TIME = 1
#: Messages one fetch asks for.
FETCH_BATCH = 1000
#: Messages a partition's buffer holds before its pump waits.
BUFFER_MESSAGES = 4000
#: Seconds a blocking call into the client thread waits at most.
CALL_TIMEOUT = 30.0
#: The end of a retry topic's name (``TOPIC.retry``, ``--retry-topic``).
RETRY_SUFFIX = retry_topic("")
#: Topic and group names: stream names, subjects, keys and references must stay plain.
NAME = re.compile(r"[A-Za-z0-9_-]+")


def stream_name(topic: str, partition: int) -> str:
    """The stream of ``topic``'s ``partition``: ``TOPIC-P`` (every non-Kafka source)."""
    return f"{topic}-{partition}"


def check_plain(what: str, name: str, names: str) -> None:
    """:raises UsageError: ``name`` is not letters, digits, ``_`` and ``-`` (it
    cannot name ``names``, e.g. "a NATS stream")."""
    if not NAME.fullmatch(name):
        raise UsageError(
            f"{what} {name!r} cannot name {names}", "use letters, digits, '_' and '-' only"
        )


# -- messages -------------------------------------------------------------------------------


class LogMessage:
    """A consumed message as the runtime reads it (:class:`htmqc.ports.Message`).

    ``offset()`` is the source's dense position; ``timestamp()`` is
    ``(CreateTime, milliseconds)`` of the server's store time."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_topic", "_ts", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]] | None,
        timestamp_ms: int,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._ts = timestamp_ms

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, self._ts)

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._topic}/{self._partition}@{self._offset})"


# -- the consumer -----------------------------------------------------------------------------


def _tp(topic: str, partition: int, offset: int, metadata: str | None) -> KafkaTP:
    """A confluent-kafka ``TopicPartition`` (whose ``metadata`` may not be ``None``)."""
    if metadata is None:
        return KafkaTP(topic, partition, offset)
    return KafkaTP(topic, partition, offset, metadata=metadata)


TP = tuple[str, int]
CommitCallback = Callable[[Any, list[KafkaTP]], None]
RebalanceCallback = Callable[[Any, list[KafkaTP]], None]


@dataclass(eq=False)
class _Partition:
    """One assigned partition: its fetch position and buffer (guarded by the
    consumer's condition), its pump (on the client thread)."""

    topic: str
    partition: int
    #: Next offset to hand out (``position``); ``None`` until known (assigned without one).
    position: int | None
    paused: bool = False
    #: Bumped by every seek / unassign: a pump of an older generation stops.
    generation: int = 0
    buffer: deque[LogMessage] = field(default_factory=deque)
    #: Set (on the client loop) to wake the pump.
    wake: asyncio.Event | None = None
    #: The pump waits for room or a resume.
    idle: bool = False



class PumpedConsumer:
    """The blocking consumer port over a source's asyncio client (module docs).

    ``group``: the name commits and the lease are kept under;
    ``on_commit(err, partitions)``: the outcome of each asynchronous commit,
    called on the thread that calls :meth:`consume`."""

    #: The source's name in messages ("NATS"), its ``--source`` value ("nats"), and
    #: what its topic names name ("a NATS stream").
    SOURCE = ""
    OPTION = ""
    NAMES = ""

    def __init__(
        self,
        group: str,
        *,
        on_commit: CommitCallback | None = None,
        fetch_batch: int = FETCH_BATCH,
        buffer_messages: int = BUFFER_MESSAGES,
        thread_name: str = "htmqc-source",
    ) -> None:
        self._lease_lost = False
        #: Monotonic time until which the lease is surely ours (renewed in time).
        self._lease_until = 0.0
        self._lease_key: str | None = None
        self.group = group
        self.on_commit = on_commit
        self.fetch_batch = fetch_batch
        self.buffer_messages = max(buffer_messages, fetch_batch)
        self._cond = threading.Condition()
        self._parts: dict[TP, _Partition] = {}
        self._acks: deque[tuple[Any, list[KafkaTP]]] = deque()
        self._callbacks: tuple[RebalanceCallback | None, ...] = (None, None, None)
        self._to_assign: list[KafkaTP] | None = None
        self._to_revoke: list[KafkaTP] | None = None
        self._watermarks: dict[TP, tuple[int, int]] = {}
        self._rotate = 0
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=thread_name, daemon=True
        )
        self._thread.start()
        self._commit_lock: asyncio.Lock | None = None
        self._pumps: set[asyncio.Task[Any]] = set()

    # -- what a source supplies ---------------------------------------------------------------

    def _stream(self, topic: str, partition: int) -> str:
        """The name of ``topic``'s ``partition``'s stream."""
        return stream_name(topic, partition)

    def _check_topic(self, topic: str) -> None:
        """:raises UsageError: ``topic`` cannot name the source's streams."""
        check_plain("topic", topic, self.NAMES)

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (0: none)."""
        raise NotImplementedError

    def _lost_lease(self) -> RuntimeFailure:
        """The failure :meth:`consume` raises once the lease is lost."""
        raise NotImplementedError

    async def _session(self, part: _Partition, generation: int) -> None:
        """Fetch ``part`` from its position into its buffer while ``generation``
        is current (returns then); raises to start over from the position."""
        raise NotImplementedError

    async def _hold_lease(self, parts: list[KafkaTP]) -> None:
        """Take the lease (waiting as a standby), set ``_lease_until`` and
        ``_to_assign = parts``; keep it until :meth:`close`, setting
        ``_lease_lost`` if it goes."""
        raise NotImplementedError

    async def _watermarks_of(self, tp: TP) -> tuple[int, int]:
        """``(low, high)`` of a partition, also kept in ``_watermarks``."""
        raise NotImplementedError

    async def _read_commits(self, tps: Iterable[TP]) -> dict[TP, tuple[int, str | None]]:
        """The group's stored commits ``(offset, metadata)`` of ``tps`` that exist."""
        raise NotImplementedError

    async def _store_commits(self, parts: Sequence[KafkaTP]) -> None:
        """Store ``parts`` durably (returns once stored)."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Stop the pumps, release the lease, close the connection(s)."""
        raise NotImplementedError

    # -- the client thread ----------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the client thread and wait for it (at most ``timeout`` s)."""
        return self._submit(coro).result(timeout if timeout >= 0 else None)

    def _stop_loop(self) -> None:
        stop_loop(self._loop, self._thread)

    # -- ConsumerPort ---------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Take the partitions of ``topics``: one topic, or one topic and its retry
        topic (``[T, T.retry]``, ``--retry-topic``: a subclass names the retry
        topic's one partition, ``_stream(T.retry, 0)``). Once this member holds the
        group's lease (named after the first topic), ``on_assign`` gets them all
        inside a :meth:`consume` (module docs: one member; a second one waits as a
        standby).

        :raises UsageError: other topics, a bad name, or no such topic.
        """
        topic = topics[0] if topics else ""
        if topics not in ([topic], [topic, retry_topic(topic)]):
            raise UsageError(
                f"a {self.SOURCE} source consumes one topic and its retry topic",
                "pass one --topic (and --retry-topic to read TOPIC.retry too)",
            )
        self._check_topic(topic)
        parts = []
        for name in topics:
            count = self.partitions(name)
            if count == 0:
                raise UsageError(
                    f"topic {name!r} has no streams {self._stream(name, 0)}, ... on "
                    f"{self.SOURCE}",
                    "run with --retry-topic: it makes them" if name != topic
                    else "create them (pass --create-topic PARTITIONS)",
                )
            parts += [KafkaTP(name, p) for p in range(count)]
        self._callbacks = (on_assign, on_revoke, on_lost)
        self._lease_key = f"{self.group}.{topic}"
        self._loop.call_soon_threadsafe(self._track, self._hold_lease(parts))

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        """Up to ``num_messages`` messages of the unpaused partitions, waiting at
        most ``timeout`` seconds (negative: until some arrive) for the first.
        Rebalance and commit callbacks run here first. Nothing is handed out
        while the lease is in doubt (the source says when: NATS's key not renewed
        within 80 % of its life, RabbitMQ's queue connection or Pulsar's
        subscription disconnected).

        :raises RuntimeFailure: the lease is lost, or could not be taken at all:
            the run must stop.
        """
        self._callbacks_due()
        out = self._take(num_messages)
        if out or timeout == 0:
            return out
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                if (
                    self._acks
                    or self._to_assign is not None
                    or self._to_revoke is not None
                    or self._lease_lost
                ):
                    break
                if time.monotonic() < self._lease_until and any(
                    p.buffer and not p.paused for p in self._parts.values()
                ):
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
        self._callbacks_due()
        return self._take(num_messages)

    def _callbacks_due(self) -> None:
        if self._lease_lost:
            raise self._lost_lease()
        with self._cond:
            gone, self._to_revoke = self._to_revoke, None
        self._deliver(gone, self._callbacks[1], self.incremental_unassign)
        with self._cond:
            parts, self._to_assign = self._to_assign, None
        self._deliver(parts, self._callbacks[0], self.incremental_assign)
        while self._acks:
            err, parts = self._acks.popleft()
            if self.on_commit is not None:
                self.on_commit(err, parts)

    def _deliver(
        self,
        parts: list[KafkaTP] | None,
        callback: RebalanceCallback | None,
        default: Callable[[list[KafkaTP]], None],
    ) -> None:
        """Hand an assignment change to the runtime's callback, as librdkafka
        does, or apply it directly when none was given to ``subscribe``."""
        if parts is None:
            return
        if callback is not None:
            callback(self, parts)
        else:
            default(parts)

    def _take(self, num: int) -> list[Any]:
        out: list[Any] = []
        wake: list[_Partition] = []
        with self._cond:
            if time.monotonic() >= self._lease_until:
                return out  # the lease is in doubt (or not taken yet)
            parts = [p for p in self._parts.values() if p.buffer and not p.paused]
            if not parts:
                return out
            self._rotate = (self._rotate + 1) % len(parts)
            for part in parts[self._rotate:] + parts[: self._rotate]:
                room = num - len(out)
                if room <= 0:
                    break
                buf = part.buffer
                before = len(buf)
                if before <= room:
                    out.extend(buf)
                    buf.clear()
                else:
                    out.extend(buf.popleft() for _ in range(room))
                part.position = out[-1].offset() + 1
                if part.idle and before > len(buf):
                    part.idle = False
                    wake.append(part)
        for part in wake:
            self._wake(part)
        return out

    def _wake(self, part: _Partition) -> None:
        event = part.wake
        if event is not None:
            self._loop.call_soon_threadsafe(event.set)

    def incremental_assign(self, partitions: list[KafkaTP]) -> None:
        """Take ``partitions``, each at its offset if given (``>= 0``), else at the
        group's committed offset, else at the log start."""
        for p in partitions:
            tp = (p.topic, p.partition)
            with self._cond:
                if tp in self._parts:
                    continue
                offset = p.offset if p.offset is not None and p.offset >= 0 else None
                part = self._parts[tp] = _Partition(p.topic, p.partition, offset)
            self._loop.call_soon_threadsafe(self._start_pump, part, part.generation)

    def incremental_unassign(self, partitions: list[KafkaTP]) -> None:
        """Let go of ``partitions`` (their pumps stop, buffers dropped)."""
        with self._cond:
            for p in partitions:
                part = self._parts.pop((p.topic, p.partition), None)
                if part is not None:
                    part.generation += 1
                    part.buffer.clear()
                    self._wake(part)
        self._released([(p.topic, p.partition) for p in partitions])

    def _released(self, tps: list[TP]) -> None:
        """The runtime let go of ``tps`` (a source sharing partitions tells their
        next owner); called on the caller's thread."""

    def _change_assignment(self, gained: Sequence[TP], lost: Sequence[TP]) -> list[TP]:
        """The membership moved partitions (client thread): ``lost`` ones are
        revoked, then ``gained`` ones assigned, at the start of the next
        :meth:`consume`. A partition lost before its assignment was delivered is
        not assigned, nor revoked: those are returned (the runtime never had them).
        One gained back before its revoke was delivered is revoked, then assigned."""
        skipped: list[TP] = []
        with self._cond:
            if lost:
                pending = self._to_assign or []
                undelivered = {(p.topic, p.partition) for p in pending}
                gone = set(lost)
                self._to_assign = [
                    p for p in pending if (p.topic, p.partition) not in gone
                ] or None
                for tp in lost:
                    if tp in undelivered and tp not in self._parts:
                        skipped.append(tp)
                    else:
                        self._to_revoke = [*(self._to_revoke or []), KafkaTP(*tp)]
            if gained:
                self._to_assign = [*(self._to_assign or []), *(KafkaTP(*tp) for tp in gained)]
            self._cond.notify_all()
        return skipped

    def pause(self, partitions: list[KafkaTP]) -> None:
        """Hand out nothing of ``partitions`` and stop fetching them."""
        with self._cond:
            for p in partitions:
                part = self._parts.get((p.topic, p.partition))
                if part is not None:
                    part.paused = True

    def resume(self, partitions: list[KafkaTP]) -> None:
        """Undo :meth:`pause`."""
        with self._cond:
            for p in partitions:
                part = self._parts.get((p.topic, p.partition))
                if part is not None and part.paused:
                    part.paused = False
                    self._wake(part)
            self._cond.notify_all()

    def seek(self, partition: KafkaTP) -> None:
        """Fetch ``partition`` from its offset on: the buffer is dropped and a new
        pull consumer starts at that sequence.

        :raises KafkaException: the partition is not assigned (as librdkafka).
        """
        tp = (partition.topic, partition.partition)
        offset = partition.offset
        with self._cond:
            part = self._parts.get(tp)
            if part is None or offset is None or offset < 0:
                raise KafkaException(
                    KafkaError(KafkaError._STATE, f"cannot seek {tp[0]}/{tp[1]} to {offset}")
                )
            part.generation += 1
            part.buffer.clear()
            part.position = offset
            generation = part.generation
            self._wake(part)
        self._loop.call_soon_threadsafe(self._start_pump, part, generation)

    def position(self, partitions: list[KafkaTP]) -> list[KafkaTP]:
        """Each partition's next offset to hand out (``OFFSET_INVALID`` if unknown)."""
        out = []
        with self._cond:
            for p in partitions:
                part = self._parts.get((p.topic, p.partition))
                pos = part.position if part is not None else None
                out.append(KafkaTP(p.topic, p.partition, OFFSET_INVALID if pos is None else pos))
        return out

    def committed(self, partitions: list[KafkaTP], timeout: float = -1) -> list[KafkaTP]:
        """The group's stored commits (offset and metadata), ``OFFSET_INVALID`` where none."""
        wait = CALL_TIMEOUT if timeout < 0 else timeout
        got = self._call(self._read_commits([(p.topic, p.partition) for p in partitions]), wait)
        out = []
        for p in partitions:
            entry = got.get((p.topic, p.partition))
            if entry is None:
                out.append(KafkaTP(p.topic, p.partition, OFFSET_INVALID))
            else:
                out.append(_tp(p.topic, p.partition, entry[0], entry[1]))
        return out

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        """Store ``offsets=[TopicPartition(topic, partition, offset, metadata=...)]``.
        ``asynchronous=True`` (default, as confluent-kafka): the outcome comes to
        ``on_commit`` inside a later :meth:`consume`; ``False``: wait and return
        the partitions.

        :raises KafkaException: a synchronous commit failed.
        :raises ValueError: no ``offsets`` (committing a message or the current
            positions is not supported).
        """
        offsets = kwargs.get("offsets", args[0] if args else None)
        if not offsets:
            raise ValueError(f"{type(self).__name__}.commit needs offsets=[...]")
        parts = [_tp(p.topic, p.partition, p.offset, p.metadata) for p in offsets]
        future = self._submit(self._store_commits(parts))
        if kwargs.get("asynchronous", True):

            def done(f: Future[None]) -> None:
                exc = f.exception()
                err = None if exc is None else KafkaError(KafkaError._TRANSPORT, str(exc))
                with self._cond:
                    self._acks.append((err, parts))
                    self._cond.notify_all()

            future.add_done_callback(done)
            return None
        try:
            future.result(CALL_TIMEOUT)
        except Exception as exc:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, str(exc))) from None
        return parts

    def get_watermark_offsets(
        self, partition: KafkaTP, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int] | None:
        """``(low, high)``: ``first_seq - 1`` and ``last_seq`` of the partition's
        stream. ``cached``: the last value read (refreshed in the background),
        ``None`` before the first."""
        tp = (partition.topic, partition.partition)
        if cached:
            self._submit(self._watermarks_of(tp))
            return self._watermarks.get(tp)
        wait = CALL_TIMEOUT if timeout < 0 else timeout
        return self._call(self._watermarks_of(tp), wait)

    def close(self) -> None:
        """Stop every pump, delete their pull consumers, drain and close the
        connection. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for part in self._parts.values():
                part.generation += 1
                self._wake(part)
            self._parts.clear()
            self._cond.notify_all()
        with contextlib.suppress(Exception):
            self._call(self._close(), 10)
        self._stop_loop()


    # -- coroutines (client thread) ------------------------------------------------------------

    def _start_pump(self, part: _Partition, generation: int) -> None:
        if part.wake is None:
            part.wake = asyncio.Event()
        self._track(self._pump(part, generation))

    def _track(self, coro: Coroutine[Any, Any, Any], what: str = "a background task") -> None:
        """Run ``coro`` (``what`` it does) as a task :meth:`close` cancels and waits
        for. Its failure, which nobody awaits, is one warning line, not asyncio's
        "exception was never retrieved" traceback."""
        task = self._loop.create_task(coro, name=what)
        self._pumps.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._pumps.discard(task)
        if task.cancelled() or task.exception() is None or self._closed:
            return
        exc = task.exception()
        line = exc.line() if isinstance(exc, HtmqcError) else f"{type(exc).__name__}: {exc}"
        log.warning("%s failed: %s", task.get_name(), line)

    def _current(self, part: _Partition, generation: int) -> bool:
        return not self._closed and part.generation == generation

    async def _pump(self, part: _Partition, generation: int) -> None:
        """Fetch ``part`` into its buffer while ``generation`` is current: one
        *session* (an inbox subscription and an ephemeral pull consumer from the
        position on) at a time; a failure ends the session, drops the buffer and
        starts another from the position after a backoff."""
        failures = 0
        last_failure = 0.0
        while self._current(part, generation):
            try:
                await self._session(part, generation)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._current(part, generation):
                    return  # closed or re-pumped meanwhile: the failure is of no interest
                if time.monotonic() - last_failure > 60:
                    failures = 0  # a new incident
                last_failure = time.monotonic()
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "fetching %s/%d failed (%d in a row): %s: %s",
                        part.topic, part.partition, failures, type(exc).__name__, exc,
                    )
                with self._cond:  # fetched again from the position on
                    if self._current(part, generation):
                        part.buffer.clear()
                await asyncio.sleep(min(2.0, 0.1 * failures))

    async def _start_of(self, part: _Partition) -> int:
        """Where a partition assigned without an offset starts: the committed
        offset, else the log start."""
        got = await self._read_commits([(part.topic, part.partition)])
        entry = got.get((part.topic, part.partition))
        if entry is not None:
            return entry[0]
        low, _high = await self._watermarks_of((part.topic, part.partition))
        return low



def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop ``loop`` (running on ``thread``), join the thread, close the loop."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()



class Deliveries:
    """The delivery side of a source's dead-letter producer: each publish is a
    future on the client thread; ``on_delivery(err, None)`` is called when it
    settles and :meth:`flush` waits for them."""

    def __init__(self) -> None:
        self._pending: list[Future[Any]] = []
        self._lock = threading.Lock()

    def track(self, future: Future[Any], callback: Callable[[Any, None], None] | None) -> None:
        """Keep ``future`` for :meth:`flush`; tell ``callback`` its outcome."""
        if callback is not None:
            future.add_done_callback(
                lambda f: callback(
                    None if f.exception() is None
                    else KafkaError(KafkaError._MSG_TIMED_OUT, str(f.exception())),
                    None,
                )
            )
        with self._lock:
            self._pending.append(future)

    def flush(self, timeout: float = -1) -> int:
        """Wait for every published record's ack; return how many are still unacked."""
        with self._lock:
            pending, self._pending = self._pending, []
        deadline = None if timeout < 0 else time.monotonic() + timeout
        left = 0
        for future in pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                future.result(wait)
            except TimeoutError:
                left += 1
            except Exception:
                pass  # reported through on_delivery
        return left


# -- numbered test messages (``produce``) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Numbered:
    """Message ``id`` of :mod:`htmqc.produce`'s format: key ``k{id % keys}`` (``None``
    with no keys), value the zero-padded id; it goes to partition ``id % partitions``."""

    id: int
    partition: int
    value: bytes
    key: bytes | None


class LogClient(Protocol):
    """What :class:`NumberedProducer` needs of a source's blocking client."""

    def create_topic(self, topic: str, partitions: int) -> None: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=LogClient)


class NumberedProducer(Generic[C]):
    """A source's ``produce(bootstrap, topic, count, *, partitions, keys=100,
    size=100, start_id=0, client=None)``: write ``count`` numbered messages
    (:class:`Numbered`, ids from ``start_id``; the id also in the message's
    :data:`htmqc.produce.ID_HEADER`) to ``topic``, creating it with ``partitions``
    partitions if missing, and return ``count``. ``client`` (else one of ``connect``,
    closed afterwards) writes them: the source supplies ``publish(client, topic,
    partitions, messages)``, which publishes them in order, waits for every one and
    returns how many."""

    def __init__(
        self,
        connect: Callable[[str], C],
        publish: Callable[[C, str, int, Iterable[Numbered]], int],
    ) -> None:
        self.connect = connect
        self.publish = publish

    def __call__(
        self,
        bootstrap: str,
        topic: str,
        count: int,
        *,
        partitions: int,
        keys: int = 100,
        size: int = 100,
        start_id: int = 0,
        client: C | None = None,
    ) -> int:
        from htmqc.produce import message_key, message_value

        messages = (
            Numbered(i, i % partitions, message_value(i, size), message_key(i, keys))
            for i in range(start_id, start_id + count)
        )
        own = client is None
        log = client if client is not None else self.connect(bootstrap)
        try:
            log.create_topic(topic, partitions)
            return self.publish(log, topic, partitions, messages)
        finally:
            if own:
                log.close()
