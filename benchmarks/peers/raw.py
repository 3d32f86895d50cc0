"""Contender: the hand-written confluent-kafka loops of :mod:`benchmarks.raw_loop`.

Modes: ``raw`` (a commit per ``consume()`` batch of 500, asynchronous) and
``naive`` (a synchronous commit per message). This wraps
:func:`benchmarks.raw_loop.run`, passing the shared trivial handler.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message

from benchmarks import raw_loop
from benchmarks.peers.common import Meter

MODES = ("raw", "naive")


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "raw",
    latency: str | None = None,
    store: str | None = None,
    kill_at: int | None = None,
    journal: str | None = None,
    out_topic: str | None = None,
    idle_exit: float | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with the ``mode`` loop; return the shared figures.

    ``out_topic`` and ``idle_exit`` are not used (no output; the loop stops at ``count``).
    """
    meter = Meter(count, latency=latency, store=store, kill_at=kill_at, journal=journal)

    def handler(message: Message) -> None:
        meter.handle(message.value(), message.timestamp()[1], message.key(),
                     message.partition(), message.offset())

    inner = raw_loop.run(bootstrap, topic, count, mode, group=group, handler=handler,
                         timeout=timeout)
    return meter.result("raw", mode, commits=inner["commits"], join_seconds=inner["join_seconds"])
