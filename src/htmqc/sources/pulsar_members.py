"""Sharing a topic's partitions between the members of a Pulsar group
(``?subscription=failover``): which partitions this member may take, and when.

Theory of operation
-------------------
Every member subscribes, with a ``Failover`` subscription named after the group
and a consumer name of its own, to the **members topic**
``htmqc.members.GROUP.T``: a partitioned topic with one partition per partition
the member reads (``T``'s, then ``T.retry``'s with ``--retry-topic``). For each
partition of a partitioned topic the broker makes one of the subscription's
consumers the *active* one (consumers sorted by name, partition ``i`` to the
``i mod n``-th), so the broker balances the partitions and moves them when a
member joins or leaves (a clean close, a crash and a SIGKILL drop its consumer
with its connection). Nothing is consumed there: the Python client has no
callback for a change of the active consumer, so the member reads who is active
for each partition from the admin API (``partitioned-stats``) every
:data:`POLL` s, and this module decides what that means (:class:`Handover`).

*Hand-over.* A member that sees a partition go to another member stops handing
it out and revokes it (the runtime finishes its work, bounded, and commits);
once the runtime let go of it, the member publishes a **release** (a message
whose ``released-by`` property is its consumer name) to that partition of the
members topic, which the broker delivers to the partition's new active consumer.
The new owner takes a partition at once when its previous owner is gone (not a
consumer of the subscription any more) or unknown, and otherwise waits for that
owner's release, at most :data:`HANDOVER_WAIT` s (a member frozen while
connected never sends one). So a clean rebalance has no overlap: the new owner
starts from the old one's last commit. Correctness does not rest on the
release: a partition taken while its old owner still works is the zombie case
every source has, and the exactly-once sink's fence (bumped by the new owner's
claim) rejects the old owner's late transaction; at-least-once, the overlap is
duplicates, never a loss (every stored commit is one its writer earned).

Pure: no I/O, no clock (``now`` comes in), so it is tested by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Seconds between two reads of the members topic's active consumers.
POLL = 0.5
#: Seconds a new owner waits for the previous owner's release at most (beyond
#: the runtime's default ``--shutdown-seconds`` of 10 s, so a busy but live
#: owner finishes and commits first).
HANDOVER_WAIT = 15.0
#: The property naming the member that released a partition.
RELEASED_BY = "released-by"


@dataclass(frozen=True, slots=True)
class Owner:
    """One partition of the members topic as the broker reports it: its active
    consumer (``None``: none yet) and every consumer of the subscription on it."""

    active: str | None
    consumers: frozenset[str]


@dataclass(frozen=True, slots=True)
class Change:
    """What one look at the members topic decides: partition indexes to take now
    and to let go of now."""

    gained: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()


@dataclass(slots=True)
class Handover:
    """This member's view of who owns which partition (module docs).

    ``me``: this member's consumer name; ``partitions``: how many it reads (a
    members topic with more partitions, left by an earlier run with
    ``--retry-topic``, has indexes that name nothing: they are ignored).

    Invariants: :attr:`held` and :attr:`waiting` are disjoint, and each index in
    them is ``< partitions`` and was active for :attr:`me` in the last
    :meth:`observe`."""

    me: str
    partitions: int
    #: Indexes handed to the runtime (assigned and not revoked since).
    held: set[int] = field(default_factory=set)
    #: Indexes active for this member whose previous owner has not released them
    #: yet: ``index -> (previous owner, until when to wait)``.
    waiting: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: The last active consumer seen per index (before this member's first look:
    #: what :meth:`start` saw).
    last_active: dict[int, str] = field(default_factory=dict)
    #: Releases heard and not yet used: ``(index, releasing member)``.
    released: set[tuple[int, str]] = field(default_factory=set)

    def start(self, owners: Mapping[int, Owner]) -> None:
        """Who was active before this member joined (so a partition it is given
        at once still waits for its owner's release)."""
        for index, owner in owners.items():
            if owner.active is not None:
                self.last_active[index] = owner.active

    def hear(self, releases: Iterable[tuple[int, str]]) -> None:
        """Releases ``(index, member)`` read from the members topic."""
        self.released.update(releases)

    def observe(self, owners: Mapping[int, Owner], now: float) -> Change:
        """One look at the members topic at ``now``: what to take and let go of."""
        mine = {
            i for i, o in owners.items() if o.active == self.me and 0 <= i < self.partitions
        }
        lost = sorted(self.held - mine)
        self.held -= set(lost)
        for index in [i for i in self.waiting if i not in mine]:
            del self.waiting[index]
        gained: list[int] = []
        for index in sorted(mine - self.held):
            owner = owners[index]
            if index not in self.waiting:
                previous = self.last_active.get(index)
                if previous is None or previous == self.me:
                    gained.append(index)
                    continue
                self.waiting[index] = (previous, now + HANDOVER_WAIT)
            previous, until = self.waiting[index]
            let_go = (index, previous) in self.released or previous not in owner.consumers
            if let_go or now >= until:
                del self.waiting[index]
                gained.append(index)
        self.held.update(gained)
        for index, owner in owners.items():
            if owner.active is not None:
                self.last_active[index] = owner.active
                # A release older than its member's latest hold of the index is stale.
                self.released.discard((index, owner.active))
        self.released -= {(i, m) for i, m in self.released if i in gained}
        return Change(tuple(gained), tuple(lost))
