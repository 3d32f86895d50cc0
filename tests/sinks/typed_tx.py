"""Checked by ``mypy --strict`` in :mod:`tests.sinks.test_tx_protocols`: the real
handles the sinks give handlers are, statically, :class:`htmqc.SqlTx` and
:class:`htmqc.KafkaTx`, and a handler typed with them type-checks."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg

from htmqc import AsyncSqlTx, KafkaTx, Message, SqlTx
from htmqc.sinks.kafka import Output


def sql_handles(lite: sqlite3.Cursor, pg: psycopg.Cursor[Any]) -> tuple[SqlTx, SqlTx]:
    """sqlite3's and psycopg's cursors are :class:`SqlTx` (what the SQL sinks hand out)."""
    return lite, pg


def async_sql_handle(pg: psycopg.AsyncCursor[Any]) -> AsyncSqlTx:
    """psycopg's ``AsyncCursor`` is an :class:`AsyncSqlTx` (what the PostgreSQL
    sink hands an ``async def`` handler)."""
    return pg


async def store_async(msg: Message, tx: AsyncSqlTx) -> int:
    """A typed ``async def`` exactly-once handler: awaited writes, then a read."""
    await tx.execute("INSERT INTO t (k, v) VALUES (%s, %s)", (msg.key(), msg.value()))
    await tx.executemany("INSERT INTO t (k, v) VALUES (%s, %s)", [(b"a", b"1"), (b"b", b"2")])
    row = await (await tx.execute("SELECT COUNT(*) FROM t")).fetchone()
    assert tx.rowcount >= -1 and await tx.fetchall() == [] and await tx.fetchmany(1) == []
    return int(row[0])


def kafka_handle(out: Output) -> KafkaTx:
    """The Kafka sink's ``Output`` is a :class:`KafkaTx`."""
    return out


def store(msg: Message, tx: SqlTx) -> int:
    """A typed exactly-once handler: a write, then a read in the same transaction."""
    tx.execute("INSERT INTO t (k, v) VALUES (?, ?)", (msg.key(), msg.value()))
    tx.executemany("INSERT INTO t (k, v) VALUES (?, ?)", [(b"a", b"1"), (b"b", b"2")])
    row = tx.execute("SELECT COUNT(*) FROM t").fetchone()
    assert tx.rowcount >= -1 and tx.fetchall() == [] and tx.fetchmany(1) == []
    return int(row[0])


def forward(msg: Message, tx: KafkaTx) -> None:
    """A typed Kafka→Kafka handler."""
    tx.send(None, msg.value(), key=msg.key(), headers={"from": tx.topic})
    tx.send("other", "text", headers=[("h", b"v")])
