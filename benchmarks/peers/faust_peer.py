"""Contender: faust-streaming (asyncio stream processor), at-least-once.

A faust ``App`` with an agent over the topic (raw bytes values); the agent
runs the shared handler per event and stops the worker after ``count``.
Faust commits acknowledged offsets every ``broker_commit_interval`` (kept at
its default, 2.8 s). Faust keeps its tables in memory (``store="memory://"``)
and its data directory in a temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from typing import Any

from benchmarks.peers.common import Meter

MODES = ("at-least-once",)


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "at-least-once",
    latency: str | None = None,
    store: str | None = None,
    kill_at: int | None = None,
    journal: str | None = None,
    out_topic: str | None = None,
    idle_exit: float | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with a faust worker; return the shared figures."""
    import faust

    meter = Meter(count, latency=latency, store=store, kill_at=kill_at, journal=journal)
    app = faust.App(
        group,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="faust-peer-"),
        topic_partitions=8,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        topic_disable_leader=True,
        broker_session_timeout=6.0,  # the loopback timing htmqc and aiokafka use too
        broker_heartbeat_interval=0.5,
        broker_rebalance_timeout=10.0,
        broker_max_poll_interval=10.0,
    )
    source = app.topic(topic, value_serializer="raw", key_serializer="raw")

    @app.agent(source)
    async def consume(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            meter.handle(event.value, message.timestamp * 1000.0, event.key,
                         message.partition, message.offset)
            if meter.seen == count:
                # stopping from inside the agent deadlocks (the worker waits for
                # this very event to be acknowledged): stop from another task
                asyncio.get_running_loop().call_later(0.1, _stop_soon)
                break

    def _stop_soon() -> None:
        tasks.append(asyncio.ensure_future(worker.stop()))

    tasks: list[Any] = []
    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    with contextlib.suppress(SystemExit):  # the worker exits the process when it stops
        worker.execute_from_commandline()
    return meter.result("faust", mode)
