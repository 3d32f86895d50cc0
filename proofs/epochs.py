"""Assignment epochs are fresh: a late event can never reach a newer assignment.

The consumer's partitions and epochs are :class:`proofs.model.Members`
(``assigned: TP -> Bool``, ``epoch: TP -> Int``, ``last``), with partitions as
unbounded integers, and the transitions are :func:`proofs.model.assign`,
:func:`~proofs.model.release` and :func:`~proofs.model.crash`: the definitions
:mod:`proofs.differential` runs beside :class:`htmqc.core.ConsumerCore`. The
invariant (:func:`proofs.model.members_invariant`)::

    last >= 0
    forall tp. assigned(tp) => 1 <= epoch(tp) <= last
    forall a b. assigned(a) and assigned(b) and a != b => epoch(a) != epoch(b)

Events carry an epoch and act only when it is the partition's current one
(:func:`proofs.model.current`), so with this invariant an event stamped with an
epoch handed out before an ``assign`` never matches the new assignment. The
tracker that ``assign``/``restored`` creates satisfies the tracker invariant by
the ``init`` obligation of :mod:`proofs.tracker`.
"""

from __future__ import annotations

from collections.abc import Iterator

import z3

from proofs.logic import Symbolic
from proofs.model import Members, assign, crash, members_initial, members_invariant, release
from proofs.obligation import Obligation

Z3 = Symbolic()


def _fresh() -> Members:
    return Members(Z3.var("assigned", "set"), Z3.var("epoch", "count"), Z3.var("last", "int"))


def _fresh_epoch(before: Members, after: Members, tp: z3.ArithRef) -> z3.BoolRef:
    """The new epoch of ``tp`` differs from every epoch handed out before."""
    old = z3.Int("stale_epoch")
    return z3.ForAll([old], z3.Implies(old <= before.last, after.epoch[tp] != old))


def obligations() -> Iterator[Obligation]:
    """Init, assign/restored (with freshness), revoked, crashed, and a mutant."""
    m = _fresh()
    tp = z3.Int("tp")
    yield Obligation(
        "epochs:init",
        [],
        members_invariant(Z3, members_initial(Z3)),
        "ConsumerCore.__init__: nothing held, last epoch 0",
    )
    allowed, after = assign(Z3, m, tp)
    yield Obligation(
        "epochs:assign/restored",
        [members_invariant(Z3, m), allowed],
        z3.And(members_invariant(Z3, after), _fresh_epoch(m, after, tp)),
        "ConsumerCore.assign/restored: a fresh epoch, different from every earlier one",
    )
    yield Obligation(
        "epochs:revoked",
        [members_invariant(Z3, m)],
        members_invariant(Z3, release(Z3, m, tp)),
        "ConsumerCore.revoked: the partition is dropped",
    )
    yield Obligation(
        "epochs:crashed",
        [members_invariant(Z3, m)],
        members_invariant(Z3, crash(Z3, m)),
        "ConsumerCore.crashed: every partition is dropped",
    )
    reused = Members(after.assigned, z3.Store(m.epoch, tp, m.last), m.last)
    yield Obligation(
        "mutant:assign_reuses_last_epoch",
        [members_invariant(Z3, m), allowed],
        z3.And(members_invariant(Z3, reused), _fresh_epoch(m, reused, tp)),
        "MUTANT of assign: the epoch counter is not incremented",
        expect="COUNTEREXAMPLE",
        shown={"tp": tp, "last": m.last},
    )
