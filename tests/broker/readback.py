"""Read a whole topic back with a plain assigned consumer (no group join)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from htmqc.produce import ID_HEADER, parse_id

TopicFactory = Callable[..., str]
"""The ``new_topic`` fixture: ``new_topic(partitions=1, prefix=None) -> name``."""


@dataclass(frozen=True)
class Record:
    """One message as read back."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    header_id: str | None
    timestamp_type: int

    @property
    def id(self) -> int:
        return parse_id(self.value)


def read_all(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 20.0
) -> list[Record]:
    """Every record of ``topic`` from the beginning until end-of-partition everywhere."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"readback-{uuid.uuid4().hex[:8]}",  # required, never joined
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        at_end: set[int] = set()
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(records)} records, partitions at end: {at_end}")
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                partition = cast(int, msg.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(partition)
                        continue
                    raise RuntimeError(err.str())
                at_end.discard(partition)
                headers = dict(msg.headers() or [])
                header = headers.get(ID_HEADER)
                records.append(
                    Record(
                        partition=partition,
                        offset=cast(int, msg.offset()),
                        key=cast(bytes | None, msg.key()),
                        value=cast(bytes, msg.value()),
                        header_id=header.decode() if isinstance(header, bytes) else header,
                        timestamp_type=msg.timestamp()[0],
                    )
                )
        return records
    finally:
        consumer.close()
