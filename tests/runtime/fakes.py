"""The fakes of :mod:`htmqc.testing` under their old names, for callers outside
this part of the tree that still import them from here (``tests/formal``).
New code imports :mod:`htmqc.testing` directly."""

from __future__ import annotations

from htmqc import testing
from htmqc.testing import TP, FakeMessage, FakeProducer, make_logs

__all__ = ["FakeConsumer", "FakeMessage", "FakeProducer", "make_logs"]


def FakeConsumer(
    topic: str, logs: dict[TP, list[tuple[bytes | None, bytes]]]
) -> testing.FakeConsumer:
    """``htmqc.testing.FakeConsumer.from_logs(logs)`` (``topic`` is implied by the logs)."""
    return testing.FakeConsumer.from_logs(logs)
