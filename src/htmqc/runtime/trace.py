"""``--trace FILE``: every core transition as one JSON line (design notes §5).

:class:`TracingCore` is a :class:`~htmqc.core.ConsumerCore` that, after each
event that changed something, appends one line::

    {"p": "topic/partition", "ev": EVENT, "off": OFFSET,
     "state": {"next": .., "processed": .., "committed": .., "requested": ..,
               "unsent": .., "epoch": .., "finished_above": [..]}}

``state`` is the partition's tracker after the event (``{}`` once the
partition is no longer held): the three watermarks, ``requested`` (the last
offset handed out for a commit), ``unsent`` (something finished since the last
commit request), the assignment's ``epoch`` (the core's number) and
``finished_above()``. Offset sets (``finished_above``, ``"above"``) are written
by :func:`compact_offsets`: increasing, each run of two or more consecutive
offsets as a pair ``[first, last]``, so ``[3, [5, 9], 12]`` is 3, 5..9 and 12.
While one offset is held (a retry waiting out its backoff) everything after it
finishes above the watermark; written in full, every line would repeat that
growing set and a trace would grow with the square of the stall (one chaos run
wrote 218 MB for 74,000 lines). Pairs keep a line's size to the number of gaps
(offsets not finished), which flow control bounds. Events (``lifecycle.Event`` values and the
core's method names): ``assign``, ``fetched``, the lifecycle events,
``commit_requested``, ``commit_acked``, ``commit_failed``, ``revoking``,
``revoked``, ``crashed``. Some lines carry more:

* ``assign``: ``"above"``, the offsets the sink held above ``off``;
* ``commit_requested`` (a line per request that handed something out, also
  the ones ``revoked`` and ``commits`` make): ``off`` and ``"above"`` are the
  :class:`~htmqc.core.Commit`'s offset and ``finished_above``, ``"epoch"`` its
  epoch;
* ``assign`` and ``commit_requested``, exactly-once: ``"fence"``, the fence
  token the runtime got from ``Sink.claim`` for this assignment (read from
  the ``fences`` mapping the runtime keeps; the core does not know it).

Batch events write one line per offset (the state after the whole batch), so a
trace replays through the reference model offset by offset; a batch's lines go
out in one write, so a process killed while tracing leaves whole batches. Late events (stale
epoch) are not written: they change nothing. Tracing costs a JSON dump per
offset; leave it off for throughput. ``model_checks.trace_validation`` reads
this format (and refuses traces written before it had ``requested``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from htmqc.core import (
    Commit,
    ConsumerCore,
    DeadLetter,
    Failure,
    FailureKind,
    HandOff,
    RetryAt,
    RetryPolicy,
    RetryTopic,
)
from htmqc.core.decisions import TopicPartition


def compact_offsets(offsets: Iterable[int]) -> list[int | list[int]]:
    """Increasing distinct ``offsets`` as the trace writes them (module docs): an
    offset alone, or ``[first, last]`` for a run of consecutive ones.

    >>> compact_offsets([3, 5, 6, 7, 8, 9, 12, 13])
    [3, [5, 9], [12, 13]]
    """
    out: list[int | list[int]] = []
    first = last = -2
    for o in offsets:
        if o == last + 1:
            last = o
            continue
        if last >= 0:
            out.append(first if first == last else [first, last])
        first = last = o
    if last >= 0:
        out.append(first if first == last else [first, last])
    return out


class TracingCore(ConsumerCore):
    """A core that writes its transitions to ``out`` (see module docs).

    ``fences``: the runtime's live map of each partition's fence token
    (exactly-once; the runtime may set it after construction); ``None`` when
    there are none (at-least-once).
    """

    def __init__(
        self,
        out: IO[str],
        retry: RetryPolicy | None = None,
        fences: Mapping[TopicPartition, int] | None = None,
        *,
        retry_topic: RetryTopic | None = None,
    ) -> None:
        super().__init__(retry, retry_topic=retry_topic)
        self._out = out
        self.fences = fences

    def _state(self, tp: TopicPartition) -> dict[str, Any]:
        tracker = self._parts.get(tp)
        if tracker is None:
            return {}
        return {
            "next": tracker.next,
            "processed": tracker.processed,
            "committed": tracker.committed,
            "requested": tracker.requested,
            "unsent": tracker._unsent,
            "epoch": self._epochs[tp],
            "finished_above": compact_offsets(tracker.finished_above()),
        }

    def _write(
        self, tp: TopicPartition, ev: str, offsets: Iterable[int | None], **extra: Any
    ) -> None:
        state = self._state(tp)
        name = f"{tp[0]}/{tp[1]}"
        # One write per event: a process killed mid-trace loses whole batches at
        # its tail, never the end of one (whose lines all carry the state after it).
        self._out.write("".join(
            json.dumps({"p": name, "ev": ev, "off": off, "state": state, **extra}) + "\n"
            for off in offsets
        ))  # fmt: skip

    def _fence(self, tp: TopicPartition) -> dict[str, int]:
        fence = self.fences.get(tp) if self.fences is not None else None
        return {} if fence is None else {"fence": fence}

    def close(self) -> None:
        """Flush and close the trace file."""
        self._out.close()

    def assign(self, tp: TopicPartition, committed: int, finished_above: Iterable[int] = ()) -> int:
        above = sorted(finished_above)
        epoch = super().assign(tp, committed, above)
        self._write(tp, "assign", [committed], above=compact_offsets(above), **self._fence(tp))
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

    def dead_lettered_many(self, tp: TopicPartition, epoch: int, offsets: Sequence[int]) -> bool:
        ok = super().dead_lettered_many(tp, epoch, offsets)
        return self._traced("dead_lettered", ok, tp, offsets)

    def handed_off(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        return self._traced("handed_off", super().handed_off(tp, epoch, offset), tp, [offset])

    def failed(
        self,
        tp: TopicPartition,
        epoch: int,
        offset: int,
        failure: Failure | FailureKind,
        now: float,
        jitter: float,
        *,
        held_for: float | None = None,
    ) -> RetryAt | HandOff | DeadLetter | None:
        decision = super().failed(tp, epoch, offset, failure, now, jitter, held_for=held_for)
        if decision is not None:
            self._write(tp, "failed", [offset])
            if isinstance(decision, RetryAt):
                self._write(tp, "retry_scheduled", [offset])
        return decision

    def commit_requested(self, tp: TopicPartition) -> Commit | None:
        commit = super().commit_requested(tp)
        if commit is not None:
            self._write(
                tp, "commit_requested", [commit.offset],
                above=compact_offsets(commit.finished_above),
                epoch=commit.epoch, **self._fence(tp),
            )
        return commit

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
