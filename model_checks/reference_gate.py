"""An independent reference model of :class:`htmqc.core.gate.Gate`.

Deliberately naive: one method per event written out as plain ``if``s over
state names (no transition table, no derived effect sets), pause decisions
recomputed from scratch, effects answered as a set of tuples:
``("drop", tp)``, ``("claim", tp)``, ``("pause", tp)``, ``("resume", tp)``,
``("seek", tp, offset)``. The Hypothesis tests drive the gate and this model
with the same events and compare states and effects after every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TP = tuple[str, int]
Effects = set[tuple[object, ...]]

# States in which the consumer core holds the partition.
_CORE_HOLDS = ("Active", "Waiting", "Draining")


class RefGateError(Exception):
    """The model refuses an event (the gate must refuse it too)."""


class RefGate:
    """The naive twin of :class:`htmqc.core.gate.Gate`."""

    def __init__(self, fence_grace: float) -> None:
        self.grace = fence_grace
        self.state: dict[TP, str] = {}
        self.since: dict[TP, float] = {}
        self.until: dict[TP, float] = {}
        self.holds: set[object] = set()
        # What Kafka was last told per partition; absent: not known.
        self.told: dict[TP, bool] = {}

    # -- helpers -------------------------------------------------------------------------

    def _want(self, tp: TP) -> bool | None:
        s = self.state[tp]
        if s == "Waiting" or s == "Fenced":
            return True
        if s == "Active":
            return len(self.holds) > 0
        return None

    def _sync(self, tps: Iterable[TP], out: Effects) -> Effects:
        for tp in tps:
            if tp not in self.state:
                continue
            want = self._want(tp)
            if want is None or self.told.get(tp) == want:
                continue
            out.add(("pause", tp) if want else ("resume", tp))
            self.told[tp] = want
        return out

    def _set(self, tp: TP, new: str, out: Effects) -> None:
        old = self.state.get(tp, "Unassigned")
        if old in _CORE_HOLDS and new not in _CORE_HOLDS:
            out.add(("drop", tp))
        if new != "Fenced":
            self.since.pop(tp, None)
        if new != "Waiting":
            self.until.pop(tp, None)
        if new == "Unassigned":
            self.state.pop(tp, None)
        else:
            self.state[tp] = new

    def _check(self, tps: Iterable[TP], allowed: tuple[str, ...]) -> list[TP]:
        tps = list(dict.fromkeys(tps))
        for tp in tps:
            if self.state.get(tp, "Unassigned") not in allowed:
                raise RefGateError(f"{tp} is {self.state.get(tp, 'Unassigned')}")
        return tps

    # -- events --------------------------------------------------------------------------

    def assigned(self, tps: Iterable[TP]) -> Effects:
        tps = self._check(tps, ("Unassigned", "Active", "Waiting", "Fenced"))
        out: Effects = set()
        for tp in tps:
            self._set(tp, "Claiming", out)
            out.add(("claim", tp))
            self.told.pop(tp, None)  # librdkafka keeps pauses across assignments
        return out

    def claimed(self, positions: Mapping[TP, int]) -> Effects:
        self._check(positions, ("Claiming", "Reclaiming"))
        out: Effects = set()
        for tp, offset in positions.items():
            if self.state[tp] == "Reclaiming":
                out.add(("seek", tp, offset))
            self._set(tp, "Active", out)
        return self._sync(positions, out)

    def retry_wait(self, tp: TP, offset: int, until: float) -> Effects:
        self._check([tp], ("Active", "Waiting"))
        out: Effects = {("seek", tp, offset)}
        self._set(tp, "Waiting", out)
        self.until[tp] = until
        return self._sync([tp], out)

    def rolled_back(self, stale: Iterable[TP], now: float) -> Effects:
        stale = set(stale)
        out: Effects = set()
        for tp in list(self.state):
            s = self.state[tp]
            if s in ("Active", "Waiting"):
                if tp in stale:
                    self._set(tp, "Fenced", out)
                    self.since[tp] = now
                else:
                    self._set(tp, "Reclaiming", out)
                    out.add(("claim", tp))
            elif s == "Draining":
                self._set(tp, "Leaving", out)
        return self._sync(list(self.state), out)

    def tick(self, now: float) -> Effects:
        out: Effects = set()
        for tp in list(self.state):
            if self.state[tp] == "Fenced" and now - self.since[tp] >= self.grace:
                self._set(tp, "Reclaiming", out)
                out.add(("claim", tp))
            elif self.state[tp] == "Waiting" and self.until[tp] <= now:
                self._set(tp, "Active", out)
        return self._sync(list(self.state), out)

    def revoking(self, tps: Iterable[TP]) -> Effects:
        tps = self._check(tps, ("Active", "Waiting", "Claiming", "Fenced", "Reclaiming"))
        out: Effects = set()
        for tp in tps:
            held = self.state[tp] in ("Active", "Waiting")
            self._set(tp, "Draining" if held else "Leaving", out)
        return out

    def revoked(self, tps: Iterable[TP]) -> Effects:
        tps = self._check(tps, ("Draining", "Leaving"))
        out: Effects = set()
        for tp in tps:
            self._set(tp, "Unassigned", out)
            self.told.pop(tp, None)
        return out

    def lost(self, tps: Iterable[TP]) -> Effects:
        out: Effects = set()
        for tp in dict.fromkeys(tps):
            if tp in self.state:
                self._set(tp, "Unassigned", out)
                self.told.pop(tp, None)
        return out

    def hold(self, reason: object) -> Effects:
        self.holds.add(reason)
        return self._sync(list(self.state), set())

    def unhold(self, reason: object) -> Effects:
        self.holds.discard(reason)
        return self._sync(list(self.state), set())
