"""One proof obligation and how Z3 discharges it.

An :class:`Obligation` is ``premises => goal`` plus what we expect: ``PROVED``
for a lemma, ``COUNTEREXAMPLE`` for a mutant. :func:`discharge` first checks
that the premises are satisfiable (a proof from contradictory premises proves
nothing and is reported ``VACUOUS``), then whether ``premises and not goal`` is,
one named part of the goal at a time.

An obligation about offsets may carry ``bounded``: the same statement over a
finite universe of offsets (:class:`proofs.logic.Bounded`), without quantifiers.
Its models are genuine models of the unbounded statement, so it is where
:func:`discharge` looks first, both for a witness that the premises can hold and
for a counterexample (one with small numbers). Only when it finds none does it
prove the part over unbounded integers: with Z3's model-based quantifier
instantiation, and if that times out, once more with every universal premise
instantiated at every integer constant of the problem (weaker premises, so
``unsat`` is still a proof).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Literal

import z3

Verdict = Literal["PROVED", "COUNTEREXAMPLE", "VACUOUS", "UNKNOWN"]

#: Milliseconds Z3 may spend on one satisfiability check.
TIMEOUT_MS = 30_000
#: Milliseconds for the first, model-based attempt at an unbounded proof.
QUICK_MS = 3_000


@dataclass(frozen=True)
class Obligation:
    """``premises => goal``; ``shown`` names the terms printed in a counterexample;
    ``parts`` names conjuncts of the goal: a counterexample lists those it breaks."""

    name: str
    premises: Sequence[z3.BoolRef]
    goal: z3.BoolRef
    doc: str
    expect: Literal["PROVED", "COUNTEREXAMPLE"] = "PROVED"
    shown: Mapping[str, z3.ExprRef] = field(default_factory=dict)
    parts: Mapping[str, z3.BoolRef] = field(default_factory=dict)
    bounded: Obligation | None = None


@dataclass(frozen=True)
class Outcome:
    """The verdict on one obligation."""

    name: str
    expect: str
    verdict: Verdict
    seconds: float
    model: str
    doc: str

    @property
    def ok(self) -> bool:
        """True when the verdict is the expected one."""
        return self.verdict == self.expect

    def line(self) -> str:
        """``PROVED name`` or ``COUNTEREXAMPLE name: model`` (and so on)."""
        tail = f": {self.model}" if self.model else ""
        note = "" if self.ok else f"   <-- expected {self.expect}"
        return f"{self.verdict} {self.name}{tail}{note}"


def _flat(terms: Sequence[z3.BoolRef]) -> list[z3.BoolRef]:
    """Conjunctions split into their conjuncts (Z3 instantiates separately asserted
    quantifiers far more readily than one big conjunction)."""
    out: list[z3.BoolRef] = []
    for term in terms:
        if z3.is_and(term):
            out += _flat(term.children())
        else:
            out.append(term)
    return out


class _NotInstantiable(Exception):
    """A quantifier where :func:`_instantiate` cannot handle it."""


def _instantiate(
    term: z3.ExprRef, terms: Sequence[z3.ExprRef], positive: bool, skolems: list[z3.ExprRef]
) -> z3.ExprRef:
    """``term`` without quantifiers: a universal in positive position becomes the
    conjunction of its instances at ``terms``; one in negative position (an
    existential) becomes its instance at a fresh constant, added to ``skolems``."""

    def again(t: z3.ExprRef, pos: bool = positive) -> z3.ExprRef:
        return _instantiate(t, terms, pos, skolems)

    if z3.is_quantifier(term) and not term.is_lambda():
        if not term.is_forall():
            raise _NotInstantiable(str(term))
        n = term.num_vars()
        if not positive:
            fresh = [z3.FreshConst(term.var_sort(i), "sk") for i in range(n)]
            skolems += fresh
            return again(z3.substitute_vars(term.body(), *reversed(fresh)))
        return z3.And(
            [
                again(z3.substitute_vars(term.body(), *reversed(combo)))
                for combo in product(terms, repeat=n)
            ]
        )
    if z3.is_and(term):
        return z3.And([again(c) for c in term.children()])
    if z3.is_or(term):
        return z3.Or([again(c) for c in term.children()])
    if z3.is_not(term):
        return z3.Not(again(term.arg(0), not positive))
    if z3.is_implies(term):
        return z3.Implies(again(term.arg(0), not positive), again(term.arg(1)))
    if _has_quantifier(term):
        raise _NotInstantiable(str(term))
    return term


def _has_quantifier(term: z3.ExprRef) -> bool:
    if z3.is_quantifier(term):
        return not term.is_lambda() or _has_quantifier(term.body())
    return any(_has_quantifier(c) for c in term.children())


def _constants(terms: Sequence[z3.ExprRef]) -> list[z3.ExprRef]:
    """The integer constants (uninterpreted, no arguments) occurring in ``terms``."""
    seen: dict[int, z3.ExprRef] = {}
    stack = list(terms)
    while stack:
        t = stack.pop()
        if z3.is_quantifier(t):
            stack.append(t.body())
        elif z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            if t.sort() == z3.IntSort():
                seen[t.get_id()] = t
        else:
            stack.extend(t.children())
    return list(seen.values())


def _instantiated(premises: Sequence[z3.BoolRef], negated: z3.BoolRef) -> list[z3.BoolRef]:
    """Premises and negated goal without quantifiers: universals instantiated at every
    integer constant (and skolem constant) around. Weaker premises, so ``unsat`` is
    still a proof; ``sat`` proves nothing."""
    skolems: list[z3.ExprRef] = []
    goal = _instantiate(negated, [], True, skolems)
    terms = _constants([*premises, goal]) + skolems
    return [*(_instantiate(p, terms, True, []) for p in premises), goal]


def _check(
    premises: Sequence[z3.BoolRef], *extra: z3.BoolRef, timeout: int = TIMEOUT_MS
) -> tuple[z3.CheckSatResult, z3.Solver]:
    solver = z3.Solver()
    solver.set("timeout", timeout)
    solver.add(*premises, *extra)
    return solver.check(), solver


def _prove(premises: Sequence[z3.BoolRef], part: z3.BoolRef) -> tuple[z3.CheckSatResult, z3.Solver]:
    """Is ``premises and not part`` satisfiable over unbounded integers (module docs)?"""
    negated = z3.Not(part)
    answer, solver = _check(premises, negated, timeout=QUICK_MS)
    if answer != z3.unknown:
        return answer, solver
    try:
        quick, solver = _check(_instantiated(premises, negated))
    except _NotInstantiable:
        quick = z3.unknown
    return (z3.unsat, solver) if quick == z3.unsat else (z3.unknown, solver)


def _shown(ob: Obligation, solver: z3.Solver) -> str:
    found = solver.model()
    return ", ".join(
        f"{label}={found.eval(term, model_completion=True)}" for label, term in ob.shown.items()
    )


def discharge(ob: Obligation) -> Outcome:
    """Ask Z3 about ``ob``; never raises for a failed proof.

    Each part of the goal is settled on its own (their conjunction is the goal):
    PROVED if every part is, COUNTEREXAMPLE if one is refuted (the model is the first
    refutation's, followed by every part refuted), else UNKNOWN."""
    began = time.perf_counter()
    premises = _flat(ob.premises)
    small = ob.bounded
    small_premises = _flat(small.premises) if small else []
    model = ""
    first, _ = _check(small_premises) if small else (z3.unknown, None)
    if first != z3.sat:
        first, _ = _check(premises)
    if first == z3.unsat:
        verdict: Verdict = "VACUOUS"
    elif first == z3.unknown:
        verdict = "UNKNOWN"
    else:
        parts = dict(ob.parts) or {"goal": ob.goal}
        refuted: dict[str, str] = {}
        unsettled = False
        for name, part in parts.items():
            if small:
                answer, solver = _check(small_premises, z3.Not(small.parts.get(name, small.goal)))
                if answer == z3.sat:
                    refuted[name] = _shown(small, solver)
                    continue
            answer, solver = _prove(premises, part)
            if answer == z3.sat:
                refuted[name] = _shown(ob, solver)
            unsettled |= answer == z3.unknown
        if refuted:
            verdict = "COUNTEREXAMPLE"
            model = next(iter(refuted.values()))
            if ob.parts:
                model += f"; breaks {', '.join(refuted)}"
        else:
            verdict = "UNKNOWN" if unsettled else "PROVED"
    return Outcome(
        name=ob.name,
        expect=ob.expect,
        verdict=verdict,
        seconds=round(time.perf_counter() - began, 4),
        model=model,
        doc=ob.doc,
    )
