"""The partition gate: which assigned partitions may fetch, as one table.

Runtime API
-----------
One :class:`Gate` per consumer, driven from the poll thread; every method
returns the actions to carry out, in order (:data:`GateAction`)::

    gate = Gate(fence_grace=session_timeout_ms / 1000)

    on_assign(tps):   do(gate.assigned(tps))          # Drop (if held before), Claim
                      positions = claim(tps)          # sink.claim / consumer.committed, core.assign
                      consumer.incremental_assign(tp @ positions[tp] ...)
                      do(gate.claimed(positions))     # Pause or Resume, always explicit
    on_revoke(tps):   do(gate.revoking(tps)); core.revoking; wait; final commit (core.revoked)
                      do(gate.revoked(tps))           # Drop; then incremental_unassign
    on_lost(tps):     do(gate.lost(tps))              # Drop; then incremental_unassign
    sink raised Fenced(stale):
                      do(gate.rolled_back(stale or gate.partitions(), now))
                                                      # Drop all held; Pause stale; Claim the rest
    a retry-topic record due later:
                      do(gate.retry_wait(tp, record_offset, until))   # Pause, Seek
    every turn:       do(gate.tick(now))              # Claim (fence grace over), Resume (due)
    flow control:     do(gate.hold(Hold.FLOW)) / do(gate.unhold(Hold.FLOW))
    circuit breaker:  do(gate.hold(Hold.BREAKER)) while it is open, else unhold
    dispatch:         gate.fetching(tp)   # may tp's fetched messages go to the core?
    state page:       gate.paused(), gate.snapshot()

    do(actions):  Drop(tps)   -> core.revoked(tp) (a no-op if already done) and drop the
                                 partitions' queued work and retry timers
                  Claim(tps)  -> claim positions (core.assign), then report gate.claimed
                  Pause(tps)  -> consumer.pause;  Resume(tps) -> consumer.resume
                  Seek(tp, o) -> consumer.seek(tp @ o)

All times (``now``, ``until``) are in one clock, the runtime's monotonic one: a
retry-topic record's wall-clock due time is converted before it comes here
(``until = now + (due - wall_now)``).

Theory of operation
-------------------
Each partition the group gave this member is in one :class:`GateState`;
:data:`TRANSITIONS` (``TRANSITIONS[state][event] -> state``) is the only place
that says how it moves. Unassigned partitions are not stored::

    Unassigned --assigned--> Claiming --claimed--> Active
    Active  --retry_wait--> Waiting --retry_wait_over--> Active
    Active/Waiting --fenced--> Fenced --fence_grace_over--> Reclaiming --claimed--> Active
    Active/Waiting --rolled_back--> Reclaiming
    Active/Waiting --revoking--> Draining --revoked--> Unassigned
    (anything) --lost--> Unassigned; Active/Waiting/Fenced --assigned--> Claiming

* *Fenced*: the sink refused this member's fence token for the partition (a
  zombie, or a racing claim). Its work is dropped and it stays paused while
  the group decides; normally the group takes it away within the session
  timeout. If the group still gives it to us ``fence_grace`` seconds later, it
  is claimed again (commit 3bdd90a): the fence rejects whoever is stale, and
  pausing for ever would stall the partition.
* *Reclaiming*: a claim is on its way (after the grace, or after a rolled-back
  transaction for a partition that is still ours); when it comes back the
  partition seeks to the claimed position.
* *Waiting*: the next retry-topic record is not due, or the commit-metadata
  budget holds the rest of a batch back (:mod:`htmqc.core.metadata_budget`; the
  runtime makes it due as soon as the partition's live work drained enough);
  paused and rewound to it.
* *Draining* / *Leaving*: being revoked, with / without work the core holds.

The effects are derived from the table with four sets, not written per edge:
the core holds the partition exactly in :data:`HELD` (leaving it drops the
core's state: :class:`Drop`); entering :data:`CLAIMS` asks for a claim
(:class:`Claim`); the edges in :data:`SEEKS` rewind (:class:`Seek`); and Kafka's
pause follows the state: always paused in :data:`ALWAYS_PAUSED`, paused in
:data:`FOLLOWS_HOLDS` exactly while a consumer-wide :class:`Hold` (flow control,
the circuit breaker) is on, and left alone elsewhere. The gate remembers what
it last told Kafka per partition and emits only changes, except that after
``assigned`` it knows nothing: librdkafka keeps a partition's pause across
unassign and assign (commit 44915de), so the first word after a claim is always
an explicit Pause or Resume.

Properties (checked after every method by :func:`gate_invariant`, and by the
tests against a naive model, ``model_checks/reference_gate.py``):

* *NoStrayPause*: an Active partition is paused exactly while a hold is on;
  Waiting and Fenced partitions are paused. So after ``assigned`` and
  ``claimed`` a partition is never left paused unless flow control, the
  breaker or a retry wait says so.
* *FencedReclaimed*: after ``tick(now)``, no partition has been Fenced for
  ``fence_grace`` or longer, and no Waiting partition is past its due time.
* *CoreHoldsHeld*: :class:`Drop` and :class:`Claim` keep the set of partitions
  the core holds equal to those in :data:`HELD`.

Liveness (to be stated in TLA+; the tests check a bounded form): a partition
that the group assigns to a live member is eventually resumed and processed.
Assigned, it is claimed; a claim ends Claiming/Reclaiming in Active; a Fenced
partition that stays assigned is claimed again after ``fence_grace`` and a
Waiting one resumes at its due time, provided the runtime calls :meth:`tick`
every turn; and an Active partition is resumed when the last hold is lifted
(flow control lifts its hold when in-flight work drains, the breaker when it
stops being open, which its bounded backoff guarantees).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import icontract

from htmqc.core.contracts import ENABLED, keeps_invariant
from htmqc.core.decisions import TopicPartition
from htmqc.core.errors import IllegalTransition


class GateState(enum.Enum):
    """Where an assigned partition is (see module docs)."""

    UNASSIGNED = "Unassigned"
    CLAIMING = "Claiming"
    ACTIVE = "Active"
    WAITING = "Waiting"
    FENCED = "Fenced"
    RECLAIMING = "Reclaiming"
    DRAINING = "Draining"
    LEAVING = "Leaving"


class GateEvent(enum.Enum):
    """What can happen to a partition; values are the names used in traces."""

    ASSIGNED = "assigned"
    CLAIMED = "claimed"
    RETRY_WAIT = "retry_wait"
    RETRY_WAIT_OVER = "retry_wait_over"
    FENCED = "fenced"
    ROLLED_BACK = "rolled_back"
    FENCE_GRACE_OVER = "fence_grace_over"
    REVOKING = "revoking"
    REVOKED = "revoked"
    LOST = "lost"


class Hold(enum.Enum):
    """Consumer-wide reasons to pause every Active partition."""

    FLOW = "flow"
    BREAKER = "breaker"


G = GateState
V = GateEvent

#: ``TRANSITIONS[state][event] -> new state``; a missing entry is illegal.
TRANSITIONS: Final[Mapping[GateState, Mapping[GateEvent, GateState]]] = MappingProxyType(
    {
        G.UNASSIGNED: MappingProxyType({V.ASSIGNED: G.CLAIMING}),
        G.CLAIMING: MappingProxyType(
            {
                V.CLAIMED: G.ACTIVE,
                V.FENCED: G.CLAIMING,
                V.ROLLED_BACK: G.CLAIMING,
                V.REVOKING: G.LEAVING,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.ACTIVE: MappingProxyType(
            {
                V.ASSIGNED: G.CLAIMING,
                V.RETRY_WAIT: G.WAITING,
                V.FENCED: G.FENCED,
                V.ROLLED_BACK: G.RECLAIMING,
                V.REVOKING: G.DRAINING,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.WAITING: MappingProxyType(
            {
                V.ASSIGNED: G.CLAIMING,
                V.RETRY_WAIT: G.WAITING,
                V.RETRY_WAIT_OVER: G.ACTIVE,
                V.FENCED: G.FENCED,
                V.ROLLED_BACK: G.RECLAIMING,
                V.REVOKING: G.DRAINING,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.FENCED: MappingProxyType(
            {
                V.ASSIGNED: G.CLAIMING,
                V.FENCED: G.FENCED,
                V.ROLLED_BACK: G.FENCED,
                V.FENCE_GRACE_OVER: G.RECLAIMING,
                V.REVOKING: G.LEAVING,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.RECLAIMING: MappingProxyType(
            {
                V.CLAIMED: G.ACTIVE,
                V.FENCED: G.RECLAIMING,
                V.ROLLED_BACK: G.RECLAIMING,
                V.REVOKING: G.LEAVING,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.DRAINING: MappingProxyType(
            {
                V.FENCED: G.LEAVING,
                V.ROLLED_BACK: G.LEAVING,
                V.REVOKED: G.UNASSIGNED,
                V.LOST: G.UNASSIGNED,
            }
        ),
        G.LEAVING: MappingProxyType(
            {
                V.FENCED: G.LEAVING,
                V.ROLLED_BACK: G.LEAVING,
                V.REVOKED: G.UNASSIGNED,
                V.LOST: G.UNASSIGNED,
            }
        ),
    }
)

#: States in which the consumer core holds the partition (a tracker, work).
HELD: Final[frozenset[GateState]] = frozenset({G.ACTIVE, G.WAITING, G.DRAINING})
#: States whose entry asks the runtime for a claim.
CLAIMS: Final[frozenset[GateState]] = frozenset({G.CLAIMING, G.RECLAIMING})
#: Edges that rewind the partition: to the waiting record, or to the claimed position.
SEEKS: Final[frozenset[tuple[GateState, GateEvent]]] = frozenset(
    {(G.ACTIVE, V.RETRY_WAIT), (G.WAITING, V.RETRY_WAIT), (G.RECLAIMING, V.CLAIMED)}
)
#: States in which Kafka must hold the partition paused.
ALWAYS_PAUSED: Final[frozenset[GateState]] = frozenset({G.WAITING, G.FENCED})
#: States in which the partition is paused exactly while a :class:`Hold` is on.
FOLLOWS_HOLDS: Final[frozenset[GateState]] = frozenset({G.ACTIVE})
#: Events after which the gate no longer knows Kafka's pause (librdkafka keeps it).
FORGETS_PAUSE: Final[frozenset[GateEvent]] = frozenset({V.ASSIGNED})
#: States timed by :meth:`Gate.tick`, and the event the time brings.
TIMED: Final[Mapping[GateState, GateEvent]] = MappingProxyType(
    {G.FENCED: V.FENCE_GRACE_OVER, G.WAITING: V.RETRY_WAIT_OVER}
)


def _check_table() -> None:
    if set(TRANSITIONS) != set(GateState):
        raise AssertionError("every gate state needs a row")
    used = {event for row in TRANSITIONS.values() for event in row}
    if used != set(GateEvent):
        raise AssertionError(f"events with no edge: {set(GateEvent) - used}")
    for state, row in TRANSITIONS.items():
        if state is not G.UNASSIGNED and row.get(V.LOST) is not G.UNASSIGNED:
            raise AssertionError(f"the group can take a partition away in {state.value}")
    if ALWAYS_PAUSED & FOLLOWS_HOLDS:
        raise AssertionError("a state is paused always or with the holds, not both")
    if any(event not in TRANSITIONS[state] for state, event in SEEKS):
        raise AssertionError("a seeking edge is not in the table")
    if any(event not in TRANSITIONS[state] for state, event in TIMED.items()):
        raise AssertionError("a timed state cannot be left by its event")
    reached, frontier = {G.UNASSIGNED}, [G.UNASSIGNED]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    if reached != set(GateState):
        raise AssertionError(f"unreachable gate states: {set(GateState) - reached}")


_check_table()


# -- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Drop:
    """The core no longer holds ``tps``: forget their trackers (``core.revoked``)
    and drop their queued work and retry timers."""

    tps: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """Claim ``tps`` (their durable positions, a fresh fence) and report
    :meth:`Gate.claimed`."""

    tps: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """``consumer.pause(tps)``."""

    tps: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Seek:
    """``consumer.seek(tp @ offset)``."""

    tp: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume:
    """``consumer.resume(tps)``."""

    tps: tuple[TopicPartition, ...]


GateAction = Drop | Claim | Pause | Seek | Resume
"""What a gate method asks for, in the order the runtime must carry it out:
Drop, Claim, Pause, Seek, Resume."""


# -- the gate --------------------------------------------------------------------------


@dataclass(slots=True)
class _Part:
    state: GateState
    #: What Kafka was last told (True: paused); None: not known (after ``assigned``).
    paused: bool | None = None
    #: Fenced: when. Waiting: when the record is due.
    since: float | None = None
    until: float | None = None


def desired_pause(state: GateState, held: bool) -> bool | None:
    """Whether Kafka should hold a partition in ``state`` paused, when a
    consumer-wide hold is (``held``) or is not on; ``None``: leave it as it is."""
    if state in ALWAYS_PAUSED:
        return True
    if state in FOLLOWS_HOLDS:
        return held
    return None


def gate_invariant(gate: Gate) -> bool:
    """The gate's invariant (module docs: *NoStrayPause*, and the bookkeeping)."""
    held = bool(gate._holds)
    for tp, part in gate._parts.items():
        state = part.state
        if state is G.UNASSIGNED:
            return False
        if (part.since is not None) != (state is G.FENCED):
            return False
        if (part.until is not None) != (state is G.WAITING):
            return False
        if (tp in gate._timed) != (state in TIMED):
            return False
        want = desired_pause(state, held)
        if want is not None and part.paused is not want:
            return False
        if state is G.CLAIMING and part.paused is not None:
            return False
    return gate._timed <= gate._parts.keys()


_keeps_invariant = keeps_invariant(gate_invariant, "gate")


def _overdue(gate: Gate, now: float) -> bool:
    return any(
        (p.state is G.FENCED and p.since is not None and now - p.since >= gate.fence_grace)
        or (p.state is G.WAITING and p.until is not None and p.until <= now)
        for p in gate._parts.values()
    )


class Gate:
    """Every assigned partition's gate state (see module docs).

    ``fence_grace``: seconds a Fenced partition that the group still assigns
    stays paused before it is claimed again (the session timeout: by then the
    group has evicted a real zombie).
    """

    def __init__(self, fence_grace: float) -> None:
        if fence_grace < 0:
            raise ValueError(f"fence_grace must be >= 0, got {fence_grace}")
        self.fence_grace = fence_grace
        self._parts: dict[TopicPartition, _Part] = {}
        self._holds: set[Hold] = set()
        #: Partitions in a TIMED state, so that tick looks at them only.
        self._timed: set[TopicPartition] = set()

    # -- views ---------------------------------------------------------------------------

    def state(self, tp: TopicPartition) -> GateState:
        """The gate state of ``tp`` (Unassigned if the group did not give it to us)."""
        part = self._parts.get(tp)
        return part.state if part is not None else G.UNASSIGNED

    def fetching(self, tp: TopicPartition) -> bool:
        """Whether messages fetched for ``tp`` may go to the core (it is Active)."""
        part = self._parts.get(tp)
        return part is not None and part.state is G.ACTIVE

    def partitions(self) -> set[TopicPartition]:
        """Every partition the group gave us (in any state)."""
        return set(self._parts)

    def paused(self) -> set[TopicPartition]:
        """Partitions Kafka was last told to pause."""
        return {tp for tp, part in self._parts.items() if part.paused}

    @property
    def holds(self) -> frozenset[Hold]:
        """The consumer-wide holds that are on."""
        return frozenset(self._holds)

    def snapshot(self) -> dict[str, Any]:
        """Plain data for the state page: holds, and each partition's state."""
        return {
            "holds": sorted(h.value for h in self._holds),
            "partitions": {
                f"{t}/{p}": {
                    "state": part.state.value,
                    "paused": part.paused,
                    "since": part.since,
                    "until": part.until,
                }
                for (t, p), part in sorted(self._parts.items())
            },
        }

    # -- events --------------------------------------------------------------------------

    @icontract.ensure(
        lambda self, tps: all(self._parts[tp].state is G.CLAIMING for tp in tps),
        "an assigned partition waits for its claim",
        enabled=ENABLED,
    )
    @_keeps_invariant
    def assigned(self, tps: Iterable[TopicPartition]) -> list[GateAction]:
        """The group gave us ``tps``: Claim them (Drop first those the core held).

        :raises IllegalTransition: a partition is being claimed or revoked.
        """
        return self._move([(tp, V.ASSIGNED, None) for tp in tps])

    @icontract.ensure(
        lambda self, positions: all(self._parts[tp].state is G.ACTIVE for tp in positions),
        "a claimed partition is Active",
        enabled=ENABLED,
    )
    @_keeps_invariant
    def claimed(self, positions: Mapping[TopicPartition, int]) -> list[GateAction]:
        """The claims of ``positions`` (``tp -> committed``) are done: the core holds
        them. Seek a reclaimed partition to its position; Pause or Resume each.

        :raises IllegalTransition: a partition was not being claimed.
        """
        return self._move([(tp, V.CLAIMED, offset) for tp, offset in positions.items()])

    @_keeps_invariant
    def retry_wait(self, tp: TopicPartition, offset: int, until: float) -> list[GateAction]:
        """The retry-topic record at ``offset`` of ``tp`` is due at ``until``: Pause
        and Seek back to it; :meth:`tick` resumes the partition then.

        :raises IllegalTransition: ``tp`` is not Active or Waiting.
        """
        return self._move([(tp, V.RETRY_WAIT, offset)], until=until)

    @_keeps_invariant
    def rolled_back(self, stale: Iterable[TopicPartition], now: float) -> list[GateAction]:
        """The sink rolled the transaction back: the core's state of every partition
        is gone (Drop). Those in ``stale`` were fenced (Pause them, from ``now``);
        the others are still ours (Claim them again). Partitions already Fenced keep
        their time; stale partitions we were not given are ignored."""
        fenced = set(stale)
        return self._move(
            [(tp, V.FENCED if tp in fenced else V.ROLLED_BACK, None) for tp in self._parts],
            since=now,
        )

    @icontract.ensure(
        lambda self, now: not _overdue(self, now),
        "FencedReclaimed: nothing stays fenced past the grace or waits past its time",
        enabled=ENABLED,
    )
    @_keeps_invariant
    def tick(self, now: float) -> list[GateAction]:
        """Time passed: Claim again partitions Fenced for ``fence_grace`` or longer
        (still assigned, so the group did not take them away); Resume Waiting
        partitions whose record is due."""
        if not self._timed:
            return []
        moves: list[tuple[TopicPartition, GateEvent, int | None]] = []
        for tp in self._timed:
            part = self._parts[tp]
            if part.state is G.FENCED:
                assert part.since is not None
                if now - part.since >= self.fence_grace:
                    moves.append((tp, TIMED[G.FENCED], None))
            elif part.until is not None and part.until <= now:
                moves.append((tp, TIMED[G.WAITING], None))
        return self._move(moves) if moves else []

    @_keeps_invariant
    def revoking(self, tps: Iterable[TopicPartition]) -> list[GateAction]:
        """The group is taking ``tps`` back: nothing new starts on them.

        :raises IllegalTransition: a partition is not assigned or already leaving.
        """
        return self._move([(tp, V.REVOKING, None) for tp in tps])

    @icontract.ensure(lambda self, tps: not self._parts.keys() & set(tps), enabled=ENABLED)
    @_keeps_invariant
    def revoked(self, tps: Iterable[TopicPartition]) -> list[GateAction]:
        """``tps`` are gone after :meth:`revoking` (make the final commit first).

        :raises IllegalTransition: a partition was not being revoked.
        """
        return self._move([(tp, V.REVOKED, None) for tp in tps])

    @icontract.ensure(lambda self, tps: not self._parts.keys() & set(tps), enabled=ENABLED)
    @_keeps_invariant
    def lost(self, tps: Iterable[TopicPartition]) -> list[GateAction]:
        """``tps`` are already someone else's; partitions we did not have are ignored."""
        return self._move([(tp, V.LOST, None) for tp in tps if tp in self._parts])

    @icontract.ensure(lambda self, reason: reason in self._holds, enabled=ENABLED)
    @_keeps_invariant
    def hold(self, reason: Hold) -> list[GateAction]:
        """A consumer-wide hold is on (flow control, the breaker): Pause every Active
        partition."""
        self._holds.add(reason)
        return self._sync(list(self._parts))

    @icontract.ensure(lambda self, reason: reason not in self._holds, enabled=ENABLED)
    @_keeps_invariant
    def unhold(self, reason: Hold) -> list[GateAction]:
        """A hold is off: Resume the Active partitions once no hold is left (never a
        Waiting or Fenced one)."""
        self._holds.discard(reason)
        return self._sync(list(self._parts))

    # -- the one place that moves partitions ---------------------------------------------

    def _move(
        self,
        moves: list[tuple[TopicPartition, GateEvent, int | None]],
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> list[GateAction]:
        """Apply ``(tp, event, offset)`` moves, all or none; return the actions.
        A partition named twice moves once."""
        parts = self._parts
        first: dict[TopicPartition, tuple[TopicPartition, GateEvent, int | None]] = {}
        for move in moves:
            first.setdefault(move[0], move)
        moves = list(first.values())
        for tp, event, _ in moves:
            state = self.state(tp)
            if event not in TRANSITIONS[state]:
                raise IllegalTransition(
                    f"gate: can't handle {event.value} when {tp[0]}/{tp[1]} is {state.value}"
                )
        drops: list[TopicPartition] = []
        claims: list[TopicPartition] = []
        seeks: list[Seek] = []
        for tp, event, offset in moves:
            part = parts.get(tp) or _Part(G.UNASSIGNED)
            source = part.state
            target = TRANSITIONS[source][event]
            if source in HELD and target not in HELD:
                drops.append(tp)
            if target in CLAIMS and source not in CLAIMS:
                claims.append(tp)
            if (source, event) in SEEKS:
                assert offset is not None
                seeks.append(Seek(tp=tp, offset=offset))
            if event in FORGETS_PAUSE:
                part.paused = None
            part.state = target
            if target is not G.FENCED:
                part.since = None
            elif source is not G.FENCED:
                part.since = since
            part.until = until if target is G.WAITING else None
            if target is G.UNASSIGNED:
                parts.pop(tp, None)
                self._timed.discard(tp)
                continue
            parts[tp] = part
            if target in TIMED:
                self._timed.add(tp)
            else:
                self._timed.discard(tp)
        actions: list[GateAction] = []
        if drops:
            actions.append(Drop(tps=tuple(drops)))
        if claims:
            actions.append(Claim(tps=tuple(claims)))
        return self._sync([tp for tp, _, _ in moves], actions, seeks)

    def _sync(
        self,
        tps: list[TopicPartition],
        actions: list[GateAction] | None = None,
        seeks: list[Seek] | None = None,
    ) -> list[GateAction]:
        """Bring Kafka's pause of ``tps`` in line with their states and the holds."""
        out = actions if actions is not None else []
        held = bool(self._holds)
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        for tp in dict.fromkeys(tps):
            part = self._parts.get(tp)
            if part is None:
                continue
            want = desired_pause(part.state, held)
            if want is None or part.paused is want:
                continue
            (pause if want else resume).append(tp)
            part.paused = want
        if pause:
            out.append(Pause(tps=tuple(pause)))
        if seeks:
            out.extend(seeks)
        if resume:
            out.append(Resume(tps=tuple(resume)))
        return out
