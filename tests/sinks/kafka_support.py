"""Helpers for the Kafka→Kafka sink tests (the broker is the shared ``broker``
fixture of tests/conftest.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from htmqc.broker import create_topic


def make_topics(bootstrap: str, partitions: dict[str, int]) -> dict[str, str]:
    """Create uniquely named topics; returns logical name -> real name."""
    suffix = uuid.uuid4().hex[:8]
    names = {name: f"{name}-{suffix}" for name in partitions}
    for name, count in partitions.items():
        create_topic(bootstrap, names[name], count)
    return names


def produce_plain(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(15) == 0


def read_all(bootstrap: str, topic: str, *, committed_only: bool, wait: float = 1.5) -> list[bytes]:
    """Every record value of partition 0 of ``topic`` a fresh reader sees within ``wait`` s."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        }
    )
    try:
        reader.assign([KafkaTopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for msg in reader.consume(100, 0.2):
                if msg.error() is None:
                    out.append(bytes(msg.value() or b""))
        return out
    finally:
        reader.close()


def group_consumer(bootstrap: str, group: str, topic: str) -> Any:
    """A read_committed consumer of ``group`` holding partition 0 of ``topic``.

    It is assigned, not subscribed: the bundled broker holds a JoinGroup for
    half the rebalance timeout, and the sink only needs the group metadata."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([KafkaTopicPartition(topic, 0, 0)])
    return consumer
