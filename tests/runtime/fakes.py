"""A fake confluent-kafka consumer for engine tests without a broker.

It keeps one in-memory log per partition, assigns every partition at the
first ``consume`` (or when a test calls :meth:`FakeConsumer.rebalance`),
honours pause/resume, stores commits and answers ``committed``, and calls the
rebalance and ``on_commit`` callbacks from inside ``consume`` like librdkafka.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition as KafkaTP

TP = tuple[str, int]


class FakeMessage:
    """The parts of ``confluent_kafka.Message`` the runtime uses."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes):
        self._t, self._p, self._o, self._k, self._v = topic, partition, offset, key, value

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes:
        return self._v

    def __len__(self) -> int:
        return len(self._v) if self._v is not None else 0

    def error(self) -> None:
        return None

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (1, int(time.time() * 1000))


class FakeConsumer:
    """See module docs. ``logs[tp]`` is the list of ``(key, value)`` records."""

    def __init__(self, topic: str, logs: dict[TP, list[tuple[bytes | None, bytes]]]) -> None:
        self.topic = topic
        self.logs = logs
        self.positions: dict[TP, int] = {}
        self.paused: set[TP] = set()
        self.commits: dict[TP, tuple[int, str | None]] = {}
        self.commit_calls: list[dict[TP, int]] = []
        self.pause_events = 0
        self.resume_events = 0
        self.on_commit: Callable[[Any, list[Any]], None] | None = None
        self._callbacks: dict[str, Any] = {}
        self._pending: list[tuple[str, list[TP]]] = []
        self._acks: list[list[Any]] = []
        self._lock = threading.Lock()
        self.closed = False

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._callbacks = callbacks
        self._pending.append(("assign", sorted(self.logs)))

    def rebalance(self, kind: str, tps: list[TP]) -> None:
        """Schedule ``assign``/``revoke``/``lost`` for the next ``consume``."""
        with self._lock:
            self._pending.append((kind, tps))

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        with self._lock:
            pending, self._pending = self._pending, []
            acks, self._acks = self._acks, []
        for kind, tps in pending:
            self._callbacks[f"on_{kind}"](self, [KafkaTP(t, p) for t, p in tps])
        for parts in acks:
            if self.on_commit is not None:
                self.on_commit(None, parts)
        out: list[FakeMessage] = []
        for tp in sorted(self.positions):
            if tp in self.paused:
                continue
            log = self.logs[tp]
            pos = self.positions[tp]
            while pos < len(log) and len(out) < num_messages:
                key, value = log[pos]
                out.append(FakeMessage(tp[0], tp[1], pos, key, value))
                pos += 1
            self.positions[tp] = pos
        if not out:
            time.sleep(min(timeout, 0.005))
        return out

    def incremental_assign(self, parts: list[KafkaTP]) -> None:
        for p in parts:
            self.positions[(p.topic, p.partition)] = p.offset

    def incremental_unassign(self, parts: list[KafkaTP]) -> None:
        # Like librdkafka, a pause outlives unassign: it still holds if the
        # partition is assigned again (checked against Tansu).
        for p in parts:
            self.positions.pop((p.topic, p.partition), None)

    def pause(self, parts: list[KafkaTP]) -> None:
        self.pause_events += 1
        self.paused.update((p.topic, p.partition) for p in parts)

    def resume(self, parts: list[KafkaTP]) -> None:
        self.resume_events += 1
        self.paused.difference_update((p.topic, p.partition) for p in parts)

    def seek(self, part: KafkaTP) -> None:
        self.positions[(part.topic, part.partition)] = part.offset

    def committed(self, parts: list[KafkaTP], timeout: float) -> list[KafkaTP]:
        out = []
        for p in parts:
            offset, meta = self.commits.get((p.topic, p.partition), (-1001, None))
            out.append(KafkaTP(p.topic, p.partition, offset, metadata=meta or ""))
        return out

    def commit(self, offsets: list[KafkaTP], asynchronous: bool = True) -> list[KafkaTP] | None:
        for p in offsets:
            tp = (p.topic, p.partition)
            if p.offset >= self.commits.get(tp, (-1, None))[0]:
                self.commits[tp] = (p.offset, p.metadata)
        self.commit_calls.append({(p.topic, p.partition): p.offset for p in offsets})
        if asynchronous:
            with self._lock:
                self._acks.append(offsets)
            return None
        return offsets

    def position(self, parts: list[KafkaTP]) -> list[KafkaTP]:
        return [
            KafkaTP(p.topic, p.partition, self.positions.get((p.topic, p.partition), -1001))
            for p in parts
        ]

    def get_watermark_offsets(self, part: KafkaTP, timeout: float) -> tuple[int, int]:
        return (0, len(self.logs[(part.topic, part.partition)]))

    def close(self) -> None:
        self.closed = True


def make_logs(
    topic: str, partitions: int, count: int, keys: int
) -> dict[TP, list[tuple[bytes | None, bytes]]]:
    """``count`` records per partition, keys ``k{i % keys}``, values ``p:i``."""
    return {
        (topic, p): [(f"k{i % keys}".encode(), f"{p}:{i}".encode()) for i in range(count)]
        for p in range(partitions)
    }


class FakeProducer:
    """A producer whose every record is acknowledged at once; keeps them in
    :attr:`records` as ``(topic, value, key, headers)``."""

    records: list[tuple[str, bytes | None, Any, list[tuple[str, bytes]]]]

    def __init__(self) -> None:
        self.records = []

    def produce(self, topic: str, value: bytes | None = None, key: Any = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        self.records.append((topic, value, key, list(headers or [])))
        if on_delivery is not None:
            on_delivery(None, None)

    def flush(self, timeout: float = 0) -> int:
        return 0
