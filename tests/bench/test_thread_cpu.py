"""The thread-by-thread CPU split of a broker run (``benchmarks.thread_cpu``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from benchmarks import thread_cpu


def test_threads_are_grouped_by_part() -> None:
    pid = os.getpid()
    assert thread_cpu.group_of(pid, "python", pid) == "poll"
    assert thread_cpu.group_of(pid + 1, "htmqc-lane-3", pid) == "htmqc-lane"
    assert thread_cpu.group_of(pid + 1, "htmqc-txn", pid) == "htmqc-txn"
    assert thread_cpu.group_of(pid + 1, "rdk:broker111", pid) == "rdk:broker"
    assert thread_cpu.group_of(pid + 1, "rdk:broker-1", pid) == "rdk:broker"
    assert thread_cpu.group_of(pid + 1, "python", pid) == "other"


def test_a_tree_that_is_not_one_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert thread_cpu.main([f"old={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "git archive" in err


@pytest.mark.slow
@pytest.mark.broker
def test_a_small_run_splits_the_cpu_by_thread(capsys: pytest.CaptureFixture[str]) -> None:
    count = 50_000  # enough for the lane's CPU to pass a clock tick (10 ms)
    assert thread_cpu.main(["--count", str(count), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  this")]
    parts = dict(re.findall(r"(\S+) (\d+\.\d+)", line))
    assert {"whole", "poll", "htmqc-lane"} <= set(parts)  # handlers run off the poll thread
    # the threads' ticks (10 ms) add up to the process's time, within a tick each
    threads = sum(float(v) for k, v in parts.items() if k != "whole")
    assert abs(threads - float(parts["whole"])) <= 0.01 * 1e6 / (count - 1) * (len(parts) + 1)
