"""TLS to the broker: ``htmqc broker --cert --key``, then ``htmqc produce`` and
``htmqc run`` over TLS with certificate verification on; a wrong CA is one
clear line (exit code 1).

The bundled Tansu 0.6.0 cannot serve TLS itself (see :mod:`htmqc.broker`),
so the TLS these tests see is htmqc's terminator in front of it; what they
check is what a client sees: the port speaks only TLS, with the certificate
given, verified against the CA given.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from htmqc import broker as broker_mod
from htmqc.broker import Broker, TlsTerminator, start_broker, tls_context
from htmqc.errors import UsageError

from .certs import Pki

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")



@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[Broker]:
    with start_broker(cert=pki.cert, key=pki.key) as running:
        assert running.tls and running.port != running.backend_port
        yield running


def ssl_args(ca: Path) -> list[str]:
    return ["--kafka-config", "security.protocol=ssl", "--kafka-config", f"ssl.ca.location={ca}"]


def htmqc(*args: str, timeout: float = 90, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "htmqc", *args],
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


def one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("htmqc: error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    return errors[0]


@pytest.mark.broker
def test_produce_and_run_over_verified_tls(tls_broker: Broker, pki: Pki, tmp_path: Path) -> None:
    topic = "tls-orders"
    code, out = htmqc(
        "produce", "--bootstrap", tls_broker.bootstrap, "--topic", topic, "--count", "200",
        "--partitions", "2", *ssl_args(pki.ca),
    )  # fmt: skip
    assert code == 0, out
    assert "produced 200 messages" in out
    seen = tmp_path / "seen.txt"
    code, out = htmqc(
        "run", "tests.security.handlers:record_id", "--bootstrap", tls_broker.bootstrap,
        "--topic", topic, "--group", "tls-g", "--max-messages", "200", "--idle-exit", "20",
        *ssl_args(pki.ca),
        env={"HTMQC_SECURITY_OUT": str(seen)},
    )  # fmt: skip
    assert code == 0, out
    ids = sorted(int(line) for line in seen.read_text().split())
    assert ids == list(range(200))
    # The group's progress was committed over TLS as well.
    consumer = Consumer(
        {
            "bootstrap.servers": tls_broker.bootstrap,
            "group.id": "tls-g",
            "security.protocol": "ssl",
            "ssl.ca.location": str(pki.ca),
        }
    )
    try:
        from confluent_kafka import TopicPartition

        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)
        assert sum(tp.offset for tp in committed) == 200
    finally:
        consumer.close()


@pytest.mark.broker
@pytest.mark.parametrize("command", ["produce", "run"])
def test_wrong_ca_is_one_clear_line(
    tls_broker: Broker, other_pki: Pki, command: str, tmp_path: Path
) -> None:
    common = ["--bootstrap", tls_broker.bootstrap, "--topic", "tls-wrong-ca"]
    if command == "produce":
        args = ["produce", *common, "--count", "1"]
    else:
        args = ["run", "tests.security.handlers:record_id", *common, "--group", "g"]
        args += ["--connect-seconds", "3"]
    code, out = htmqc(*args, *ssl_args(other_pki.ca), timeout=60,
                      env={"HTMQC_SECURITY_OUT": str(tmp_path / "never.txt")})  # fmt: skip
    line = one_error_line(out)
    assert code == 1, out
    assert "certificate verify failed" in line, line
    assert "ssl.ca.location" in line, line
    assert not (tmp_path / "never.txt").exists()


@pytest.mark.broker
def test_plaintext_client_gets_nothing(tls_broker: Broker) -> None:
    code, out = htmqc(
        "produce", "--bootstrap", tls_broker.bootstrap, "--topic", "tls-plain", "--count", "1",
        timeout=60,
    )  # fmt: skip
    assert code == 1, out
    assert "cannot reach broker" in one_error_line(out)


@pytest.mark.broker
def test_broker_command_serves_tls(pki: Pki) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "htmqc", "broker", "--cert", str(pki.cert), "--key", str(pki.key)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once ready; the broker has a 20 s bound
        assert first.startswith("bootstrap: "), first
        host, port = first.split()[1].rsplit(":", 1)
        client = ssl.create_default_context(cafile=str(pki.ca))
        with (
            socket.create_connection((host, int(port)), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            peer = tls.getpeercert()
            assert peer is not None
            assert ("commonName", "localhost") in [pair for rdn in peer["subject"] for pair in rdn]
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "tls: on" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--cert", "x.pem"], "TLS needs both --cert and --key"),
        (["--key", "x.key"], "TLS needs both --cert and --key"),
        (["--cert", "/nonexistent/c.pem", "--key", "/nonexistent/k.pem"], "not found"),
    ],
)
def test_broker_command_refuses_bad_tls_files(extra: list[str], needle: str) -> None:
    code, out = htmqc("broker", *extra, timeout=30)
    assert code == 2, out
    assert needle in one_error_line(out)


def test_mismatched_key_is_refused(pki: Pki, other_pki: Pki) -> None:
    with pytest.raises(UsageError, match="cannot load the TLS certificate"):
        tls_context(pki.cert, other_pki.key)


def _echo_backend() -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_terminator_relays_and_drops_stalled_handshakes(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_mod, "TLS_HANDSHAKE_SECONDS", 1.0)
    backend, _thread = _echo_backend()
    public = socket.create_server(("127.0.0.1", 0))
    port = public.getsockname()[1]
    terminator = TlsTerminator(public, backend.getsockname(), tls_context(pki.cert, pki.key))
    terminator.start()
    try:
        client = ssl.create_default_context(cafile=str(pki.ca))
        payload = os.urandom(300_000)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += tls.recv(65536)
            assert got == payload
        # A client that never starts its handshake is dropped after the bound.
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stalled:
            assert stalled.recv(1) == b""
        assert time.monotonic() - started < 5
    finally:
        terminator.stop()
        terminator.stop()  # idempotent
        backend.close()
