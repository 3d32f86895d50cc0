"""One set of definitions, two meanings: Z3 terms, or plain Python values.

The model of :mod:`proofs.model` is written once, against the small vocabulary
of :class:`Logic` (``If``, ``And``, ``forall``, arrays, ``define``, the message
*slots*), and Python's own ``==``, ``<=`` and ``+``, which mean the right thing
on both Z3 terms and Python numbers. It is then read twice:

* :class:`Symbolic` builds Z3 terms: the inductiveness proofs of
  :mod:`proofs.tracker` and :mod:`proofs.epochs` are about these.
* :class:`Concrete` computes Python values: :mod:`proofs.differential` runs the
  same definitions on every state of a small exhaustive domain beside the real
  :mod:`htmqc.core` and compares the answers.

So what the proofs are about is exactly what was compared with the code.

Concrete values. An array (``Int -> X``) is a :class:`Table`: its values on a
finite *universe* of offsets plus one value below it and one above it, which is
all that arrays built by the model from finite data can hold (the differential
check fails with :class:`OutOfUniverse` if one ever needed more). ``forall``
ranges over the universe and one offset far below and far above it, which
stand for every offset outside: there every table holds its outside value and
every comparison with a watermark inside the universe comes out the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import z3

from htmqc.core.lifecycle import MessageState

#: A term: a Z3 expression under :class:`Symbolic`, a Python value under :class:`Concrete`.
Term = Any

#: The slot of an offset that holds no message: never fetched, or a gap.
ABSENT = "ABSENT"

#: Slot names: one per :class:`~htmqc.core.lifecycle.MessageState`, plus ``ABSENT``.
SLOTS: tuple[str, ...] = (*(s.name for s in MessageState), ABSENT)


class OutOfUniverse(Exception):
    """A concrete array was asked to change an offset outside its universe."""


class Logic(ABC):
    """The vocabulary the model is written in (see module docs)."""

    @abstractmethod
    def If(self, cond: Term, then: Term, other: Term) -> Term:
        """``then`` if ``cond`` else ``other``."""

    @abstractmethod
    def And(self, *terms: Term) -> Term:
        """Conjunction (at least one term)."""

    @abstractmethod
    def Or(self, *terms: Term) -> Term:
        """Disjunction (at least one term)."""

    @abstractmethod
    def Not(self, term: Term) -> Term:
        """Negation."""

    def Implies(self, premise: Term, conclusion: Term) -> Term:
        """``premise => conclusion``."""
        return self.Or(self.Not(premise), conclusion)

    @abstractmethod
    def forall(self, name: str, body: Callable[[Term], Term]) -> Term:
        """``body(o)`` for every offset ``o`` (``name`` names the bound variable)."""

    @abstractmethod
    def array(self, name: str, body: Callable[[Term], Term]) -> Term:
        """The array ``o -> body(o)``."""

    @abstractmethod
    def store(self, array: Term, index: Term, value: Term) -> Term:
        """``array`` with ``array[index] = value``."""

    @abstractmethod
    def define(
        self, name: str, lo: Term, hi: Term, relation: Callable[[Term], Term]
    ) -> tuple[Term, Term]:
        """The integer ``v`` in ``[lo, hi]`` with ``relation(v)``, and the constraint
        that defines it. The relation must have exactly one solution there:
        symbolically the constraint becomes a premise; concretely the solution is
        searched for, and the constraint is false unless there is exactly one (a
        transition whose ``pre`` holds must never meet that)."""

    @abstractmethod
    def slot(self, name: str) -> Term:
        """The slot constant named ``name`` (a message state's name, or ``ABSENT``)."""

    @abstractmethod
    def true(self) -> Term:
        """The constant true."""

    def member(self, value: Term, names: tuple[str, ...]) -> Term:
        """The slot ``value`` is one of those named ``names``."""
        return self.Or(*(value == self.slot(n) for n in names))


# -- Z3 ----------------------------------------------------------------------------------


def _slot_sort() -> z3.DatatypeSortRef:
    decl = z3.Datatype("Slot")
    for name in SLOTS:
        decl.declare(name)
    sort: z3.DatatypeSortRef = decl.create()
    return sort


#: The Z3 sort of slots: one constructor per message state, plus ``ABSENT``.
Slot = _slot_sort()


class Symbolic(Logic):
    """Z3 terms; inputs and states are fresh constants (see :meth:`var`)."""

    def If(self, cond: Term, then: Term, other: Term) -> Term:
        return z3.If(cond, then, other)

    def And(self, *terms: Term) -> Term:
        return z3.And(*terms)

    def Or(self, *terms: Term) -> Term:
        return z3.Or(*terms)

    def Not(self, term: Term) -> Term:
        return z3.Not(term)

    def forall(self, name: str, body: Callable[[Term], Term]) -> Term:
        o = z3.Int(name)
        return z3.ForAll([o], body(o))

    def array(self, name: str, body: Callable[[Term], Term]) -> Term:
        o = z3.Int(name)
        value = body(o)
        if isinstance(value, bool):
            value = z3.BoolVal(value)
        elif isinstance(value, int):
            value = z3.IntVal(value)
        return z3.Lambda([o], value)

    def store(self, array: Term, index: Term, value: Term) -> Term:
        return z3.Store(array, index, value)

    def define(
        self, name: str, lo: Term, hi: Term, relation: Callable[[Term], Term]
    ) -> tuple[Term, Term]:
        v = z3.Int(name)
        return v, z3.And(lo <= v, v <= hi, relation(v))

    def slot(self, name: str) -> Term:
        return getattr(Slot, name)

    def true(self) -> Term:
        return z3.BoolVal(True)

    def var(self, name: str, kind: str) -> Term:
        """A fresh constant: ``kind`` is ``int``, ``bool``, ``set`` (``Int -> Bool``),
        ``count`` (``Int -> Int``) or ``slots`` (``Int -> Slot``)."""
        sorts: dict[str, Callable[[], Term]] = {
            "int": lambda: z3.Int(name),
            "bool": lambda: z3.Bool(name),
            "set": lambda: z3.Array(name, z3.IntSort(), z3.BoolSort()),
            "count": lambda: z3.Array(name, z3.IntSort(), z3.IntSort()),
            "slots": lambda: z3.Array(name, z3.IntSort(), Slot),
        }
        return sorts[kind]()


class Bounded(Symbolic):
    """Z3 terms over a finite universe of offsets: ``forall`` is a conjunction over
    the universe and one offset far below and far above it, and :meth:`domain`
    keeps every integer input inside the universe. No quantifiers are left, so Z3
    decides such a problem quickly, and a model of it is a genuine model of the
    unbounded one: every definition reads an array at the bound offset or at an
    integer in the universe, so the arrays, made constant below and above the
    universe (their values at the two far offsets), satisfy every universal
    statement the far offsets satisfied."""

    def __init__(self, universe: range) -> None:
        self.points = _points(universe)
        self.universe = universe
        self._ints: list[Term] = []

    def forall(self, name: str, body: Callable[[Term], Term]) -> Term:
        return z3.And([body(z3.IntVal(o)) for o in self.points])

    def define(
        self, name: str, lo: Term, hi: Term, relation: Callable[[Term], Term]
    ) -> tuple[Term, Term]:
        v, definition = super().define(name, lo, hi, relation)
        self._ints.append(v)
        return v, definition

    def var(self, name: str, kind: str) -> Term:
        value = super().var(name, kind)
        if kind == "int":
            self._ints.append(value)
        return value

    def domain(self) -> list[Term]:
        """Every integer made by :meth:`var` or :meth:`define` lies in the universe."""
        lo, hi = self.universe.start, self.universe.stop
        return [z3.And(lo <= v, v < hi) for v in self._ints]


def _points(universe: range) -> tuple[int, ...]:
    """The universe, and one offset far below and one far above it."""
    if universe.step != 1 or not universe:
        raise ValueError("the universe is a non-empty range of consecutive offsets")
    far = 1_000_000 + len(universe)
    return (universe.start - far, *universe, universe.stop + far)


# -- Python values -----------------------------------------------------------------------


class Table:
    """A concrete array over ``points`` (the universe with one far offset below and
    one above it): its value at every offset below the universe is the one at the
    far offset below, and likewise above. Computed on first use, so the post-state
    of an event the model refuses costs nothing."""

    __slots__ = ("_body", "_points", "_values")

    def __init__(
        self,
        points: tuple[int, ...],
        body: Callable[[int], Any] | None = None,
        values: tuple[Any, ...] | None = None,
    ) -> None:
        self._points = points
        self._body = body
        self._values = values

    def _all(self) -> tuple[Any, ...]:
        values = self._values
        if values is None:
            assert self._body is not None
            values = self._values = tuple(map(self._body, self._points))
            self._body = None
        return values

    def __getitem__(self, o: int) -> Any:
        values = self._values
        if values is None:
            values = self._all()
        i = o - self._points[1] + 1
        if i <= 0:
            return values[0]
        if i >= len(values) - 1:
            return values[-1]
        return values[i]

    @property
    def values(self) -> tuple[Any, ...]:
        """The values on the universe."""
        return self._all()[1:-1]

    def items(self) -> Iterator[tuple[int, Any]]:
        """``(offset, value)`` over the universe."""
        return enumerate(self.values, self._points[1])

    def stored(self, o: int, value: Any) -> Table:
        """A copy with ``value`` at the universe offset ``o``."""
        values = list(self._all())
        values[o - self._points[1] + 1] = value
        return Table(self._points, values=tuple(values))


class Concrete(Logic):
    """Python values over the offsets ``universe`` (see module docs)."""

    def __init__(self, universe: range) -> None:
        self._points = _points(universe)
        self.universe = universe

    def If(self, cond: Term, then: Term, other: Term) -> Term:
        return then if cond else other

    def And(self, *terms: Term) -> Term:
        return all(terms)

    def Or(self, *terms: Term) -> Term:
        return any(terms)

    def Not(self, term: Term) -> Term:
        return not term

    def Implies(self, premise: Term, conclusion: Term) -> Term:
        return (not premise) or conclusion

    def true(self) -> Term:
        return True

    def member(self, value: Term, names: tuple[str, ...]) -> Term:
        return value in names

    def forall(self, name: str, body: Callable[[Term], Term]) -> Term:
        return all(body(o) for o in self._points)

    def array(self, name: str, body: Callable[[Term], Term]) -> Term:
        return Table(self._points, body)

    def table(self, values: dict[int, Any], default: Any) -> Table:
        """The array that is ``values`` on its keys and ``default`` elsewhere."""
        outside = set(values) - set(self.universe)
        if outside:
            raise OutOfUniverse(f"offsets {sorted(outside)} are outside {self.universe}")
        return Table(self._points, values=tuple(values.get(o, default) for o in self._points))

    def members(self, array: Table) -> tuple[int, ...]:
        """The offsets of the universe where a boolean array is true, in order."""
        return tuple(o for o, v in array.items() if v)

    def store(self, array: Term, index: Term, value: Term) -> Term:
        if index not in self.universe:
            raise OutOfUniverse(f"offset {index} is outside {self.universe}")
        return array.stored(index, value)

    def define(
        self, name: str, lo: Term, hi: Term, relation: Callable[[Term], Term]
    ) -> tuple[Term, Term]:
        found = [v for v in range(lo, hi + 1) if relation(v)]
        if len(found) != 1:
            return None, False
        return found[0], True

    def slot(self, name: str) -> Term:
        return name


def all_of(logic: Logic, terms: Iterable[Term]) -> Term:
    """Conjunction of a possibly empty sequence of terms."""
    listed = list(terms)
    return logic.And(*listed) if listed else logic.true()
