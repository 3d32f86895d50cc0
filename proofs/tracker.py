"""The tracker invariant is inductive: ``Init => Inv`` and ``Inv and Pre and T => Inv'``.

The transitions and the invariant are the definitions of :mod:`proofs.model`,
read as Z3 terms: the same definitions :mod:`proofs.differential` runs beside
the real :mod:`htmqc.core` on every state of its domain. Every transition of
:data:`proofs.model.TRANSITIONS` (the lifecycle ones generated from
:data:`htmqc.core.lifecycle.EDGES`, single and batch form) gets one obligation:

    Inv(t) and pre and defs and assume  =>  Inv(t') and monotone(t, t')

``Inv`` is every invariant of :data:`proofs.model.INVARIANTS`, less the
``consumer`` group for the transitions only a direct :class:`PartitionTracker`
caller can make (scheduling a retry outside ``ConsumerCore.failed``).
``monotone``: ``committed``, ``processed`` and ``next`` never decrease.
``assume`` is used once: an ack acknowledges an offset some request handed out;
``commit_acked[any offset]`` proves the ``tracker`` group without it.

A transition that raises (an illegal event) leaves the tracker unchanged, which
keeps the invariant trivially; ``pre`` is when the Python method does *not*
raise, and the differential check confirms that it is exactly that.

Mutants are deliberately wrong transitions, each one of the bug classes the
invariants are there for; each must yield a counterexample that breaks the
invariant named beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import z3

from htmqc.core.lifecycle import EDGES, Event, MessageState
from proofs.logic import Bounded, Logic, Symbolic, Term
from proofs.model import (
    Step,
    Tracker,
    Transition,
    commit_requested,
    done,
    fetched,
    fresh,
    initial,
    invariant,
    invariants,
    is_live,
    monotone,
    pick,
    transitions,
)
from proofs.obligation import Obligation

#: Offsets of the bounded twin of every obligation (see :mod:`proofs.obligation`).
BOUND = range(-1, 5)
EVERYTHING = frozenset({"tracker", "exactly_once", "consumer"})
WITHOUT_CONSUMER = frozenset({"tracker", "exactly_once"})


def _shown(t: Tracker, prefix: str) -> dict[str, z3.ExprRef]:
    return {
        f"{prefix}{name}": getattr(t, name)
        for name in ("committed", "requested", "processed", "next")
    }


def _obligation(
    name: str,
    doc: str,
    expect: str,
    statement: Callable[[Symbolic], tuple[list[Term], dict[str, Term], dict[str, Term]]],
) -> Obligation:
    """An obligation from ``statement(logic) -> (premises, parts, shown)``, stated
    over unbounded integers and, as its ``bounded`` twin, over :data:`BOUND`."""

    def build(logic: Symbolic, bounded: Obligation | None) -> Obligation:
        premises, parts, shown = statement(logic)
        if isinstance(logic, Bounded):
            premises = [*premises, *logic.domain()]
        return Obligation(
            name=name,
            premises=premises,
            goal=z3.And(list(parts.values())),
            doc=doc,
            expect="PROVED" if expect == "PROVED" else "COUNTEREXAMPLE",
            shown=shown,
            parts=parts,
            bounded=bounded,
        )

    return build(Symbolic(), build(Bounded(BOUND), None))


def preserves(
    transition: Transition,
    name: str | None = None,
    groups: frozenset[str] | None = None,
    assumptions: bool = True,
    expect: str = "PROVED",
) -> Obligation:
    """``Inv(t) and pre and defs [and assume] and T(t, t') => Inv(t') and monotone``."""
    chosen = groups or (EVERYTHING if transition.consumer else WITHOUT_CONSUMER)

    def statement(logic: Symbolic) -> tuple[list[Term], dict[str, Term], dict[str, Term]]:
        before = fresh(logic)
        given = {n: logic.var(n, kind) for n, kind in transition.inputs.items()}
        step = transition.run(logic, before, **given)
        parts = {f"{i.name}'": i.holds(logic, step.post) for i in invariants(chosen)}
        parts["monotone"] = z3.And(monotone(before, step.post))
        premises = [
            invariant(logic, before, chosen),
            *step.pre,
            *step.defs,
            *(step.assume if assumptions else []),
        ]
        shown = {
            **_shown(before, ""),
            **_shown(step.post, "'"),
            **{n: v for n, v in given.items() if transition.inputs[n] == "int"},
        }
        return premises, parts, shown

    return _obligation(name or transition.name, transition.doc, expect, statement)


def init_establishes() -> Obligation:
    """``Init => Inv``: a new tracker, at any ``start >= 0`` with any held set."""

    def statement(logic: Symbolic) -> tuple[list[Term], dict[str, Term], dict[str, Term]]:
        start = logic.var("start", "int")
        step = initial(logic, start, logic.var("held", "set"), logic.var("max_retries", "int"))
        parts = {i.name: i.holds(logic, step.post) for i in invariants(EVERYTHING)}
        return step.pre, parts, {"start": start}

    return _obligation(
        "init", "Init => Inv (PartitionTracker.__init__, ConsumerCore.assign)", "PROVED", statement
    )


# -- mutants: each is a real transition with one part changed -------------------------


def _mutant(
    name: str, doc: str, inputs: Mapping[str, str], run: Callable[..., Step]
) -> Transition:
    return Transition(name, f"MUTANT: {doc}", inputs, run)


def _skip_boundary(L: Logic, t: Tracker, arrived: Term, end: Term) -> Step:
    step = fetched(L, t, arrived, end)
    skip = L.array("o_skip", lambda o: L.And(t.skip[o], o > end))
    return replace(step, post=step.post.but(skip=skip))


def _no_advance_over_gap(L: Logic, t: Tracker, arrived: Term, end: Term) -> Step:
    step = fetched(L, t, arrived, end)
    return replace(step, post=step.post.but(processed=t.processed))


def _finish_any_live(L: Logic, t: Tracker, batch: Term) -> Step:
    step = transitions()[f"apply_many[{Event.SUCCEED.value}]"].run(L, t, batch=batch)
    live = L.forall("o_src", lambda o: L.Implies(batch[o], is_live(L, t.states[o])))
    return replace(step, pre=[live])


def _succeed(L: Logic, t: Tracker, offset: Term) -> Step:
    step: Step = transitions()[f"apply[{Event.SUCCEED.value}]"].run(L, t, offset=offset)
    return step


def _finish_without_unsent(L: Logic, t: Tracker, offset: Term) -> Step:
    step = _succeed(L, t, offset)
    return replace(step, post=step.post.but(unsent=t.unsent))


def _finish_without_advance(L: Logic, t: Tracker, offset: Term) -> Step:
    step = _succeed(L, t, offset)
    return replace(step, post=step.post.but(processed=t.processed))


def _advance_to_last_live(L: Logic, t: Tracker, offset: Term) -> Step:
    step = _succeed(L, t, offset)
    states = step.post.states

    def live_between(lo: Term, hi: Term) -> Term:
        return L.forall(
            "o_last",
            lambda o: L.Implies(L.And(lo <= o, o < hi), L.Not(is_live(L, states[o]))),
        )

    last, define = L.define(
        "last_live",
        t.processed,
        t.next,
        lambda w: L.Or(
            L.And(w == t.next, live_between(t.processed, t.next)),
            L.And(w < t.next, is_live(L, states[w]), live_between(w + 1, t.next)),
        ),
    )
    return replace(step, post=step.post.but(processed=last), defs=[define])


def _hands_out_next(L: Logic, t: Tracker) -> Step:
    step = commit_requested(L, t)
    return replace(step, post=step.post.but(requested=t.next, top=t.next))


def _commit_drops_held(L: Logic, t: Tracker) -> Step:
    step = commit_requested(L, t)
    only_done = L.array("o_handed", lambda o: done(L, t, o))
    return replace(step, post=step.post.but(handed=L.If(step.out[0], only_done, t.handed)))


def _ack(L: Logic, t: Tracker, offset: Term) -> Step:
    step: Step = transitions()["commit_acked"].run(L, t, offset=offset)
    return step


def _ack_above_watermark(L: Logic, t: Tracker, offset: Term) -> Step:
    return replace(_ack(L, t, offset), pre=[], assume=[])


def _late_ack_moves_back(L: Logic, t: Tracker, offset: Term) -> Step:
    step = _ack(L, t, offset)
    return replace(step, pre=[*step.pre, offset >= 0], post=step.post.but(committed=offset))


def _commit_failed_without_unsent(L: Logic, t: Tracker, offset: Term) -> Step:
    step: Step = transitions()["commit_failed"].run(L, t, offset=offset)
    return replace(step, post=step.post.but(unsent=t.unsent))


def _retry_past_budget(L: Logic, t: Tracker, offset: Term, permanent: Term) -> Step:
    table = transitions()
    fail = table[f"apply[{Event.FAIL.value}]"].run(L, t, offset=offset)
    again = table[f"apply[{Event.SCHEDULE_RETRY.value}]"].run(L, fail.post, offset=offset)
    retry = L.Not(permanent)
    post = pick(L, retry, again.post, fail.post)
    return Step(fail.pre, post, (retry, fail.post.failures[offset]))


OFFSET = {"offset": "int"}
FETCH = {"arrived": "set", "end": "int"}

#: ``(mutant, the invariant it must break)``.
MUTANTS: tuple[tuple[Transition, str], ...] = (
    (
        _mutant(
            "mutant:fetched_skip_boundary",
            "fetched keeps held offsets > end (not >= end)",
            FETCH,
            _skip_boundary,
        ),
        "skip_is_unfetched_held'",
    ),
    (
        _mutant(
            "mutant:fetched_no_advance_over_gap",
            "fetched does not move the watermark over gaps and held offsets",
            FETCH,
            _no_advance_over_gap,
        ),
        "watermark_least_live'",
    ),
    (
        _mutant(
            "mutant:batch_finish_from_any_live_state",
            "apply_many(SUCCEED) finishes offsets in any live state",
            {"batch": "set"},
            _finish_any_live,
        ),
        "finished_only_after_running'",
    ),
    (
        _mutant(
            "mutant:finish_without_unsent",
            "apply(SUCCEED) does not set unsent",
            OFFSET,
            _finish_without_unsent,
        ),
        "commit_due_after_finish'",
    ),
    (
        _mutant(
            "mutant:finish_without_advance",
            "finishing the watermark offset does not advance it",
            OFFSET,
            _finish_without_advance,
        ),
        "watermark_least_live'",
    ),
    (
        _mutant(
            "mutant:advance_to_last_live",
            "finishing moves the watermark to the last live offset",
            OFFSET,
            _advance_to_last_live,
        ),
        "live_in_window'",
    ),
    (
        _mutant(
            "mutant:commit_requested_hands_out_next",
            "commit_requested hands out next instead of the watermark",
            {},
            _hands_out_next,
        ),
        "watermarks_ordered'",
    ),
    (
        _mutant(
            "mutant:commit_drops_held",
            "a commit's finished_above leaves out the held offsets not fetched yet",
            {},
            _commit_drops_held,
        ),
        "commit_due_after_finish'",
    ),
    (
        _mutant(
            "mutant:commit_acked_above_watermark",
            "an ack above the watermark is accepted",
            OFFSET,
            _ack_above_watermark,
        ),
        "watermarks_ordered'",
    ),
    (
        _mutant(
            "mutant:late_ack_moves_committed_back",
            "a late ack (below committed) is taken as the new committed offset",
            OFFSET,
            _late_ack_moves_back,
        ),
        "monotone",
    ),
    (
        _mutant(
            "mutant:commit_failed_without_unsent",
            "commit_failed does not set unsent",
            OFFSET,
            _commit_failed_without_unsent,
        ),
        "failed_commit_asked_again'",
    ),
    (
        _mutant(
            "mutant:retry_past_budget",
            "ConsumerCore.failed schedules a retry whatever the failure count",
            {"offset": "int", "permanent": "bool"},
            _retry_past_budget,
        ),
        "retries_within_budget'",
    ),
)


def obligations(
    edges: Mapping[Event, tuple[MessageState, MessageState]] = EDGES,
) -> Iterator[Obligation]:
    """Init, every transition of the model (lifecycle ones from ``edges``), the ack
    without its assumption, and the mutants."""
    yield init_establishes()
    table = transitions(edges)
    for transition in table.values():
        yield preserves(transition)
    yield preserves(
        table["commit_acked"],
        name="commit_acked[any offset]",
        groups=frozenset({"tracker"}),
        assumptions=False,
    )
    for mutant, _ in MUTANTS:
        yield preserves(mutant, expect="COUNTEREXAMPLE")
    wrong = {**edges, Event.RETRY_DUE: (MessageState.SUCCEEDED, MessageState.PROCESSING)}
    yield preserves(
        transitions(wrong)[f"apply[{Event.RETRY_DUE.value}]"],
        name="mutant:edge_out_of_finished_state",
        expect="COUNTEREXAMPLE",
    )
