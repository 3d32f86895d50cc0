"""Fixtures for the observability tests: a hand-driven core, a server over it,
and the system tools it needs (promtool, prometheus, chromium: ``tests.services``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from htmqc.core import ConsumerCore, FailureKind, TopicPartition
from htmqc.core.flow import FlowPolicy, FlowWindow
from htmqc.observe import CoreStateSource, Metrics, ObserveServer

ORDERS_0: TopicPartition = ("orders", 0)
ORDERS_1: TopicPartition = ("orders", 1)
AUDIT_3: TopicPartition = ("audit.events", 3)

@dataclass
class Scenario:
    """A real core driven by hand into an interesting state, plus the extras a
    runtime would report. ``lock`` is what the runtime would hold."""

    core: ConsumerCore
    flow: FlowWindow
    epochs: dict[TopicPartition, int]
    paused: set[TopicPartition] = field(default_factory=set)
    dlq: dict[str, int] = field(default_factory=dict)
    highs: dict[TopicPartition, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def source(self) -> CoreStateSource:
        return CoreStateSource(
            self.core,
            lock=self.lock,
            flow=self.flow,
            paused=lambda: self.paused,
            dlq_counts=lambda: self.dlq,
            high_watermarks=lambda: self.highs,
            extra=lambda: {"mode": "at-least-once"},
        )


def build_scenario() -> Scenario:
    """orders/0: committed 120, processed 130, next 160, out-of-order finishes;
    orders/1: a failed message retrying, paused; audit.events/3: idle."""
    core = ConsumerCore()
    flow = FlowWindow(FlowPolicy(
        min_window=16, initial_window=1000, max_window=10_000, increase=50,
        latency_target=1.0, max_in_flight=10_000, max_in_flight_bytes=256 << 20,
    ))
    epochs = {tp: core.assign(tp, start) for tp, start in
              ((ORDERS_0, 100), (ORDERS_1, 40), (AUDIT_3, 7))}
    e = epochs[ORDERS_0]
    run = list(core.fetched(ORDERS_0, e, range(100, 160)))
    core.started_many(ORDERS_0, e, run)
    core.succeeded_many(ORDERS_0, e, [*range(100, 120)])
    commit = core.commit_requested(ORDERS_0)
    assert commit is not None and commit.offset == 120
    core.commit_acked(ORDERS_0, e, 120)
    core.succeeded_many(ORDERS_0, e, [*range(120, 130), 140, 141, 150])
    e = epochs[ORDERS_1]
    run = list(core.fetched(ORDERS_1, e, [40, 41, 42, 45, 46], end=50))
    core.started_many(ORDERS_1, e, run[:3])
    core.failed(ORDERS_1, e, 40, FailureKind.RETRYABLE, now=0.0, jitter=0.5)
    flow.observe(completed=100, errors=0, latency=0.1)
    return Scenario(
        core=core,
        flow=flow,
        epochs=epochs,
        paused={ORDERS_1},
        dlq={"failed": 2, "poison": 1},
        highs={ORDERS_0: 200, ORDERS_1: 80},
    )


@pytest.fixture
def scenario() -> Scenario:
    return build_scenario()


@pytest.fixture
def served(scenario: Scenario) -> Iterator[tuple[Scenario, Metrics, ObserveServer]]:
    """The scenario behind a started server (127.0.0.1, free port)."""
    metrics = Metrics(scenario.source())
    server = ObserveServer(metrics, request_timeout=1.0)
    server.start()
    try:
        yield scenario, metrics, server
    finally:
        server.stop()
