"""Sharing a Pulsar topic's partitions between members (:mod:`htmqc.sources.pulsar_members`),
without a broker: :class:`Handover` drives members of a model cluster whose broker
does what Pulsar's ``Failover`` subscription does on a partitioned topic (consumers
sorted by name, partition ``i`` to the ``i mod n``-th; a release published to a
partition goes to its active consumer at that moment).

* A rolling change (members join and leave cleanly, one change at a time, each
  followed by every member looking and finishing its revokes) never has two members
  holding a partition, and ends with each partition held by its active member.
* Any interleaving (looks, revokes finished late, members crashing, time passing)
  keeps a member's holdings among the partitions it was last seen active for, and
  once the membership stops changing every partition reaches its active member
  within :data:`HANDOVER_WAIT` and a few looks.
The broker end (a real Failover subscription, the release messages, runs) is in
test_pulsar_members_run.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from htmqc.sources.pulsar_members import HANDOVER_WAIT, POLL, Change, Handover, Owner


@dataclass
class Member:
    """A member: its :class:`Handover`, what its runtime holds (taken and not let go of
    yet) and the releases delivered to it and not read yet."""

    handover: Handover
    holding: set[int] = field(default_factory=set)
    revoking: set[int] = field(default_factory=set)
    inbox: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class Cluster:
    """A model broker (module docs) and its members."""

    partitions: int
    now: float = 0.0
    members: dict[str, Member] = field(default_factory=dict)
    #: The largest number of members holding one partition at once, seen so far.
    most_holders: int = 0

    def active(self, index: int) -> str | None:
        names = sorted(self.members)
        return names[index % len(names)] if names else None

    def owners(self) -> dict[int, Owner]:
        everyone = frozenset(self.members)
        return {i: Owner(self.active(i), everyone) for i in range(self.partitions)}

    def join(self, name: str) -> None:
        handover = Handover(name, self.partitions)
        handover.start(self.owners())  # read before subscribing, as the adapter does
        self.members[name] = Member(handover)
        self._count()

    def leave(self, name: str) -> None:
        """A clean stop or a crash: the runtime holds nothing once the consumer is gone."""
        self.members.pop(name)

    def look(self, name: str) -> Change:
        member = self.members[name]
        member.handover.hear(member.inbox)  # releases first, as the adapter reads them
        member.inbox.clear()
        change = member.handover.observe(self.owners(), self.now)
        for index in set(change.gained) & member.revoking:
            self.let_go(name, index)  # the adapter delivers the revoke before the assign
        assert set(change.gained).isdisjoint(member.holding), "gained twice"
        member.holding |= set(change.gained)
        member.revoking |= set(change.lost)
        self._count()
        return change

    def let_go(self, name: str, index: int) -> None:
        """The runtime finished revoking ``index``; the release goes to its active member."""
        member = self.members[name]
        member.revoking.discard(index)
        member.holding.discard(index)
        active = self.active(index)
        if active is not None:
            self.members[active].inbox.append((index, name))

    def settle(self, rounds: int = 6) -> None:
        """Every member looks and finishes its revokes, ``rounds`` times, a look apart."""
        for _ in range(rounds):
            for name in sorted(self.members):
                self.look(name)
            for name in sorted(self.members):
                for index in sorted(self.members[name].revoking):
                    self.let_go(name, index)
            self.now += POLL

    def _count(self) -> None:
        for index in range(self.partitions):
            holders = sum(index in m.holding for m in self.members.values())
            self.most_holders = max(self.most_holders, holders)

    def converged(self) -> bool:
        return all(
            {i for i in range(self.partitions) if self.active(i) == name} == m.holding
            for name, m in self.members.items()
        )


NAMES = [f"m{i}" for i in range(5)]


@settings(max_examples=200)
@given(st.integers(1, 6), st.lists(st.tuples(st.booleans(), st.sampled_from(NAMES)), max_size=12))
def test_a_rolling_change_never_has_two_holders_and_ends_with_the_active_ones(
    partitions: int, changes: list[tuple[bool, str]]
) -> None:
    cluster = Cluster(partitions)
    for joining, name in changes:
        if joining and name not in cluster.members:
            cluster.join(name)
        elif not joining and name in cluster.members:
            cluster.leave(name)
        cluster.settle()
        assert cluster.converged(), "a settled cluster holds each partition at its active member"
    assert cluster.most_holders <= 1, "two members held a partition at once"


STEP = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(NAMES)),
    st.tuples(st.just("leave"), st.sampled_from(NAMES)),
    st.tuples(st.just("look"), st.sampled_from(NAMES)),
    st.tuples(st.just("let_go"), st.sampled_from(NAMES)),
    st.tuples(st.just("wait"), st.sampled_from([POLL, 2.0, HANDOVER_WAIT])),
)


@settings(max_examples=300)
@given(st.integers(1, 5), st.lists(STEP, max_size=40))
def test_any_interleaving_holds_only_what_was_seen_and_converges(
    partitions: int, steps: list[tuple[str, object]]
) -> None:
    cluster = Cluster(partitions)
    for kind, arg in steps:
        if kind == "wait":
            assert isinstance(arg, float)
            cluster.now += arg
            continue
        assert isinstance(arg, str)
        if kind == "join" and arg not in cluster.members:
            cluster.join(arg)
        elif arg not in cluster.members:
            continue
        elif kind == "leave":
            cluster.leave(arg)
        elif kind == "look":
            cluster.look(arg)
        elif kind == "let_go":
            member = cluster.members[arg]
            for index in sorted(member.revoking)[:1]:
                cluster.let_go(arg, index)
        for member in cluster.members.values():
            handover = member.handover
            assert not handover.held & set(handover.waiting), "held and waiting at once"
            assert handover.held <= set(range(partitions))
            assert member.holding - member.revoking == handover.held
    rounds = int((HANDOVER_WAIT + 4 * POLL) / POLL)
    cluster.settle(rounds)
    assert cluster.converged(), "the membership stopped changing but did not converge"


def test_a_joining_member_waits_for_the_holders_release_then_takes_the_partition() -> None:
    cluster = Cluster(2)
    cluster.join("b")
    cluster.settle()
    assert cluster.members["b"].holding == {0, 1}
    cluster.join("a")  # sorted first: the broker gives it partition 0
    assert cluster.look("a") == Change(), "b still holds partition 0"
    assert cluster.members["a"].handover.waiting.keys() == {0}
    assert cluster.look("b") == Change(lost=(0,))
    cluster.now += HANDOVER_WAIT / 2
    assert cluster.look("a") == Change(), "no release yet: still waiting"
    cluster.let_go("b", 0)
    assert cluster.look("a") == Change(gained=(0,))
    assert cluster.most_holders == 1


def test_the_wait_ends_when_the_holder_is_gone_or_after_the_handover_wait() -> None:
    frozen = Cluster(1)
    frozen.join("b")
    frozen.settle()
    frozen.join("a")
    assert frozen.look("a") == Change()
    frozen.now += HANDOVER_WAIT - 0.01
    assert frozen.look("a") == Change(), "b never looks (frozen): a waits the handover out"
    frozen.now += 0.01
    assert frozen.look("a") == Change(gained=(0,))

    crashed = Cluster(1)
    crashed.join("b")
    crashed.settle()
    crashed.join("a")
    assert crashed.look("a") == Change()
    crashed.leave("b")  # crashed: its consumer is gone with its connection
    assert crashed.look("a") == Change(gained=(0,)), "a gone holder is not waited for"


def test_a_stale_release_does_not_cut_a_later_wait_short() -> None:
    cluster = Cluster(1)
    member = Handover("a", 1)
    member.start({0: Owner("b", frozenset({"b"}))})
    member.hear([(0, "b")])  # b's release of an earlier hold
    both = frozenset({"a", "b"})
    assert member.observe({0: Owner("b", both)}, 0.0) == Change(), "b holds it again"
    assert member.observe({0: Owner("a", both)}, 1.0) == Change(), "the old release is void"
    assert member.waiting == {0: ("b", 1.0 + HANDOVER_WAIT)}
    member.hear([(0, "b")])
    assert member.observe({0: Owner("a", both)}, 2.0) == Change(gained=(0,))
    assert cluster.partitions == 1


def test_indexes_beyond_the_partitions_read_are_ignored() -> None:
    member = Handover("a", 2)
    owners = {i: Owner("a", frozenset({"a"})) for i in range(4)}  # a members topic of 4
    assert member.observe(owners, 0.0) == Change(gained=(0, 1))
