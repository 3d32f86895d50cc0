"""A real Apache Pulsar standalone broker (:mod:`htmqc.sources.pulsar_server`, the jars
``make setup`` fetches from Maven Central) with ``pulsar-client`` from PyPI: a partitioned
topic read back through a failover subscription resumes after its cumulative acks, and
the launcher's start, restart and stop leave nothing running or on disk.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from htmqc.errors import RuntimeFailure
from htmqc.loopback import FLOOR, ephemeral_low
from htmqc.sources.pulsar_server import (
    PulsarServer,
    kept_bookie_port,
    pulsar_libs,
    start_pulsar,
)
from tests.services import require_module, require_pulsar

pytestmark = pytest.mark.slow


@pytest.fixture
def pulsar_module() -> Any:
    return require_module("pulsar")


@pytest.fixture
def client(pulsar_server: PulsarServer, pulsar_module: Any) -> Iterator[Any]:
    c = pulsar_module.Client(
        pulsar_server.url, logger=pulsar_module.ConsoleLogger(pulsar_module.LoggerLevel.Error)
    )
    yield c
    c.close()


def subscribe(pulsar: Any, client: Any, topic: str) -> Any:
    return client.subscribe(
        topic, "htmqc", consumer_type=pulsar.ConsumerType.Failover,
        initial_position=pulsar.InitialPosition.Earliest,
    )  # fmt: skip


def drain(pulsar: Any, consumer: Any, want: int, timeout: float = 20.0) -> list[Any]:
    """Receive until ``want`` messages came, then for another half second (to see extras)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got.append(consumer.receive(timeout_millis=500))
        except pulsar.Timeout:
            if len(got) >= want:
                break
    return got


def position(message: Any) -> tuple[int, int, int]:
    mid = message.message_id()
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index())


def test_a_failover_subscription_resumes_after_its_cumulative_acks(
    pulsar_server: PulsarServer, pulsar_module: Any, client: Any, topic_name: Callable[[], str]
) -> None:
    pulsar = pulsar_module
    topic = pulsar_server.create_partitioned_topic(topic_name(), 4)
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{p}" for p in range(4)]
    producer = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )  # fmt: skip
    for i in range(100):
        producer.send(f"m{i}".encode())
    producer.flush()
    producer.close()

    consumer = subscribe(pulsar, client, topic)
    first = drain(pulsar, consumer, 100)
    assert sorted(m.data() for m in first) == sorted(f"m{i}".encode() for i in range(100))
    by_partition: dict[str, list[Any]] = defaultdict(list)
    for m in first:
        by_partition[m.topic_name()].append(m)
    assert sorted(by_partition) == [f"{topic}-partition-{p}" for p in range(4)]
    acked: set[bytes] = set()
    resume: dict[str, bytes] = {}
    for part, messages in by_partition.items():
        # A partition's messages come in the order of their ids (ledger, entry, batch index).
        assert [position(m) for m in messages] == sorted(position(m) for m in messages), part
        cut = len(messages) // 2
        consumer.acknowledge_cumulative(messages[cut - 1])
        acked |= {m.data() for m in messages[:cut]}
        resume[part] = messages[cut].data()
    consumer.close()  # flushes the grouped acks

    consumer = subscribe(pulsar, client, topic)
    again = drain(pulsar, consumer, 100 - len(acked))
    consumer.close()
    data = [m.data() for m in again]
    assert len(data) == len(set(data)) == 100 - len(acked)
    assert set(data) == {f"m{i}".encode() for i in range(100)} - acked
    firsts: dict[str, bytes] = {}
    for m in again:
        firsts.setdefault(m.topic_name(), m.data())
    assert firsts == resume


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_start_restart_and_stop_leave_nothing_running(pulsar_module: Any) -> None:
    require_pulsar()
    pulsar = pulsar_module
    with start_pulsar() as server:
        pid, work = server.process.pid if server.process else 0, server.work
        assert server.running() and server.rss_bytes() > 0
        ports = (server.broker_port, server.web_port, server.bookie_port)
        # Ports no outgoing connection can take while it is down (tests/test_loopback.py).
        assert all(FLOOR <= p < ephemeral_low() for p in ports) and len(set(ports)) == 3
        assert all(_port_open(p) for p in ports)
        topic = server.create_partitioned_topic("kept", 1)
        client = pulsar.Client(server.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            producer = client.create_producer(topic)
            producer.send(b"before the restart")
            producer.close()
        finally:
            client.close()
        server.restart()  # an orderly stop, a start on the same data and ports
        assert server.process is not None and server.process.pid != pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        pid = server.process.pid
        assert all(_port_open(p) for p in ports)  # the bookie's too: the same ports
        client = pulsar.Client(server.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            consumer = subscribe(pulsar, client, topic)
            assert consumer.receive(timeout_millis=20_000).data() == b"before the restart"
            consumer.close()
        finally:
            client.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not work.exists()
    assert not any(_port_open(p) for p in ports)


def test_a_kept_bookies_port_is_read_from_its_cookie(tmp_path: Path) -> None:
    assert kept_bookie_port(tmp_path) is None  # no bookie ran here
    version = tmp_path / "bookie" / "current" / "VERSION"
    version.parent.mkdir(parents=True)
    version.write_text('5\nbookieHost: "127.0.0.1:28984"\njournalDir: "/x/bookie"\n')
    assert kept_bookie_port(tmp_path) == 28984
    version.write_text("5\njournalDir: \"/x/bookie\"\n")
    assert kept_bookie_port(tmp_path) is None


def test_a_start_on_a_kept_work_folder_names_the_port_its_bookie_listens_on(
    tmp_path: Path,
) -> None:
    """BookKeeper starts a bookie whose cookie exists on the cookie's port, whatever
    ``--bookkeeper-port`` says: ``bookie_port`` must be that one (a drawn one was
    named while nothing listened on it)."""
    require_pulsar()
    with start_pulsar(work=tmp_path) as first:
        port = first.bookie_port
    assert tmp_path.exists() and not _port_open(port)
    with start_pulsar(work=tmp_path) as again:
        assert again.bookie_port == port and _port_open(port)


def test_missing_jars_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("HTMQC_PULSAR_LIBS", str(tmp_path))
    with pytest.raises(RuntimeFailure, match="jars are not in") as raised:
        pulsar_libs()
    assert "make setup" in raised.value.fix
    with pytest.raises(RuntimeFailure, match="jars are not in"):
        start_pulsar()
