"""``async def`` exactly-once handlers with the PostgreSQL sink, in-process
(no broker): ``tx`` is psycopg's ``AsyncCursor`` of the sink's
``AsyncConnection`` on the handler loop (:mod:`htmqc.sinks.loop_bridge`), its
statements in the transaction that stores the positions; a failing call is
rolled back to its savepoint, retried, and dead-lettered like a sync one.
The run across a SIGKILL is ``test_exactly_once_into_postgresql_across_sigkill``
(``async_table_record``) in ``test_modes_broker.py``.

PostgreSQL on 127.0.0.1:5432, database ``test``; each test its own table prefix.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from htmqc import AsyncSqlTx
from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import open_sink
from htmqc.sinks.postgresql import PostgresSink
from htmqc.testing import FakeConsumer, make_logs
from tests.services import postgres_url

TOPIC = "a"
PARTS, PER_PART = 2, 300


class Tables:
    """A table prefix, its effects table, and raw reads (committed data only)."""

    def __init__(self) -> None:
        self.base = postgres_url()
        self.prefix = f"t{uuid.uuid4().hex[:10]}_"
        self.sink_url = f"{self.base}?table_prefix={self.prefix}"
        self.effects = f"{self.prefix}effects"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.base, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []


@pytest.fixture
def tables() -> Iterator[Tables]:
    t = Tables()
    t.query(
        f"CREATE TABLE {t.effects} (seq BIGSERIAL PRIMARY KEY, part INTEGER NOT NULL, "
        "off BIGINT NOT NULL, k TEXT, txid BIGINT NOT NULL, backend INTEGER NOT NULL)"
    )
    try:
        yield t
    finally:
        t.query(
            f"DROP TABLE IF EXISTS {t.effects}, {t.prefix}positions, {t.prefix}dead_letters"
        )


def _run(tables: Tables, handler: Any, **extra: Any) -> tuple[Engine, PostgresSink]:
    """Run ``handler`` exactly-once over every message of the fake topic."""
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, PARTS, PER_PART, keys=5))
    sink = open_sink(tables.sink_url)
    assert isinstance(sink, PostgresSink)
    sink.open("g")
    opts = RunOptions(
        bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=tables.sink_url,
        max_messages=PARTS * PER_PART, txn_messages=100, kafka_config={}, **extra,
    )
    engine = Engine(handler, opts, consumer, sink=sink)
    consumer.on_commit = engine.on_commit
    guard = threading.Timer(60, engine.stopping.set)  # a handler that always fails
    guard.start()
    try:
        engine.run(install_signals=False)
    finally:
        guard.cancel()
        sink.close()
    return engine, sink


def _insert(tables: Tables) -> str:
    return (
        f"INSERT INTO {tables.effects} (part, off, k, txid, backend) "
        "VALUES (%s, %s, %s, txid_current(), pg_backend_pid())"
    )


def _positions(tables: Tables) -> dict[int, tuple[int, int]]:
    """``partition -> (committed, xmin)`` of the stored positions."""
    rows = tables.query(
        f'SELECT "partition", committed, xmin::text::bigint FROM {tables.prefix}positions'
    )
    return {int(p): (int(c), int(x)) for p, c, x in rows}


def test_an_async_handler_gets_an_async_cursor_inside_the_sinks_transaction(
    tables: Tables,
) -> None:
    kinds: set[type] = set()
    sink_backends: set[int] = set()
    sql = _insert(tables)

    async def handler(msg: Any, tx: AsyncSqlTx) -> None:
        kinds.add(type(tx))
        assert isinstance(tx, psycopg.AsyncCursor) and isinstance(tx, AsyncSqlTx)
        await asyncio.sleep(0)  # other coroutines may run: the loop is not blocked
        key = msg.key().decode() if msg.key() is not None else None
        await tx.execute(sql, (msg.partition(), msg.offset(), key))
        assert tx.rowcount == 1
        # a read in the same transaction sees the row just written
        await tx.execute(
            f"SELECT count(*) FROM {tables.effects} WHERE part = %s AND off = %s",
            (msg.partition(), msg.offset()),
        )
        row = await tx.fetchone()
        assert row == (1,)

    _engine, sink = _run(tables, handler)
    assert kinds == {psycopg.AsyncCursor}
    assert sink.loop is not None
    rows = tables.query(
        f"SELECT seq, part, off, k, txid, backend FROM {tables.effects} ORDER BY seq"
    )
    # every effect once
    assert sorted((p, o) for _, p, o, *_ in rows) == [
        (p, o) for p in range(PARTS) for o in range(PER_PART)
    ]
    # per-key order: within a key of a partition, offsets in the order written
    by_key: dict[tuple[int, str], list[int]] = defaultdict(list)
    for _seq, p, o, k, *_ in rows:
        by_key[(p, k)].append(o)
    assert all(offs == sorted(offs) for offs in by_key.values())
    # the positions are stored, in the same transactions as the effects: the
    # last transaction that wrote a partition's position wrote effect rows too,
    # and the effects came in a few transactions (not one per statement)
    positions = _positions(tables)
    assert {p: c for p, (c, _) in positions.items()} == {p: PER_PART for p in range(PARTS)}
    txids = {int(r[4]) for r in rows}
    # the sink commits up to 100 per transaction (fewer when its 100 ms timer fires on a
    # loaded box); a handler committing on its own would make one per effect
    assert len(txids) <= (PARTS * PER_PART) // 4, "effects committed outside the sink's txns"
    assert {x for _, x in positions.values()} <= txids
    sink_backends.update(int(r[5]) for r in rows)
    assert len(sink_backends) == 1  # one connection: the sink's


def test_a_failing_async_call_is_rolled_back_retried_and_dead_lettered(
    tables: Tables,
) -> None:
    """Each call writes its row first, then fails as told: ids failing once are
    retried and stored once; ids failing always are dead-lettered (a row of the
    dead-letter table) with none of their attempts' rows stored."""
    attempts: dict[tuple[int, int], int] = defaultdict(int)
    sql = _insert(tables)
    once = {(0, 7), (1, 100), (1, 299)}
    always = {(0, 3), (1, 42)}

    async def handler(msg: Any, tx: Any) -> None:
        at = (msg.partition(), msg.offset())
        attempts[at] += 1
        await tx.execute(sql, (*at, None))
        if at in always or (at in once and attempts[at] == 1):
            raise RuntimeError(f"handler fails on {at}")

    started = time.monotonic()
    _run(tables, handler, max_retries=2, backoff_ms=1.0, backoff_max_ms=5.0)
    assert time.monotonic() - started < 60
    # (a failure in a piece of messages run together re-runs the piece one
    # message at a time, so a call count is at least the attempts logged)
    assert all(attempts[at] >= 2 for at in once)
    assert all(attempts[at] >= 3 for at in always)  # the call and two retries
    stored = [(int(p), int(o)) for p, o in tables.query(f"SELECT part, off FROM {tables.effects}")]
    expected = sorted((p, o) for p in range(PARTS) for o in range(PER_PART)
                      if (p, o) not in always)
    assert sorted(stored) == expected  # failed attempts undone, the rest once
    letters = tables.query(
        f'SELECT "partition", "offset" FROM {tables.prefix}dead_letters'
    )
    assert sorted((int(p), int(o)) for p, o in letters) == sorted(always)
    assert {p: c for p, (c, _) in _positions(tables).items()} == {
        p: PER_PART for p in range(PARTS)
    }


def test_a_sync_handler_keeps_the_sync_cursor(tables: Tables) -> None:
    kinds: set[type] = set()
    sql = _insert(tables)

    def handler(msg: Any, tx: Any) -> None:
        kinds.add(type(tx))
        tx.execute(sql, (msg.partition(), msg.offset(), None))

    _engine, sink = _run(tables, handler)
    assert kinds == {psycopg.Cursor} and sink.loop is None
    assert len(tables.query(f"SELECT 1 FROM {tables.effects}")) == PARTS * PER_PART


def test_the_bridge_refuses_the_loops_thread_and_a_stopped_loop() -> None:
    """A synchronous sink call on the loop's own thread would wait for itself:
    refused; once the loop stopped (shutdown), a call fails as an unusable
    connection at once instead of waiting forever."""
    from htmqc.runtime.handlers import EventLoopThread
    from htmqc.sinks.loop_bridge import LoopCaller

    runner = EventLoopThread()
    caller = LoopCaller(runner.loop())
    assert caller.call(asyncio.sleep(0, result=7)) == 7

    async def on_the_loop() -> None:
        caller.call(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="deadlock"):
        runner.run(on_the_loop())
    runner.close()
    deadline = time.monotonic() + 5
    while caller.loop.is_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(psycopg.InterfaceError, match="not running"):
        caller.call(asyncio.sleep(0))
    assert time.monotonic() - started < 1
