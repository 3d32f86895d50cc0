"""Intake: a consumed batch becomes work for the workers.

Errors are dropped (a fatal one stops the run); the rest is grouped by
partition; each partition's run goes through the gate (is it ours, fetchable,
not draining), the retry topic's due time, the core (``fetched`` leaves out
offsets the sink already holds, ``started_many``), and is handed to the workers
in one command per partition and lane: the hand-off costs per batch, not per
message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from itertools import groupby
from operator import methodcaller
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.core.decisions import TopicPartition
from htmqc.errors import RuntimeFailure
from htmqc.runtime.retry_topic import retry_after_ms

if TYPE_CHECKING:
    from htmqc.runtime.loop import Engine

log = logging.getLogger("htmqc.runtime")

#: How intake reads a message's error, partition and offset: a consume batch is all
#: ``confluent_kafka.Message`` (whose unbound methods ``map`` calls straight from C);
#: anything else (test fakes, whose batches may mix types) is asked by name.
READERS: dict[type, tuple[Callable[[Any], Any], ...]] = {
    Message: (Message.error, Message.partition, Message.offset)
}
ANY_READERS: tuple[Callable[[Any], Any], ...] = (
    methodcaller("error"),
    methodcaller("partition"),
    methodcaller("offset"),
)


class Intake:
    """Turns consumed batches into worker commands (see module docs)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def dispatch(self, msgs: list[Any]) -> None:
        """Hand a consumed batch to the core and the workers."""
        e = self.engine
        n = len(msgs)
        e.stats.received += n
        if not n:
            return
        now = e.clock.monotonic()
        e.last_message = now
        if e.stats.first_message_at is None:
            e.stats.first_message_at = now
        error, partition, offset = READERS.get(type(msgs[0]), ANY_READERS)
        if list(map(error, msgs)).count(None) != n:
            msgs = drop_errors(msgs)
        core = e.core
        gate = e.ownership
        for tp, batch in self.by_partition(msgs, partition):
            lease = gate.lease(tp)
            if lease is None or not gate.fetchable(tp) or core.tracker(tp).draining:
                continue
            if tp[0] == e.retry_topic:
                batch = self.due_prefix(tp, batch)
                if not batch:
                    continue
            offsets = list(map(offset, batch))
            first = core.tracker(tp).next
            if offsets[0] < first:
                # Buffered before a seek: already covered by this assignment.
                batch = [m for m in batch if m.offset() >= first]
                offsets = [m.offset() for m in batch]
                if not batch:
                    continue
            run = core.fetched(tp, lease.epoch, offsets)
            if len(run) != len(batch):
                if e.metrics is not None:
                    e.metrics.duplicates_suppressed(len(batch) - len(run))
                wanted = set(run)
                batch = [m for m in batch if m.offset() in wanted]
            if not run:
                continue
            core.started_many(tp, lease.epoch, run)
            nbytes = sum(map(len, batch))
            lease.count += len(run)
            lease.nbytes += nbytes
            e.stats.started(len(run), nbytes)
            e.workers.submit(lease, batch, (list(run), nbytes))

    def by_partition(
        self, msgs: list[Any], partition: Callable[[Any], Any]
    ) -> Iterable[tuple[TopicPartition, list[Any]]]:
        """``msgs`` grouped by partition, in order within each.

        librdkafka hands a fetch response out partition by partition, so a batch is
        a few long runs: with one topic subscribed they are found by
        :func:`itertools.groupby` in C (one call per message, no tuple, no dict
        step); with the retry topic too, each message is looked at in Python."""
        if not msgs:
            return ()
        e = self.engine
        if e.retry_topic is None:
            topic = e.options.topic
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

    def due_prefix(self, tp: TopicPartition, batch: list[Any]) -> list[Any]:
        """The retry-topic records of ``batch`` whose time has come, up to the first
        that has not: from that one on, the partition is rewound and waits
        (paused) until it is due (:meth:`~htmqc.runtime.ownership.Ownership.wake`)."""
        e = self.engine
        now_ms = e.clock.wall() * 1000.0
        for i, msg in enumerate(batch):
            due_ms = retry_after_ms(msg)
            if due_ms > now_ms:
                e.consumer.seek(KafkaTP(tp[0], tp[1], msg.offset()))
                e.ownership.wait_until(tp, due_ms / 1000.0)
                return batch[:i]
        return batch


def drop_errors(msgs: list[Any]) -> list[Any]:
    """The messages of ``msgs`` that are not errors; a fatal error stops the run."""
    out = []
    for msg in msgs:
        err = msg.error()
        if err is None:
            out.append(msg)
        elif err.fatal():
            raise RuntimeFailure(f"Kafka consumer failed: {err.str()}", "restart htmqc run")
        else:
            log.warning("consumer error: %s", err.str())
    return out
