"""How finished work becomes durable: the two delivery modes.

Theory of operation
-------------------
The engine asks the core what to commit (:meth:`ConsumerCore.commits`) and
hands the :class:`~htmqc.core.Commit` values to a *delivery*:

* :class:`AtLeastOnce` commits each partition's watermark to Kafka with an
  asynchronous ``commit`` (``finished_above`` goes into the commit metadata, so
  a restart skips work finished out of order); the ``on_commit`` callback
  arrives on the poll thread and is queued as acks/failures for the core.
* :class:`ExactlyOnce` runs every handler inside the open sink transaction
  (``with txn.message(): handler(msg, txn.handle)``) and, when the transaction
  is full (``txn_messages``) or old (``txn_ms``), stores the commits in it,
  fenced (:meth:`SinkTransaction.commit`). The core hears ``commit_acked`` only
  after the sink committed. Handlers of one transaction share one connection,
  so in this mode they run one at a time on the poll thread.

Dead letters (a message whose handler failed for good, a poison message, or a
message above ``--max-message-bytes``) carry a
:class:`~htmqc.dlq.record.DeadLetterInfo` and go to ``info.target(topic)``
(``<topic>.dlq``, or ``<topic>.dlq.poison`` for poison) with the headers of
:mod:`htmqc.dlq.headers`: at-least-once writes them with a producer and waits
for the broker's ack before the core hears ``dead_lettered``; exactly-once
writes them in the sink transaction (a row of ``htmqc_dead_letters``, see
:mod:`htmqc.dlq.table`, for SQL sinks; a record on the DLQ topic for the Kafka
sink), so a message ends with its effect or its dead letter, never neither and
never both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from htmqc.core import Commit, ConsumerCore
from htmqc.core.decisions import TopicPartition
from htmqc.dlq import table as dlq_table
from htmqc.dlq.headers import dlq_headers
from htmqc.dlq.record import DeadLetterInfo, dlq_topic
from htmqc.errors import RuntimeFailure
from htmqc.sinks import Fenced, Sink, SinkTransaction
from htmqc.sinks.encoding import encode_metadata

#: The dead-letter table of a SQL sink with the default table prefix.
DLQ_TABLE = dlq_table.table_name()

__all__ = ["DLQ_TABLE", "AtLeastOnce", "ExactlyOnce", "dlq_topic"]


class AtLeastOnce:
    """Kafka commits of the watermark, asynchronous, acked through the core."""

    def __init__(self, consumer: Any, producer_factory: Callable[[], Any]) -> None:
        self.consumer = consumer
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._pending: dict[tuple[TopicPartition, int], int] = {}
        self.acks: list[tuple[Any, list[Any]]] = []

    def on_commit(self, err: Any, partitions: list[Any]) -> None:
        """confluent-kafka's ``on_commit``: queue it for the poll loop."""
        self.acks.append((err, partitions))

    def drain_acks(self, core: ConsumerCore) -> None:
        """Report queued commit callbacks to the core."""
        while self.acks:
            err, partitions = self.acks.pop(0)
            for p in partitions:
                tp = (p.topic, p.partition)
                epoch = self._pending.pop((tp, p.offset), None)
                if epoch is None:
                    continue
                if err is None and p.error is None:
                    core.commit_acked(tp, epoch, p.offset)
                else:
                    core.commit_failed(tp, epoch, p.offset)

    def commit(self, core: ConsumerCore, commits: list[Commit], *, sync: bool = False) -> None:
        """Commit ``commits`` to Kafka (asynchronously unless ``sync``)."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTP

        if not commits:
            return
        offsets = [
            KafkaTP(
                c.tp[0], c.tp[1], c.offset, metadata=encode_metadata(c.offset, c.finished_above)
            )
            for c in commits
        ]
        for c in commits:
            self._pending[(c.tp, c.offset)] = c.epoch
        if not sync:
            self.consumer.commit(offsets=offsets, asynchronous=True)
            return
        try:
            result = self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            for c in commits:
                self._pending.pop((c.tp, c.offset), None)
                core.commit_failed(c.tp, c.epoch, c.offset)
            return
        self.acks.append((None, result or []))
        self.drain_acks(core)

    def dead_letter(self, topic: str, msg: Any, info: DeadLetterInfo) -> None:
        """Write ``msg`` (same key and value, headers of :func:`dlq_headers`) to
        ``info.target(topic)`` and wait for the broker's ack.

        :raises RuntimeFailure: the dead letter could not be written (the message
            then stays unfinished, so nothing is committed past it).
        """
        self.send(info.target(topic), msg.value(), msg.key(), _dlq_headers(msg, info))

    def send(
        self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        """Produce one record and wait for the broker's ack (dead letters, retry
        records: the source offset may be finished only once its copy exists).

        :raises RuntimeFailure: the broker did not take it within 30 s.
        """
        if self._producer is None:
            self._producer = self._producer_factory()
        errors: list[Any] = []
        self._producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers,
            on_delivery=lambda err, _m: errors.append(err) if err is not None else None,
        )
        remaining = self._producer.flush(30)
        if remaining or errors:
            raise RuntimeFailure(
                f"could not write to {topic}: {errors[0] if errors else 'timed out'}",
                f"check that the topic {topic} exists and the broker is up",
            )

    def close(self) -> None:
        """Flush the dead-letter producer."""
        if self._producer is not None:
            self._producer.flush(10)


class ExactlyOnce:
    """Effects and positions in one sink transaction (see module docs)."""

    def __init__(self, sink: Sink, txn_messages: int, txn_ms: float) -> None:
        self.sink = sink
        self.txn_messages = txn_messages
        self.txn_seconds = txn_ms / 1000.0
        self.txn: SinkTransaction | None = None
        self.started_at = 0.0
        self.finished_at = time.monotonic()
        self.count = 0
        self.fences: dict[TopicPartition, int] = {}

    def current(self) -> SinkTransaction:
        """The open transaction, opened if needed."""
        txn = self.txn
        if txn is None:
            txn = self.txn = self.sink.begin()
            self.started_at = time.monotonic()
            self.count = 0
        return txn

    def due(self, now: float) -> bool:
        """Whether to commit now: the open transaction is full or old, or (with none
        open) a transaction period passed, so progress over gaps is stored too."""
        if self.txn is None:
            return now - self.finished_at >= self.txn_seconds
        return self.count >= self.txn_messages or now - self.started_at >= self.txn_seconds

    def finish(self, core: ConsumerCore) -> None:
        """Commit the open transaction with the core's commits, then ack them. With
        no transaction open, one is opened only if the core has something to store
        (offsets that were gaps).

        :raises Fenced: a partition's fence was stale; nothing was stored and the
            core has not been told anything (the caller drops the partitions).
        """
        self.finished_at = time.monotonic()
        commits = [c for c in core.commits() if c.tp in self.fences]
        txn = self.txn
        if txn is None:
            if not commits:
                return
            txn = self.current()
        self.txn = None
        try:
            txn.commit([(c, self.fences[c.tp]) for c in commits])
        except Fenced:
            raise
        except BaseException:
            txn.abort()
            for c in commits:
                core.commit_failed(c.tp, c.epoch, c.offset)
            raise
        for c in commits:
            core.commit_acked(c.tp, c.epoch, c.offset)

    def abort(self) -> None:
        """Roll back the open transaction, if any."""
        if self.txn is not None:
            self.txn.abort()
            self.txn = None

    def dead_letter(self, topic: str, msg: Any, info: DeadLetterInfo) -> None:
        """Write ``msg``'s dead letter inside the open transaction, in its own
        message scope: for the Kafka sink a record on ``info.target(topic)``;
        for SQL sinks a row of the sink's dead-letter table
        (:mod:`htmqc.dlq.table`; ``redriven_at`` NULL)."""
        txn = self.current()
        with txn.message():
            if self.sink.name == "kafka":
                txn.handle.send(
                    info.target(topic), msg.value(), key=msg.key(), headers=_dlq_headers(msg, info)
                )
                return
            prefix = str(getattr(self.sink, "positions_table", "htmqc_positions"))
            table = dlq_table.table_name(prefix.removesuffix("positions"))
            dlq_table.insert(txn.handle, table, self.sink.name, msg, info)

    def close(self) -> None:
        """Abort any open transaction."""
        self.abort()


def _dlq_headers(msg: Any, info: DeadLetterInfo) -> list[tuple[str, bytes]]:
    """The headers of ``msg``'s dead letter (:func:`htmqc.dlq.headers.dlq_headers`)."""
    return dlq_headers(msg, info)
