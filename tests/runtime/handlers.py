"""Handlers the runtime tests run through ``htmqc run`` in subprocesses."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from htmqc.produce import parse_id

_lock = threading.Lock()


def log_order(msg: Any) -> None:
    """At-least-once: append ``partition key id`` to the file ``$HTMQC_TEST_OUT``."""
    time.sleep(0.0005)
    line = (
        f"{msg.partition()} {msg.key().decode()} {parse_id(msg.value())} {threading.get_ident()}\n"
    )
    with _lock, open(os.environ["HTMQC_TEST_OUT"], "a") as out:
        out.write(line)


def slow_log_order(msg: Any) -> None:
    """:func:`log_order` after 5 ms: a run of thousands lasts long enough for a second
    member to join it."""
    time.sleep(0.005)
    log_order(msg)


def slow_table_record(msg: Any, tx: Any) -> None:
    """:func:`table_record` after 5 ms (see :func:`slow_log_order`)."""
    time.sleep(0.005)
    table_record(msg, tx)


def slow_record(msg: Any, tx: Any) -> None:
    """Exactly-once: the demo's effect row, after a short sleep (so kills land mid-batch)."""
    from examples.effects import record

    time.sleep(0.001)
    record(msg, tx)


NOT_CALLABLE = 42


def poison_five(msg: Any) -> None:
    """At-least-once: message id 5 always fails (it ends in the DLQ)."""
    if parse_id(msg.value()) == 5:
        raise ValueError("id 5 is poison")


def _effect_sql(tx: Any) -> str:
    """The insert into ``$HTMQC_TEST_TABLE`` in the placeholder style of ``tx``'s driver."""
    p = "?" if type(tx).__module__.startswith("sqlite3") else "%s"
    return (
        f'INSERT INTO {os.environ["HTMQC_TEST_TABLE"]} (id, "partition", "offset", pid) '
        f"VALUES ({p}, {p}, {p}, {p})"
    )


def table_record(msg: Any, tx: Any) -> None:
    """Exactly-once: one row ``(id, partition, offset, pid)`` per message in the
    table named by ``$HTMQC_TEST_TABLE`` (the test creates it; ``id`` is not
    unique, so a duplicate effect shows up), after a short sleep (so kills land
    mid-batch). ``pid`` tells which process stored the row."""
    time.sleep(0.0005)
    tx.execute(_effect_sql(tx), (parse_id(msg.value()), msg.partition(), msg.offset(), os.getpid()))


async def async_table_record(msg: Any, tx: Any) -> None:
    """:func:`table_record` as an ``async def`` handler: ``tx`` must be psycopg's
    ``AsyncCursor`` (else the message fails and ends as a dead letter, which the
    test sees as a lost effect), and the insert is awaited."""
    import asyncio

    import psycopg

    if not isinstance(tx, psycopg.AsyncCursor):
        raise TypeError(f"tx is a {type(tx).__module__}.{type(tx).__qualname__}")
    await asyncio.sleep(0.0005)
    await tx.execute(
        _effect_sql(tx), (parse_id(msg.value()), msg.partition(), msg.offset(), os.getpid())
    )


_STALL_LIMIT = 60.0
_stalled = False


def _stall(flag: str, ident: int) -> None:
    """Write ``"IDENT PID"`` to ``FLAG.stalled`` (atomically), then sleep while
    ``flag`` exists, at most :data:`_STALL_LIMIT` seconds."""
    marker = f"{flag}.stalled"
    with open(f"{marker}.tmp", "w") as out:
        out.write(f"{ident} {os.getpid()}\n")
    os.replace(f"{marker}.tmp", marker)  # the test never reads half a line
    deadline = time.monotonic() + _STALL_LIMIT
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)


def stalling_record(msg: Any, tx: Any) -> None:
    """:func:`table_record`, then, once per process, stall inside the open
    transaction: on the first message with an id of at least
    ``$HTMQC_TEST_STALL_AT`` while the flag file ``$HTMQC_TEST_STALL`` exists,
    write ``"ID PID"`` to ``$HTMQC_TEST_STALL.stalled`` and sleep until the flag
    file is removed (at most 60 s). The row of that message is then in a
    transaction that is surely open: a test can stop the process there."""
    global _stalled
    table_record(msg, tx)
    flag = os.environ.get("HTMQC_TEST_STALL")
    if _stalled or not flag or parse_id(msg.value()) < int(os.environ["HTMQC_TEST_STALL_AT"]):
        return
    if not os.path.exists(flag):
        return
    _stalled = True
    _stall(flag, parse_id(msg.value()))


def slow_forward(msg: Any, tx: Any) -> None:
    """Exactly-once Kafka->Kafka: copy the message (value, key) to the sink's
    output topic, after a short sleep (so kills land mid-transaction)."""
    time.sleep(0.0005)
    tx.send(None, msg.value(), key=msg.key())


_txn_seen: Any = None
_txn_position = 0


def stalling_forward(msg: Any, tx: Any) -> None:
    """:func:`slow_forward`, then, once per process, stall inside the open Kafka
    transaction: on the message at 0-based position ``$HTMQC_TEST_STALL_NTH`` of
    its transaction whose id is at least ``$HTMQC_TEST_STALL_AT``, while the
    flag file ``$HTMQC_TEST_STALL`` exists (marker and wait as in
    :func:`stalling_record`). Position 0: nothing of that transaction has
    reached the broker yet (output is produced when a piece of messages ends);
    position 250 or more: an earlier piece of it has (pieces are at most 250)."""
    global _stalled, _txn_seen, _txn_position
    if tx is not _txn_seen:  # each transaction has its own handle
        _txn_seen, _txn_position = tx, 0
    position = _txn_position
    _txn_position += 1
    slow_forward(msg, tx)
    flag = os.environ.get("HTMQC_TEST_STALL")
    if _stalled or not flag or position != int(os.environ["HTMQC_TEST_STALL_NTH"]):
        return
    if parse_id(msg.value()) < int(os.environ["HTMQC_TEST_STALL_AT"]) or not os.path.exists(flag):
        return
    _stalled = True
    _stall(flag, parse_id(msg.value()))


def _journal(event: str, msg: Any) -> None:
    """Append ``EVENT PARTITION OFFSET ID UNIX_SECONDS`` to ``$HTMQC_TEST_OUT``."""
    line = f"{event} {msg.partition()} {msg.offset()} {parse_id(msg.value())} {time.time():.6f}\n"
    with _lock, open(os.environ["HTMQC_TEST_OUT"], "a") as out:
        out.write(line)


def sleepy(msg: Any) -> None:
    """At-least-once: journal ``start``, sleep ``$HTMQC_TEST_SLEEP`` seconds, journal
    ``done`` (see :func:`_journal`): a test can tell which calls started after a
    signal and which finished."""
    _journal("start", msg)
    time.sleep(float(os.environ["HTMQC_TEST_SLEEP"]))
    _journal("done", msg)


def sleepy_record(msg: Any, tx: Any) -> None:
    """Exactly-once: :func:`sleepy`, with the effect row of :func:`table_record`
    written before the sleep."""
    _journal("start", msg)
    table_record(msg, tx)
    time.sleep(float(os.environ["HTMQC_TEST_SLEEP"]))
    _journal("done", msg)


async def async_log_order(msg: Any) -> None:
    """At-least-once, ``async def``: :func:`log_order` after an ``await``."""
    import asyncio

    await asyncio.sleep(0)
    log_order(msg)


def two_args(msg: Any, tx: Any) -> None:
    """A handler for exactly-once, run by mistake in at-least-once mode."""


async def async_record(msg: Any, tx: Any) -> None:
    """Exactly-once, ``async def``: the demo's effect row after an ``await``."""
    import asyncio

    from examples.effects import record

    await asyncio.sleep(0)
    record(msg, tx)


_sent_once: set[int] = set()


async def async_forward_flaky(msg: Any, tx: Any) -> None:
    """Exactly-once Kafka->Kafka, ``async def``: copy the message to the output
    topic; on its first attempt in this process a message whose id is divisible
    by 7 then fails (after sending), so its first send must not reach the output."""
    import asyncio

    from htmqc import Retryable

    await asyncio.sleep(0)
    tx.send(None, msg.value(), key=msg.key())
    ident = parse_id(msg.value())
    if ident % 7 == 0 and ident not in _sent_once:
        _sent_once.add(ident)
        raise Retryable(f"first attempt of {ident}")
