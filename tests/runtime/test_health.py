"""``/healthz`` and ``/readyz`` that mean something, and an HTTP server that never
waits for the engine (issue 16, item 7). A fake consumer, no broker.

Regression kept from the report: with the engine stuck (a 40 s table lock held
it), ``/healthz`` still said 200 while ``/state.json`` hung."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import Any

from htmqc.core import BreakerPolicy
from htmqc.observe import Metrics, ObserveServer
from htmqc.runtime import Engine, RunOptions
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
