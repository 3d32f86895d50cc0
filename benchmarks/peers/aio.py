"""Contender: aiokafka (asyncio), at-least-once with a commit per batch.

``getmany(max_records=500)`` per partition batch, the shared handler per
message, then ``await consumer.commit()`` (committing the positions just
consumed) once per ``getmany`` result. Auto-commit is off.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.peers.common import Meter

MODES = ("at-least-once",)


async def _consume(bootstrap: str, topic: str, group: str, meter: Meter, timeout: float) -> int:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        max_poll_records=500,
    )
    await consumer.start()
    commits = 0
    deadline = time.monotonic() + timeout
    try:
        while not meter.done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"aiokafka: got {meter.seen} of {meter.count} in {timeout:g}s")
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batches.values():
                for record in records:
                    meter.handle(record.value, record.timestamp, record.key, record.partition,
                                 record.offset)
                    if meter.done:
                        break
                if meter.done:
                    break
            if batches:
                await consumer.commit()
                commits += 1
    finally:
        await consumer.stop()
    return commits


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
    """Consume ``count`` messages with aiokafka; return the shared figures."""
    meter = Meter(count, latency=latency, store=store, kill_at=kill_at, journal=journal)
    commits = asyncio.run(_consume(bootstrap, topic, group, meter, timeout))
    return meter.result("aiokafka", mode, commits=commits)
