"""``htmqc.SqlTx`` and ``htmqc.KafkaTx``: the handles the sinks really give
handlers satisfy them, at run time (``isinstance``, runtime-checkable) and
statically (``mypy --strict`` on :mod:`tests.sinks.typed_tx` and the examples)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import htmqc
from htmqc import KafkaTx, SqlTx
from htmqc.sinks.kafka import Output
from htmqc.testing import FakeMessage
from tests.sinks.conftest import Backend, commit_of

ROOT = Path(__file__).resolve().parents[2]
TP = ("orders", 0)


def test_the_protocols_are_exported_from_htmqc() -> None:
    assert {"SqlTx", "AsyncSqlTx", "KafkaTx"} <= set(htmqc.__all__)
    assert htmqc.SqlTx is SqlTx and htmqc.KafkaTx is KafkaTx


def test_the_sql_sinks_handle_is_a_sql_tx(backend: Backend) -> None:
    """The cursor a real SQLite / PostgreSQL sink transaction hands the handler is an
    ``SqlTx``, and a handler using every member of it stores its rows once committed."""
    sink = backend.sink()
    fence = sink.claim([TP], default_start=lambda tp: 0)[TP].fence
    txn = sink.begin()
    tx = txn.handle
    assert isinstance(tx, SqlTx)
    p, table = sink.param, backend.effects_table

    def handler(msg: Any, tx: SqlTx) -> None:
        tx.execute(f"INSERT INTO {table} VALUES ({p}, {p}, {p})",
                   (msg.topic(), msg.partition(), msg.offset()))
        tx.executemany(f"INSERT INTO {table} VALUES ({p}, {p}, {p})",
                       [("other", 0, msg.offset()), ("other", 1, msg.offset())])
        assert tx.rowcount in (-1, 1, 2)  # sqlite3: the last row's; psycopg: all
        count = tx.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        assert count is not None and count[0] == 3 * (msg.offset() + 1)
        tx.execute(f"SELECT off FROM {table} WHERE topic = {p} ORDER BY off", ("orders",))
        assert [r[0] for r in tx.fetchmany(1)] == [0]
        assert [r[0] for r in tx.fetchall()] == list(range(1, msg.offset() + 1))

    for offset in range(3):
        with txn.message():
            handler(FakeMessage(TP[0], TP[1], offset, None, b"x"), tx)
    txn.commit([(commit_of(TP, 3), fence)])
    assert {o for t, _p, o in backend.effects() if t == "orders"} == {0, 1, 2}
    assert backend.positions()[TP][0] == 3
    sink.close()


def test_the_kafka_sinks_output_is_a_kafka_tx() -> None:
    """``Output`` (what ``KafkaTransaction.handle`` is) satisfies ``KafkaTx``;
    neither protocol is satisfied by the other's handle."""
    sent: list[Any] = []

    class Txn:
        def send(self, record: Any) -> None:
            sent.append(record)

    out = Output(Txn(), "out")  # type: ignore[arg-type]
    assert isinstance(out, KafkaTx) and not isinstance(out, SqlTx)
    out.send(None, b"v", key=b"k", headers={"h": b"1"})
    assert sent == [("out", b"v", b"k", {"h": b"1"})]
    import sqlite3

    assert not isinstance(sqlite3.connect(":memory:").cursor(), KafkaTx)


@pytest.mark.slow  # runs mypy in a subprocess
def test_the_handles_and_the_examples_type_check_with_mypy_strict() -> None:
    """Statically too: ``sqlite3.Cursor``, ``psycopg.Cursor`` and ``Output`` are
    assignable to the protocols, and the examples' handlers annotated with them
    pass ``mypy --strict``."""
    src = Path(htmqc.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "tests/sinks/typed_tx.py", "examples/"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
