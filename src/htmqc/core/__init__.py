"""htmqc's pure core: the per-partition state machine and offset tracker.

No I/O, no clock, no threads: events come in as arguments and decisions go out
as values. See :mod:`htmqc.core.lifecycle` (the transition table),
:mod:`htmqc.core.partition` (the offset tracker) and
:mod:`htmqc.core.consumer` (the consumer-level core the runtime drives).
"""

from htmqc.core.consumer import ConsumerCore
from htmqc.core.contracts import ENABLED as CONTRACTS_ENABLED
from htmqc.core.decisions import Commit, DeadLetter, Decision, RetryAt, TopicPartition
from htmqc.core.errors import CoreError, IllegalTransition, NotAssigned, OffsetOrderError
from htmqc.core.lifecycle import EDGES, FINISHED, TRANSITIONS, Event, MessageState
from htmqc.core.partition import PartitionTracker, tracker_invariant
from htmqc.core.retry import FailureKind, Permanent, Retryable, RetryPolicy, classify

__all__ = [
    "CONTRACTS_ENABLED",
    "EDGES",
    "FINISHED",
    "TRANSITIONS",
    "Commit",
    "ConsumerCore",
    "CoreError",
    "DeadLetter",
    "Decision",
    "Event",
    "FailureKind",
    "IllegalTransition",
    "MessageState",
    "NotAssigned",
    "OffsetOrderError",
    "PartitionTracker",
    "Permanent",
    "RetryAt",
    "RetryPolicy",
    "Retryable",
    "TopicPartition",
    "classify",
    "tracker_invariant",
]
