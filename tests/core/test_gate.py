"""The partition gate: its table edge by edge, and against a naive model.

The table-driven tests are generated from :data:`htmqc.core.gate.TRANSITIONS`:
every (state, event) pair is tried, legal or not. The Hypothesis state
machine drives the gate and ``model_checks/reference_gate.py`` with the same
events, carries the actions out on a fake Kafka consumer that keeps a
partition's pause across unassign and assign (as librdkafka does) and a fake
core, and checks the properties the gate promises; its ``settle`` rule is a
bounded form of the liveness property. Mutants of the two bugs fixed in the
runtime's gate (3bdd90a, 44915de) and of the flow resume are kept below: each
must make the machine fail.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from htmqc.core import IllegalTransition, gate
from htmqc.core.gate import (
    ALWAYS_PAUSED,
    CLAIMS,
    HELD,
    SEEKS,
    TRANSITIONS,
    Claim,
    Drop,
    Gate,
    GateAction,
    GateEvent,
    GateState,
    Hold,
    Pause,
    Resume,
    Seek,
    gate_invariant,
)
from model_checks.reference_gate import RefGate, RefGateError
from tests.core.mutants.stateful import assert_rejected
from tests.core.tables import row_edit, shortest_paths, with_entry, without

G, V = GateState, GateEvent
TP = ("t", 0)
GRACE = 10.0
ORDER = (Drop, Claim, Pause, Seek, Resume)


def effects(actions: list[GateAction]) -> set[tuple[object, ...]]:
    """Actions as the reference model's effect tuples."""
    out: set[tuple[object, ...]] = set()
    for action in actions:
        if isinstance(action, Seek):
            out.add(("seek", action.tp, action.offset))
        else:
            out.update((type(action).__name__.lower(), tp) for tp in action.tps)
    return out


def in_order(actions: list[GateAction]) -> bool:
    ranks = [ORDER.index(type(a)) for a in actions]
    return ranks == sorted(ranks)


# -- table-driven: every (state, event) pair ---------------------------------------------------

# How a test makes each event happen to TP at time `now` (events that time or a
# rollback bring are never refused: where the table has no edge, nothing moves).
# Time events tick at TP's own due time if it has one, else at `now`, when
# nothing is due (each step of a path is 1 s after the last; waits are 5 s).


def _stamp(gate: Gate, key: str) -> float | None:
    part = gate.snapshot()["partitions"].get(f"{TP[0]}/{TP[1]}", {})
    value: float | None = part.get(key)
    return value


def _tick_at(key: str, after: float) -> Callable[[Gate, float], list[GateAction]]:
    def drive(gate: Gate, now: float) -> list[GateAction]:
        stamp = _stamp(gate, key)
        return gate.tick(now if stamp is None else stamp + after)

    return drive


DRIVE: dict[GateEvent, Callable[[Gate, float], list[GateAction]]] = {
    V.ASSIGNED: lambda g, now: g.assigned([TP]),
    V.CLAIMED: lambda g, now: g.claimed({TP: 42}),
    V.RETRY_WAIT: lambda g, now: g.retry_wait(TP, 17, now + 5.0),
    V.RETRY_WAIT_OVER: _tick_at("until", 0.0),
    V.FENCED: lambda g, now: g.rolled_back([TP], now),
    V.ROLLED_BACK: lambda g, now: g.rolled_back([], now),
    V.FENCE_GRACE_OVER: _tick_at("since", GRACE),
    V.REVOKING: lambda g, now: g.revoking([TP]),
    V.REVOKED: lambda g, now: g.revoked([TP]),
    V.LOST: lambda g, now: g.lost([TP]),
}
NEVER_REFUSED = {V.RETRY_WAIT_OVER, V.FENCED, V.ROLLED_BACK, V.FENCE_GRACE_OVER, V.LOST}


def gate_in(state: GateState) -> tuple[Gate, float]:
    gate, now = Gate(fence_grace=GRACE), 0.0
    for event in shortest_paths(TRANSITIONS, G.UNASSIGNED)[state]:
        DRIVE[event](gate, now)
        now += 1.0
    assert gate.state(TP) is state
    return gate, now


def _part(gate: Gate) -> Any:
    return gate._parts[TP]


@pytest.mark.parametrize("state", list(GateState))
def test_the_invariant_holds_in_every_reachable_state(state: GateState) -> None:
    gate, _ = gate_in(state)
    assert gate_invariant(gate)
    gate.hold(Hold.FLOW)
    assert gate_invariant(gate)


#: One field out of line each, the rest as reached (each conjunct on its own; both
#: sides of each equivalence).
INVARIANT_BREAKS: dict[str, tuple[GateState, Callable[[Gate], object]]] = {
    "unassigned-kept": (G.ACTIVE, lambda g: setattr(_part(g), "state", G.UNASSIGNED)),
    "since-not-fenced": (G.ACTIVE, lambda g: setattr(_part(g), "since", 5.0)),
    "fenced-no-since": (G.FENCED, lambda g: setattr(_part(g), "since", None)),
    "until-not-waiting": (G.ACTIVE, lambda g: setattr(_part(g), "until", 5.0)),
    "waiting-no-until": (G.WAITING, lambda g: setattr(_part(g), "until", None)),
    "timed-not-timed-state": (G.ACTIVE, lambda g: g._timed.add(TP)),
    "timed-state-not-timed": (G.FENCED, lambda g: g._timed.discard(TP)),
    "waiting-not-paused": (G.WAITING, lambda g: setattr(_part(g), "paused", False)),
    "active-paused-no-hold": (G.ACTIVE, lambda g: setattr(_part(g), "paused", True)),
    "claiming-pause-known": (G.CLAIMING, lambda g: setattr(_part(g), "paused", False)),
    "timed-unknown-partition": (G.ACTIVE, lambda g: g._timed.add(("t", 9))),
}


@pytest.mark.parametrize("broken", sorted(INVARIANT_BREAKS))
def test_the_invariant_refuses_each_broken_field(broken: str) -> None:
    state, corrupt = INVARIANT_BREAKS[broken]
    gate, _ = gate_in(state)
    corrupt(gate)
    assert not gate_invariant(gate)


def test_tick_postcondition_says_overdue_exactly_from_the_grace_and_the_due_time() -> None:
    """``tick``'s postcondition (*FencedReclaimed*) looks for a partition Fenced for
    ``fence_grace`` or longer, or Waiting at or past its due time: exact at both
    edges, each state on its own (``tick`` itself never leaves one, so only this
    shows the check would see it)."""
    overdue = gate._overdue
    fenced, _ = gate_in(G.FENCED)
    _part(fenced).since = 100.0
    assert not overdue(fenced, 100.0 + GRACE - 0.5)
    assert overdue(fenced, 100.0 + GRACE) and overdue(fenced, 100.0 + GRACE + 0.5)
    waiting, _ = gate_in(G.WAITING)
    _part(waiting).until = 100.0
    assert not overdue(waiting, 99.5)
    assert overdue(waiting, 100.0) and overdue(waiting, 100.5)
    active, _ = gate_in(G.ACTIVE)  # neither timer applies to another state
    assert not overdue(active, 1e9)


@pytest.mark.parametrize("state", list(GateState))
def test_only_an_active_partition_is_fetched(state: GateState) -> None:
    gate, _ = gate_in(state)
    assert gate.fetching(TP) is (state is G.ACTIVE)
    assert not gate.fetching(("t", 9))  # a partition the gate does not hold


def test_a_refused_event_names_the_event_the_partition_and_its_state() -> None:
    gate, _ = gate_in(G.ACTIVE)
    with pytest.raises(IllegalTransition) as refused:
        gate.claimed({TP: 42})
    assert str(refused.value) == f"gate: can't handle {V.CLAIMED.value} when t/0 is Active"


def test_the_fence_grace_may_be_zero_never_negative() -> None:
    assert Gate(fence_grace=0.0).fence_grace == 0.0
    assert Gate(fence_grace=0.5).fence_grace == 0.5
    for bad in (-0.5, -2.0):
        with pytest.raises(ValueError, match=f"fence_grace must be >= 0, got {bad}"):
            Gate(fence_grace=bad)


def test_every_event_has_a_driver_and_every_state_a_path() -> None:
    assert set(DRIVE) == set(GateEvent)
    for state in GateState:
        gate_in(state)


@pytest.mark.parametrize("source", list(GateState))
@pytest.mark.parametrize("event", list(GateEvent))
def test_the_gate_follows_exactly_the_tables_edges(source: GateState, event: GateEvent) -> None:
    gate, now = gate_in(source)
    before = gate.snapshot()
    target = TRANSITIONS[source].get(event)
    if target is None:
        if event in NEVER_REFUSED:
            assert DRIVE[event](gate, now) == [] and gate.snapshot() == before
        else:
            with pytest.raises(IllegalTransition, match=event.value):
                DRIVE[event](gate, now)
            assert gate.snapshot() == before
        return
    actions = DRIVE[event](gate, now)
    assert gate.state(TP) is target
    got = effects(actions)
    assert (("drop", TP) in got) == (source in HELD and target not in HELD)
    assert (("claim", TP) in got) == (target in CLAIMS and source not in CLAIMS)
    assert any(e[0] == "seek" for e in got) == ((source, event) in SEEKS)
    assert in_order(actions)
    if target in ALWAYS_PAUSED:
        assert TP in gate.paused()


def test_a_partition_assigned_back_after_being_fenced_is_resumed() -> None:
    """44915de: librdkafka kept the pause of a fenced partition across assignments."""
    gate = Gate(fence_grace=GRACE)
    gate.assigned([TP])
    gate.claimed({TP: 0})
    assert gate.rolled_back([TP], 1.0) == [Drop(tps=(TP,)), Pause(tps=(TP,))]
    gate.lost([TP])
    assert gate.assigned([TP]) == [Claim(tps=(TP,))]
    assert gate.claimed({TP: 5}) == [Resume(tps=(TP,))]


def test_a_fenced_partition_still_assigned_after_the_grace_is_claimed_again() -> None:
    """3bdd90a: a racing claim left a partition paused for ever."""
    gate = Gate(fence_grace=GRACE)
    gate.assigned([TP])
    gate.claimed({TP: 0})
    gate.rolled_back([TP], 100.0)
    assert gate.tick(100.0 + GRACE - 0.5) == []
    assert gate.tick(100.0 + GRACE) == [Claim(tps=(TP,))]
    assert gate.claimed({TP: 3}) == [Seek(tp=TP, offset=3), Resume(tps=(TP,))]
    assert gate.state(TP) is G.ACTIVE and not gate.paused()


def test_flow_control_never_resumes_a_waiting_or_fenced_partition() -> None:
    gate = Gate(fence_grace=GRACE)
    a, b, c = ("t", 0), ("t", 1), ("t.retry", 0)
    gate.assigned([a, b, c])
    gate.claimed({a: 0, b: 0, c: 0})
    gate.retry_wait(c, 4, 50.0)
    gate.rolled_back([b], 1.0)
    gate.claimed({a: 0})
    assert gate.hold(Hold.FLOW) == [Pause(tps=(a,))]
    assert gate.unhold(Hold.FLOW) == [Resume(tps=(a,))]
    assert gate.paused() == {b, c}


# -- the gate against the naive model ----------------------------------------------------------

TPS = [("t", 0), ("t", 1), ("t.retry", 0)]
tp_lists = st.lists(st.sampled_from(TPS), max_size=3)
holds = st.sampled_from(Hold)


class FakeKafka:
    """What a consumer was told: pauses survive unassign and assign (librdkafka)."""

    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()
        self.positions: dict[tuple[str, int], int] = {}


class GateVersusReference(RuleBasedStateMachine):
    """The gate and the naive model side by side (see module docstring)."""

    gate_class: type[Gate] = Gate

    @initialize()
    def setup(self) -> None:
        self.gate = self.gate_class(fence_grace=GRACE)
        self.ref = RefGate(fence_grace=GRACE)
        self.kafka = FakeKafka()
        self.core: set[tuple[str, int]] = set()  # partitions the fake core holds
        self.claims: set[tuple[str, int]] = set()  # claims asked for, not reported yet
        self.now = 0.0

    def both(self, call: Callable[[Any], Any]) -> list[GateAction] | None:
        """One event on both; they accept or refuse it together and agree on effects."""
        try:
            actions = call(self.gate)
        except IllegalTransition:
            actions = None
        try:
            expected = call(self.ref)
        except RefGateError:
            expected = None
        assert (actions is None) == (expected is None), (actions, expected)
        if actions is None:
            return None
        assert isinstance(actions, list)
        assert effects(actions) == expected
        assert in_order(actions)
        self.carry_out(actions)
        return actions

    def carry_out(self, actions: list[GateAction]) -> None:
        for action in actions:
            if isinstance(action, Drop):
                self.core -= set(action.tps)
            elif isinstance(action, Claim):
                self.claims |= set(action.tps)
            elif isinstance(action, Pause):
                self.kafka.paused |= set(action.tps)
            elif isinstance(action, Resume):
                self.kafka.paused -= set(action.tps)
            else:
                self.kafka.positions[action.tp] = action.offset

    def claiming(self) -> list[tuple[str, int]]:
        return sorted(tp for tp in self.claims if self.gate.state(tp) in CLAIMS)

    def report_claims(self, tps: list[tuple[str, int]]) -> None:
        positions = {tp: len(self.kafka.positions) for tp in tps}
        if self.both(lambda g: g.claimed(positions)) is not None:
            self.core |= set(tps)
            self.claims -= set(tps)

    # -- rules ---------------------------------------------------------------------------

    @rule(tps=tp_lists)
    def assign(self, tps: list[tuple[str, int]]) -> None:
        self.both(lambda g: g.assigned(tps))

    @rule(data=st.data(), any_tps=tp_lists, legal=st.integers(0, 3))
    def claim_done(self, data: st.DataObject, any_tps: list[tuple[str, int]], legal: int) -> None:
        pending = self.claiming()
        if legal and pending:
            tps = data.draw(st.lists(st.sampled_from(pending), min_size=1, unique=True))
        else:
            tps = any_tps
        self.report_claims(list(dict.fromkeys(tps)))

    @rule(tp=st.sampled_from(TPS), offset=st.integers(0, 9), wait=st.floats(0, 30))
    def retry_wait(self, tp: tuple[str, int], offset: int, wait: float) -> None:
        self.both(lambda g: g.retry_wait(tp, offset, self.now + wait))

    @rule(stale=tp_lists)
    def rolled_back(self, stale: list[tuple[str, int]]) -> None:
        self.both(lambda g: g.rolled_back(stale, self.now))

    @rule(dt=st.floats(0, 2 * GRACE))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.both(lambda g: g.tick(self.now))

    @rule(tps=tp_lists)
    def revoking(self, tps: list[tuple[str, int]]) -> None:
        self.both(lambda g: g.revoking(tps))

    @rule(tps=tp_lists)
    def revoked(self, tps: list[tuple[str, int]]) -> None:
        self.both(lambda g: g.revoked(tps))
        self.claims -= set(tps) - self.gate.partitions()

    @rule(tps=tp_lists)
    def lost(self, tps: list[tuple[str, int]]) -> None:
        self.both(lambda g: g.lost(tps))
        self.claims -= set(tps)

    @rule(reason=holds, on=st.booleans())
    def hold(self, reason: Hold, on: bool) -> None:
        if on:
            self.both(lambda g: g.hold(reason))
        else:
            self.both(lambda g: g.unhold(reason))

    @rule()
    def settle(self) -> None:
        """Bounded liveness: lift the holds, let the grace and every wait pass,
        carry out the claims: every partition not being revoked is Active,
        the core holds it and Kafka fetches it."""
        for reason in Hold:
            self.hold(reason, on=False)
        for _ in range(2):
            self.time_passes(2 * GRACE + 30.0)
            self.report_claims(self.claiming())
        for tp in self.gate.partitions():
            if self.gate.state(tp) not in (G.DRAINING, G.LEAVING):
                assert self.gate.state(tp) is G.ACTIVE, tp
                assert tp not in self.kafka.paused and tp in self.core, tp

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def SameState(self) -> None:
        assert {tp: self.gate.state(tp).value for tp in self.gate.partitions()} == self.ref.state
        assert self.gate.holds == self.ref.holds
        snap = self.gate.snapshot()["partitions"]
        assert {k: v["since"] for k, v in snap.items() if v["since"] is not None} == {
            f"{t}/{p}": s for (t, p), s in self.ref.since.items()
        }
        assert {k: v["until"] for k, v in snap.items() if v["until"] is not None} == {
            f"{t}/{p}": u for (t, p), u in self.ref.until.items()
        }

    @invariant()
    def NoStrayPause(self) -> None:
        held = bool(self.gate.holds)
        for tp in self.gate.partitions():
            state = self.gate.state(tp)
            if state is G.ACTIVE:
                assert (tp in self.kafka.paused) == held, (tp, state)
            elif state in ALWAYS_PAUSED:
                assert tp in self.kafka.paused, (tp, state)

    @invariant()
    def CoreHoldsHeld(self) -> None:
        assert self.core == {tp for tp in self.gate.partitions() if self.gate.state(tp) in HELD}

    @invariant()
    def FencedReclaimed(self) -> None:
        for tp in self.gate.partitions():
            if self.gate.state(tp) is G.FENCED:
                assert self.now - self.ref.since[tp] < GRACE


TestGateVersusReference = pytest.mark.formal(GateVersusReference.TestCase)


# -- mutants: each must make the machine fail ----------------------------------------------------


class NeverReclaims(Gate):
    """A fenced partition is never claimed again (the stall 3bdd90a fixed)."""

    def __init__(self, fence_grace: float) -> None:
        super().__init__(fence_grace=math.inf)


class KeepsPauseAcrossAssignments(Gate):
    """Assumes a newly assigned partition is not paused (the bug 44915de fixed)."""

    def claimed(self, positions: Any) -> list[GateAction]:
        for tp in positions:
            part = self._parts.get(tp)
            if part is not None and part.paused is None:
                part.paused = False
        return super().claimed(positions)


class FlowResumesWaiting(Gate):
    """Lifting flow control resumes every partition, waiting ones too."""

    def unhold(self, reason: Hold) -> list[GateAction]:
        actions = super().unhold(reason)
        waiting = tuple(tp for tp in self._parts if self._parts[tp].state is G.WAITING)
        return [*actions, Resume(tps=waiting)] if waiting and not self._holds else actions


@pytest.mark.formal
@pytest.mark.parametrize("mutant", [NeverReclaims, KeepsPauseAcrossAssignments, FlowResumesWaiting])
def test_the_model_comparison_catches_the_mutant(mutant: type[Gate]) -> None:
    assert_rejected(GateVersusReference, gate_class=mutant)


# -- the import-time table guard ---------------------------------------------

#: Each way to break the gate's tables (each caught by its own check).
GATE_BREAKS: dict[str, dict[str, Any]] = {
    "a state without a row": {"TRANSITIONS": without(gate.TRANSITIONS, G.FENCED)},
    "a row for no state": {"TRANSITIONS": with_entry(gate.TRANSITIONS, "Extra", {})},
    "an event with no edge": {
        "TRANSITIONS": MappingProxyType({
            s: without(row, V.FENCE_GRACE_OVER) for s, row in gate.TRANSITIONS.items()
        }),
    },
    "an edge on no event, and an event with no edge": {
        "TRANSITIONS": MappingProxyType({
            s: with_entry(without(row, V.FENCE_GRACE_OVER), "NoEvent", s)
            for s, row in gate.TRANSITIONS.items()
        }),
    },
    "a state the group cannot take a partition from": {
        "TRANSITIONS": row_edit(gate.TRANSITIONS, G.ACTIVE, lambda row: without(row, V.LOST)),
    },
    "lost leading elsewhere than unassigned": {
        "TRANSITIONS": row_edit(gate.TRANSITIONS, G.ACTIVE,
                                 lambda row: with_entry(row, V.LOST, G.FENCED)),
    },
    "paused always and with the holds": {"FOLLOWS_HOLDS": frozenset({G.ACTIVE, G.FENCED})},
    "a seeking edge not in the table": {
        "SEEKS": frozenset({*gate.SEEKS, (G.UNASSIGNED, V.RETRY_WAIT)}),
    },
    "a timed state its event cannot leave": {
        "TIMED": MappingProxyType({**gate.TIMED, G.ACTIVE: V.FENCE_GRACE_OVER}),
    },
    "an unreachable state": {
        "TRANSITIONS": MappingProxyType({
            s: MappingProxyType({e: (G.ACTIVE if t is G.WAITING else t) for e, t in row.items()})
            for s, row in gate.TRANSITIONS.items()
        }),
    },
}  # fmt: skip
GATE_SAYS = {
    "a state without a row": "every gate state needs a row",
    "a row for no state": "every gate state needs a row",
    # exactly the events without an edge: not the edges' own events, nor theirs and others
    "an event with no edge": re.escape(f"events with no edge: { {V.FENCE_GRACE_OVER} }") + "$",
    "an edge on no event, and an event with no edge":
        re.escape(f"events with no edge: { {V.FENCE_GRACE_OVER} }") + "$",
    "a state the group cannot take a partition from": "can take a partition away",
    "lost leading elsewhere than unassigned": "can take a partition away",
    "paused always and with the holds": "paused always or with the holds",
    "a seeking edge not in the table": "a seeking edge",
    "a timed state its event cannot leave": "a timed state cannot be left",
    "an unreachable state": re.escape(f"unreachable gate states: { {G.WAITING} }") + "$",
}


@pytest.mark.parametrize("broken", sorted(GATE_BREAKS))
def test_the_gate_guard_refuses_a_broken_table(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import-time guard refuses each way to break the tables, by its own
    check's message (the shipped tables pass: the module imported)."""
    for name, value in GATE_BREAKS[broken].items():
        monkeypatch.setattr(gate, name, value)
    with pytest.raises(AssertionError, match=GATE_SAYS[broken]):
        gate._check_table()
