"""The JetStream adapter (:mod:`htmqc.sources.nats`) against a real ``nats-server``:
offsets are stream sequences minus one (dense, with holes where messages were
deleted or purged), one assignment of every partition, nothing left on the
server after close; and the launcher leaves nothing running. Run-level evidence
is in ``test_nats_run.py``; seek, pause, commits in the KV bucket (with their
metadata) and refusals in one line, shared with RabbitMQ and Pulsar, in
``test_source_contract.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.produce import parse_id
from htmqc.sources.nats import (
    NatsClient,
    NatsConsumer,
    produce,
    sequence_and_time,
    stream_name,
)
from htmqc.sources.nats_server import NatsServer, start_nats
from tests.services import require_nats_server
from tests.sources.support import assign_at, check_offsets, drain

pytestmark = pytest.mark.slow


def test_offsets_are_sequences_minus_one_dense_with_holes_where_deleted(
    nats_server: NatsServer, client: NatsClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(nats_server.url, topic, 400, partitions=4, client=client)
    client.delete_message(topic, 1, 10)  # a hole in partition 1
    consumer = NatsConsumer(nats_server.url, "g")
    try:
        holes = {1: [10]}  # the deleted message is a hole
        want = {p: [o for o in range(100) if o not in holes.get(p, [])] for p in range(4)}
        check_offsets(consumer, topic, want, 100)
        assert client.watermarks(topic, 1) == (0, 100)
    finally:
        consumer.close()


def test_a_purge_moves_the_low_watermark_and_a_seek_below_it_lands_on_the_first_kept(
    nats_server: NatsServer, client: NatsClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(nats_server.url, topic, 50, partitions=1, client=client)
    client.call(client.js.purge_stream(stream_name(topic, 0), seq=21))  # keeps seq 21..
    assert client.watermarks(topic, 0) == (20, 50)
    consumer = NatsConsumer(nats_server.url, "g")
    try:
        consumer.subscribe([topic], on_assign=assign_at({0: 3}))
        got = drain(consumer, 30)
        assert [m.offset() for m in got] == list(range(20, 50))
    finally:
        consumer.close()


def test_close_leaves_no_pull_consumer_on_the_server(
    nats_server: NatsServer, client: NatsClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(nats_server.url, topic, 20, partitions=2, client=client)
    consumer = NatsConsumer(nats_server.url, "g")
    consumer.subscribe([topic], on_assign=assign_at({}))
    drain(consumer, 20)
    consumer.seek(KafkaTP(topic, 0, 0))  # one pull consumer replaced by another
    drain(consumer, 10)

    def consumers() -> int:
        return sum(
            client.call(client.js.stream_info(stream_name(topic, p))).state.consumer_count
            for p in range(2)
        )

    deadline = time.monotonic() + 5
    while consumers() != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert consumers() == 2, "a seek replaces the partition's pull consumer"
    consumer.close()
    assert consumers() == 0


def test_a_second_member_of_a_group_waits_until_the_first_lets_go(
    nats_server: NatsServer, client: NatsClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(nats_server.url, topic, 10, partitions=2, client=client)
    first, second, other = (NatsConsumer(nats_server.url, g) for g in ("g", "g", "other"))
    assigned: dict[str, int] = {}

    def counting(name: str) -> Callable[[Any, list[KafkaTP]], None]:
        def on_assign(c: Any, parts: list[KafkaTP]) -> None:
            assigned[name] = assigned.get(name, 0) + 1
            assign_at({})(c, parts)

        return on_assign

    try:
        first.subscribe([topic], on_assign=counting("first"))
        assert len(drain(first, 10)) == 10
        second.subscribe([topic], on_assign=counting("second"))
        other.subscribe([topic], on_assign=counting("other"))
        assert len(drain(other, 10)) == 10, "another group is not held back"
        assert drain(second, 1, timeout=1.5) == [], "a standby gets nothing"
        assert "second" not in assigned
        first.close()  # releases the lease: the standby takes over at once
        assert len(drain(second, 10, timeout=5)) == 10
        assert assigned == {"first": 1, "second": 1, "other": 1}
    finally:
        for c in (first, second, other):
            c.close()


def test_a_member_whose_lease_was_taken_stops(
    nats_server: NatsServer, client: NatsClient, topic_name: Callable[[], str]
) -> None:
    from htmqc.errors import RuntimeFailure
    from htmqc.sources.nats import leases_bucket

    topic = topic_name()
    produce(nats_server.url, topic, 10, partitions=1, client=client)
    consumer = NatsConsumer(nats_server.url, "g")
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        assert len(drain(consumer, 10)) == 10

        async def steal() -> None:
            kv = await leases_bucket(client.js)
            await kv.put(f"g.{topic}", b'{"member": "thief"}')

        client.call(steal())
        with pytest.raises(RuntimeFailure, match="another member took the NATS lease"):
            drain(consumer, 1, timeout=10)
    finally:
        consumer.close()


def test_a_server_killed_and_restarted_on_its_store_is_resumed(tmp_path: Path) -> None:
    """SIGKILL the server (longer down than a lease lives), restart it on the same
    port and store: the consumer reconnects, keeps (or takes again) its lease and
    reads what is published afterwards, without losing or repeating an offset."""
    binary = require_nats_server()
    server = start_nats(binary=binary, store=tmp_path / "js")
    consumer = None
    try:
        produce(server.url, "r", 100, partitions=2)
        consumer = NatsConsumer(server.url, "g", lease_seconds=2.0)
        consumer.subscribe(["r"], on_assign=assign_at({}))
        got = drain(consumer, 100)
        server.kill()
        time.sleep(3)
        server = start_nats(binary=binary, port=server.port, store=tmp_path / "js")
        produce(server.url, "r", 100, partitions=2, start_id=100)
        got += drain(consumer, 100, timeout=30)
        assert sorted(parse_id(m.value()) for m in got) == list(range(200))
        assert sorted((m.partition(), m.offset()) for m in got) == [
            (p, o) for p in range(2) for o in range(100)
        ]
    finally:
        if consumer is not None:
            consumer.close()
        server.stop()


def test_ack_subjects_parse_in_both_forms() -> None:
    assert sequence_and_time("$JS.ACK.s-0.c.1.42.7.1700000000123456789.0") == (
        42, 1_700_000_000_123
    )
    assert sequence_and_time("$JS.ACK.dom.hash.s-0.c.1.42.7.1700000000123456789.0.tok") == (
        42, 1_700_000_000_123
    )
    with pytest.raises(ValueError):
        sequence_and_time("_INBOX.x")


def test_the_launcher_leaves_nothing_running() -> None:
    binary = require_nats_server()
    server = start_nats(binary=binary)
    store, pid = server.store, server.process.pid
    assert asyncio.run(_answers(server.url))
    server.stop()
    assert server.process.poll() is not None and not store.exists()
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


async def _answers(url: str) -> bool:
    import nats

    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().account_info()
        return info is not None
    finally:
        await nc.close()
