"""The raw-loop baseline consumes exactly ``count`` messages and commits them."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from benchmarks.raw_loop import run
from htmqc.broker import Broker
from htmqc.errors import UsageError
from htmqc.produce import parse_id, produce
from tests.broker.readback import TopicFactory

pytestmark = pytest.mark.broker


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """Sum of the group's committed offsets over the topic's partitions."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in got)


@pytest.mark.parametrize(("mode", "count"), [("raw", 3000), ("naive", 300)])
def test_loop_handles_each_message_once_and_commits_them(
    broker: Broker, new_topic: TopicFactory, mode: str, count: int
) -> None:
    topic = new_topic(partitions=3)
    produce(broker.bootstrap, topic, count)
    ids: list[int] = []

    def handler(message: Message) -> None:
        ids.append(parse_id(message.value() or b""))

    group = f"g-{topic}"
    result = run(broker.bootstrap, topic, count, mode, group=group, handler=handler)
    assert sorted(ids) == list(range(count))
    assert result["count"] == count and result["rate"] > 0
    assert result["commit_errors"] == 0
    if mode == "naive":
        assert result["commits"] == count
    else:
        assert result["commits"] <= count // 100  # one commit per batch, not per message
        assert result["commit_acks"] >= 2  # batches were committed during the run
    # every handled message is committed (async commits flushed by close)
    assert committed(broker.bootstrap, group, topic, 3) == count


def test_unknown_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown mode 'fast'"):
        run("127.0.0.1:1", "t", 1, "fast")
