"""Deterministic replay: capture a topic range into a segment file, feed it
through the runtime offline.

* :mod:`htmqc.replay.segment`: the segment file format (versioned, checksummed),
  writer and memory-mapped, zero-copy reader;
* :mod:`htmqc.replay.faults`: a seeded schedule of handler faults;
* :mod:`htmqc.replay.capture`: ``htmqc capture``;
* :mod:`htmqc.replay.run`: ``htmqc replay`` (the segment is served by
  :class:`htmqc.testing.FakeConsumer`, in file order).
"""

from htmqc.replay.segment import (
    PartitionRange,
    SegmentError,
    SegmentMessage,
    SegmentReader,
    SegmentWriter,
)

__all__ = [
    "PartitionRange",
    "SegmentError",
    "SegmentMessage",
    "SegmentReader",
    "SegmentWriter",
]
