"""An independent reference model of one consumer-group member.

Deliberately naive: plain dictionaries and sets, every watermark recomputed
from scratch, no cleverness shared with :mod:`htmqc.core`. The stateful
Hypothesis tests drive the core and this model with the same events and compare
their observable state after every step; conformance vectors and trace replays
use it as the oracle. Its vocabulary (event names, state names) is the
transition table's, so that the two can be compared, but it restates the
lifecycle edges itself instead of reading :data:`htmqc.core.TRANSITIONS`, and
the backoff formula from ``spec/README.md`` instead of importing
:mod:`htmqc.core.retry`.

Answers come in two spellings. The ``*_decision`` methods give the whole
decision as plain data, spelled as in the conformance vectors
(``spec/conformance/README.md``); ``commit_requested``, ``revoked`` and
``failed`` give only its offset or outcome, which is what the Hypothesis
comparison reads (it checks the core's decision objects itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The lifecycle, restated: event -> (source state, target state).
LIFECYCLE = {
    "started": ("Pending", "Processing"),
    "succeeded": ("Processing", "Succeeded"),
    "failed": ("Processing", "Failed"),
    "retry_scheduled": ("Failed", "Retrying"),
    "retry_due": ("Retrying", "Processing"),
    "dead_lettered": ("Failed", "DeadLettered"),
    "handed_off": ("Failed", "HandedOff"),
}
DONE = {"Succeeded", "DeadLettered", "HandedOff"}


class RefError(Exception):
    """The model refuses an event (the core must refuse it too)."""


@dataclass
class RefPartition:
    """One assigned partition: every offset the fetcher covered, with its state."""

    start: int
    epoch: int
    skip: set[int] = field(default_factory=set)
    next: int = 0
    committed: int = 0
    requested: int = 0
    draining: bool = False
    unsent: bool = False  # something finished since the last commit request
    states: dict[int, str] = field(default_factory=dict)  # arrived offsets only
    failures: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.next = self.committed = self.requested = self.start

    def unfinished(self) -> set[int]:
        return {o for o, s in self.states.items() if s not in DONE}

    def processed(self) -> int:
        return min(self.unfinished() | {self.next})

    def observe(self) -> dict[str, Any]:
        p = self.processed()
        return {
            "epoch": self.epoch,
            "next": self.next,
            "processed": p,
            "committed": self.committed,
            "requested": self.requested,
            "unsent": self.unsent,
            "draining": self.draining,
            "in_flight": {str(o): self.states[o] for o in sorted(self.unfinished())},
            "finished_above": sorted(
                {o for o, s in self.states.items() if s in DONE and o > p}
                | {o for o in self.skip if o >= self.next}
            ),
        }


class ReferenceConsumer:
    """The naive twin of :class:`htmqc.core.ConsumerCore` (same method names)."""

    def __init__(
        self, max_retries: int = 3, base_delay: float = 0.1, max_delay: float = 30.0
    ) -> None:
        self.max_retries = max_retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.parts: dict[tuple[str, int], RefPartition] = {}
        self.last_epoch = 0

    def assign(self, tp: tuple[str, int], committed: int, finished_above: Any = ()) -> int:
        if tp in self.parts:
            raise RefError("already assigned")
        if committed < 0 or any(o < committed for o in finished_above):
            raise RefError("bad start")
        self.last_epoch += 1
        self.parts[tp] = RefPartition(committed, self.last_epoch, set(finished_above))
        return self.last_epoch

    restored = assign

    def _part(self, tp: tuple[str, int], epoch: int) -> RefPartition | None:
        part = self.parts.get(tp)
        return part if part is not None and part.epoch == epoch else None

    def fetched(
        self, tp: tuple[str, int], epoch: int, offsets: list[int], end: int | None = None
    ) -> list[int]:
        part = self._part(tp, epoch)
        if part is None:
            return []
        if not offsets and end is None:
            return []
        if part.draining:
            raise RefError("draining")
        if offsets and (offsets[0] < part.next or sorted(set(offsets)) != list(offsets)):
            raise RefError("order")
        hi = end if end is not None else offsets[-1] + 1
        if hi < part.next or (offsets and hi <= offsets[-1]):
            raise RefError("end")
        run = []
        for o in offsets:
            if o in part.skip:
                part.states[o] = "Succeeded"
            else:
                part.states[o] = "Pending"
                run.append(o)
        part.skip = {o for o in part.skip if o >= hi}
        part.next = hi
        return run

    def event(self, name: str, tp: tuple[str, int], epoch: int, offsets: list[int]) -> bool:
        """Apply a lifecycle event to a batch, all or nothing."""
        part = self._part(tp, epoch)
        if part is None:
            return False
        source, target = LIFECYCLE[name]
        if len(set(offsets)) != len(offsets):
            raise RefError("duplicate in batch")
        if part.draining and name in ("started", "retry_due"):
            raise RefError("draining")
        if any(part.states.get(o) != source for o in offsets):
            raise RefError(f"{name} needs {source}")
        if target in DONE and offsets:
            part.unsent = True  # an empty batch finishes nothing (spec §5)
        for o in offsets:
            part.states[o] = target
            if name == "failed":
                part.failures[o] = part.failures.get(o, 0) + 1
        return True

    def backoff(self, n: int, jitter: float) -> float:
        """Seconds before the n-th retry: jitter x min(cap, base x 2^min(n-1, 1000)),
        in doubles. ldexp scales by a power of two exactly, like the spec's product."""
        return jitter * min(self.max_delay, math.ldexp(self.base_delay, min(n - 1, 1000)))

    def failed_decision(
        self, tp: tuple[str, int], epoch: int, offset: int, kind: str, now: float, jitter: float
    ) -> dict[str, Any] | None:
        """``kind`` is "retryable", "unknown" or "permanent". A RetryAt (now Retrying)
        or a DeadLetter (stays Failed); None if late."""
        if not self.event("failed", tp, epoch, [offset]):
            return None
        n = self.parts[tp].failures[offset]
        where = {"tp": _name(tp), "epoch": epoch, "offset": offset}
        if kind != "permanent" and n <= self.max_retries:
            self.event("retry_scheduled", tp, epoch, [offset])
            return {"type": "RetryAt", **where, "attempt": n, "at": now + self.backoff(n, jitter)}
        return {"type": "DeadLetter", **where, "attempts": n,
                "kind": "permanent" if kind == "permanent" else "failed"}

    def failed(
        self, tp: tuple[str, int], epoch: int, offset: int, permanent: bool
    ) -> str | None:
        """'retry' or 'dead_letter' (the state moves as the core's does), None if late."""
        kind = "permanent" if permanent else "retryable"
        decision = self.failed_decision(tp, epoch, offset, kind, 0.0, 0.0)
        if decision is None:
            return None
        return "retry" if decision["type"] == "RetryAt" else "dead_letter"

    def commit_decision(self, tp: tuple[str, int]) -> dict[str, Any] | None:
        """The Commit a request hands out (tp, epoch, offset, finished_above), or None."""
        part = self.parts.get(tp)
        if part is None:
            return None
        p = part.processed()
        if p > part.requested or part.unsent:
            part.requested = p
            part.unsent = False
            above = part.observe()["finished_above"]
            return {"type": "Commit", "tp": _name(tp), "epoch": part.epoch, "offset": p,
                    "finished_above": above}
        return None

    def commit_requested(self, tp: tuple[str, int]) -> int | None:
        commit = self.commit_decision(tp)
        return None if commit is None else int(commit["offset"])

    def commit_acked(self, tp: tuple[str, int], epoch: int, offset: int) -> bool:
        part = self._part(tp, epoch)
        if part is None:
            return False
        if offset > part.processed():
            raise RefError("ack above watermark")
        if offset <= part.committed:
            return False
        part.committed = offset
        part.requested = max(part.requested, offset)
        return True

    def commit_failed(self, tp: tuple[str, int], epoch: int, offset: int) -> bool:
        part = self._part(tp, epoch)
        if part is None:
            return False
        part.requested = part.committed
        part.unsent = True
        return True

    def revoking(self, tp: tuple[str, int]) -> None:
        if tp in self.parts:
            self.parts[tp].draining = True

    def revoked_decision(self, tp: tuple[str, int]) -> dict[str, Any] | None:
        """The final Commit (or None); the partition is dropped."""
        commit = self.commit_decision(tp)
        self.parts.pop(tp, None)
        return commit

    def revoked(self, tp: tuple[str, int]) -> int | None:
        commit = self.revoked_decision(tp)
        return None if commit is None else int(commit["offset"])

    def crashed(self) -> None:
        self.parts.clear()

    def snapshot(self) -> dict[str, Any]:
        return {_name(tp): part.observe() for tp, part in sorted(self.parts.items())}


def _name(tp: tuple[str, int]) -> str:
    return f"{tp[0]}/{tp[1]}"
