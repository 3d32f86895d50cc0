"""Differential tests: the same exactly-once scenarios against SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from contextlib import nullcontext, suppress
from typing import Any

import pytest

from htmqc.core import TopicPartition
from htmqc.errors import RuntimeFailure
from htmqc.sinks import Fenced, Position, Sink, SinkStateError, SinkTransaction
from htmqc.sinks.sql import SqlSink

from .conftest import GROUP, Backend, commit_of, write_effect

TP: TopicPartition = ("orders", 0)
TP1: TopicPartition = ("orders", 1)


def never_called(tp: TopicPartition) -> int:
    raise AssertionError(f"default_start called for {tp}, which the sink has stored")


def run_batch(sink: SqlSink, tp: TopicPartition, offsets: range, fence: int) -> None:
    txn = sink.begin()
    for off in offsets:
        with txn.message():
            write_effect(txn, sink, tp, off)
    txn.commit([(commit_of(tp, offsets.stop), fence)])


def test_claim_bumps_fence_and_returns_stored_position(backend: Backend) -> None:
    a = backend.sink()
    assert isinstance(a, Sink) and isinstance(a.begin(), SinkTransaction)
    a.close()
    a = backend.sink()
    first = a.claim([TP, TP1], default_start=lambda tp: 40 + tp[1])
    assert first == {TP: Position(40, (), 1), TP1: Position(41, (), 1)}
    txn = a.begin()
    with txn.message():
        write_effect(txn, a, TP, 44)
    txn.commit([(commit_of(TP, 42, (44, 45, 46, 50)), 1)])
    b = backend.sink()
    again = b.claim([TP1, TP], default_start=never_called)
    assert again == {TP: Position(42, (44, 45, 46, 50), 2), TP1: Position(41, (), 2)}
    assert backend.positions()[TP] == (42, "2:3,3", 2)
    other_group = backend.sink(group="another")
    assert other_group.claim([TP], default_start=lambda tp: 0) == {TP: Position(0, (), 1)}
    for sink in (a, b, other_group):
        sink.close()


def test_effects_and_position_commit_together(backend: Backend) -> None:
    sink = backend.sink()
    fence = sink.claim([TP], default_start=lambda tp: 0)[TP].fence
    txn = sink.begin()
    for off in range(3):
        with txn.message():
            write_effect(txn, sink, TP, off)
    assert backend.effects() == set(), "effects are visible before the commit"
    assert backend.positions()[TP][0] == 0
    txn.commit([(commit_of(TP, 3), fence)])
    assert backend.effects() == {("orders", 0, off) for off in range(3)}
    assert backend.positions()[TP][0] == 3
    sink.close()


def test_failing_message_leaves_no_effect_and_others_commit(backend: Backend) -> None:
    sink = backend.sink()
    fence = sink.claim([TP], default_start=lambda tp: 0)[TP].fence
    txn = sink.begin()
    for off in range(3):
        expect = pytest.raises(ValueError) if off == 1 else nullcontext()
        with expect, txn.message():
            write_effect(txn, sink, TP, off)
            write_effect(txn, sink, TP1, off)
            if off == 1:
                raise ValueError("handler failed")
    txn.commit([(commit_of(TP, 3), fence)])
    assert backend.effects() == {(t, p, o) for t, p in (TP, TP1) for o in (0, 2)}
    sink.close()


def test_zombie_commit_is_fenced_and_stores_nothing(backend: Backend) -> None:
    a, b = backend.sink(), backend.sink()
    fence_a = a.claim([TP, TP1], default_start=lambda tp: 0)[TP].fence
    fence_b = b.claim([TP], default_start=never_called)[TP].fence
    assert fence_b == fence_a + 1
    txn = a.begin()
    for off in range(2):
        with txn.message():
            write_effect(txn, a, TP, off)
            write_effect(txn, a, TP1, off)
    with pytest.raises(Fenced) as info:
        txn.commit([(commit_of(TP1, 2), fence_a), (commit_of(TP, 2), fence_a)])
    assert info.value.tps == (TP,)
    assert "orders[0]" in info.value.line() and "orders[1]" not in info.value.problem
    assert backend.effects() == set(), "a fenced transaction stored effects"
    assert backend.positions()[TP1][0] == 0, "a fenced transaction stored a position"
    run_batch(b, TP, range(0, 2), fence_b)
    assert backend.effects() == {("orders", 0, 0), ("orders", 0, 1)}
    assert backend.positions()[TP] == (2, "", fence_b)
    run_batch(a, TP1, range(0, 2), fence_a)  # A still owns partition 1
    a.close()
    b.close()


class _SlowAfterFenceRead:
    """Wraps the committer's cursor: sleeps right after the fence is read, so a
    concurrent claim lands between the fence check and the position write."""

    def __init__(self, inner: Any, pause: float) -> None:
        self._inner, self._pause = inner, pause

    def execute(self, sql: str, params: Any = ()) -> Any:
        out = self._inner.execute(sql, params)
        if sql.startswith("SELECT fence"):
            time.sleep(self._pause)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_claim_racing_a_commit_after_its_fence_check(backend: Backend) -> None:
    """The window between the fence read and the commit is locked: a claim that
    arrives there waits, then returns the position that covers the effects."""
    a, b = backend.sink(), backend.sink()
    fence_a = a.claim([TP], default_start=lambda tp: 0)[TP].fence
    txn = a.begin()
    with txn.message():
        write_effect(txn, a, TP, 0)
    txn._own = _SlowAfterFenceRead(txn._own, 0.5)
    committer = threading.Thread(target=txn.commit, args=([(commit_of(TP, 1), fence_a)],))
    committer.start()
    time.sleep(0.2)
    claimed = b.claim([TP], default_start=never_called)[TP]
    committer.join()
    assert backend.effects() == {("orders", 0, 0)}
    assert claimed.committed == 1, "B's claim does not cover A's stored effect: it would redo it"
    a.close()
    b.close()


def test_racing_claims_and_commits_never_store_an_uncovered_effect(backend: Backend) -> None:
    """Two members race: B claims while A commits batches. Whatever the order,
    an effect is stored exactly when the position B's claim returned (or a
    later stored position) covers it, and B never redoes a stored effect."""
    for round_ in range(12):
        tp: TopicPartition = ("race", round_)
        a, b = backend.sink(), backend.sink()
        fence_a = a.claim([tp], default_start=lambda tp: 0)[tp].fence
        outcome: dict[str, Any] = {}

        def member_a(
            a: SqlSink = a,
            tp: TopicPartition = tp,
            fence: int = fence_a,
            outcome: dict[str, Any] = outcome,
        ) -> None:
            try:
                for start in range(0, 20, 2):
                    run_batch(a, tp, range(start, start + 2), fence)
                    outcome["a_committed"] = start + 2
            except Fenced:
                outcome["a_fenced"] = True

        def member_b(
            b: SqlSink = b,
            tp: TopicPartition = tp,
            delay: float = round_ * 0.004,
            outcome: dict[str, Any] = outcome,
        ) -> None:
            time.sleep(delay)
            outcome["b_position"] = b.claim([tp], default_start=never_called)[tp]

        threads = [threading.Thread(target=member_a), threading.Thread(target=member_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        b_pos: Position = outcome["b_position"]
        a_done = outcome.get("a_committed", 0)
        stored = {o for t, p, o in backend.effects() if (t, p) == tp}
        assert stored == set(range(a_done)), f"round {round_}: effects {stored} vs A's commits"
        assert b_pos.committed == a_done, f"round {round_}: B starts at {b_pos.committed}"
        # B redoes from its position: the primary key would reject a duplicate effect.
        run_batch(b, tp, range(b_pos.committed, 20), b_pos.fence)
        assert {o for t, p, o in backend.effects() if (t, p) == tp} == set(range(20))
        a.close()
        b.close()


@pytest.mark.slow  # a child process dies mid-transaction
def test_crashed_process_leaves_nothing(backend: Backend) -> None:
    sink = backend.sink()
    sink.claim([TP], default_start=lambda tp: 0)
    sink.close()
    script = textwrap.dedent(
        f"""
        import os
        from htmqc.sinks import open_sink
        s = open_sink({backend.url!r}); s.open({GROUP!r})
        fence = s.claim([("orders", 0)], default_start=lambda tp: 0)[("orders", 0)].fence
        t = s.begin()
        with t.message():
            t.handle.execute("INSERT INTO {backend.effects_table} VALUES ('orders', 0, 7)")
        print("written", flush=True)
        os._exit(3)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3 and "written" in proc.stdout, proc.stderr
    assert backend.effects() == set()
    assert backend.positions()[TP][:2] == (0, "")
    survivor = backend.sink()
    assert survivor.claim([TP], default_start=never_called)[TP] == Position(0, (), 3)
    survivor.close()


def test_close_with_open_transaction_rolls_back(backend: Backend) -> None:
    sink = backend.sink()
    sink.claim([TP], default_start=lambda tp: 0)
    txn = sink.begin()
    with txn.message():
        write_effect(txn, sink, TP, 0)
    sink.close()
    assert backend.effects() == set()


def test_empty_commit_aborts_the_effects(backend: Backend) -> None:
    sink = backend.sink()
    sink.claim([TP], default_start=lambda tp: 0)
    txn = sink.begin()
    with txn.message():
        write_effect(txn, sink, TP, 0)
    txn.commit([])
    assert backend.effects() == set()
    run_batch(sink, TP, range(0, 1), 1)  # the sink is usable again
    assert backend.effects() == {("orders", 0, 0)}
    sink.close()


def test_misuse_is_reported(backend: Backend) -> None:
    sink = backend.sink()
    sink.claim([TP], default_start=lambda tp: 0)
    txn = sink.begin()
    with pytest.raises(SinkStateError, match="begin"):
        sink.begin()
    with pytest.raises(SinkStateError, match="claim"):
        sink.claim([TP1], default_start=lambda tp: 0)
    txn.abort()
    txn.abort()
    with pytest.raises(SinkStateError, match="already committed or aborted"):
        txn.commit([(commit_of(TP, 1), 1)])
    sink.close()
    with pytest.raises(SinkStateError, match="not open"):
        sink.begin()


def test_open_is_idempotent_and_keeps_positions(backend: Backend) -> None:
    sink = backend.sink()
    fence = sink.claim([TP], default_start=lambda tp: 0)[TP].fence
    run_batch(sink, TP, range(0, 5), fence)
    sink.open(GROUP)
    sink.close()
    again = backend.sink()
    again.open(GROUP)
    assert again.claim([TP], default_start=never_called)[TP] == Position(5, (), 2)
    again.close()


def test_malformed_stored_position_is_a_one_line_failure(backend: Backend) -> None:
    sink = backend.sink()
    sink.claim([TP], default_start=lambda tp: 0)
    backend.query(f"UPDATE {backend.prefix}positions SET finished_above = 'x,y'")
    with pytest.raises(RuntimeFailure, match=r"finished_above 'x,y' .* orders\[0\] .* malformed"):
        sink.claim([TP], default_start=never_called)
    sink.close()


def test_swallowed_database_error_fails_the_message(backend: Backend) -> None:
    """A handler that catches a failed statement and returns normally: on
    PostgreSQL the transaction is then unusable, so the sink fails the message
    (undoing its writes) instead of losing the whole batch at commit."""
    sink = backend.sink()
    fence = sink.claim([TP], default_start=lambda tp: 0)[TP].fence
    txn = sink.begin()
    with txn.message():
        write_effect(txn, sink, TP, 0)
    db_error = sink.db_error

    def swallowing_handler() -> None:
        write_effect(txn, sink, TP, 1)
        with suppress(db_error):
            write_effect(txn, sink, TP, 0)  # duplicate key

    if backend.kind == "postgresql":
        with pytest.raises(RuntimeFailure, match="failed in the database"), txn.message():
            swallowing_handler()
        expected = {0, 2}
    else:  # SQLite rolls back only the failed statement; the handler chose to go on
        with txn.message():
            swallowing_handler()
        expected = {0, 1, 2}
    with txn.message():
        write_effect(txn, sink, TP, 2)
    txn.commit([(commit_of(TP, 3), fence)])
    assert {o for _, _, o in backend.effects()} == expected
    sink.close()
