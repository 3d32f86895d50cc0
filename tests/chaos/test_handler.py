"""The chaos handler against a SQLite cursor: effects, switches, the fence probe."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from htmqc.chaos import handler
from htmqc.chaos.handler import InjectedError, PoisonMessage, Switches, chosen, record
from htmqc.produce import message_value
from htmqc.sinks.sqlite import SqliteSink
from tests.runtime.fakes import FakeMessage


def msg_of(ident: int, part: int = 0) -> FakeMessage:
    """Message ``ident`` of partition ``part`` at offset ``ident``, key ``k{ident % 7}``."""
    return FakeMessage("t", part, ident, f"k{ident % 7}".encode(), message_value(ident, 100))


@pytest.fixture
def cursor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[sqlite3.Cursor]:
    conn = sqlite3.connect(tmp_path / "e.db", isolation_level=None)
    conn.execute(
        'CREATE TABLE fx (id INTEGER, msg_key TEXT, "partition" INTEGER, "offset" INTEGER, '
        "generation INTEGER, pid INTEGER)"
    )
    monkeypatch.setenv(handler.TABLE_ENV, "fx")
    monkeypatch.setattr(handler, "_insert", {})
    monkeypatch.setattr(handler, "_attempts", {})
    monkeypatch.setattr(handler, "held", {})
    yield conn.cursor()
    conn.close()


def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **values: object) -> Switches:
    path = tmp_path / "control.json"
    path.write_text(json.dumps(values))
    sw = Switches(str(path))
    monkeypatch.setattr(handler, "switches", sw)
    return sw


def rows(cur: sqlite3.Cursor) -> list[tuple[object, ...]]:
    return cur.execute("SELECT id, msg_key, generation, pid FROM fx ORDER BY rowid").fetchall()


def test_one_row_per_message_with_the_claimed_fence(
    cursor: sqlite3.Cursor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control(tmp_path, monkeypatch)
    sink = SqliteSink(str(tmp_path / "s.db"))
    sink.open("g")
    try:
        sink.claim([("t", 0)], default_start=lambda tp: 0)
        sink.claim([("t", 0)], default_start=lambda tp: 0)
    finally:
        sink.close()
    assert handler.held[("t", 0)] == 2  # the probe saw the second claim's fence
    record(msg_of(5), cursor)
    record(msg_of(6, part=9), cursor)
    assert rows(cursor) == [(5, "k5", 2, os.getpid()), (6, "k6", None, os.getpid())]


def test_poison_always_fails(
    cursor: sqlite3.Cursor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control(tmp_path, monkeypatch, poison=[3])
    for _ in range(3):
        with pytest.raises(PoisonMessage):
            record(msg_of(3), cursor)
    record(msg_of(4), cursor)
    assert [r[0] for r in rows(cursor)] == [4]


def test_handler_and_sink_errors_fail_only_the_first_attempt(
    cursor: sqlite3.Cursor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control(tmp_path, monkeypatch, handler_error_rate=1.0, salt=1)
    with pytest.raises(InjectedError):
        record(msg_of(1), cursor)
    record(msg_of(1), cursor)
    control(tmp_path, monkeypatch, sink_error_rate=1.0, salt=1)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        record(msg_of(2), cursor)
    record(msg_of(2), cursor)
    assert [r[0] for r in rows(cursor)] == [1, 2]


def test_slow_switch_sleeps(
    cursor: sqlite3.Cursor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control(tmp_path, monkeypatch, slow_ms=60)
    started = time.monotonic()
    record(msg_of(1), cursor)
    assert time.monotonic() - started >= 0.06


def test_stop_in_txn_stops_the_named_client_once_after_its_effect(
    cursor: sqlite3.Cursor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals: list[tuple[int, int, int]] = []  # (pid, signal, effects stored by then)
    monkeypatch.setattr(
        handler.os, "kill", lambda pid, sig: signals.append((pid, sig, len(rows(cursor))))
    )
    monkeypatch.setattr(handler, "_stopped_for", set())
    monkeypatch.setenv(handler.CLIENT_ENV, "chaos-c1")
    control(tmp_path, monkeypatch, stop_in_txn="chaos-c0#4")
    record(msg_of(1), cursor)  # another client's stop
    assert signals == []
    control(tmp_path, monkeypatch, stop_in_txn="chaos-c1#4")
    record(msg_of(2), cursor)
    record(msg_of(3), cursor)  # woken: the same token does not stop it again
    assert signals == [(os.getpid(), handler.signal.SIGSTOP, 2)]
    control(tmp_path, monkeypatch, stop_in_txn="chaos-c1#7")
    record(msg_of(4), cursor)
    assert len(signals) == 2


def test_switches_reload_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sw = control(tmp_path, monkeypatch, slow_ms=5)
    assert sw.refresh().slow_ms == 5
    (tmp_path / "control.json").write_text(json.dumps({"slow_ms": 0, "poison": [1, 2]}))
    deadline = time.monotonic() + 5
    while sw.refresh().slow_ms and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sw.slow_ms == 0 and sw.poison == {1, 2}
    (tmp_path / "control.json").write_text("{not json")
    time.sleep(handler.RELOAD_SECONDS * 2)
    assert sw.refresh().poison == {1, 2}  # a torn file keeps the last switches


def test_share_selection_is_stable_and_near_the_rate() -> None:
    picked = [i for i in range(10_000) if chosen(7, "sink", i, 0.1)]
    assert picked == [i for i in range(10_000) if chosen(7, "sink", i, 0.1)]
    assert 800 < len(picked) < 1200
    assert not any(chosen(7, "sink", i, 0.0) for i in range(1000))
