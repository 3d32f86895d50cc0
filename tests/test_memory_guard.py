"""The memory guard (:mod:`tests.memory_guard`) stops a runaway test process, naming the test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import memory_guard

ROOT = Path(__file__).resolve().parents[1]


def _run_watch(sizes: list[float], limit: int) -> list[tuple[float, int]]:
    """Run :func:`memory_guard.watch` over ``sizes``; return the trips it made."""
    trips: list[tuple[float, int]] = []
    left = iter(sizes)
    measured: list[float] = []

    def wait(_: float) -> bool:
        return len(measured) == len(sizes)

    def measure() -> float:
        measured.append(next(left))
        return measured[-1]

    memory_guard.watch(limit, wait, measure, lambda size, lim: trips.append((size, lim)))
    return trips


def test_the_guard_trips_once_past_the_limit_and_not_at_it() -> None:
    assert _run_watch([10, 100, 100.0], 100) == []
    assert _run_watch([10, 100.5, 900], 100) == [(100.5, 100)]


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTMQC_TEST_RSS_LIMIT_MB", raising=False)
    assert memory_guard.limit_mb() == memory_guard.DEFAULT_LIMIT_MB
    monkeypatch.setenv("HTMQC_TEST_RSS_LIMIT_MB", "0")
    assert memory_guard.limit_mb() == 0
    monkeypatch.setenv("HTMQC_TEST_RSS_LIMIT_MB", "6G")
    with pytest.raises(pytest.UsageError, match="'6G' is not a whole number of MiB"):
        memory_guard.limit_mb()


def test_this_process_is_measured() -> None:
    before = memory_guard.resident_mb()
    block = bytearray(64 * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])  # touch every page
    assert memory_guard.resident_mb() - before > 48
    del block


@pytest.mark.slow
def test_a_runaway_test_is_stopped_and_named(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_runaway.py").write_text(
        "import time\n"
        "def test_fine():\n    pass\n"
        "def test_grows():\n"
        "    hoard = []\n"
        "    for _ in range(400):\n"
        "        hoard.append(bytearray(2**20)); hoard[-1][::4096] = b'x' * 256\n"
        "        time.sleep(0.01)\n"
    )
    env = {**os.environ, "HTMQC_TEST_RSS_LIMIT_MB": "150", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.memory_guard", "-q", "-p",
         "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == memory_guard.EXIT_CODE, run.stdout + run.stderr
    assert "over the 150 MiB limit, while running test_runaway.py::test_grows" in run.stderr
    assert "in test_grows" in run.stderr  # the stack of the test's thread
    kept = Path(run.stderr.rsplit("stacks kept in ", 1)[1].strip())
    assert "in test_grows" in kept.read_text()
    kept.unlink()
