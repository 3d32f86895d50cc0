"""The partition gate keeps Kafka's pause where its state says, and never stalls.

One partition of :class:`htmqc.core.gate.Gate`, with what Kafka's own pause
flag is (librdkafka keeps it across unassign and assign), as Z3 terms:
``state`` (a :class:`~htmqc.core.gate.GateState`), ``told`` (what the gate last
told Kafka: ``unknown``, ``paused``, ``resumed``; the gate's ``_Part.paused``
``None``/``True``/``False``), ``kafka`` (the flag) and ``held`` (a
consumer-wide :class:`~htmqc.core.gate.Hold` is on).

The transitions are read from the code's tables, as the runtime sees them:
``TRANSITIONS`` moves the state; ``FORGETS_PAUSE`` makes the gate forget what it
told; ``ALWAYS_PAUSED`` and ``FOLLOWS_HOLDS`` say what it wants Kafka to hold,
and a Pause or Resume is emitted (and carried out) exactly when that differs
from what it told (``Gate._sync``). ``hold``/``unhold`` flip ``held`` and sync.
Leaving for Unassigned forgets the partition; Kafka's flag stays.

The properties are restated from the spec (``NoStrayPause`` and ``ToldTruth``
of ``tla/Consumer.tla``, the gate's module docs), not read from the code:

* ``Inv``: what the gate told is Kafka's flag; Waiting and Fenced partitions
  are told paused; an Active one is told paused exactly while a hold is on;
  a partition being claimed, or not assigned, is told nothing.
* ``gate:progress``: from Claiming, Reclaiming, Waiting and Fenced an event the
  gate takes by itself (``claimed`` once the runtime's claim is done,
  ``fence_grace_over`` and ``retry_wait_over`` from ``tick``) leads closer to
  Active (a ranking). With ``Inv``, an Active partition with no hold on is
  resumed: the TLA+ property ``AssignedResumed``, reduced to one step.

Mutants (each a changed table): a fenced partition never reclaimed (3bdd90a),
a new assignment taken for resumed (44915de), Waiting not paused.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import z3

from htmqc.core import gate as code
from htmqc.core.gate import GateEvent, GateState
from proofs.obligation import Obligation

G, V = GateState, GateEvent
STATE, STATES = z3.EnumSort("GateState", [s.value for s in GateState])
TOLD, (UNKNOWN, PAUSED, RESUMED) = z3.EnumSort("Told", ["unknown", "paused", "resumed"])
#: The events the gate takes without the group (the runtime's claim, tick).
INTERNAL = (V.CLAIMED, V.FENCE_GRACE_OVER, V.RETRY_WAIT_OVER)
#: Distance to Active along INTERNAL events (the progress ranking).
RANK = {G.ACTIVE: 0, G.CLAIMING: 1, G.RECLAIMING: 1, G.WAITING: 1, G.FENCED: 2}


def _s(state: GateState) -> z3.ExprRef:
    return STATES[list(GateState).index(state)]


@dataclass(frozen=True)
class Tables:
    """The code's tables the transitions are read from (a mutant changes one)."""

    transitions: Mapping[GateState, Mapping[GateEvent, GateState]]
    always_paused: frozenset[GateState]
    follows_holds: frozenset[GateState]
    forgets_pause: frozenset[GateEvent]
    #: What the gate believes after an event of ``forgets_pause``.
    forgotten: z3.ExprRef = UNKNOWN


CODE = Tables(code.TRANSITIONS, code.ALWAYS_PAUSED, code.FOLLOWS_HOLDS, code.FORGETS_PAUSE)


@dataclass(frozen=True)
class Part:
    """One partition's gate state and Kafka's flag."""

    state: z3.ExprRef
    told: z3.ExprRef
    kafka: z3.BoolRef
    held: z3.BoolRef


def _fresh(tag: str = "") -> Part:
    return Part(
        z3.Const(f"state{tag}", STATE), z3.Const(f"told{tag}", TOLD),
        z3.Bool(f"kafka{tag}"), z3.Bool(f"held{tag}"),
    )


def _in(x: z3.ExprRef, states: frozenset[GateState] | set[GateState]) -> z3.BoolRef:
    return z3.Or([x == _s(s) for s in states]) if states else z3.BoolVal(False)


def _want(t: Tables, state: z3.ExprRef, held: z3.BoolRef) -> tuple[z3.BoolRef, z3.ExprRef]:
    """Whether the gate wants a word with Kafka in ``state``, and which."""
    always, follows = _in(state, t.always_paused), _in(state, t.follows_holds)
    return z3.Or(always, follows), z3.If(z3.Or(always, held), PAUSED, RESUMED)


def _sync(t: Tables, p: Part, state: z3.ExprRef, told: z3.ExprRef) -> Part:
    """``Gate._sync`` after the move to ``state`` (told ``told``), carried out."""
    wants, word = _want(t, state, p.held)
    emit = z3.And(wants, told != word)
    gone = state == _s(G.UNASSIGNED)
    return Part(
        state,
        z3.If(gone, UNKNOWN, z3.If(emit, word, told)),
        z3.If(emit, word == PAUSED, p.kafka),
        p.held,
    )


def step(t: Tables, p: Part, event: GateEvent) -> tuple[z3.BoolRef, Part]:
    """``event`` on ``p``: whether the table has an edge for its state, and after."""
    row = [(s, targets[event]) for s, targets in t.transitions.items() if event in targets]
    allowed = z3.Or([p.state == _s(s) for s, _ in row]) if row else z3.BoolVal(False)
    target: z3.ExprRef = _s(G.UNASSIGNED)
    for s, to in row:
        target = z3.If(p.state == _s(s), _s(to), target)
    told = t.forgotten if event in t.forgets_pause else p.told
    return allowed, _sync(t, p, target, told)


def _holds(t: Tables, p: Part, on: bool) -> Part:
    """``hold`` / ``unhold`` (the last hold off), as this partition sees it."""
    moved = Part(p.state, p.told, p.kafka, z3.BoolVal(on))
    return _sync(t, moved, p.state, p.told)


def inv(p: Part) -> z3.BoolRef:
    """NoStrayPause and ToldTruth, with the told word (see module docs)."""
    st = p.state
    return z3.And(
        z3.Implies(p.told != UNKNOWN, (p.told == PAUSED) == p.kafka),
        z3.Implies(z3.Or(st == _s(G.WAITING), st == _s(G.FENCED)), p.told == PAUSED),
        z3.Implies(st == _s(G.ACTIVE), p.told == z3.If(p.held, PAUSED, RESUMED)),
        z3.Implies(z3.Or(st == _s(G.CLAIMING), st == _s(G.UNASSIGNED)), p.told == UNKNOWN),
    )


def _progress(t: Tables, state: z3.ExprRef) -> z3.BoolRef:
    """Some INTERNAL event the table has for ``state`` leads to a lower rank."""
    closer = {
        s for s, targets in t.transitions.items() for event in INTERNAL
        if s in RANK and targets.get(event) in RANK and RANK[targets[event]] < RANK[s]
    }
    return _in(state, closer)


def obligations(t: Tables = CODE, prefix: str = "gate") -> Iterator[Obligation]:
    """Init, one obligation per event (every edge of it), hold, unhold, progress."""
    p = _fresh()
    shown = {"state": p.state, "told": p.told, "kafka": p.kafka, "held": p.held}
    yield Obligation(
        f"{prefix}:init",
        [p.state == _s(G.UNASSIGNED), p.told == UNKNOWN],
        inv(p),
        "a partition not assigned: the gate told Kafka nothing (whatever its flag)",
        shown=shown,
    )
    for event in GateEvent:
        allowed, after = step(t, p, event)
        yield Obligation(
            f"{prefix}:event[{event.value}]",
            [inv(p), allowed],
            inv(after),
            f"Gate: every edge of {event.value} keeps NoStrayPause and ToldTruth",
            shown=shown,
        )
    for on in (True, False):
        yield Obligation(
            f"{prefix}:{'hold' if on else 'unhold'}",
            [inv(p)],
            inv(_holds(t, p, on)),
            f"Gate.{'hold' if on else 'unhold'}: every partition follows",
            shown=shown,
        )
    yield Obligation(
        f"{prefix}:progress",
        [_in(p.state, set(RANK) - {G.ACTIVE})],
        _progress(t, p.state),
        "Claiming, Reclaiming, Waiting, Fenced: the gate's own events lead to Active",
        shown={"state": p.state},
    )
    yield Obligation(
        f"{prefix}:active_resumed",
        [inv(p), p.state == _s(G.ACTIVE), z3.Not(p.held)],
        z3.Not(p.kafka),
        "an Active partition with no hold on is resumed: Kafka lets it fetch",
        shown=shown,
    )


def without(
    event: GateEvent, source: GateState
) -> Mapping[GateState, Mapping[GateEvent, GateState]]:
    return {
        s: {e: to for e, to in row.items() if (s, e) != (source, event)}
        for s, row in code.TRANSITIONS.items()
    }


def mutants() -> Iterator[Obligation]:
    """Changed tables, each refuted: the obligation it breaks is expected to fail."""
    never = Tables(
        without(V.FENCE_GRACE_OVER, G.FENCED), code.ALWAYS_PAUSED, code.FOLLOWS_HOLDS,
        code.FORGETS_PAUSE,
    )
    kept = Tables(
        code.TRANSITIONS, code.ALWAYS_PAUSED, code.FOLLOWS_HOLDS, code.FORGETS_PAUSE,
        forgotten=RESUMED,
    )
    waiting = Tables(
        code.TRANSITIONS, code.ALWAYS_PAUSED - {G.WAITING}, code.FOLLOWS_HOLDS,
        code.FORGETS_PAUSE,
    )
    chosen = {
        "mutant:gate_never_reclaims": (
            never, "progress", "a fenced partition is never claimed again (3bdd90a)"
        ),
        "mutant:gate_pause_kept": (
            kept, "event[assigned]", "a new assignment is taken for resumed (44915de)"
        ),
        "mutant:gate_waiting_not_paused": (
            waiting, "event[retry_wait]", "a waiting partition keeps fetching"
        ),
    }
    for name, (tables, which, what) in chosen.items():
        for ob in obligations(tables, prefix=name):
            if ob.name == f"{name}:{which}":
                yield Obligation(
                    name, ob.premises, ob.goal, f"MUTANT: {what}", expect="COUNTEREXAMPLE",
                    shown=ob.shown,
                )
