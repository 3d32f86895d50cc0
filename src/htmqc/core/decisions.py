"""Decisions the core hands to the runtime, as frozen values.

The core never performs I/O. When an event calls for an action (commit an
offset, retry a message later, write a message to the dead-letter queue) the
core returns one of these; the runtime carries it out and reports back with the
matching event (``commit_acked``, ``retry_due``, ``dead_lettered``).
Each decision names the assignment *epoch* it belongs to, so that a report that
comes back after the partition moved is recognised as late and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A Kafka topic-partition.
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit:
    """Make ``offset`` durable for ``tp`` (Kafka convention: the next offset to
    read). ``finished_above`` lists offsets at or above ``offset`` that are
    finished too; a sink that stores them with the offset lets a restart skip
    them (see :meth:`ConsumerCore.assign`)."""

    tp: TopicPartition
    epoch: int
    offset: int
    finished_above: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryAt:
    """Run ``offset`` again at time ``at`` (the caller's clock); this will be
    failure number ``attempt`` + 1 if it fails again."""

    tp: TopicPartition
    epoch: int
    offset: int
    attempt: int
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """Write ``offset`` to the dead-letter queue, then report ``dead_lettered``."""

    tp: TopicPartition
    epoch: int
    offset: int
    attempts: int
    permanent: bool


Decision = Commit | RetryAt | DeadLetter
