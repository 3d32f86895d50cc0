"""Fixtures for the sink tests: the same scenarios run against SQLite (a file
in ``tmp_path``) and PostgreSQL (127.0.0.1:5432, database ``test``), each test
with its own table prefix, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from htmqc.core import Commit, TopicPartition
from htmqc.sinks import open_sink
from htmqc.sinks.sql import SqlSink, SqlTransaction
from tests.services import postgres_url

GROUP = "g1"


@dataclass
class Backend:
    """One SQL backend under test: makes sinks (members) and reads tables raw."""

    kind: str
    url: str
    prefix: str
    path: Path | None = None

    def sink(self, group: str = GROUP) -> SqlSink:
        """A new member: its own connection to the same storage, opened."""
        sink = open_sink(self.url)
        assert isinstance(sink, SqlSink)
        sink.open(group)
        return sink

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Run ``sql`` on a fresh autocommit connection (sees only committed data)."""
        if self.kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.url.partition("?")[0], autocommit=True) as pg:
            cur = pg.execute(sql)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    @property
    def effects_table(self) -> str:
        return f"{self.prefix}effects"

    def effects(self) -> set[tuple[str, int, int]]:
        rows = self.query(f"SELECT topic, part, off FROM {self.effects_table}")
        return {(str(t), int(p), int(o)) for t, p, o in rows}

    def positions(self) -> dict[TopicPartition, tuple[int, str, int]]:
        rows = self.query(
            f'SELECT topic, "partition", committed, finished_above, fence '
            f"FROM {self.prefix}positions WHERE consumer_group = '{GROUP}'"
        )
        return {(str(t), int(p)): (int(c), str(f), int(fe)) for t, p, c, f, fe in rows}


def write_effect(txn: SqlTransaction, sink: SqlSink, tp: TopicPartition, off: int) -> None:
    """The test handler's effect: one row naming the message."""
    p = sink.param
    txn.handle.execute(
        f"INSERT INTO {sink.positions_table.removesuffix('positions')}effects "
        f"VALUES ({p}, {p}, {p})",
        (tp[0], tp[1], off),
    )


def commit_of(tp: TopicPartition, offset: int, finished_above: tuple[int, ...] = ()) -> Commit:
    return Commit(tp=tp, epoch=1, offset=offset, finished_above=finished_above)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each SQL backend, with a unique table prefix and an effects table."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    if request.param == "sqlite":
        path = tmp_path / "sink.db"
        be = Backend("sqlite", f"sqlite:///{path}?table_prefix={prefix}", prefix, path)
    else:
        base = postgres_url()
        be = Backend("postgresql", f"{base}?table_prefix={prefix}", prefix)
    be.query(
        f"CREATE TABLE {be.effects_table} (topic TEXT NOT NULL, part INTEGER NOT NULL, "
        "off INTEGER NOT NULL, PRIMARY KEY (topic, part, off))"
    )
    yield be
    if be.kind == "postgresql":
        be.query(f"DROP TABLE IF EXISTS {be.effects_table}, {prefix}positions")
