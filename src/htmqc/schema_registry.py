"""Apicurio Registry on loopback: a real Schema Registry for the tests of the
``avro``, ``protobuf`` and ``json-schema`` formats (:mod:`htmqc.serde`).

Apicurio Registry speaks the Confluent Schema Registry API under
``/apis/ccompat/v7``, which is all confluent-kafka's serializers and
deserializers use (register a schema, look one up by id, subjects and
versions, config). ``make setup`` (``tools/provision.py``, ``tools/apicurio/``)
unpacks its distribution from Maven Central,
``io.apicurio:apicurio-registry-app:2.6.13.Final`` classifier ``all`` (a Quarkus
runner jar and its ``lib/``), into ``build/apicurio/app``
(``$HTMQC_APICURIO_HOME`` overrides the folder). It keeps its data in an
in-memory H2 database: every start is an empty registry.

Contract:

- :func:`start_registry` returns a :class:`SchemaRegistry` once
  ``GET /apis/ccompat/v7/subjects`` answers 200 on its loopback port (a free one
  unless given); if it does not within ``timeout`` or the JVM exits, the JVM is
  killed and :class:`~htmqc.errors.RuntimeFailure` names its log in one line
  (Java or the distribution missing say "run `make setup`"). A port taken
  between probing and binding is retried with a fresh one.
- The JVM is killed by the kernel when the thread that started it exits (Linux
  ``PR_SET_PDEATHSIG``), so nothing outlives a killed test run.
- :meth:`SchemaRegistry.close` stops it (SIGTERM, SIGKILL after a grace period),
  waits for it and deletes its working directory (the log) unless
  ``keep_logs``; it is idempotent, and the registry is a context manager.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from htmqc.broker import _die_with_parent
from htmqc.errors import RuntimeFailure
from htmqc.kafka_cluster import java_binary
from htmqc.loopback import free_port

HOME_ENV = "HTMQC_APICURIO_HOME"
#: Where ``make setup`` unpacks the distribution, in a source checkout.
REPO_HOME = Path(__file__).resolve().parents[2] / "build" / "apicurio" / "app"
HOST = "127.0.0.1"
#: The Confluent-compatible API's root on an Apicurio Registry.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: A small heap and the client JIT only: a test registry on a busy two-core box.
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
_BIND_FAILED = (b"Address already in use", b"Port already bound")
_START_ATTEMPTS = 3
_STOP_GRACE_SECONDS = 10.0
_POLL_SECONDS = 0.2


def registry_jar() -> Path:
    """The Apicurio Registry runner jar (``$HTMQC_APICURIO_HOME`` or ``build/apicurio/app``).

    :raises RuntimeFailure: it is not there.
    """
    home = Path(os.environ.get(HOME_ENV) or REPO_HOME)
    jars = sorted(home.glob("apicurio-registry-app-*-runner.jar"))
    if not jars:
        raise RuntimeFailure(
            f"Apicurio Registry is not in {home}",
            "run `make setup` (it fetches it from Maven Central), "
            f"or set {HOME_ENV} to a folder holding its runner jar and lib/",
        )
    return jars[-1]


@dataclass
class SchemaRegistry:
    """A running Apicurio Registry; clients use :attr:`url`."""

    port: int
    process: subprocess.Popen[bytes]
    work_dir: Path
    keep_logs: bool = False
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        """The Confluent-compatible API's URL (``SchemaRegistryClient``'s ``url``)."""
        return f"http://{HOST}:{self.port}{CCOMPAT_PATH}"

    @property
    def log_path(self) -> Path:
        """The JVM's stdout and stderr."""
        return self.work_dir / "registry.log"

    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the JVM and wait for it; delete the working directory (module docs)."""
        if self._closed:
            return
        self._closed = True
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(_STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
        if not self.keep_logs:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> SchemaRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_registry(
    port: int | None = None, *, timeout: float = 120.0, keep_logs: bool = False
) -> SchemaRegistry:
    """Start Apicurio Registry on ``HOST:port`` (a free port by default) and wait
    until its Confluent-compatible API answers (module docs).

    :raises RuntimeFailure: Java or the distribution is missing, or it did not
        become ready within ``timeout`` seconds.
    """
    java = java_binary()
    jar = registry_jar()
    last = ""
    for _attempt in range(_START_ATTEMPTS):
        registry = _spawn(java, jar, port if port is not None else free_port(HOST), keep_logs)
        outcome = _wait_ready(registry, timeout)
        if outcome == "ready":
            return registry
        registry.keep_logs = True  # the log says why
        registry.close()
        last = outcome
        if outcome != "port taken" or port is not None:
            break
    raise RuntimeFailure(
        f"Apicurio Registry did not start ({last}): see {registry.log_path}",
        "check the log; `make setup` provisions the registry",
    )


def _spawn(java: str, jar: Path, port: int, keep_logs: bool) -> SchemaRegistry:
    work = Path(tempfile.mkdtemp(prefix="htmqc-apicurio-"))
    log_file = open(work / "registry.log", "ab")  # noqa: SIM115 - closed by close()
    process = subprocess.Popen(
        [
            java,
            *JVM_OPTIONS,
            f"-Djava.io.tmpdir={work}",
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={port}",
            "-Dquarkus.log.console.color=false",
            "-jar",
            str(jar),
        ],
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    return SchemaRegistry(port, process, work, keep_logs, log_file)


def _wait_ready(registry: SchemaRegistry, timeout: float) -> str:
    """``ready``, ``port taken``, ``exited with N`` or ``not ready after N s``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not registry.running():
            if any(text in _log(registry) for text in _BIND_FAILED):
                return "port taken"
            return f"exited with {registry.process.returncode}"
        if _answers(registry.url + "/subjects"):
            return "ready"
        time.sleep(_POLL_SECONDS)
    return f"not ready after {timeout:g} s"


def _log(registry: SchemaRegistry) -> bytes:
    try:
        return registry.log_path.read_bytes()
    except OSError:
        return b""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
