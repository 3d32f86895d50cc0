"""A stand-in for ``confluent_kafka.Consumer`` that serves a segment file.

:class:`SegmentConsumer` has the consumer methods :class:`~htmqc.runtime.Engine`
uses (``subscribe``, ``consume``, ``incremental_assign``/``unassign``,
``pause``/``resume``, ``seek``, ``position``, ``committed``, ``commit``,
``get_watermark_offsets``, ``close``) and hands out the segment's
:class:`~htmqc.replay.segment.SegmentMessage` records.

Order. Records are served in the segment's order, which is the order the
capture received them. Each partition has a cursor; ``consume`` repeatedly
takes the partition whose next record comes first in the file. If that
partition is paused (flow control), the batch ends there instead of skipping
ahead, so the sequence of records handed out never depends on when a pause
happened. A ``seek`` back (the engine re-reads from a stored position after a
rolled-back transaction) moves that partition's cursor back, and its records
are served again first, as a broker would.

Group. Every partition of the segment is assigned at the first ``consume``
(the ``on_assign`` callback runs inside it, like librdkafka's), at the position
the engine asks for: records below it are not served. Commits are kept in
memory and acknowledged through ``on_commit`` at the next ``consume``;
``get_watermark_offsets`` answers the captured range. No I/O, no threads.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.replay.segment import SegmentMessage, SegmentReader

TP = tuple[str, int]
#: librdkafka's "no committed offset".
OFFSET_INVALID = -1001


class SegmentConsumer:
    """See module docs. ``on_progress(n)`` is called with each batch's size."""

    def __init__(
        self, reader: SegmentReader, on_progress: Callable[[int], None] | None = None
    ) -> None:
        self.reader = reader
        self.on_progress = on_progress
        self.on_commit: Callable[[Any, list[Any]], None] | None = None
        # per partition: file indices and offsets of its records, in order
        self._indices: dict[TP, list[int]] = {tp: [] for tp in reader.ranges}
        self._offsets: dict[TP, list[int]] = {tp: [] for tp in reader.ranges}
        for msg in reader:
            tp = (msg.topic(), msg.partition())
            self._indices[tp].append(msg.index)
            self._offsets[tp].append(msg.offset())
        self._cursor: dict[TP, int] = {}
        self._position: dict[TP, int] = {}
        self.paused: set[TP] = set()
        self.commits: dict[TP, tuple[int, str]] = {}
        self._callbacks: dict[str, Any] = {}
        self._pending_assign = False
        self._acks: list[list[Any]] = []
        self.delivered = 0
        self.closed = False

    @property
    def topics(self) -> list[str]:
        """The topics in the segment."""
        return sorted({t for t, _ in self.reader.ranges})

    def exhausted(self) -> bool:
        """Every assigned partition has served its last record."""
        return all(self._cursor[tp] >= len(self._indices[tp]) for tp in self._cursor)

    # -- group ----------------------------------------------------------------------------

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._callbacks = callbacks
        self._pending_assign = True

    def incremental_assign(self, parts: list[KafkaTP]) -> None:
        for p in parts:
            tp = (p.topic, p.partition)
            if tp not in self._indices:
                continue
            self._seek(tp, p.offset if p.offset >= 0 else self.reader.ranges[tp].start)

    def incremental_unassign(self, parts: list[KafkaTP]) -> None:
        for p in parts:
            tp = (p.topic, p.partition)
            self._cursor.pop(tp, None)
            self._position.pop(tp, None)
            self.paused.discard(tp)

    def pause(self, parts: list[KafkaTP]) -> None:
        self.paused.update((p.topic, p.partition) for p in parts)

    def resume(self, parts: list[KafkaTP]) -> None:
        self.paused.difference_update((p.topic, p.partition) for p in parts)

    def seek(self, part: KafkaTP) -> None:
        tp = (part.topic, part.partition)
        if tp in self._cursor:
            self._seek(tp, part.offset)

    def _seek(self, tp: TP, offset: int) -> None:
        self._cursor[tp] = bisect.bisect_left(self._offsets[tp], offset)
        self._position[tp] = offset

    # -- fetching -------------------------------------------------------------------------

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[SegmentMessage]:
        """Up to ``num_messages`` records in segment order (see module docs);
        never waits."""
        if self._pending_assign:
            self._pending_assign = False
            parts = [KafkaTP(t, p) for t, p in sorted(self._indices)]
            self._callbacks["on_assign"](self, parts)
        acks, self._acks = self._acks, []
        for parts in acks:
            if self.on_commit is not None:
                self.on_commit(None, parts)
        out: list[SegmentMessage] = []
        cursor, indices, reader = self._cursor, self._indices, self.reader
        while len(out) < num_messages:
            best: TP | None = None
            best_index = -1
            for tp, k in cursor.items():
                if k < len(indices[tp]) and (best is None or indices[tp][k] < best_index):
                    best, best_index = tp, indices[tp][k]
            if best is None or best in self.paused:
                break
            msg = reader[best_index]
            cursor[best] += 1
            self._position[best] = msg.offset() + 1
            out.append(msg)
        if out:
            self.delivered += len(out)
            if self.on_progress is not None:
                self.on_progress(len(out))
        return out

    def position(self, parts: list[KafkaTP]) -> list[KafkaTP]:
        """Next offset to serve; the range end once a partition is exhausted
        (so offsets missing at the end of the range become gaps)."""
        out = []
        for p in parts:
            tp = (p.topic, p.partition)
            pos = self._position.get(tp, OFFSET_INVALID)
            if tp in self._cursor and self._cursor[tp] >= len(self._indices[tp]):
                pos = max(pos, self.reader.ranges[tp].end)
            out.append(KafkaTP(p.topic, p.partition, pos))
        return out

    def get_watermark_offsets(
        self, part: KafkaTP, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        r = self.reader.ranges[(part.topic, part.partition)]
        return (r.start, r.end)

    # -- commits --------------------------------------------------------------------------

    def committed(self, parts: list[KafkaTP], timeout: float | None = None) -> list[KafkaTP]:
        out = []
        for p in parts:
            offset, meta = self.commits.get((p.topic, p.partition), (OFFSET_INVALID, ""))
            out.append(KafkaTP(p.topic, p.partition, offset, metadata=meta))
        return out

    def commit(
        self, offsets: list[KafkaTP] | None = None, asynchronous: bool = True
    ) -> list[KafkaTP] | None:
        for p in offsets or []:
            tp = (p.topic, p.partition)
            if p.offset >= self.commits.get(tp, (OFFSET_INVALID, ""))[0]:
                self.commits[tp] = (p.offset, p.metadata or "")
        if asynchronous:
            self._acks.append(list(offsets or []))
            return None
        return list(offsets or [])

    def close(self) -> None:
        self.closed = True
