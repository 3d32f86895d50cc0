"""The HTTP server: routes, read-only, loopback by default, slow clients cut off."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.request

import pytest

from htmqc.errors import RuntimeFailure
from htmqc.observe import Metrics, ObserveServer
from tests.observe.conftest import Scenario
from tests.observe.test_metrics import parse, value

Served = tuple[Scenario, Metrics, ObserveServer]


def get(server: ObserveServer, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_state_json_is_the_core_state(served: Served) -> None:
    scenario, metrics, server = served
    status, headers, body = get(server, "/state.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert metrics.source is not None
    want = metrics.source.state()
    doc.pop("generated_at"), want.pop("generated_at")
    assert doc == want
    snap = scenario.core.snapshot()
    assert {p["name"]: (p["committed"], p["processed"], p["next"]) for p in doc["partitions"]} \
        == {n: (s["committed"], s["processed"], s["next"]) for n, s in snap.items()}


def test_metrics_page_and_health(served: Served) -> None:
    _, metrics, server = served
    metrics.processed("orders", 0, "succeeded", 7)
    status, headers, body = get(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    s = parse(body)
    assert value(s, "htmqc_messages_processed_total",
                 topic="orders", partition="0", outcome="succeeded") == 7
    assert value(s, "htmqc_offset", topic="orders", partition="0", kind="next") == 160
    status, headers, body = get(server, "/state")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"state.json" in body and b"<script" in body
    assert not re.search(rb"(src|href)\s*=|url\(|@import|https?://", body)  # self-contained
    assert get(server, "/healthz")[:3:2] == (200, b"ok\n")
    assert get(server, "/nope")[0] == 404
    status, _, body = get(server, "/state.json", "HEAD")
    assert status == 200 and body == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_read_only(served: Served, method: str) -> None:
    _, _, server = served
    status, headers, _ = get(server, "/metrics", method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_binds_to_loopback_by_default(scenario: Scenario) -> None:
    server = ObserveServer(Metrics(scenario.source()))
    port = server.start()
    try:
        assert server._server is not None
        assert server._server.server_address[0] == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(server.url + "/healthz", timeout=5) as r:
            assert r.read() == b"ok\n"
    finally:
        server.stop()
    server.stop()  # idempotent


def test_host_must_be_explicit_to_listen_elsewhere(scenario: Scenario) -> None:
    server = ObserveServer(Metrics(scenario.source()), host="0.0.0.0")
    server.start()
    try:
        assert server._server is not None and server._server.server_address[0] == "0.0.0.0"
    finally:
        server.stop()


def test_a_broken_source_answers_500_and_the_server_lives(scenario: Scenario) -> None:
    class Flaky:
        broken = True

        def state(self) -> dict:
            if self.broken:
                raise RuntimeError("secret=hunter2")
            return scenario.source().state()

    source = Flaky()
    server = ObserveServer(Metrics(source), source)
    server.start()
    try:
        status, _, body = get(server, "/state.json")
        assert status == 500 and b"hunter2" not in body
        source.broken = False
        assert get(server, "/state.json")[0] == 200
    finally:
        server.stop()


def _slow_loris(port: int, stop: threading.Event, cut: list[float], started: float) -> None:
    """Send a request head one byte every 0.1 s; note when the server hangs up."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for byte in head:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut.append(time.monotonic() - started)
                return
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    cut.append(time.monotonic() - started)
                    return
            except BlockingIOError:
                pass
            except OSError:
                cut.append(time.monotonic() - started)
                return
            finally:
                sock.setblocking(True)


def test_survives_slow_loris(served: Served) -> None:
    _, _, server = served  # request_timeout=1.0
    stop = threading.Event()
    cut: list[float] = []
    started = time.monotonic()
    lorises = [
        threading.Thread(target=_slow_loris, args=(server.port, stop, cut, started))
        for _ in range(8)
    ]
    for t in lorises:
        t.start()
    try:
        time.sleep(0.5)  # all attackers connected and dribbling
        t0 = time.monotonic()
        status, _, body = get(server, "/state.json")
        assert status == 200 and json.loads(body)["partitions"]
        assert time.monotonic() - t0 < 1.0, "a normal request must answer quickly"
        for t in lorises:
            t.join(timeout=4)
        assert len(cut) == 8, "every slow client is cut off"
        assert max(cut) < 3.0, f"cut off after the 1 s head deadline, not later: {cut}"
    finally:
        stop.set()
        for t in lorises:
            t.join(timeout=5)
    assert get(server, "/healthz")[0] == 200


def test_connections_beyond_the_limit_are_closed(scenario: Scenario) -> None:
    server = ObserveServer(Metrics(scenario.source()), request_timeout=2.0, max_connections=2)
    server.start()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=3) for _ in range(2)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", server.port), timeout=3) as extra:
            extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert extra.recv(100) == b"", "over the limit: closed without an answer"
        for s in idle:
            s.close()
        time.sleep(0.3)  # their slots come back
        assert get(server, "/healthz")[0] == 200
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_a_port_in_use_is_a_one_line_error(served: Served) -> None:
    _, metrics, server = served
    other = ObserveServer(metrics)
    with pytest.raises(RuntimeFailure, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
        other.start(server.port)
