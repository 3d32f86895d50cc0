"""The bundled broker starts, answers, round-trips a message and stops."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Message, Producer

from htmqc import broker as broker_module
from htmqc.broker import Broker, create_topic, start_broker, wait_reachable
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_defaults import CLASSIC_ONLY, consumer_config, is_local, producer_config
from htmqc.loopback import free_port
from tests.broker.readback import TopicFactory

pytestmark = pytest.mark.broker


def test_start_round_trip_through_a_group_and_stop() -> None:
    with start_broker() as broker:
        assert broker.running()
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert broker.log_path.exists()
        create_topic(broker.bootstrap, "round-trip", 2)
        producer = Producer(producer_config(broker.bootstrap))
        producer.produce("round-trip", b"hello", b"k")
        assert producer.flush(10) == 0
        del producer  # destroy it while the broker is up, or destroy waits for it
        consumer = Consumer(consumer_config(broker.bootstrap, "g-round-trip"))
        consumer.subscribe(["round-trip"])
        started = time.monotonic()
        got: list[Message] = []
        while not got and time.monotonic() - started < 20:
            got = [m for m in consumer.consume(10, 0.5) if m.error() is None]
        joined_in = time.monotonic() - started
        consumer.close()
        assert [(m.key(), m.value()) for m in got] == [(b"k", b"hello")]
        # the local timing makes a group join take seconds, not librdkafka's ~23 s
        assert joined_in < 10, joined_in
    assert not broker.running()
    assert not broker.log_path.exists()  # a clean stop removes the log
    broker.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", broker.port), timeout=1).close()


@pytest.mark.tansu_only
def test_start_on_a_given_port_and_reject_a_taken_one(broker: Broker) -> None:
    port = free_port()
    with start_broker(port) as mine:
        assert mine.port == port
        wait_reachable(mine.bootstrap, timeout=5)
    taken = rf"port {broker.port} on 127\.0\.0\.1 is already in use"
    with pytest.raises(RuntimeFailure, match=taken):
        start_broker(broker.port, ready_timeout=3)


def test_bad_port_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="out of range"):
        start_broker(70000)


def test_wait_reachable_gives_up_with_one_line() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RuntimeFailure) as info:
        wait_reachable(f"127.0.0.1:{port}", timeout=1.0)
    assert time.monotonic() - started < 5
    assert info.value.line() == (
        f"cannot reach broker at 127.0.0.1:{port}; "
        "start one with `htmqc broker` or check --bootstrap"
    )


def test_create_topic_is_idempotent_but_rejects_another_partition_count(broker: Broker) -> None:
    name = f"parts-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name, 3)
    create_topic(broker.bootstrap, name, 3)
    with pytest.raises(UsageError, match="exists with 3 partitions, not 5"):
        create_topic(broker.bootstrap, name, 5)


def test_new_topic_fixture_gives_distinct_topics(
    new_topic: TopicFactory, topic_factory: TopicFactory, broker: Broker
) -> None:
    first, second = new_topic(partitions=4), topic_factory(partitions=2)
    assert first != second
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "meta"})
    topics = consumer.list_topics(timeout=5).topics
    consumer.close()
    assert len(topics[first].partitions) == 4
    assert len(topics[second].partitions) == 2


@pytest.mark.parametrize(
    ("bootstrap", "local"),
    [
        ("127.0.0.1:9092", True),
        ("localhost:9092", True),
        ("127.0.0.1:1,localhost:2", True),
        ("[::1]:9092", True),
        ("10.0.0.5:9092", False),
        ("127.0.0.1:9092,kafka.example.com:9092", False),
        ("", False),
    ],
)
def test_is_local(bootstrap: str, local: bool) -> None:
    assert is_local(bootstrap) is local


def test_consumer_config_layers_base_local_then_overrides() -> None:
    local = consumer_config("127.0.0.1:9092", "g", {"session.timeout.ms": 45000})
    assert local["enable.auto.commit"] is False
    assert local["enable.auto.offset.store"] is False
    assert local["isolation.level"] == "read_committed"
    assert local["partition.assignment.strategy"] == "cooperative-sticky"
    assert local["max.poll.interval.ms"] == 10000
    assert local["session.timeout.ms"] == 45000  # the override wins
    remote = consumer_config("kafka.example.com:9092", "g")
    assert "session.timeout.ms" not in remote
    assert remote["group.id"] == "g"


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:9092", "kafka.example.com:9092"])
def test_the_consumer_group_protocol_leaves_out_the_classic_only_settings(bootstrap: str) -> None:
    """librdkafka refuses partition.assignment.strategy, session.timeout.ms and
    heartbeat.interval.ms under group.protocol=consumer: the defaults are left
    out, whichever way the protocol is chosen, and a consumer can be made."""
    classic = consumer_config(bootstrap, "g")
    assert "group.protocol" not in classic
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    for config in (
        consumer_config(bootstrap, "g", group_protocol="consumer"),
        consumer_config(bootstrap, "g", {"group.protocol": "consumer"}),
    ):
        assert config["group.protocol"] == "consumer"
        assert not set(CLASSIC_ONLY) & set(config)
        assert config["max.poll.interval.ms" if is_local(bootstrap) else "group.id"]
        Consumer(config).close()
    # a user's own classic-only setting is kept: librdkafka's refusal names it
    mine = consumer_config(bootstrap, "g", {"session.timeout.ms": 9000}, group_protocol="consumer")
    assert mine["session.timeout.ms"] == 9000
    with pytest.raises(KafkaException, match=r"session\.timeout\.ms"):
        Consumer(mine)


@pytest.mark.tansu_only
def test_a_spawn_on_a_taken_port_is_not_mistaken_for_ready(broker: Broker, tmp_path: Path) -> None:
    # The other broker on that port answers metadata; only our own log says ready.
    from htmqc.broker import _spawn, _wait_ready, broker_binary

    clash = _spawn(broker_binary(), "127.0.0.1", broker.port, tmp_path / "clash.log")
    try:
        assert _wait_ready(clash, ready_timeout=5) is False
    finally:
        clash.stop()
    assert broker.running()


def test_create_topic_waits_for_a_broker_that_has_not_caught_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker of a Kafka cluster can list a topic created a moment ago with no
    partitions yet (seen on the three-node cluster): that is not another count."""
    listed: list[int] = []

    class Admin:
        def create_topics(self, topics: list[Any], **_: Any) -> dict[str, Any]:
            return {"t": SimpleNamespace(result=lambda timeout: None)}

        def list_topics(self, topic: str, timeout: float) -> Any:
            count = 0 if len(listed) < 3 else 3
            listed.append(count)
            part = SimpleNamespace(leader=1, error=None)
            found = SimpleNamespace(partitions=dict.fromkeys(range(count), part), error=None)
            return SimpleNamespace(topics={"t": found})

    monkeypatch.setattr(broker_module, "_admin", lambda bootstrap, config: Admin())
    create_topic("127.0.0.1:1", "t", 3)
    assert listed[:3] == [0, 0, 0] and listed[-1] == 3
