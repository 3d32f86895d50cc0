"""The model of one partition tracker and of the consumer's epochs, written once.

Everything here is written against :class:`proofs.logic.Logic`, so the same
definitions are Z3 terms in the proofs (:mod:`proofs.tracker`,
:mod:`proofs.epochs`) and Python values in the differential check
(:mod:`proofs.differential`), which compares them with :mod:`htmqc.core` on
every state of a small exhaustive domain. The lifecycle edges come from
:data:`htmqc.core.lifecycle.EDGES`; the rest is the specification of
``spec/README.md`` §3–§5, restated, never read from the code under test.

State
-----
A :class:`Tracker` is four integer watermarks (``committed``, ``requested``,
``processed``, ``next``), ``unsent`` and ``draining``, and three arrays over
offsets: ``states`` (the *slot* of each offset: a message state, or ``ABSENT``
for never fetched or a gap), ``failures`` (failure count of a live offset) and
``skip`` (offsets the sink held at assignment that have not been fetched yet).
``max_retries`` is the consumer's retry policy, a constant.

Four *ghost* fields record history for the invariants; no transition reads them
to compute anything else, and the differential check does not compare them:
``held`` (what the sink held at assignment, constant), ``ran`` (offsets ever
handed to a handler, i.e. moved into Processing), ``handed`` (the
``finished_above`` of the latest commit request that has not failed) and
``top`` (the highest offset a commit request handed out).

Transitions
-----------
A :class:`Transition` maps a state and inputs to a :class:`Step`: ``pre`` (when
the method does not raise), ``defs`` (constraints defining auxiliary values, such
as the new watermark), the post-state, the answer (``out``) and ``assume`` (what
the environment promises: only the proofs use it, the code cannot check it).
One transition per tracker method, one per lifecycle edge in single and batch
form (generated from the table), and the consumer's ``failed`` (fail, then
retry or dead-letter as the policy says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

from htmqc.core.lifecycle import EDGES, FINISHED, INITIAL, Event, MessageState
from proofs.logic import ABSENT, Logic, Symbolic, Term, all_of

#: A handler runs a message while it is in this state.
RUNNING = MessageState.PROCESSING
#: Events that start work: refused while the partition drains ("nothing new starts").
STARTS_WORK = frozenset(e for e, (_, target) in EDGES.items() if target is RUNNING)
#: Events that record a handler failure (the failure count grows by one).
COUNTS_FAILURE = frozenset(e for e, (_, target) in EDGES.items() if target is MessageState.FAILED)
#: Events that schedule a retry: the consumer does this only inside ``failed``,
#: after the retry policy allowed it.
SCHEDULES_RETRY = frozenset(
    e for e, (_, target) in EDGES.items() if target is MessageState.RETRYING
)
LIVE = tuple(s.name for s in MessageState if s not in FINISHED)
DONE = tuple(sorted(s.name for s in FINISHED))


# -- state ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tracker:
    """The state of one :class:`~htmqc.core.partition.PartitionTracker` (module docs)."""

    committed: Term
    requested: Term
    processed: Term
    next: Term
    unsent: Term
    draining: Term
    states: Term
    failures: Term
    skip: Term
    max_retries: Term
    held: Term = field(metadata={"ghost": True})
    ran: Term = field(metadata={"ghost": True})
    handed: Term = field(metadata={"ghost": True})
    top: Term = field(metadata={"ghost": True})

    def but(self, **changes: Term) -> Tracker:
        """A copy with some fields replaced (a post-state)."""
        copy = object.__new__(Tracker)
        copy.__dict__.update(self.__dict__, **changes)
        return copy


#: Kind of each field, for :meth:`proofs.logic.Symbolic.var`.
KINDS: Mapping[str, str] = {
    "committed": "int",
    "requested": "int",
    "processed": "int",
    "next": "int",
    "unsent": "bool",
    "draining": "bool",
    "states": "slots",
    "failures": "count",
    "skip": "set",
    "max_retries": "int",
    "held": "set",
    "ran": "set",
    "handed": "set",
    "top": "int",
}
GHOSTS = frozenset(f.name for f in fields(Tracker) if f.metadata.get("ghost"))


def fresh(logic: Symbolic, prefix: str = "") -> Tracker:
    """A tracker of unconstrained Z3 constants."""
    return Tracker(**{name: logic.var(prefix + name, kind) for name, kind in KINDS.items()})


def pick(logic: Logic, cond: Term, then: Tracker, other: Tracker) -> Tracker:
    """``then`` if ``cond`` else ``other``, field by field."""
    return Tracker(
        **{
            f.name: logic.If(cond, getattr(then, f.name), getattr(other, f.name))
            for f in fields(Tracker)
        }
    )


# -- definitions ---------------------------------------------------------------------------


def is_in(logic: Logic, value: Term, names: tuple[str, ...]) -> Term:
    """The slot ``value`` is one of ``names``."""
    return logic.member(value, names)


def is_live(logic: Logic, value: Term) -> Term:
    """The slot holds a message that still holds back the watermark."""
    return is_in(logic, value, LIVE)


def done(logic: Logic, t: Tracker, o: Term) -> Term:
    """``o`` was fetched, is finished, and lies in ``[processed, next)``."""
    return logic.And(t.processed <= o, o < t.next, is_in(logic, t.states[o], DONE))


def finished_above(logic: Logic, t: Tracker, o: Term) -> Term:
    """``o`` belongs in a commit's ``finished_above``: finished out of order above the
    watermark, or held by the sink at assignment and not fetched yet."""
    return logic.Or(done(logic, t, o), t.skip[o])


def commit_due(logic: Logic, t: Tracker) -> Term:
    """A commit request would hand out a commit."""
    return logic.Or(t.processed > t.requested, t.unsent)


def least_live(
    logic: Logic, states: Term, frm: Term, nxt: Term, name: str = "watermark"
) -> tuple[Term, Term]:
    """The least live offset in ``[frm, nxt)``, or ``nxt`` if there is none."""
    return logic.define(
        name,
        frm,
        nxt,
        lambda w: logic.And(
            logic.forall(
                f"o_{name}",
                lambda o: logic.Implies(
                    logic.And(frm <= o, o < w), logic.Not(is_live(logic, states[o]))
                ),
            ),
            logic.Or(w == nxt, is_live(logic, states[w])),
        ),
    )


# -- invariants ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Invariant:
    """A named conjunct of the invariant. ``group``: ``tracker`` (the one of
    ``spec/README.md`` §3), ``exactly_once`` (what exactly-once depends on) or
    ``consumer`` (holds for the transitions a :class:`ConsumerCore` makes)."""

    name: str
    doc: str
    group: str
    holds: Callable[[Logic, Tracker], Term]


def _forall(logic: Logic, body: Callable[[Term], Term]) -> Term:
    return logic.forall("o_inv", body)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "watermarks_ordered",
        "0 <= committed <= requested <= processed <= next",
        "tracker",
        lambda L, t: L.And(
            t.committed >= 0,
            t.committed <= t.requested,
            t.requested <= t.processed,
            t.processed <= t.next,
        ),
    ),
    Invariant(
        "live_in_window",
        "every live offset lies in [processed, next)",
        "tracker",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(is_live(L, t.states[o]), L.And(t.processed <= o, o < t.next)),
        ),
    ),
    Invariant(
        "watermark_least_live",
        "processed is live, or equal to next",
        "tracker",
        lambda L, t: L.Or(t.processed == t.next, is_live(L, t.states[t.processed])),
    ),
    Invariant(
        "unfetched_untouched",
        "an offset at or above next holds no message and never ran",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(
                o >= t.next, L.And(t.states[o] == L.slot(ABSENT), L.Not(t.ran[o]))
            ),
        ),
    ),
    Invariant(
        "failures_only_live",
        "failure counts are >= 0, and non-zero only for live offsets",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.And(
                t.failures[o] >= 0, L.Implies(t.failures[o] > 0, is_live(L, t.states[o]))
            ),
        ),
    ),
    Invariant(
        "skip_is_unfetched_held",
        "skip is exactly the held offsets at or above next",
        "exactly_once",
        lambda L, t: _forall(L, lambda o: t.skip[o] == L.And(t.held[o], o >= t.next)),
    ),
    Invariant(
        "held_never_runs",
        "an offset the sink held is never live and never handed to a handler",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(
                t.held[o], L.And(L.Not(is_live(L, t.states[o])), L.Not(t.ran[o]))
            ),
        ),
    ),
    Invariant(
        "finished_only_after_running",
        "an offset past Pending ran, unless the sink held it",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(
                L.Not(is_in(L, t.states[o], (INITIAL.name, ABSENT))),
                L.Or(t.ran[o], t.held[o]),
            ),
        ),
    ),
    Invariant(
        "finished_above_sound",
        "every offset in finished_above is at or above processed and not live",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(
                finished_above(L, t, o),
                L.And(t.processed <= o, L.Not(is_live(L, t.states[o]))),
            ),
        ),
    ),
    Invariant(
        "held_in_finished_above",
        "a held offset at or above processed is in finished_above, unless it was a gap",
        "exactly_once",
        lambda L, t: _forall(
            L,
            lambda o: L.Implies(
                L.And(
                    t.held[o],
                    t.processed <= o,
                    L.Not(L.And(o < t.next, t.states[o] == L.slot(ABSENT))),
                ),
                finished_above(L, t, o),
            ),
        ),
    ),
    Invariant(
        "failed_commit_asked_again",
        "requested <= top <= processed; requested < top (a commit failed) => unsent",
        "exactly_once",
        lambda L, t: L.And(
            t.requested <= t.top,
            t.top <= t.processed,
            L.Implies(t.requested < t.top, t.unsent),
        ),
    ),
    Invariant(
        "commit_due_after_finish",
        "no commit due => finished_above adds nothing to the last commit handed out",
        "exactly_once",
        lambda L, t: L.Implies(
            L.Not(commit_due(L, t)),
            _forall(L, lambda o: L.Implies(finished_above(L, t, o), t.handed[o])),
        ),
    ),
    Invariant(
        "retries_within_budget",
        "a Retrying offset has failed between 1 and max_retries times",
        "consumer",
        lambda L, t: L.And(
            t.max_retries >= 0,
            _forall(
                L,
                lambda o: L.Implies(
                    t.states[o] == L.slot(MessageState.RETRYING.name),
                    L.And(t.failures[o] >= 1, t.failures[o] <= t.max_retries),
                ),
            ),
        ),
    ),
)


def invariants(groups: frozenset[str]) -> tuple[Invariant, ...]:
    """The invariants of the given groups, in order."""
    return tuple(i for i in INVARIANTS if i.group in groups)


def invariant(logic: Logic, t: Tracker, groups: frozenset[str]) -> Term:
    """The conjunction of the invariants of ``groups``."""
    return all_of(logic, (i.holds(logic, t) for i in invariants(groups)))


def monotone(before: Tracker, after: Tracker) -> list[Term]:
    """``committed``, ``processed`` and ``next`` never move backwards."""
    return [
        after.committed >= before.committed,
        after.processed >= before.processed,
        after.next >= before.next,
    ]


# -- transitions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What a transition does (module docs)."""

    pre: list[Term]
    post: Tracker
    out: Term = None
    defs: list[Term] = field(default_factory=list)
    assume: list[Term] = field(default_factory=list)


@dataclass(frozen=True)
class Transition:
    """``run(logic, tracker, **inputs) -> Step``; ``inputs`` maps each input to its
    kind (see :meth:`proofs.logic.Symbolic.var`). ``consumer``: a
    :class:`~htmqc.core.consumer.ConsumerCore` can make it."""

    name: str
    doc: str
    inputs: Mapping[str, str]
    run: Callable[..., Step]
    consumer: bool = True


def initial(logic: Logic, start: Term, held: Term, max_retries: Term) -> Step:
    """``PartitionTracker(start, finished_above=held)`` (``ConsumerCore.assign``):
    every watermark at ``start``, nothing fetched, ``skip = held``."""
    nothing = logic.array("o_none", lambda o: False)
    post = Tracker(
        committed=start,
        requested=start,
        processed=start,
        next=start,
        unsent=False,
        draining=False,
        states=logic.array("o_absent", lambda o: logic.slot(ABSENT)),
        failures=logic.array("o_zero", lambda o: 0),
        skip=held,
        max_retries=max_retries,
        held=held,
        ran=nothing,
        handed=held,
        top=start,
    )
    pre = [
        start >= 0,
        max_retries >= 0,
        logic.forall("o_held", lambda o: logic.Implies(held[o], o >= start)),
    ]
    return Step(pre, post)


def fetched(logic: Logic, t: Tracker, arrived: Term, end: Term) -> Step:
    """``fetched(offsets, end)``: the ``arrived`` offsets (all in ``[next, end)``)
    become Pending, or finished if the sink held them; the rest of the range are
    gaps; ``next := end``; the watermark moves to the least live offset. Answers
    the offsets to run."""
    L = logic
    states = L.array(
        "o_fetch",
        lambda o: L.If(
            arrived[o],
            L.If(t.skip[o], L.slot(MessageState.SUCCEEDED.name), L.slot(INITIAL.name)),
            L.If(L.And(t.next <= o, o < end), L.slot(ABSENT), t.states[o]),
        ),
    )
    processed, define = least_live(L, states, t.processed, end)
    pre = [
        L.Not(t.draining),
        t.next <= end,
        L.forall("o_arr", lambda o: L.Implies(arrived[o], L.And(t.next <= o, o < end))),
    ]
    post = t.but(
        states=states,
        next=end,
        processed=processed,
        skip=L.array("o_skip", lambda o: L.And(t.skip[o], o >= end)),
    )
    run = L.array("o_run", lambda o: L.And(arrived[o], L.Not(t.skip[o])))
    return Step(pre, post, run, [define])


def lifecycle(
    event: Event, many: bool, edges: Mapping[Event, tuple[MessageState, MessageState]] = EDGES
) -> Callable[..., Step]:
    """``apply`` (``many=False``, input ``offset``) or ``apply_many`` (input ``batch``)
    for ``event``'s edge of ``edges``: every chosen offset is in the source state (and
    the event does not start work while draining); all move to the target. Finishing
    clears the failure count, sets ``unsent`` (if the batch is not empty) and moves the
    watermark to the least live offset; a failure counts; running marks ``ran``. Answers
    the target."""
    source, target = edges[event]

    def run(logic: Logic, t: Tracker, **given: Term) -> Step:
        L = logic

        def chosen(o: Term) -> Term:
            return given["batch"][o] if many else o == given["offset"]

        if many:
            pre = [
                L.forall(
                    "o_src", lambda o: L.Implies(chosen(o), t.states[o] == L.slot(source.name))
                )
            ]
        else:
            pre = [t.states[given["offset"]] == L.slot(source.name)]
        if event in STARTS_WORK:
            pre.append(L.Not(t.draining))

        def update(array: Term, value: Callable[[Term], Term], name: str) -> Term:
            return L.array(name, lambda o: L.If(chosen(o), value(o), array[o]))

        states = update(t.states, lambda o: L.slot(target.name), "o_state")
        post = t.but(states=states)
        if target in FINISHED:
            processed, define = least_live(L, states, t.processed, t.next)
            failures = update(t.failures, lambda o: 0, "o_fail")
            # An empty batch finishes nothing, so it makes no commit due.
            some = L.Not(L.forall("o_any", lambda o: L.Not(chosen(o)))) if many else L.true()
            post = post.but(processed=processed, unsent=L.Or(t.unsent, some), failures=failures)
            return Step(pre, post, L.slot(target.name), [define])
        if event in COUNTS_FAILURE:
            post = post.but(failures=update(t.failures, lambda o: t.failures[o] + 1, "o_fail"))
        if target is RUNNING:
            post = post.but(ran=update(t.ran, lambda o: True, "o_ran"))
        return Step(pre, post, L.slot(target.name))

    return run


def commit_requested(logic: Logic, t: Tracker) -> Step:
    """``commit_requested()``: when a commit is due, hand out ``processed`` (with
    ``finished_above``) and remember it in ``requested``. Answers ``(due, offset,
    finished_above)``."""
    L = logic
    due = commit_due(L, t)
    handed = L.array("o_handed", lambda o: finished_above(L, t, o))
    post = t.but(
        requested=L.If(due, t.processed, t.requested),
        unsent=L.If(due, False, t.unsent),
        top=L.If(due, t.processed, t.top),
        handed=L.If(due, handed, t.handed),
    )
    return Step([], post, (due, t.processed, handed))


def commit_acked(logic: Logic, t: Tracker, offset: Term) -> Step:
    """``commit_acked(offset)``, ``offset <= processed``: ``committed`` moves up to it
    (a late or duplicate ack changes nothing); ``requested := max(requested, offset)``.
    Assumes the offset was handed out by some request. Answers whether it moved."""
    L = logic
    late = offset <= t.committed
    post = t.but(
        committed=L.If(late, t.committed, offset),
        requested=L.If(
            late, t.requested, L.If(t.requested < offset, offset, t.requested)
        ),
    )
    return Step([offset <= t.processed], post, L.Not(late), assume=[offset <= t.top])


def commit_failed(logic: Logic, t: Tracker, offset: Term) -> Step:
    """``commit_failed(offset)``: ``requested := committed``; the next request asks again."""
    return Step([], t.but(requested=t.committed, unsent=True))


def begin_drain(logic: Logic, t: Tracker) -> Step:
    """``begin_drain()`` (``ConsumerCore.revoking``): nothing new starts."""
    return Step([], t.but(draining=True))


def failed(logic: Logic, t: Tracker, offset: Term, permanent: Term) -> Step:
    """``ConsumerCore.failed``: the offset fails; then, if the failure is not permanent
    and it has failed at most ``max_retries`` times, a retry is scheduled, else it
    stays Failed for the dead-letter queue. Answers ``(retry, attempts)``."""
    L = logic
    (fail,) = COUNTS_FAILURE
    (schedule,) = SCHEDULES_RETRY
    first = lifecycle(fail, many=False)(L, t, offset=offset)
    attempts = first.post.failures[offset]
    retry = L.And(L.Not(permanent), attempts <= t.max_retries)
    second = lifecycle(schedule, many=False)(L, first.post, offset=offset)
    pre = [*first.pre, L.Implies(retry, all_of(L, second.pre))]
    post = pick(L, retry, second.post, first.post)
    return Step(pre, post, (retry, attempts), [*first.defs, *second.defs])


def transitions(
    edges: Mapping[Event, tuple[MessageState, MessageState]] = EDGES,
) -> dict[str, Transition]:
    """Every transition by name, the lifecycle ones generated from ``edges``."""
    found = [Transition("fetched", _doc(fetched), {"arrived": "set", "end": "int"}, fetched)]
    for event, (source, target) in edges.items():
        for many in (False, True):
            form = "apply_many" if many else "apply"
            found.append(
                Transition(
                    f"{form}[{event.value}]",
                    f"PartitionTracker.{form}({event.name}): {source.value} -> {target.value}",
                    {"batch": "set"} if many else {"offset": "int"},
                    lifecycle(event, many, edges),
                    consumer=event not in SCHEDULES_RETRY,
                )
            )
    found += [
        Transition("commit_requested", _doc(commit_requested), {}, commit_requested),
        Transition("commit_acked", _doc(commit_acked), {"offset": "int"}, commit_acked),
        Transition("commit_failed", _doc(commit_failed), {"offset": "int"}, commit_failed),
        Transition("begin_drain", _doc(begin_drain), {}, begin_drain),
        Transition("consumer.failed", _doc(failed), {"offset": "int", "permanent": "bool"}, failed),
    ]
    return {t.name: t for t in found}


def _doc(function: Callable[..., Step]) -> str:
    return " ".join((function.__doc__ or "").split())


#: Every transition, by name.
TRANSITIONS: Mapping[str, Transition] = transitions()


# -- the consumer's epochs ------------------------------------------------------------------


@dataclass(frozen=True)
class Members:
    """:class:`~htmqc.core.consumer.ConsumerCore`'s partitions and epochs:
    ``assigned: TP -> Bool``, ``epoch: TP -> Int`` and ``last`` (the last epoch
    handed out), partitions numbered by integers."""

    assigned: Term
    epoch: Term
    last: Term


def members_initial(logic: Logic) -> Members:
    """``ConsumerCore()``: nothing assigned, no epoch handed out."""
    return Members(logic.array("tp_none", lambda tp: False), logic.array("tp_0", lambda tp: 0), 0)


def assign(logic: Logic, m: Members, tp: Term) -> tuple[Term, Members]:
    """``assign``/``restored``: refused if ``tp`` is held; else a fresh epoch
    ``last + 1``. Returns the precondition and the new state."""
    epoch = m.last + 1
    post = Members(logic.store(m.assigned, tp, True), logic.store(m.epoch, tp, epoch), epoch)
    return logic.Not(m.assigned[tp]), post


def release(logic: Logic, m: Members, tp: Term) -> Members:
    """``revoked``: ``tp`` is dropped."""
    return Members(logic.store(m.assigned, tp, False), m.epoch, m.last)


def crash(logic: Logic, m: Members) -> Members:
    """``crashed``: every partition is dropped."""
    return Members(logic.array("tp_none", lambda tp: False), m.epoch, m.last)


def current(logic: Logic, m: Members, tp: Term, epoch: Term) -> Term:
    """An event stamped ``epoch`` is about ``tp``'s current assignment (else it is late
    and ignored)."""
    return logic.And(m.assigned[tp], m.epoch[tp] == epoch)


def members_invariant(logic: Logic, m: Members) -> Term:
    """``last >= 0``; a held partition's epoch is in ``[1, last]``; no two held
    partitions share an epoch."""
    L = logic
    return L.And(
        m.last >= 0,
        L.forall(
            "tp_a",
            lambda a: L.Implies(m.assigned[a], L.And(m.epoch[a] >= 1, m.epoch[a] <= m.last)),
        ),
        L.forall(
            "tp_a",
            lambda a: L.forall(
                "tp_b",
                lambda b: L.Implies(
                    L.And(m.assigned[a], m.assigned[b], a != b), m.epoch[a] != m.epoch[b]
                ),
            ),
        ),
    )
