"""Failure handling against the bundled broker: a tenfold slowdown, poison
messages among many, transient sink errors (issue: failure handling)."""

from __future__ import annotations

import json
import random
import sqlite3
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from htmqc.broker import Broker
from htmqc.loopback import free_port
from htmqc.produce import produce
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    logged,
)

pytestmark = pytest.mark.broker


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_tenfold_slowdown_stays_bounded_without_rebalance(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    count, bound = 12_000, 400
    produce(broker.bootstrap, topic, count, keys=200)
    flag, port, log = tmp_path / "slow", free_port(), tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, "tests.runtime.failure_handlers:slowdown",
        "--group", "g-slow", "--workers", "4", "--max-in-flight", str(bound),
        "--flow", "fixed", "--metrics-port", str(port), "--idle-exit", "2",
        env={"HTMQC_TEST_FLAG": str(flag)}, log=log,
    )
    samples: list[dict[str, Any]] = []
    rss: list[int] = []
    started = time.monotonic()
    slow_from, slow_until = 2.0, 7.0
    try:
        while proc.poll() is None and time.monotonic() - started < 120:
            elapsed = time.monotonic() - started
            if slow_from <= elapsed < slow_until and not flag.exists():
                flag.write_text("")
            elif elapsed >= slow_until and flag.exists():
                flag.unlink()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/state.json", timeout=2) as r:
                    samples.append({"t": elapsed, **json.loads(r.read())})
            except OSError:
                pass
            rss.append(_rss_kib(proc.pid))
            time.sleep(0.1)
        assert finish(proc, 30) == 0, log.read_text()[-2000:]
    finally:
        flag.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    slow = [s for s in samples if slow_from + 1 <= s["t"] < slow_until]
    assert slow, "no sample during the slowdown"
    last = samples[-1]["extra"]
    assert last["finished"] == count, "lag did not recover: not everything finished"
    assert max(s["in_flight"] for s in samples) <= bound
    assert last["peak_in_flight"] <= bound, last
    assert any(s["flow"]["paused"] for s in slow), "never paused while slow"
    assert last["assignments"] == 1, "a rebalance happened"
    peak_rss_mib = max(rss) / 1024
    assert peak_rss_mib < 300, f"RSS {peak_rss_mib:.0f} MiB"
    print(f"slowdown: peak in-flight {last['peak_in_flight']} (bound {bound}), "
          f"peak in-flight bytes {last['peak_in_flight_bytes']}, peak RSS {peak_rss_mib:.1f} MiB")


@pytest.mark.brokers("tansu", "kafka")
def test_poison_messages_end_in_the_dlq_and_the_rest_exactly_once(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=4)
    count = 100_000
    poison = sorted(random.Random(11).sample(range(count), 25))
    produce(broker.bootstrap, topic, count, keys=500)
    db, log = tmp_path / "eo.db", tmp_path / "run.log"
    started = time.monotonic()
    proc = htmqc_run(
        broker.bootstrap, topic, "tests.runtime.failure_handlers:poison_or_record",
        *exactly_once_args(db, "g-poison", "--poison-threshold", "3", "--max-retries", "10",
                           "--backoff-ms", "5", "--backoff-max-ms", "50", "--idle-exit", "3"),
        env={"HTMQC_TEST_POISON": ",".join(map(str, poison))}, log=log,
    )
    assert finish(proc, 240) == 0, log.read_text()[-2000:]
    took = time.monotonic() - started
    ids = Counter(effect_ids(db))
    assert sorted(ids) == sorted(set(range(count)) - set(poison)), "lost or extra effects"
    assert max(ids.values()) == 1, "duplicated effects"
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            'SELECT "partition", "offset", kind, retries FROM htmqc_dead_letters'
        ).fetchall()
    assert len(rows) == len(poison)
    assert {r[2] for r in rows} == {"poison"}
    assert all(r[3] == 2 for r in rows), "not dead-lettered at the poison threshold"
    print(f"poison: {len(poison)} of {count} dead-lettered, rest exactly once, {took:.1f} s")


@pytest.mark.brokers("tansu", "kafka")
def test_transient_sink_errors_are_retried_exactly_once(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    count = 5000
    produce(broker.bootstrap, topic, count, keys=50)
    db, log = tmp_path / "eo.db", tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, "tests.runtime.failure_handlers:flaky_record",
        *exactly_once_args(db, "g-flaky", "--backoff-ms", "5", "--idle-exit", "2"),
        env={"HTMQC_TEST_FLAKY_EVERY": "7"}, log=log,
    )
    assert finish(proc, 120) == 0, log.read_text()[-2000:]
    ids = Counter(effect_ids(db))
    assert sorted(ids) == list(range(count))
    assert max(ids.values()) == 1, "a failed attempt's half-done effect survived"
    # Every 7th id fails once. A failure inside a piece run in one scope is not a
    # failure report: the piece runs again one message at a time (where that id
    # now passes), so up to one failure per piece goes unlogged, how many depends
    # on timing (keys held by retries make pieces run isolated). Half is a bound
    # any timing meets; with the failures switched off nothing is logged.
    assert logged(log.read_text(), "handler failed") >= count // 7 // 2
