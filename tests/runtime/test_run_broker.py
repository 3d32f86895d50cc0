"""``htmqc run`` against the bundled broker: crashes, gaps, ordering, rebalances."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from htmqc.broker import Broker
from htmqc.produce import produce

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]


def htmqc_run(
    bootstrap: str,
    topic: str,
    *extra: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "htmqc",
        "run",
        *extra[:1],
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        *extra[1:],
    ]
    # PYTHONFAULTHANDLER: a run that hangs prints every thread's stack on the
    # SIGABRT ``finish`` sends it, into its log.
    full_env = dict(
        os.environ,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}",
        PYTHONFAULTHANDLER="1",
        **(env or {}),
    )
    if log is None:
        proc = subprocess.Popen(
            cmd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        _LOGS.pop(proc.pid, None)  # an earlier run's log under a reused pid is not this one's
        return proc
    with log.open("ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    _LOGS[proc.pid] = log
    return proc


_LOGS: dict[int, Path] = {}


def log_tail(log: Path, size: int = 8000) -> str:
    """The last ``size`` bytes of ``log`` (a hung run's log can be long)."""
    with log.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read().decode(errors="replace")


def logged(text: str, part: str) -> int:
    """How many lines with ``part`` a run logged (``text``: its log), the ones
    the rate limit held back included: each of its summary lines stands for the
    ``(suppressed K similar lines ...)`` it says (see :class:`htmqc.logs.RateLimit`)."""
    total = 0
    for line in text.splitlines():
        if part in line:
            held = re.search(r"\(suppressed (\d+) similar lines in the last \d+ s\)", line)
            total += int(held.group(1)) if held else 1
    return total


def stored(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return int(
                conn.execute("SELECT COALESCE(SUM(committed), 0) FROM htmqc_positions").fetchone()[
                    0
                ]
            )
    except sqlite3.Error:
        return 0


def effect_ids(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM effects")]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """The run's exit code; a run still going after ``timeout`` seconds is
    made to print its threads' stacks, killed, and fails the test with the end
    of its log (stacks included) when :func:`htmqc_run` was given one."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log = _LOGS.get(proc.pid)
        tail = log_tail(log) if log else "(run without a log)"
        raise AssertionError(
            f"the run (pid {proc.pid}) did not end within {timeout} s; its log ends:\n{tail}"
        ) from None


def exactly_once_args(db: Path, group: str, *extra: str) -> list[str]:
    return ["--group", group, "--mode", "exactly-once", "--sink", f"sqlite:///{db}", *extra]


@pytest.mark.brokers("tansu", "kafka")
def test_exactly_once_across_sigkill(broker: Broker, new_topic: Any, tmp_path: Path) -> None:
    topic = new_topic(partitions=4)
    produce(broker.bootstrap, topic, 8000, keys=100)
    db, log = tmp_path / "eo.db", tmp_path / "run.log"
    args = [
        "tests.runtime.handlers:slow_record",
        *exactly_once_args(db, "g-kill", "--txn-messages", "300"),
    ]
    first = htmqc_run(broker.bootstrap, topic, *args, log=log)
    wait_for(lambda: stored(db) >= 1500, 60, "the first transactions")
    first.send_signal(signal.SIGKILL)  # mid-batch: a transaction is open
    first.wait()
    assert stored(db) < 8000
    second = htmqc_run(broker.bootstrap, topic, *args, "--idle-exit", "2", log=log)
    assert finish(second, 90) == 0, log.read_text()[-2000:]
    ids = effect_ids(db)
    assert len(ids) == 8000, "lost or duplicated effects"
    assert sorted(ids) == list(range(8000))
    assert stored(db) == 8000


@pytest.mark.brokers("tansu", "kafka")
def test_offset_gaps_from_aborted_transactions(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    report = produce(broker.bootstrap, topic, 3000, keys=10, transactional=True, abort_every=3)
    assert report.aborted_ids
    db, log = tmp_path / "gaps.db", tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap,
        topic,
        "examples.effects:record",
        *exactly_once_args(db, "g-gaps", "--idle-exit", "2"),
        log=log,
    )
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    ids = effect_ids(db)
    assert len(ids) == len(set(ids)) == report.count
    assert not set(ids) & set(report.aborted_ids)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe"})
    try:
        with sqlite3.connect(db) as conn:
            rows = dict(
                ((t, p), c)
                for t, p, c in conn.execute(
                    'SELECT topic, "partition", committed FROM htmqc_positions'
                )
            )
        for p in range(2):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert rows[(topic, p)] == high, "the watermark did not pass the gaps to the log end"
    finally:
        consumer.close()


@pytest.mark.parametrize("handler", ["log_order", "async_log_order"])
def test_per_key_order_with_parallel_workers_at_least_once(
    broker: Broker, new_topic: Any, tmp_path: Path, handler: str
) -> None:
    """Per-key order with 4 workers; ``async_log_order`` is the same as an
    ``async def`` (its coroutine must run, on the one event-loop thread)."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 4000, keys=20)
    out, log = tmp_path / "order.txt", tmp_path / "run.log"
    group = f"g-order-{handler}"
    proc = htmqc_run(
        broker.bootstrap,
        topic,
        f"tests.runtime.handlers:{handler}",
        "--group",
        group,
        "--workers",
        "4",
        "--idle-exit",
        "2",
        env={"HTMQC_TEST_OUT": str(out)},
        log=log,
    )
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    per_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    threads = set()
    for line in out.read_text().splitlines():
        part, key, ident, thread = line.split()
        per_key[(part, key)].append(int(ident))
        threads.add(thread)
    assert sum(len(v) for v in per_key.values()) == 4000
    for ids in per_key.values():
        assert ids == sorted(ids), "a key's messages ran out of order"
    assert len(threads) == 1 if handler.startswith("async") else len(threads) > 1
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        committed = consumer.committed(parts, timeout=10)
        assert sum(c.offset for c in committed) == 4000, "the group's commits stop short"
    finally:
        consumer.close()


@pytest.mark.brokers("tansu", "kafka")
def test_rebalance_second_consumer_joins_and_leaves_exactly_once(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    # Enough work that A is still busy when B's join completes: if A finished and
    # left in the middle of that rebalance, Tansu 0.6 sometimes never assigns B.
    produce(broker.bootstrap, topic, 15000, keys=100)
    db, log = tmp_path / "rb.db", tmp_path / "run.log"
    args = [
        "tests.runtime.handlers:slow_record",
        *exactly_once_args(db, "g-rb", "--txn-messages", "100"),
    ]
    a = htmqc_run(broker.bootstrap, topic, *args, log=log)
    b = None
    try:
        wait_for(lambda: stored(db) >= 500, 60, "the first member's progress")
        b = htmqc_run(broker.bootstrap, topic, *args, log=log)
        # cooperative-sticky: A gives some partitions up, then B is assigned them
        wait_for(
            lambda: log.read_text().count("INFO htmqc.runtime: assigned") >= 2,
            60,
            "the second member's assignment",
        )
        assert "revoked" in log.read_text()
        time.sleep(1.0)
        b.send_signal(signal.SIGTERM)  # leaves the group gracefully
        assert finish(b, 30) == 0
        # A gets B's partitions back and finishes everything; then it is stopped.
        wait_for(lambda: stored(db) >= 15000, 120, "A to finish after B left")
        a.send_signal(signal.SIGTERM)
        assert finish(a, 30) == 0, log.read_text()[-2000:]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    ids = effect_ids(db)
    assert len(ids) == 15000 and sorted(ids) == list(range(15000))


def test_poison_message_goes_to_the_dlq_at_least_once(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 20, keys=2)
    log = tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap,
        topic,
        "tests.runtime.handlers:poison_five",
        "--group",
        "g-poison",
        "--idle-exit",
        "2",
        log=log,
    )
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "probe-dlq",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(f"{topic}.dlq", 0, 0)])
        letters: list[Any] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not letters:
            letters += [m for m in consumer.consume(10, 0.5) if m.error() is None]
        assert [m.value()[:12] for m in letters] == [b"000000000005"]
        assert dict(letters[0].headers())["htmqc-dlq-reason"] == b"ValueError: id 5 is poison"
    finally:
        consumer.close()
    probe = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-poison"})
    try:
        assert probe.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 20
    finally:
        probe.close()


def test_real_batches_take_the_c_level_readers(broker: Broker, new_topic: Any) -> None:
    """What librdkafka hands out is the type intake reads in C (``READERS``); were it
    another type, every message would take the slow by-name path (correct, but
    several times the cost), and the at-least-once benchmark would show it."""
    from htmqc.runtime import RunOptions, build_engine
    from htmqc.runtime.intake import READERS

    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 200, keys=10)
    kinds: set[type] = set()
    opts = RunOptions(bootstrap=broker.bootstrap, topic=topic, group="g-readers", max_messages=200)
    engine = build_engine(lambda msg: kinds.add(type(msg)), opts)
    assert engine.run(install_signals=False) == 200
    assert kinds and kinds <= set(READERS), kinds
