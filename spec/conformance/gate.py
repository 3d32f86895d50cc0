"""Conformance vectors of the partition gate (``"kind": "gate"``, spec §5a).

Generated from the independent reference model
(:class:`model_checks.reference_gate.RefGate`): the hand-written scenarios
below (one reading of the spec each) and seeded random walks; replayed
through :class:`htmqc.core.gate.Gate`. The format is in
``spec/conformance/README.md``: each step is one gate method, its actions in
the spec's order (Drop, Claim, Pause, the Seeks, Resume; partitions sorted
within an action, Seeks by partition) or the error ``IllegalTransition``, and
the gate's state afterwards (``Gate.snapshot()``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from htmqc.core.errors import IllegalTransition
from htmqc.core.gate import Gate, GateAction, Hold, Seek
from model_checks.reference_gate import RefGate, RefGateError
from spec.conformance.replay import parse_tp as _tp
from spec.conformance.replay import step_mismatches

KIND = "gate"
FENCE_GRACE = 10.0
#: The order of the action types in an answer (spec §5a).
ORDER = ("Drop", "Claim", "Pause", "Seek", "Resume")
RANDOM_SEEDS = (1, 2, 3)
TPS = ("t/0", "t/1", "t.retry/0")

TP = tuple[str, int]


def _name(tp: TP) -> str:
    return f"{tp[0]}/{tp[1]}"


def _sorted(tps: Sequence[TP]) -> list[str]:
    return [_name(tp) for tp in sorted(tps)]


def actions_json(actions: Sequence[GateAction]) -> list[dict[str, Any]]:
    """The gate's actions in the vectors' vocabulary (partitions sorted)."""
    out: list[dict[str, Any]] = []
    seeks = sorted((a for a in actions if isinstance(a, Seek)), key=lambda a: a.tp)
    for action in actions:
        if not isinstance(action, Seek):
            out.append({"type": type(action).__name__, "tps": _sorted(action.tps)})
        elif action is seeks[0]:  # the Seeks come together: write them in partition order
            out.extend({"type": "Seek", "tp": _name(a.tp), "offset": a.offset} for a in seeks)
    return out


def effects_json(effects: set[tuple[object, ...]]) -> list[dict[str, Any]]:
    """The reference model's effect set as the spec orders it."""
    by: dict[str, list[Any]] = {}
    for effect in effects:
        by.setdefault(str(effect[0]), []).append(effect[1:])
    out: list[dict[str, Any]] = []
    for kind in ORDER:
        items = by.get(kind.lower())
        if not items:
            continue
        if kind == "Seek":
            out.extend(
                {"type": "Seek", "tp": _name(tp), "offset": off} for tp, off in sorted(items)
            )
        else:
            out.append({"type": kind, "tps": _sorted([tp for (tp,) in items])})
    return out


def ref_state(ref: RefGate) -> dict[str, Any]:
    """The reference model's state as ``Gate.snapshot()`` writes it."""
    return {
        "holds": sorted(str(getattr(h, "value", h)) for h in ref.holds),
        "partitions": {
            _name(tp): {
                "state": state,
                "paused": ref.told.get(tp),
                "since": ref.since.get(tp),
                "until": ref.until.get(tp),
            }
            for tp, state in sorted(ref.state.items())
        },
    }


# -- generating ----------------------------------------------------------------------------


class GateRecorder:
    """Drives the reference gate and records every step."""

    def __init__(self) -> None:
        self.ref = RefGate(fence_grace=FENCE_GRACE)
        self.steps: list[dict[str, Any]] = []

    def _do(self, op: str, args: dict[str, Any], call: Callable[[], set[Any]]) -> None:
        before = ref_state(self.ref)
        step: dict[str, Any] = {"op": op, "args": args}
        try:
            step["result"] = effects_json(call())
        except RefGateError:
            if ref_state(self.ref) != before:
                raise AssertionError(f"the reference gate changed on a refused {op}") from None
            step["error"] = "IllegalTransition"
        step["state"] = ref_state(self.ref)
        self.steps.append(step)

    def assigned(self, *tps: str) -> None:
        self._do("assigned", {"tps": list(tps)}, lambda: self.ref.assigned(map(_tp, tps)))

    def claim(self, positions: Sequence[tuple[str, int]]) -> None:
        args = {"positions": [[tp, off] for tp, off in positions]}
        self._do("claimed", args, lambda: self.ref.claimed({_tp(t): o for t, o in positions}))

    def retry_wait(self, tp: str, offset: int, until: float) -> None:
        args = {"tp": tp, "offset": offset, "until": until}
        self._do("retry_wait", args, lambda: self.ref.retry_wait(_tp(tp), offset, until))

    def rolled_back(self, stale: Sequence[str], now: float) -> None:
        args = {"stale": list(stale), "now": now}
        self._do("rolled_back", args, lambda: self.ref.rolled_back(map(_tp, stale), now))

    def tick(self, now: float) -> None:
        self._do("tick", {"now": now}, lambda: self.ref.tick(now))

    def revoking(self, *tps: str) -> None:
        self._do("revoking", {"tps": list(tps)}, lambda: self.ref.revoking(map(_tp, tps)))

    def revoked(self, *tps: str) -> None:
        self._do("revoked", {"tps": list(tps)}, lambda: self.ref.revoked(map(_tp, tps)))

    def lost(self, *tps: str) -> None:
        self._do("lost", {"tps": list(tps)}, lambda: self.ref.lost(map(_tp, tps)))

    def hold(self, reason: str, on: bool = True) -> None:
        op = "hold" if on else "unhold"
        call = self.ref.hold if on else self.ref.unhold
        self._do(op, {"reason": reason}, lambda: call(Hold(reason)))


A, B, R = TPS


def gate_assign_and_holds(r: GateRecorder) -> None:
    """After a claim the gate always says Pause or Resume (librdkafka keeps a pause across
    assignments); holds pause Active partitions and the last one lifted resumes them; a
    partition assigned again while held is dropped and claimed again."""
    r.assigned(A, B)
    r.claim([(A, 0), (B, 5)])
    r.hold("flow")
    r.hold("breaker")
    r.hold("flow", on=False)
    r.assigned(A)
    r.claim([(A, 3)])
    r.hold("breaker", on=False)
    r.assigned(A, A)
    r.claim([(A, 3)])


def gate_fence_and_reclaim(r: GateRecorder) -> None:
    """A rolled-back transaction drops every held partition: the stale one is Fenced
    (paused, from now), the others are claimed again and Seek to their claimed position;
    after the fence grace tick claims the fenced one again; a tick before it does nothing."""
    r.assigned(A, B)
    r.claim([(A, 0), (B, 0)])
    r.rolled_back([A], 100.0)
    r.claim([(B, 7)])
    r.rolled_back([B], 101.0)
    r.tick(109.9)
    r.tick(110.0)
    r.claim([(A, 4)])
    r.tick(111.0)
    r.claim([(B, 9)])
    r.hold("flow")
    r.rolled_back([], 120.0)
    r.claim([(A, 4), (B, 9)])


def gate_retry_wait(r: GateRecorder) -> None:
    """A retry-topic record not due: Pause and Seek back to it; lifting a hold never resumes
    a Waiting partition; tick at its due time resumes it (unless a hold is on); a second wait
    while Waiting seeks again."""
    r.assigned(R)
    r.claim([(R, 0)])
    r.retry_wait(R, 4, 50.0)
    r.hold("flow")
    r.hold("flow", on=False)
    r.retry_wait(R, 5, 60.0)
    r.tick(59.0)
    r.hold("breaker")
    r.tick(60.0)
    r.hold("breaker", on=False)
    r.assigned(R)
    r.retry_wait(R, 5, 70.0)


def gate_revoke_lost_refusals(r: GateRecorder) -> None:
    """Revoking drains a held partition (Draining) or lets go of one not held (Leaving);
    revoked forgets it (Drop only if the core held it); lost takes any state away and
    ignores partitions not assigned; events with no edge are refused and change nothing."""
    r.assigned(A, B)
    r.revoked(A)
    r.retry_wait(A, 1, 5.0)
    r.claim([(A, 0)])
    r.claim([(A, 0)])
    r.revoking(A, B)
    r.assigned(A)
    r.rolled_back([A, B], 1.0)
    r.revoked(A, B)
    r.assigned(A)
    r.lost(A, B, R)
    r.revoking(A)
    r.tick(1000.0)


SCENARIOS: dict[str, Callable[[GateRecorder], None]] = {
    f.__name__: f
    for f in (gate_assign_and_holds, gate_fence_and_reclaim, gate_retry_wait,
              gate_revoke_lost_refusals)
}


def random_walk(r: GateRecorder, seed: int, steps: int = 80) -> None:
    """Legal and illegal events at random, time moving forward."""
    rng = random.Random(seed)
    now = 0.0

    def some() -> list[str]:
        return rng.sample(TPS, rng.randint(1, len(TPS)))

    for _ in range(steps):
        now += rng.choice([0.0, 1.0, 2.5, FENCE_GRACE])
        claiming = [_name(tp) for tp, s in sorted(r.ref.state.items())
                    if s in ("Claiming", "Reclaiming")]
        choice = rng.choices(
            ["assigned", "claimed", "retry_wait", "rolled_back", "tick", "revoking",
             "revoked", "lost", "hold", "unhold"],
            [2.0, 3.0 if claiming else 0.5, 1.0, 1.0, 2.0, 1.0, 1.0, 0.5, 1.0, 1.0],
        )[0]
        if choice == "assigned":
            r.assigned(*some())
        elif choice == "claimed":
            tps = claiming if claiming and rng.random() < 0.8 else some()
            r.claim([(tp, rng.randrange(0, 20)) for tp in tps])
        elif choice == "retry_wait":
            r.retry_wait(rng.choice(TPS), rng.randrange(0, 20), now + rng.choice([0.0, 3.0]))
        elif choice == "rolled_back":
            r.rolled_back(rng.sample(TPS, rng.randint(0, 2)), now)
        elif choice == "tick":
            r.tick(now)
        elif choice in ("revoking", "revoked", "lost"):
            getattr(r, choice)(*some())
        else:
            r.hold(rng.choice(["flow", "breaker"]), on=choice == "hold")


def vectors(fmt: int) -> dict[str, dict[str, Any]]:
    """Every gate vector, by file stem, generated afresh."""
    out = {}
    runs: list[tuple[str, str, Callable[[GateRecorder], None]]] = [
        (name, (scenario.__doc__ or "").strip(), scenario) for name, scenario in SCENARIOS.items()
    ]
    runs += [
        (f"gate_random_{seed}",
         f"Seeded random walk of the gate, seed {seed}: legal and illegal events, time passing.",
         lambda r, seed=seed: random_walk(r, seed))
        for seed in RANDOM_SEEDS
    ]
    for name, description, run in runs:
        r = GateRecorder()
        run(r)
        out[name] = {
            "format": fmt, "kind": KIND, "name": name,
            "description": " ".join(description.split()), "fence_grace": FENCE_GRACE,
            "steps": r.steps,
        }
    return out


# -- replaying -----------------------------------------------------------------------------


def call(gate: Gate, op: str, args: dict[str, Any]) -> list[GateAction]:
    """Perform one step on ``gate``."""
    if op == "claimed":
        return gate.claimed({_tp(tp): off for tp, off in args["positions"]})
    if op == "retry_wait":
        return gate.retry_wait(_tp(args["tp"]), args["offset"], args["until"])
    if op == "rolled_back":
        return gate.rolled_back([_tp(tp) for tp in args["stale"]], args["now"])
    if op == "tick":
        return gate.tick(args["now"])
    if op in ("hold", "unhold"):
        return list(getattr(gate, op)(Hold(args["reason"])))
    if op in ("assigned", "revoking", "revoked", "lost"):
        return list(getattr(gate, op)([_tp(tp) for tp in args["tps"]]))
    raise ValueError(f"unknown gate op {op!r}")


def mismatches(vector: dict[str, Any]) -> Iterator[str]:
    """Every difference between ``Gate`` and a gate vector (stops at the first state)."""
    gate = Gate(fence_grace=vector["fence_grace"])
    yield from step_mismatches(
        vector, lambda op, args: actions_json(call(gate, op, args)), gate.snapshot,
        (IllegalTransition,),
    )
