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

The life of a transaction::

    txn = sink.begin()
    for message in batch:
        with txn.message():           # effects of one message, all or nothing
            handler(message, txn.handle)
    txn.commit([(core_commit, fence), ...])   # or txn.abort()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from htmqc.core.decisions import Commit, TopicPartition
from htmqc.errors import RuntimeFailure


@dataclass(frozen=True, slots=True)
class Position:
    """A partition's durable position in the sink.

    ``committed``: the next offset to read (Kafka convention); every offset
    below it has its effects stored. ``finished_above``: offsets above
    ``committed`` whose effects are stored too (finished out of order), sorted.
    ``fence``: the fence token this owner got from :meth:`Sink.claim`.
    """

    committed: int
    finished_above: tuple[int, ...]
    fence: int


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


@runtime_checkable
class SinkTransaction(Protocol):
    """One open transaction of a :class:`Sink` (see the module docs)."""

    #: What the user handler receives: a DB-API cursor (sqlite3 / psycopg) or,
    #: for Kafka, an ``Output`` with ``send(topic, value, key=None, headers=None)``.
    handle: Any

    def message(self) -> AbstractContextManager[None]:
        """Scope of one message's effects. If the block raises, that message's
        effects are undone and the exception propagates; the transaction stays
        usable for the other messages. Scopes do not nest."""
        ...

    def commit(self, commits: Sequence[tuple[Commit, int]]) -> None:
        """Store each ``(commit, fence)``'s position with the effects, in the
        same transaction, after checking each partition's fence is still
        ``fence``; then commit. A stale fence rolls back everything and raises
        :class:`Fenced`. With no commits the transaction is aborted: effects are
        only ever stored together with the positions that cover them."""
        ...

    def abort(self) -> None:
        """Roll back everything in this transaction. Idempotent."""
        ...


@runtime_checkable
class Sink(Protocol):
    """An exactly-once sink: effects and positions in one transaction."""

    #: ``"sqlite"``, ``"postgresql"`` or ``"kafka"``.
    name: str

    def open(self, group: str) -> None:
        """Connect and create the sink's tables if missing (idempotent)."""
        ...

    def claim(
        self,
        tps: Sequence[TopicPartition],
        *,
        default_start: Callable[[TopicPartition], int],
    ) -> dict[TopicPartition, Position]:
        """Take newly assigned partitions: atomically bump each one's fence and
        return its durable position. ``default_start(tp)`` is the start of a
        partition the sink has never seen. Not allowed while a transaction is open."""
        ...

    def begin(self) -> SinkTransaction:
        """Open a transaction (at most one at a time per sink)."""
        ...

    def close(self) -> None:
        """Abort any open transaction and disconnect. Idempotent."""
        ...
