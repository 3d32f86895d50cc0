"""``HTMQC_UNSAFE_DISABLE_FENCE=1`` (read at ``open``): a stale fence no longer
stops a commit, and the sink says so loudly. Without it, the commit is fenced."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from htmqc.core.decisions import Commit
from htmqc.sinks.base import Fenced
from htmqc.sinks.sql import UNSAFE_DISABLE_FENCE_ENV
from htmqc.sinks.sqlite import SqliteSink

TP = ("t", 0)


def late_commit(path: Path) -> int:
    """A claims, B claims (fence moves on), A commits with its old fence.
    Returns the committed offset stored afterwards."""
    a, b = SqliteSink(path), SqliteSink(path)
    a.open("g")
    b.open("g")
    try:
        fence_a = a.claim([TP], default_start=lambda tp: 0)[TP].fence
        b.claim([TP], default_start=lambda tp: 0)
        txn = a.begin()
        txn.commit([(Commit(tp=TP, epoch=1, offset=7, finished_above=()), fence_a)])
        return b.claim([TP], default_start=lambda tp: 0)[TP].committed
    finally:
        a.close()
        b.close()


def test_the_fence_holds_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UNSAFE_DISABLE_FENCE_ENV, raising=False)
    with pytest.raises(Fenced):
        late_commit(tmp_path / "s.db")


def test_the_unsafe_switch_lets_a_stale_commit_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(UNSAFE_DISABLE_FENCE_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="htmqc.sinks"):
        assert late_commit(tmp_path / "s.db") == 7
    assert any("UNSAFE" in r.getMessage() for r in caplog.records)
