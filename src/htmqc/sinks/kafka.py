"""The Kafka→Kafka sink: output records and input offsets in one Kafka transaction.

Theory of operation
-------------------
A transactional producer (``transactional.id`` = ``htmqc-GROUP-MEMBER``) opens a
Kafka transaction per :meth:`KafkaSink.begin`. The handler gets an
:class:`Output`; what it sends inside ``txn.message()`` is buffered and handed
to the producer only when the block exits normally, so a failed message sends
nothing. ``commit`` adds the input offsets to the transaction
(``send_offsets_to_transaction`` with the consumer's group metadata) and
commits it: downstream ``read_committed`` readers see the output exactly when
the group's committed offsets cover the input. ``finished_above`` travels in the
offset-commit metadata (:func:`~htmqc.sinks.encoding.encode_metadata`), so a
restart skips messages that finished out of order.

Fencing is Kafka's: the broker rejects offsets sent with a stale group
generation (the partition was reassigned since) and a producer whose epoch was
bumped by a newer producer with the same ``transactional.id``. Those errors
become :class:`~htmqc.sinks.base.Fenced`, after aborting. ``claim`` reads the
group's committed offsets through the consumer and hands out local fence
tokens; a commit carrying a token older than the partition's latest claim on
this member is rejected too.

The consumer: this sink needs the runtime's consumer for
``consumer_group_metadata()``, which the runtime reads through
:meth:`KafkaSink.before_commit` on the consumer's own thread right before each
commit (the commit itself runs on the runtime's transaction thread, and a call
into the group consumer from another thread may never return while the
consumer is in use). The runtime calls :meth:`KafkaSink.bind` with it before
the first ``claim``; the consumer should use ``isolation.level=read_committed``
and ``enable.auto.commit=false``. For the same reason ``claim`` reads the
group's committed offsets with a consumer of its own that never joins the group.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from htmqc.core.decisions import Commit, TopicPartition
from htmqc.core.metadata_budget import DEFAULT_LIMIT
from htmqc.dlq.headers import dlq_headers
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_defaults import producer_config
from htmqc.ports import ConsumerPort, Headers, Message
from htmqc.sinks.base import (
    Fenced,
    Position,
    SinkStateError,
    SinkUnavailable,
    check_no_transaction,
    partition_name,
)
from htmqc.sinks.encoding import decode_finished, decode_metadata, encode_metadata
from htmqc.sinks.kafka_positions import (
    DEFAULT_POSITIONS_TOPIC,
    ensure_topic,
    read_positions,
    record_key,
    record_value,
)

log = logging.getLogger("htmqc.sinks")

#: Broker errors that mean "another owner has the partition or the transactional id".
FENCING_ERRORS = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
    }
)
#: Of those, the ones that make the producer itself unusable.
PRODUCER_FENCING_ERRORS = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
#: Group-coordinator errors librdkafka hands to ``committed()`` while the coordinator
#: moves or loads (a new offsets-topic leader, a broker restart); asked again until
#: the sink's timeout.
COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)
_COORDINATOR_RETRY_SECONDS = 0.2
#: Kafka's default ``offset.metadata.max.bytes``.
METADATA_MAX_BYTES = DEFAULT_LIMIT

#: How long past its own timeout a transactional call of librdkafka may run
#: before the sink gives up on it and on its producer (:func:`_bounded`).
STUCK_GRACE_SECONDS = 5.0

Record = tuple[str, Any, Any, Any]  # topic, value, key, headers

if TYPE_CHECKING:
    from htmqc.dlq.record import DeadLetterInfo

#: The open message scope of the running code: its transaction and its buffer.
#: A context variable, not a thread-local, so that an ``async def`` handler,
#: which runs on the runtime's event-loop thread in a copy of the calling
#: worker's context, sends into the scope its worker opened.
_SCOPE: ContextVar[tuple[KafkaTransaction, list[Record]] | None] = ContextVar(
    "htmqc_kafka_scope", default=None
)


class Output:
    """What a Kafka→Kafka handler receives: ``send`` records into the open
    transaction. ``topic`` is the sink's output topic (``kafka:TOPIC``)."""

    def __init__(self, txn: KafkaTransaction, topic: str) -> None:
        self.topic = topic
        self._txn = txn

    def send(
        self,
        topic: str | None,
        value: str | bytes | None,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]] | None = None,
    ) -> None:
        """Send a record to ``topic`` (``None``: the sink's output topic). Inside
        ``txn.message()`` it is produced when the message succeeds."""
        self._txn.send((topic or self.topic, value, key, headers))


class KafkaSink:
    """Exactly-once Kafka→Kafka through a transactional producer (see module docs)."""

    name = "kafka"
    writes_kafka = True
    #: Each transaction commits the input offsets to the group itself.
    commits_group_offsets = True

    def __init__(
        self,
        topic: str,
        *,
        bootstrap: str,
        kafka_config: Mapping[str, Any] | None = None,
        member_id: str | None = None,
        timeout: float = 30.0,
        positions_topic: str = DEFAULT_POSITIONS_TOPIC,
    ) -> None:
        self.topic = topic
        self.positions_topic = positions_topic
        self.bootstrap = bootstrap
        self.member_id = member_id or uuid.uuid4().hex[:12]
        self.timeout = timeout
        self.group = ""
        self._extra = dict(kafka_config or {})
        self._producer: Producer | None = None
        self._consumer: Any = None
        self._offsets: Consumer | None = None
        self._group_metadata: Any = None
        self._txn: KafkaTransaction | None = None
        self._fences: dict[TopicPartition, int] = {}
        self._last_fence = 0
        #: The broker's ``offset.metadata.max.bytes`` (the runtime sets it from
        #: ``--commit-metadata-bytes``; its intake keeps every commit within it).
        self.metadata_max_bytes = METADATA_MAX_BYTES
        #: Producers given up while stuck in librdkafka (:meth:`_abandon`).
        self._abandoned: list[Producer] = []

    @property
    def transactional_id(self) -> str:
        """``htmqc-GROUP-MEMBER``: a restarted member with the same ``member_id``
        fences its predecessor's producer."""
        return f"htmqc-{self.group}-{self.member_id}"

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """The DLQ topic of ``info``: ``info.target(topic)``."""
        return info.target(topic)

    def serve_async_handler(self, loop: asyncio.AbstractEventLoop) -> bool:
        """``tx.send`` only queues a record in the producer (it does not wait),
        so an ``async def`` handler keeps the synchronous ``Output``: ``False``."""
        return False

    def bind(self, consumer: ConsumerPort) -> None:
        """Give the sink the runtime's ``confluent_kafka.Consumer`` (needed by
        ``claim`` and ``commit``). Call before the first ``claim``."""
        self._consumer = consumer

    def open(self, group: str) -> None:
        """Create the transactional producer and ``init_transactions`` (fences
        an older producer with the same transactional id)."""
        if not group:
            raise UsageError("the consumer group name is empty", "pass --group NAME")
        self.group = group
        if self._producer is None:
            self._producer = self._new_producer()
            ensure_topic(self.bootstrap, self.positions_topic, self._extra, self.timeout)

    def _new_producer(self) -> Producer:
        config = producer_config(self.bootstrap, self._extra)
        config.update({"transactional.id": self.transactional_id, "enable.idempotence": True})
        try:
            producer = Producer(config)
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            raise RuntimeFailure(
                f"kafka sink: cannot start a transactional producer on {self.bootstrap}: "
                f"{_error_text(exc)}",
                "check that the broker runs, is reachable, and supports transactions",
            ) from exc
        return producer

    def claim(
        self,
        tps: Sequence[TopicPartition],
        *,
        default_start: Callable[[TopicPartition], int],
    ) -> dict[TopicPartition, Position]:
        """The group's committed offsets (and finished-above metadata) for ``tps``."""
        self._bound()
        consumer = self._offsets_reader()
        check_no_transaction(self.name, "claim", self._txn)
        ordered = sorted(set(tps))
        if not ordered:
            return {}
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                stored = consumer.committed(
                    [KafkaTopicPartition(t, p) for t, p in ordered],
                    timeout=max(0.1, deadline - time.monotonic()),
                )
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                moving = err is not None and err.code() in COORDINATOR_MOVING
                if moving and time.monotonic() < deadline:
                    time.sleep(_COORDINATOR_RETRY_SECONDS)
                    continue
                raise RuntimeFailure(
                    f"kafka sink: reading the committed offsets of group {self.group!r} "
                    f"failed: {_error_text(exc)}",
                    "check that the broker is reachable",
                ) from exc
        starts: dict[TopicPartition, tuple[int, tuple[int, ...]]] = {}
        need_topic: list[TopicPartition] = []
        for ktp in stored:
            tp = (ktp.topic, ktp.partition)
            if ktp.offset < 0:
                starts[tp] = (default_start(tp), ())
                continue
            starts[tp] = (ktp.offset, self._decode(tp, ktp.offset, ktp.metadata, decode_metadata))
            if not (ktp.metadata or "").startswith("htmqc1:"):
                need_topic.append(tp)  # this broker dropped the commit metadata
        if need_topic:
            records = read_positions(
                self.bootstrap,
                self.positions_topic,
                self.group,
                need_topic,
                self._extra,
                self.timeout,
            )
            for tp, (committed, text) in records.items():
                if committed == starts[tp][0]:
                    starts[tp] = (committed, self._decode(tp, committed, text, decode_finished))
        out: dict[TopicPartition, Position] = {}
        for tp, (committed, finished) in starts.items():
            self._last_fence += 1
            self._fences[tp] = self._last_fence
            out[tp] = Position(committed, finished, self._last_fence)
        return out

    def _decode(
        self,
        tp: TopicPartition,
        committed: int,
        text: str | None,
        decode: Callable[[int, str], tuple[int, ...]],
    ) -> tuple[int, ...]:
        try:
            return decode(committed, text or "")
        except ValueError:
            raise RuntimeFailure(
                f"kafka sink: the stored finished-above offsets of {partition_name(tp)} "
                f"({text!r}) are malformed",
                "commit an offset for that partition without metadata to reset it",
            ) from None

    def begin(self) -> KafkaTransaction:
        """``begin_transaction`` (re-creating the producer after a fatal error)."""
        check_no_transaction(self.name, "begin", self._txn)
        if not self.group:
            raise SinkStateError("kafka sink is not open", "call open(group) first")
        if self._producer is None:
            self._producer = self._new_producer()
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            self._after_error(exc)
            raise SinkUnavailable(
                f"kafka sink: begin_transaction failed: {_error_text(exc)}",
                "check the broker; the runtime retries from the committed offsets",
            ) from exc
        self._txn = KafkaTransaction(self, self._producer)
        return self._txn

    def reconnect(self) -> None:
        """Drop the transaction and the producer; make a new producer
        (``init_transactions`` aborts what the old one left open).

        :raises SinkUnavailable: the broker cannot be reached yet."""
        if self._txn is not None:
            self._txn._finish()
        self._producer = None
        try:
            self._producer = self._new_producer()
        except RuntimeFailure as exc:
            raise SinkUnavailable(exc.problem, exc.fix) from exc

    def close(self) -> None:
        """Abort an open transaction and drop the producer."""
        if self._offsets is not None:
            reader, self._offsets = self._offsets, None
            with suppress(KafkaException, RuntimeError):
                reader.close()
        if self._txn is not None:
            self._txn.abort()
        producer, self._producer = self._producer, None
        if producer is not None:  # healthy, no transaction open: closes at once
            _close_quietly(producer)

    # -- helpers -----------------------------------------------------------------------

    def before_commit(self) -> None:
        """Read the group metadata (generation, member) the next commit sends."""
        self._group_metadata = self._bound().consumer_group_metadata()

    def _offsets_reader(self) -> Consumer:
        """The consumer that reads the group's committed offsets (module docs)."""
        if self._offsets is None:
            config = {
                **self._extra,
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
            }
            self._offsets = Consumer(config)
        return self._offsets

    def _bound(self) -> Any:
        if self._consumer is None:
            raise SinkStateError(
                "kafka sink has no consumer", "call sink.bind(consumer) before claim/commit"
            )
        return self._consumer

    def _after_error(self, exc: KafkaException) -> None:
        """Leave the producer usable: abort an abortable transaction, drop a
        fatally failed producer (the next ``begin`` makes a new one)."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        producer = self._producer
        if producer is None:
            return
        if err is not None and (err.fatal() or err.code() in PRODUCER_FENCING_ERRORS):
            self._producer = None  # unusable: closing it would try to abort and hang
            return
        try:
            _bounded(producer.abort_transaction, seconds=self.timeout)
        except KafkaException as again:
            inner = again.args[0] if again.args else None
            if isinstance(inner, KafkaError) and inner.code() == KafkaError._STATE:
                return  # no transaction in progress
            self._producer = None
        except _Stuck:
            self._abandon(producer)

    def _abandon(self, producer: Producer) -> None:
        """Drop a producer stuck in a transactional call: never closed (closing it
        would wait for that call), kept referenced so that its destructor does not
        run on some other thread and block there; the next ``begin`` or
        ``reconnect`` makes a new producer, whose ``init_transactions`` fences it."""
        if self._producer is producer:
            self._producer = None
        self._abandoned.append(producer)
        log.warning(
            "kafka sink: a producer stuck in a transactional call was abandoned "
            "(%d so far in this process)", len(self._abandoned),
        )


class KafkaTransaction:
    """One Kafka transaction of a :class:`KafkaSink` (see module docs).

    Message scopes may run on several threads at once: each context's sends go
    to its own scope's buffer (:data:`_SCOPE`). ``commit``/``abort`` wait for
    running scopes."""

    def __init__(self, sink: KafkaSink, producer: Producer) -> None:
        self.handle = Output(self, sink.topic)
        self._sink = sink
        self._producer = producer
        self._idle = threading.Condition()
        self._active = 0
        self._done = False
        self._broken: BaseException | None = None
        self._produced = 0

    @contextmanager
    def message(self) -> Iterator[None]:
        """Buffer the sends of one message; produce them only if it succeeds."""
        self._check_open()
        if self._buffer() is not None:
            raise SinkStateError("kafka sink: message() scopes do not nest", "close the outer one")
        buffer: list[Record] = []
        token = _SCOPE.set((self, buffer))
        with self._idle:
            self._active += 1
        try:
            yield
            for record in buffer:
                self._produce(record)
        finally:
            _SCOPE.reset(token)
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def _buffer(self) -> list[Record] | None:
        """The buffer of this transaction's scope open in the running context."""
        scope = _SCOPE.get()
        return scope[1] if scope is not None and scope[0] is self else None

    def dead_letter(self, topic: str, msg: Message, info: DeadLetterInfo) -> None:
        """The dead letter as a record on the DLQ topic
        (:meth:`KafkaSink.dead_letter_destination`), in its own scope."""
        destination = self._sink.dead_letter_destination(topic, info)
        with self.message():
            self.handle.send(
                destination, msg.value(), key=msg.key(), headers=dlq_headers(msg, info)
            )

    def forward(self, topic: str, msg: Message, headers: Headers) -> None:
        """``msg`` to ``topic`` with ``headers``, in its own scope."""
        with self.message():
            self.handle.send(topic, msg.value(), key=msg.key(), headers=headers)

    def send(self, record: Record) -> None:
        """Buffer ``record`` in the running context's message scope, or produce it now."""
        self._check_open()
        buffer = self._buffer()
        if buffer is None:
            self._produce(record)
        else:
            buffer.append(record)

    def _produce(self, record: Record) -> None:
        topic, value, key, headers = record
        deadline = time.monotonic() + self._sink.timeout
        try:
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, headers=headers)
                    break
                except BufferError:
                    if time.monotonic() > deadline:
                        raise
                    self._producer.poll(0.05)
            self._produced += 1
            if self._produced % 1000 == 0:
                self._producer.poll(0)
        except BaseException as exc:
            # Part of a message may be in the transaction: it must not commit.
            self._broken = exc
            raise

    def commit(self, commits: Sequence[tuple[Commit, int]]) -> None:
        """Send the offsets into the transaction and commit it (see module docs)."""
        self._check_open()
        self._wait_idle()
        sink = self._sink
        if not commits:
            self.abort()
            return
        tps = [c.tp for c, _ in commits]
        try:
            if self._broken is not None:
                raise SinkUnavailable(
                    f"kafka sink: producing a message's output failed ({self._broken!r}); "
                    "the transaction was aborted",
                    "check the broker; the runtime retries from the committed offsets",
                )
            stale = [c.tp for c, fence in commits if sink._fences.get(c.tp) != fence]
            if stale:
                raise Fenced.for_partitions(sink.name, stale)
            offsets = []
            for commit, _fence in sorted(commits, key=lambda item: item[0].tp):
                metadata = encode_metadata(commit.offset, commit.finished_above)
                if len(metadata) > sink.metadata_max_bytes:
                    # The runtime's intake throttles so that this cannot happen
                    # (htmqc.core.metadata_budget); left as the guard it was.
                    raise RuntimeFailure(
                        f"kafka sink: {len(commit.finished_above)} offsets finished out of order "
                        f"on {partition_name(commit.tp)} do not fit the commit metadata "
                        f"({len(metadata)} > {sink.metadata_max_bytes} bytes)",
                        "set --commit-metadata-bytes to the broker's offset.metadata.max.bytes",
                    )
                offsets.append(KafkaTopicPartition(*commit.tp, commit.offset, metadata=metadata))
                if commit.finished_above:
                    self._produce(
                        (
                            sink.positions_topic,
                            record_value(commit.offset, metadata.removeprefix("htmqc1:")),
                            record_key(sink.group, commit.tp),
                            None,
                        )
                    )
            group_metadata = sink._group_metadata
            if group_metadata is None:  # used without the runtime (tests, tools)
                group_metadata = sink._bound().consumer_group_metadata()
            sink._group_metadata = None
            _bounded(
                self._producer.send_offsets_to_transaction, offsets, group_metadata,
                seconds=sink.timeout,
            )  # fmt: skip
            self._commit_with_retries()
        except _Stuck as stuck:
            self._finish()
            sink._abandon(self._producer)
            raise SinkUnavailable(
                f"kafka sink: librdkafka's {stuck} did not return within "
                f"{sink.timeout + STUCK_GRACE_SECONDS:g} s; the transaction is dropped and its "
                "producer abandoned (a new one fences it)",
                "check the broker; the runtime retries from the committed offsets",
            ) from None
        except KafkaException as exc:
            self._finish()
            sink._after_error(exc)
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() in FENCING_ERRORS:
                raise Fenced(
                    f"kafka sink: the transaction for {', '.join(map(partition_name, tps))} "
                    f"was fenced ({_error_text(exc)}); nothing of it was stored",
                    "let the partitions go: their new owner processes them",
                    tps=tps,
                ) from exc
            raise SinkUnavailable(
                f"kafka sink: committing the transaction failed: {_error_text(exc)}",
                "check the broker; the runtime retries from the committed offsets",
            ) from exc
        except BaseException:
            self.abort()
            raise
        self._finish()

    def _commit_with_retries(self) -> None:
        deadline = time.monotonic() + self._sink.timeout
        while True:
            try:
                _bounded(self._producer.commit_transaction, seconds=self._sink.timeout)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not (isinstance(err, KafkaError) and err.retriable()):
                    raise
                if time.monotonic() > deadline:
                    raise

    def abort(self) -> None:
        """``abort_transaction``: nothing of it becomes visible (idempotent)."""
        if self._done:
            return
        self._wait_idle()
        self._finish()
        producer = self._producer
        try:
            _bounded(producer.abort_transaction, seconds=self._sink.timeout)
        except KafkaException as exc:
            self._sink._after_error(exc)
        except _Stuck:
            self._sink._abandon(producer)

    def _wait_idle(self) -> None:
        if self._buffer() is not None:
            raise SinkStateError(
                "kafka sink: commit/abort inside a message() scope", "close the scope first"
            )
        with self._idle:
            self._idle.wait_for(lambda: self._active == 0)

    def _finish(self) -> None:
        self._done = True
        if self._sink._txn is self:
            self._sink._txn = None

    def _check_open(self) -> None:
        if self._done:
            raise SinkStateError(
                "kafka sink: this transaction is already committed or aborted",
                "call sink.begin() for a new one",
            )


class _Stuck(Exception):
    """A transactional call did not return within its bound (:func:`_bounded`)."""


def _bounded(method: Callable[..., Any], *args: Any, seconds: float) -> None:
    """``method(*args, seconds)`` (a transactional call of librdkafka, given
    ``seconds`` as its own timeout) on a thread of its own, waited for at most
    ``seconds`` + :data:`STUCK_GRACE_SECONDS`; its exception, if it raised one.

    librdkafka 2.16 can block in ``send_offsets_to_transaction`` far past its
    timeout after a broker fault (issues 5456 and 5511: the coordinator
    request's timeout is never checked), which stopped the sink's consumers until
    ``max.poll.interval.ms`` threw them out of the group.

    :raises _Stuck: the call is still running; its producer must be abandoned
        (a new one with the same ``transactional.id`` fences it).
    """
    what = getattr(method, "__name__", "call")
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def run() -> None:
        try:
            method(*args, seconds)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"htmqc-kafka-{what}", daemon=True).start()
    if not done.wait(seconds + STUCK_GRACE_SECONDS):
        raise _Stuck(what)
    if outcome[0] is not None:
        raise outcome[0]


def _close_quietly(producer: Producer) -> None:
    """Close a producer that has nothing left to send (its transaction is over).
    ``Producer.close`` is new in confluent-kafka 2.13; an older one (pyproject
    allows 2.6 and later) is let go when the last reference to it goes."""
    close = getattr(producer, "close", None)
    if close is None:
        return
    with suppress(KafkaException, RuntimeError):
        close()


def _error_text(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)
