"""The exactly-once worker heeds the loop between two handler calls, not pieces.

:class:`~htmqc.runtime.workers.TransactionWorker` runs up to a piece of
messages in one sink scope; a commit request, a claim or a doom from the loop
must still be carried out before the next handler call (a handler may take
seconds, and a piece hundreds of calls: a revoke's or the shutdown's bound
would pass). Driven by hand: this test is the loop, answering the worker's
reports on its own thread.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from htmqc.ports import SystemClock
from htmqc.runtime.lanes import Lease
from htmqc.runtime.workers import TransactionWorker
from htmqc.sinks import open_sink
from htmqc.testing import FakeMessage

TOPIC = "t"
#: The handler blocks at this offset until the loop has spoken.
STALL_AT = 3
COUNT = 40


def _next_report(reports: queue.SimpleQueue[tuple[Any, ...]], kinds: set[str]) -> tuple[Any, ...]:
    """The next report whose kind is one of ``kinds`` (others skipped)."""
    while True:
        report = reports.get(timeout=10)
        if report[0] in kinds:
            return report


@pytest.mark.parametrize("what", ["commit", "doom"])
def test_the_loop_is_heeded_before_the_next_handler_call(tmp_path: Path, what: str) -> None:
    """A commit request (the handshake follows) or a doom (the transaction is
    rolled back) made while a handler runs, in the middle of a piece, is carried
    out right after that call: the handler has run exactly up to the stalled
    message when the worker reports. Removing the loop's wake-up of the handler
    loop (the worker would only look between pieces) fails it."""
    sink = open_sink(f"sqlite:///{tmp_path / 'w.db'}")
    sink.open("g")
    calls: list[int] = []
    stalled, go_on = threading.Event(), threading.Event()

    def handler(msg: Any, tx: Any) -> None:
        calls.append(msg.offset())
        if msg.offset() == STALL_AT:
            stalled.set()
            go_on.wait(10)

    worker = TransactionWorker(sink, handler, clock=SystemClock(), txn_messages=10_000,
                               txn_seconds=3600.0, reconnect_seconds=1.0)
    seen: dict[str, int] = {}  # report kind -> handler calls made when it was reported
    report = worker.report

    def noting(item: tuple[Any, ...], *, wake: bool = True) -> None:
        seen.setdefault(item[0], len(calls))
        report(item, wake=wake)

    worker.report = noting  # type: ignore[method-assign]
    worker.start()
    try:
        lease = Lease((TOPIC, 0), 1)
        msgs = [FakeMessage(TOPIC, 0, i, b"k", b"v") for i in range(COUNT)]
        worker.submit(lease, msgs, ([m.offset() for m in msgs], 0))
        assert stalled.wait(10)
        if what == "commit":
            worker.request(("commit",))
        else:
            worker.doom()
        go_on.set()
        if what == "commit":
            _next_report(worker.reports, {"commit_due"})
            worker.answer([])
            _next_report(worker.reports, {"committed"})
            assert seen["commit_due"] == STALL_AT + 1, "the commit waited for the rest of the piece"
        else:
            _next_report(worker.reports, {"aborted"})
            assert seen["aborted"] == STALL_AT + 1, "the doom waited for the rest of the piece"
    finally:
        go_on.set()
        worker.close()
