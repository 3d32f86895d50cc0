"""``htmqc-kafka``: a Spark 4 Python data source (streaming and batch) over
confluent-kafka, with the options and columns of Spark's own Kafka connector.

When to use it rather than ``format("kafka")`` (``spark-sql-kafka-0-10``,
which :func:`htmqc.spark.session.build_session` puts on the classpath after
``make setup``): on a machine without the connector's jars, or to read with
``read_committed`` by default and htmqc's gap accounting (below). In the
README's one comparison run (Spark section, Figures) the two read at about
the same rate; Spark's connector is the older, more widely used code.

Options: :mod:`htmqc.spark.kafka_options` (checked at ``load()``). Offsets and
data loss: :mod:`htmqc.spark.kafka_offsets` (``failOnDataLoss``).

How it reads: no consumer group. Each micro-batch (or batch read) is one input
partition per Kafka partition covering ``[start, end)``, read by assign + seek
with ``isolation.level=read_committed`` unless set otherwise, so records of
aborted transactions never appear. ``end`` is the partition's end at planning
time (last stable offset under read_committed), confirmed by one fetch over all
partitions at once because the bundled broker's ``ListOffsets`` answer lags.
Offsets in the range that never arrive - transaction markers, aborted or
compacted records - are gaps: the reader hands what arrived to
:meth:`htmqc.core.partition.PartitionTracker.fetched` with the range end,
which checks the offsets are in order and inside the range and counts the rest
as finished, so the next batch starts exactly at ``end``. Records deleted
between planning and reading are data loss too. Replaying a batch after a
failure reads the same range again (the range's start is in the checkpoint):
the sink must be idempotent per batch (:mod:`htmqc.spark.sinks`).

Rows go to Spark as Arrow record batches; executors keep one consumer per
Python worker and settings (Spark reuses Python workers), so a task does not
pay for a new connection.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from htmqc.errors import UsageError
from htmqc.spark import loss_notes
from htmqc.spark.kafka_offsets import (
    DataLoss,
    DataLossError,
    LossNote,
    Snapshot,
    SourceOffset,
    TopicPartition,
    continue_from,
    ends,
    initial_positions,
    notes_due,
)
from htmqc.spark.kafka_options import (
    NAME,
    Offsets,
    Position,
    SourceOptions,
    Timestamps,
    parse_options,
    schema,
)

log = logging.getLogger("htmqc.spark.kafka")
_FROM = "@from"
_BATCH_ROWS = 8192
_ADMIN_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "socket.", "broker.")


def register(spark: Any) -> None:
    """Make ``format("htmqc-kafka")`` available in ``spark`` (read and readStream)."""
    spark.dataSource.register(HtmqcKafkaSource)


def stream_kafka(spark: Any, **options: str) -> Any:
    """``spark.readStream.format("htmqc-kafka")`` with ``options``, checked for a
    stream here, in the caller's process, before anything is planned: an option
    of a batch read (``endingOffsets``) fails now with one line, not when the
    query runs (a data source's ``load()`` is not told which kind of read follows).

    :raises UsageError: a missing, unknown, misplaced or malformed option.
    """
    parse_options(options, batch=False)
    return spark.readStream.format(NAME).options(**options).load()


def read_kafka(spark: Any, **options: str) -> Any:
    """``spark.read.format("htmqc-kafka")`` with ``options``, checked for a batch
    read first (:func:`stream_kafka`'s twin: ``maxOffsetsPerTrigger`` fails now).

    :raises UsageError: a missing, unknown, misplaced or malformed option.
    """
    parse_options(options, batch=True)
    return spark.read.format(NAME).options(**options).load()


class HtmqcKafkaSource(DataSource):
    """The data source; options are checked here, so a bad one fails ``load()``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        raw = dict(options)
        # load() does not say whether spark.read or spark.readStream follows: keep
        # both readings; an option wrong for both fails here, one wrong only for
        # the other kind fails when that kind of query starts.
        self.stream_options: SourceOptions | None = None
        self.batch_options: SourceOptions | None = None
        self.stream_error = self.batch_error = ""
        try:
            self.stream_options = parse_options(raw, batch=False)
        except UsageError as exc:
            self.stream_error = exc.line()
        try:
            self.batch_options = parse_options(raw, batch=True)
        except UsageError as exc:
            self.batch_error = exc.line()
        if self.stream_options is None and self.batch_options is None:
            raise ValueError(self.stream_error) from None
        settings = (self.stream_options or self.batch_options).consumer_config()  # type: ignore[union-attr]
        _check_settings(settings)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        chosen = self.stream_options or self.batch_options
        assert chosen is not None
        return schema(chosen.include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.stream_options is None:
            raise ValueError(self.stream_error)
        return KafkaStreamReader(self.stream_options)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.batch_options is None:
            raise ValueError(self.batch_error)
        return KafkaBatchReader(self.batch_options)


def _check_settings(settings: Mapping[str, str]) -> None:
    """librdkafka refuses unknown or bad settings when a client is made."""
    from confluent_kafka import Consumer, KafkaException

    try:
        Consumer({**settings, "group.id": "htmqc-check"}).close()
    except (KafkaException, ValueError, TypeError) as exc:
        text = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise ValueError(
            f"{NAME}: a kafka.* setting is refused by librdkafka: {text}; "
            "check the name and value (librdkafka's CONFIGURATION.md)"
        ) from None


class KafkaRange(InputPartition):
    """One Kafka partition's offsets ``[start, end)`` to read; ``notes``: the
    query's loss-notes group (:mod:`htmqc.spark.loss_notes`), if it keeps one."""

    def __init__(
        self, topic: str, partition: int, start: int, end: int, notes: str | None = None
    ) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.notes = notes


#: How long the driver waits for a cluster that never answered this query's planner.
FIRST_CONTACT_SECONDS = 5.0
#: How long it waits for one that answered before (a broker restarting).
PATIENCE_SECONDS = 15.0


class _Planner:
    """Driver side, shared by the stream and batch readers: partitions, their
    offsets now, offsets for times; and what to do with a loss."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Any = None
        self._admin: Any = None
        #: Whether the cluster has answered this planner once: until then a wrong
        #: address fails in FIRST_CONTACT_SECONDS, later an outage gets PATIENCE_SECONDS.
        self._reached = False
        self._last_error = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_consumer": None, "_admin": None,
                "_reached": False, "_last_error": ""}  # fmt: skip

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = _new_consumer(
                {"fetch.wait.max.ms": "10", **self.options.consumer_config()},
                error_cb=self._on_error,
            )
        return self._consumer

    def _on_error(self, err: Any) -> None:
        self._last_error = err.str()

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            conf = self.options.consumer_config()
            self._admin = AdminClient(
                {k: v for k, v in conf.items() if k.startswith(_ADMIN_PREFIXES)}
            )
        return self._admin

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None

    def _unreachable(self, exc: BaseException) -> RuntimeError:
        why = self._last_error or _text(exc)
        return RuntimeError(
            f"{NAME}: cannot list topics at {self.options.bootstrap} ({why}); "
            "check kafka.bootstrap.servers and that the brokers are up"
        )

    def _topic_partitions(self) -> dict[str, int]:
        """Topic -> partition count for every topic this query reads that exists.

        Asks in one-second tries until the cluster answers: for
        :data:`FIRST_CONTACT_SECONDS` before it ever did (a wrong address fails
        the query's start at once, naming librdkafka's reason), for
        :data:`PATIENCE_SECONDS` after (a broker restarting mid-query)."""
        from confluent_kafka import KafkaException

        client = self._client()
        budget = PATIENCE_SECONDS if self._reached else FIRST_CONTACT_SECONDS
        deadline = time.monotonic() + budget
        while True:
            try:
                meta = client.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                break
            except KafkaException as exc:
                client.poll(0)  # serves error_cb: the connection's own reason
                if time.monotonic() >= deadline:
                    raise self._unreachable(exc) from None
        self._reached = True
        counts = {
            name: len(t.partitions)
            for name, t in meta.topics.items()
            if t.error is None and t.partitions and not name.startswith("__")
        }
        return {t: n for t, n in counts.items() if self.options.matches(t)}

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        from confluent_kafka import KafkaException, TopicCollection

        if not topics:
            return {}
        ids: dict[str, str] = {}
        try:
            for topic, future in (
                self.admin()
                .describe_topics(TopicCollection(topics), request_timeout=15)
                .items()
            ):
                ids[topic] = str(future.result().topic_id)
        except KafkaException:
            return ids  # a broker without DescribeTopics: ids are not compared
        return ids

    def snapshot(self, *, first: bool = False) -> Snapshot:
        """Each partition read now with its earliest and end offsets.

        ``first``: a subscribed topic or an assigned partition that does not
        exist is an error (later on it is data loss, decided by the caller).
        """
        counts = self._topic_partitions()
        wanted: list[TopicPartition]
        if self.options.assign:
            wanted = [tp for tp in self.options.assign if tp[1] < counts.get(tp[0], 0)]
            missing = [tp for tp in self.options.assign if tp not in wanted]
        else:
            wanted = [(t, p) for t, n in sorted(counts.items()) for p in range(n)]
            missing = [(t, -1) for t in self.options.subscribe if t not in counts]
        if first and missing:
            named = ", ".join(t if p < 0 else f"{t}/{p}" for t, p in missing)
            raise RuntimeError(
                f"{NAME}: {named} not found at {self.options.bootstrap}; "
                "create it first or fix subscribe/assign"
            )
        if first and not wanted:
            raise RuntimeError(
                f"{NAME}: no topic at {self.options.bootstrap} matches "
                f"subscribePattern {self.options.pattern!r}; create one first or fix the pattern"
            )
        marks = self._marks(wanted)
        return Snapshot(marks, self._topic_ids(sorted({t for t, _ in wanted})))

    def _marks(self, wanted: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as TP

        consumer = self._client()
        marks: dict[TopicPartition, tuple[int, int]] = {}
        try:
            for tp in wanted:
                marks[tp] = consumer.get_watermark_offsets(TP(*tp), timeout=15, cached=False)
        except KafkaException as exc:
            raise self._unreachable(exc) from None
        highs = _probe_ends(consumer, marks, self.options.poll_timeout_ms / 1000)
        return {tp: (low, highs[tp]) for tp, (low, _) in marks.items()}

    def by_time(
        self, position: Timestamps, now: Snapshot, *, ending: bool
    ) -> dict[TopicPartition, int]:
        """The first offset at or after each partition's time (``offsets_for_times``)."""
        from confluent_kafka import TopicPartition as TP

        times: dict[TopicPartition, int] = {}
        for tp in now.partitions:
            at = position.everywhere
            if at is None:
                at = position.per_partition.get(tp)
            if at is None:
                raise RuntimeError(
                    f"{NAME}: {tp[0]}/{tp[1]} has no time in the "
                    f"{'ending' if ending else 'starting'}OffsetsByTimestamp option; "
                    "name every partition read"
                )
            times[tp] = at
        if not times:
            return {}
        found = self._client().offsets_for_times(
            [TP(t, p, ms) for (t, p), ms in sorted(times.items())], timeout=15
        )
        out: dict[TopicPartition, int] = {}
        for tpo in found:
            tp = (tpo.topic, tpo.partition)
            low, high = now.partitions[tp]
            if tpo.offset >= 0:
                out[tp] = min(max(tpo.offset, low), high)
            elif ending or position.if_none == "latest":
                out[tp] = high
            else:
                raise RuntimeError(
                    f"{NAME}: {tp[0]}/{tp[1]} has no record at or after {times[tp]} ms; "
                    "set startingOffsetsByTimestampStrategy=latest to start at the end there"
                )
        return out

    def positions(
        self, position: Position, now: Snapshot, *, ending: bool = False
    ) -> tuple[dict[TopicPartition, int], list[DataLoss]]:
        """Offsets for a starting or ending option (``ending``: the batch reader)."""
        if isinstance(position, Timestamps):
            return self.by_time(position, now, ending=ending), []
        if position.where == "specific":
            self._check_named(position, now)
            if ending:
                return {
                    tp: now.partitions[tp][1] if o < 0 else o
                    for tp, o in position.per_partition.items()
                }, []
        return initial_positions(position, now)

    @staticmethod
    def _check_named(position: Offsets, now: Snapshot) -> None:
        named, read = set(position.per_partition), set(now.partitions)
        unknown = sorted(named - read)
        if unknown:
            raise RuntimeError(
                f"{NAME}: offsets given for {', '.join(f'{t}/{p}' for t, p in unknown)}, "
                "which do not exist; name only existing partitions"
            )
        missing = sorted(read - named)
        if missing:
            raise RuntimeError(
                f"{NAME}: no offset given for {', '.join(f'{t}/{p}' for t, p in missing)}; "
                "name every partition read (-2 = earliest, -1 = latest), as Spark wants"
            )

    def on_loss(self, losses: list[DataLoss]) -> None:
        """Fail (``failOnDataLoss=true``) or log each loss."""
        if not losses:
            return
        if self.options.fail_on_data_loss:
            raise DataLossError(losses)
        for loss in losses:
            log.warning("%s: data loss (failOnDataLoss=false): %s", NAME, loss.line())


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return str(arg.str()) if hasattr(arg, "str") else str(arg)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from partition ends and reads them by assign + seek.

    An end offset records where each batch's partitions start when that is not
    the previous end (new partitions, and skips after a loss) under ``"@from"``,
    so a replay reads exactly the same ranges. ``trigger(availableNow=True)``
    fixes the ends when the query starts and runs batches of at most
    ``maxOffsetsPerTrigger`` until it reaches them.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.planner = _Planner(options)
        self._target: dict[TopicPartition, int] | None = None

    def initialOffset(self) -> dict[str, Any]:
        now = self.planner.snapshot(first=True)
        start, losses = self.planner.positions(self.options.starting, now)
        self.planner.on_loss(losses)
        offset = SourceOffset(start, now.topic_ids, notes=self._notes_group(None))
        return offset.with_losses(losses).to_json()

    def _notes_group(self, kept: str | None) -> str | None:
        """The loss-notes group: kept from the checkpoint, new if it has none;
        none with ``failOnDataLoss=true`` (a loss fails the reading task)."""
        if self.options.fail_on_data_loss:
            return None
        return kept or loss_notes.new_group()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        now = self.planner.snapshot()
        self._target = {tp: high for tp, (_, high) in now.partitions.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit | None = None) -> dict[str, Any]:
        previous = SourceOffset.from_json(start)
        now = self.planner.snapshot()
        begin, losses = continue_from(previous, now)
        self.planner.on_loss(losses)
        notes = self._notes_group(previous.notes)
        counted: dict[TopicPartition, int] = {}
        if notes is not None and previous.notes is not None:
            # Read-time losses of the batch that ended at ``previous``: already
            # logged by the executors; counted here.
            due, counted = notes_due(
                previous, loss_notes.read_notes(self.planner.admin(), previous.notes)
            )
            losses = [*losses, *due]
        highs = {tp: high for tp, (_, high) in now.partitions.items()}
        if self._target is not None:
            begin = {tp: o for tp, o in begin.items() if tp in self._target}
            highs = {tp: max(begin[tp], min(highs[tp], self._target[tp])) for tp in begin}
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = ends(begin, highs, rows)
        offset = SourceOffset(
            end, now.topic_ids, previous.lost_offsets, previous.loss_events, notes, counted
        )
        out = offset.with_losses(losses).to_json()
        moved = {tp: o for tp, o in begin.items() if previous.next.get(tp) != o}
        if moved:
            out[_FROM] = SourceOffset(moved).to_json()
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = dict(SourceOffset.from_json(start).next)
        begin.update(SourceOffset.from_json(end.get(_FROM) or {}).next)
        last = SourceOffset.from_json(end)
        return _ranges(begin, last.next, last.notes)

    def commit(self, end: dict[str, Any]) -> None:
        """Offsets live in Spark's checkpoint, not in Kafka; Spark has written
        ``end``, so the loss notes it lists as counted can go."""
        offset = SourceOffset.from_json(end)
        if offset.notes is not None and offset.counted:
            loss_notes.clear_notes(self.planner.admin(), offset.notes, offset.counted)

    def stop(self) -> None:
        self.planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: ``startingOffsets`` to ``endingOffsets`` (or by time)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        planner = _Planner(self.options)
        try:
            now = planner.snapshot(first=True)
            begin, losses = planner.positions(self.options.starting, now)
            planner.on_loss(losses)
            stop, _ = planner.positions(self.options.ending, now, ending=True)
        finally:
            planner.close()
        past = sorted(tp for tp in stop if stop[tp] > now.partitions[tp][1])
        if past:
            t, p = past[0]
            raise RuntimeError(
                f"{NAME}: endingOffsets {stop[(t, p)]} for {t}/{p} is past its end "
                f"{now.partitions[(t, p)][1]}; end there or lower (-1 = latest)"
            )
        late = sorted(tp for tp in stop if stop[tp] < begin.get(tp, 0))
        if late:
            t, p = late[0]
            raise RuntimeError(
                f"{NAME}: {t}/{p} ends at {stop[(t, p)]} before it starts at {begin[(t, p)]}; "
                "check startingOffsets and endingOffsets"
            )
        return _ranges(begin, stop)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)


def _ranges(
    begin: Mapping[TopicPartition, int],
    stop: Mapping[TopicPartition, int],
    notes: str | None = None,
) -> list[Any]:
    return [
        KafkaRange(topic, part, begin[(topic, part)], end, notes)
        for (topic, part), end in sorted(stop.items())
        if (topic, part) in begin and end > begin[(topic, part)]
    ]


def _probe_ends(
    consumer: Any, marks: Mapping[TopicPartition, tuple[int, int]], timeout: float
) -> dict[TopicPartition, int]:
    """Each partition's end as the broker's fetch reports it, all partitions at once.

    ``ListOffsets`` alone is not trusted: the bundled broker answers it with the
    base offset of the last record batch plus one. So read from just below the
    answer to the partition-EOF event, which carries the fetch's end offset; with
    a correct broker this reads at most the last record batch of each partition.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka import TopicPartition as TP

    out = {tp: low for tp, (low, hint) in marks.items() if hint <= low}
    todo = {tp: hint for tp, (low, hint) in marks.items() if hint > low}
    if not todo:
        return out
    consumer.assign([TP(t, p, hint - 1) for (t, p), hint in todo.items()])
    try:
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=0.05):
                err = msg.error()
                if err is None:
                    continue
                tp = (msg.topic(), msg.partition())
                if err.code() == KafkaError._PARTITION_EOF and tp in todo:
                    out[tp] = max(int(msg.offset()), todo.pop(tp))
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
        if todo:
            t, p = next(iter(todo))
            raise TimeoutError(f"{NAME}: no end of {t}/{p} in {timeout:g} s")
    finally:
        consumer.unassign()
    return out


def _new_consumer(config: Mapping[str, str], error_cb: Callable[[Any], None] | None = None) -> Any:
    from confluent_kafka import Consumer

    callbacks = {} if error_cb is None else {"error_cb": error_cb}
    return Consumer(
        {
            **callbacks,
            "group.id": f"htmqc-spark-{uuid.uuid4().hex}",  # required; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": "10",
            **config,
        }
    )


_CONSUMERS: dict[tuple[tuple[str, str], ...], Any] = {}
"""Executor side: one consumer per settings per Python worker (workers are reused)."""


def _cached_consumer(config: Mapping[str, str]) -> Any:
    key = tuple(sorted(config.items()))
    consumer = _CONSUMERS.get(key)
    if consumer is None:
        consumer = _CONSUMERS[key] = _new_consumer(config)
    return consumer


def _arrow_schema(include_headers: bool) -> Any:
    import pyarrow as pa

    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([("key", pa.string()), ("value", pa.binary())])
        fields.append(("headers", pa.list_(header)))
    return pa.schema(fields)


def _to_batch(messages: list[Any], part: KafkaRange, include_headers: bool) -> Any:
    import pyarrow as pa

    stamps = [m.timestamp() for m in messages]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([part.topic] * len(messages), pa.string()),
        pa.array([part.partition] * len(messages), pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array(
            [ts * 1000 if kind else None for kind, ts in stamps], pa.timestamp("us", tz="UTC")
        ),
        pa.array([kind - 1 for kind, _ in stamps], pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in (m.headers() or [])] for m in messages],
                _arrow_schema(True).field("headers").type,
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=_arrow_schema(include_headers))


def read_range(options: SourceOptions, part: KafkaRange) -> Iterator[Any]:
    """Arrow record batches of ``part``'s offsets ``[start, end)``; gaps are passed.

    Stops at the first record at or past ``end``, or at the end of the partition
    (all of ``[start, end)`` was below the end when planned, so what did not
    arrive is a gap). Records deleted since planning are data loss (failed or
    skipped per ``failOnDataLoss``; skipped ones leave a loss note for the
    planner to count when the query keeps notes). Raises ``TimeoutError`` after
    ``kafkaConsumer.pollTimeoutMs`` of silence.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka import TopicPartition as TP

    from htmqc.core.lifecycle import Event
    from htmqc.core.partition import PartitionTracker

    consumer = _cached_consumer(options.consumer_config())
    timeout = options.poll_timeout_ms / 1000
    tracker = PartitionTracker(part.start)
    consumer.assign([TP(part.topic, part.partition, part.start)])
    try:
        arrived: list[int] = []
        pending: list[Any] = []
        skipped = 0
        done = False
        silent_since = time.monotonic()
        while not done:
            batch = consumer.consume(2000, timeout=0.05)
            if not batch:
                if time.monotonic() - silent_since > timeout:
                    raise TimeoutError(
                        f"{NAME}: nothing from {part.topic}/{part.partition} in {timeout:g} s"
                    )
                continue
            silent_since = time.monotonic()
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        break
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        tracker, arrived, lost = _skip_deleted(
                            consumer, options, part, tracker, arrived
                        )
                        skipped += lost
                        if tracker.next >= part.end:
                            done = True
                        break
                    raise KafkaException(err)
                off = msg.offset()
                if off >= part.end:
                    done = True
                    break
                arrived.append(off)
                pending.append(msg)
            if len(pending) >= _BATCH_ROWS or (done and pending):
                yield _to_batch(pending, part, options.include_headers)
                pending = []
        # The range is covered: what did not arrive is a gap.
        tracker.apply_many(Event.START, tracker.fetched(arrived, part.end))
        tracker.apply_many(Event.SUCCEED, arrived)
        if tracker.processed != part.end:
            raise RuntimeError(
                f"{NAME}: {part.topic}/{part.partition} stopped at {tracker.processed}"
            )
        if skipped and part.notes is not None:
            loss_notes.write_note(
                options.consumer_config(), part.notes, (part.topic, part.partition),
                LossNote(part.end, part.start, skipped),
            )  # fmt: skip
    finally:
        consumer.unassign()


def _skip_deleted(
    consumer: Any, options: SourceOptions, part: KafkaRange, tracker: Any, arrived: list[int]
) -> tuple[Any, list[int], int]:
    """Records in the range were deleted after planning: fail, or go on from the
    partition's earliest offset now (what arrived so far stays counted); the
    new tracker, arrivals, and the count of offsets skipped."""
    from confluent_kafka import TopicPartition as TP

    from htmqc.core.lifecycle import Event
    from htmqc.core.partition import PartitionTracker

    low, _ = consumer.get_watermark_offsets(
        TP(part.topic, part.partition), timeout=15, cached=False
    )
    at = arrived[-1] + 1 if arrived else part.start
    # Below the earliest: go on from it (this batch's share of the deleted
    # offsets ends at its range's end; the next planning sees the rest). Past
    # the end (the partition shrank): the rest of the range is gone.
    resume = min(low, part.end) if low > at else part.end
    what = "were deleted" if low > at else "are past the partition's end now"
    loss = DataLoss(
        part.topic, part.partition, "deleted",
        f"offsets {at}..{resume - 1} {what} while the batch read them", resume - at,
    )  # fmt: skip
    if options.fail_on_data_loss:
        raise DataLossError([loss])
    log.warning("%s: data loss (failOnDataLoss=false): %s", NAME, loss.line())
    if arrived:
        tracker.apply_many(Event.START, tracker.fetched(arrived, at))
        tracker.apply_many(Event.SUCCEED, arrived)
    resumed = PartitionTracker(resume)
    consumer.assign([TP(part.topic, part.partition, resume)])
    return resumed, [], resume - at
