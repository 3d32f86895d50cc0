"""The RabbitMQ Streams adapter (:mod:`htmqc.sources.rabbitmq`) against a private
node (:mod:`htmqc.sources.rabbitmq_server`): offsets are stream offsets (dense from
0; retention moves the first one forward and a read below it starts there: a gap),
key and headers, seek and pause, commits by offset tracking (one number) and their
callbacks, the lease (a standby takes over when the holder goes), refusals in one
line, and a node that leaves nothing running. Run-level evidence is in
``test_rabbitmq_run.py``; seek, pause and ordered commits (without metadata here),
shared with NATS, in ``test_source_contract.py``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.produce import ID_HEADER, parse_id
from htmqc.sources.rabbitmq import (
    Endpoint,
    RabbitStreamClient,
    RabbitStreamConsumer,
    RabbitStreamProducer,
    endpoint_of,
    produce,
)
from htmqc.sources.rabbitmq_server import RabbitServer, start_rabbitmq
from tests.services import require_rabbitmq_server
from tests.sources.support import assign_at, drain

pytestmark = pytest.mark.slow


def test_offsets_are_dense_stream_offsets_with_keys_and_headers(
    rabbitmq_server: RabbitServer, client: RabbitStreamClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(rabbitmq_server.url, topic, 300, partitions=3, client=client)
    consumer = RabbitStreamConsumer(rabbitmq_server.url, "g")
    assigned: list[list[KafkaTP]] = []
    try:

        def on_assign(c: Any, parts: list[KafkaTP]) -> None:
            assigned.append(parts)
            assign_at({})(c, parts)

        consumer.subscribe([topic], on_assign=on_assign)
        got = drain(consumer, 300)
        assert len(assigned) == 1, "one member: one assignment of every partition"
        assert sorted(p.partition for p in assigned[0]) == [0, 1, 2]
        by: dict[int, list[int]] = {}
        for msg in got:
            by.setdefault(msg.partition(), []).append(msg.offset())
            ident = parse_id(msg.value())  # message i: partition i % 3, offset i // 3
            assert (ident % 3, ident // 3) == (msg.partition(), msg.offset())
            assert msg.key() == f"k{ident % 100}".encode()
            assert (ID_HEADER, str(ident).encode()) in (msg.headers() or [])
            assert msg.topic() == topic and msg.error() is None
            assert msg.timestamp()[1] > 1_600_000_000_000
        assert by == {p: list(range(100)) for p in range(3)}
        positions = consumer.position([KafkaTP(topic, p) for p in range(3)])
        assert [p.offset for p in positions] == [100] * 3
        assert consumer.get_watermark_offsets(KafkaTP(topic, 1)) == (0, 100)
    finally:
        consumer.close()


def test_retention_moves_the_low_watermark_and_a_read_below_it_starts_at_the_first_kept(
    rabbitmq_server: RabbitServer, client: RabbitStreamClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    # Small segments and a small maximum: whole segments go from the head as it grows.
    client.create_topic(
        topic, 1, max_length_bytes=20_000, stream_max_segment_size_bytes=4_000
    )
    for start in range(0, 600, 100):  # retention is applied as segments roll over
        produce(rabbitmq_server.url, topic, 100, partitions=1, start_id=start, client=client)
    low, high = client.watermarks(topic, 0)
    assert 0 < low < high == 600, "retention deleted the head"
    consumer = RabbitStreamConsumer(rabbitmq_server.url, "g")
    try:
        consumer.subscribe([topic], on_assign=assign_at({0: 3}))
        got = drain(consumer, 600 - low)
        assert [m.offset() for m in got] == list(range(low, 600)), "a gap, then dense"
    finally:
        consumer.close()


def test_a_second_member_waits_as_a_standby_and_takes_over_when_the_first_goes(
    rabbitmq_server: RabbitServer, client: RabbitStreamClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(rabbitmq_server.url, topic, 20, partitions=2, client=client)
    first = RabbitStreamConsumer(rabbitmq_server.url, "g")
    second = RabbitStreamConsumer(rabbitmq_server.url, "g")
    try:
        first.subscribe([topic], on_assign=assign_at({}))
        assert len(drain(first, 20)) == 20
        second.subscribe([topic], on_assign=assign_at({}))
        assert drain(second, 1, timeout=1.5) == [], "the standby gets nothing"
        first.close()
        began = time.monotonic()
        assert len(drain(second, 20)) == 20
        assert time.monotonic() - began < 5, "the lease queue went with the connection"
    finally:
        first.close()
        second.close()


def test_dead_letters_go_to_their_own_streams(
    rabbitmq_server: RabbitServer, client: RabbitStreamClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    producer = RabbitStreamProducer(rabbitmq_server.url, topic)
    outcomes: list[Any] = []
    try:
        producer.produce(
            f"{topic}.dlq", value=b"v", key=b"k", headers=[("why", b"boom")],
            on_delivery=lambda err, _m: outcomes.append(err),
        )  # fmt: skip
        producer.produce(f"{topic}.dlq.poison", value=b"p", key=None, headers=None)
        assert producer.flush(10) == 0
    finally:
        producer.close()
    assert outcomes == [None]
    assert client.call(client.consumer.stream_exists(f"{topic}.dlq.poison"))
    assert client.call(_watermarks(client, f"{topic}.dlq")) == (0, 1)


async def _watermarks(client: RabbitStreamClient, stream: str) -> tuple[int, int]:
    from htmqc.sources.rabbitmq import watermarks

    return await watermarks(client.consumer, stream)


def test_subscribe_refuses_a_missing_topic_and_a_second_topic(
    rabbitmq_server: RabbitServer,
) -> None:
    consumer = RabbitStreamConsumer(rabbitmq_server.url, "g")
    try:
        with pytest.raises(UsageError, match="has no streams nope-0"):
            consumer.subscribe(["nope"])
        with pytest.raises(UsageError, match="consumes one topic"):
            consumer.subscribe(["a", "b"])
    finally:
        consumer.close()


def test_an_unreachable_node_is_one_line() -> None:
    with pytest.raises(RuntimeFailure, match="cannot reach RabbitMQ's stream port") as info:
        RabbitStreamConsumer("rabbitmq-stream://127.0.0.1:1", "g", connect_seconds=0.5)
    assert "\n" not in info.value.line()


def test_bootstrap_urls() -> None:
    assert endpoint_of("rabbitmq-stream://h:1") == Endpoint("h", 1)
    assert endpoint_of("rabbitmq-stream://u:p%40@h/vh?amqp-port=9") == Endpoint(
        "h", 5552, 9, "u", "p@", "vh"
    )
    for bad in ("nats://h:1", "h:1", "", "rabbitmq-stream://h:x"):
        with pytest.raises(UsageError):
            endpoint_of(bad)


def test_the_node_starts_on_its_own_ports_and_leaves_nothing_running() -> None:
    server = start_rabbitmq(binary=require_rabbitmq_server())
    home, pids = server.home, (server.process.pid, server.epmd.pid)
    try:
        assert server.started_seconds < 60
        c = RabbitStreamClient(server.url)
        c.create_topic("t", 1)
        assert c.partitions("t") == 1
        c.close()
        vm = _group_members(server.process.pid)
        assert any("beam" in cmd for cmd in vm), "the Erlang VM runs in the node's group"
    finally:
        server.stop()
    assert not home.exists()
    assert _group_members(pids[0]) == [] and _group_members(pids[1]) == []


def _group_members(pgid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(Path(f"/proc/{entry}/cmdline").read_text().replace("\0", " "))
        except (OSError, IndexError, ValueError):
            continue
    return out
