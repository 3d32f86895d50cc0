"""Generate the conformance vectors from the reference model.

Every vector is a list of steps; each step is one event, the answer the
reference model (:class:`model_checks.reference.ReferenceConsumer`) gives, and
its snapshot afterwards. The scenarios below are written by hand, one reading
of the spec each (their one-line docstrings say which); the ``random_*``
vectors are seeded random walks. Generation is deterministic:
``python -m spec.conformance.generate`` rewrites ``spec/conformance/vectors/``,
``--check`` fails if the committed files differ. See
``spec/conformance/README.md`` for the format.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from model_checks.reference import ReferenceConsumer, RefError
from spec.conformance import breaker as breaker_vectors
from spec.conformance import failures as failures_vectors
from spec.conformance import gate as gate_vectors
from spec.conformance.replay import BATCH, FORMAT, SINGLE, VECTORS
from spec.conformance.replay import parse_tp as _tp

#: The retry policy a vector's core is built with unless its scenario says otherwise
#: (``RetryPolicy``'s defaults).
DEFAULT_RETRY: dict[str, Any] = {"max_retries": 3, "base_delay": 0.1, "max_delay": 30.0}

#: Reference refusals that the core reports as OffsetOrderError; every other
#: refusal is an IllegalTransition.
_ORDER_ERRORS = {"order", "end", "bad start"}


class Recorder:
    """Drives the reference model and records every step."""

    def __init__(self) -> None:
        self.retry = dict(DEFAULT_RETRY)
        self.ref = ReferenceConsumer(**self.retry)
        self.steps: list[dict[str, Any]] = []

    def policy(self, max_retries: int, base_delay: float = 0.1, max_delay: float = 30.0) -> None:
        """Build the core with this retry policy (only before the first step)."""
        assert not self.steps, "set the policy before the first step"
        self.retry = {
            "max_retries": max_retries,
            "base_delay": float(base_delay),
            "max_delay": float(max_delay),
        }
        self.ref = ReferenceConsumer(**self.retry)

    def _do(self, op: str, args: dict[str, Any], call: Callable[[], Any]) -> Any:
        before = self.ref.snapshot()
        step: dict[str, Any] = {"op": op, "args": args}
        try:
            result = call()
        except RefError as exc:
            if self.ref.snapshot() != before:
                raise AssertionError(f"reference changed state on a refused {op}") from exc
            step["error"] = "OffsetOrderError" if str(exc) in _ORDER_ERRORS else "IllegalTransition"
            result = None
        else:
            step["result"] = result
        step["state"] = self.ref.snapshot()
        self.steps.append(step)
        return result

    # one method per event, named as in ConsumerCore ------------------------------------

    def assign(
        self, tp: str, committed: int, finished_above: Sequence[int] = (), op: str = "assign"
    ) -> int:
        """Returns the epoch, or 0 when the model refused."""
        args = {"tp": tp, "committed": committed, "finished_above": list(finished_above)}
        epoch = self._do(op, args, lambda: self.ref.assign(_tp(tp), committed, finished_above))
        return int(epoch or 0)

    def restored(self, tp: str, committed: int, finished_above: Sequence[int] = ()) -> int:
        return self.assign(tp, committed, finished_above, op="restored")

    def fetched(self, tp: str, epoch: int, offsets: Sequence[int], end: int | None = None) -> Any:
        args = {"tp": tp, "epoch": epoch, "offsets": list(offsets), "end": end}
        batch = list(offsets)
        return self._do("fetched", args, lambda: self.ref.fetched(_tp(tp), epoch, batch, end))

    def event(self, name: str, tp: str, epoch: int, offset: int | Sequence[int]) -> Any:
        """A lifecycle event on one offset (``name``) or a batch (``name_many``)."""
        if isinstance(offset, int):
            op, args = name, {"tp": tp, "epoch": epoch, "offset": offset}
            batch = [offset]
        else:
            op, args = f"{name}_many", {"tp": tp, "epoch": epoch, "offsets": list(offset)}
            batch = list(offset)
        assert op in SINGLE or op in BATCH, f"the core has no {op}"
        return self._do(op, args, lambda: self.ref.event(name, _tp(tp), epoch, batch))

    def failed(
        self,
        tp: str,
        epoch: int,
        offset: int,
        kind: str = "retryable",
        now: float = 0.0,
        jitter: float = 0.5,
    ) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset, "kind": kind,
                "now": float(now), "jitter": float(jitter)}
        ref = self.ref
        return self._do(
            "failed", args, lambda: ref.failed_decision(_tp(tp), epoch, offset, kind, now, jitter)
        )

    def commit_requested(self, tp: str) -> Any:
        return self._do("commit_requested", {"tp": tp}, lambda: self.ref.commit_decision(_tp(tp)))

    def commit_acked(self, tp: str, epoch: int, offset: int) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset}
        return self._do("commit_acked", args, lambda: self.ref.commit_acked(_tp(tp), epoch, offset))

    def commit_failed(self, tp: str, epoch: int, offset: int) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset}
        ref = self.ref
        return self._do("commit_failed", args, lambda: ref.commit_failed(_tp(tp), epoch, offset))

    def revoking(self, tp: str) -> Any:
        return self._do("revoking", {"tp": tp}, lambda: self.ref.revoking(_tp(tp)))

    def revoked(self, tp: str) -> Any:
        return self._do("revoked", {"tp": tp}, lambda: self.ref.revoked_decision(_tp(tp)))

    def crashed(self) -> Any:
        return self._do("crashed", {}, self.ref.crashed)


T0, T1 = "orders/0", "orders/1"
#: A topic name with a slash: the partition number is after the last one.
T_SLASH = "eu/orders/7"
#: The first integer a double cannot hold exactly is 2^53 + 1.
B53 = 2**53
#: The largest Kafka offset (a signed 64-bit integer).
I64 = 2**63 - 1


# -- the hand-written scenarios ------------------------------------------------------------


def happy_path(r: Recorder) -> None:
    """In order: a commit hands out processed with the epoch and an empty finished_above;
    once acked, a request with nothing new answers null."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1, 2])
    for o in (0, 1, 2):
        r.event("started", T0, e, o)
        r.event("succeeded", T0, e, o)
    r.commit_requested(T0)
    r.commit_acked(T0, e, 3)
    r.commit_requested(T0)


def gap_end_beyond_last(r: Recorder) -> None:
    """A batch whose end lies beyond its last offset: the tail is a gap, finished but never
    listed in finished_above."""
    e = r.assign(T0, 10)
    r.fetched(T0, e, [10, 11, 13], end=16)
    r.event("started", T0, e, [10, 11, 13])
    r.event("succeeded", T0, e, 13)
    r.event("succeeded", T0, e, 10)
    r.event("succeeded", T0, e, 11)
    r.commit_requested(T0)
    r.fetched(T0, e, [], end=20)
    r.commit_requested(T0)


def gap_batch_above_next(r: Recorder) -> None:
    """A batch starting above next: the offsets in between are a gap; a fetch that moves
    processed over a gap makes a commit due."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [5, 6])
    r.commit_requested(T0)
    r.event("started", T0, e, 5)
    r.event("succeeded", T0, e, 5)
    r.commit_requested(T0)
    r.fetched(T0, e, [9])
    r.event("started", T0, e, [6, 9])
    r.event("succeeded", T0, e, [9, 6])
    r.commit_requested(T0)


def out_of_order_completion(r: Recorder) -> None:
    """Offsets finish out of order; finished_above carries them until the watermark passes,
    and each change makes a commit due."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(5))
    r.event("started", T0, e, [0, 1, 2, 3, 4])
    r.event("succeeded", T0, e, 3)
    r.event("succeeded", T0, e, 1)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 0)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 4)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 2)
    r.commit_requested(T0)


def failures_retries_dead_letter(r: Recorder) -> None:
    """max_retries = 3: a retryable message is retried 3 times and dead-lettered at its 4th
    failure (attempts 4, kind failed); a permanent one at once (attempts 1, kind permanent)."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1])
    r.event("started", T0, e, [0, 1])
    for n in range(3):
        r.failed(T0, e, 0, now=100.0 + n, jitter=0.5)
        r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0, now=200.0)
    r.event("retry_due", T0, e, 0)
    r.event("dead_lettered", T0, e, 0)
    r.failed(T0, e, 1, kind="permanent", now=300.0)
    r.event("dead_lettered", T0, e, 1)
    r.commit_requested(T0)


def handed_off_finishes(r: Recorder) -> None:
    """handed_off (the message was written to the retry topic) finishes a Failed offset
    like dead_lettered: out of order it goes into finished_above, at the watermark it
    moves processed; it needs Failed (Processing, Retrying or finished offsets refuse)."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1, 2])
    r.event("started", T0, e, [0, 1, 2])
    r.event("handed_off", T0, e, 1)
    r.failed(T0, e, 1, kind="permanent", now=10.0)
    r.event("handed_off", T0, e, 1)
    r.event("handed_off", T0, e, 1)
    r.commit_requested(T0)
    r.failed(T0, e, 0, now=11.0, jitter=0.25)
    r.event("handed_off", T0, e, 0)
    r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0, kind="permanent", now=12.0)
    r.event("handed_off", T0, e, 0)
    r.commit_requested(T0)
    r.event("handed_off", T0, e + 1, 2)


def acks_late_duplicate_out_of_order(r: Recorder) -> None:
    """Acks may arrive late, twice or in the wrong order; only a newer one moves committed,
    and an ack above processed is illegal."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(4))
    r.event("started", T0, e, [0, 1, 2, 3])
    r.event("succeeded", T0, e, [0, 1])
    r.commit_requested(T0)
    r.event("succeeded", T0, e, [2, 3])
    r.commit_requested(T0)
    r.commit_acked(T0, e, 4)
    r.commit_acked(T0, e, 2)
    r.commit_acked(T0, e, 4)
    r.commit_acked(T0, e, 5)
    r.commit_requested(T0)


def failed_commits(r: Recorder) -> None:
    """A failed commit is requested again, even if nothing new finished and even if its
    offset is already durable."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1])
    r.event("started", T0, e, [0, 1])
    r.event("succeeded", T0, e, 0)
    r.commit_requested(T0)
    r.commit_failed(T0, e, 1)
    r.commit_requested(T0)
    r.commit_acked(T0, e, 1)
    r.commit_failed(T0, e, 1)
    r.commit_requested(T0)
    r.commit_requested(T0)


def revoke_assign_stale_epoch(r: Recorder) -> None:
    """Revoking stops new work; after revoke and a new assignment, events of the old
    epoch are ignored."""
    e1 = r.assign(T0, 0)
    r.fetched(T0, e1, [0, 1, 2])
    r.event("started", T0, e1, [0, 1])
    r.revoking(T0)
    r.event("started", T0, e1, 2)
    r.fetched(T0, e1, [3])
    r.event("succeeded", T0, e1, 0)
    r.failed(T0, e1, 1)
    r.revoked(T0)
    r.event("retry_due", T0, e1, 1)
    e2 = r.assign(T0, 1)
    r.event("succeeded", T0, e1, 1)
    r.commit_acked(T0, e1, 1)
    r.fetched(T0, e1, [1, 2])
    r.fetched(T0, e2, [1, 2])
    r.failed(T0, e1, 1)
    r.commit_failed(T0, e1, 1)
    r.event("started", T0, e2, 1)
    r.event("succeeded", T0, e2, 1)
    r.commit_requested(T0)


def crash_restore_finished_above(r: Recorder) -> None:
    """After a crash the partition restarts from the commit; offsets the sink already
    holds (finished_above) are not handed out again and keep travelling in commits."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(5))
    r.event("started", T0, e, [0, 1, 2, 3, 4])
    r.event("succeeded", T0, e, [0, 2, 4])
    r.commit_requested(T0)
    r.crashed()
    r.event("succeeded", T0, e, 1)
    e2 = r.restored(T0, 1, [2, 4])
    r.fetched(T0, e2, [1, 2, 3])
    r.fetched(T0, e2, [4, 5])
    r.event("started", T0, e2, [1, 3, 5])
    r.event("succeeded", T0, e2, [3, 1])
    r.commit_requested(T0)
    r.event("succeeded", T0, e2, 5)
    r.commit_requested(T0)


def illegal_events(r: Recorder) -> None:
    """Events a correct runtime never sends are refused with the right error type and
    change nothing (an epoch is not used up by a refused assign)."""
    r.assign(T0, -1)
    e = r.assign(T0, 5, [5])
    e = r.assign(T0, 5, [7])
    r.assign(T0, 0)
    r.fetched(T0, e, [4])
    r.fetched(T0, e, [6, 5])
    r.fetched(T0, e, [5, 5])
    r.fetched(T0, e, [5, 6], end=6)
    r.fetched(T0, e, [], end=4)
    r.fetched(T0, e, [5, 6, 7, 8])
    r.event("succeeded", T0, e, 5)
    r.event("started", T0, e, 5)
    r.event("started", T0, e, 5)
    r.event("started", T0, e, 7)
    r.event("started", T0, e, 9)
    r.event("succeeded", T0, e, 5)
    r.event("succeeded", T0, e, 5)
    r.event("retry_due", T0, e, 6)
    r.event("dead_lettered", T0, e, 6)
    r.commit_acked(T0, e, 7)
    r.failed(T0, e, 6)


def batch_events(r: Recorder) -> None:
    """Batch forms move every offset or none: one offset in the wrong state or a duplicate
    refuses the whole batch."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(6))
    r.event("started", T0, e, [0, 1, 2])
    r.event("started", T0, e, [3, 2])
    r.event("started", T0, e, [3, 3])
    r.event("started", T0, e, [3, 4, 5])
    r.event("succeeded", T0, e, [1, 0, 9])
    r.event("succeeded", T0, e, [1, 0])
    r.failed(T0, e, 2, kind="permanent")
    r.failed(T0, e, 3, kind="permanent")
    r.event("dead_lettered", T0, e, [3, 2])
    r.event("succeeded", T0, e, [4, 4])
    r.commit_requested(T0)


def two_partitions(r: Recorder) -> None:
    """Partitions are independent; epochs count per core, not per partition; the topic is
    everything before the last slash."""
    a = r.assign(T0, 0)
    b = r.assign(T1, 100)
    s = r.assign(T_SLASH, 0)
    r.fetched(T1, b, [100, 101])
    r.fetched(T0, a, [0])
    r.fetched(T_SLASH, s, [0])
    r.event("started", T1, b, 101)
    r.event("started", T0, a, 0)
    r.event("succeeded", T1, b, 101)
    r.event("succeeded", T0, a, 0)
    r.commit_requested(T0)
    r.commit_requested(T1)
    r.event("succeeded", T0, b, 0)
    r.revoked(T1)
    b2 = r.assign(T1, 100, [101])
    r.fetched(T1, b2, [100, 101, 102])
    r.commit_acked(T0, a, 1)


def finished_above_contents(r: Recorder) -> None:
    """finished_above = arrived offsets above processed that finished, plus restored offsets
    not fetched yet (at or above next), so it may hold processed itself."""
    e = r.restored(T0, 2, [4, 7, 9])
    r.commit_requested(T0)
    r.fetched(T0, e, [2, 3, 4, 5], end=7)
    r.event("started", T0, e, [2, 3, 5])
    r.event("succeeded", T0, e, 5)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, [2, 3])
    r.commit_requested(T0)
    r.fetched(T0, e, [7, 8])
    r.commit_requested(T0)
    r.event("started", T0, e, 8)
    r.event("succeeded", T0, e, 8)
    r.commit_requested(T0)


def restored_offset_held_at_batch_end(r: Recorder) -> None:
    """A restored offset equal to a batch's end stays held (kept while offset >= end) and
    arrives finished when the next batch starts at it; it never runs."""
    e = r.restored(T0, 1, [3, 6])
    r.fetched(T0, e, [1, 2])
    r.fetched(T0, e, [3, 4])
    r.event("started", T0, e, 3)
    r.fetched(T0, e, [5], end=6)
    r.fetched(T0, e, [6, 7])
    r.event("started", T0, e, [1, 2, 4, 5, 7])
    r.event("succeeded", T0, e, [7, 5, 4, 2, 1])
    r.commit_requested(T0)


def restored_offset_at_committed(r: Recorder) -> None:
    """A batch that ends exactly at a restored offset h, all finished, commits offset h with
    h in finished_above; restoring from that commit is allowed (h == committed) and h never
    runs. Refusing it (finished_above must be above committed) made the partition
    unassignable for ever (found by the TLC graph replay); below committed is refused."""
    e = r.restored(T0, 0, [2])
    r.fetched(T0, e, [0, 1], end=2)
    r.event("started", T0, e, [0, 1])
    r.event("succeeded", T0, e, [1, 0])
    r.commit_requested(T0)
    r.crashed()
    r.restored(T0, 1, [0])
    e = r.restored(T0, 2, [2])
    r.fetched(T0, e, [2, 3])
    r.event("started", T0, e, 3)
    r.event("succeeded", T0, e, 3)
    r.commit_requested(T0)


def restored_offset_in_gap(r: Recorder) -> None:
    """A restored offset inside a fetched range that did not arrive is a gap: it leaves
    finished_above without a commit becoming due, and cannot be started."""
    e = r.restored(T0, 0, [2, 5, 8])
    r.fetched(T0, e, [0, 1, 3], end=4)
    r.event("started", T0, e, 0)
    r.event("succeeded", T0, e, 0)
    r.commit_requested(T0)
    r.fetched(T0, e, [6, 7], end=10)
    r.commit_requested(T0)
    r.event("started", T0, e, 8)


def unsent_flag(r: Recorder) -> None:
    """The flag unsent is raised by every finishing event (even an empty batch) and by
    commit_failed, never by a gap, a restored arrival, a failure or an ack; a request lowers it."""
    e = r.restored(T0, 0, [3])
    r.fetched(T0, e, [0, 1, 2, 3, 4], end=8)
    r.event("started", T0, e, [0, 1, 2])
    r.failed(T0, e, 1)
    r.commit_requested(T0)
    r.event("retry_due", T0, e, 1)
    r.event("succeeded", T0, e, 2)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, [])
    r.commit_requested(T0)
    r.commit_failed(T0, e, 0)
    r.commit_acked(T0, e, 0)
    r.commit_requested(T0)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 0)
    r.commit_acked(T0, e, 1)
    r.commit_requested(T0)
    r.failed(T0, e, 1, kind="permanent")
    r.commit_requested(T0)
    r.event("dead_lettered", T0, e, 1)
    r.commit_requested(T0)


def epoch_counter_survives_crash(r: Recorder) -> None:
    """Epochs count per core, and crashed() keeps the counter: partitions restored after a
    crash get the next numbers, never an old one."""
    a = r.assign(T0, 0)
    b = r.assign(T1, 0)
    r.crashed()
    b2 = r.restored(T1, 0)
    r.fetched(T0, a, [0])
    r.fetched(T1, b, [0])
    r.fetched(T1, a, [0])
    r.restored(T0, 0)
    r.fetched(T1, b2, [0])
    r.revoked(T1)
    r.assign(T1, 0)


def stale_is_any_other_epoch(r: Recorder) -> None:
    """Stale means any epoch but the partition's current one (older, newer, another
    partition's), and the epoch is checked before anything in the payload."""
    e = r.assign(T0, 5)
    f = r.assign(T1, 0)
    r.fetched(T0, e + 2, [5, 6])
    r.fetched(T0, f, [5, 6])
    r.fetched(T0, 0, [9, 7])
    r.fetched(T0, e, [5, 6, 7])
    r.event("started", T0, f, 5)
    r.event("started", T0, 99, 42)
    r.event("started", T0, 99, [5, 5])
    r.event("started", T0, e, [5, 6])
    r.failed(T0, 99, 6)
    r.failed(T0, 99, 7)
    r.event("succeeded", T0, e, 5)
    r.commit_acked(T0, 99, 100)
    r.commit_failed(T0, 99, 6)
    r.commit_requested(T0)
    r.commit_acked(T0, 0, 6)
    r.commit_acked(T0, e, 6)


def failed_while_revoking(r: Recorder) -> None:
    """While revoking, failed still decides: a retryable failure answers RetryAt and goes
    Retrying (retry_due is then refused); dead letters, completions and commits go on."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1, 2, 3])
    r.event("started", T0, e, [0, 1, 2])
    r.revoking(T0)
    r.failed(T0, e, 0, now=10.0, jitter=0.25)
    r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 1, kind="permanent", now=11.0)
    r.event("dead_lettered", T0, e, 1)
    r.event("succeeded", T0, e, 2)
    r.event("started", T0, e, 3)
    r.commit_requested(T0)
    r.revoking(T0)
    r.revoked(T0)


def partitions_not_held(r: Recorder) -> None:
    """Every event about a partition that is not held (never assigned, or revoked) is
    ignored like a stale one: no error, no state, null/false/[] answers."""
    r.fetched(T_SLASH, 1, [0])
    r.fetched(T_SLASH, 1, [])
    r.event("started", T_SLASH, 1, 0)
    r.event("succeeded", T_SLASH, 1, [0, 1])
    r.event("retry_due", T_SLASH, 1, 0)
    r.event("dead_lettered", T_SLASH, 1, [])
    r.failed(T_SLASH, 1, 0)
    r.commit_requested(T_SLASH)
    r.commit_acked(T_SLASH, 1, 5)
    r.commit_failed(T_SLASH, 1, 5)
    r.revoking(T_SLASH)
    r.revoked(T_SLASH)
    e = r.assign(T_SLASH, 3)
    r.revoked(T_SLASH)
    r.event("succeeded", T_SLASH, e, 3)
    r.revoking(T_SLASH)
    r.fetched(T_SLASH, e, [3])
    r.commit_requested(T_SLASH)


def error_precedence(r: Recorder) -> None:
    """When several checks apply: stale epoch first; assign: already held before bad
    offsets; fetched: an empty end-less batch (no event), then revoking, then order."""
    e = r.assign(T0, 5)
    r.assign(T0, -1)
    r.assign(T0, 5, [5])
    r.assign(T1, -1, [0])
    r.assign(T1, 3, [2])
    r.fetched(T0, e, [5, 6, 7])
    r.event("started", T0, e, 5)
    r.revoking(T0)
    r.fetched(T0, e, [])
    r.fetched(T0, e, [3, 1])
    r.fetched(T0, e, [], end=4)
    r.fetched(T0, e + 1, [3, 1])
    r.event("started", T0, e, [6, 6])
    r.event("started", T0, e, [])
    r.event("retry_due", T0, e, 5)
    r.failed(T0, e, 6)
    r.commit_acked(T0, e, 9)
    r.event("succeeded", T0, e, 5)
    r.commit_acked(T0, e + 1, 9)


def empty_batches(r: Recorder) -> None:
    """fetched([]) without end is no event; with end it covers a gap (end = next: nothing,
    end < next: OffsetOrderError); empty lifecycle batches answer true, finishing ones
    raise unsent."""
    e = r.assign(T0, 4)
    r.fetched(T0, e, [])
    r.fetched(T0, e, [], end=4)
    r.commit_requested(T0)
    r.fetched(T0, e, [], end=3)
    r.fetched(T0, e, [], end=6)
    r.commit_requested(T0)
    r.event("started", T0, e, [])
    r.commit_requested(T0)
    r.event("dead_lettered", T0, e, [])
    r.commit_requested(T0)
    r.event("succeeded", T0, e, [])
    r.revoking(T0)
    r.event("succeeded", T0, e, [])
    r.event("started", T0, e, [])
    r.fetched(T0, e, [])
    r.revoked(T0)


def _retries(max_retries: int) -> Callable[[Recorder], None]:
    def scenario(r: Recorder) -> None:
        r.policy(max_retries, base_delay=0.25, max_delay=2.0)
        e = r.assign(T0, 0)
        r.fetched(T0, e, [0, 1, 2])
        r.event("started", T0, e, [0, 1, 2])
        jitters = [0.5, 1.0, 0.0, 0.3, 0.9, 0.75]
        for n in range(max_retries):
            r.failed(T0, e, 0, now=1000.0 + n, jitter=jitters[n])
            r.event("retry_due", T0, e, 0)
        r.failed(T0, e, 0, now=2000.0, jitter=0.5)
        r.event("retry_due", T0, e, 0)
        r.event("dead_lettered", T0, e, 0)
        if r.failed(T0, e, 1, kind="unknown", now=3000.0, jitter=0.1)["type"] == "RetryAt":
            r.event("retry_due", T0, e, 1)
            r.failed(T0, e, 1, kind="permanent", now=3001.0)
        r.event("dead_lettered", T0, e, 1)
        r.failed(T0, e, 2, kind="permanent", now=4000.0)
        r.event("dead_lettered", T0, e, 2)
        r.commit_requested(T0)

    scenario.__name__ = f"retries_max_{max_retries}"
    scenario.__doc__ = (
        f"max_retries = {max_retries}: a retryable or unknown failure is retried while the "
        f"message has failed at most {max_retries} times, then DeadLetter(attempts = "
        f"{max_retries + 1}, kind failed); kind permanent only for failure kind permanent."
    )
    return scenario


def backoff_and_jitter(r: Recorder) -> None:
    """at = now + jitter * min(max_delay, base_delay * 2^(n-1)) in doubles, n the failure
    count: jitter 0, 1 and others, the cap reached at n = 4, a wall-clock now."""
    r.policy(7, base_delay=0.1, max_delay=0.5)
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0])
    r.event("started", T0, e, 0)
    now = 1_700_000_000.123
    for n, jitter in enumerate([0.3, 1.0, 0.0, 0.7, 0.3, 1.0, 0.123456789], 1):
        r.failed(T0, e, 0, now=now + n, jitter=jitter)
        r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0, now=now + 8, jitter=0.5)


def backoff_zero(r: Recorder) -> None:
    """base_delay = max_delay = 0 is a valid policy: every retry is due at now."""
    r.policy(2, base_delay=0.0, max_delay=0.0)
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0])
    r.event("started", T0, e, 0)
    r.failed(T0, e, 0, now=5.5, jitter=1.0)
    r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0, now=6.5, jitter=0.5)
    r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0, now=7.5, jitter=0.5)


def big_offsets(r: Recorder) -> None:
    """Offsets are exact integers: around 2^53 (where doubles collapse neighbours) and up to
    2^63 - 1; JSON numbers must be read without rounding."""
    e = r.restored(T0, B53 - 2, [B53 + 1])
    r.fetched(T0, e, [B53 - 2, B53 - 1, B53, B53 + 1, B53 + 2])
    r.event("started", T0, e, [B53 - 2, B53, B53 + 2])
    r.event("succeeded", T0, e, [B53 + 2, B53])
    r.commit_requested(T0)
    r.event("succeeded", T0, e, B53 - 2)
    r.commit_requested(T0)
    r.fetched(T0, e, [B53 + 4], end=B53 + 7)
    f = r.assign(T1, I64 - 3, [I64 - 1])
    r.fetched(T1, f, [I64 - 3, I64 - 2])
    r.event("started", T1, f, [I64 - 3, I64 - 2])
    r.event("succeeded", T1, f, [I64 - 2, I64 - 3])
    r.commit_requested(T1)
    r.fetched(T1, f, [I64 - 1])
    r.commit_requested(T1)
    r.commit_acked(T1, f, I64)


def batch_completion_needs_source_state(r: Recorder) -> None:
    """A finishing batch needs every offset in its source state (succeeded: Processing,
    dead_lettered: Failed); Pending, finished or restored offsets refuse the whole batch."""
    e = r.restored(T0, 0, [4])
    r.fetched(T0, e, range(6))
    r.event("started", T0, e, [0, 1])
    r.event("succeeded", T0, e, [0, 2])
    r.event("succeeded", T0, e, [1, 4])
    r.event("dead_lettered", T0, e, [0])
    r.event("dead_lettered", T0, e, 0)
    r.failed(T0, e, 1, kind="permanent")
    r.event("dead_lettered", T0, e, [1, 0])
    r.event("succeeded", T0, e, [0, 1])
    r.event("succeeded", T0, e, [0])
    r.event("dead_lettered", T0, e, [1])
    r.event("succeeded", T0, e, [0])
    r.commit_requested(T0)


def failure_count_per_assignment(r: Recorder) -> None:
    """A message's failure count belongs to its assignment: after revoke and assign, or
    crash and restore, its next failure is attempt 1 again."""
    r.policy(2, base_delay=1.0, max_delay=8.0)

    def run_and_fail(e: int, now: float, times: int) -> None:
        r.fetched(T0, e, [0])
        r.event("started", T0, e, 0)
        for n in range(times):
            if n:
                r.event("retry_due", T0, e, 0)
            r.failed(T0, e, 0, now=now + n)

    run_and_fail(r.assign(T0, 0), 1.0, 2)
    r.revoked(T0)
    run_and_fail(r.assign(T0, 0), 3.0, 2)
    r.crashed()
    run_and_fail(r.restored(T0, 0), 5.0, 1)


def commit_acks_and_failures(r: Recorder) -> None:
    """commit_acked takes any offset up to processed, even one never requested (requested
    rises to it); commit_failed ignores its offset: requested falls to committed, unsent rises."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(4))
    r.event("started", T0, e, [0, 1, 2, 3])
    r.event("succeeded", T0, e, [0, 1, 2])
    r.commit_acked(T0, e, 2)
    r.commit_acked(T0, e, 4)
    r.commit_requested(T0)
    r.commit_failed(T0, e, 999)
    r.commit_acked(T0, e, 3)
    r.commit_requested(T0)
    r.commit_acked(T0, e, 1)
    r.commit_failed(T0, e, -5)
    r.commit_requested(T0)


def revoked_final_commit(r: Recorder) -> None:
    """Commits go on while revoking; revoked answers the final Commit (the dropped
    assignment's epoch and finished_above) or null, and an ack of it is late."""
    e = r.assign(T0, 0, [6])
    f = r.assign(T1, 0)
    r.fetched(T0, e, range(4))
    r.event("started", T0, e, [0, 1, 2, 3])
    r.event("succeeded", T0, e, [0, 2])
    r.revoking(T0)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 3)
    r.revoked(T0)
    r.commit_acked(T0, e, 1)
    r.revoked(T1)
    r.commit_acked(T1, f, 0)


def restored_offsets_never_run(r: Recorder) -> None:
    """Restored offsets are a set (order and repeats in the list do not matter); they arrive
    finished, are not handed out, and starting one is illegal."""
    e = r.restored(T0, 0, [3, 1, 3])
    r.fetched(T0, e, range(5))
    r.event("started", T0, e, 1)
    r.event("started", T0, e, [0, 3])
    r.event("started", T0, e, [0, 2, 4])
    r.event("succeeded", T0, e, [4, 2, 0])
    r.commit_requested(T0)


SCENARIOS: dict[str, Callable[[Recorder], None]] = {
    f.__name__: f
    for f in (
        happy_path,
        gap_end_beyond_last,
        gap_batch_above_next,
        out_of_order_completion,
        failures_retries_dead_letter,
        handed_off_finishes,
        acks_late_duplicate_out_of_order,
        failed_commits,
        revoke_assign_stale_epoch,
        crash_restore_finished_above,
        illegal_events,
        batch_events,
        two_partitions,
        finished_above_contents,
        restored_offset_held_at_batch_end,
        restored_offset_at_committed,
        restored_offset_in_gap,
        unsent_flag,
        epoch_counter_survives_crash,
        stale_is_any_other_epoch,
        failed_while_revoking,
        partitions_not_held,
        error_precedence,
        empty_batches,
        _retries(0),
        _retries(1),
        _retries(5),
        backoff_and_jitter,
        backoff_zero,
        big_offsets,
        batch_completion_needs_source_state,
        failure_count_per_assignment,
        commit_acks_and_failures,
        revoked_final_commit,
        restored_offsets_never_run,
    )
}


# -- seeded random walks -------------------------------------------------------------------

#: The retry policy of each random walk, by seed.
RANDOM_POLICIES: dict[int, tuple[int, float, float]] = {
    1: (3, 0.1, 30.0),
    2: (1, 0.25, 1.0),
    3: (5, 0.001, 0.01),
    4: (0, 0.5, 0.5),
}
RANDOM_SEEDS = tuple(RANDOM_POLICIES)


def random_walk(r: Recorder, seed: int, steps: int = 80) -> None:
    """Mostly legal events chosen from the model's state, with some illegal, stale,
    empty and not-held ones mixed in."""
    r.policy(*RANDOM_POLICIES[seed])
    rng = random.Random(seed)
    epochs: dict[str, int] = {}
    stale: list[tuple[str, int]] = []
    clock = [0.0]
    while len(r.steps) < steps:
        _random_step(r, rng, epochs, stale, clock)


def _random_step(
    r: Recorder,
    rng: random.Random,
    epochs: dict[str, int],
    stale: list[tuple[str, int]],
    clock: list[float],
) -> None:
    """One step of :func:`random_walk`, on a random partition."""
    tp = rng.choice([T0, T1])
    part = r.ref.parts.get(_tp(tp))
    if part is None:
        start = rng.randrange(0, 5)
        above = sorted(rng.sample(range(start + 1, start + 6), rng.randrange(0, 3)))
        epochs[tp] = r.assign(tp, start, above)
        return
    e = epochs[tp]
    by_state: dict[str, list[int]] = {}
    for o, state in sorted(part.states.items()):
        by_state.setdefault(state, []).append(o)

    def pick(state: str) -> int:
        return rng.choice(by_state[state])

    def some(state: str) -> list[int]:
        return rng.sample(by_state[state], rng.randrange(1, len(by_state[state]) + 1))

    def fetch() -> None:
        first = part.next + rng.choice([0, 0, 0, 1])
        offsets = [o for o in range(first, first + rng.randrange(1, 4)) if rng.random() < 0.8]
        if offsets and rng.random() < 0.5:
            r.fetched(tp, e, offsets)  # end defaults to one past the last offset
        else:
            r.fetched(tp, e, offsets, (offsets[-1] + 1 if offsets else first) + rng.randrange(2))

    def commit() -> None:
        commit = r.commit_requested(tp)
        if commit is not None and rng.random() < 0.8:
            r.commit_acked(tp, e, commit["offset"])
        elif commit is not None:
            r.commit_failed(tp, e, commit["offset"])

    def fail() -> None:
        clock[0] += rng.choice([0.5, 1.0, 7.25])
        kind = rng.choice(["retryable", "retryable", "unknown", "permanent"])
        r.failed(tp, e, pick("Processing"), kind, clock[0], rng.choice([0.0, 1.0, rng.random()]))

    def stale_event() -> None:
        old_tp, old_e = rng.choice(stale)
        r.event("succeeded", old_tp, old_e, rng.randrange(0, 10))

    def crash() -> None:
        stale.extend(epochs.items())
        r.crashed()

    def revoke() -> None:
        stale.append((tp, e))
        r.revoked(tp)

    def illegal() -> None:
        name = rng.choice(["started", "succeeded", "retry_due", "dead_lettered"])
        r.event(name, tp, e, rng.randrange(0, part.next + 3))

    def empty() -> None:
        r.event(rng.choice(["started", "succeeded", "dead_lettered"]), tp, e, [])

    candidates: list[tuple[float, Callable[[], object]]] = [
        (3.0 if not part.draining else 0.2, fetch),
        (1.5, commit),
        (0.4, lambda: r.commit_acked(tp, e, rng.randrange(0, part.next + 2))),
        (0.3, lambda: r.revoking(tp)),
        (0.3, revoke),
        (0.15, crash),
        (0.6 if stale else 0.0, stale_event),
        (0.2, lambda: r.event("started", tp, e + rng.choice([1, 2]), part.next)),
        (0.5, illegal),
        (0.3, empty),
    ]
    if "Pending" in by_state:
        candidates.append((3.0, lambda: r.event("started", tp, e, pick("Pending"))))
        candidates.append((1.0, lambda: r.event("started", tp, e, some("Pending"))))
    if "Processing" in by_state:
        candidates.append((3.0, lambda: r.event("succeeded", tp, e, pick("Processing"))))
        candidates.append((1.0, lambda: r.event("succeeded", tp, e, some("Processing"))))
        candidates.append((1.5, fail))
    if "Retrying" in by_state:
        candidates.append((1.5, lambda: r.event("retry_due", tp, e, pick("Retrying"))))
    if "Failed" in by_state:
        candidates.append((1.5, lambda: r.event("dead_lettered", tp, e, pick("Failed"))))
    weights = [w for w, _ in candidates]
    rng.choices([act for _, act in candidates], weights)[0]()


# -- files ---------------------------------------------------------------------------------


def vectors() -> dict[str, dict[str, Any]]:
    """Every vector, by file stem, generated afresh."""
    out = {}
    for name, scenario in SCENARIOS.items():
        r = Recorder()
        scenario(r)
        out[name] = _vector(name, (scenario.__doc__ or "").strip(), r)
    for seed in RANDOM_SEEDS:
        r = Recorder()
        random_walk(r, seed)
        description = f"Seeded random walk, seed {seed}: legal, illegal, stale and empty events."
        out[f"random_{seed}"] = _vector(f"random_{seed}", description, r)
    out.update(gate_vectors.vectors(FORMAT))
    out.update(failures_vectors.vectors(FORMAT))
    out.update(breaker_vectors.vectors(FORMAT))
    return out


def _vector(name: str, description: str, r: Recorder) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "name": name,
        "description": " ".join(description.split()),
        "retry": r.retry,
        "steps": r.steps,
    }


def dumps(vector: dict[str, Any]) -> str:
    """One vector as JSON text: header fields first, one step per line."""
    head = {k: v for k, v in vector.items() if k != "steps"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "steps": [']
    steps = [json.dumps(s, sort_keys=True) for s in vector["steps"]]
    lines.extend(f"  {s}," for s in steps[:-1])
    lines.extend(f"  {s}" for s in steps[-1:])
    lines.append("]}")
    return "\n".join(lines) + "\n"


def stale_files(folder: Path = VECTORS) -> list[str]:
    """Vector files that are missing, differ from a fresh generation, or are extra."""
    fresh = {f"{name}.json": dumps(v) for name, v in vectors().items()}
    present = {p.name for p in folder.glob("*.json")}
    stale = sorted(present - set(fresh))
    for name, text in fresh.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Write the vectors, or with ``--check`` report stale ones and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m spec.conformance.generate")
    parser.add_argument("--check", action="store_true", help="fail if a vector file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale vectors: {', '.join(stale)}; run python -m spec.conformance.generate",
                  file=sys.stderr)
            return 1
        print(f"{len(vectors())} vectors are current")
        return 0
    VECTORS.mkdir(parents=True, exist_ok=True)
    fresh = vectors()
    for old in VECTORS.glob("*.json"):
        if old.stem not in fresh:
            old.unlink()
    for name, vector in fresh.items():
        (VECTORS / f"{name}.json").write_text(dumps(vector))
    total = sum(len(v["steps"]) for v in fresh.values())
    print(f"wrote {len(fresh)} vectors ({total} steps) to {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
