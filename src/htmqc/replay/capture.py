"""``htmqc capture``: copy a topic range into a segment file.

:func:`capture` reads ``[start, end)`` of each chosen partition with a plain
assigned consumer (no group join, no commits, ``read_committed``, so aborted
records and transaction markers become gaps, as the runtime sees them) and
writes the records, in the order the consumer delivered them, to a segment
(:mod:`htmqc.replay.segment`). Defaults: every partition, from its log start
to its high watermark at the time of the call. The file appears only when the
whole range was read (written to ``PATH.tmp``, renamed at the end).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.progress import progress as show_progress
from htmqc.replay.segment import PartitionRange, SegmentWriter


@dataclass
class CaptureReport:
    """What was captured."""

    path: str
    topic: str
    records: int
    bytes: int
    ranges: list[PartitionRange]
    seconds: float

    def summary(self) -> str:
        """One line for the terminal."""
        spans = ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in self.ranges)
        return (
            f"captured {self.records} records of {self.topic} ({spans}) to {self.path} "
            f"({self.bytes:,} bytes) in {self.seconds:.2f}s"
        )


def parse_offsets(text: str | None, what: str) -> int | dict[int, int] | None:
    """``--from``/``--to``: ``N`` (every partition) or ``P:N,P:N``.

    :raises UsageError: not of that form, or negative.
    """
    if text is None:
        return None
    try:
        if ":" not in text:
            value = int(text)
            if value < 0:
                raise ValueError
            return value
        out: dict[int, int] = {}
        for item in text.split(","):
            p, _, n = item.partition(":")
            out[int(p)] = int(n)
            if out[int(p)] < 0 or int(p) < 0:
                raise ValueError
        return out
    except ValueError:
        raise UsageError(
            f"{what} {text!r} is not an offset", f"pass {what} N or {what} P:N,P:N"
        ) from None


def parse_partitions(text: str | None) -> list[int] | None:
    """``--partitions 0,2,3``.

    :raises UsageError: not a list of partition numbers.
    """
    if text is None:
        return None
    try:
        parts = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise UsageError(
            f"--partitions {text!r} is not a list of partitions", "pass e.g. --partitions 0,1"
        ) from None
    if not parts or parts[0] < 0:
        raise UsageError(f"--partitions {text!r} is not valid", "pass e.g. --partitions 0,1")
    return parts


def _pick(value: int | dict[int, int] | None, partition: int, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int):
        return value
    return value.get(partition, default)


def capture(
    bootstrap: str,
    topic: str,
    out: str | Path,
    *,
    partitions: list[int] | None = None,
    start: int | dict[int, int] | None = None,
    end: int | dict[int, int] | None = None,
    timeout: float = 60.0,
    progress: bool = False,
    kafka_config: dict[str, Any] | None = None,
) -> CaptureReport:
    """Capture the range into the segment ``out`` (see module docs).

    :raises UsageError: unknown topic or partition, a range outside the log.
    :raises RuntimeFailure: broker unreachable, or the range not read in ``timeout`` s.
    """
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTP

    from htmqc.broker import wait_reachable
    from htmqc.kafka_defaults import consumer_config

    wait_reachable(bootstrap, timeout=min(timeout, 10.0))
    config = consumer_config(bootstrap, f"htmqc-capture-{uuid.uuid4().hex[:8]}", kafka_config)
    consumer = Consumer(config)
    started = time.perf_counter()
    try:
        # all topics: asking for one by name may auto-create it on some brokers
        meta = consumer.list_topics(timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise UsageError(f"topic {topic!r} does not exist on {bootstrap}", "check --topic")
        chosen = partitions if partitions is not None else sorted(meta.partitions)
        ranges: list[PartitionRange] = []
        targets: dict[int, int | None] = {}
        highs: dict[int, int] = {}
        for p in chosen:
            if p not in meta.partitions:
                raise UsageError(
                    f"topic {topic} has no partition {p}",
                    f"pick among 0..{len(meta.partitions) - 1}",
                )
            low, high = consumer.get_watermark_offsets(KafkaTP(topic, p), timeout=10)
            lo = _pick(start, p, low)
            hi = _pick(end, p, -1)
            if lo < low or (hi >= 0 and lo > hi):
                raise UsageError(
                    f"range [{lo}, {hi if hi >= 0 else 'end'}) of {topic}/{p} is outside its "
                    f"log, which starts at {low}",
                    "choose --from at or above the log start and --to above --from",
                )
            targets[p] = hi if hi >= 0 else None
            highs[p] = max(high, lo)
            ranges.append(PartitionRange(topic, p, lo, hi if hi >= 0 else _OPEN_END))
        writer = SegmentWriter(out, ranges)
        try:
            _read(consumer, writer, topic, ranges, targets, highs, timeout, progress)
            writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        consumer.close()
    return CaptureReport(
        path=str(out),
        topic=topic,
        records=writer.count,
        bytes=Path(out).stat().st_size,
        ranges=sorted(writer.ranges.values(), key=lambda r: r.partition),
        seconds=round(time.perf_counter() - started, 3),
    )


#: The provisional end of a range read "to the end", until the end is known.
_OPEN_END = 1 << 62
#: Seconds without a new record after which an open-ended range is complete.
QUIET = 0.5


def _read(
    consumer: Any,
    writer: SegmentWriter,
    topic: str,
    ranges: list[PartitionRange],
    targets: dict[int, int | None],
    highs: dict[int, int],
    timeout: float,
    progress: bool,
) -> None:
    """Consume the ranges into ``writer``. A partition with a target end is done
    once its position reaches it; one without (to the end) once its position
    reached the high watermark seen at the start and nothing new came for
    :data:`QUIET` seconds (some brokers report a high watermark below the last
    record of a batch, so the watermark alone is not trusted); its range end is
    then its position."""
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as KafkaTP

    todo = {r.partition for r in ranges if targets[r.partition] is None or r.start < r.end}
    seen = {r.partition: r.start for r in ranges}
    consumer.assign([KafkaTP(topic, p, seen[p]) for p in sorted(todo)])
    total = 0
    for p in todo:
        target = targets[p]
        total += (target if target is not None else highs[p]) - seen[p]
    deadline = time.monotonic() + timeout
    last_record = time.monotonic()
    with show_progress(total, "captured", enabled=progress) as advance:
        while todo:
            if time.monotonic() > deadline:
                left = ", ".join(str(p) for p in sorted(todo))
                raise RuntimeFailure(
                    f"capture of {topic} not complete after {timeout:.0f}s "
                    f"(partitions {left} still reading)",
                    "raise --timeout, lower --to, or check for open transactions in the range",
                )
            msgs = consumer.consume(500, 0.2)
            wrote = 0
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeFailure(f"capture failed: {err.str()}", "check the broker")
                p, off = msg.partition(), msg.offset()
                target = targets.get(p)
                if p not in todo or (target is not None and off >= target):
                    continue
                ts_type, ts = msg.timestamp()
                writer.append(
                    topic, p, off, ts, ts_type, msg.key(), msg.value(), msg.headers() or []
                )
                seen[p] = off + 1
                wrote += 1
            if wrote:
                advance(wrote)
                last_record = time.monotonic()
            if len(msgs) >= 500:
                continue
            quiet = time.monotonic() - last_record >= QUIET
            for pos in consumer.position([KafkaTP(topic, p) for p in sorted(todo)]):
                p = pos.partition
                if pos.offset is not None and pos.offset > seen[p]:
                    seen[p] = pos.offset  # markers / aborted records passed over
                target = targets[p]
                if target is not None and seen[p] >= target:
                    todo.discard(p)
                    writer.set_end(topic, p, target)
                elif target is None and seen[p] >= highs[p] and quiet:
                    todo.discard(p)
                    writer.set_end(topic, p, seen[p])
