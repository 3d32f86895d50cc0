"""The chaos proxy against a local echo server: each mode, targeting by client id."""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from htmqc.chaos.proxy import ChaosProxy, Rule, client_id_of
from htmqc.errors import UsageError


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock = self.request
        sock.settimeout(30)
        try:
            while data := sock.recv(65536):
                sock.sendall(data)
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[ChaosProxy]:
    with ChaosProxy(echo) as running:
        yield running


def kafka_header(client_id: str, correlation: int = 1) -> bytes:
    """A Kafka request: size, ApiVersions key 18, version 3, correlation id, client id."""
    raw = client_id.encode()
    body = struct.pack(">hhih", 18, 3, correlation, len(raw)) + raw + b"\x00"
    return struct.pack(">i", len(body)) + body


def connect(proxy: ChaosProxy, client_id: str | None = "chaos-c0") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    if client_id is not None:
        hello = kafka_header(client_id)
        sock.sendall(hello)
        assert recv_exactly(sock, len(hello)) == hello
    return sock


def recv_exactly(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_pass_forwards_both_ways_and_identifies_the_client(proxy: ChaosProxy) -> None:
    with connect(proxy, "chaos-c3") as sock:
        sock.sendall(b"hello")
        assert recv_exactly(sock, 5) == b"hello"
        assert proxy.client_ids() == ["chaos-c3"]
    assert proxy.stats()["identified"] == 1


def test_client_id_parsing() -> None:
    assert client_id_of(kafka_header("rdkafka")) == "rdkafka"
    assert client_id_of(b"GET / HTTP/1.1\r\n") is None
    assert client_id_of(b"\x00\x00") is None


def test_a_non_kafka_client_still_passes(proxy: ChaosProxy) -> None:
    with connect(proxy, None) as sock:
        sock.sendall(b"plain bytes that are long enough")
        assert recv_exactly(sock, 32) == b"plain bytes that are long enough"
        assert proxy.client_ids() == [None]


def test_a_connection_is_listed_once_its_first_request_is_read(proxy: ChaosProxy) -> None:
    with connect(proxy, None) as sock:
        wait_until(lambda: proxy.stats().get("accepted") == 1)
        assert proxy.client_ids() == []  # whose it is cannot be told yet
        hello = kafka_header("chaos-late")
        sock.sendall(hello)
        assert recv_exactly(sock, len(hello)) == hello
        assert proxy.client_ids() == ["chaos-late"]


def test_delay_holds_each_chunk(proxy: ChaosProxy) -> None:
    with connect(proxy) as sock:
        proxy.set("delay", delay_ms=150)
        started = time.monotonic()
        sock.sendall(b"x")
        assert recv_exactly(sock, 1) == b"x"
        assert time.monotonic() - started >= 0.29  # 150 ms each way
        proxy.heal()
        started = time.monotonic()
        sock.sendall(b"y")
        assert recv_exactly(sock, 1) == b"y"
        assert time.monotonic() - started < 0.1


def test_drop_is_silence_until_healed(proxy: ChaosProxy) -> None:
    with connect(proxy) as sock:
        proxy.set("drop")
        sock.sendall(b"lost?")
        with pytest.raises(TimeoutError):
            recv_exactly(sock, 5, timeout=0.5)
        with connect(proxy, None) as other:  # new connections are blackholed too
            other.sendall(b"0123456789abcdef")
            with pytest.raises(TimeoutError):
                recv_exactly(other, 16, timeout=0.3)
            proxy.heal()
            assert recv_exactly(other, 16) == b"0123456789abcdef"
        assert recv_exactly(sock, 5) == b"lost?"


def test_half_close_gives_the_client_end_of_stream(proxy: ChaosProxy) -> None:
    with connect(proxy) as sock:
        proxy.set("half-close")
        assert recv_exactly(sock, 1) == b""  # EOF, not a reset
        sock.sendall(b"still writable")  # the other direction is open
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as fresh:
        fresh.sendall(kafka_header("chaos-c9"))
        assert recv_exactly(fresh, 1) == b""
    assert proxy.stats()["half_closed"] >= 2


def test_reset_aborts_existing_and_new_connections(proxy: ChaosProxy) -> None:
    with connect(proxy) as sock:
        proxy.set("reset")
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"x")
            recv_exactly(sock, 1)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as fresh:
        fresh.sendall(kafka_header("chaos-c0"))
        with pytest.raises(ConnectionResetError):
            recv_exactly(fresh, 1)
    proxy.heal()
    with connect(proxy) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"
    assert proxy.stats()["reset"] >= 2


def test_a_targeted_rule_spares_other_clients(proxy: ChaosProxy) -> None:
    with connect(proxy, "chaos-c1") as victim, connect(proxy, "chaos-c2") as bystander:
        proxy.set("reset", "chaos-c1")
        assert proxy.rule("chaos-c1") == Rule("reset")
        assert proxy.rule("chaos-c2") == Rule("pass")
        with pytest.raises(ConnectionResetError):
            victim.sendall(b"x")
            recv_exactly(victim, 1)
        bystander.sendall(b"fine")
        assert recv_exactly(bystander, 4) == b"fine"
        proxy.set("drop")  # everyone else: the targeted reset still wins for c1
        assert proxy.rule("chaos-c1") == Rule("reset")
        proxy.heal("chaos-c1")
        assert proxy.rule("chaos-c1") == Rule("drop")
        proxy.heal()
        assert recv_exactly(bystander, 0) == b""
        bystander.sendall(b"back")
        assert recv_exactly(bystander, 4) == b"back"


def test_bad_rules_are_refused(proxy: ChaosProxy) -> None:
    with pytest.raises(UsageError, match="unknown proxy mode"):
        proxy.set("explode")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="delay must be positive"):
        proxy.set("delay")


def test_stop_closes_connections_and_is_idempotent(echo: tuple[str, int]) -> None:
    proxy = ChaosProxy(echo).start()
    sock = connect(proxy)
    proxy.stop()
    proxy.stop()
    try:
        assert recv_exactly(sock, 1) == b""
    except ConnectionResetError:
        pass
    finally:
        sock.close()
