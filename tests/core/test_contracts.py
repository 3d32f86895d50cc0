"""The contracts catch a broken transition, and the switch turns them off."""

from __future__ import annotations

import subprocess
import sys

import icontract
import pytest

from htmqc.core import CONTRACTS_ENABLED, Event, PartitionTracker

BROKEN = """
from htmqc.core import CONTRACTS_ENABLED, Event, PartitionTracker
def broken_advance(self):  # the watermark jumps to `next`, over unfinished work
    self._processed = self._next
PartitionTracker._advance = broken_advance
t = PartitionTracker(0)
t.fetched([0, 1, 2])
t.apply_many(Event.START, [0, 1, 2])
t.apply(Event.SUCCEED, 0)
print(CONTRACTS_ENABLED, t.processed)
"""


@pytest.mark.skipif(not CONTRACTS_ENABLED, reason="contracts are switched off (HTMQC_CONTRACTS=0)")
def test_a_broken_transition_is_caught_by_the_contracts(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_advance(self: PartitionTracker) -> None:
        self._processed = self._next

    monkeypatch.setattr(PartitionTracker, "_advance", broken_advance)
    t = PartitionTracker(0)
    t.fetched([0, 1, 2])
    t.apply_many(Event.START, [0, 1, 2])
    with pytest.raises(icontract.ViolationError, match="tracker invariant"):
        t.apply(Event.SUCCEED, 0)


@pytest.mark.slow  # fresh interpreters, contracts off and on
def test_the_switch_turns_contracts_off_and_on() -> None:
    def run(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", BROKEN],
            env={"HTMQC_CONTRACTS": value, "PATH": ""},
            capture_output=True,
            text=True,
        )

    off = run("0")
    assert off.returncode == 0 and off.stdout.split() == ["False", "3"]  # the bug goes through
    on = run("1")
    assert on.returncode != 0 and "ViolationError" in on.stderr
