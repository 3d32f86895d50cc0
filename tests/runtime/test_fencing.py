"""A zombie's late transaction is rejected by the sink's fence (no broker needed).

Two engines share one SQLite sink. A claims the partition, fetches a batch and
stalls; the partition moves to B, which claims it (bumping the fence), stores
its effects and position. A wakes up and runs its late batch: the sink rejects
the transaction, nothing of it is stored, and A lets the partition go.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition as KafkaTP
from examples.effects import record

from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import open_sink
from tests.runtime.fakes import FakeConsumer, FakeMessage

TOPIC = "z"
TP = (TOPIC, 0)


def _messages(lo: int, hi: int) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, 0, i, b"k", f"{i:012d}".encode()) for i in range(lo, hi)]


def _member(db: Path, clock: Any = time.monotonic) -> tuple[Engine, FakeConsumer]:
    consumer = FakeConsumer(TOPIC, {TP: [(b"k", f"{i:012d}".encode()) for i in range(10)]})
    sink = open_sink(f"sqlite:///{db}")
    sink.open("g")
    opts = RunOptions(
        bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=f"sqlite:///{db}",
        kafka_config={"session.timeout.ms": 1000},
    )
    engine = Engine(record, opts, consumer, sink=sink, clock=clock)
    return engine, consumer


def test_zombie_transaction_is_fenced(tmp_path: Path) -> None:
    db = tmp_path / "z.db"
    a, ca = _member(db)
    b, cb = _member(db)
    a.on_assign(ca, [KafkaTP(TOPIC, 0)])
    b.on_assign(cb, [KafkaTP(TOPIC, 0)])  # the group moved the partition while A stalled
    b.dispatch(_messages(0, 10))
    b.run_backlog()
    b.commit(force=True)
    a.dispatch(_messages(0, 6))  # A's late batch
    a.run_backlog()
    a.commit(force=True)
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        committed = conn.execute("SELECT committed FROM htmqc_positions").fetchone()[0]
    assert ids == list(range(10)), "the zombie's effects were stored"
    assert committed == 10
    assert a.core.epoch(TP) is None and TP in a.fenced
    assert TP in ca.paused
    a.dispatch(_messages(6, 10))  # fenced partitions run nothing more
    a.run_backlog()
    assert a.in_flight == 0


def test_fenced_member_keeps_partitions_nobody_else_claimed(tmp_path: Path) -> None:
    db = tmp_path / "z2.db"
    a, ca = _member(db)
    ca.logs[(TOPIC, 1)] = [(b"k", f"{100 + i:012d}".encode()) for i in range(4)]
    b, cb = _member(db)
    a.on_assign(ca, [KafkaTP(TOPIC, 0), KafkaTP(TOPIC, 1)])
    b.on_assign(cb, [KafkaTP(TOPIC, 0)])
    a.dispatch(
        _messages(0, 3)
        + [FakeMessage(TOPIC, 1, i, b"k", f"{100 + i:012d}".encode()) for i in range(4)]
    )
    a.run_backlog()
    a.commit(force=True)  # fenced on partition 0: the whole transaction is rolled back
    with sqlite3.connect(db) as conn:  # even the table the handler created was rolled back
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "effects" not in tables
    assert a.core.epoch((TOPIC, 1)) is not None, "partition 1 was not claimed again"
    assert ca.positions[(TOPIC, 1)] == 0, "partition 1 was not re-read from the stored position"
    assert a.core.epoch(TP) is None


def test_a_fenced_partition_still_assigned_after_the_session_is_claimed_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "z3.db"
    now = [0.0]
    a, ca = _member(db, clock=lambda: now[0])
    b, cb = _member(db)
    a.on_assign(ca, [KafkaTP(TOPIC, 0)])
    b.on_assign(cb, [KafkaTP(TOPIC, 0)])  # a racing claim; the group never revokes A
    a.dispatch(_messages(0, 3))
    a.run_backlog()
    a.commit(force=True)
    assert TP in a.fenced and a.core.epoch(TP) is None and TP in ca.paused
    now[0] = 0.5
    a._reclaim_fenced()
    assert TP in a.fenced, "claimed again before the session timeout"
    now[0] = 1.5  # session.timeout.ms=1000 below
    a._reclaim_fenced()
    assert TP not in a.fenced and a.core.epoch(TP) is not None
    assert TP not in ca.paused, "still paused: the partition would stall"
    a.dispatch(_messages(0, 10))
    a.run_backlog()
    a.commit(force=True)
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        committed = conn.execute("SELECT committed FROM htmqc_positions").fetchone()[0]
    assert ids == list(range(10)) and committed == 10
    b.dispatch(_messages(0, 4))  # B is the stale one now
    b.run_backlog()
    b.commit(force=True)
    assert TP in b.fenced


def test_a_fenced_partition_assigned_back_after_a_loss_is_fetched_again(tmp_path: Path) -> None:
    db = tmp_path / "z4.db"
    a, ca = _member(db)
    b, cb = _member(db)
    a.on_assign(ca, [KafkaTP(TOPIC, 0)])
    b.on_assign(cb, [KafkaTP(TOPIC, 0)])
    a.dispatch(_messages(0, 3))
    a.run_backlog()
    a.commit(force=True)
    assert TP in ca.paused, "the fenced partition was not paused"
    a.on_lost(ca, [KafkaTP(TOPIC, 0)])  # the group takes it away ...
    a.on_assign(ca, [KafkaTP(TOPIC, 0)])  # ... and later gives it back
    assert TP not in ca.paused, "assigned back but still paused: it would never be fetched"
