"""The offset tracker of one assigned partition.

Theory of operation
-------------------
Kafka convention throughout: an offset *committed* is the next offset to read.
Three watermarks describe a partition::

    committed  <=  processed  <=  next

* ``next``: one past the highest offset the fetcher has covered. A fetched
  batch covers a range ``[old next, new next)``; offsets in the range that never
  arrived (compaction, transaction control records, retention) are *gaps* and
  count as finished.
* ``processed``: the watermark. Every offset below it is finished (succeeded,
  dead-lettered or a gap); it is the smallest unfinished offset, or ``next``
  when nothing is unfinished.
* ``committed``: the durable watermark, as acknowledged by the broker or the
  sink. It never moves backwards.

``requested`` (``committed <= requested <= processed``) is the highest offset
handed out in a :meth:`commit_requested` that has not failed. A commit is due
when the watermark passed ``requested`` or when offsets finished out of order
since the last request (``unsent``): an exactly-once sink must store the set of
offsets finished above the watermark with every transaction, or a restart would
run them again.

The seed document states the invariant with inclusive offsets, "last committed
<= last processed < next"; :mod:`htmqc.core.offsets` maps one form to the other.

Representation and cost
-----------------------
``_live`` maps every fetched, unfinished offset to its
:class:`~htmqc.core.lifecycle.MessageState`; ``_order`` holds fetched offsets in
increasing order, from the watermark up. An offset is finished exactly when it
is below ``next`` and not in ``_live``, so gaps cost nothing. The watermark is
the first offset of ``_order`` that is still live: finished offsets are popped
off the front lazily, each once, so every operation is amortized O(1) per
offset and memory is bounded by the window ``[processed, next)``.

Illegal events raise :class:`~htmqc.core.errors.IllegalTransition` or
:class:`~htmqc.core.errors.OffsetOrderError` and leave the tracker unchanged:

* completing (or starting) an offset twice, or one that was never fetched:
  ``IllegalTransition`` - a correct runtime never does either, so silence would
  hide a bug;
* a fetched batch that starts below ``next`` or is not strictly increasing:
  ``OffsetOrderError``;
* a batch that starts *above* ``next`` leaves a gap, which is how Kafka reports
  compacted or deleted records;
* an ack at or below ``committed`` is late or duplicated and ignored; an ack
  above ``processed`` is ``IllegalTransition``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice, pairwise, repeat
from operator import lt
from typing import Any, TypeVar

import icontract

from htmqc.core.contracts import ENABLED, capture_old
from htmqc.core.errors import IllegalTransition, OffsetOrderError
from htmqc.core.lifecycle import EDGES, FINISHED, INITIAL, Event, MessageState

_FINISHING = frozenset(event for event, (_, target) in EDGES.items() if target in FINISHED)
_FORBIDDEN_WHILE_DRAINING = frozenset({Event.START, Event.RETRY_DUE})


def tracker_invariant(t: PartitionTracker) -> bool:
    """The tracker's invariant (checked after every transition when contracts are on).

    ``committed <= requested <= processed <= next``; every live offset lies in
    ``[processed, next)``; ``processed`` is exactly the smallest live offset (or
    ``next``); ``_order`` is strictly increasing, starts at ``processed`` and
    contains every live offset.
    """
    live = t._live
    order = t._order
    if not (0 <= t._committed <= t._requested <= t._processed <= t._next):
        return False
    if live:
        if t._processed != min(live) or max(live) >= t._next:
            return False
        if not order or order[0] != t._processed:
            return False
    elif t._processed != t._next:
        return False
    if any(a >= b for a, b in zip(order, islice(order, 1, None), strict=False)):
        return False
    if order and (order[0] < t._processed or order[-1] >= t._next):
        return False
    return set(live) <= set(order) and set(t._failures) <= set(live)


def _invariant_after(self: PartitionTracker) -> bool:
    return tracker_invariant(self)


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _keeps_invariant() -> Callable[[_Fn], _Fn]:
    # A postcondition rather than an icontract class invariant: class invariants
    # also wrap __eq__/__ne__, which CrossHair then explores to no purpose.
    decorator: Callable[[_Fn], _Fn] = icontract.ensure(
        _invariant_after, "the tracker invariant holds", enabled=ENABLED
    )
    return decorator


class PartitionTracker:
    """Offsets and message states of one assigned partition (see module docs).

    ``start`` is the durable position the assignment begins at; ``finished_above``
    lists offsets at or above ``start`` that the sink already holds (stored with
    the commit, see :class:`~htmqc.core.decisions.Commit`): when fetched they are
    finished at once and not handed out to run. ``start`` itself is among them
    when the commit was made with every offset below a held one finished.
    """

    @_keeps_invariant()
    def __init__(self, start: int, finished_above: Iterable[int] = ()) -> None:
        """:raises OffsetOrderError: ``start`` is negative or above a finished offset.

        A finished offset may equal ``start``: a commit made while a held offset
        ``h`` was not fetched yet and everything below it was finished is
        ``offset = h, finished_above = (h, ...)`` (found by the TLC graph replay,
        model ``small_eos``: refusing it made the partition unassignable)."""
        if start < 0:
            raise OffsetOrderError(f"cannot start at negative offset {start}")
        skip = set(finished_above)
        if any(o < start for o in skip):
            raise OffsetOrderError(f"finished_above offsets must not lie below start {start}")
        self._next = start
        self._processed = start
        self._committed = start
        self._requested = start
        self._unsent = False
        self._live: dict[int, MessageState] = {}
        self._order: deque[int] = deque()
        self._failures: dict[int, int] = {}
        self._skip = skip
        self._draining = False

    # -- read-only view --------------------------------------------------------------

    @property
    def next(self) -> int:
        """One past the highest fetched offset."""
        return self._next

    @property
    def processed(self) -> int:
        """The watermark: every offset below it is finished."""
        return self._processed

    @property
    def committed(self) -> int:
        """The durable watermark."""
        return self._committed

    @property
    def requested(self) -> int:
        """The highest offset in a commit request that has not failed."""
        return self._requested

    @property
    def draining(self) -> bool:
        """True once the partition is being revoked: nothing new may start."""
        return self._draining

    @property
    def live_count(self) -> int:
        """How many fetched offsets are unfinished (Pending, Processing, Failed...):
        ``len(in_flight())`` in O(1)."""
        return len(self._live)

    @property
    @icontract.ensure(
        lambda self, result: result == len(self.finished_above()),
        "exactly as many as finished_above lists",
        enabled=ENABLED,
    )
    def finished_count(self) -> int:
        """How many offsets :meth:`finished_above` lists, in O(1) (the metadata
        budget's upper bound of a commit's text rests on it)."""
        return len(self._order) - len(self._live) + len(self._skip)

    def highest_held(self) -> int | None:
        """The highest offset the sink held at assignment that no fetch covered
        yet (``finished_above`` of :meth:`__init__`), or ``None``."""
        return max(self._skip) if self._skip else None

    def state_of(self, offset: int) -> MessageState | None:
        """The state of an unfinished offset; ``None`` if finished or never fetched."""
        return self._live.get(offset)

    def is_finished(self, offset: int) -> bool:
        """True if ``offset`` was covered by a fetch and is finished (or a gap)."""
        return offset < self._next and offset not in self._live

    def failures(self, offset: int) -> int:
        """How many times the unfinished ``offset`` has failed so far."""
        return self._failures.get(offset, 0)

    def in_flight(self) -> dict[int, MessageState]:
        """A copy of the unfinished offsets and their states."""
        return dict(self._live)

    @icontract.ensure(
        lambda self, result: all(a < b for a, b in pairwise(result))
        and all(o >= self._processed and o not in self._live for o in result)
        and self._skip.issubset(result)
        and len(result) == len(self._order) - len(self._live) + len(self._skip),
        "exactly the finished offsets above the watermark and the held ones, increasing",
        enabled=ENABLED,
    )
    def finished_above(self) -> tuple[int, ...]:
        """Offsets above the watermark that are finished, in increasing order:
        those that finished out of order, and those the sink already held at
        assignment (``finished_above`` of :meth:`__init__`) that have not been
        fetched again yet. A commit must carry both, or a sink that replaces its
        stored set would forget the second kind (found by TLC, model
        ``small_eos_forget_skip``)."""
        live = self._live
        done = tuple(o for o in self._order if o not in live)
        return done + tuple(sorted(self._skip)) if self._skip else done

    def snapshot(self) -> dict[str, Any]:
        """The whole observable state as plain data (for traces and vectors);
        ``unsent`` is the flag that makes :meth:`commit_requested` answer even
        when the watermark has not moved."""
        return {
            "next": self._next,
            "processed": self._processed,
            "committed": self._committed,
            "requested": self._requested,
            "unsent": self._unsent,
            "draining": self._draining,
            "in_flight": {str(o): s.value for o, s in sorted(self._live.items())},
            "finished_above": list(self.finished_above()),
        }

    # -- fetching ------------------------------------------------------------------------

    @capture_old(lambda self: self._next, name="next")
    @capture_old(lambda self: (len(self._live), frozenset(self._skip)), name="before")
    @icontract.ensure(
        lambda self, end, offsets, OLD: self._next
        == (end if end is not None else (offsets[-1] + 1 if offsets else OLD.next)),
        "next moves to the end of the fetched range",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, result: all(self._live.get(o) is INITIAL for o in result),
        "every offset handed out is Pending",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, offsets, result, OLD: list(result)
        == [o for o in offsets if o not in OLD.before[1]]
        and len(self._live) == OLD.before[0] + len(result),
        "exactly the arrived offsets the sink does not hold are handed out to run",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, OLD: self._skip == {o for o in OLD.before[1] if o >= self._next},
        "a held offset stays held until a fetch covers it",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def fetched(self, offsets: Sequence[int], end: int | None = None) -> Sequence[int]:
        """Record a fetched batch covering ``[next, end)``; return the offsets to run.

        ``offsets``: the offsets that arrived, strictly increasing, all ``>= next``.
        ``end``: one past the covered range; defaults to ``offsets[-1] + 1``. Offsets
        of the range that did not arrive are gaps. The returned offsets are Pending;
        offsets the sink already holds (``finished_above``) are left out.

        :raises IllegalTransition: the partition is being revoked.
        :raises OffsetOrderError: the batch starts below ``next`` or is out of order.
        """
        if not offsets and end is None:
            return offsets  # nothing arrived and no range was covered: no event
        if self._draining:
            raise IllegalTransition("fetched: the partition is being revoked")
        lo = self._next
        if offsets:
            first = offsets[0]
            last = offsets[-1]
            if first < lo:
                raise OffsetOrderError(f"fetched offset {first} is below next ({lo})")
            n = len(offsets)
            if (
                n > 1
                and not (isinstance(offsets, range) and offsets.step == 1)
                # the usual batch, consecutive offsets: one C-level comparison
                and not (last - first == n - 1 and offsets == list(range(first, last + 1)))
                and not all(map(lt, offsets, islice(offsets, 1, None)))
            ):
                raise OffsetOrderError("fetched offsets are not strictly increasing")
            hi = last + 1 if end is None else end
            if hi <= last:
                raise OffsetOrderError(f"range end {hi} is not above the last offset {last}")
        else:
            assert end is not None  # the empty, end-less batch returned above
            hi = end
            if hi < lo:
                raise OffsetOrderError(f"range end {hi} is below next ({lo})")
        # Offsets the sink already holds arrive finished: they stay in _order so
        # that later commits keep carrying them in finished_above.
        self._order.extend(offsets)
        if self._skip:
            skip = self._skip
            offsets = [o for o in offsets if o not in skip]
            self._skip = {o for o in skip if o >= hi}
        self._live.update(dict.fromkeys(offsets, INITIAL))
        self._next = hi
        if self._processed not in self._live:
            self._advance()
        return offsets

    # -- lifecycle events ---------------------------------------------------------------

    @capture_old(lambda self: self._processed, name="processed")
    @capture_old(lambda self, offset: (self._live.get(offset), self._unsent), name="before")
    @icontract.ensure(
        lambda event, OLD: OLD.before[0] is EDGES[event][0],
        "the offset was in the event's source state",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, event, OLD: self._unsent == (OLD.before[1] or EDGES[event][1] in FINISHED),
        "a commit is due once an offset finished, and not because of anything else",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, event, offset, result: result is EDGES[event][1]
        and (self._live.get(offset) is result or (result in FINISHED and offset not in self._live)),
        "the offset moved along the table's edge",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, OLD: self._processed >= OLD.processed, "the watermark never moves back",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def apply(self, event: Event, offset: int) -> MessageState:
        """Move ``offset`` along the edge of ``event``; return its new state.

        :raises IllegalTransition: ``offset`` is not in the edge's source state.
        """
        source, target = EDGES[event]
        live = self._live
        if live.get(offset) is not source or (
            self._draining and event in _FORBIDDEN_WHILE_DRAINING
        ):
            self._reject(event, (offset,))
        if event in _FINISHING:
            del live[offset]
            self._failures.pop(offset, None)
            self._unsent = True
            if offset == self._processed:
                self._advance()
        else:
            live[offset] = target
            if event is Event.FAIL:
                self._failures[offset] = self._failures.get(offset, 0) + 1
        return target

    @capture_old(lambda self: self._processed, name="processed")
    @capture_old(
        lambda self, offsets: (len(self._live), list(map(self._live.get, offsets)), self._unsent),
        name="batch",
    )
    @icontract.ensure(
        lambda event, offsets, OLD: OLD.batch[1].count(EDGES[event][0])
        == len(offsets)
        == len(set(offsets)),
        "every offset of the batch was in the event's source state, once",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, event, offsets, OLD: len(self._live)
        == OLD.batch[0] - (len(offsets) if EDGES[event][1] in FINISHED else 0),
        "only the batch's offsets left the live set",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, event, offsets, OLD: self._unsent
        == (OLD.batch[2] or (EDGES[event][1] in FINISHED and len(offsets) > 0)),
        "a commit is due once offsets finished, and not because of anything else",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, event, offsets: all(
            self._live.get(o) is EDGES[event][1]
            or (EDGES[event][1] in FINISHED and o not in self._live)
            for o in offsets
        ),
        "every offset moved along the table's edge",
        enabled=ENABLED,
    )
    @icontract.ensure(
        lambda self, OLD: self._processed >= OLD.processed, "the watermark never moves back",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def apply_many(self, event: Event, offsets: Sequence[int]) -> None:
        """Batch form of :meth:`apply`: all offsets move, or none does.

        :raises IllegalTransition: an offset is not in the edge's source state.
        """
        source, target = EDGES[event]
        live = self._live
        n = len(offsets)
        if event in _FINISHING:
            # Pop first, check after (one pass over the batch, not two): an offset
            # that was not in `source`, or a duplicate, makes the count fall short;
            # then every popped state goes back and the batch is refused.
            popped = list(map(live.pop, offsets, repeat(None, n)))
            if popped.count(source) != n:
                for o, state in zip(offsets, popped, strict=True):
                    if state is not None:
                        live[o] = state
                self._reject(event, offsets)
            if n:  # an empty batch finished nothing: no commit is due
                self._unsent = True
            if self._failures:
                failures = self._failures
                for o in offsets:
                    failures.pop(o, None)
            if self._processed not in live:
                self._advance()
        else:
            if list(map(live.get, offsets)).count(source) != n or (
                self._draining and event in _FORBIDDEN_WHILE_DRAINING
            ):
                self._reject(event, offsets)
            moved = dict.fromkeys(offsets, target)
            if len(moved) != n:
                self._reject(event, offsets)
            live.update(moved)
            if event is Event.FAIL:
                failures = self._failures
                for o in offsets:
                    failures[o] = failures.get(o, 0) + 1

    def _reject(self, event: Event, offsets: Sequence[int]) -> None:
        source, _ = EDGES[event]
        if self._draining and event in _FORBIDDEN_WHILE_DRAINING:
            raise IllegalTransition(f"{event.value}: the partition is being revoked")
        seen: set[int] = set()
        for o in offsets:
            if o in seen:
                raise IllegalTransition(f"{event.value}: offset {o} appears twice in the batch")
            seen.add(o)
            state = self._live.get(o)
            if state is source:
                continue
            if state is not None:
                raise IllegalTransition(
                    f"{event.value}: offset {o} is {state.value}, needs {source.value}"
                )
            if o >= self._next:
                raise IllegalTransition(
                    f"{event.value}: offset {o} was never fetched (next is {self._next})"
                )
            raise IllegalTransition(f"{event.value}: offset {o} is already finished")
        raise AssertionError("unreachable: _reject found nothing to reject")  # pragma: no cover

    def _advance(self) -> None:
        live = self._live
        order = self._order
        if not live:
            order.clear()
            self._processed = self._next
            return
        # live is non-empty and every live offset is in order, so this stops.
        while order[0] not in live:
            order.popleft()
        self._processed = order[0]

    # -- commits ------------------------------------------------------------------------

    @capture_old(lambda self: (self._requested, self._unsent), name="before")
    @icontract.ensure(
        lambda self, result, OLD: (
            result is None
            and self._requested == OLD.before[0]
            and not OLD.before[1]
            and self._processed == OLD.before[0]
        )
        or (result == self._processed == self._requested and not self._unsent),
        "a commit request hands out the watermark whenever something new finished",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def commit_requested(self) -> int | None:
        """The offset to make durable now (the watermark), or ``None`` if nothing
        finished since the last request. Pair it with :meth:`finished_above`."""
        if self._processed > self._requested or self._unsent:
            self._requested = self._processed
            self._unsent = False
            return self._processed
        return None

    @capture_old(lambda self: self._committed, name="committed")
    @icontract.ensure(
        lambda self, offset, result, OLD: self._committed == max(OLD.committed, offset)
        and result == (offset > OLD.committed),
        "committed only grows, to the acked offset",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def commit_acked(self, offset: int) -> bool:
        """The broker or sink made ``offset`` durable. Returns False when the ack is
        late or duplicated (at or below ``committed``), which changes nothing.

        :raises IllegalTransition: ``offset`` is above the watermark.
        """
        if offset > self._processed:
            raise IllegalTransition(
                f"commit_acked: offset {offset} is above the watermark ({self._processed})"
            )
        if offset <= self._committed:
            return False
        self._committed = offset
        if self._requested < offset:
            self._requested = offset
        return True

    @icontract.ensure(
        lambda self: self._requested == self._committed and self._unsent,
        "a failed commit is requested again",
        enabled=ENABLED,
    )
    @_keeps_invariant()
    def commit_failed(self, offset: int) -> None:
        """A commit of ``offset`` failed; the next :meth:`commit_requested` asks again
        (also when ``offset`` was already durable: the failed commit may have carried
        a newer ``finished_above``)."""
        self._requested = self._committed
        self._unsent = True

    @_keeps_invariant()
    def begin_drain(self) -> None:
        """The partition is being revoked: nothing new is fetched or started;
        running messages may still finish and commits may still be made."""
        self._draining = True
