"""Kafka DLQ topics: list, show and redrive ``<topic>.dlq`` and ``<topic>.dlq.poison``.

Theory of operation
-------------------
Reading. A consumer assigns every partition of the DLQ topics (``read_committed``,
so dead letters of aborted exactly-once transactions never show up) and reads
each up to its end (``enable.partition.eof``), within ``timeout`` seconds.
Records whose headers are not htmqc dead-letter headers
(:func:`htmqc.dlq.headers.parse_headers` refuses them) are counted in
``skipped`` and otherwise ignored.

Redrive marks. Which entries were redriven is the committed position of the
consumer group ``htmqc-redrive.<topic>`` on each DLQ partition, in the same
form the runtime uses for its own partitions: an offset below which every
entry was redriven (or is not an entry), plus the redriven offsets above it
(``finished_above``), carried in the offset-commit metadata
(:func:`htmqc.sinks.encoding.encode_metadata`) and, because some brokers drop
that metadata, in a record of the compacted positions topic
(:mod:`htmqc.sinks.kafka_positions`), exactly like the Kafka sink.

Redrive is exactly-once. A transactional producer
(``transactional.id = htmqc-redrive.<topic>``) starts with
``init_transactions``, which aborts whatever an earlier redrive left open and
fences it if it is still running; only then are the marks read. Selected
entries are produced to their original topic and partition (same key, value
and headers, plus ``htmqc-redrive-of=<dlq topic>/<partition>/<offset>``) in
transactions of ``chunk`` entries; each transaction also carries the new marks
(``send_offsets_to_transaction`` for the redrive group, and the positions
record). So a crash at any point leaves each entry either written back and
marked, or neither; the next redrive picks up exactly the unmarked ones, and
a second redrive of the same selection writes nothing. Readers of the original
topic must use ``read_committed`` (htmqc's consumer does).

Per-key order: a redriven record is appended to its partition, after every
message of its key that came later. Redrive only after the fix, and only for
handlers whose effects per key do not depend on order (or are versioned).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.dlq.entries import Selection, StoredDeadLetter
from htmqc.dlq.headers import parse_headers
from htmqc.dlq.record import dlq_topic, poison_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_defaults import consumer_config, producer_config
from htmqc.sinks.encoding import METADATA_PREFIX, decode_finished, encode_finished
from htmqc.sinks.kafka import METADATA_MAX_BYTES
from htmqc.sinks.kafka_positions import (
    DEFAULT_POSITIONS_TOPIC,
    ensure_topic,
    read_positions,
    record_key,
    record_value,
)

DlqPartition = tuple[str, int]
_ID_RE = re.compile(r"(?:(?:([A-Za-z0-9._-]{1,249})/)?(\d{1,10})/)?(\d{1,19})")


def redrive_group(topic: str) -> str:
    """The consumer group whose offsets mark the redriven entries of ``topic``'s DLQs."""
    return f"htmqc-redrive.{topic}"


@dataclass
class Marks:
    """Redrive marks of one DLQ partition: every offset below ``committed`` and
    every offset in ``above`` was redriven (see module docs)."""

    committed: int
    above: set[int] = field(default_factory=set)

    def redriven(self, offset: int) -> bool:
        """Whether the entry at ``offset`` was redriven."""
        return offset < self.committed or offset in self.above


@dataclass
class RedriveReport:
    """What a redrive did: ``redriven`` entries written back in ``transactions``
    transactions; ``skipped`` records that are not htmqc dead letters."""

    redriven: int = 0
    transactions: int = 0
    skipped: int = 0
    seconds: float = 0.0
    ids: list[str] = field(default_factory=list)


class KafkaDlq:
    """The DLQ topics of ``topic`` on ``bootstrap`` (see module docs).

    ``poison_only``: only ``<topic>.dlq.poison``. ``timeout``: seconds for any
    one broker operation, and for reading a DLQ topic to its end.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        poison_only: bool = False,
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        positions_topic: str = DEFAULT_POSITIONS_TOPIC,
        metadata_max_bytes: int = METADATA_MAX_BYTES,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.names = (
            [poison_topic(topic)] if poison_only else [dlq_topic(topic), poison_topic(topic)]
        )
        self.extra = dict(kafka_config or {})
        self.timeout = timeout
        self.group = redrive_group(topic)
        self.positions_topic = positions_topic
        #: The broker's ``offset.metadata.max.bytes``: a longer finished-above text
        #: rides in the positions topic only.
        self.metadata_max_bytes = metadata_max_bytes
        self.skipped = 0

    # -- reading -----------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        overrides = {**self.extra, "enable.partition.eof": True}
        try:
            return Consumer(consumer_config(self.bootstrap, self.group, overrides))
        except KafkaException as exc:
            raise UsageError(
                f"invalid Kafka setting: {_text(exc)}", "check the --kafka-config keys and values"
            ) from None

    def partitions(self, consumer: Consumer) -> list[DlqPartition]:
        """Every partition of the DLQ topics that exist.

        :raises UsageError: none of them exists.
        """
        try:
            meta = consumer.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise RuntimeFailure(
                f"cannot read topic metadata from {self.bootstrap}: {_text(exc)}",
                "check --bootstrap and that the broker is up",
            ) from None
        out: list[DlqPartition] = []
        for name in self.names:
            topic = meta.topics.get(name)
            if topic is not None and topic.error is None:
                out += [(name, p) for p in sorted(topic.partitions)]
        if not out:
            raise UsageError(
                f"no dead-letter topic {' or '.join(self.names)} on {self.bootstrap}",
                "check --topic (the consumer's input topic) and --bootstrap",
            )
        return out

    def marks(self, consumer: Consumer, tps: list[DlqPartition]) -> dict[DlqPartition, Marks]:
        """The redrive marks of ``tps`` (committed offsets of the redrive group,
        and their finished-above sets)."""
        try:
            stored = consumer.committed([KafkaTP(t, p) for t, p in tps], timeout=self.timeout)
        except KafkaException as exc:
            raise RuntimeFailure(
                f"cannot read the redrive marks (group {self.group}): {_text(exc)}",
                "check that the broker is up; retry",
            ) from None
        out: dict[DlqPartition, Marks] = {}
        need_topic: list[DlqPartition] = []
        for ktp in stored:
            tp = (ktp.topic, ktp.partition)
            if ktp.offset < 0:
                out[tp] = Marks(0)
                continue
            meta = getattr(ktp, "metadata", None) or ""
            if meta.startswith(METADATA_PREFIX):
                out[tp] = Marks(ktp.offset, set(_decode(ktp.offset, meta[len(METADATA_PREFIX) :])))
            else:
                out[tp] = Marks(ktp.offset)
                need_topic.append(tp)
        if need_topic and self._topic_exists(consumer, self.positions_topic):
            records = read_positions(
                self.bootstrap,
                self.positions_topic,
                self.group,
                need_topic,
                self.extra,
                self.timeout,
            )
            for tp, (committed, text) in records.items():
                if committed == out[tp].committed:
                    out[tp].above = set(_decode(committed, text))
        return out

    def _topic_exists(self, consumer: Consumer, name: str) -> bool:
        try:
            topic = consumer.list_topics(name, timeout=self.timeout).topics.get(name)
        except KafkaException:
            return False
        return topic is not None and topic.error is None

    def scan(
        self,
        consumer: Consumer,
        starts: Mapping[DlqPartition, int],
        marks: Mapping[DlqPartition, Marks],
        on_record: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[DlqPartition, int, StoredDeadLetter | None, bool]]:
        """Yield ``(partition, offset, entry, False)`` for every record of the DLQ
        partitions from ``starts`` to their end (``entry`` is ``None`` for a
        record that is not an htmqc dead letter), and ``(partition, end, None,
        True)`` once per partition when its end (the next offset) is reached.

        :raises RuntimeFailure: a partition did not reach its end within ``timeout``
            (an open transaction on it), or the broker failed.
        """
        consumer.assign([KafkaTP(t, p, max(0, starts[(t, p)])) for t, p in starts])
        open_tps = set(starts)
        deadline = time.monotonic() + self.timeout
        while open_tps:
            if time.monotonic() > deadline:
                names = ", ".join(f"{t}/{p}" for t, p in sorted(open_tps))
                raise RuntimeFailure(
                    f"reading {names} did not reach its end within {self.timeout:g} s",
                    "a transaction on it is still open; retry later or raise --timeout",
                )
            for msg in consumer.consume(500, 0.2):
                tp = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if tp in open_tps:
                            open_tps.discard(tp)
                            yield tp, msg.offset() or 0, None, True
                        continue
                    if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        continue  # librdkafka reconnects; the deadline bounds the wait
                    raise RuntimeFailure(
                        f"reading {tp[0]}/{tp[1]} failed: {err.str()}",
                        "check that the broker is up; retry",
                    )
                if tp not in open_tps:
                    continue
                deadline = time.monotonic() + self.timeout
                if on_record is not None:
                    on_record(1)
                yield tp, msg.offset() or 0, self._entry(msg, marks[tp]), False

    def _entry(self, msg: Any, marks: Marks) -> StoredDeadLetter | None:
        try:
            meta = parse_headers(msg.headers() or [])
        except ValueError:
            self.skipped += 1
            return None
        kind, stamp = msg.timestamp()
        return StoredDeadLetter(
            id=f"{msg.topic()}/{msg.partition()}/{msg.offset()}",
            topic=meta.topic,
            partition=meta.partition,
            offset=meta.offset,
            key=msg.key(),
            value=msg.value(),
            headers=meta.headers,
            info=meta.info,
            reason=meta.reason,
            source=meta.source,
            dead_lettered_at=stamp / 1000.0 if kind != 0 and stamp >= 0 else None,
            redriven=marks.redriven(msg.offset()),
        )

    def entries(self, selection: Selection) -> Iterator[StoredDeadLetter]:
        """The DLQ entries that pass ``selection``, in DLQ order (topic,
        partition, offset), at most ``selection.limit``. Streams: one DLQ
        partition is read at a time, and reading stops at the limit."""
        consumer = self._consumer()
        try:
            tps = self.partitions(consumer)
            marks = self.marks(consumer, tps)
            left = selection.limit
            for tp in tps:
                # with --pending, everything below the mark was redriven: skip it
                start = marks[tp].committed if selection.pending else 0
                for _tp, _off, entry, _end in self.scan(consumer, {tp: start}, marks):
                    if entry is None or not selection.matches(entry):
                        continue
                    yield entry
                    if left is not None:
                        left -= 1
                        if left == 0:
                            return
        finally:
            consumer.close()

    def get(self, ident: str) -> StoredDeadLetter:
        """The entry ``ident``: ``OFFSET`` (partition 0 of ``<topic>.dlq``, or of
        the poison topic with ``poison_only``), ``PARTITION/OFFSET``, or
        ``DLQTOPIC/PARTITION/OFFSET``.

        :raises UsageError: malformed, or no dead letter there.
        """
        m = _ID_RE.fullmatch(ident.strip())
        if not m:
            raise UsageError(
                f"DLQ entry id {ident!r} is malformed",
                "use OFFSET, PARTITION/OFFSET or DLQTOPIC/PARTITION/OFFSET (as `list` shows)",
            )
        name = m.group(1) or self.names[0]
        if name not in self.names:
            raise UsageError(
                f"{name} is not a dead-letter topic of {self.topic}",
                f"use one of {', '.join(self.names)}",
            )
        tp = (name, int(m.group(2) or 0))
        offset = int(m.group(3))
        consumer = self._consumer()
        try:
            if tp not in self.partitions(consumer):
                raise UsageError(f"no partition {tp[0]}/{tp[1]}", "check the entry id")
            marks = self.marks(consumer, [tp])
            for _tp, off, entry, _end in self.scan(consumer, {tp: offset}, marks):
                if off == offset and entry is not None:
                    return entry
                break
        finally:
            consumer.close()
        raise UsageError(
            f"no dead letter at {tp[0]}/{tp[1]}/{offset}", "run `htmqc dlq list` for the ids"
        )

    # -- redrive -----------------------------------------------------------------------

    def redrive(
        self,
        selection: Selection,
        *,
        chunk: int = 500,
        progress: Callable[[int], Any] | None = None,
        on_total: Callable[[int], None] | None = None,
    ) -> RedriveReport:
        """Write the selected, not yet redriven entries back to their original
        topic and partition, exactly once (see module docs).

        ``on_total(n)`` is called once with the number of DLQ records to scan,
        ``progress(n)`` as they are scanned.

        :raises RuntimeFailure: the broker failed or another redrive of this
            topic took over; every transaction committed before stays committed,
            the one in progress is rolled back.
        """
        started = time.monotonic()
        report = RedriveReport()
        producer = self._producer()
        consumer = self._consumer()
        try:
            tps = self.partitions(consumer)
            ensure_topic(self.bootstrap, self.positions_topic, self.extra, self.timeout)
            marks = self.marks(consumer, tps)  # after init_transactions: nothing open
            starts = {tp: marks[tp].committed for tp in tps}
            if on_total is not None:
                on_total(self._remaining(consumer, starts))
            run = _Run(self, producer, consumer, marks, report)
            for tp, off, entry, end in self.scan(consumer, starts, marks, progress):
                if end:
                    run.reached(tp, off)
                    continue
                if entry is None or entry.redriven:
                    run.reached(tp, off + 1)
                    continue
                full = selection.limit is not None and report.redriven + len(run.chunk) >= (
                    selection.limit
                )
                if full or not selection.matches(entry):
                    run.pending(tp, off)
                    continue
                run.add(tp, off, entry)
                if len(run.chunk) >= chunk:
                    run.commit()
            run.commit()
        finally:
            consumer.close()
            _close(producer)
        report.seconds = time.monotonic() - started
        report.skipped = self.skipped
        return report

    def _producer(self) -> Producer:
        config = producer_config(self.bootstrap, self.extra, transactional_id=self.group)
        try:
            producer = Producer(config)
        except KafkaException as exc:
            raise UsageError(
                f"invalid Kafka setting: {_text(exc)}", "check the --kafka-config keys and values"
            ) from None
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            raise RuntimeFailure(
                f"cannot start the redrive producer on {self.bootstrap}: {_text(exc)}",
                "check that the broker is up and supports transactions",
            ) from None
        return producer

    def _remaining(self, consumer: Consumer, starts: Mapping[DlqPartition, int]) -> int:
        total = 0
        for (t, p), start in starts.items():
            try:
                _low, high = consumer.get_watermark_offsets(KafkaTP(t, p), self.timeout)
            except KafkaException:
                continue
            total += max(0, high - start)
        return total

    def check_targets(self, entries: Iterable[StoredDeadLetter]) -> None:
        """:meth:`check_target` for each original partition of ``entries``, as a
        redrive of them does before writing each: a dry run fails as the redrive
        would, instead of listing entries the redrive cannot write.

        :raises RuntimeFailure: an entry's topic has no such partition (any more).
        """
        consumer = self._consumer()
        try:
            for topic, partition in sorted({(e.topic, e.partition) for e in entries}):
                self.check_target(consumer, topic, partition)
        finally:
            consumer.close()

    def check_target(self, consumer: Consumer, topic: str, partition: int) -> None:
        """:raises RuntimeFailure: ``topic`` has no partition ``partition``."""
        meta = consumer.list_topics(topic, timeout=self.timeout).topics.get(topic)
        if meta is None or meta.error is not None or partition not in meta.partitions:
            raise RuntimeFailure(
                f"cannot redrive to {topic}/{partition}: no such partition",
                "create the topic (with at least as many partitions as before) and redrive again",
            )


class _Run:
    """One redrive's transactions: entries of the open chunk and the marks."""

    def __init__(
        self,
        dlq: KafkaDlq,
        producer: Producer,
        consumer: Consumer,
        marks: dict[DlqPartition, Marks],
        report: RedriveReport,
    ) -> None:
        self.dlq = dlq
        self.producer = producer
        self.consumer = consumer
        self.marks = marks
        self.report = report
        self.chunk: list[tuple[DlqPartition, int, StoredDeadLetter]] = []
        self.first_pending: dict[DlqPartition, int] = {}
        self.scanned_to: dict[DlqPartition, int] = {tp: m.committed for tp, m in marks.items()}
        self.targets: set[tuple[str, int]] = set()

    def reached(self, tp: DlqPartition, offset: int) -> None:
        """Every offset of ``tp`` below ``offset`` was scanned."""
        self.scanned_to[tp] = max(self.scanned_to[tp], offset)

    def pending(self, tp: DlqPartition, offset: int) -> None:
        """``offset`` is an entry left for a later redrive."""
        self.first_pending.setdefault(tp, offset)
        self.scanned_to[tp] = max(self.scanned_to[tp], offset + 1)

    def add(self, tp: DlqPartition, offset: int, entry: StoredDeadLetter) -> None:
        """Put ``entry`` in the open chunk."""
        target = (entry.topic, entry.partition)
        if target not in self.targets:
            self.dlq.check_target(self.consumer, *target)
            self.targets.add(target)
        self.chunk.append((tp, offset, entry))
        self.scanned_to[tp] = max(self.scanned_to[tp], offset + 1)

    def commit(self) -> None:
        """Produce the chunk and store the new marks in one transaction."""
        if not self.chunk:
            return
        producer, timeout = self.producer, self.dlq.timeout
        touched = sorted({tp for tp, _o, _e in self.chunk})
        new_marks = {
            tp: Marks(self.marks[tp].committed, set(self.marks[tp].above)) for tp in touched
        }
        for tp, off, _entry in self.chunk:
            new_marks[tp].above.add(off)
        try:
            producer.begin_transaction()
            for _tp, _off, entry in self.chunk:
                producer.produce(
                    entry.topic,
                    value=entry.value,
                    key=entry.key,
                    partition=entry.partition,
                    headers=list[tuple[str, str | bytes | None]](entry.redrive_headers()),
                )
            offsets = []
            for tp in touched:
                mark = new_marks[tp]
                low = min(self.first_pending.get(tp, self.scanned_to[tp]), self.scanned_to[tp])
                mark.committed = max(mark.committed, low)
                mark.above = {o for o in mark.above if o >= mark.committed}
                text = encode_finished(mark.committed, mark.above)
                metadata = METADATA_PREFIX + text
                if len(metadata) > self.dlq.metadata_max_bytes:
                    metadata = ""  # too long for Kafka's metadata: the positions record holds it
                offsets.append(KafkaTP(tp[0], tp[1], mark.committed, metadata=metadata))
                if mark.above:
                    producer.produce(
                        self.dlq.positions_topic,
                        value=record_value(mark.committed, text),
                        key=record_key(self.dlq.group, tp),
                    )
            producer.send_offsets_to_transaction(
                offsets, self.consumer.consumer_group_metadata(), timeout
            )
            producer.commit_transaction(timeout)
        except KafkaException as exc:
            _abort(producer, timeout)
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            fenced = err is not None and err.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            )
            raise RuntimeFailure(
                f"redrive of {self.dlq.topic} stopped after {self.report.redriven} entries: "
                + ("another redrive of this topic took over" if fenced else _text(exc)),
                "the last transaction was rolled back; run the redrive again to continue",
            ) from None
        self.marks.update(new_marks)
        self.report.redriven += len(self.chunk)
        self.report.transactions += 1
        self.report.ids += [entry.id for _tp, _off, entry in self.chunk]
        self.chunk = []


def _decode(committed: int, text: str) -> tuple[int, ...]:
    try:
        return decode_finished(committed, text)
    except ValueError:
        raise RuntimeFailure(
            f"the stored redrive marks ({text[:60]!r}) are malformed",
            "reset the offsets of the htmqc-redrive.<topic> group",
        ) from None


def _text(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def _abort(producer: Producer, timeout: float) -> None:
    # Fenced or broken: the broker aborts it on timeout or on the next init.
    with suppress(KafkaException):
        producer.abort_transaction(timeout)


def _close(producer: Producer) -> None:
    producer.flush(1)
