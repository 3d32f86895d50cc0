"""``--python-cpu``: the poll thread and the handler threads on one CPU, nothing else moved."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from htmqc.errors import UsageError
from htmqc.runtime import affinity
from htmqc.testing import FakeConsumer, make_logs
from tests.runtime.test_engine_unit import TOPIC, engine_in
from tests.runtime.test_run_cli import BASE, error_line, run

ALLOWED = os.sched_getaffinity(0)
#: A CPU this process may run on, and (on a machine with more than one) the last.
CPU = max(ALLOWED)


def in_thread(body: Any) -> Any:
    """``body()`` on a fresh thread (pinning must not touch pytest's own thread)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(body())
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    if failed:
        raise failed[0]
    assert out, "still running after 60 s"
    return out[0]


def test_pin_moves_the_thread_and_those_it_starts_later_and_unpin_gives_it_back() -> None:
    if len(ALLOWED) < 2:
        pytest.skip("one CPU: pinning to it changes nothing to see")

    def body() -> tuple[set[int], set[int], set[int], set[int], set[int]]:
        seen: dict[str, set[int]] = {}
        go = threading.Event()

        def earlier() -> None:
            go.wait(10)
            seen["earlier"] = os.sched_getaffinity(0)

        first = threading.Thread(target=earlier)
        first.start()  # stands for librdkafka's threads: started before the pin
        before = affinity.pin(CPU)
        pinned = os.sched_getaffinity(0)
        later = threading.Thread(target=lambda: seen.setdefault("later", os.sched_getaffinity(0)))
        later.start()
        later.join()
        go.set()
        first.join()
        affinity.unpin(before)
        return before, pinned, seen["later"], seen["earlier"], os.sched_getaffinity(0)

    before, pinned, later, earlier, after = in_thread(body)
    assert before == ALLOWED and after == ALLOWED
    assert pinned == {CPU} and later == {CPU}
    assert earlier == ALLOWED  # a thread started before the pin keeps every CPU


def test_a_cpu_the_process_may_not_use_is_a_usage_error_naming_the_allowed_ones() -> None:
    refused = r"--python-cpu 4096 is not a CPU this process may run on \(allowed: "
    with pytest.raises(UsageError, match=refused):
        affinity.pin(4096)
    assert os.sched_getaffinity(0) == ALLOWED


def test_allowed_cpus_are_written_as_ranges() -> None:
    assert affinity._ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert affinity._ranges({3}) == "3"


def test_a_platform_without_affinity_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.raises(UsageError, match="needs sched_setaffinity"):
        affinity.pin(CPU)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_the_engine_runs_its_handlers_on_the_cpu_and_gives_the_poll_thread_back(
    mode: str, tmp_path: Path
) -> None:
    seen: list[frozenset[int]] = []

    def handler(msg: Any, *tx: Any) -> None:
        seen.append(frozenset(os.sched_getaffinity(0)))

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, 40, keys=5))
    engine = engine_in(mode, tmp_path, handler, consumer, python_cpu=CPU, max_messages=80,
                       workers=2 if mode == "at-least-once" else 1)  # fmt: skip

    def body() -> tuple[int, set[int]]:
        done = engine.run(install_signals=False)
        return done, os.sched_getaffinity(0)

    done, after = in_thread(body)
    assert done == 80 and len(seen) == 80
    assert set(seen) == {frozenset({CPU})}  # every handler call, on its worker thread
    assert after == ALLOWED


def test_the_engine_runs_nothing_when_the_cpu_is_refused(tmp_path: Path) -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 5, keys=1))
    calls: list[Any] = []
    engine = engine_in("at-least-once", tmp_path, calls.append, consumer, python_cpu=4096,
                       max_messages=5)  # fmt: skip
    with pytest.raises(UsageError, match="--python-cpu 4096"):
        in_thread(lambda: engine.run(install_signals=False))
    assert not calls and not consumer.positions  # nothing fetched, nothing run


def test_the_cli_refuses_the_cpu_in_one_line_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """127.0.0.1:1 has no broker: the CPU is refused first, with exit 2, not exit 1."""
    code, err = run(capsys, "examples.printer:show", *BASE, "--python-cpu", "4096")
    assert code == 2
    assert "--python-cpu 4096 is not a CPU this process may run on" in error_line(err)
