"""The injector's end of a run: a run is over only once what the last fault set in
motion had time to happen (a woken zombie's late commit above all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from htmqc.chaos.injector import AFTERMATH_SECONDS, Injector
from htmqc.chaos.schedule import Fault


def test_done_only_an_aftermath_after_the_last_fault_ended(tmp_path: Path) -> None:
    lines: list[str] = []
    fault = Fault(index=0, kind="sink-slow", at=0.0, seconds=1.0, delay_ms=5.0)
    proxy: Any = None  # a switch fault never touches the proxy
    injector = Injector([fault], [], proxy, tmp_path / "control.json", salt=1, log=lines.append)
    t0 = injector.started
    assert not injector.done(t0)  # pending
    injector.step(0.0, t0)
    assert not injector.done(t0 + 0.5)  # in force
    injector.step(0.9, t0 + 1.0)
    ended = t0 + 1.0
    assert not injector.active and any("end #0" in line for line in lines)
    assert not injector.done(ended + AFTERMATH_SECONDS - 0.01)
    assert injector.done(ended + AFTERMATH_SECONDS)
