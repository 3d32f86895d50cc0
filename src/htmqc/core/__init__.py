"""htmqc's pure core: the per-partition state machine and offset tracker.

No I/O, no clock, no threads: events come in as arguments and decisions go out
as values. See :mod:`htmqc.core.lifecycle` (the transition table),
:mod:`htmqc.core.partition` (the offset tracker), :mod:`htmqc.core.consumer`
(the consumer-level core the runtime drives), :mod:`htmqc.core.failures` (what
becomes of a failed message), :mod:`htmqc.core.gate` (which partitions may
fetch), :mod:`htmqc.core.breaker` (the circuit breaker),
:mod:`htmqc.core.position_text` (the stored text form of ``finished_above``) and
:mod:`htmqc.core.metadata_budget` (how much work fits Kafka's commit metadata).
"""

from htmqc.core.breaker import Breaker, BreakerPolicy, BreakerState
from htmqc.core.consumer import ConsumerCore
from htmqc.core.contracts import ENABLED as CONTRACTS_ENABLED
from htmqc.core.decisions import (
    Commit,
    DeadLetter,
    DeadLetterKind,
    Decision,
    HandOff,
    RetryAt,
    TopicPartition,
)
from htmqc.core.errors import CoreError, IllegalTransition, NotAssigned, OffsetOrderError
from htmqc.core.failures import Failure, RetryTopic
from htmqc.core.gate import Gate, GateState, Hold
from htmqc.core.lifecycle import EDGES, FINISHED, TRANSITIONS, Event, MessageState
from htmqc.core.partition import PartitionTracker, tracker_invariant
from htmqc.core.retry import FailureKind, Permanent, Retryable, RetryPolicy, classify

__all__ = [
    "CONTRACTS_ENABLED",
    "EDGES",
    "FINISHED",
    "TRANSITIONS",
    "Breaker",
    "BreakerPolicy",
    "BreakerState",
    "Commit",
    "ConsumerCore",
    "CoreError",
    "DeadLetter",
    "DeadLetterKind",
    "Decision",
    "Event",
    "Failure",
    "FailureKind",
    "Gate",
    "GateState",
    "HandOff",
    "Hold",
    "IllegalTransition",
    "MessageState",
    "NotAssigned",
    "OffsetOrderError",
    "PartitionTracker",
    "Permanent",
    "RetryAt",
    "RetryPolicy",
    "RetryTopic",
    "Retryable",
    "TopicPartition",
    "classify",
    "tracker_invariant",
]
