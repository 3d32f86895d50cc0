"""Assignment epochs are fresh: a late event can never reach a newer assignment.

Encodes :class:`htmqc.core.consumer.ConsumerCore`'s ``_parts``/``_epochs`` as
``held: TP -> Bool``, ``epoch: TP -> Int`` and ``last`` (``_last_epoch``), with
partitions as unbounded integers. The invariant::

    last >= 0
    forall tp. held(tp) => 1 <= epoch(tp) <= last
    forall a b. held(a) and held(b) and a != b => epoch(a) != epoch(b)

Events carry an epoch and act only when it equals the partition's current one
(``ConsumerCore._current``), so with this invariant an event stamped with an
epoch handed out before an ``assign`` never matches the new assignment.
The tracker created by ``assign``/``restored`` satisfies the tracker invariant
by the ``init`` obligation of :mod:`proofs.tracker`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import z3

from proofs.obligation import Obligation


@dataclass(frozen=True)
class Members:
    """Symbolic epoch state of one consumer."""

    held: z3.ArrayRef
    epoch: z3.ArrayRef
    last: z3.ArithRef


def _fresh() -> Members:
    return Members(
        held=z3.Array("held", z3.IntSort(), z3.BoolSort()),
        epoch=z3.Array("epoch", z3.IntSort(), z3.IntSort()),
        last=z3.Int("last"),
    )


def invariant(m: Members) -> z3.BoolRef:
    """The epoch invariant (see module docs)."""
    a, b = z3.Ints("tp_a tp_b")
    return z3.And(
        m.last >= 0,
        z3.ForAll([a], z3.Implies(m.held[a], z3.And(m.epoch[a] >= 1, m.epoch[a] <= m.last))),
        z3.ForAll(
            [a, b],
            z3.Implies(z3.And(m.held[a], m.held[b], a != b), m.epoch[a] != m.epoch[b]),
        ),
    )


def _assign(m: Members, tp: z3.ArithRef, epoch: z3.ArithRef, last: z3.ArithRef) -> Members:
    return Members(
        held=z3.Store(m.held, tp, True), epoch=z3.Store(m.epoch, tp, epoch), last=last
    )


def _fresh_epoch(before: Members, after: Members, tp: z3.ArithRef) -> z3.BoolRef:
    """The new epoch of ``tp`` differs from every epoch handed out before."""
    old = z3.Int("stale_epoch")
    return z3.ForAll([old], z3.Implies(old <= before.last, after.epoch[tp] != old))


def obligations() -> Iterator[Obligation]:
    """Init, assign/restored (with freshness), revoked, crashed, and a mutant."""
    m = _fresh()
    tp = z3.Int("tp")
    init = Members(held=z3.K(z3.IntSort(), z3.BoolVal(False)), epoch=m.epoch, last=z3.IntVal(0))
    yield Obligation(
        "epochs:init", [], invariant(init), "ConsumerCore.__init__: nothing held, last epoch 0"
    )
    after = _assign(m, tp, m.last + 1, m.last + 1)
    yield Obligation(
        "epochs:assign/restored",
        [invariant(m), z3.Not(m.held[tp])],
        z3.And(invariant(after), _fresh_epoch(m, after, tp)),
        "ConsumerCore.assign/restored: a fresh epoch, different from every earlier one",
    )
    yield Obligation(
        "epochs:revoked",
        [invariant(m)],
        invariant(Members(z3.Store(m.held, tp, False), m.epoch, m.last)),
        "ConsumerCore.revoked: the partition is dropped",
    )
    yield Obligation(
        "epochs:crashed",
        [invariant(m)],
        invariant(Members(z3.K(z3.IntSort(), z3.BoolVal(False)), m.epoch, m.last)),
        "ConsumerCore.crashed: every partition is dropped",
    )
    reused = _assign(m, tp, m.last, m.last)
    yield Obligation(
        "mutant:assign_reuses_last_epoch",
        [invariant(m), z3.Not(m.held[tp])],
        z3.And(invariant(reused), _fresh_epoch(m, reused, tp)),
        "MUTANT of assign: the epoch counter is not incremented",
        expect="COUNTEREXAMPLE",
        shown={"tp": tp, "last": m.last},
    )
