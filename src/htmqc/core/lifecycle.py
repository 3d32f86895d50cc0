"""The message lifecycle: one transition table, as data.

Theory of operation
-------------------
Every fetched message (one Kafka offset) moves through these states::

    Pending --start--> Processing --succeed--> Succeeded
                       Processing --fail-----> Failed
    Failed  --schedule_retry--> Retrying --retry_due--> Processing
    Failed  --dead_letter-----> DeadLettered
    Failed  --hand_off--------> HandedOff

``Succeeded``, ``DeadLettered`` and ``HandedOff`` are *finished*: the offset no
longer holds back the partition's watermark. ``HandedOff`` is a message moved
to the retry topic (``--retry-topic``): it will run again, but from that topic,
so for its own partition it is done (:mod:`htmqc.core.failures` decides when).
Offsets that never arrive inside a fetched range (compaction, transaction
markers) are *gaps* and count as finished from the start.

:data:`TRANSITIONS` is the single source of truth. The partition tracker, the
TLA+ mapping, the generated diagram, the conformance vectors and the tests all
read it; nothing else in the code base spells out a lifecycle edge.
Every event has exactly one source state (checked at import), which is what
lets the batch forms of the tracker check a whole batch with one comparison.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


class MessageState(enum.Enum):
    """Where one message (offset) is in its lifecycle."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RETRYING = "Retrying"
    DEAD_LETTERED = "DeadLettered"
    HANDED_OFF = "HandedOff"


class Event(enum.Enum):
    """Lifecycle events; values are the names used in traces and in TLA+."""

    START = "started"
    SUCCEED = "succeeded"
    FAIL = "failed"
    SCHEDULE_RETRY = "retry_scheduled"
    RETRY_DUE = "retry_due"
    DEAD_LETTER = "dead_lettered"
    HAND_OFF = "handed_off"


S = MessageState
E = Event

#: The lifecycle: ``TRANSITIONS[state][event] -> new state``. A missing entry is
#: an illegal move.
TRANSITIONS: Final[Mapping[MessageState, Mapping[Event, MessageState]]] = MappingProxyType(
    {
        S.PENDING: MappingProxyType({E.START: S.PROCESSING}),
        S.PROCESSING: MappingProxyType({E.SUCCEED: S.SUCCEEDED, E.FAIL: S.FAILED}),
        S.FAILED: MappingProxyType(
            {
                E.SCHEDULE_RETRY: S.RETRYING,
                E.DEAD_LETTER: S.DEAD_LETTERED,
                E.HAND_OFF: S.HANDED_OFF,
            }
        ),
        S.RETRYING: MappingProxyType({E.RETRY_DUE: S.PROCESSING}),
        S.SUCCEEDED: MappingProxyType({}),
        S.DEAD_LETTERED: MappingProxyType({}),
        S.HANDED_OFF: MappingProxyType({}),
    }
)

#: States in which an offset no longer holds back the watermark.
FINISHED: Final[frozenset[MessageState]] = frozenset(
    {S.SUCCEEDED, S.DEAD_LETTERED, S.HANDED_OFF}
)

#: The state of a message when it is fetched.
INITIAL: Final[MessageState] = S.PENDING


def _edges() -> Mapping[Event, tuple[MessageState, MessageState]]:
    edges: dict[Event, tuple[MessageState, MessageState]] = {}
    for source, row in TRANSITIONS.items():
        for event, target in row.items():
            if event in edges:
                raise AssertionError(f"event {event.value} has two source states")
            edges[event] = (source, target)
    missing = set(Event) - set(edges)
    if missing:
        raise AssertionError(f"events with no edge: {sorted(e.value for e in missing)}")
    return MappingProxyType(edges)


#: ``EDGES[event] == (source, target)``, derived from :data:`TRANSITIONS`.
EDGES: Final[Mapping[Event, tuple[MessageState, MessageState]]] = _edges()


def step(state: MessageState, event: Event) -> MessageState:
    """The state after ``event`` in ``state``; :class:`KeyError` if illegal."""
    return TRANSITIONS[state][event]
