"""``htmqc-kafka``: a Spark 4 Python streaming data source over confluent-kafka.

Why not Spark's own Kafka connector: ``spark-sql-kafka-0-10`` is a set of JVM
jars fetched from a Maven repository at session start (``--packages``), which a
machine without Maven access cannot reach; this source needs only PySpark and
confluent-kafka, both from PyPI.

How it reads: no consumer group. Offsets are ``{"topic/partition": next offset}``
dicts kept in Spark's checkpoint (``initialOffset`` / ``latestOffset``); each
micro-batch is one input partition per Kafka partition covering ``[start, end)``,
read by assign + seek with ``isolation.level=read_committed``, so records of
aborted transactions never appear. ``end`` is the partition's end at planning
time (last stable offset under read_committed; capped by ``maxRecordsPerBatch``),
probed with a fetch because the bundled broker's ``ListOffsets`` answer lags.
Offsets in the range that never arrive - transaction markers, aborted or
compacted records - are gaps: the reader hands what arrived to
:meth:`htmqc.core.partition.PartitionTracker.fetched`
with the range end, which checks the offsets are in order and inside the range
and counts the rest as finished, so the next batch starts exactly at ``end``.
Replaying a batch after a failure reads the same range again: the sink must be
idempotent per batch (:mod:`htmqc.spark.sinks`).

Options: ``bootstrap`` (required), ``topics`` (comma-separated, required),
``startingOffsets`` (``earliest`` (default), ``latest``, or JSON
``{"topic": {"0": 42}}`` with -2 = earliest, -1 = latest), ``maxRecordsPerBatch``
(offsets per micro-batch over all partitions, split evenly; default unlimited),
``pollTimeout`` (seconds a read waits for a missing record, default 30), and any
``kafka.``-prefixed librdkafka setting (``kafka.security.protocol`` ...).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, "
    "timestamp TIMESTAMP, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
NAME = "htmqc-kafka"
_EARLIEST, _LATEST = -2, -1


def register(spark: Any) -> None:
    """Make ``spark.readStream.format("htmqc-kafka")`` available in ``spark``."""
    spark.dataSource.register(HtmqcKafkaSource)


class HtmqcKafkaSource(DataSource):
    """The data source; see the module docs for options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))


class KafkaRange(InputPartition):
    """One Kafka partition's offsets ``[start, end)`` in one micro-batch."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _split(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition("/")
    return topic, int(part)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from partition ends and reads them by assign + seek.

    ``trigger(availableNow=True)`` fixes the ends when the query starts
    (:meth:`prepareForTriggerAvailableNow`) and then runs as many batches of
    ``maxRecordsPerBatch`` as it takes to reach them.
    """

    def __init__(self, options: dict[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        if not opts.get("bootstrap") or not opts.get("topics"):
            raise ValueError("htmqc-kafka needs the options 'bootstrap' and 'topics'")
        self.topics = [t.strip() for t in opts["topics"].split(",") if t.strip()]
        self.starting = opts.get("startingoffsets", "earliest")
        limit = opts.get("maxrecordsperbatch")
        self.max_records = int(limit) if limit else None
        self.poll_timeout = float(opts.get("polltimeout", "30"))
        self.config: dict[str, Any] = {
            k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")
        }
        self.config["bootstrap.servers"] = opts["bootstrap"]
        self._client: Any = None
        self._target: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a librdkafka handle does not travel to executors
        return state

    # -- driver side ----------------------------------------------------------------

    def _consumer(self) -> Any:
        if self._client is None:
            self._client = _new_consumer(self.config)
        return self._client

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        marks: dict[str, tuple[int, int]] = {}
        for topic in self.topics:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise RuntimeError(f"htmqc-kafka: topic {topic!r} not found")
            for part in sorted(meta.partitions):
                tp = TopicPartition(topic, part)
                low, hint = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                marks[_key(topic, part)] = (low, _probe_end(consumer, tp, low, hint, 10.0))
        return marks

    def initialOffset(self) -> dict[str, int]:
        marks = self._watermarks()
        if self.starting in ("earliest", "latest"):
            pick = 0 if self.starting == "earliest" else 1
            return {k: v[pick] for k, v in marks.items()}
        wanted = json.loads(self.starting)
        start: dict[str, int] = {}
        for key, (low, high) in marks.items():
            topic, part = _split(key)
            chosen = int(wanted.get(topic, {}).get(str(part), _EARLIEST))
            start[key] = low if chosen == _EARLIEST else high if chosen == _LATEST else chosen
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: high for k, (_, high) in self._watermarks().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit | None = None) -> dict[str, int]:
        if self._target is not None:
            marks = {k: (int(start.get(k, 0)), high) for k, high in self._target.items()}
        else:
            marks = self._watermarks()
        per_partition = None
        if isinstance(limit, ReadMaxRows):
            per_partition = max(1, limit.max_rows // max(1, len(marks)))
        end: dict[str, int] = {}
        for key, (low, high) in marks.items():
            begin = max(int(start.get(key, low)), low)
            end[key] = high if per_partition is None else min(high, begin + per_partition)
            end[key] = max(end[key], begin)
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        for key, stop in sorted(end.items()):
            begin = int(start.get(key, 0))
            if stop > begin:
                topic, part = _split(key)
                ranges.append(KafkaRange(topic, part, begin, int(stop)))
        return ranges

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- executor side --------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaRange)
        return read_range(
            self.config, partition.topic, partition.partition, partition.start, partition.end,
            self.poll_timeout,
        )  # fmt: skip


def _probe_end(consumer: Any, tp: Any, low: int, hint: int, timeout: float) -> int:
    """The partition's end (high watermark, or last stable offset under
    read_committed) as the broker's fetch reports it.

    ``ListOffsets`` alone is not trusted: the bundled broker answers it with the
    base offset of the last record batch plus one. So read from just below the
    hint to the partition-EOF event, which carries the fetch's end offset; with
    a correct broker this reads at most the last record.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if hint <= low:
        return low
    consumer.assign([TopicPartition(tp.topic, tp.partition, max(low, hint - 1))])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=0.05):
                err = msg.error()
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    return max(int(msg.offset()), hint)
                raise KafkaException(err)
        raise TimeoutError(f"htmqc-kafka: no end of {tp.topic}/{tp.partition} in {timeout} s")
    finally:
        consumer.unassign()


def _new_consumer(config: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "group.id": f"htmqc-spark-{uuid.uuid4().hex}",  # required; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            **config,
        }
    )


def read_range(
    config: dict[str, Any], topic: str, part: int, start: int, end: int, timeout: float
) -> Iterator[tuple[Any, ...]]:
    """Rows of ``topic/part`` offsets ``[start, end)``; gaps in the range are passed.

    Stops at the first record at or past ``end``, or at the end of the partition
    (all of ``[start, end)`` was below the high watermark when planned, so what
    did not arrive is a gap). Raises ``TimeoutError`` if neither happens within
    ``timeout`` seconds of silence.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from htmqc.core.lifecycle import Event
    from htmqc.core.partition import PartitionTracker

    tracker = PartitionTracker(start)
    consumer = _new_consumer(config)
    try:
        consumer.assign([TopicPartition(topic, part, start)])
        arrived: list[int] = []
        done = False
        silent_since = time.monotonic()
        while not done:
            batch = consumer.consume(500, timeout=0.05)
            if not batch:
                if time.monotonic() - silent_since > timeout:
                    raise TimeoutError(f"htmqc-kafka: nothing from {topic}/{part} in {timeout} s")
                continue
            silent_since = time.monotonic()
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        break
                    raise KafkaException(err)
                off = msg.offset()
                if off >= end:
                    done = True
                    break
                arrived.append(off)
                ts_type, ts = msg.timestamp()
                yield (
                    msg.key(),
                    msg.value(),
                    topic,
                    part,
                    off,
                    dt.datetime.fromtimestamp(ts / 1000, tz=dt.UTC) if ts_type else None,
                    [(k, v) for k, v in (msg.headers() or [])],
                )
        # The range [start, end) is covered: what did not arrive is a gap.
        tracker.apply_many(Event.START, tracker.fetched(arrived, end))
        tracker.apply_many(Event.SUCCEED, arrived)
        if tracker.processed != end:
            raise RuntimeError(f"htmqc-kafka: {topic}/{part} stopped at {tracker.processed}")
    finally:
        consumer.close()
