"""Apache Kafka on loopback: one combined node, or a three-node cluster.

The bundled broker (:mod:`htmqc.broker`, Tansu) starts in milliseconds but
deviates from Kafka exactly where exactly-once lives (see the README's
"Known limits of the bundled broker"). This module runs the real thing, from
the jars ``make setup`` resolves into ``build/kafka/libs`` (``$HTMQC_KAFKA_LIBS``
overrides the folder), for the tests, chaos runs, benchmarks and
``htmqc broker --kafka``.

Every node is a KRaft *combined* node (``process.roles=broker,controller``)
started as ``java -cp LIBS/* kafka.Kafka server.properties`` after
``kafka.tools.StorageTool format`` with a fresh cluster id. With ``nodes=3``
the three controllers form a static quorum (``controller.quorum.voters``) and
topics default to replication factor 3 with ``min.insync.replicas=2``, as
are the transaction state log and the offsets topic; with ``nodes=1`` all of
those are 1. Timing is set for a loopback test broker (:data:`TEST_SETTINGS`):
no initial rebalance delay, timed-out transactions aborted within a second,
KIP-848 consumer-group session timeouts of seconds.

Contract:

- :func:`start_kafka` returns a :class:`KafkaCluster` once every node logged
  that it started and a metadata request lists every broker; otherwise every
  node it started is killed and :class:`~htmqc.errors.RuntimeFailure` names
  the failing node's log in one line (java missing or the jars missing say
  "run `make setup`"). Ports are free loopback ports unless given; a port
  taken between probing and binding is retried with fresh ports.
- Each node is killed (SIGKILL) by the kernel when the thread that started it
  exits, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), so no JVM outlives a
  killed test run. Start clusters from a thread that lives as long as they do.
- :meth:`KafkaCluster.close` kills every node and waits for it, then deletes
  the working directory (data and logs) unless ``keep_logs`` is set or a
  start failed; it is idempotent, and the cluster is a context manager.
- Faults for chaos runs: :meth:`KafkaCluster.kill` (any signal; SIGKILL is
  waited for), :meth:`~KafkaCluster.stop` (SIGTERM, a controlled shutdown,
  SIGKILL after a grace period), :meth:`~KafkaCluster.start` (the same node id,
  ports and storage), :meth:`~KafkaCluster.pause` / :meth:`~KafkaCluster.resume`
  (SIGSTOP / SIGCONT). ``front`` puts something (a proxy) in front of each
  listener: clients, other brokers (replication, transaction markers) and
  the controllers (the Raft quorum, broker heartbeats) are told its port,
  while the readiness checks and look-ups use the node's own client port.
  :meth:`~KafkaCluster.in_sync` / :meth:`~KafkaCluster.wait_in_sync` tell
  when every replica is back in its partition's ISR (after a fault).
- Look-ups answer node ids: :meth:`~KafkaCluster.leader_of` (metadata, ``-1``
  when the partition has no leader now), :meth:`~KafkaCluster.active_controller`
  (DescribeQuorum), :meth:`~KafkaCluster.transaction_coordinator` and
  :meth:`~KafkaCluster.group_coordinator` (FindCoordinator, retried while the
  coordinator is loading); :meth:`~KafkaCluster.group_members` answers a
  group's members (DescribeGroups); see :mod:`htmqc.kafka_requests`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from htmqc import kafka_requests
from htmqc.broker import _die_with_parent, _port_taken
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.loopback import free_ports

LIBS_ENV = "HTMQC_KAFKA_LIBS"
#: Where ``make setup`` puts the jars, in a source checkout.
REPO_LIBS = Path(__file__).resolve().parents[2] / "build" / "kafka" / "libs"
READY_LOG_TEXT = b"Kafka Server started"
_BIND_FAILED_LOG_TEXT = b"Address already in use"
_START_ATTEMPTS = 3
_STOP_GRACE_SECONDS = 15.0
_POLL_SECONDS = 0.1
#: Kafka error codes that mean "ask again shortly": coordinator loading / not
#: available / not the coordinator, leader or controller not available yet.
_RETRIABLE_CODES = frozenset({-1, 5, 14, 15, 16, 41})
HOST = "127.0.0.1"
_INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")

#: JVM options for throughput (benchmarks): a small heap (three nodes fit beside
#: the tests on a small machine), short GC pauses, both JIT compilers.
THROUGHPUT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-Djava.awt.headless=true",
)
#: The default (tests, ``htmqc broker --kafka``): the client JIT only. On a busy
#: two-core machine the optimising compiler's threads compete with start-up: a
#: node took 21-25 s to log its start with them and 6-13 s without (load 11-14,
#: see benchmarks/README.md), and a test broker never gets hot enough to miss them.
JVM_OPTIONS: tuple[str, ...] = (*THROUGHPUT_JVM_OPTIONS, "-XX:TieredStopAtLevel=1")
#: The storage format: a short-lived JVM.
_FORMAT_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m")

TEST_SETTINGS: Mapping[str, str] = {
    "num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Fewer internal partitions: each one is loaded on start and on failover.
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
    # A transaction whose producer died is aborted within transaction.timeout.ms
    # plus this interval (Kafka's default checks every 10 s).
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    # KIP-848 (group.protocol=consumer): the session and heartbeat are the
    # broker's; the defaults (45 s, 5 s) would hold a killed member's partitions
    # for 45 s. These match the classic protocol's loopback timing
    # (htmqc.kafka_defaults.LOCAL_BROKER_CONSUMER).
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "500",
    # The classic protocol's lower bound, stated: LOCAL_BROKER_CONSUMER asks 6 s.
    "group.min.session.timeout.ms": "6000",
    # Kafka's default, stated: a broker that misses heartbeats to the active
    # controller this long is fenced and its partitions get new leaders (chaos
    # runs pause brokers past it).
    "broker.session.timeout.ms": "9000",
    # The log cleaner (compacted topics such as htmqc-positions) takes this much
    # heap when it starts; Kafka's default is 128 MiB.
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "num.network.threads": "2",
    "num.io.threads": "4",
}
"""Broker settings for a loopback test broker, beside the replication ones."""

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
"""

_T = TypeVar("_T")

LISTENERS = ("client", "internal", "controller")
Front = Callable[[int, str, int], int]
"""``front(node_id, listener, port) -> port``: called for each node's listener
(one of :data:`LISTENERS`, on ``port``) before the nodes start (again on a
start retried with fresh ports); the answer is the port the others are told:
``client`` in metadata (clients), ``internal`` in the INTERNAL advertised
listener (replication fetches and transaction markers from the other brokers),
``controller`` in ``controller.quorum.voters`` (the Raft quorum and the
brokers' heartbeats to the active controller)."""


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars (``$HTMQC_KAFKA_LIBS`` or ``build/kafka/libs``).

    :raises RuntimeFailure: it holds no ``kafka_2.13-*.jar``.
    """
    libs = Path(os.environ.get(LIBS_ENV) or REPO_LIBS)
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise RuntimeFailure(
            f"Apache Kafka's jars are not in {libs}",
            "run `make setup` (it fetches them from Maven Central), "
            f"or set {LIBS_ENV} to a folder holding them",
        )
    return libs


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on the PATH.

    :raises RuntimeFailure: no Java runtime is installed.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeFailure(
            "java is not installed (Apache Kafka needs Java 17 or later)",
            "run `make setup` (it installs a JRE)",
        )
    return found


def new_cluster_id() -> str:
    """A random KRaft cluster id (a UUID in URL-safe base64, as ``kafka-storage random-uuid``).

    Like Kafka's ``Uuid.randomUuid`` it never starts with ``-``, which the storage
    tool's argument parser would take for an option.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def replication_settings(nodes: int) -> dict[str, str]:
    """Replication of topics and internal topics for a cluster of ``nodes`` brokers.

    Up to three replicas, and at least two in sync when there are three.
    """
    factor = min(nodes, 3)
    in_sync = 1 if factor == 1 else 2
    return {
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(factor),
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(in_sync),
    }


@dataclass
class KafkaNode:
    """One combined broker+controller JVM; clients reach it at ``HOST:advertised_port``."""

    node_id: int
    port: int
    """The node's own client listener (PLAINTEXT)."""
    internal_port: int
    """Replication and transaction markers between brokers (INTERNAL), never proxied."""
    controller_port: int
    advertised_port: int
    """The port metadata gives clients: ``port``, or a proxy's in front of it."""
    directory: Path
    advertised_internal_port: int = 0
    """The port other brokers reach INTERNAL on (``internal_port`` unless fronted)."""
    advertised_controller_port: int = 0
    """The port in ``controller.quorum.voters`` (``controller_port`` unless fronted)."""
    """Holds ``server.properties``, ``data/`` and ``kafka.log``."""
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        """The node's log (stdout and stderr of the JVM, and of the storage format)."""
        return self.directory / "kafka.log"

    @property
    def properties_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def address(self) -> str:
        """``HOST:port``, the node's own listener."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs, else ``None``."""
        return self.process.pid if self.process is not None and self.running() else None

    def running(self) -> bool:
        """Whether the JVM is alive (a paused one is)."""
        return self.process is not None and self.process.poll() is None

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> bytes:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read()
        except OSError:
            return b""


class KafkaCluster:
    """Running Kafka nodes; use :func:`start_kafka` to make one."""

    def __init__(
        self,
        nodes: Sequence[KafkaNode],
        work_dir: Path,
        cluster_id: str,
        *,
        java: str,
        libs: Path,
        jvm_options: Sequence[str],
        keep_logs: bool = False,
    ) -> None:
        self.nodes: tuple[KafkaNode, ...] = tuple(nodes)
        self.work_dir = work_dir
        self.cluster_id = cluster_id
        self.keep_logs = keep_logs
        """Keep ``work_dir`` (logs and data) after :meth:`close`."""
        self._java = java
        self._libs = libs
        self._jvm_options = tuple(jvm_options)
        self._closed = False

    # -- what clients need -----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's advertised address."""
        return ",".join(f"{HOST}:{n.advertised_port}" for n in self.nodes)

    @property
    def log_paths(self) -> list[Path]:
        return [n.log_path for n in self.nodes]

    def node(self, node_id: int) -> KafkaNode:
        """The node with id ``node_id`` (ids are 1..nodes)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise UsageError(
            f"no Kafka node {node_id} in this cluster",
            f"pick one of {[n.node_id for n in self.nodes]}",
        )

    def running(self) -> bool:
        """Whether every node's JVM is alive."""
        return all(n.running() for n in self.nodes)

    # -- faults ----------------------------------------------------------------------------

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the node; for SIGKILL, return once it is dead."""
        node = self.node(node_id)
        if not node.running() or node.process is None:
            return
        node.process.send_signal(sig)
        if sig == signal.SIGKILL:
            node.process.wait()
            node.paused = False
        elif sig == signal.SIGSTOP:
            node.paused = True
        elif sig == signal.SIGCONT:
            node.paused = False

    def stop(self, node_id: int, grace: float = _STOP_GRACE_SECONDS) -> None:
        """SIGTERM the node (a controlled shutdown), SIGKILL it after ``grace`` seconds."""
        node = self.node(node_id)
        if node.process is None or not node.running():
            return
        if node.paused:
            self.resume(node_id)
        node.process.terminate()
        try:
            node.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill(node_id)

    def start(self, node_id: int, ready_timeout: float = 60.0) -> None:
        """Start a stopped (or killed) node again on its ports and storage.

        Returns once it logged its start and metadata lists it again.
        :raises RuntimeFailure: it did not, in ``ready_timeout`` seconds.
        """
        node = self.node(node_id)
        if node.running():
            return
        since = node.log_size()
        self._spawn(node)
        if not self._wait_ready([node], {node.node_id: since}, ready_timeout):
            self.keep_logs = True
            self.kill(node_id)
            raise RuntimeFailure(
                f"Kafka node {node_id} did not start again within {ready_timeout:g}s",
                f"see {node.log_path}",
            )

    def pause(self, node_id: int) -> None:
        """SIGSTOP the node: it holds its connections and answers nothing."""
        self.kill(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        """SIGCONT a paused node."""
        self.kill(node_id, signal.SIGCONT)

    # -- look-ups --------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """The node id that leads ``topic``/``partition`` now, ``-1`` if none does.

        :raises RuntimeFailure: no node answered, or metadata has no such partition.
        """

        def ask(node: KafkaNode) -> int:
            meta = self._admin(node).list_topics(topic=topic, timeout=min(timeout, 5.0))
            found = meta.topics.get(topic)
            if found is None or found.error is not None or partition not in found.partitions:
                raise KeyError(topic)
            return int(found.partitions[partition].leader)

        return self._ask_any(f"the leader of {topic}/{partition}", ask, timeout)

    def active_controller(self, timeout: float = 10.0) -> int:
        """The node id of the KRaft quorum leader (the active controller)."""
        return self._ask_any(
            "the active controller",
            lambda node: kafka_requests.quorum_leader(HOST, node.port, timeout=2.0),
            timeout,
        )

    def transaction_coordinator(self, transactional_id: str, timeout: float = 10.0) -> int:
        """The node id that coordinates ``transactional_id``'s transactions."""
        return self._coordinator(transactional_id, kafka_requests.TRANSACTION_KEY, timeout)

    def group_coordinator(self, group: str, timeout: float = 10.0) -> int:
        """The node id that coordinates consumer group ``group``."""
        return self._coordinator(group, kafka_requests.GROUP_KEY, timeout)

    def in_sync(self) -> bool:
        """Whether every node runs unpaused and every partition of every topic has
        a leader and all its replicas in the ISR (metadata of one live node)."""
        if not all(n.running() and not n.paused for n in self.nodes):
            return False
        for node in self.nodes:
            with contextlib.suppress(KafkaException):
                meta = self._admin(node).list_topics(timeout=5.0)
                return all(
                    p.error is None and p.leader >= 0 and set(p.isrs) == set(p.replicas)
                    for t in meta.topics.values()
                    for p in t.partitions.values()
                )
        return False

    def wait_in_sync(self, timeout: float = 120.0) -> bool:
        """Wait until :meth:`in_sync` (``False`` if ``timeout`` seconds passed first,
        or the cluster was closed)."""
        deadline = time.monotonic() + timeout
        while not self.in_sync():
            if time.monotonic() >= deadline or self._closed:
                return False
            time.sleep(0.5)
        return True

    def group_members(self, group: str, timeout: float = 10.0) -> list[tuple[str, str]]:
        """``(member_id, client_id)`` of each member of consumer group ``group``, asked
        of its coordinator (retried while the coordinator moves or loads)."""

        def ask(node: KafkaNode) -> list[tuple[str, str]]:
            coordinator = self.node(
                kafka_requests.find_coordinator(
                    HOST, node.port, group, kafka_requests.GROUP_KEY, timeout=2.0
                )[0]
            )
            return kafka_requests.group_members(HOST, coordinator.port, group, timeout=2.0)

        return self._ask_any(f"the members of group {group!r}", ask, timeout)

    def warm_up(self, timeout: float = 60.0) -> None:
        """Create Kafka's offsets topic and transaction log now and wait until every
        partition of both has a leader and a coordinator answers.

        Kafka creates them on first use, and a client that comes first meets
        NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS for a few seconds (the
        bundled broker has no such delay); tests warm the session's brokers.
        """
        deadline = time.monotonic() + timeout
        self.group_coordinator("htmqc-warm-up", timeout=timeout)
        self.transaction_coordinator("htmqc-warm-up", timeout=timeout)
        while not all(self._all_led(topic) for topic in _INTERNAL_TOPICS):
            if time.monotonic() >= deadline:
                raise RuntimeFailure(
                    f"Kafka's internal topics did not get leaders within {timeout:g}s",
                    f"see the nodes' logs under {self.work_dir}",
                )
            time.sleep(_POLL_SECONDS)

    def _all_led(self, topic: str) -> bool:
        """Whether metadata shows ``topic`` with a leader for every partition."""
        for node in self.nodes:
            if node.running() and not node.paused:
                with contextlib.suppress(KafkaException):
                    found = self._admin(node).list_topics(topic=topic, timeout=5.0).topics[topic]
                    return bool(found.partitions) and all(
                        p.leader >= 0 and p.error is None for p in found.partitions.values()
                    )
        return False

    def _coordinator(self, key: str, key_type: int, timeout: float) -> int:
        what = "transaction" if key_type == kafka_requests.TRANSACTION_KEY else "group"
        return self._ask_any(
            f"the {what} coordinator of {key!r}",
            lambda node: kafka_requests.find_coordinator(
                HOST, node.port, key, key_type, timeout=2.0
            )[0],
            timeout,
        )

    def _ask_any(self, what: str, ask: Callable[[KafkaNode], _T], timeout: float) -> _T:
        """``ask`` each live, unpaused node in turn until one answers, for ``timeout`` s."""
        deadline = time.monotonic() + timeout
        last = "no node is running"
        while True:
            for node in self.nodes:
                if not node.running() or node.paused:
                    continue
                try:
                    return ask(node)
                except kafka_requests.KafkaRequestError as exc:
                    if exc.code not in _RETRIABLE_CODES:
                        raise RuntimeFailure(
                            f"cannot find {what}: {exc}", "see the nodes' logs"
                        ) from None
                    last = str(exc)
                except (OSError, KafkaException, KeyError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise RuntimeFailure(
                    f"cannot find {what} within {timeout:g}s ({last})",
                    f"see the nodes' logs under {self.work_dir}",
                )
            time.sleep(_POLL_SECONDS)

    @staticmethod
    def _admin(node: KafkaNode) -> AdminClient:
        return AdminClient({"bootstrap.servers": node.address, "log_level": 0})

    # -- lifecycle -------------------------------------------------------------------------

    def _spawn(self, node: KafkaNode) -> None:
        if node._log_file is None:
            node._log_file = node.log_path.open("ab")
        node.paused = False
        node.process = subprocess.Popen(
            [
                self._java,
                *self._jvm_options,
                f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
                "-cp",
                f"{self._libs}/*",
                "kafka.Kafka",
                str(node.properties_path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=node._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us; we stop the nodes
            preexec_fn=_kill_with_parent if sys.platform.startswith("linux") else None,
        )

    def _registered(self, node_ids: set[int]) -> bool:
        """Whether a metadata answer from some live node lists every id of ``node_ids``."""
        for node in self.nodes:
            if not node.running() or node.paused:
                continue
            with contextlib.suppress(KafkaException):
                brokers = self._admin(node).list_topics(timeout=1.0).brokers
                return node_ids <= set(brokers)
        return False

    def _wait_ready(
        self, nodes: Sequence[KafkaNode], since: Mapping[int, int], timeout: float
    ) -> bool:
        """Whether each of ``nodes`` logs its start (after ``since``) and metadata lists it."""
        deadline = time.monotonic() + timeout
        waiting = {n.node_id for n in nodes}
        while time.monotonic() < deadline:
            for node in nodes:
                if not node.running():
                    return False
                if node.node_id in waiting and READY_LOG_TEXT in node.log_since(
                    since.get(node.node_id, 0)
                ):
                    waiting.discard(node.node_id)
            if not waiting and self._registered({n.node_id for n in nodes}):
                return True
            time.sleep(_POLL_SECONDS)
        return False

    def close(self) -> None:
        """Kill every node, wait for each, delete the working directory. Idempotent."""
        if self._closed:
            return
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
        for node in self.nodes:
            if node.process is not None:
                node.process.wait()
            if node._log_file is not None:
                node._log_file.close()
                node._log_file = None
        self._closed = True
        if not self.keep_logs:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_kill_with_parent = functools.partial(_die_with_parent, signal.SIGKILL)


def _properties(
    node: KafkaNode, voters: Mapping[int, int], overrides: Mapping[str, object]
) -> dict[str, str]:
    """``server.properties`` of ``node``; ``voters``: node id -> the controller port
    the others reach it on.

    Clients use PLAINTEXT (advertised as ``node.advertised_port``), brokers talk
    to each other on INTERNAL (``node.advertised_internal_port``), controllers on
    CONTROLLER.
    """
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{i}@{HOST}:{port}" for i, port in sorted(voters.items())
        ),
        "listeners": f"PLAINTEXT://{HOST}:{node.port},INTERNAL://{HOST}:{node.internal_port},"
        f"CONTROLLER://{HOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{node.advertised_port},"
        f"INTERNAL://{HOST}:{node.advertised_internal_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.directory / "data"),
        **replication_settings(len(voters)),
        **TEST_SETTINGS,
    }
    props.update(
        {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in overrides.items()}
    )
    return props


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def _format(java: str, libs: Path, work: Path, nodes: Sequence[KafkaNode], cluster_id: str) -> None:
    """Format every node's storage (in parallel) with ``cluster_id``.

    :raises RuntimeFailure: a format failed; the line names that node's log.
    """
    running = []
    for node in nodes:
        with node.log_path.open("ab") as log:
            running.append(
                (
                    node,
                    subprocess.Popen(
                        [
                            java,
                            *_FORMAT_JVM_OPTIONS,
                            f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
                            "-cp",
                            f"{libs}/*",
                            "kafka.tools.StorageTool",
                            "format",
                            "--cluster-id",
                            cluster_id,
                            "--config",
                            str(node.properties_path),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_kill_with_parent if sys.platform.startswith("linux") else None,
                    ),
                )
            )
    failed = [node for node, proc in running if proc.wait() != 0]
    if failed:
        raise RuntimeFailure(
            f"formatting Kafka's storage failed for node {failed[0].node_id}",
            f"see {failed[0].log_path}",
        )


def start_kafka(
    nodes: int = 1,
    *,
    ports: Sequence[int] | None = None,
    front: Front | None = None,
    broker_config: Mapping[str, object] | None = None,
    jvm_options: Sequence[str] = JVM_OPTIONS,
    ready_timeout: float = 90.0,
    keep_logs: bool = False,
    work_dir: Path | None = None,
) -> KafkaCluster:
    """Format and start ``nodes`` combined Kafka nodes (ids 1..nodes) on loopback.

    ``ports``: each node's client port (default: free ones); ``front``: see
    :data:`Front` (default: every listener is reached directly); ``broker_config``: settings
    that override the defaults of every node; ``work_dir``: where the nodes'
    data and logs go (default: a new temporary directory). See the module docs
    for the rest.
    """
    if nodes < 1:
        raise UsageError(f"a Kafka cluster needs at least 1 node, got {nodes}", "pass 1 or 3")
    if ports is not None:
        if len(ports) != nodes:
            raise UsageError(
                f"{len(ports)} ports given for {nodes} Kafka nodes", "give one port per node"
            )
        for port in ports:
            if not 0 < port < 65536:
                raise UsageError(f"port {port} is out of range", "pass a port between 1 and 65535")
            if _port_taken(HOST, port):
                raise RuntimeFailure(
                    f"port {port} on {HOST} is already in use", "pick another or omit it"
                )
    java, libs = java_binary(), kafka_libs()
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    work = work_dir or Path(tempfile.mkdtemp(prefix="htmqc-kafka-"))
    (work / "log4j2.properties").write_text(_LOG4J2)
    failure = "did not start"
    failed_log = work
    for attempt in range(1 if ports is not None else _START_ATTEMPTS):
        cluster = _start_attempt(
            nodes,
            work / f"attempt-{attempt}" if attempt else work,
            work,
            ports=ports,
            front=front,
            broker_config=broker_config or {},
            java=java,
            libs=libs,
            jvm_options=jvm_options,
            keep_logs=keep_logs,
        )
        since = {n.node_id: n.log_size() for n in cluster.nodes}
        for node in cluster.nodes:
            cluster._spawn(node)
        if cluster._wait_ready(cluster.nodes, since, ready_timeout):
            return cluster
        exited = [
            n for n in cluster.nodes if n.process is not None and n.process.poll() is not None
        ]
        failed_node = exited[0] if exited else cluster.nodes[0]
        if exited and failed_node.process is not None:
            failure = (
                f"node {failed_node.node_id} exited with code {failed_node.process.returncode}"
            )
        else:
            failure = f"did not become ready within {ready_timeout:g}s"
        bind_failed = any(_BIND_FAILED_LOG_TEXT in n.log_since(0) for n in cluster.nodes)
        cluster.keep_logs = True
        cluster.close()
        failed_log = failed_node.log_path
        if not bind_failed:
            break
    raise RuntimeFailure(f"Apache Kafka {failure}", f"see {failed_log}")


def _start_attempt(
    nodes: int,
    root: Path,
    work: Path,
    *,
    ports: Sequence[int] | None,
    front: Front | None,
    broker_config: Mapping[str, object],
    java: str,
    libs: Path,
    jvm_options: Sequence[str],
    keep_logs: bool,
) -> KafkaCluster:
    """Lay out and format the nodes of one start attempt under ``root``."""
    free = iter(free_ports(3 * nodes if ports is None else 2 * nodes, HOST))
    clients = list(ports) if ports is not None else [next(free) for _ in range(nodes)]
    members = []
    for i, client in enumerate(clients, start=1):
        members.append(
            KafkaNode(
                node_id=i,
                port=client,
                internal_port=next(free),
                controller_port=next(free),
                advertised_port=client,
                directory=root / f"node-{i}",
            )
        )
    for node in members:
        node.advertised_internal_port = node.internal_port
        node.advertised_controller_port = node.controller_port
        if front is not None:
            node.advertised_port = front(node.node_id, "client", node.port)
            node.advertised_internal_port = front(node.node_id, "internal", node.internal_port)
            node.advertised_controller_port = front(
                node.node_id, "controller", node.controller_port
            )
    voters = {n.node_id: n.advertised_controller_port for n in members}
    for node in members:
        node.directory.mkdir(parents=True)
        _write_properties(node.properties_path, _properties(node, voters, broker_config))
    cluster_id = new_cluster_id()
    _format(java, libs, work, members, cluster_id)
    return KafkaCluster(
        members,
        work,
        cluster_id,
        java=java,
        libs=libs,
        jvm_options=jvm_options,
        keep_logs=keep_logs,
    )
