"""The contract between the runtime and an exactly-once sink.

Theory of operation
-------------------
A sink stores two things for each partition it has seen: the user's *effects*
(rows, output records) and the partition's *position* (:class:`Position`). The
two only ever move together, in one transaction, so a message's effect is in
the sink exactly when the sink's position covers that message: below
``committed``, or listed in ``finished_above``. After a crash the runtime
restarts each partition from its stored position, and every message whose
effect is stored is skipped; every other one runs again, and its earlier
attempt left nothing. Delivery is at-least-once; effects are once.

Fencing. A partition can be owned by a new group member while the old one
(a *zombie*: paused, partitioned from the broker, slow) still runs. On
assignment the runtime calls :meth:`Sink.claim`, which atomically bumps the
partition's *fence token* and returns it in the :class:`Position`. Every
:meth:`SinkTransaction.commit` carries the fence the committer got, and the
sink checks it under the same lock that stores the position: if anyone has
claimed the partition since, the whole transaction is rolled back and
:class:`Fenced` is raised. So a zombie can never store an effect after the
partition moved.

Faults. A sink raises :class:`SinkUnavailable` when its database cannot be
used for now (the connection was lost, PostgreSQL terminated the backend, the
SQLite file stayed locked past the busy timeout) and :class:`TransactionAborted`
when it had to roll the whole open transaction back under a running batch (a
failed message could not be undone alone). Either way nothing of the open
transaction is stored; the runtime rolls back, reconnects
(:meth:`~htmqc.ports.Sink.reconnect`) with backoff, claims its partitions
again and re-reads them from the stored positions.

The life of a transaction::

    txn = sink.begin()
    for message in batch:
        with txn.message():           # effects of one message, all or nothing
            handler(message, txn.handle)
    txn.commit([(core_commit, fence), ...])   # or txn.abort()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from htmqc.core.decisions import TopicPartition
from htmqc.errors import RuntimeFailure
from htmqc.ports import Position, Sink, SinkTransaction

__all__ = [
    "Fenced",
    "Position",
    "Sink",
    "SinkStateError",
    "SinkTransaction",
    "SinkUnavailable",
    "TransactionAborted",
    "check_no_transaction",
    "partition_name",
]


def partition_name(tp: TopicPartition) -> str:
    """``topic[partition]``, the way every sink message names a partition."""
    return f"{tp[0]}[{tp[1]}]"


class Fenced(RuntimeFailure):
    """A transaction was rejected because another owner claimed a partition
    since this one did; nothing of the transaction was stored.

    ``tps`` names the partitions whose fence was stale (may be empty when the
    broker does not say which, as with Kafka's producer fencing).
    """

    def __init__(self, problem: str, fix: str = "", *, tps: Iterable[TopicPartition] = ()) -> None:
        super().__init__(problem, fix)
        self.tps: tuple[TopicPartition, ...] = tuple(tps)

    @classmethod
    def for_partitions(cls, sink: str, tps: Sequence[TopicPartition]) -> Fenced:
        """The standard message for stale fences on ``tps``."""
        names = ", ".join(partition_name(tp) for tp in tps)
        return cls(
            f"{sink} sink: partition {names} was claimed by another member; "
            "the transaction was rolled back and none of its effects were stored",
            "let the partition go: its new owner processes it from the stored position",
            tps=tps,
        )


class SinkUnavailable(RuntimeFailure):
    """The sink's database cannot be used for now (connection lost, backend
    terminated, file locked past the busy timeout); the open transaction, if
    any, is gone. The runtime reconnects with backoff (module docs)."""


class TransactionAborted(RuntimeFailure):
    """The sink rolled the whole open transaction back under a running batch;
    nothing of it is stored and the transaction cannot be used any more."""


class SinkStateError(RuntimeFailure):
    """The sink was used out of order (a programming error in the caller):
    ``begin`` with a transaction open, ``claim`` inside a transaction, a
    transaction used after it finished."""


def check_no_transaction(sink: str, call: str, txn: object | None) -> None:
    """Raise :class:`SinkStateError` if ``txn`` (the sink's open one) is not ``None``."""
    if txn is not None:
        raise SinkStateError(
            f"{sink} sink: {call}() while a transaction is open",
            "commit or abort the open transaction first (one at a time per sink)",
        )
