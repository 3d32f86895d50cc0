"""Start a private Apache Pulsar standalone broker for tests, benchmarks and demos.

Contract
--------
:func:`start_pulsar` runs ``java -cp LIBS/* org.apache.pulsar.PulsarStandaloneStarter``
from the jars ``make setup`` resolves into ``build/pulsar/libs`` (``$HTMQC_PULSAR_LIBS``
overrides the folder): the metadata store is RocksDB (no ZooKeeper), one BookKeeper
bookie runs in the same JVM, no functions worker and no stream storage. The broker's
binary port and its admin (HTTP) port are free loopback ports unless given, and the
bookie gets one too (:func:`htmqc.loopback.free_ports`: below the kernel's ephemeral
range, so a restart finds all three free again; on a kept working folder, the port its
bookie's cookie recorded, :func:`kept_bookie_port`). It waits until the broker logged that its
messaging service is ready and the admin API lists the ``public/default`` namespace, and
returns a :class:`PulsarServer`. A port taken between probing and binding is retried
with fresh ports.

:meth:`PulsarServer.stop` (also the context manager's exit) sends SIGTERM (Pulsar's
orderly shutdown: the broker, then the bookie, then the metadata store), SIGKILL after
:data:`STOP_GRACE` seconds, reaps the JVM and removes the working directory it created:
nothing is left running or on disk. The JVM is also killed by the kernel when the thread
that started it exits, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``). A broker that exits
or does not get ready in time is stopped and reported as
:class:`~htmqc.errors.RuntimeFailure` with the tail of its log.

``settings`` adds or overrides broker settings (``standalone.conf`` keys). The defaults
(:data:`SETTINGS`) make one-copy ledgers, allow topics to be created on first use, and
append a dense per-partition ``index`` to each entry's broker metadata
(``AppendIndexMetadataInterceptor``), exposed to clients.

Durability: the in-process bookie of Pulsar's standalone mode runs with
``journalWriteData=false`` (Pulsar's ``BKCluster`` sets it for its test bookies), so
entries written since the last ledger-storage flush may be lost if the JVM is killed
(SIGKILL); an orderly :meth:`PulsarServer.stop` or :meth:`PulsarServer.restart` loses
nothing. Use it for functional tests, not for crash tests of the broker itself.

Nothing here installs anything: ``make setup`` (``tools/provision.py``, ``tools/pulsar/``)
fetches the jars.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from htmqc.errors import RuntimeFailure
from htmqc.loopback import free_ports
from htmqc.sources.tls import ServerTls

LIBS_ENV = "HTMQC_PULSAR_LIBS"
#: Where ``make setup`` puts the jars, in a source checkout.
REPO_LIBS = Path(__file__).resolve().parents[3] / "build" / "pulsar" / "libs"
MAIN_CLASS = "org.apache.pulsar.PulsarStandaloneStarter"
HOST = "127.0.0.1"
#: Seconds :func:`start_pulsar` waits (about 7-9 s on an idle two-core machine).
READY_SECONDS = 90.0
#: Seconds :meth:`PulsarServer.stop` waits after SIGTERM before SIGKILL (an orderly
#: shutdown took about 7 s).
STOP_GRACE = 30.0
READY_LOG_TEXT = b"messaging service is ready"
_BIND_FAILED_LOG_TEXT = b"Address already in use"
_START_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1

#: Broker settings of a loopback test broker (``standalone.conf`` keys).
SETTINGS: Mapping[str, str] = {
    "clusterName": "standalone",
    "managedLedgerDefaultEnsembleSize": "1",
    "managedLedgerDefaultWriteQuorum": "1",
    "managedLedgerDefaultAckQuorum": "1",
    "functionsWorkerEnabled": "false",
    "allowAutoTopicCreation": "true",
    "allowAutoTopicCreationType": "non-partitioned",
    # A dense per-partition index in each entry's broker metadata, given to clients.
    "brokerEntryMetadataInterceptors": (
        "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor"
    ),
    "exposingBrokerEntryMetadataToClientEnabled": "true",
    # Not needed by one test broker, and they cost threads and start-up time.
    "loadBalancerEnabled": "false",
    "webSocketServiceEnabled": "false",
    "numIOThreads": "2",
    "numHttpServerThreads": "4",
}

#: JVM options: a small heap and direct memory (a test broker beside the tests on a
#: small machine), the client JIT only (start-up on a busy two-core machine), and what
#: Pulsar's own launcher passes on Java 17. The BookKeeper properties (the in-process
#: bookie reads system properties as settings) make it listen on loopback only and on the
#: port given by ``--bookkeeper-port``: Pulsar's ``BKCluster`` takes that port only with
#: ``allowEphemeralPorts`` set, and otherwise draws one in the ephemeral range.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:MaxDirectMemorySize=256m",
    "-XX:+UseG1GC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dorg.apache.bookkeeper.conf.readsystemproperties=true",
    "-DlisteningInterface=lo",
    "-DallowEphemeralPorts=true",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
)

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{HH:mm:ss.SSS} %-5level [%t] %c{1} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


def pulsar_libs() -> Path:
    """The folder of Apache Pulsar's jars (``$HTMQC_PULSAR_LIBS`` or ``build/pulsar/libs``).

    :raises RuntimeFailure: it holds no ``pulsar-broker-*.jar``.
    """
    libs = Path(os.environ.get(LIBS_ENV) or REPO_LIBS)
    if not any(libs.glob("pulsar-broker-[0-9]*.jar")):
        raise RuntimeFailure(
            f"Apache Pulsar's jars are not in {libs}",
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
            "java is not installed (Apache Pulsar needs Java 17 or later)",
            "run `make setup` (it installs a JRE)",
        )
    return found


def _pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the kernel sends SIGKILL to the JVM when the thread that started it exits."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class PulsarServer:
    """A running standalone broker (see module docs); ``url`` is ``pulsar://127.0.0.1:PORT``."""

    argv: list[str]
    work: Path
    broker_port: int
    web_port: int
    process: subprocess.Popen[bytes] | None = None
    _owned: list[Path] = field(default_factory=list)
    #: The token its own admin calls present (a broker started with :func:`token_auth`).
    token: str | None = None
    #: The in-process bookie's port (loopback): drawn, or on a kept ``work`` the one
    #: its cookie recorded (:func:`kept_bookie_port`).
    bookie_port: int = 0
    #: Its TLS binary and admin ports (0: no TLS listeners).
    tls_broker_port: int = 0
    tls_web_port: int = 0

    def tls_bootstrap(self, query: str) -> str:
        """``pulsar+ssl://127.0.0.1:PORT?admin-port=PORT&QUERY`` (its TLS ports)."""
        return f"pulsar+ssl://{HOST}:{self.tls_broker_port}?admin-port={self.tls_web_port}&{query}"

    @property
    def url(self) -> str:
        """The client service URL (what ``pulsar.Client`` and ``--bootstrap`` take)."""
        return f"pulsar://{HOST}:{self.broker_port}"

    @property
    def bootstrap(self) -> str:
        """``--bootstrap`` of ``htmqc run --source pulsar``: the client URL with the
        admin port (``pulsar://127.0.0.1:PORT?admin-port=PORT``)."""
        return f"{self.url}?admin-port={self.web_port}"

    @property
    def admin_url(self) -> str:
        """The admin (HTTP) service URL."""
        return f"http://{HOST}:{self.web_port}"

    @property
    def log(self) -> Path:
        return self.work / "pulsar.log"

    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        """The JVM's resident memory now (0 when it is not running)."""
        if not self.running() or self.process is None:
            return 0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def admin(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One admin REST call (``path`` under ``/admin``); the JSON answer, or ``None``.

        :raises RuntimeFailure: the broker answered an error status.
        """
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            f"{self.admin_url}/admin{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise RuntimeFailure(
                f"Pulsar admin {method} {path} answered {exc.code}: {detail}",
                f"see the broker log {self.log}",
            ) from exc
        return json.loads(text) if text.strip() else None

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        """Create ``persistent://public/default/<topic>`` with ``partitions`` partitions;
        answer its full name."""
        self.admin("PUT", f"/v2/persistent/public/default/{topic}/partitions", partitions)
        return f"persistent://public/default/{topic}"

    def _spawn(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - closed right after the child has it
        try:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.work,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it
                preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
            )
        finally:
            out.close()

    def _ready(self) -> bool:
        try:
            if READY_LOG_TEXT not in self.log.read_bytes():
                return False
            return "public/default" in (self.admin("GET", "/v2/namespaces/public", timeout=2) or [])
        except (OSError, RuntimeFailure, ValueError):
            return False

    def _wait_ready(self, seconds: float) -> None:
        """Wait until ready; stop it and raise when it exits or does not get ready."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.running():
                code = self.process.returncode if self.process else None
                raise RuntimeFailure(
                    f"the Pulsar standalone broker exited at start (code {code}): "
                    f"{_tail(self.log)}",
                    f"see {self.log}",
                )
            if self._ready():
                return
            time.sleep(0.2)
        raise RuntimeFailure(
            f"the Pulsar standalone broker was not ready within {seconds:g} s: {_tail(self.log)}",
            "check the machine's load and the broker log",
        )

    def _halt(self, grace: float) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        """SIGTERM (SIGKILL after :data:`STOP_GRACE`), reap, remove what
        :func:`start_pulsar` created. Idempotent."""
        self._halt(STOP_GRACE)
        for path in self._owned:
            shutil.rmtree(path, ignore_errors=True)
        self._owned.clear()

    def kill(self) -> None:
        """SIGKILL the JVM (its data stays; see the module docs on durability)."""
        self._halt(0)

    def restart(self, ready_seconds: float = READY_SECONDS) -> None:
        """An orderly stop, then a start on the same data and ports; waits until ready."""
        self._halt(STOP_GRACE)
        self._spawn()
        try:
            self._wait_ready(ready_seconds)
        except RuntimeFailure:
            self.stop()
            raise

    def __enter__(self) -> PulsarServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace").strip().splitlines()
        picked = [line for line in text if "ERROR" in line or "Exception" in line] or text
        return " | ".join(picked[-lines:])
    return "no log"


def _tls_settings(tls: ServerTls | None, broker: int, web: int) -> dict[str, str]:
    """TLS listeners beside the plain ones (the broker's own clients stay plain)."""
    if tls is None:
        return {}
    return {
        "brokerServicePortTls": str(broker),
        "webServicePortTls": str(web),
        "tlsCertificateFilePath": str(tls.cert),
        "tlsKeyFilePath": str(tls.key),
        "tlsTrustCertsFilePath": str(tls.ca),
        "tlsRequireTrustedClientCertOnConnect": str(tls.verify_clients).lower(),
        "numHttpServerThreads": "8",  # two web connectors: 4 do not start (Jetty)
    }


def _write_config(work: Path, broker_port: int, web_port: int,
                  settings: Mapping[str, str]) -> Path:  # fmt: skip
    conf = {
        **SETTINGS,
        "bindAddress": HOST,
        "advertisedAddress": HOST,
        "brokerServicePort": str(broker_port),
        "webServicePort": str(web_port),
        **settings,
    }
    path = work / "standalone.conf"
    path.write_text("".join(f"{key}={value}\n" for key, value in conf.items()))
    (work / "log4j2.properties").write_text(_LOG4J2)
    return path


def hs256_token(secret: bytes, subject: str) -> str:
    """A Pulsar token (a JWT signed with HMAC-SHA256) for the role ``subject``."""

    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": subject}).encode())
    signature = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + signature).decode()


def token_auth(secret: bytes) -> tuple[dict[str, str], str]:
    """``(settings, admin token)``: broker settings that require a token signed with
    ``secret`` from every client (the admin API included; any valid token may do
    anything: no authorization), and the token of the broker's own superuser, which
    :func:`start_pulsar` takes as ``token``."""
    admin = hs256_token(secret, "admin")
    settings = {
        "authenticationEnabled": "true",
        "authenticationProviders": (
            "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
        ),
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode(),
        "superUserRoles": "admin",
        "brokerClientAuthenticationPlugin": (
            "org.apache.pulsar.client.impl.auth.AuthenticationToken"
        ),
        "brokerClientAuthenticationParameters": f"token:{admin}",
    }
    return settings, admin


def kept_bookie_port(work: Path) -> int | None:
    """The port recorded in the cookie of a bookie that ran in ``work`` before
    (``bookie/current/VERSION``, ``bookieHost: "127.0.0.1:PORT"``), or ``None``.
    BookKeeper starts such a bookie on that port again whatever ``--bookkeeper-port``
    says, so a start on a kept ``work`` passes it on, and
    :attr:`PulsarServer.bookie_port` names the port the bookie listens on."""
    try:
        text = (work / "bookie" / "current" / "VERSION").read_text()
    except OSError:
        return None
    found = re.search(r'bookieHost:\s*"[^"]*:(\d+)"', text)
    return int(found.group(1)) if found else None


def start_pulsar(
    *,
    broker_port: int | None = None,
    web_port: int | None = None,
    work: Path | None = None,
    settings: Mapping[str, str] | None = None,
    ready_seconds: float = READY_SECONDS,
    token: str | None = None,
    tls: ServerTls | None = None,
) -> PulsarServer:
    """Start a Pulsar standalone broker on 127.0.0.1 and wait until it is ready.

    ``work``: the folder for its configuration, data and log (kept on
    :meth:`PulsarServer.stop`); default a fresh temporary one (removed on stop).

    :raises RuntimeFailure: no Java or no jars, or the broker exited or was not
        ready in time.
    """
    java = java_binary()
    libs = pulsar_libs()
    owned: list[Path] = []
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="htmqc-pulsar-"))
        owned.append(work)
    work.mkdir(parents=True, exist_ok=True)
    fixed = broker_port is not None and web_port is not None
    for attempt in range(_START_ATTEMPTS):
        drawn = iter(free_ports(5))
        ports = (broker_port or next(drawn), web_port or next(drawn))
        bookie = kept_bookie_port(work) or next(drawn)
        tls_ports = (next(drawn), next(drawn)) if tls is not None else (0, 0)
        conf = _write_config(work, *ports, {**_tls_settings(tls, *tls_ports), **(settings or {})})
        argv = [
            java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
            "-cp", f"{libs}/*", MAIN_CLASS, "--config", str(conf),
            "--no-functions-worker", "--no-stream-storage",
            "--metadata-dir", str(work / "metadata"), "--bookkeeper-dir", str(work / "bookie"),
            "--bookkeeper-port", str(bookie),
        ]  # fmt: skip
        server = PulsarServer(argv, work, *ports, _owned=owned, token=token)
        server.bookie_port = bookie
        server.tls_broker_port, server.tls_web_port = tls_ports
        server._spawn()
        try:
            server._wait_ready(ready_seconds)
        except RuntimeFailure:
            server._halt(STOP_GRACE)
            bind_failed = _BIND_FAILED_LOG_TEXT in server.log.read_bytes()
            if bind_failed and not fixed and attempt + 1 < _START_ATTEMPTS:
                server.log.unlink(missing_ok=True)
                if work in owned:  # a fresh start: no metadata naming the old ports
                    for data in ("metadata", "bookie"):
                        shutil.rmtree(work / data, ignore_errors=True)
                continue
            server.stop()
            raise
        return server
    raise AssertionError("unreachable")  # pragma: no cover
