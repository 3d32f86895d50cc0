"""Start a private RabbitMQ node with the stream plugin for tests, benchmarks and demos.

Contract
--------
:func:`start_rabbitmq` runs Debian's ``rabbitmq-server`` start script as a child
(not a daemon), in a new process group, with everything of its own: a fresh
directory for its Mnesia database, logs, ``HOME`` (Erlang's cookie) and
configuration; a unique node name ``htmqc-PORT@localhost``; free ports on
127.0.0.1 for AMQP 0-9-1 (the lease), the stream protocol (advertised as
``127.0.0.1``), Erlang distribution, and a private ``epmd`` started first (so
nothing is shared with another node on the machine). Only ``rabbitmq_stream`` is
enabled; the management plugin is not. It waits until the log says the server
started and the stream port accepts connections, and returns a
:class:`RabbitServer`. :meth:`RabbitServer.stop` (also the context manager's
exit) sends SIGTERM to the node's process group, SIGKILL after a grace period,
kills its ``epmd``, reaps both and removes the directory: nothing is left
running or on disk. A node that exits or is not ready in time is stopped and
reported as :class:`~htmqc.errors.RuntimeFailure` with the tail of its log.

Start-up takes about 3 s on the project's 2-core machine (the Erlang VM boots,
then the plugin).

Nothing here installs anything: ``make setup`` (``tools/provision.py``) installs
Debian's ``rabbitmq-server``; :func:`rabbitmq_server_binary` finds it
(``$RABBITMQ_SERVER`` first, then ``/usr/lib/rabbitmq/bin/rabbitmq-server``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from htmqc.errors import RuntimeFailure
from htmqc.loopback import free_port
from htmqc.sources.nats_server import _tail
from htmqc.sources.tls import ServerTls

#: Seconds :func:`start_rabbitmq` waits for the node.
READY_SECONDS = 60.0
#: Seconds :meth:`RabbitServer.stop` waits after SIGTERM before SIGKILL.
STOP_GRACE = 10.0
#: The start script Debian installs (the one in /usr/sbin switches to the rabbitmq user).
DEBIAN_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def rabbitmq_server_binary() -> str | None:
    """The ``rabbitmq-server`` start script, or ``None`` if it is not installed."""
    for candidate in (os.environ.get("RABBITMQ_SERVER"), DEBIAN_SCRIPT):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _epmd_binary() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    raise RuntimeFailure("epmd is not installed", "run `make setup` (it comes with erlang-base)")


@dataclass
class RabbitServer:
    """A running node (see module docs); ``url`` is what ``--bootstrap`` takes."""

    process: subprocess.Popen[bytes]
    epmd: subprocess.Popen[bytes]
    stream_port: int
    amqp_port: int
    home: Path
    log: Path
    started_seconds: float
    #: How the node was started (its binary and environment), for :meth:`restart`.
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: The TLS stream and AMQP ports (0: no TLS listeners).
    tls_stream_port: int = 0
    tls_amqp_port: int = 0

    def tls_url(self, query: str) -> str:
        """``rabbitmq-stream+tls://127.0.0.1:PORT?amqp-port=PORT&QUERY`` (its TLS ports)."""
        return (
            f"rabbitmq-stream+tls://127.0.0.1:{self.tls_stream_port}"
            f"?amqp-port={self.tls_amqp_port}&{query}"
        )

    @property
    def url(self) -> str:
        """``rabbitmq-stream://127.0.0.1:PORT?amqp-port=PORT`` (the lease's AMQP port)."""
        return f"rabbitmq-stream://127.0.0.1:{self.stream_port}?amqp-port={self.amqp_port}"

    def running(self) -> bool:
        """Whether the node's start script is still alive."""
        return self.process.poll() is None

    def restart(self, *, ready_seconds: float = READY_SECONDS) -> None:
        """SIGKILL the node (a crash: nothing flushed, connections cut) and start it
        again on the same ports and Mnesia directory, so streams, their offsets and
        tracked offsets survive as they would a machine's crash; ``epmd`` keeps
        running. Returns once the node is ready again.

        :raises RuntimeFailure: the node did not come back in time.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        began = time.monotonic()
        self.process = _spawn(self.argv, self.env, self.home)
        _wait_ready(self, began + ready_seconds)
        self.started_seconds = time.monotonic() - began

    def stop(self) -> None:
        """SIGTERM the node's process group (SIGKILL after :data:`STOP_GRACE`), kill
        its ``epmd``, reap both, remove the directory. Idempotent."""
        _end_group(self.process, STOP_GRACE)
        _end_group(self.epmd, 1.0)
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> RabbitServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _end_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Terminate ``proc``'s process group (it leads one), kill it after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):  # the VM outlives its script
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _spawn(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """``argv`` as the leader of a new process group, silent."""
    return subprocess.Popen(
        argv, env=env, cwd=cwd, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def start_rabbitmq(
    *, binary: str | None = None, ready_seconds: float = READY_SECONDS, tls: ServerTls | None = None
) -> RabbitServer:
    """Start a private node with streams on 127.0.0.1 and wait until it is ready;
    with ``tls``, TLS stream and AMQP listeners as well (``tls_url``).

    :raises RuntimeFailure: not installed, or the node exited or was not ready in time.
    """
    exe = binary or rabbitmq_server_binary()
    if exe is None:
        raise RuntimeFailure(
            "rabbitmq-server is not installed", "run `make setup` (Debian package rabbitmq-server)"
        )
    began = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="htmqc-rabbitmq-"))
    amqp, stream, dist, epmd_port, amqps, streams = (free_port() for _ in range(6))
    conf = (
        f"listeners.tcp.default = 127.0.0.1:{amqp}\n"
        f"stream.listeners.tcp.1 = 127.0.0.1:{stream}\n"
        "stream.advertised_host = 127.0.0.1\n"
        f"stream.advertised_port = {stream}\n"
        "loopback_users.guest = true\n"
    )
    if tls is not None:
        verify = "verify_peer" if tls.verify_clients else "verify_none"
        conf += (
            f"listeners.ssl.default = 127.0.0.1:{amqps}\n"
            f"stream.listeners.ssl.1 = 127.0.0.1:{streams}\n"
            f"stream.advertised_tls_port = {streams}\n"
            f"ssl_options.cacertfile = {tls.ca}\n"
            f"ssl_options.certfile = {tls.cert}\n"
            f"ssl_options.keyfile = {tls.key}\n"
            f"ssl_options.verify = {verify}\n"
            f"ssl_options.fail_if_no_peer_cert = {str(tls.verify_clients).lower()}\n"
        )
    (home / "rabbitmq.conf").write_text(conf)
    (home / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    log = home / "rabbit.log"
    env = {
        **os.environ,
        "HOME": str(home),
        "RABBITMQ_NODENAME": f"htmqc-{amqp}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(amqp),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_LOGS": str(log),
        "RABBITMQ_PID_FILE": str(home / "rabbit.pid"),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "ERL_EPMD_PORT": str(epmd_port),
    }
    epmd = _spawn([_epmd_binary(), "-port", str(epmd_port), "-address", "127.0.0.1"], env, home)
    proc = _spawn([exe], env, home)
    server = RabbitServer(proc, epmd, stream, amqp, home, log, 0.0, [exe], env)
    if tls is not None:
        server.tls_stream_port, server.tls_amqp_port = streams, amqps
    _wait_ready(server, began + ready_seconds)
    server.started_seconds = time.monotonic() - began
    return server


def _wait_ready(server: RabbitServer, deadline: float) -> None:
    """Wait until ``server``'s node logged its start and accepts stream
    connections; stop it and raise :class:`RuntimeFailure` if it exits or
    ``deadline`` (a monotonic time) passes first."""
    size_at_start = server.log.stat().st_size if server.log.exists() else 0
    while time.monotonic() < deadline:
        if not server.running():
            tail = _tail(server.log)
            server.stop()
            raise RuntimeFailure(
                f"rabbitmq-server exited at start (code {server.process.returncode}): {tail}",
                f"run {server.argv[0]} by hand with the same RABBITMQ_* variables to see why",
            )
        if _started(server.log, size_at_start) and _accepts(server.stream_port):
            return
        time.sleep(0.1)
    tail = _tail(server.log)
    server.stop()
    raise RuntimeFailure(
        f"rabbitmq-server was not ready in time: {tail}",
        "check the machine's load and the node's log",
    )


def _started(log: Path, since: int = 0) -> bool:
    """Whether the node logged its start after byte ``since`` of ``log`` (a
    restarted node appends to the same log)."""
    with contextlib.suppress(OSError), log.open("rb") as f:
        f.seek(since)
        return b"Server startup complete" in f.read()
    return False
