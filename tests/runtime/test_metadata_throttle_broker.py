"""Commit-metadata budget on a real broker (issue 19, item 3): one very slow key
among many fast ones fragments the set of offsets finished above the watermark
(``1,1,1,...``: two bytes per slow message), which would outgrow Kafka's 4096
bytes of offset-commit metadata. The partition is throttled instead: the run
completes, no commit carries more than 4096 bytes, the throttle is counted, and
the output is exactly-once (Kafka->Kafka) / complete (at-least-once)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from htmqc.broker import Broker
from htmqc.core.metadata_budget import DEFAULT_LIMIT
from htmqc.produce import produce
from htmqc.runtime import RunOptions, build_engine

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]

SLOW = b"slow"


def records(n: int) -> list[tuple[bytes, bytes]]:
    """Every other message has the slow key; the others each a key of their own."""
    return [(SLOW if i % 2 == 0 else f"k{i}".encode(), str(i).encode()) for i in range(n)]


def slow_until(seconds: float, *, fail: bool) -> Callable[[Any], None]:
    """Messages with the slow key are held up for ``seconds`` from the first one:
    they raise (exactly-once: the key is held, its later messages wait, in memory
    retries) or the first sleeps (at-least-once: its lane waits)."""
    deadline: list[float] = []
    lock = threading.Lock()

    def hold(msg: Any) -> None:
        if msg.key() != SLOW:
            return
        with lock:
            if not deadline:
                deadline.append(time.monotonic() + seconds)
        left = deadline[0] - time.monotonic()
        if left > 0:
            if fail:
                raise RuntimeError("slow key not ready")
            time.sleep(left)

    return hold


def recording(mp: pytest.MonkeyPatch, target: Any, name: str, sizes: list[int]) -> None:
    """Wrap ``target.name`` (a metadata encoder) to record every length it returns."""
    inner = getattr(target, name)

    def wrapped(*args: Any) -> str:
        out = str(inner(*args))
        sizes.append(len(out))
        return out

    mp.setattr(target, name, wrapped)


def committed_metadata(bootstrap: str, group: str, topic: str) -> tuple[int, str]:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        part = probe.committed([TopicPartition(topic, 0)], timeout=10)[0]
        return part.offset, part.metadata or ""
    finally:
        probe.close()


class CommitWatch:
    """Reads the group's committed metadata back from the broker every 50 ms while
    the run goes on (Tansu 0.6 returns none; Apache Kafka returns it, and refuses
    more than 4096 bytes)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.longest = 0
        self._stop = threading.Event()
        self._probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._tp = TopicPartition(topic, 0)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                part = self._probe.committed([self._tp], timeout=5)[0]
            except Exception:
                continue
            self.longest = max(self.longest, len(part.metadata or ""))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._probe.close()
        return self.longest


def read_committed(bootstrap: str, topic: str, want: int, wait: float = 30.0) -> list[bytes]:
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and len(out) < want:
            out += [bytes(m.value() or b"") for m in reader.consume(500, 0.5) if m.error() is None]
        time.sleep(0.5)  # anything more would be a duplicate
        out += [bytes(m.value() or b"") for m in reader.consume(500, 0.5) if m.error() is None]
        return out
    finally:
        reader.close()


def test_exactly_once_kafka_throttles_instead_of_failing(
    broker: Broker, broker_kind: str, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import htmqc.sinks.kafka as kafka_sink

    n = 8000
    topic, out = new_topic(1), new_topic(1)
    group = f"g-meta-{uuid.uuid4().hex[:6]}"
    produce(broker.bootstrap, topic, n, records=records(n))
    sizes: list[int] = []
    recording(monkeypatch, kafka_sink, "encode_metadata", sizes)
    hold = slow_until(4.0, fail=True)

    def handler(msg: Any, tx: Any) -> None:
        hold(msg)
        tx.send(None, msg.value(), key=msg.key())

    opts = RunOptions(
        bootstrap=broker.bootstrap, topic=topic, group=group, mode="exactly-once",
        sink=f"kafka:{out}", max_messages=n, idle_exit=60.0,
        max_retries=10_000, backoff_ms=100.0, backoff_max_ms=200.0,
        poison_threshold=1_000_000, breaker_min_calls=10**9, breaker_consecutive=10**9,
    )  # fmt: skip
    engine = build_engine(handler, opts)
    watch = CommitWatch(broker.bootstrap, group, topic)
    assert engine.run(install_signals=False) == n  # no "do not fit the commit metadata"
    read_back = watch.stop()
    assert engine.stats.throttled > 0, "the slow key never throttled the partition"
    engine.snapshot.publish()
    assert engine.snapshot.state()["extra"]["metadata_throttled"] == engine.stats.throttled
    # the set did fragment (so the test means something), and never past the limit
    assert max(sizes) > DEFAULT_LIMIT // 2, max(sizes)
    assert max(sizes) <= DEFAULT_LIMIT
    offset, metadata = committed_metadata(broker.bootstrap, group, topic)
    assert offset == n and len(metadata) <= DEFAULT_LIMIT
    assert read_back <= DEFAULT_LIMIT
    if broker_kind == "kafka":  # the broker stored what was sent (Tansu drops it)
        assert read_back > DEFAULT_LIMIT // 2, read_back
    values = read_committed(broker.bootstrap, out, n)
    assert sorted(values, key=int) == [str(i).encode() for i in range(n)]  # each once


def test_at_least_once_throttles_and_every_commit_fits(
    broker: Broker, broker_kind: str, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from htmqc.runtime.delivery import AtLeastOnce

    n = 30_000
    topic = new_topic(1)
    group = f"g-meta-alo-{uuid.uuid4().hex[:6]}"
    produce(broker.bootstrap, topic, n, records=records(n))
    sizes: list[int] = []
    recording(monkeypatch, AtLeastOnce, "metadata", sizes)
    seen: set[int] = set()
    hold = slow_until(4.0, fail=False)

    def handler(msg: Any) -> None:
        hold(msg)
        seen.add(int(msg.value()))

    opts = RunOptions(
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        workers=4,
        max_messages=n,
        idle_exit=60.0,
        commit_ms=200.0,
    )
    engine = build_engine(handler, opts)
    watch = CommitWatch(broker.bootstrap, group, topic)
    assert engine.run(install_signals=False) == n
    read_back = watch.stop()
    assert engine.stats.throttled > 0, "the slow key never throttled the partition"
    assert sizes and max(sizes) <= DEFAULT_LIMIT, max(sizes)
    assert max(sizes) > DEFAULT_LIMIT // 2  # the set did fragment
    assert seen == set(range(n))
    offset, metadata = committed_metadata(broker.bootstrap, group, topic)
    assert offset == n and len(metadata) <= DEFAULT_LIMIT
    assert read_back <= DEFAULT_LIMIT
    if broker_kind == "kafka":  # the broker stored what was sent (Tansu drops it)
        assert read_back > DEFAULT_LIMIT // 2, read_back
