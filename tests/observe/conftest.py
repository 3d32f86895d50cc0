"""Fixtures for the observability tests: a hand-driven core, a server over it,
and system tools (promtool, prometheus, chromium) installed from Debian on demand."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from htmqc.core import ConsumerCore, FailureKind, TopicPartition
from htmqc.core.flow import FlowWindow
from htmqc.observe import CoreStateSource, Metrics, ObserveServer

ORDERS_0: TopicPartition = ("orders", 0)
ORDERS_1: TopicPartition = ("orders", 1)
AUDIT_3: TopicPartition = ("audit.events", 3)

_apt_lock = threading.Lock()
_apt_updated = False


def require_tool(tool: str, package: str) -> str:
    """The path of ``tool``; installs Debian ``package`` when missing, and skips
    (with the reason) only when that cannot be done."""
    global _apt_updated
    path = shutil.which(tool)
    if path:
        return path
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip(f"{tool} missing and apt-get unavailable: install Debian package {package}")
    if os.geteuid() != 0:
        pytest.skip(f"{tool} missing and not root: run `apt-get install -y {package}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _apt_lock:
        if not _apt_updated:
            subprocess.run([apt, "update", "-qq"], env=env, capture_output=True, timeout=600)
            _apt_updated = True
        done = subprocess.run(
            [apt, "install", "-y", "-qq", "--no-install-recommends", package],
            env=env, capture_output=True, text=True, timeout=900,
        )
    path = shutil.which(tool)
    if path is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"cannot install {package} for {tool}: {tail[0]}")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    flow = FlowWindow()
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
