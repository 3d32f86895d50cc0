"""The Z3 encoding of one partition tracker and of its invariant.

A tracker is four unbounded integers (``committed``, ``requested``,
``processed``, ``next``), two flags, the ``finished_above`` skip set
(``Int -> Bool``) and the per-offset state, an array ``Int -> Slot``. ``Slot``
has one constructor per :class:`~htmqc.core.lifecycle.MessageState` (generated
from the enum) plus ``ABSENT``: never fetched, or a gap. An offset is *live*
when its slot is a state outside :data:`~htmqc.core.lifecycle.FINISHED`; the
Python tracker keeps exactly the live offsets in ``_live``.

:func:`invariant` is ``tracker_invariant`` of :mod:`htmqc.core.partition`
without its representation part (``_order`` and ``_failures`` are how the
Python code finds the watermark quickly, not what the watermark is)::

    0 <= committed <= requested <= processed <= next
    forall o. live(o) => processed <= o < next
    processed = next  or  live(processed)

The last two lines say that ``processed`` is the least live offset, or
``next`` when nothing is live.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import z3

from htmqc.core.lifecycle import FINISHED, MessageState

ABSENT = "ABSENT"


def _slot_sort() -> z3.DatatypeSortRef:
    decl = z3.Datatype("Slot")
    for state in MessageState:
        decl.declare(state.name)
    decl.declare(ABSENT)
    sort: z3.DatatypeSortRef = decl.create()
    return sort


#: One constructor per message state, plus ``ABSENT``.
Slot = _slot_sort()


def slot(state: MessageState | str) -> z3.ExprRef:
    """The Z3 constant of a message state (or of ``ABSENT``)."""
    name = state if isinstance(state, str) else state.name
    value: z3.ExprRef = getattr(Slot, name)
    return value


def is_live(value: z3.ExprRef) -> z3.BoolRef:
    """The slot holds a state that still holds back the watermark."""
    return z3.Or([value == slot(s) for s in MessageState if s not in FINISHED])


@dataclass(frozen=True)
class Tracker:
    """Symbolic state of one :class:`~htmqc.core.partition.PartitionTracker`."""

    committed: z3.ArithRef
    requested: z3.ArithRef
    processed: z3.ArithRef
    next: z3.ArithRef
    states: z3.ArrayRef
    skip: z3.ArrayRef
    unsent: z3.BoolRef
    draining: z3.BoolRef

    def but(self, **changes: z3.ExprRef) -> Tracker:
        """A copy with some fields replaced (the post-state of a transition)."""
        return replace(self, **changes)

    def shown(self, prefix: str) -> dict[str, z3.ExprRef]:
        """The scalar fields, for printing a counterexample."""
        return {
            f"{prefix}committed": self.committed,
            f"{prefix}requested": self.requested,
            f"{prefix}processed": self.processed,
            f"{prefix}next": self.next,
        }


def fresh(prefix: str) -> Tracker:
    """A tracker of unconstrained symbolic values."""
    return Tracker(
        committed=z3.Int(f"{prefix}committed"),
        requested=z3.Int(f"{prefix}requested"),
        processed=z3.Int(f"{prefix}processed"),
        next=z3.Int(f"{prefix}next"),
        states=z3.Array(f"{prefix}states", z3.IntSort(), Slot),
        skip=z3.Array(f"{prefix}skip", z3.IntSort(), z3.BoolSort()),
        unsent=z3.Bool(f"{prefix}unsent"),
        draining=z3.Bool(f"{prefix}draining"),
    )


def invariant(t: Tracker) -> z3.BoolRef:
    """The tracker invariant (see module docs)."""
    o = z3.Int("o_inv")
    return z3.And(
        t.committed >= 0,
        t.committed <= t.requested,
        t.requested <= t.processed,
        t.processed <= t.next,
        z3.ForAll([o], z3.Implies(is_live(t.states[o]), z3.And(t.processed <= o, o < t.next))),
        z3.Or(t.processed == t.next, is_live(t.states[t.processed])),
    )


def advanced(
    states: z3.ArrayRef, frm: z3.ArithRef, nxt: z3.ArithRef, to: z3.ArithRef
) -> z3.BoolRef:
    """``to`` is what ``PartitionTracker._advance`` computes: the least live
    offset at or above ``frm``, or ``nxt`` when there is none below ``nxt``.

    Stated as a relation; it has exactly one solution for every finite range
    ``[frm, nxt]``, and the vacuity check of every obligation confirms it can be
    met.
    """
    o = z3.Int("o_adv")
    return z3.And(
        frm <= to,
        to <= nxt,
        z3.ForAll([o], z3.Implies(z3.And(frm <= o, o < to), z3.Not(is_live(states[o])))),
        z3.Or(to == nxt, is_live(states[to])),
    )
