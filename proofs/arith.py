"""Arithmetic lemmas: the offset conventions and the retry backoff bound.

* ``offsets:conventions`` runs the real :func:`htmqc.core.offsets.to_inclusive`
  and :func:`~htmqc.core.offsets.from_inclusive` (unwrapped from their
  contracts) on symbolic integers, and proves for every integer triple that
  ``holds(w) <=> holds_inclusive(to_inclusive(w))`` and the converse.
* ``backoff:bounded`` restates :meth:`htmqc.core.retry.RetryPolicy.delay` over
  the reals. ``2.0**exponent`` is an uninterpreted positive real (whatever its
  value, the clamps bound the result); Python's ``min(a, b)`` is ``b if b < a
  else a`` and ``max(a, b)`` is ``b if b > a else a``. Proves
  ``0 <= delay <= cap`` for every attempt >= 1, jitter in [0, 1] and
  0 <= base <= cap, and that the clamped exponent is in [0, 1000].
* ``backoff:bounded[ieee754]`` proves the same bound in IEEE-754 doubles with
  round-to-nearest-even, as Python computes it (rounding, infinities and the
  NaN of ``0.0 * inf`` included): any positive ``power``, any
  ``0 <= base <= cap`` (``cap`` may be infinite), any ``jitter`` in [0, 1].

* ``flow:window_bounded`` restates :meth:`htmqc.core.flow.FlowWindow.observe`
  over the integers (``int(w * d)`` for a positive real product is its floor):
  for every policy that :class:`~htmqc.core.flow.FlowPolicy` accepts, a window in
  ``[min_window, max_window]`` stays there after any interval, grows (or stays)
  when the interval is healthy and shrinks (or stays) when it is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import z3

from htmqc.core import offsets, retry
from proofs.obligation import Obligation


def _holds(w: offsets.Watermarks) -> z3.BoolRef:
    return z3.And(w.committed <= w.processed, w.processed <= w.next)


def _holds_inclusive(w: offsets.InclusiveWatermarks) -> z3.BoolRef:
    return z3.And(w.last_committed <= w.last_processed, w.last_processed < w.next)


def _py_min(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    return z3.If(b < a, b, a)


def _py_max(a: z3.ArithRef, b: z3.ArithRef) -> z3.ArithRef:
    return z3.If(b > a, b, a)


def _delay(
    base: z3.ArithRef, cap: z3.ArithRef, power: z3.ArithRef, jitter: z3.ArithRef
) -> z3.ArithRef:
    ceiling = _py_min(cap, base * power)
    return _py_min(cap, _py_max(z3.RealVal(0), jitter * ceiling))


def obligations() -> Iterator[Obligation]:
    """The offset-convention and backoff lemmas, and one mutant of each."""
    c, p, n = z3.Ints("committed processed next")
    lc, lp = z3.Ints("last_committed last_processed")
    to_inclusive = inspect.unwrap(offsets.to_inclusive)
    from_inclusive = inspect.unwrap(offsets.from_inclusive)
    w = offsets.Watermarks(c, p, n)
    iw = offsets.InclusiveWatermarks(lc, lp, n)
    shown = {"committed": c, "processed": p, "next": n}
    yield Obligation(
        "offsets:conventions",
        [],
        z3.And(
            _holds(w) == _holds_inclusive(to_inclusive(w)),
            _holds_inclusive(iw) == _holds(from_inclusive(iw)),
            *(a == b for a, b in zip(from_inclusive(to_inclusive(w)), w, strict=True)),
        ),
        "holds(w) <=> holds_inclusive(to_inclusive(w)), both ways, for all integers",
        shown=shown,
    )
    yield Obligation(
        "mutant:offsets_without_shift",
        [],
        _holds(w) == _holds_inclusive(offsets.InclusiveWatermarks(c, p, n)),
        "MUTANT of to_inclusive: last_x = x (no -1)",
        expect="COUNTEREXAMPLE",
        shown=shown,
    )
    base, cap, power, jitter = z3.Reals("base cap power jitter")
    attempt = z3.Int("attempt")
    assumptions = [attempt >= 1, jitter >= 0, jitter <= 1, base >= 0, base <= cap, power > 0]
    shown_b = {"base": base, "cap": cap, "power": power, "jitter": jitter}
    delay = _delay(base, cap, power, jitter)
    exponent = z3.If(attempt - 1 > retry._MAX_EXPONENT, retry._MAX_EXPONENT, attempt - 1)
    yield Obligation(
        "backoff:bounded",
        assumptions,
        z3.And(delay >= 0, delay <= cap, exponent >= 0, exponent <= retry._MAX_EXPONENT),
        "RetryPolicy.delay: 0 <= delay <= max_delay, exponent clamped to [0, 1000]",
        shown=shown_b,
    )
    yield _backoff_ieee754()
    unclamped = jitter * base * power
    yield Obligation(
        "mutant:backoff_without_clamp",
        assumptions,
        z3.And(unclamped >= 0, unclamped <= cap),
        "MUTANT of delay: jitter * base * 2**n without the min/max clamps",
        expect="COUNTEREXAMPLE",
        shown=shown_b,
    )
    yield from _flow_obligations()


def _flow_obligations() -> Iterator[Obligation]:
    lo, hi, w, inc, completed = z3.Ints("min_window max_window window increase completed")
    dec = z3.Real("decrease")
    healthy = z3.Bool("healthy")
    policy = [lo >= 1, lo <= hi, inc >= 1, dec > 0, dec < 1, completed >= 0]
    inv = z3.And(lo <= w, w <= hi)
    shrunk = z3.ToInt(z3.ToReal(w) * dec)
    grown = z3.If(completed > 0, _py_min(hi, w + inc), w)
    after = z3.If(healthy, grown, _py_max(lo, shrunk))
    shown = {"min": lo, "max": hi, "window": w, "increase": inc, "decrease": dec}
    yield Obligation(
        "flow:window_bounded",
        [*policy, inv],
        z3.And(
            lo <= after,
            after <= hi,
            z3.Implies(healthy, after >= w),
            z3.Implies(z3.Not(healthy), after <= w),
        ),
        "FlowWindow.observe keeps min_window <= window <= max_window; AIMD direction",
        shown=shown,
    )
    yield Obligation(
        "mutant:flow_decrease_without_floor",
        [*policy, inv],
        z3.And(lo <= shrunk, shrunk <= hi),
        "MUTANT of observe: window * decrease without the min_window clamp",
        expect="COUNTEREXAMPLE",
        shown=shown,
    )


def _backoff_ieee754() -> Obligation:
    double = z3.Float64()
    rne = z3.RNE()
    base, cap, power, jitter = (z3.FP(n, double) for n in ("base", "cap", "power", "jitter"))
    zero, one = z3.FPVal(0.0, double), z3.FPVal(1.0, double)

    def py_min(a: z3.FPRef, b: z3.FPRef) -> z3.FPRef:
        return z3.If(z3.fpLT(b, a), b, a)

    def py_max(a: z3.FPRef, b: z3.FPRef) -> z3.FPRef:
        return z3.If(z3.fpGT(b, a), b, a)

    ceiling = py_min(cap, z3.fpMul(rne, base, power))
    delay = py_min(cap, py_max(zero, z3.fpMul(rne, jitter, ceiling)))
    return Obligation(
        "backoff:bounded[ieee754]",
        [
            z3.fpLEQ(zero, jitter),
            z3.fpLEQ(jitter, one),
            z3.fpLEQ(zero, base),
            z3.fpLEQ(base, cap),
            z3.fpGT(power, zero),
        ],
        z3.And(z3.fpLEQ(zero, delay), z3.fpLEQ(delay, cap)),
        "RetryPolicy.delay in float64: 0.0 <= delay <= max_delay",
        shown={"base": base, "cap": cap, "power": power, "jitter": jitter},
    )
