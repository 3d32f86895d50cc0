"""The tracker invariant is inductive: ``Init => Inv`` and ``Inv and Pre and T => Inv'``.

Every transition is also proved *monotone*: ``committed``, ``processed`` and
``next`` never decrease (``requested`` may: a failed commit resets it).
``ConsumerCore.revoked`` is ``commit_requested`` followed by dropping the
tracker, and ``crashed`` drops every tracker; what remains to prove about them
(and about ``assign``/``restored``) is in :mod:`proofs.epochs`.

Offset-level transitions are encoded by hand below, one function per method of
:class:`htmqc.core.partition.PartitionTracker`, each citing it. The lifecycle
transitions are *generated* from :data:`htmqc.core.lifecycle.EDGES` (single and
batch form for every edge), so adding an edge to the table adds its proof.

A transition that raises (an illegal event) leaves the tracker unchanged, which
keeps the invariant trivially; the ``Pre`` of each transition is the condition
under which the Python method does *not* raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import z3

from htmqc.core.lifecycle import EDGES, FINISHED, INITIAL, Event, MessageState
from proofs.model import Tracker, advanced, fresh, invariant, is_live, slot
from proofs.obligation import Obligation


@dataclass(frozen=True)
class Step:
    """A transition: its guard and auxiliary definitions (``pre``) and the post-state."""

    pre: list[z3.BoolRef]
    post: Tracker
    extra: dict[str, z3.ExprRef] = field(default_factory=dict)


Transition = Callable[[Tracker], Step]
Edges = Mapping[Event, tuple[MessageState, MessageState]]


def monotone(before: Tracker, after: Tracker) -> z3.BoolRef:
    """``committed``, ``processed`` and ``next`` never move backwards."""
    return z3.And(
        after.committed >= before.committed,
        after.processed >= before.processed,
        after.next >= before.next,
    )


def preserves(name: str, transition: Transition, expect: str = "PROVED") -> Obligation:
    """``Inv(t) and Pre and T(t, t') => Inv(t') and monotone(t, t')``."""
    before = fresh("")
    step = transition(before)
    doc = (transition.__doc__ or "").strip().splitlines()[0]
    return Obligation(
        name=name,
        premises=[invariant(before), *step.pre],
        goal=z3.And(invariant(step.post), monotone(before, step.post)),
        doc=doc,
        expect="PROVED" if expect == "PROVED" else "COUNTEREXAMPLE",
        shown={**before.shown(""), **step.post.shown("'"), **step.extra},
    )


def init_establishes() -> Obligation:
    """``PartitionTracker.__init__(start, finished_above)``: all four watermarks at
    ``start >= 0``, nothing fetched, every skipped offset above ``start``."""
    t = fresh("")
    start = z3.Int("start")
    o = z3.Int("o_init")
    premises = [
        start >= 0,
        t.committed == start,
        t.requested == start,
        t.processed == start,
        t.next == start,
        t.states == z3.K(z3.IntSort(), slot("ABSENT")),
        z3.ForAll([o], z3.Implies(t.skip[o], o > start)),
        z3.Not(t.unsent),
        z3.Not(t.draining),
    ]
    return Obligation(
        name="init",
        premises=premises,
        goal=invariant(t),
        doc="Init => Inv (PartitionTracker.__init__)",
        shown={"start": start},
    )


# -- fetched ------------------------------------------------------------------------------


def _fetched(t: Tracker, arrived: z3.ArrayRef, hi: z3.ArithRef, advance: bool = True) -> Step:
    o = z3.Int("o_fetch")
    states = z3.Lambda(
        [o],
        z3.If(
            arrived[o],
            z3.If(t.skip[o], slot(MessageState.SUCCEEDED), slot(INITIAL)),
            z3.If(z3.And(t.next <= o, o < hi), slot("ABSENT"), t.states[o]),
        ),
    )
    adv = z3.Int("advanced")
    processed = z3.If(is_live(states[t.processed]), t.processed, adv) if advance else t.processed
    pre = [
        z3.Not(t.draining),
        hi >= t.next,
        z3.ForAll([o], z3.Implies(arrived[o], z3.And(t.next <= o, o < hi))),
        advanced(states, t.processed, hi, adv),
    ]
    post = t.but(
        states=states,
        next=hi,
        processed=processed,
        skip=z3.Lambda([o], z3.And(t.skip[o], o >= hi)),
    )
    return Step(pre, post, {"end": hi})


def fetched_with_gaps(t: Tracker) -> Step:
    """PartitionTracker.fetched(offsets, end): any offsets in [next, end) arrive, the
    rest are gaps; offsets in finished_above arrive finished; next := end;
    the watermark advances if it is no longer live."""
    return _fetched(t, z3.Array("arrived", z3.IntSort(), z3.BoolSort()), z3.Int("end"))


def fetched_contiguous(t: Tracker) -> Step:
    """PartitionTracker.fetched(offsets) with end=None: every offset of [next, last] arrives."""
    o = z3.Int("o_all")
    hi = z3.Int("end")
    step = _fetched(t, z3.Lambda([o], z3.And(t.next <= o, o < hi)), hi)
    return Step([*step.pre, hi > t.next], step.post, step.extra)


def fetched_no_finished_above(t: Tracker) -> Step:
    """PartitionTracker.fetched(offsets, end) with an empty finished_above set: gaps only."""
    o = z3.Int("o_noskip")
    step = _fetched(t, z3.Array("arrived", z3.IntSort(), z3.BoolSort()), z3.Int("end"))
    return Step([*step.pre, z3.ForAll([o], z3.Not(t.skip[o]))], step.post, step.extra)


def fetched_empty(t: Tracker) -> Step:
    """PartitionTracker.fetched([], None): nothing arrived, nothing changes."""
    return Step([], t)


def mutant_fetched_no_advance_over_gap(t: Tracker) -> Step:
    """MUTANT of fetched: the watermark is not advanced over a gap or a skipped offset."""
    return _fetched(t, z3.Array("arrived", z3.IntSort(), z3.BoolSort()), z3.Int("end"), False)


# -- lifecycle events, generated from EDGES ----------------------------------------------


def apply_single(event: Event, edges: Edges) -> Transition:
    """PartitionTracker.apply(event, offset) for one edge of the table."""
    source, target = edges[event]
    finishing = target in FINISHED

    def transition(t: Tracker) -> Step:
        x = z3.Int("offset")
        states = z3.Store(t.states, x, slot(target))
        adv = z3.Int("advanced")
        pre = [t.states[x] == slot(source)]
        if not finishing:
            return Step(pre, t.but(states=states), {"offset": x})
        # apply: ``if offset == self._processed: self._advance()``
        pre.append(advanced(states, t.processed, t.next, adv))
        processed = z3.If(x == t.processed, adv, t.processed)
        post = t.but(states=states, processed=processed, unsent=z3.BoolVal(True))
        return Step(pre, post, {"offset": x})

    transition.__doc__ = (
        f"PartitionTracker.apply({event.name}, offset): {source.value} -> {target.value}"
    )
    return transition


def apply_batch(event: Event, edges: Edges) -> Transition:
    """PartitionTracker.apply_many(event, offsets) for one edge: a set of offsets moves."""
    source, target = edges[event]
    finishing = target in FINISHED

    def transition(t: Tracker) -> Step:
        o = z3.Int("o_batch")
        batch = z3.Array("batch", z3.IntSort(), z3.BoolSort())
        states = z3.Lambda([o], z3.If(batch[o], slot(target), t.states[o]))
        pre = [z3.ForAll([o], z3.Implies(batch[o], t.states[o] == slot(source)))]
        if not finishing:
            return Step(pre, t.but(states=states))
        # apply_many: ``if self._processed not in live: self._advance()``
        adv = z3.Int("advanced")
        pre.append(advanced(states, t.processed, t.next, adv))
        processed = z3.If(is_live(states[t.processed]), t.processed, adv)
        return Step(pre, t.but(states=states, processed=processed, unsent=z3.BoolVal(True)))

    transition.__doc__ = (
        f"PartitionTracker.apply_many({event.name}, offsets): {source.value} -> {target.value}"
    )
    return transition


def mutant_finish_without_advance(t: Tracker) -> Step:
    """MUTANT of apply(SUCCEED): finishing the watermark offset does not advance it."""
    x = z3.Int("offset")
    source, target = EDGES[Event.SUCCEED]
    pre = [t.states[x] == slot(source)]
    return Step(pre, t.but(states=z3.Store(t.states, x, slot(target))), {"offset": x})


# -- commits and draining -----------------------------------------------------------------


def commit_requested(t: Tracker) -> Step:
    """PartitionTracker.commit_requested(): if processed > requested or unsent, then
    requested := processed and unsent := False (the watermark is handed out)."""
    due = z3.Or(t.processed > t.requested, t.unsent)
    post = t.but(
        requested=z3.If(due, t.processed, t.requested),
        unsent=z3.If(due, z3.BoolVal(False), t.unsent),
    )
    return Step([], post)


def mutant_commit_requested_hands_out_next(t: Tracker) -> Step:
    """MUTANT of commit_requested: hands out next instead of the watermark."""
    return Step([], t.but(requested=t.next, unsent=z3.BoolVal(False)))


def _acked(t: Tracker, x: z3.ArithRef) -> Tracker:
    late = x <= t.committed
    return t.but(
        committed=z3.If(late, t.committed, x),
        requested=z3.If(late, t.requested, z3.If(t.requested < x, x, t.requested)),
    )


def commit_acked(t: Tracker) -> Step:
    """PartitionTracker.commit_acked(offset), offset <= processed: committed := max;
    requested := max(requested, offset). Any order of acks (late, duplicate,
    out of order) is covered: offset is arbitrary below the watermark."""
    x = z3.Int("acked")
    return Step([x <= t.processed], _acked(t, x), {"acked": x})


def commit_acked_late(t: Tracker) -> Step:
    """PartitionTracker.commit_acked(offset) with offset <= committed (late or
    duplicate ack): the same transition, restricted to the ignored case."""
    x = z3.Int("acked")
    return Step([x <= t.committed], _acked(t, x), {"acked": x})


def mutant_commit_acked_moves_back(t: Tracker) -> Step:
    """MUTANT of commit_acked: a late ack (below committed) is taken as the new
    committed offset. The invariant still holds; monotonicity catches it."""
    x = z3.Int("acked")
    return Step([x >= 0, x <= t.processed], t.but(committed=x), {"acked": x})


def mutant_commit_acked_unguarded(t: Tracker) -> Step:
    """MUTANT of commit_acked: an ack above the watermark is accepted."""
    x = z3.Int("acked")
    return Step([], _acked(t, x), {"acked": x})


def commit_failed(t: Tracker) -> Step:
    """PartitionTracker.commit_failed(offset): requested := committed, unsent := True."""
    return Step([], t.but(requested=t.committed, unsent=z3.BoolVal(True)))


def begin_drain(t: Tracker) -> Step:
    """PartitionTracker.begin_drain(): draining := True (ConsumerCore.revoking)."""
    return Step([], t.but(draining=z3.BoolVal(True)))


def stale_event(t: Tracker) -> Step:
    """ConsumerCore._current returns None for a stale epoch: the event changes nothing."""
    return Step([], t)


def obligations(
    edges: Edges = EDGES,
) -> Iterator[Obligation]:
    """Every tracker obligation: Init, the hand-encoded transitions, one single and
    one batch obligation per lifecycle edge, and the mutants."""
    yield init_establishes()
    for name, transition in [
        ("fetched[gaps,end,finished_above]", fetched_with_gaps),
        ("fetched[gaps,end]", fetched_no_finished_above),
        ("fetched[contiguous]", fetched_contiguous),
        ("fetched[empty]", fetched_empty),
        ("commit_requested", commit_requested),
        ("commit_acked", commit_acked),
        ("commit_acked[late,duplicate]", commit_acked_late),
        ("commit_failed", commit_failed),
        ("begin_drain/revoking", begin_drain),
        ("stale_epoch_event", stale_event),
    ]:
        yield preserves(name, transition)
    for event in edges:
        yield preserves(f"apply[{event.value}]", apply_single(event, edges))
        yield preserves(f"apply_many[{event.value}]", apply_batch(event, edges))
    for name, transition in [
        ("mutant:fetched_no_advance_over_gap", mutant_fetched_no_advance_over_gap),
        ("mutant:commit_requested_hands_out_next", mutant_commit_requested_hands_out_next),
        ("mutant:commit_acked_above_watermark", mutant_commit_acked_unguarded),
        ("mutant:late_ack_moves_committed_back", mutant_commit_acked_moves_back),
        ("mutant:finish_without_advance", mutant_finish_without_advance),
    ]:
        yield preserves(name, transition, expect="COUNTEREXAMPLE")
    wrong = {**edges, Event.RETRY_DUE: (MessageState.SUCCEEDED, MessageState.PROCESSING)}
    yield preserves(
        "mutant:edge_out_of_finished_state",
        apply_single(Event.RETRY_DUE, wrong),
        expect="COUNTEREXAMPLE",
    )
