"""Hypothesis stateful differential test: SQLite, PostgreSQL and a plain model
driven by the same random sequence of claims, messages (some failing), commits
and crashes of two members sharing one partition.

One thread drives everything, so at most one member has a transaction open at
a time and nobody claims while one is open (on SQLite a second writer would
wait for the lock); the threaded tests in test_sql_sinks.py cover the races.

A formal test: it is the code-level check of the fence that gives exactly-once
(a claim bumps the token; a commit under any other token stores nothing), so
``make verify`` rejects the catalogue's sink bugs (``fence-not-bumped``,
``zombie-commit-accepted``) through it.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from htmqc.core import Commit, TopicPartition
from htmqc.sinks import Fenced, open_sink
from htmqc.sinks.sql import SqlSink, SqlTransaction
from tests.services import postgres_url

pytestmark = pytest.mark.formal

TP: TopicPartition = ("topic", 0)
MEMBERS = ("A", "B")


@dataclass
class MemberModel:
    fence: int | None = None  # from the last claim; None after a crash
    next: int = 0  # next offset this member would run
    pending: list[int] = field(default_factory=list)  # succeeded in the open txn
    open: bool = False


class SinkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"s{uuid.uuid4().hex[:10]}_"
        self.tmp = tempfile.TemporaryDirectory()
        self.urls = {"sqlite": f"sqlite:///{Path(self.tmp.name) / 'db.sqlite'}"}
        pg = postgres_url()
        import psycopg

        self.urls["postgresql"] = pg
        self.pg: Any = psycopg.connect(pg, autocommit=True)
        for kind in self.urls:
            self._raw(kind, f"CREATE TABLE {self.prefix}effects (off INTEGER NOT NULL)")
        self.sinks: dict[tuple[str, str], SqlSink] = {}
        self.txns: dict[tuple[str, str], SqlTransaction] = {}
        for m in MEMBERS:
            self._connect(m)
        # the model: what a correct sink stores
        self.fence = 0
        self.committed = 0
        self.effects: set[int] = set()
        self.members = {m: MemberModel() for m in MEMBERS}

    def _url(self, kind: str) -> str:
        return f"{self.urls[kind]}?table_prefix={self.prefix}"

    def _connect(self, m: str) -> None:
        for kind in self.urls:
            sink = open_sink(self._url(kind))
            assert isinstance(sink, SqlSink)
            sink.open("g")
            self.sinks[kind, m] = sink

    def _raw(self, kind: str, sql: str) -> list[tuple[Any, ...]]:
        if kind == "sqlite":
            conn = sqlite3.connect(Path(self.tmp.name) / "db.sqlite", isolation_level=None)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        cur = self.pg.execute(sql)
        return list(cur.fetchall()) if cur.description else []

    def _any_open(self) -> bool:
        return any(mm.open for mm in self.members.values())

    def _open_member(self) -> str:
        return next(m for m, mm in self.members.items() if mm.open)

    # -- rules ---------------------------------------------------------------------------

    @precondition(lambda self: not self._any_open())
    @rule(m=st.sampled_from(MEMBERS))
    def claim(self, m: str) -> None:
        self.fence += 1
        mm = self.members[m]
        mm.fence, mm.next = self.fence, self.committed
        for kind in self.urls:
            pos = self.sinks[kind, m].claim([TP], default_start=lambda tp: 0)[TP]
            expected = (self.committed, (), self.fence)
            assert (pos.committed, pos.finished_above, pos.fence) == expected

    @precondition(lambda self: not self._any_open())
    @rule(m=st.sampled_from(MEMBERS))
    def begin(self, m: str) -> None:
        if self.members[m].fence is None:
            self.claim(m)
        self.members[m].open = True
        for kind in self.urls:
            self.txns[kind, m] = self.sinks[kind, m].begin()

    @precondition(_any_open)
    @rule(fail=st.booleans())
    def message(self, fail: bool) -> None:
        m = self._open_member()
        mm = self.members[m]
        for kind in self.urls:
            txn, sink = self.txns[kind, m], self.sinks[kind, m]
            try:
                with txn.message():
                    txn.handle.execute(
                        f"INSERT INTO {self.prefix}effects VALUES ({sink.param})", (mm.next,)
                    )
                    if fail:
                        raise ValueError("handler failed")
            except ValueError:
                assert fail
        if not fail:
            mm.pending.append(mm.next)
            mm.next += 1

    @precondition(_any_open)
    @rule()
    def commit(self) -> None:
        m = self._open_member()
        mm = self.members[m]
        assert mm.fence is not None
        current = mm.fence == self.fence
        for kind in self.urls:
            txn = self.txns.pop((kind, m))
            commit = Commit(tp=TP, epoch=1, offset=mm.next)
            if current:
                txn.commit([(commit, mm.fence)])
            else:
                with pytest.raises(Fenced):
                    txn.commit([(commit, mm.fence)])
        if current:
            self.effects.update(mm.pending)
            self.committed = mm.next
        mm.pending, mm.open = [], False

    @rule(m=st.sampled_from(MEMBERS))
    def crash(self, m: str) -> None:
        for kind in self.urls:
            self.sinks[kind, m].close()
            self.txns.pop((kind, m), None)
        self._connect(m)
        self.members[m] = MemberModel()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def effects_match_positions(self) -> None:
        """EffectsExactlyCovered: each backend stores exactly the model's effects,
        and its stored position is the model's (effects and positions move together)."""
        if self._any_open():
            return  # SQLite readers would wait for the writer's lock
        for kind in self.urls:
            stored = [int(r[0]) for r in self._raw(kind, f"SELECT off FROM {self.prefix}effects")]
            effects = set(stored)
            assert len(stored) == len(effects), f"{kind}: an effect is stored twice"
            assert effects == self.effects, kind
            assert effects == set(range(self.committed)), kind
            rows = self._raw(kind, f"SELECT committed, fence FROM {self.prefix}positions")
            assert [tuple(map(int, r)) for r in rows] in ([], [(self.committed, self.fence)]), kind

    def teardown(self) -> None:
        for sink in self.sinks.values():
            sink.close()
        if self.pg is not None:
            self._raw(
                "postgresql",
                f"DROP TABLE IF EXISTS {self.prefix}effects, {self.prefix}positions",
            )
            self.pg.close()
        self.tmp.cleanup()


TestSinkMachine = SinkMachine.TestCase
TestSinkMachine.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
