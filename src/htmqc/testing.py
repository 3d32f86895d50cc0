"""The fakes of the ports: a consumer, a producer and a message, with no broker.

The one set of stand-ins used by the runtime's tests, ``htmqc replay``
(:mod:`htmqc.replay.run` serves a segment file through :class:`FakeConsumer`)
and the engine benchmark. They implement :class:`~htmqc.ports.ConsumerPort`,
:class:`~htmqc.ports.ProducerPort` and :class:`~htmqc.ports.Message`.

:class:`FakeConsumer` serves a fixed sequence of records (any objects with the
message methods) in that order, one cursor per partition. Group: every
partition is assigned at the first ``consume`` after ``subscribe`` (or when a
test calls :meth:`FakeConsumer.rebalance`), and the rebalance and ``on_commit``
callbacks run inside ``consume``, as librdkafka's do. ``incremental_assign``
starts a partition where the engine says (or, without an offset, at its
committed offset, else its range start); records below are not served.
``pause``/``resume`` and ``seek`` work per partition; a pause outlives an
unassign, like librdkafka's. Commits are kept and acknowledged through
``on_commit`` at the next ``consume``.

Order: ``consume`` hands out the next records in the sequence among the
assigned partitions. A paused partition is skipped, as a broker would
(``strict=False``); with ``strict=True`` (replay) the batch ends at a paused
partition's next record instead, so the order of the records handed out never
depends on when a pause happened. While every partition is assigned, unpaused
and in step with the sequence, a batch is a slice (no per-record work), so the
engine benchmark measures the engine, not the fake.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from confluent_kafka import TopicPartition as KafkaTP

TP = tuple[str, int]
#: librdkafka's "no offset".
OFFSET_INVALID = -1001


class FakeMessage:
    """The parts of ``confluent_kafka.Message`` the runtime uses."""

    __slots__ = ("_h", "_k", "_o", "_p", "_t", "_ts", "_v")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self._t, self._p, self._o, self._k, self._v = topic, partition, offset, key, value
        self._h = headers
        self._ts = timestamp_ms

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def __len__(self) -> int:
        return len(self._v) if self._v is not None else 0

    def error(self) -> None:
        return None

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._h or [])

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts if self._ts is not None else int(time.time() * 1000))


def logs_to_records(
    logs: dict[TP, list[tuple[bytes | None, bytes]]],
) -> list[FakeMessage]:
    """``logs[tp]`` (``(key, value)`` records at offsets 0, 1, ...) as one sequence,
    partition after partition in sorted order."""
    return [
        FakeMessage(tp[0], tp[1], offset, key, value)
        for tp in sorted(logs)
        for offset, (key, value) in enumerate(logs[tp])
    ]


def make_logs(
    topic: str, partitions: int, count: int, keys: int
) -> dict[TP, list[tuple[bytes | None, bytes]]]:
    """``count`` records per partition, keys ``k{i % keys}``, values ``p:i``."""
    return {
        (topic, p): [(f"k{i % keys}".encode(), f"{p}:{i}".encode()) for i in range(count)]
        for p in range(partitions)
    }


class FakeConsumer:
    """See module docs. ``records``: the sequence served; ``ranges``: each
    partition's ``(low, high)`` offsets (default: from its records; a partition
    may have none); ``idle_sleep``: seconds a ``consume`` that has nothing
    sleeps (at most its timeout); ``on_progress(n)``: called with each batch's size."""

    def __init__(
        self,
        records: Sequence[Any],
        *,
        ranges: dict[TP, tuple[int, int]] | None = None,
        strict: bool = False,
        idle_sleep: float = 0.005,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.records = records
        self.strict = strict
        self.idle_sleep = idle_sleep
        self.on_progress = on_progress
        self.on_commit: Callable[[Any, list[Any]], None] | None = None
        self._index: dict[TP, list[int]] = {}
        self._offsets: dict[TP, list[int]] = {}
        for i, msg in enumerate(records):
            tp = (msg.topic(), msg.partition())
            self._index.setdefault(tp, []).append(i)
            self._offsets.setdefault(tp, []).append(msg.offset())
        self.ranges: dict[TP, tuple[int, int]] = {
            tp: (offs[0], offs[-1] + 1) for tp, offs in self._offsets.items()
        }
        self.ranges.update(ranges or {})
        for tp in self.ranges:
            self._index.setdefault(tp, [])
            self._offsets.setdefault(tp, [])
        #: Assigned partitions: the index (into their own records) of the next one.
        self._cursor: dict[TP, int] = {}
        #: Assigned partitions: the next offset to read (Kafka's position).
        self._position: dict[TP, int] = {}
        #: In step: every partition assigned, unpaused, and served up to ``_next``.
        self._in_step = False
        self._next = 0
        self.paused: set[TP] = set()
        self.commits: dict[TP, tuple[int, str]] = {}
        self.commit_calls: list[dict[TP, int]] = []
        self.pause_events = 0
        self.resume_events = 0
        self.delivered = 0
        self.closed = False
        self._callbacks: dict[str, Any] = {}
        self._pending: list[tuple[str, list[TP]]] = []
        self._acks: list[list[Any]] = []
        self._lock = threading.Lock()

    @classmethod
    def from_logs(
        cls, logs: dict[TP, list[tuple[bytes | None, bytes]]], **kwargs: Any
    ) -> FakeConsumer:
        """A consumer of ``logs`` (:func:`logs_to_records`)."""
        ranges = {tp: (0, len(log)) for tp, log in logs.items()}
        return cls(logs_to_records(logs), ranges=ranges, **kwargs)

    # -- views ----------------------------------------------------------------------------

    @property
    def topics(self) -> list[str]:
        """The topics of the records."""
        return sorted({t for t, _ in self.ranges})

    @property
    def positions(self) -> dict[TP, int]:
        """Assigned partitions and their next offsets."""
        self._leave_step()
        return dict(self._position)

    def exhausted(self) -> bool:
        """Every assigned partition has served its last record."""
        self._leave_step()
        return all(self._cursor[tp] >= len(self._index[tp]) for tp in self._cursor)

    # -- group ----------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Any, list[KafkaTP]], None] | None = None,
        on_revoke: Callable[[Any, list[KafkaTP]], None] | None = None,
        on_lost: Callable[[Any, list[KafkaTP]], None] | None = None,
    ) -> None:
        self._callbacks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        self._pending.append(("assign", sorted(tp for tp in self.ranges if tp[0] in topics)))

    def rebalance(self, kind: str, tps: list[TP]) -> None:
        """Schedule ``assign``/``revoke``/``lost`` of ``tps`` for the next ``consume``."""
        with self._lock:
            self._pending.append((kind, tps))

    def incremental_assign(self, partitions: list[KafkaTP]) -> None:
        self._leave_step()
        for p in partitions:
            tp = (p.topic, p.partition)
            if tp not in self.ranges:
                continue
            offset = p.offset
            if offset < 0:
                offset = self.commits.get(tp, (self.ranges[tp][0], ""))[0]
            self._seek(tp, offset)
        self._check_step()

    def incremental_unassign(self, partitions: list[KafkaTP]) -> None:
        self._leave_step()
        for p in partitions:
            self._cursor.pop((p.topic, p.partition), None)
            self._position.pop((p.topic, p.partition), None)

    def pause(self, partitions: list[KafkaTP]) -> None:
        self.pause_events += 1
        self.paused.update((p.topic, p.partition) for p in partitions)

    def resume(self, partitions: list[KafkaTP]) -> None:
        self.resume_events += 1
        self.paused.difference_update((p.topic, p.partition) for p in partitions)

    def seek(self, partition: KafkaTP) -> None:
        tp = (partition.topic, partition.partition)
        self._leave_step()
        if tp in self._cursor:
            self._seek(tp, partition.offset)

    def _seek(self, tp: TP, offset: int) -> None:
        self._cursor[tp] = bisect.bisect_left(self._offsets[tp], offset)
        self._position[tp] = offset

    # -- in step (the fast path) ------------------------------------------------------------

    def _check_step(self) -> None:
        """Enter the fast path when every partition is assigned, unpaused, and its
        cursor is where the sequence up to some point put it."""
        if self._in_step or len(self._cursor) != len(self.ranges) or self.paused:
            return
        served = min((self._index[tp][c] if c < len(self._index[tp]) else len(self.records))
                     for tp, c in self._cursor.items()) if self._cursor else 0
        for tp, c in self._cursor.items():
            if c != bisect.bisect_left(self._index[tp], served):
                return
        self._in_step, self._next = True, served

    def _leave_step(self) -> None:
        """Write the fast path's progress back into the cursors."""
        if not self._in_step:
            return
        self._in_step = False
        upto = self._next
        for tp in self._cursor:
            c = bisect.bisect_left(self._index[tp], upto)
            self._cursor[tp] = c
            offs = self._offsets[tp]
            if c > 0:
                self._position[tp] = max(self._position[tp], offs[c - 1] + 1)

    # -- fetching -------------------------------------------------------------------------

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        with self._lock:
            pending, self._pending = self._pending, []
            acks, self._acks = self._acks, []
        for kind, tps in pending:
            callback = self._callbacks.get(f"on_{kind}")
            if callback is not None:
                callback(self, [KafkaTP(t, p) for t, p in tps])
            elif kind == "assign":
                self.incremental_assign([KafkaTP(t, p) for t, p in tps])
        for parts in acks:
            if self.on_commit is not None:
                self.on_commit(None, parts)
        if self._in_step and self.paused:
            if self.paused >= self._cursor.keys():
                out: list[Any] = []  # everything paused (flow control): still in step
            else:
                self._leave_step()
                out = self._merge(num_messages)
        else:
            out = self._slice(num_messages) if self._in_step else self._merge(num_messages)
        if out:
            self.delivered += len(out)
            if self.on_progress is not None:
                self.on_progress(len(out))
        elif self.idle_sleep and timeout:
            time.sleep(min(timeout, self.idle_sleep) if timeout > 0 else self.idle_sleep)
        return out

    def _slice(self, n: int) -> list[Any]:
        start, records = self._next, self.records
        end = min(len(records), start + n)
        out = records[start:end] if isinstance(records, list) else [
            records[i] for i in range(start, end)
        ]
        self._next = end
        return out

    def _merge(self, n: int) -> list[Any]:
        """The next records in sequence order among the assigned partitions."""
        cursor, index, records = self._cursor, self._index, self.records
        heap = [(index[tp][c], tp) for tp, c in cursor.items() if c < len(index[tp])]
        heapq.heapify(heap)
        out: list[Any] = []
        if self.strict is False and heap and self.paused >= {tp for _, tp in heap}:
            return out  # every partition with records left is paused
        while heap and len(out) < n:
            i, tp = heapq.heappop(heap)
            if tp in self.paused:
                if self.strict:
                    break
                continue
            msg = records[i]
            out.append(msg)
            c = cursor[tp] = cursor[tp] + 1
            self._position[tp] = msg.offset() + 1
            if c < len(index[tp]):
                heapq.heappush(heap, (index[tp][c], tp))
        self._check_step()
        return out

    def position(self, partitions: list[KafkaTP]) -> list[KafkaTP]:
        """Next offset to serve; the range end once a partition is exhausted
        (so offsets missing at the end of the range become gaps)."""
        self._leave_step()
        out = []
        for p in partitions:
            tp = (p.topic, p.partition)
            pos = self._position.get(tp, OFFSET_INVALID)
            if tp in self._cursor and self._cursor[tp] >= len(self._index[tp]):
                pos = max(pos, self.ranges[tp][1])
            out.append(KafkaTP(p.topic, p.partition, pos))
        self._check_step()
        return out

    def get_watermark_offsets(
        self, partition: KafkaTP, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return self.ranges[(partition.topic, partition.partition)]

    # -- commits --------------------------------------------------------------------------

    def committed(self, partitions: list[KafkaTP], timeout: float = -1) -> list[KafkaTP]:
        out = []
        for p in partitions:
            offset, meta = self.commits.get((p.topic, p.partition), (OFFSET_INVALID, ""))
            out.append(KafkaTP(p.topic, p.partition, offset, metadata=meta))
        return out

    def commit(
        self, offsets: list[KafkaTP] | None = None, asynchronous: bool = True
    ) -> list[KafkaTP] | None:
        parts = list(offsets or [])
        for p in parts:
            tp = (p.topic, p.partition)
            if p.offset >= self.commits.get(tp, (OFFSET_INVALID, ""))[0]:
                self.commits[tp] = (p.offset, p.metadata or "")
        self.commit_calls.append({(p.topic, p.partition): p.offset for p in parts})
        if asynchronous:
            with self._lock:
                self._acks.append(parts)
            return None
        return parts

    def close(self) -> None:
        self.closed = True


class Produced(NamedTuple):
    """A record :class:`FakeProducer` took."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]


class FakeProducer:
    """A producer whose every record is acknowledged at once; keeps them in
    :attr:`records`. Thread-safe (lanes produce from several threads)."""

    def __init__(self) -> None:
        self.records: list[Produced] = []
        self._lock = threading.Lock()

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        with self._lock:
            self.records.append(Produced(topic, value, key, list(headers or [])))
        if on_delivery is not None:
            on_delivery(None, None)

    def flush(self, timeout: float = -1) -> int:
        return 0

    def header_values(self, name: str) -> list[str]:
        """The value of header ``name`` of each record that has it, in order."""
        out = []
        for record in self.records:
            for key, raw in record.headers:
                if key == name and raw is not None:
                    out.append(bytes(raw).decode())
        return out
