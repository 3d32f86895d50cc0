"""``/healthz`` and ``/readyz`` that mean something, and an HTTP server that never
waits for the engine (issue 16, item 7). A fake consumer, no broker.

Regression kept from the report: with the engine stuck (a 40 s table lock held
it), ``/healthz`` still said 200 while ``/state.json`` hung."""

from __future__ import annotations

import socket
import sqlite3
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from htmqc.core import BreakerPolicy
from htmqc.observe import Metrics, ObserveServer
from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import SinkUnavailable
from htmqc.sinks.sqlite import SqliteSink
from htmqc.testing import FakeConsumer, make_logs

TOPIC = "t"


def get(url: str) -> tuple[int, str, float]:
    """Status, body and seconds taken of a GET (5 s timeout)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


def wait_until(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_health_follows_the_poll_loop_and_readiness_the_breaker() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, 50, keys=5))

    def handler(msg: Any) -> None:
        pass

    options = RunOptions(
        bootstrap="fake:1", topic=TOPIC, group="g", shutdown_seconds=0.5, max_retries=1000,
        liveness_seconds=0.5,
    )
    metrics = Metrics()
    engine = Engine(
        handler, options, consumer, seed=1, metrics=metrics,
        breaker=BreakerPolicy(consecutive=3, first_backoff=5.0, max_backoff=5.0),
    )  # fmt: skip
    consumer.on_commit = engine.on_commit
    metrics.source = engine.snapshot
    server = ObserveServer(metrics, health=engine)
    server.start()
    base = server.url
    try:
        assert get(f"{base}/readyz")[0] == 503  # nothing assigned yet
        thread = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
        thread.start()
        wait_until(lambda: get(f"{base}/readyz")[0] == 200)
        assert get(f"{base}/healthz")[:2] == (200, "ok\n")
        assert "process_resident_memory_bytes" in get(f"{base}/metrics")[1]

        # The engine is stuck (here: its lock is held, as a long callback would).
        with engine.lock:
            time.sleep(1.0)
            status, body, took = get(f"{base}/state.json")
            assert status == 200 and took < 1.0, "the state page waited for the engine"
            status, body, _ = get(f"{base}/healthz")
            assert status == 503 and "poll loop has not turned" in body
            assert get(f"{base}/metrics")[0] == 200
        wait_until(lambda: get(f"{base}/healthz")[0] == 200)

        # The handler breaks: the breaker opens, the consumer is not ready.
        with engine.lock:  # the poll thread's breaker calls are made under it
            for offset in range(3):
                now = engine.clock.monotonic()
                event = engine.breaker.failed((TOPIC, 0), 10**6 + offset, "x.Down", now)
        assert event is not None
        status, body, _ = get(f"{base}/readyz")
        assert status == 503 and "circuit breaker" in body
        engine.stop()
        thread.join(10)
    finally:
        server.stop()


class _AwaySqlite(SqliteSink):
    """An SQLite sink whose database can be taken away: while ``away`` is set,
    connecting fails as a lost database server would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, busy_timeout=0.2)
        self.away = threading.Event()

    def connect(self) -> Any:
        if self.away.is_set():
            raise SinkUnavailable(f"{self.display}: the database is away", "bring it back")
        return super().connect()


def test_readyz_is_503_naming_the_sink_while_it_is_unreachable(tmp_path: Path) -> None:
    """Exactly-once into a sink that goes away mid-run: ``/readyz`` says the sink
    is unreachable while the runtime reconnects, 200 again once it is back, and
    every message is stored once."""
    db = tmp_path / "away.db"
    sink = _AwaySqlite(db)
    sink.open("g")
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE fx (id INTEGER)")
    n = 400
    consumer = FakeConsumer.from_logs(
        {(TOPIC, p): [(b"k", f"{p * n + i}".encode()) for i in range(n)] for p in range(2)}
    )
    gone = threading.Event()

    def handler(msg: Any, tx: Any) -> None:
        ident = int(msg.value())
        if ident == n // 2 and not gone.is_set():
            gone.set()
            sink.away.set()
            raise SinkUnavailable("sqlite sink: the connection was lost", "reconnect")
        tx.execute("INSERT INTO fx (id) VALUES (?)", (ident,))

    options = RunOptions(
        bootstrap="fake:1", topic=TOPIC, group="g", mode="exactly-once",
        sink=f"sqlite:///{db}", txn_messages=50, max_messages=2 * n, sink_retry_seconds=60,
    )  # fmt: skip
    metrics = Metrics()
    engine = Engine(handler, options, consumer, sink=sink, metrics=metrics)
    metrics.source = engine.snapshot
    server = ObserveServer(metrics, health=engine)
    server.start()
    base = server.url
    thread = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    try:
        thread.start()
        wait_until(gone.is_set)
        wait_until(lambda: get(f"{base}/readyz")[0] == 503)
        status, body, _ = get(f"{base}/readyz")
        assert status == 503 and "the sqlite sink is unreachable" in body, body
        time.sleep(0.5)  # several reconnect attempts fail meanwhile
        assert get(f"{base}/readyz")[:2] == (status, body), "ready while the sink was away"
        assert get(f"{base}/healthz")[0] == 200, "a lost sink is not a dead process"
        sink.away.clear()
        wait_until(lambda: get(f"{base}/readyz")[0] == 200 or not thread.is_alive())
        thread.join(30)
        assert not thread.is_alive()
    finally:
        engine.stop()
        thread.join(10)  # its log lines go to this test's capture, not a closed one
        server.stop()
    with sqlite3.connect(db) as conn:
        ids = Counter(r[0] for r in conn.execute("SELECT id FROM fx"))
    assert sorted(ids) == list(range(2 * n)) and max(ids.values()) == 1


class _SlowState:
    """A state source that takes ``seconds`` to answer a big document."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.answered = 0

    def state(self) -> dict[str, Any]:
        time.sleep(self.seconds)
        self.answered += 1
        return {"padding": "x" * (1 << 20)}


def _hang_up(port: int, path: str, after: float) -> None:
    """Send a GET of ``path``, wait ``after`` seconds, then close with a reset."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if after:
            time.sleep(after)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_client_that_hangs_up_mid_answer_prints_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The report's ``BrokenPipeError`` traceback: clients that reset the connection
    at once, and while the answer is being made (so it is written into a reset
    socket), leave nothing on stderr, and the server goes on answering."""
    source = _SlowState(0.2)
    server = ObserveServer(source=source)
    server.start()
    try:
        for _ in range(3):
            _hang_up(server.port, "/state.json", after=0)
            _hang_up(server.port, "/state", after=0)
        for _ in range(3):
            _hang_up(server.port, "/state.json", after=0.05)
        wait_until(lambda: source.answered >= 3)
        time.sleep(0.5)  # the answers are written into the reset sockets
        source.seconds = 0
        assert get(f"{server.url}/healthz")[:2] == (200, "ok\n")
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert not any(w in err for w in ("Traceback", "BrokenPipe", "ConnectionReset")), err[-3000:]


def _samples(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus exposition, by name."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def test_process_metrics_are_exported() -> None:
    """Memory, CPU time and open file descriptors of the process (item 7)."""
    server = ObserveServer(Metrics(), source=_SlowState(0))
    server.start()
    try:
        status, body, _ = get(f"{server.url}/metrics")
    finally:
        server.stop()
    assert status == 200
    found = _samples(body)
    for name in (
        "process_resident_memory_bytes", "process_virtual_memory_bytes",
        "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
        "process_start_time_seconds",
    ):  # fmt: skip
        assert found.get(name, 0) > 0, (name, found.get(name))
    assert found["process_open_fds"] <= found["process_max_fds"]
