"""The background tasks of :class:`htmqc.sources.pumped.PumpedConsumer` (fast: no server).

A task nobody awaits (Pulsar's cached watermark refresh) that fails is one warning
line naming what it did; asyncio's "Task exception was never retrieved" traceback
(which a run's log once showed four times while the admin API was down) is not.
"""

from __future__ import annotations

import gc
import logging
import threading

import pytest

from htmqc.errors import RuntimeFailure
from htmqc.sources.pumped import PumpedConsumer


def test_a_failed_background_task_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    consumer = PumpedConsumer("g")
    done = threading.Event()

    async def refresh() -> None:
        done.set()
        raise RuntimeFailure("cannot reach the admin API", "check --bootstrap")

    try:
        with caplog.at_level(logging.WARNING):
            consumer._loop.call_soon_threadsafe(
                consumer._track, refresh(), "reading the watermarks of t/0"
            )
            assert done.wait(5)
            consumer._submit(_nothing()).result(5)  # the done callback has run
            gc.collect()  # an unretrieved exception is reported when its task goes
    finally:
        consumer.close()
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert lines == [(
        "htmqc.sources",
        "reading the watermarks of t/0 failed: cannot reach the admin API; check --bootstrap",
    )]  # fmt: skip


async def _nothing() -> None:
    return None
