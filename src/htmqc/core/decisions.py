"""Decisions the core hands to the runtime, as frozen values.

The core never performs I/O. When an event calls for an action (commit an
offset, retry a message later, move it to the retry topic, write it to the
dead-letter queue) the core returns one of these; the runtime carries it out
and reports back with the matching event (``commit_acked``, ``retry_due``,
``handed_off``, ``dead_lettered``).
Each decision names the assignment *epoch* it belongs to, so that a report that
comes back after the partition moved is recognised as late and ignored.
"""

from __future__ import annotations

import enum
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
class HandOff:
    """Write ``offset`` to the retry topic ``topic``, to run again from there at
    ``due`` (the caller's clock: unix seconds, it goes into a record header),
    then report ``handed_off``. ``attempt``: failures so far, this one included
    (the record's attempt header)."""

    tp: TopicPartition
    epoch: int
    offset: int
    topic: str
    attempt: int
    due: float


class DeadLetterKind(enum.Enum):
    """Why a message is dead-lettered; values are the DLQ records' ``kind``."""

    #: Its retries are used up.
    FAILED = "failed"
    #: Its failure was classified permanent: no retry can fix it.
    PERMANENT = "permanent"
    #: It failed too often too fast, or killed its worker (``<topic>.dlq.poison``).
    POISON = "poison"
    #: Its value is over the size limit; the handler never ran on it.
    TOO_LARGE = "too_large"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """Write ``offset`` to the dead-letter queue, then report ``dead_lettered``.
    ``attempts``: failures so far, this one and earlier assignments' (retry
    topic) included."""

    tp: TopicPartition
    epoch: int
    offset: int
    attempts: int
    kind: DeadLetterKind

    @property
    def permanent(self) -> bool:
        """Dead-lettered before its retries were used up."""
        return self.kind is not DeadLetterKind.FAILED


Decision = Commit | RetryAt | HandOff | DeadLetter
