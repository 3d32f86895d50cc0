"""``--trace FILE``: every core transition as one JSON line (design notes §5).

:class:`TracingCore` is a :class:`~htmqc.core.ConsumerCore` that, after each
event that changed something, appends
``{"p": "topic/partition", "ev": EVENT, "off": OFFSET, "state": {"next": ..,
"processed": .., "committed": ..}}``. Batch events write one line per offset
(the state after the whole batch), so a trace replays through the reference
model offset by offset. Late events (stale epoch) are not written: they change
nothing. Tracing costs a JSON dump per offset; leave it off for throughput.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import IO, Any

from htmqc.core import Commit, ConsumerCore, DeadLetter, FailureKind, RetryAt, RetryPolicy
from htmqc.core.decisions import TopicPartition


class TracingCore(ConsumerCore):
    """A core that writes its transitions to ``out`` (see module docs)."""

    def __init__(self, out: IO[str], retry: RetryPolicy | None = None) -> None:
        super().__init__(retry)
        self._out = out

    def _write(
        self, tp: TopicPartition, ev: str, offsets: Iterable[int | None], above: Sequence[int] = ()
    ) -> None:
        tracker = self._parts.get(tp)
        state: dict[str, Any] = (
            {"next": tracker.next, "processed": tracker.processed, "committed": tracker.committed}
            if tracker is not None
            else {}
        )
        name = f"{tp[0]}/{tp[1]}"
        extra = {"above": list(above)} if above else {}
        for off in offsets:
            self._out.write(
                json.dumps({"p": name, "ev": ev, "off": off, "state": state, **extra}) + "\n"
            )

    def close(self) -> None:
        """Flush and close the trace file."""
        self._out.close()

    def assign(self, tp: TopicPartition, committed: int, finished_above: Iterable[int] = ()) -> int:
        above = sorted(finished_above)
        epoch = super().assign(tp, committed, above)
        self._write(tp, "assign", [committed], above)
        return epoch

    def fetched(
        self, tp: TopicPartition, epoch: int, offsets: Sequence[int], end: int | None = None
    ) -> Sequence[int]:
        before = self._parts[tp].next if self.epoch(tp) == epoch else None
        run = super().fetched(tp, epoch, offsets, end)
        if before is not None and self._parts[tp].next != before:
            self._write(tp, "fetched", list(offsets) or [end])
        return run

    def _traced(self, ev: str, ok: bool, tp: TopicPartition, offsets: Sequence[int]) -> bool:
        if ok:
            self._write(tp, ev, offsets)
        return ok

    def started(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("started", super().started(tp, epoch, offset), tp, [offset])

    def started_many(self, tp: TopicPartition, epoch: int, offsets: Sequence[int]) -> bool:
        return self._traced("started", super().started_many(tp, epoch, offsets), tp, offsets)

    def succeeded(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("succeeded", super().succeeded(tp, epoch, offset), tp, [offset])

    def succeeded_many(self, tp: TopicPartition, epoch: int, offsets: Sequence[int]) -> bool:
        return self._traced("succeeded", super().succeeded_many(tp, epoch, offsets), tp, offsets)

    def retry_due(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("retry_due", super().retry_due(tp, epoch, offset), tp, [offset])

    def dead_lettered(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("dead_lettered", super().dead_lettered(tp, epoch, offset), tp, [offset])

    def failed(
        self,
        tp: TopicPartition,
        epoch: int,
        offset: int,
        kind: FailureKind,
        now: float,
        jitter: float,
    ) -> RetryAt | DeadLetter | None:
        decision = super().failed(tp, epoch, offset, kind, now, jitter)
        if decision is not None:
            self._write(tp, "failed", [offset])
            if isinstance(decision, RetryAt):
                self._write(tp, "retry_scheduled", [offset])
        return decision

    def commit_acked(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        ok = super().commit_acked(tp, epoch, offset)
        return self._traced("commit_acked", ok, tp, [offset])

    def commit_failed(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("commit_failed", super().commit_failed(tp, epoch, offset), tp, [offset])

    def revoking(self, tp: TopicPartition) -> None:
        super().revoking(tp)
        if tp in self._parts:
            self._write(tp, "revoking", [None])

    def revoked(self, tp: TopicPartition) -> Commit | None:
        held = tp in self._parts
        commit = super().revoked(tp)
        if held:
            self._write(tp, "revoked", [commit.offset if commit else None])
        return commit

    def crashed(self) -> None:
        held = list(self._parts)
        super().crashed()
        for tp in held:
            self._write(tp, "crashed", [None])
