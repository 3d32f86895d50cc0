"""One proof obligation and how Z3 discharges it.

An :class:`Obligation` is ``premises => goal`` plus what we expect: ``PROVED``
for a lemma, ``COUNTEREXAMPLE`` for a mutant. :func:`discharge` first checks
that the premises are satisfiable (a proof from contradictory premises proves
nothing and is reported ``VACUOUS``), then whether ``premises and not goal`` is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import z3

Verdict = Literal["PROVED", "COUNTEREXAMPLE", "VACUOUS", "UNKNOWN"]

#: Milliseconds Z3 may spend on one satisfiability check.
TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Obligation:
    """``premises => goal``; ``shown`` names the terms printed in a counterexample."""

    name: str
    premises: Sequence[z3.BoolRef]
    goal: z3.BoolRef
    doc: str
    expect: Literal["PROVED", "COUNTEREXAMPLE"] = "PROVED"
    shown: Mapping[str, z3.ExprRef] = field(default_factory=dict)


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


def discharge(ob: Obligation) -> Outcome:
    """Ask Z3 about ``ob``; never raises for a failed proof."""
    began = time.perf_counter()
    solver = z3.Solver()
    solver.set("timeout", TIMEOUT_MS)
    solver.add(*ob.premises)
    model = ""
    first = solver.check()
    if first == z3.unsat:
        verdict: Verdict = "VACUOUS"
    elif first == z3.unknown:
        verdict = "UNKNOWN"
    else:
        solver.add(z3.Not(ob.goal))
        answer = solver.check()
        if answer == z3.unsat:
            verdict = "PROVED"
        elif answer == z3.sat:
            verdict = "COUNTEREXAMPLE"
            found = solver.model()
            model = ", ".join(
                f"{label}={found.eval(term, model_completion=True)}"
                for label, term in ob.shown.items()
            )
        else:
            verdict = "UNKNOWN"
    return Outcome(
        name=ob.name,
        expect=ob.expect,
        verdict=verdict,
        seconds=round(time.perf_counter() - began, 4),
        model=model,
        doc=ob.doc,
    )
