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
from htmqc.testing import FakeConsumer, FakeMessage

TOPIC = "z"
TP = (TOPIC, 0)


def _messages(lo: int, hi: int) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, 0, i, b"k", f"{i:012d}".encode()) for i in range(lo, hi)]


def _member(
    db: Path, clock: Any = time.monotonic, partitions: int = 1
) -> tuple[Engine, FakeConsumer]:
    """An exactly-once engine in lockstep (driven by hand: ``dispatch``, ``settle``,
    ``commit``), its workers started, on a fake consumer of ``partitions``
    partitions (partition 1 holds ids 100...)."""
    logs = {(TOPIC, p): [(b"k", f"{100 * p + i:012d}".encode()) for i in range(10)]
            for p in range(partitions)}  # fmt: skip
    consumer = FakeConsumer.from_logs(logs)
    sink = open_sink(f"sqlite:///{db}")
    sink.open("g")
    opts = RunOptions(
        bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=f"sqlite:///{db}",
        kafka_config={"session.timeout.ms": 1000},
    )
    engine = Engine(record, opts, consumer, sink=sink, clock=clock, lockstep=True)
    engine.start()
    return engine, consumer


def _assign(engine: Engine, consumer: FakeConsumer, *partitions: int) -> None:
    """The group assigns ``partitions``; the engine's worker claims them in the sink."""
    engine.on_assign(consumer, [KafkaTP(TOPIC, p) for p in partitions])
    engine.settle()


def _lose(engine: Engine, consumer: FakeConsumer, *partitions: int) -> None:
    """The group takes ``partitions`` away (lost)."""
    engine.on_lost(consumer, [KafkaTP(TOPIC, p) for p in partitions])
    engine.settle()


def _run(engine: Engine, msgs: list[FakeMessage], batch: int | None = None) -> None:
    """Dispatch ``msgs`` (returned by consume call ``batch``; ``None``: just now),
    let the worker run them, commit (waiting for the outcome)."""
    engine.dispatch(msgs, batch)
    engine.settle()
    engine.commit(force=True)
    engine.settle()


def test_zombie_transaction_is_fenced(tmp_path: Path) -> None:
    db = tmp_path / "z.db"
    a, ca = _member(db)
    b, cb = _member(db)
    _assign(a, ca, 0)
    _assign(b, cb, 0)  # the group moved the partition while A stalled
    _run(b, _messages(0, 10))
    _run(a, _messages(0, 6))  # A's late batch
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        committed = conn.execute("SELECT committed FROM htmqc_positions").fetchone()[0]
    assert ids == list(range(10)), "the zombie's effects were stored"
    assert committed == 10
    assert a.core.epoch(TP) is None and TP in a.fenced
    assert TP in ca.paused
    a.dispatch(_messages(6, 10))  # fenced partitions run nothing more
    a.settle()
    assert a.in_flight == 0


def test_fenced_member_keeps_partitions_nobody_else_claimed(tmp_path: Path) -> None:
    db = tmp_path / "z2.db"
    a, ca = _member(db, partitions=2)
    b, cb = _member(db)
    _assign(a, ca, 0, 1)
    _assign(b, cb, 0)
    # fenced on partition 0: the whole transaction is rolled back
    _run(a, _messages(0, 3)
         + [FakeMessage(TOPIC, 1, i, b"k", f"{100 + i:012d}".encode()) for i in range(4)])
    with sqlite3.connect(db) as conn:  # even the table the handler created was rolled back
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "effects" not in tables
    assert a.core.epoch((TOPIC, 1)) is not None, "partition 1 was not claimed again"
    assert ca.positions[(TOPIC, 1)] == 0, "partition 1 was not re-read from the stored position"
    assert a.core.epoch(TP) is None


def _p1(lo: int, hi: int) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, 1, i, b"k", f"{100 + i:012d}".encode()) for i in range(lo, hi)]


def _rolled_back_on_partition_1(db: Path) -> tuple[Engine, FakeConsumer, int]:
    """A holds partitions 0 and 1; B's claim fences A on partition 0 while A's
    transaction holds partition 1's offsets 0-3 too: it is rolled back, and
    partition 1 is claimed again at 0. Returns A, its consumer, and the number of
    the consume call that returned the batch (read before the seek back to 0)."""
    a, ca = _member(db, partitions=2)
    b, cb = _member(db)
    _assign(a, ca, 0, 1)
    _assign(b, cb, 0)
    batch = a.consumes + 1
    _run(a, _messages(0, 3) + _p1(0, 4))
    assert a.core.tracker((TOPIC, 1)).next == 0, "partition 1 was not re-read from the sink"
    return a, ca, batch


def _stored_1(db: Path) -> tuple[list[int], int]:
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects WHERE id >= 100"))
        got = conn.execute('SELECT committed FROM htmqc_positions WHERE "partition" = 1')
        return ids, got.fetchone()[0]


def test_records_read_before_the_rollback_are_no_gap(tmp_path: Path) -> None:
    """The fetcher had read partition 1 up to 9 when the rollback sought it back to
    0; those records, handed over after the seek, start above ``next``. Taken as
    they come, offsets 0-3 would be a gap the broker skipped: finished without
    running, committed, lost. They are set aside and fetched again from 0."""
    db = tmp_path / "gap.db"
    a, _, before = _rolled_back_on_partition_1(db)
    _run(a, _p1(4, 10), before)
    assert a.core.tracker((TOPIC, 1)).next == 0, "a stale batch moved the partition on"
    _run(a, _p1(0, 10))  # fetched again, from the seek
    assert _stored_1(db) == (list(range(100, 110)), 10)


def test_a_stale_batch_that_starts_at_next_is_taken(tmp_path: Path) -> None:
    """Records are immutable: a batch read before the seek that starts exactly at
    ``next`` is the same data, and runs."""
    db = tmp_path / "same.db"
    a, _, before = _rolled_back_on_partition_1(db)
    _run(a, _p1(0, 10), before)
    assert _stored_1(db) == (list(range(100, 110)), 10)


def test_no_gap_from_the_position_while_a_seek_is_outstanding(tmp_path: Path) -> None:
    """librdkafka refuses the seek back to the sink's position (it is tried again
    next turn); meanwhile ``position`` still says where the old fetch got to.
    That is no gap the broker skipped: nothing is finished from it."""
    db = tmp_path / "seek.db"
    a, _, _ = _rolled_back_on_partition_1(db)
    own = a.ownership
    own._to_seek[(TOPIC, 1)] = 0  # the seek was refused
    consumer: Any = a.consumer
    consumer._position[(TOPIC, 1)] = 10  # where the old fetch got to
    a.report_gaps()
    assert a.core.tracker((TOPIC, 1)).next == 0, "the old position was taken as a gap"


def test_a_fenced_partition_still_assigned_after_the_session_is_claimed_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "z3.db"
    now = [0.0]
    a, ca = _member(db, clock=lambda: now[0])
    b, cb = _member(db)
    _assign(a, ca, 0)
    _assign(b, cb, 0)  # a racing claim; the group never revokes A
    _run(a, _messages(0, 3))
    assert TP in a.fenced and a.core.epoch(TP) is None and TP in ca.paused
    now[0] = 0.5
    a.ownership.reclaim_fenced(now[0])
    a.settle()
    assert TP in a.fenced, "claimed again before the session timeout"
    now[0] = 1.5  # session.timeout.ms=1000 below
    a.ownership.reclaim_fenced(now[0])
    a.settle()
    assert TP not in a.fenced and a.core.epoch(TP) is not None
    assert TP not in ca.paused, "still paused: the partition would stall"
    _run(a, _messages(0, 10))
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        committed = conn.execute("SELECT committed FROM htmqc_positions").fetchone()[0]
    assert ids == list(range(10)) and committed == 10
    _run(b, _messages(0, 4))  # B is the stale one now
    assert TP in b.fenced


def test_a_fenced_partition_assigned_back_after_a_loss_is_fetched_again(tmp_path: Path) -> None:
    db = tmp_path / "z4.db"
    a, ca = _member(db)
    b, cb = _member(db)
    _assign(a, ca, 0)
    _assign(b, cb, 0)
    _run(a, _messages(0, 3))
    assert TP in ca.paused, "the fenced partition was not paused"
    _lose(a, ca, 0)  # the group takes it away ...
    _assign(a, ca, 0)  # ... and later gives it back
    assert TP not in ca.paused, "assigned back but still paused: it would never be fetched"


def test_a_revoke_past_the_bound_rolls_the_open_transaction_back(tmp_path: Path) -> None:
    """Partition 1 is revoked while its handler is stuck in the open transaction
    (past ``--shutdown-seconds``), after partition 0's messages ran in that same
    transaction: partition 1 is let go uncommitted, the open transaction is
    rolled back when the handler returns (committing it would store partition
    1's effects without its position), and partition 0, still ours, is claimed
    again and re-read from the sink: every effect stored once, none of
    partition 1's."""
    import threading

    db = tmp_path / "doom.db"
    logs = {(TOPIC, p): [(b"k", f"{100 * p + i:012d}".encode()) for i in range(10)]
            for p in range(2)}  # fmt: skip
    consumer = FakeConsumer.from_logs(logs)
    sink = open_sink(f"sqlite:///{db}")
    sink.open("g")
    stuck, release = threading.Event(), threading.Event()

    def handler(msg: Any, tx: Any) -> None:
        record(msg, tx)
        if (msg.partition(), msg.offset()) == (1, 5) and not stuck.is_set():
            stuck.set()
            release.wait(10)

    opts = RunOptions(
        bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=f"sqlite:///{db}",
        shutdown_seconds=0.3, txn_ms=2000, txn_messages=1000,
    )
    engine = Engine(handler, opts, consumer, sink=sink)
    runner = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    runner.start()
    revoked = (TOPIC, 1)
    try:
        assert stuck.wait(10)
        consumer.rebalance("revoke", [revoked])
        deadline = time.monotonic() + 10
        while revoked in consumer.positions and time.monotonic() < deadline:
            time.sleep(0.01)
        assert revoked not in consumer.positions, "the revoke did not finish within its bound"
        release.set()
        while time.monotonic() < deadline:
            with sqlite3.connect(db) as conn:
                got = conn.execute(
                    'SELECT committed FROM htmqc_positions WHERE "partition" = 0'
                ).fetchone()
            if got and got[0] == 10:
                break
            time.sleep(0.05)
    finally:
        release.set()
        engine.stop()
        runner.join(10)
    assert not runner.is_alive()
    with sqlite3.connect(db) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        positions = dict(conn.execute('SELECT "partition", committed FROM htmqc_positions'))
    assert ids == list(range(10)), "effects of the rolled-back transaction were stored"
    assert positions == {0: 10, 1: 0}
