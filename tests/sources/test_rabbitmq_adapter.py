"""The RabbitMQ Streams adapter (:mod:`htmqc.sources.rabbitmq`) against a private node
(:mod:`htmqc.sources.rabbitmq_server`): offsets are stream offsets (dense from 0;
retention moves the first one forward and a read below it starts there: a gap),
bootstrap URLs, and a node that leaves nothing running. Run-level evidence is in
``test_rabbitmq_run.py``; seek, pause, ordered commits (without metadata here), refusals
in one line and the dead-letter producer, shared with NATS and Pulsar, and dense offsets
with keys and headers and the lease (a standby takes over when the holder goes), shared
with Pulsar, in ``test_source_contract.py``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.sources.rabbitmq import (
    Endpoint,
    RabbitStreamClient,
    RabbitStreamConsumer,
    endpoint_of,
    produce,
)
from htmqc.sources.rabbitmq_server import RabbitServer, start_rabbitmq
from tests.services import require_rabbitmq_server
from tests.sources.support import assign_at, drain

pytestmark = pytest.mark.slow


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
