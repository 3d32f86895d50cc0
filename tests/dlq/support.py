"""A message stand-in and dead-letter values shared by the DLQ tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from htmqc.dlq.record import DeadLetterInfo


@dataclass
class Msg:
    """The parts of ``confluent_kafka.Message`` the DLQ writers read."""

    t: str
    p: int
    o: int
    k: bytes | None
    v: bytes | None
    h: list[tuple[str, bytes | None]] | None = field(default=None)

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self.h


def info(
    kind: str = "failed",
    error_class: str = "builtins.ValueError",
    message: str = "bad",
    retries: int = 2,
    last: float = 2000.0,
    group: str = "g",
) -> DeadLetterInfo:
    """A dead-letter info with a fixed stack."""
    return DeadLetterInfo(
        kind=kind,
        error_class=error_class,
        error_message=message,
        stack=f"Traceback (most recent call last):\n  File 'h.py'\n{error_class}: {message}",
        retries=retries,
        first_failure_at=last - 1.5,
        last_failure_at=last,
        group=group,
    )


def read_topic(bootstrap: str, topic: str, partitions: int, expect: int) -> list[Any]:
    """Every committed record of ``topic`` (waits until ``expect`` arrived, then
    one more second for extras)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_committed"}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        settle: float | None = None
        while time.monotonic() < deadline:
            got += [m for m in consumer.consume(100, 0.2) if m.error() is None]
            if len(got) >= expect:
                settle = settle or time.monotonic() + 1.0
                if time.monotonic() > settle:
                    break
        return got
    finally:
        consumer.close()
