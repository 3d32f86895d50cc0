"""The ports: what the runtime really uses of Kafka, a sink and a clock.

Theory of operation
-------------------
The runtime (:mod:`htmqc.runtime`) does its I/O through these typed
Protocols only, in the style of httpcore's backends: a real adapter
(``confluent_kafka.Consumer``, :mod:`htmqc.sinks`) and the fakes of
:mod:`htmqc.testing` both satisfy them, so every runtime path can be driven
without a broker. Nothing in the runtime probes an object for optional
methods or asks a sink its name: what a sink can do is said here.

* :class:`Message`: the parts of ``confluent_kafka.Message`` read by the runtime.
* :class:`ConsumerPort`: the group consumer (``enable.auto.commit=false``);
  rebalance and commit callbacks run inside :meth:`ConsumerPort.consume`.
* :class:`ProducerPort`: dead letters and retry records (at-least-once).
* :class:`Sink` / :class:`SinkTransaction`: exactly-once storage, effects and
  positions in one transaction, fenced (contract in :mod:`htmqc.sinks.base`).
* :class:`SqlTx` / :class:`AsyncSqlTx` / :class:`KafkaTx`: what a handler's
  ``tx`` is in exactly-once mode (public: ``htmqc.SqlTx``, ``htmqc.AsyncSqlTx``,
  ``htmqc.KafkaTx``).
* :class:`Clock`: ``monotonic()`` for every timer of the runtime (commit
  interval, transaction age, retries, flow), ``wall()`` for what is stored
  (failure times, retry-topic due times). One clock is injected into the
  engine and everything it starts, so a virtual clock (replay) drives them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from htmqc.core.decisions import Commit, TopicPartition

if TYPE_CHECKING:
    from confluent_kafka import TopicPartition as KafkaTP

    from htmqc.dlq.record import DeadLetterInfo

#: Kafka record headers as the runtime passes them on.
Headers = list[tuple[str, bytes]]


class Message(Protocol):
    """A consumed record (``confluent_kafka.Message`` or a fake)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Any: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> Any: ...
    def __len__(self) -> int: ...


#: Parameters of one SQL statement: positional (``?`` / ``%s``) or named.
SqlParams = Sequence[Any] | Mapping[str, Any]


@runtime_checkable
class SqlTx(Protocol):
    """The ``tx`` an exactly-once handler gets from an SQL sink (``sqlite://``,
    ``postgresql://``): a DB-API cursor of the sink's open transaction
    (``sqlite3.Cursor``, ``psycopg.Cursor``), typed by what both drivers offer.

    Contract: every statement runs in the transaction that also stores the
    consumer's position, so its effects are committed exactly when the message
    counts as done, and undone (a savepoint) when the handler raises. The
    handler must not ``COMMIT``, ``ROLLBACK`` or close it, and must let database
    errors propagate. Parameter markers are the driver's: ``?`` for SQLite,
    ``%s`` for PostgreSQL.
    """

    def execute(self, query: str, params: SqlParams = ..., /) -> Self:
        """Run one statement with ``params``; returns the cursor (for ``fetch*``)."""
        ...

    def executemany(self, query: str, params_seq: Iterable[SqlParams], /) -> object:
        """Run one statement once per parameter set (a batch handler's insert)."""
        ...

    def fetchone(self) -> Any:
        """The next row of the last query (a tuple), or ``None``."""
        ...

    def fetchmany(self, size: int = ..., /) -> list[Any]:
        """Up to ``size`` more rows of the last query."""
        ...

    def fetchall(self) -> list[Any]:
        """The remaining rows of the last query."""
        ...

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed or returned (``-1``: not known)."""
        ...


@runtime_checkable
class AsyncSqlTx(Protocol):
    """The ``tx`` an ``async def`` exactly-once handler gets from the PostgreSQL
    sink: a ``psycopg.AsyncCursor`` of the sink's open transaction, on a
    ``psycopg.AsyncConnection`` living on the handler event loop.

    Contract: that of :class:`SqlTx` (the statements are in the transaction
    that stores the positions; a handler that raises has them rolled back to
    its savepoint; no ``COMMIT``/``ROLLBACK``/``close``; let errors propagate),
    with ``execute``, ``executemany`` and the ``fetch*`` calls awaited.
    ``rowcount`` is a plain property (psycopg knows it once ``execute`` returned).
    Every call must be awaited before the handler returns: a task left running
    would use the cursor after its message's scope ended.
    """

    async def execute(self, query: Any, params: SqlParams | None = ..., /) -> Self:
        """Run one statement with ``params`` (``%s`` placeholders); returns the cursor."""
        ...

    async def executemany(self, query: Any, params_seq: Iterable[SqlParams], /) -> None:
        """Run one statement once per parameter set."""
        ...

    async def fetchone(self) -> Any:
        """The next row of the last query (a tuple), or ``None``."""
        ...

    async def fetchmany(self, size: int = ..., /) -> list[Any]:
        """Up to ``size`` more rows of the last query."""
        ...

    async def fetchall(self) -> list[Any]:
        """The remaining rows of the last query."""
        ...

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed or returned (``-1``: not known)."""
        ...


#: A Kafka record's headers as a handler may give them.
SendHeaders = Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]]


@runtime_checkable
class KafkaTx(Protocol):
    """The ``tx`` an exactly-once handler gets from the Kafka sink
    (``kafka:TOPIC``): records sent through it are written in the Kafka
    transaction that also commits the consumer's offsets.

    Contract: a record is produced only if the handler returns normally (a
    message that fails sends nothing), and ``read_committed`` readers see it
    exactly when the input offsets are committed.
    """

    @property
    def topic(self) -> str:
        """The sink's output topic (``kafka:TOPIC``)."""
        ...

    def send(
        self,
        topic: str | None,
        value: str | bytes | None,
        key: str | bytes | None = None,
        headers: SendHeaders | None = None,
    ) -> None:
        """Send a record to ``topic`` (``None``: the sink's output topic) in the
        open transaction; text is encoded as UTF-8."""
        ...


class ConsumerPort(Protocol):
    """The group consumer the runtime drives (see module docs)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[KafkaTP]], None] | None = ...,
        on_revoke: Callable[[Any, list[KafkaTP]], None] | None = ...,
        on_lost: Callable[[Any, list[KafkaTP]], None] | None = ...,
    ) -> None: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...
    def incremental_assign(self, partitions: list[KafkaTP]) -> None: ...
    def incremental_unassign(self, partitions: list[KafkaTP]) -> None: ...
    def pause(self, partitions: list[KafkaTP]) -> None: ...
    def resume(self, partitions: list[KafkaTP]) -> None: ...
    def seek(self, partition: KafkaTP) -> None: ...
    def position(self, partitions: list[KafkaTP]) -> list[KafkaTP]: ...
    def committed(self, partitions: list[KafkaTP], timeout: float = -1) -> list[KafkaTP]: ...
    def commit(self, *args: Any, **kwargs: Any) -> Any: ...
    def get_watermark_offsets(
        self, partition: KafkaTP, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int] | None: ...
    def close(self) -> None: ...


class ProducerPort(Protocol):
    """A producer whose every record the runtime waits for (dead letters, retries)."""

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None: ...
    def flush(self, timeout: float = -1) -> int: ...


@runtime_checkable
class Clock(Protocol):
    """The runtime's one source of time (see module docs)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (timers)."""
        ...

    def wall(self) -> float:
        """Unix seconds (stored facts: failure times, retry due times)."""
        ...


@dataclass(frozen=True, slots=True)
class Position:
    """A partition's durable position in a sink.

    ``committed``: the next offset to read (Kafka convention); every offset
    below it has its effects stored. ``finished_above``: offsets above
    ``committed`` whose effects are stored too (finished out of order), sorted.
    ``fence``: the fence token this owner got from :meth:`Sink.claim`.
    """

    committed: int
    finished_above: tuple[int, ...]
    fence: int


class SystemClock:
    """The machine's clocks: ``time.monotonic`` and ``time.time``."""

    monotonic = staticmethod(time.monotonic)
    wall = staticmethod(time.time)


@runtime_checkable
class SinkTransaction(Protocol):
    """One open transaction of a :class:`Sink` (see :mod:`htmqc.sinks.base`)."""

    @property
    def handle(self) -> SqlTx | AsyncSqlTx | KafkaTx:
        """What the user handler receives as ``tx``: a DB-API cursor (sqlite3 /
        psycopg, a :class:`SqlTx`), a ``psycopg.AsyncCursor`` (an
        :class:`AsyncSqlTx`, after :meth:`Sink.serve_async_handler` said so) or,
        for Kafka, an ``Output`` (a :class:`KafkaTx`)."""
        ...

    def message(self) -> AbstractContextManager[None]:
        """Scope of one message's effects. If the block raises, that message's
        effects are undone and the exception propagates; the transaction stays
        usable for the other messages. If the sink cannot undo just that
        message it rolls the whole transaction back and raises
        :class:`~htmqc.sinks.base.TransactionAborted` (or
        :class:`~htmqc.sinks.base.SinkUnavailable` when the connection is
        gone). Scopes do not nest."""
        ...

    def commit(self, commits: Sequence[tuple[Commit, int]]) -> None:
        """Store each ``(commit, fence)``'s position with the effects, in the
        same transaction, after checking each partition's fence is still
        ``fence``; then commit. A stale fence rolls back everything and raises
        :class:`~htmqc.sinks.base.Fenced`. With no commits the transaction is
        aborted: effects are only ever stored together with the positions that
        cover them."""
        ...

    def abort(self) -> None:
        """Roll back everything in this transaction. Idempotent; never raises
        for a connection that is already gone."""
        ...

    def dead_letter(self, topic: str, msg: Message, info: DeadLetterInfo) -> None:
        """Write ``msg``'s dead letter (``info``) in this transaction, in its own
        message scope, to :meth:`Sink.dead_letter_destination`: a record on
        ``info.target(topic)`` for the Kafka sink, a row of the dead-letter
        table for SQL sinks."""
        ...

    def forward(self, topic: str, msg: Message, headers: Headers) -> None:
        """Write ``msg`` (key, value, ``headers``) to ``topic`` in this
        transaction, in its own message scope (the retry topic). Only sinks
        with :attr:`Sink.writes_kafka` can.

        :raises SinkStateError: the sink cannot write Kafka records."""
        ...


@runtime_checkable
class Sink(Protocol):
    """An exactly-once sink: effects and positions in one transaction."""

    #: ``"sqlite"``, ``"postgresql"`` or ``"kafka"`` (for messages only).
    name: str
    #: Whether transactions can write Kafka records (dead-letter topics, the
    #: retry topic); SQL sinks write dead letters as rows instead.
    writes_kafka: bool
    #: Whether each transaction commits the positions to the consumer group's
    #: offsets itself (the Kafka sink: ``send_offsets_to_transaction``). For a
    #: sink without it (SQL) the runtime also commits the stored watermark to
    #: the group, best effort, so lag tools see it (``--kafka-lag-commits``);
    #: never read back.
    commits_group_offsets: bool

    @property
    def metadata_max_bytes(self) -> int | None:
        """The longest commit metadata its transactions may send, in bytes (the
        Kafka sink: the broker's ``offset.metadata.max.bytes``,
        ``--commit-metadata-bytes``); ``None`` for a sink whose transactions send
        none (SQL)."""
        ...

    def open(self, group: str) -> None:
        """Connect and create the sink's tables if missing (idempotent)."""
        ...

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """Where this sink's transactions write ``info``'s dead letter of a
        message from ``topic`` (:meth:`SinkTransaction.dead_letter`), as log
        lines name it: the DLQ topic (``info.target(topic)``) for the Kafka
        sink; ``<database> table <prefix>dead_letters`` (the URL with any
        password redacted) for SQL sinks. Pure: callable from any thread."""
        ...

    def serve_async_handler(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The handler is ``async def`` and runs on ``loop`` (the runtime's one
        handler loop, :mod:`htmqc.runtime.handlers`); called once before the
        first ``claim``, with no transaction open. Returns whether the
        transactions' :attr:`SinkTransaction.handle` is from now on awaitable
        (PostgreSQL: a ``psycopg.AsyncCursor``, an :class:`AsyncSqlTx`, on a
        ``psycopg.AsyncConnection`` living on ``loop``); ``False``: it stays
        synchronous (SQLite's cursor, Kafka's ``Output``). Either way the
        handle's statements are in the sink's transaction, as for a ``def``
        handler. The sink's own calls keep coming from other threads than the
        loop's."""
        ...

    def bind(self, consumer: ConsumerPort) -> None:
        """The runtime's consumer, before the first ``claim`` (the Kafka sink
        reads committed offsets and group metadata through it; others ignore it)."""
        ...

    def before_commit(self) -> None:
        """Called on the consumer's thread just before each ``commit`` of a
        transaction (which runs on another thread): read from the bound consumer
        what the commit needs (Kafka: the group metadata). librdkafka may leave
        a call from another thread unanswered while the consumer is in use."""
        ...

    def claim(
        self,
        tps: Sequence[TopicPartition],
        *,
        default_start: Callable[[TopicPartition], int],
    ) -> dict[TopicPartition, Position]:
        """Take newly assigned partitions: atomically bump each one's fence and
        return its durable :class:`Position`. ``default_start(tp)``
        is the start of a partition the sink has never seen. Not allowed while a
        transaction is open."""
        ...

    def begin(self) -> SinkTransaction:
        """Open a transaction (at most one at a time per sink)."""
        ...

    def reconnect(self) -> None:
        """Drop the connection (its open transaction rolls back) and connect
        again. :raises SinkUnavailable: the database still cannot be reached."""
        ...

    def close(self) -> None:
        """Abort any open transaction and disconnect. Idempotent."""
        ...
