"""Start a private ``nats-server`` with JetStream for tests, benchmarks and demos.

Contract
--------
:func:`start_nats` runs ``nats-server -js -a 127.0.0.1 -p PORT -sd DIR`` (a free
port unless one is given, a fresh store directory unless one is given), waits
until the server answers on its client port and JetStream is ready (a
``$JS.API.INFO`` request answered), and returns a :class:`NatsServer`.
:meth:`NatsServer.stop` (also the context manager's exit) terminates it, kills
it after a grace period, reaps it and removes the store directory it created:
nothing is left running or on disk. A server that exits or does not get ready
in time is stopped and reported as :class:`~htmqc.errors.RuntimeFailure` with
the tail of its log.

``extra`` adds server flags, e.g. TLS (``--tls --tlscert F --tlskey F``, with
``--tlsverify --tlscacert F`` for client certificates) or credentials (``--user
U --pass P``, ``--auth TOKEN``); a server that then needs more than a plain
client can give is waited for by its log's ``Server is ready`` line instead.

Nothing here installs anything: ``make setup`` (``tools/provision.py``) installs
Debian's ``nats-server``; :func:`nats_server_binary` finds it (``$NATS_SERVER``
first, then ``PATH``, then ``/usr/sbin``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from htmqc.errors import RuntimeFailure
from htmqc.loopback import free_port

#: Seconds :func:`start_nats` waits for the server (JetStream recovery included).
READY_SECONDS = 20.0
#: Seconds :meth:`NatsServer.stop` waits after SIGTERM before SIGKILL.
STOP_GRACE = 5.0


def nats_server_binary() -> str | None:
    """The ``nats-server`` executable, or ``None`` if it is not installed."""
    named = os.environ.get("NATS_SERVER")
    if named and os.access(named, os.X_OK):
        return named
    found = shutil.which("nats-server")
    if found:
        return found
    for candidate in ("/usr/sbin/nats-server", "/usr/bin/nats-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class NatsServer:
    """A running ``nats-server`` (see module docs); ``url`` is ``nats://127.0.0.1:PORT``."""

    process: subprocess.Popen[bytes]
    port: int
    store: Path
    log: Path
    _owned: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The client URL (what ``--bootstrap`` takes for ``--source nats``)."""
        return f"nats://127.0.0.1:{self.port}"

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process.poll() is None

    def stop(self) -> None:
        """Terminate (then kill after :data:`STOP_GRACE`), reap, remove what
        :func:`start_nats` created. Idempotent."""
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for path in self._owned:
            shutil.rmtree(path, ignore_errors=True)
        self._owned.clear()

    def kill(self) -> None:
        """SIGKILL the server (its store stays, for a restart on the same directory)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return "no log"


def _ready_in_log(log: Path) -> bool:
    with contextlib.suppress(OSError):
        return b"Server is ready" in log.read_bytes()
    return False


def _jetstream_ready(port: int) -> bool:
    """One plain-protocol ``$JS.API.INFO`` request: True once JetStream answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(1)
            reader = sock.makefile("rb")
            if not reader.readline().startswith(b"INFO"):
                return False
            sock.sendall(
                b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'
                b"SUB _htmqc.ready 1\r\nPUB $JS.API.INFO _htmqc.ready 0\r\n\r\nPING\r\n"
            )
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                line = reader.readline()
                if not line:
                    return False
                if line.startswith(b"MSG"):
                    body = reader.readline()
                    return b'"type":"io.nats.jetstream.api.v1.account_info_response"' in body and (
                        b'"error"' not in body
                    )
                if line.startswith(b"PING"):
                    sock.sendall(b"PONG\r\n")
    except OSError:
        return False
    return False


def start_nats(
    *,
    port: int | None = None,
    store: Path | None = None,
    binary: str | None = None,
    ready_seconds: float = READY_SECONDS,
    extra: Sequence[str] = (),
) -> NatsServer:
    """Start ``nats-server`` with JetStream on 127.0.0.1 and wait until it is ready.

    ``store``: the JetStream directory (kept on :meth:`NatsServer.stop`);
    default a fresh temporary one (removed on stop).

    :raises RuntimeFailure: no binary, or the server exited or was not ready in time.
    """
    exe = binary or nats_server_binary()
    if exe is None:
        raise RuntimeFailure(
            "nats-server is not installed", "run `make setup` (Debian package nats-server)"
        )
    owned: list[Path] = []
    if store is None:
        store = Path(tempfile.mkdtemp(prefix="htmqc-nats-"))
        owned.append(store)
    store.mkdir(parents=True, exist_ok=True)
    log = store / "nats-server.log"
    port = port or free_port()
    argv = [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store), "-l", str(log)]
    argv += extra
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = NatsServer(proc, port, store, log, owned)
    deadline = time.monotonic() + ready_seconds
    while time.monotonic() < deadline:
        if not server.running():
            tail = _tail(log)
            server.stop()
            raise RuntimeFailure(
                f"nats-server exited at start (code {proc.returncode}): {tail}",
                f"run `{' '.join(argv)}` by hand to see why",
            )
        if _ready_in_log(log) if extra else _jetstream_ready(port):
            return server
        time.sleep(0.05)
    tail = _tail(log)
    server.stop()
    raise RuntimeFailure(
        f"nats-server was not ready within {ready_seconds:g} s: {tail}",
        "check the machine's load and the server log",
    )
