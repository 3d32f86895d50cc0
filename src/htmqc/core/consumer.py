"""The consumer core: every partition this member holds, and the decisions.

Theory of operation
-------------------
:class:`ConsumerCore` is what the runtime drives. It owns one
:class:`~htmqc.core.partition.PartitionTracker` per assigned partition and
answers events with values (h11's sans-I/O style):

=====================  ==========================================================
event                  answer
=====================  ==========================================================
``assign``/``restored``  a fresh *epoch* for the partition
``fetched``            the offsets to run (Pending)
``started``            -
``succeeded``          -
``failed``             :class:`RetryAt`, :class:`HandOff` or :class:`DeadLetter`
``retry_due``          - (the message runs again)
``handed_off``         -
``dead_lettered``      -
``commit_requested``   :class:`Commit` or ``None``
``commit_acked``       whether ``committed`` moved
``commit_failed``      -
``revoking``           - (nothing new starts)
``revoked``            the last :class:`Commit` or ``None``; state dropped
``crashed``            - (all volatile state dropped)
=====================  ==========================================================

Epochs. Every assignment gets a new epoch, and every decision carries it.
Events about a partition carry the epoch they belong to; an event whose epoch is
not the partition's current one (the partition was revoked, or revoked and
assigned again) is *late*: it is ignored and the method returns ``False`` (or
``None``/an empty batch). This is how acks that arrive after a revoke, and
completions from workers that outlived their assignment, are made harmless.
Events that are not late but illegal raise :class:`~htmqc.core.errors.CoreError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import icontract

from htmqc.core.contracts import ENABLED, capture_old
from htmqc.core.decisions import Commit, DeadLetter, HandOff, RetryAt, TopicPartition
from htmqc.core.errors import IllegalTransition, NotAssigned, OffsetOrderError
from htmqc.core.failures import Failure, RetryTopic, decide
from htmqc.core.lifecycle import Event, MessageState
from htmqc.core.partition import PartitionTracker
from htmqc.core.retry import FailureKind, RetryPolicy

_NOTHING: tuple[int, ...] = ()


class ConsumerCore:
    """The pure state of one consumer-group member (see module docs)."""

    def __init__(
        self, retry: RetryPolicy | None = None, *, retry_topic: RetryTopic | None = None
    ) -> None:
        self.retry = retry if retry is not None else RetryPolicy()
        #: Where long backoffs wait (``--retry-topic``), or ``None``.
        self.retry_topic = retry_topic
        self._parts: dict[TopicPartition, PartitionTracker] = {}
        self._epochs: dict[TopicPartition, int] = {}
        self._last_epoch = 0

    # -- assignment ----------------------------------------------------------------------

    @capture_old(lambda self: self._last_epoch, name="last_epoch")
    @icontract.ensure(
        lambda self, tp, result, OLD: result == self._epochs[tp] == OLD.last_epoch + 1,
        "every assignment gets a fresh epoch",
        enabled=ENABLED,
    )
    def assign(
        self, tp: TopicPartition, committed: int, finished_above: Iterable[int] = ()
    ) -> int:
        """Take ``tp``, starting at its durable position ``committed``; return the epoch.

        ``finished_above``: offsets at or above ``committed`` whose effects the sink
        already holds (from an earlier :class:`Commit`); they will not run again.
        Assigning a partition that is already held is an :class:`IllegalTransition`.

        :raises IllegalTransition: ``tp`` is already assigned.
        :raises OffsetOrderError: ``committed`` is negative or above a finished offset.
        """
        if tp in self._parts:
            raise IllegalTransition(f"assign: {_name(tp)} is already assigned")
        if committed < 0:
            raise OffsetOrderError(f"assign: {_name(tp)} cannot start at offset {committed}")
        tracker = PartitionTracker(committed, finished_above)
        self._last_epoch += 1
        self._parts[tp] = tracker
        self._epochs[tp] = self._last_epoch
        return self._last_epoch

    def restored(
        self, tp: TopicPartition, committed: int, finished_above: Iterable[int] = ()
    ) -> int:
        """After :meth:`crashed`: take ``tp`` again from its durable position.

        The same as :meth:`assign`; a separate name so traces say what happened.

        :raises IllegalTransition: ``tp`` is already assigned.
        :raises OffsetOrderError: ``committed`` is negative or above a finished offset.
        """
        return self.assign(tp, committed, finished_above)

    def revoking(self, tp: TopicPartition) -> None:
        """``tp`` is being revoked: nothing new is fetched, started or retried."""
        tracker = self._parts.get(tp)
        if tracker is not None:
            tracker.begin_drain()

    @icontract.ensure(lambda self, tp: tp not in self._parts, enabled=ENABLED)
    def revoked(self, tp: TopicPartition) -> Commit | None:
        """Drop ``tp``; return the final commit of its watermark, if any is new.

        Unfinished work is dropped; it will run again wherever ``tp`` goes next.
        Any later event for this assignment is ignored as late."""
        commit = self.commit_requested(tp)
        self._parts.pop(tp, None)
        self._epochs.pop(tp, None)
        return commit

    @icontract.ensure(lambda self: not self._parts, enabled=ENABLED)
    def crashed(self) -> None:
        """The process died: every partition's volatile state is gone."""
        self._parts.clear()
        self._epochs.clear()

    # -- views ---------------------------------------------------------------------------

    def partitions(self) -> Iterator[tuple[TopicPartition, int, PartitionTracker]]:
        """``(tp, epoch, tracker)`` for every held partition (do not mutate trackers)."""
        for tp, tracker in self._parts.items():
            yield tp, self._epochs[tp], tracker

    def tracker(self, tp: TopicPartition) -> PartitionTracker:
        """The tracker of a held partition.

        :raises NotAssigned: ``tp`` is not held.
        """
        try:
            return self._parts[tp]
        except KeyError:
            raise NotAssigned(f"{_name(tp)} is not assigned") from None

    def epoch(self, tp: TopicPartition) -> int | None:
        """The current epoch of ``tp``, or ``None`` if it is not held."""
        return self._epochs.get(tp)

    def snapshot(self) -> dict[str, Any]:
        """Every held partition's state as plain data, keyed ``"topic/partition"``."""
        return {
            _name(tp): {"epoch": self._epochs[tp], **t.snapshot()}
            for tp, t in sorted(self._parts.items())
        }

    @icontract.ensure(
        lambda self, tp, epoch, result: (result is None) == (self._epochs.get(tp) != epoch),
        "an event reaches a tracker exactly when its epoch is the partition's current one",
        enabled=ENABLED,
    )
    def _current(self, tp: TopicPartition, epoch: int) -> PartitionTracker | None:
        if self._epochs.get(tp) != epoch:
            return None
        return self._parts[tp]

    # -- fetching and lifecycle ----------------------------------------------------------

    def fetched(
        self, tp: TopicPartition, epoch: int, offsets: Sequence[int], end: int | None = None
    ) -> Sequence[int]:
        """Record a fetched batch (see :meth:`PartitionTracker.fetched`); return
        the offsets to run. A late batch (stale epoch) returns nothing to run.

        :raises IllegalTransition: the partition is being revoked.
        :raises OffsetOrderError: the batch starts below ``next`` or is out of order.
        """
        tracker = self._current(tp, epoch)
        if tracker is None:
            return _NOTHING
        return tracker.fetched(offsets, end)

    def _event(self, event: Event, tp: TopicPartition, epoch: int, offset: int) -> bool:
        tracker = self._current(tp, epoch)
        if tracker is None:
            return False
        tracker.apply(event, offset)
        return True

    def _events(
        self, event: Event, tp: TopicPartition, epoch: int, offsets: Sequence[int]
    ) -> bool:
        tracker = self._current(tp, epoch)
        if tracker is None:
            return False
        tracker.apply_many(event, offsets)
        return True

    def started(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Pending -> Processing. False if late.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._event(Event.START, tp, epoch, offset)

    def started_many(self, tp: TopicPartition, epoch: int, offsets: Sequence[int]) -> bool:
        """Batch form of :meth:`started`: all or none.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._events(Event.START, tp, epoch, offsets)

    def succeeded(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Processing -> Succeeded (finished). False if late.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._event(Event.SUCCEED, tp, epoch, offset)

    def succeeded_many(self, tp: TopicPartition, epoch: int, offsets: Sequence[int]) -> bool:
        """Batch form of :meth:`succeeded`: all or none.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._events(Event.SUCCEED, tp, epoch, offsets)

    def retry_due(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Retrying -> Processing: the backoff passed and the message runs again.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._event(Event.RETRY_DUE, tp, epoch, offset)

    def dead_lettered(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Failed -> DeadLettered (finished): the DLQ write is done.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._event(Event.DEAD_LETTER, tp, epoch, offset)

    def dead_lettered_many(
        self, tp: TopicPartition, epoch: int, offsets: Sequence[int]
    ) -> bool:
        """Batch form of :meth:`dead_lettered`: all or none.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._events(Event.DEAD_LETTER, tp, epoch, offsets)

    def handed_off(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Failed -> HandedOff (finished): the message is on the retry topic.

        :raises IllegalTransition: an offset is not in the event's source state.
        """
        return self._event(Event.HAND_OFF, tp, epoch, offset)

    @icontract.require(lambda jitter: 0.0 <= jitter <= 1.0, enabled=ENABLED)
    @icontract.require(
        lambda now: math.isfinite(now), "the clock reads a finite time", enabled=ENABLED
    )
    @icontract.require(lambda held_for: held_for is None or held_for >= 0.0, enabled=ENABLED)
    @icontract.ensure(
        lambda self, tp, offset, result: result is None
        or (self.tracker(tp).state_of(offset) is MessageState.RETRYING)
        == isinstance(result, RetryAt),
        "a retried message is Retrying; any other stays Failed until reported",
        enabled=ENABLED,
    )
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
        """Processing -> Failed, then :func:`~htmqc.core.failures.decide` says what next.

        ``failure``: what the runtime knows (a bare :class:`FailureKind` stands for
        ``Failure(kind=...)``). ``jitter`` in ``[0, 1]`` is the caller's random draw;
        ``held_for``: ``None``, or the seconds the circuit breaker stays open.
        :class:`RetryAt`: the message is now Retrying, due at ``at``.
        :class:`HandOff` / :class:`DeadLetter`: it stays Failed until the runtime
        reports :meth:`handed_off` / :meth:`dead_lettered`. ``None`` if late.

        :raises IllegalTransition: ``offset`` is not Processing.
        """
        tracker = self._current(tp, epoch)
        if tracker is None:
            return None
        if isinstance(failure, FailureKind):
            failure = Failure(kind=failure)
        tracker.apply(Event.FAIL, offset)
        decision = decide(
            failure,
            tp=tp,
            epoch=epoch,
            offset=offset,
            attempts=tracker.failures(offset) + failure.prior_attempts,
            retry=self.retry,
            retry_topic=self.retry_topic,
            now=now,
            jitter=jitter,
            held_for=held_for,
        )
        if isinstance(decision, RetryAt):
            tracker.apply(Event.SCHEDULE_RETRY, offset)
        return decision

    # -- commits -------------------------------------------------------------------------

    @icontract.ensure(
        lambda self, tp, result: result is None
        or (
            result.epoch == self._epochs[tp]
            and result.offset == self._parts[tp].processed
            and result.finished_above == self._parts[tp].finished_above()
        ),
        "a commit carries the watermark and every offset finished or held above it",
        enabled=ENABLED,
    )
    def commit_requested(self, tp: TopicPartition) -> Commit | None:
        """The commit to make for ``tp`` now, or ``None`` if nothing new is finished."""
        tracker = self._parts.get(tp)
        if tracker is None:
            return None
        offset = tracker.commit_requested()
        if offset is None:
            return None
        return Commit(
            tp=tp, epoch=self._epochs[tp], offset=offset, finished_above=tracker.finished_above()
        )

    def commits(self) -> list[Commit]:
        """:meth:`commit_requested` for every held partition, leaving out ``None``."""
        out = []
        for tp in self._parts:
            commit = self.commit_requested(tp)
            if commit is not None:
                out.append(commit)
        return out

    def commit_acked(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """``offset`` is durable. True if ``committed`` moved; False if the ack was
        late (stale epoch), duplicated or overtaken by a later ack.

        :raises IllegalTransition: ``offset`` is above the watermark.
        """
        tracker = self._current(tp, epoch)
        if tracker is None:
            return False
        return tracker.commit_acked(offset)

    def commit_failed(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """A commit failed: it will be requested again. False if late."""
        tracker = self._current(tp, epoch)
        if tracker is None:
            return False
        tracker.commit_failed(offset)
        return True


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}/{tp[1]}"
