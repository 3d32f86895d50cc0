"""Apache Kafka on loopback (:mod:`htmqc.kafka_cluster`): start, look up, fault, stop.

The start and stop tests run their own node and check that nothing is left
afterwards: no JVM, no listener on any of its ports, no working directory.
The fault test uses the session's three-node cluster (the ``kafka3`` broker
of tests/conftest.py) and leaves every node running.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from htmqc.broker import create_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_cluster import (
    KafkaCluster,
    java_binary,
    kafka_libs,
    new_cluster_id,
    start_kafka,
)
from htmqc.kafka_defaults import consumer_config, producer_config
from htmqc.kafka_requests import GROUP_KEY, find_coordinator
from tests.runtime.test_run_broker import wait_for
from tests.services import missing

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}


@pytest.fixture(autouse=True)
def _kafka_installed() -> None:
    try:
        java_binary()
        kafka_libs()
    except RuntimeFailure as exc:
        missing(exc.problem)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def java_children(parent: int) -> list[int]:
    """Pids of live ``java`` processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if comm == "java" and int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def assert_nothing_left(pids: list[int], ports: list[int], work: Path) -> None:
    """Within 10 s (a killed JVM's threads take a moment to go: its main thread is
    a zombie while its sockets still listen), no pid is alive and no port listens."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids) and not any(listening(p) for p in ports):
            break
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []
    assert [p for p in ports if listening(p)] == []
    assert not work.exists()


def round_trip(bootstrap: str, topic: str) -> None:
    """A transactional write, and a read_committed group read that sees it once."""
    value = uuid.uuid4().hex.encode()
    producer = Producer(producer_config(bootstrap, transactional_id=f"t-{value[:6].decode()}"))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value, b"k")
    producer.commit_transaction(30)
    consumer = Consumer(consumer_config(bootstrap, f"g-{value[:6].decode()}"))
    consumer.subscribe([topic])
    got: list[bytes | None] = []
    deadline = time.monotonic() + 30
    while value not in got and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
    consumer.close()
    assert got.count(value) == 1


def test_single_node_serves_transactions_and_groups_then_leaves_nothing() -> None:
    before = set(java_children(os.getpid()))  # the session's own Kafka, if it started
    with start_kafka(1) as cluster:
        [node] = cluster.nodes
        assert node.node_id == 1 and node.pid is not None and node.log_path.exists()
        assert cluster.bootstrap == f"127.0.0.1:{node.port}"
        assert set(java_children(os.getpid())) - before == {node.pid}
        cluster.warm_up()
        internal = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
        for topic in ("__consumer_offsets", "__transaction_state"):
            assert len(internal.topics[topic].partitions) == 10  # TEST_SETTINGS
        create_topic(cluster.bootstrap, "round-trip", 2)
        round_trip(cluster.bootstrap, "round-trip")
        assert cluster.active_controller() == 1
        assert cluster.group_coordinator("g") == 1
        assert cluster.transaction_coordinator("t", timeout=30) == 1
        assert cluster.leader_of("round-trip", 1) == 1
        pids, ports, work = (
            [node.pid],
            [node.port, node.internal_port, node.controller_port],
            cluster.work_dir,
        )
    assert_nothing_left(pids, ports, work)
    assert set(java_children(os.getpid())) == before
    cluster.close()  # idempotent


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _leader_moves_off(cluster: KafkaCluster, topic: str, old: int) -> bool:
    try:
        return cluster.leader_of(topic, 0, timeout=2) not in (old, -1)
    except RuntimeFailure:
        return False


def test_three_node_cluster_replicates_and_survives_faults(kafka3_broker: KafkaCluster) -> None:
    """The session's three-node cluster (shared with the ``[kafka3]`` tests, so
    every node runs again at the end): replication, look-ups, and each fault."""
    cluster = kafka3_broker
    assert sorted(n.node_id for n in cluster.nodes) == [1, 2, 3]
    assert len(cluster.bootstrap.split(",")) == 3
    topic = f"replicated-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    seen: list[Any] = []

    def one_partition() -> bool:
        # The node asked may not have the new topic's metadata yet (a loaded box), and
        # the next look-up may ask another node: keep the answer that had it.
        seen[:] = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        return len(seen) == 1

    wait_for(one_partition, 30, f"{topic}'s metadata")
    [partition] = seen
    assert sorted(partition.replicas) == [1, 2, 3]  # the broker default: RF 3
    round_trip(cluster.bootstrap, topic)
    assert cluster.transaction_coordinator("t", timeout=30) in (1, 2, 3)
    assert cluster.group_coordinator("g") in (1, 2, 3)

    # a partition leader dies: another replica leads; it comes back on its storage
    leader = cluster.leader_of(topic, 0)
    old_pid = cluster.node(leader).pid
    cluster.kill(leader)
    assert cluster.node(leader).pid is None and not alive(old_pid or 0)
    _wait(lambda: _leader_moves_off(cluster, topic, leader), 30, "a new partition leader")
    round_trip(cluster.bootstrap, topic)  # min.insync.replicas=2 of the 2 left
    cluster.start(leader)
    assert cluster.node(leader).pid not in (None, old_pid)

    # the active controller is stopped: the quorum elects another
    controller = cluster.active_controller()
    cluster.stop(controller)
    assert cluster.node(controller).pid is None
    assert cluster.active_controller(timeout=30) != controller
    cluster.start(controller)

    # a paused node is still running, answers nothing, and serves again once resumed
    paused = next(n for n in cluster.nodes if n.node_id != cluster.active_controller())
    cluster.pause(paused.node_id)
    try:
        assert paused.running() and paused.paused
        with pytest.raises(OSError):  # a timeout: nobody reads the request
            find_coordinator("127.0.0.1", paused.port, "g", GROUP_KEY, timeout=1)
    finally:
        cluster.resume(paused.node_id)
    assert not paused.paused
    assert find_coordinator("127.0.0.1", paused.port, "g", GROUP_KEY)[0] in (1, 2, 3)
    assert cluster.leader_of(topic, 0) in (1, 2, 3)
    assert cluster.running()


def test_missing_java_or_jars_is_one_line_naming_make_setup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HTMQC_KAFKA_LIBS", str(tmp_path))
    with pytest.raises(RuntimeFailure) as jars:
        start_kafka(1)
    assert jars.value.line().startswith(
        f"Apache Kafka's jars are not in {tmp_path}; run `make setup`"
    )
    monkeypatch.delenv("HTMQC_KAFKA_LIBS")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeFailure) as java:
        start_kafka(1)
    assert java.value.line() == (
        "java is not installed (Apache Kafka needs Java 17 or later); "
        "run `make setup` (it installs a JRE)"
    )


def test_a_taken_port_and_bad_arguments_are_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeFailure, match=f"port {port} on 127.0.0.1 is already in use"):
            start_kafka(1, ports=[port])
    with pytest.raises(UsageError, match="at least 1 node"):
        start_kafka(0)
    with pytest.raises(UsageError, match="1 ports given for 3 Kafka nodes"):
        start_kafka(3, ports=[1])


def test_a_node_that_cannot_start_names_its_kept_log() -> None:
    temp = Path(tempfile.gettempdir())
    before_jvms = set(java_children(os.getpid()))
    with pytest.raises(RuntimeFailure) as info:
        # Kafka's own limit: at least one listener thread per listener
        start_kafka(1, broker_config={"num.network.threads": "0"})
    line = info.value.line()
    assert "\n" not in line and "Kafka" in line
    log = Path(line.rsplit("see ", 1)[1])
    assert log.name == "kafka.log" and log.exists()  # kept for the post-mortem
    assert "num.network.threads" in log.read_text()
    assert set(java_children(os.getpid())) == before_jvms
    # Only this run's directory: another worker's Kafka may be starting in a
    # sibling right now (deleting every new htmqc-kafka-* once broke its format).
    (kept,) = (d for d in log.parents if d.parent == temp and d.name.startswith("htmqc-kafka-"))
    shutil.rmtree(kept)


@pytest.fixture
def kafka_cli() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "htmqc", "broker", "--kafka"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_broker_command_runs_kafka_until_stopped_or_killed(
    kafka_cli: subprocess.Popen[str], sig: int
) -> None:
    """``htmqc broker --kafka`` prints the bootstrap; SIGTERM stops it cleanly (exit 0),
    and even SIGKILL of the command takes the JVM with it."""
    assert kafka_cli.stdout is not None and kafka_cli.stderr is not None
    first = kafka_cli.stdout.readline()
    assert first.startswith("bootstrap: 127.0.0.1:"), first + kafka_cli.stderr.read()
    bootstrap = first.split()[1]
    work = Path(kafka_cli.stderr.readline().split(" in ", 1)[1].split()[0])
    assert work.is_dir()
    [jvm] = java_children(kafka_cli.pid)
    create_topic(bootstrap, "cli", 1)  # it serves
    kafka_cli.send_signal(sig)
    code = kafka_cli.wait(timeout=30)
    if sig == signal.SIGTERM:
        assert code == 0
        assert "Traceback" not in kafka_cli.stderr.read()
        assert_nothing_left([jvm], [int(bootstrap.rsplit(":", 1)[1])], work)
    else:  # the kernel kills the orphan (PR_SET_PDEATHSIG); its temp dir stays behind
        assert_nothing_left([jvm], [int(bootstrap.rsplit(":", 1)[1])], Path("/nonexistent"))
        shutil.rmtree(work)


def test_cluster_ids_are_kafka_uuids_the_storage_tool_accepts() -> None:
    """22 URL-safe base64 characters of 16 random bytes, never a leading ``-``
    (one in 64 would otherwise be, and ``kafka-storage format`` takes it for an option)."""
    ids = [new_cluster_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert len(text) == 22 and not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16
    assert any("-" in text for text in ids)  # the alphabet is URL-safe base64's


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--nodes", "3"], "--nodes needs --kafka; add --kafka, or drop --nodes"),
        (
            ["--kafka", "--cert", "c.pem", "--key", "k.pem"],
            "--cert/--key do not apply to --kafka; drop them, or drop --kafka",
        ),
        (
            ["--kafka", "--nodes", "3", "--port", "9092"],
            "--port applies to a single Kafka node; drop --port or --nodes 3",
        ),
    ],
)
def test_broker_command_refuses_options_that_do_not_fit(args: list[str], line: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "htmqc", "broker", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"htmqc: error: {line}"
