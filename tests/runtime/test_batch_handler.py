"""Batch handlers (``--batch``). Exactly-once: one call per piece, inside the piece's sink
scope; a piece that fails runs again one message at a time. At-least-once: one call per
run of a lane (no broker needed)."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc import Permanent
from htmqc.errors import UsageError
from htmqc.runtime import Engine, RunOptions
from htmqc.runtime.launch import build_engine
from htmqc.runtime.workers import PIECE
from htmqc.sinks import open_sink
from htmqc.testing import FakeConsumer, FakeMessage, FakeProducer, make_logs

TOPIC = "b"
N = 1000


def _log(p: int) -> list[tuple[bytes | None, bytes]]:
    return [(f"k{i % 7}".encode(), f"{p}:{i}".encode()) for i in range(N)]


def _options(db: Path, **extra: Any) -> RunOptions:
    return RunOptions(bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once",
                      sink=f"sqlite:///{db}", batch=True, kafka_config={}, **extra)


def _engine(db: Path, handler: Any, **extra: Any) -> tuple[Engine, FakeConsumer]:
    """A lockstep exactly-once engine of a batch ``handler`` on partitions 0 and 1."""
    consumer = FakeConsumer.from_logs({(TOPIC, p): _log(p) for p in (0, 1)})
    sink = open_sink(f"sqlite:///{db}")
    sink.open("g")
    engine = Engine(handler, _options(db, **extra), consumer, sink=sink, clock=time.monotonic,
                    lockstep=True)
    engine.start()
    engine.on_assign(consumer, [KafkaTP(TOPIC, 0), KafkaTP(TOPIC, 1)])
    engine.settle()
    return engine, consumer


def _drain(engine: Engine, consumer: FakeConsumer) -> None:
    for p in (0, 1):
        msgs = [FakeMessage(TOPIC, p, i, k, v) for i, (k, v) in enumerate(_log(p))]
        for lo in range(0, N, 400):  # consume batches of 400
            engine.dispatch(msgs[lo:lo + 400])
            engine.settle()
    engine.commit(force=True)
    engine.settle()


def _rows(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM effects ORDER BY rowid")]


def _table(tx: Any) -> None:
    tx.execute("CREATE TABLE IF NOT EXISTS effects (v TEXT NOT NULL)")


def test_a_batch_handler_gets_whole_pieces_and_stores_each_message_once(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    sizes: list[int] = []

    def handle(msgs: list[Any], tx: Any) -> None:
        sizes.append(len(msgs))
        assert len({m.partition() for m in msgs}) == 1  # a piece is one partition's run
        _table(tx)
        tx.executemany("INSERT INTO effects (v) VALUES (?)", [(m.value().decode(),) for m in msgs])

    engine, consumer = _engine(db, handle)
    _drain(engine, consumer)
    rows = _rows(db)
    assert sorted(rows) == sorted(f"{p}:{i}" for p in (0, 1) for i in range(N))
    for p in (0, 1):  # in offset order within a partition
        assert [r for r in rows if r.startswith(f"{p}:")] == [f"{p}:{i}" for i in range(N)]
    assert max(sizes) == PIECE and len(sizes) < 2 * N / 100, sizes  # pieces, not messages
    with sqlite3.connect(db) as conn:
        assert sorted(conn.execute("SELECT committed FROM htmqc_positions")) == [(N,), (N,)]


def test_a_failing_piece_is_undone_and_run_message_by_message(tmp_path: Path) -> None:
    """One bad message: its piece's first call is rolled back whole (no effect twice),
    the piece runs again one message per call, the bad one is dead-lettered alone."""
    db = tmp_path / "f.db"
    calls: list[int] = []

    def handle(msgs: list[Any], tx: Any) -> None:
        calls.append(len(msgs))
        _table(tx)
        for m in msgs:
            tx.execute("INSERT INTO effects (v) VALUES (?)", (m.value().decode(),))
            if m.value() == b"0:333":
                raise Permanent("bad payment")

    engine, consumer = _engine(db, handle)
    _drain(engine, consumer)
    rows = _rows(db)
    expected = sorted(f"{p}:{i}" for p in (0, 1) for i in range(N) if (p, i) != (0, 333))
    assert sorted(rows) == expected, "an effect of the failed piece was kept, or one was lost"
    # the failed piece (offsets 250-399: the rest of the batch 0-399 after a full piece)
    # ran again one message per call; every other piece in one call
    # (consume batches of 400 make pieces of 250 and 150, and 200 at the end)
    assert calls.count(1) == 150
    assert sorted(c for c in calls if c > 1) == [150] * 4 + [200] * 2 + [PIECE] * 4
    with sqlite3.connect(db) as conn:
        dead = conn.execute("SELECT \"offset\", kind FROM htmqc_dead_letters").fetchall()
        assert dead == [(333, "permanent")]
        assert sorted(conn.execute("SELECT committed FROM htmqc_positions")) == [(N,), (N,)]


def _drain_together(engine: Engine, consumer: FakeConsumer) -> None:
    """Each consume batch holds 400 messages of both partitions."""
    logs = [[FakeMessage(TOPIC, p, i, k, v) for i, (k, v) in enumerate(_log(p))] for p in (0, 1)]
    for lo in range(0, N, 400):
        engine.dispatch(logs[0][lo:lo + 400] + logs[1][lo:lo + 400])
        engine.settle()
    engine.commit(force=True)
    engine.settle()


def test_one_call_takes_the_runs_of_several_partitions(tmp_path: Path) -> None:
    """A fetch with both partitions' messages: one call takes a piece of each, in offset
    order per partition, every message stored once; a failure in such a call undoes it
    whole and runs its pieces again one message per call (the bad one dead-lettered)."""
    db = tmp_path / "t.db"
    calls: list[list[tuple[int, int]]] = []

    def handle(msgs: list[Any], tx: Any) -> None:
        calls.append([(m.partition(), m.offset()) for m in msgs])
        _table(tx)
        for m in msgs:
            tx.execute("INSERT INTO effects (v) VALUES (?)", (m.value().decode(),))
            if m.value() == b"1:555":
                raise Permanent("bad payment")

    engine, consumer = _engine(db, handle)
    _drain_together(engine, consumer)
    rows = _rows(db)
    expected = sorted(f"{p}:{i}" for p in (0, 1) for i in range(N) if (p, i) != (1, 555))
    assert sorted(rows) == expected, "an effect of the failed call was kept, or one was lost"
    for p, key in itertools.product((0, 1), range(7)):  # per-key order (a held key's
        # followers wait for its dead letter, other keys go on)
        ids = [int(r.split(":")[1]) for r in rows if r.startswith(f"{p}:")]
        assert [i for i in ids if i % 7 == key] == sorted(i for i in ids if i % 7 == key)
    together = [c for c in calls if len({p for p, _ in c}) == 2]
    assert together and max(map(len, together)) == 2 * PIECE, calls
    # the call with 1:555 (0:600-799 and 1:400-649 of the batch 400-799, within the
    # transaction's room) was undone and its two pieces ran again one message per call;
    # the rest of partition 1's run (650-799) too, its key 555 % 7 being held meanwhile
    failed = next(c for c in calls if (1, 555) in c and len(c) > 1)
    assert sum(1 for c in calls if len(c) == 1) == len(failed) + 150
    with sqlite3.connect(db) as conn:
        dead = conn.execute("SELECT partition, \"offset\" FROM htmqc_dead_letters").fetchall()
        assert dead == [(1, 555)]
        assert sorted(conn.execute("SELECT committed FROM htmqc_positions")) == [(N,), (N,)]


@pytest.mark.parametrize("workers", [1, 3])
def test_at_least_once_batches_keep_key_order_and_isolate_a_failure(workers: int) -> None:
    """Each lane gets runs of one partition; a run whose call raised runs again one
    message per call: the bad message is dead-lettered alone, the others run (those
    before it in the failed call twice: at-least-once), per-key order holds, and
    the watermark covers everything."""
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, 600, keys=9))
    producer = FakeProducer()
    calls: list[int] = []
    ran: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    lock = threading.Lock()

    def handle(msgs: list[Any]) -> None:
        with lock:
            calls.append(len(msgs))
            for m in msgs:
                ran[(m.partition(), m.key())].append(m.offset())
        if any((m.partition(), m.offset()) == (1, 77) for m in msgs):
            raise Permanent("bad")

    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", batch=True, workers=workers,
                      max_messages=1200, batch_size=100)
    engine = Engine(handle, opts, consumer, producer_factory=lambda: producer, seed=1)
    consumer.on_commit = engine.on_commit
    engine.run(install_signals=False)
    assert max(calls) > 1 and calls.count(1) > 0, calls
    assert [(r[0], dict(r[3])["htmqc-dlq-reason"]) for r in producer.records] == [
        (f"{TOPIC}.dlq", b"Permanent: bad")]
    for offsets in ran.values():  # every key in order, a repeat only as a re-run
        firsts = list(dict.fromkeys(offsets))
        assert firsts == sorted(firsts)
    assert sum(len(set(v)) for v in ran.values()) == 1200
    assert consumer.commits[(TOPIC, 0)][0] == 600 and consumer.commits[(TOPIC, 1)][0] == 600


def test_a_single_failing_message_is_called_once_per_attempt() -> None:
    """A run of one message goes straight to the one-message call: a failure is not
    run twice (once as a batch of one, once alone)."""
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 1, keys=1))
    calls: list[list[int]] = []

    def handle(msgs: list[Any]) -> None:
        calls.append([m.offset() for m in msgs])
        raise Permanent("bad")

    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", batch=True, max_messages=1)
    engine = Engine(handle, opts, consumer, producer_factory=FakeProducer, seed=1)
    consumer.on_commit = engine.on_commit
    engine.run(install_signals=False)
    assert calls == [[0]]


@pytest.mark.parametrize(("mode", "handler"), [
    ("at-least-once", lambda msgs, tx: None), ("exactly-once", lambda msgs: None)])
def test_a_batch_handler_has_the_modes_signature(mode: str, handler: Any) -> None:
    options = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", batch=True, mode=mode,
                         sink="sqlite:///x.db")
    with pytest.raises(UsageError, match="handler"):
        build_engine(handler, options)
