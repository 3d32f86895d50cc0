"""The two ways of writing the offset invariant, and the map between them.

htmqc uses Kafka's convention: a watermark is the *next* offset to read, so a
partition satisfies ``committed <= processed <= next``.

The seed document speaks of the *last* offset committed and the *last* offset
processed, inclusive: ``last_committed <= last_processed < next``, with ``-1``
meaning "nothing yet". The map is ``last_x = x - 1``; under it the two forms are
equivalent for every integer triple (``tests/core/test_offsets.py`` checks this,
and ``proofs/`` proves it for unbounded integers).
"""

from __future__ import annotations

from typing import NamedTuple

import icontract

from htmqc.core.contracts import ENABLED


class Watermarks(NamedTuple):
    """Kafka convention: each value is the next offset to read."""

    committed: int
    processed: int
    next: int


class InclusiveWatermarks(NamedTuple):
    """Seed convention: the last offset committed/processed (-1: none), and next."""

    last_committed: int
    last_processed: int
    next: int


def holds(w: Watermarks) -> bool:
    """``committed <= processed <= next`` (Kafka convention)."""
    return w.committed <= w.processed <= w.next


def holds_inclusive(w: InclusiveWatermarks) -> bool:
    """``last_committed <= last_processed < next`` (seed convention)."""
    return w.last_committed <= w.last_processed < w.next


@icontract.ensure(lambda w, result: holds(w) == holds_inclusive(result), enabled=ENABLED)
def to_inclusive(w: Watermarks) -> InclusiveWatermarks:
    """Kafka convention to seed convention."""
    return InclusiveWatermarks(w.committed - 1, w.processed - 1, w.next)


@icontract.ensure(lambda w, result: holds_inclusive(w) == holds(result), enabled=ENABLED)
def from_inclusive(w: InclusiveWatermarks) -> Watermarks:
    """Seed convention to Kafka convention."""
    return Watermarks(w.last_committed + 1, w.last_processed + 1, w.next)
