"""The circuit breaker wired into the runtime (issue 16, item 5): a handler that
always raises trips it; then nothing more is dead-lettered, work stops but for
probes, and once the handler is fixed the whole stream is processed."""

from __future__ import annotations

import threading
import time
from typing import Any

from htmqc.core import BreakerPolicy, BreakerState
from htmqc.dlq.headers import OFFSET, PARTITION
from htmqc.observe.metrics import Metrics
from htmqc.runtime import Engine, RunOptions
from htmqc.testing import FakeConsumer, FakeProducer, make_logs

TOPIC = "t"
N = 120
POLICY = BreakerPolicy(consecutive=5, first_backoff=0.05, max_backoff=0.2)


class Broken(RuntimeError):
    """What the broken deploy raises."""


def test_an_always_raising_handler_trips_the_breaker_and_nothing_is_dead_lettered() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, N // 2, keys=13))
    producer = FakeProducer()
    broken = threading.Event()
    broken.set()
    calls = {"broken": 0, "ok": 0}
    done: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        with lock:
            if broken.is_set():
                calls["broken"] += 1
                raise Broken("the dependency is down")
            calls["ok"] += 1
            done.add((msg.partition(), msg.offset()))

    options = RunOptions(
        bootstrap="fake:1",
        topic=TOPIC,
        group="g",
        workers=2,
        max_messages=N,
        batch_size=20,
        max_retries=1,  # a probe that fails is past its budget: held, not dead-lettered
    )
    metrics = Metrics()
    engine = Engine(
        handler,
        options,
        consumer,
        producer_factory=lambda: producer,
        seed=1,
        breaker=POLICY,
        metrics=metrics,
    )
    consumer.on_commit = engine.on_commit
    metrics.source = engine.state_source()
    thread = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while engine.breaker.trips == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.breaker.trips >= 1, "the breaker never tripped"
    time.sleep(1.0)  # broken for a while: only probes go out, nothing is dead-lettered
    with lock:
        while_open = calls["broken"]
    assert engine.breaker.state is not BreakerState.CLOSED
    assert "htmqc_breaker_open 1.0" in metrics.exposition().decode()
    broken.clear()  # the fix is deployed
    thread.join(20)
    assert not thread.is_alive(), "the stream was not processed after the fix"
    assert engine.breaker.closed
    assert producer.records == [], f"dead-lettered: {len(producer.records)}"
    assert not any(engine.dlq_counts.values())
    assert len(done) == N
    # Without the breaker every message fails max_retries + 1 times (N * 4 calls).
    assert while_open < 2 * POLICY.consecutive + 30, while_open
    assert consumer.commits[(TOPIC, 0)][0] == N // 2
    assert consumer.commits[(TOPIC, 1)][0] == N // 2
    assert 'htmqc_breaker_transitions_total{event="tripped"}' in metrics.exposition().decode()


def test_the_run_options_set_the_breaker_triggers() -> None:
    """``--breaker-consecutive``, ``--breaker-failure-rate`` and
    ``--breaker-min-calls`` reach the core's breaker; the rest is the core's."""
    options = RunOptions(
        bootstrap="fake:1", topic=TOPIC, group="g",
        breaker_consecutive=3, breaker_failure_rate=0.25, breaker_min_calls=7,
    )  # fmt: skip
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 1, keys=1))
    engine = Engine(lambda msg: None, options, consumer)
    policy = engine.breaker.policy
    assert (policy.consecutive, policy.failure_rate, policy.min_calls) == (3, 0.25, 7)
    assert policy.window == BreakerPolicy().window


def test_scattered_bad_messages_retried_together_do_not_trip_the_breaker() -> None:
    """Bad data is not a broken handler: one message in twenty always fails, the
    rest succeed. Their first failures are scattered among successes; their
    retries come back after the rest is done, one failure after another. A
    retry failing again says nothing new (the message was known to fail), so
    the streak does not count it: the breaker stays closed, each bad message is
    dead-lettered after its retries, the stream ends. (Counting them tripped
    it; the held messages then failed every probe and the run never ended.)"""
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, N, keys=13))
    producer = FakeProducer()
    done: set[tuple[int, int]] = set()
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        if msg.offset() % 20 == 7:
            raise Broken(f"bad record at {msg.offset()}")
        with lock:
            done.add((msg.partition(), msg.offset()))

    options = RunOptions(
        bootstrap="fake:1", topic=TOPIC, group="g", workers=2, max_messages=2 * N,
        batch_size=20, max_retries=3, backoff_ms=100, backoff_max_ms=100,
    )  # fmt: skip
    engine = Engine(
        handler, options, consumer, producer_factory=lambda: producer, seed=1,
        breaker=BreakerPolicy(consecutive=5, first_backoff=0.05, max_backoff=0.2),
    )  # fmt: skip
    consumer.on_commit = engine.on_commit
    thread = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    thread.start()
    thread.join(20)
    bad = [(p, o) for p in range(2) for o in range(N) if o % 20 == 7]
    assert not thread.is_alive(), f"the run never ended (breaker trips: {engine.breaker.trips})"
    assert engine.breaker.trips == 0
    assert len(done) == 2 * N - len(bad)
    letters = [dict(r.headers) for r in producer.records]
    assert sorted((int(h[PARTITION]), int(h[OFFSET])) for h in letters) == bad
