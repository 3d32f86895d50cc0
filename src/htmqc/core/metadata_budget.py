"""The commit-metadata budget: how much fetched work a partition may hand out
before the offsets finished out of order could outgrow the commit's metadata.

Problem
-------
Offsets finished above the watermark travel with every commit as text
(:mod:`htmqc.core.position_text`, ``"htmqc1:" + encode_finished(processed, S)``).
Kafka refuses offset-commit metadata longer than the broker's
``offset.metadata.max.bytes`` (4096 by default): the exactly-once Kafka sink
could then not store its transaction, and an at-least-once commit is rejected
(the position never moves). Handing out less work is the remedy: this module
says how many of a fetched batch's offsets may be handed out so that *no
completion order* of the unfinished work can make the text too long.

The bounds (``S`` the finished set, ``c`` the watermark, every offset of ``S``
at or above ``c``; ``digits(x)`` is ``len(str(x))``)
------------------------------------------------------------------------------
*Growth* (:func:`item_max`): adding one offset ``o`` (``o - c <= d``) to ``S``
lengthens ``encode_finished(c, S)`` by at most ``digits(max(1, d)) + 1`` bytes:

* ``o`` alone (neither neighbour in ``S``): a new item ``g`` (``g <= o - c``)
  and a comma; the next item's gap only shrinks, so its digits do not grow;
* ``o`` extends a run at its end: ``g`` becomes ``g:2`` (+2) or ``g:n`` becomes
  ``g:n+1`` (+1 at most); the next item's gap shrinks by one;
* ``o`` extends a run at its start: ``g`` becomes ``g-1:2`` (+2) or ``g:n``
  becomes ``g-1:n+1`` (+1 at most);
* ``o`` joins two runs: ``a:n,1:m`` (or ``a,1``...) becomes ``a:n+m+1``: it
  never grows (``digits(n+m+1) <= max(digits(n), digits(m)) + 1``, and at least
  ``,1`` goes).

Every case is at most ``max(2, digits(max(1, d)) + 1)`` which is
:func:`item_max`. The offset *at* the watermark is special: finishing it moves
the watermark, which drops the items below the new watermark and leaves the
others as they were (the first remaining gap is measured from the same run end,
or shrinks): the text never grows.

*Window* (:func:`window_max`): any set inside ``[c, c + w)`` encodes in at most
``4w // 3 + 1`` bytes: an item after the first costs a comma, its gap's digits
and, for a run, ``:`` and the length's digits, and covers ``gap + length``
offsets with ``gap >= 1``; that is at most 4/3 byte per covered offset (worst:
``1:2,``, 4 bytes for 3 offsets), the first item at most one byte more.

*Admission* (:func:`admissible`): with ``U`` live (unfinished) offsets, ``k``
newly handed-out ones and the highest of them ``h``, the text cannot outgrow
``size + max(0, U + k - 1) * item_max(h - c)`` (every unfinished offset but the
one at the watermark finishes and grows it by its bound; the watermark only
grows, so ``h - c`` bounds every later distance), nor, when the sink holds no
offset above ``h``, ``window_max(h + 1 - c)`` (everything that can be finished
lies in that window). A batch's leading offsets are handed out while either
bound is within the limit. The invariant "every completion order fits" holds
after each admission and each completion, so it holds always: the exactly-once
Kafka sink never meets metadata it cannot commit.

*Liveness*: when nothing is live, the first offset is always admitted (it is at
the watermark once fetched: finishing it never grows the text), so a partition
is never held back for ever; a held-back one goes on once its live work drains.

*Backstop* (:func:`fitting_prefix`): at-least-once may drop offsets from the
stored set (they run again after a restart); a commit whose text is too long
keeps the longest prefix of runs that fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import icontract

from htmqc.core.contracts import ENABLED
from htmqc.core.partition import PartitionTracker
from htmqc.core.position_text import METADATA_PREFIX, encode_finished

#: Kafka's default ``offset.metadata.max.bytes``.
DEFAULT_LIMIT = 4096
#: The smallest limit ``--commit-metadata-bytes`` takes: room for the prefix and
#: a few runs, so that a commit with a handful of offsets out of order still fits.
MIN_LIMIT = 64
#: The bytes every htmqc commit metadata spends before the offsets.
PREFIX_BYTES = len(METADATA_PREFIX)


@icontract.require(lambda distance: distance >= 0, enabled=ENABLED)
@icontract.ensure(lambda result: result >= 2, enabled=ENABLED)
def item_max(distance: int) -> int:
    """The most bytes one more finished offset, at most ``distance`` above the
    watermark, adds to the text (module docs, *Growth*)."""
    return len(str(max(1, distance))) + 1


@icontract.require(lambda width: width >= 0, enabled=ENABLED)
@icontract.ensure(lambda width, result: result >= width // 2, enabled=ENABLED)
def window_max(width: int) -> int:
    """The most bytes any set of offsets in a window of ``width`` offsets from the
    watermark encodes to (module docs, *Window*)."""
    return 4 * width // 3 + 1 if width else 0


def encoded_size(tracker: PartitionTracker) -> int:
    """Bytes of the commit metadata the tracker's state would be stored with now."""
    return PREFIX_BYTES + len(encode_finished(tracker.processed, tracker.finished_above()))


def _worst(tracker: PartitionTracker, size: int, offsets: Sequence[int], k: int) -> int:
    """The bound on the text after handing out ``offsets[:k]``, ``k >= 1`` (module
    docs, *Admission*); ``size``: the text's length now (or a bound of it).
    Non-decreasing in ``k``: the window bound counts only when no held offset
    lies above the batch's first (else it would apply to some ``k`` and not to
    smaller ones)."""
    c = tracker.processed
    high = offsets[k - 1]
    per = size + max(0, tracker.live_count + k - 1) * item_max(high - c)
    held = tracker.highest_held()
    if held is None or held <= offsets[0]:
        return min(per, PREFIX_BYTES + window_max(high + 1 - c))
    return per


def _fits_after(tracker: PartitionTracker, offsets: Sequence[int], limit: int, k: int) -> bool:
    return k == 0 or _worst(tracker, encoded_size(tracker), offsets, k) <= limit


@icontract.require(lambda limit: limit > PREFIX_BYTES, enabled=ENABLED)
@icontract.require(
    lambda tracker, offsets: all(o >= tracker.next for o in offsets[:1]),
    "the batch starts at or after the tracker's next",
    enabled=ENABLED,
)
@icontract.require(
    lambda offsets: all(a < b for a, b in pairwise(offsets)),
    "the batch's offsets are strictly increasing (as a fetch's are)",
    enabled=ENABLED,
)
@icontract.ensure(lambda offsets, result: 0 <= result <= len(offsets), enabled=ENABLED)
@icontract.ensure(
    lambda tracker, offsets, result: result >= 1 or tracker.live_count > 0 or not offsets,
    "liveness: with nothing live the offset at the watermark is always handed out",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda tracker, offsets, limit, soft, result: (
        soft is not None
        or (result <= 1 and tracker.live_count == 0)
        or _fits_after(tracker, offsets, limit, result)
    ),
    "every completion order of the admitted and live offsets fits the limit",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda tracker, offsets, limit, soft, result: (
        result == len(offsets) or not _fits_after(tracker, offsets, limit, result + 1)
    ),
    "the longest prefix that fits is admitted",
    enabled=ENABLED,
)
def admissible(
    tracker: PartitionTracker, offsets: Sequence[int], limit: int, soft: int | None = None
) -> int:
    """How many of a fetched batch's leading ``offsets`` (increasing, from
    ``tracker.next`` on) may be handed out so that, whatever order the live and
    admitted offsets finish in, the commit metadata stays within ``limit`` bytes
    (module docs, *Admission*). With nothing live, at least one.

    ``soft`` (at-least-once, where too long a text is not fatal): admit the whole
    batch while the text now is at most ``soft`` bytes; above it, the rule.

    Cheap in the common case: the window bound and an upper bound of the current
    text (``finished_count * item_max``) are O(1); only when both are too coarse
    is the text encoded (O(finished offsets))."""
    n = len(offsets)
    if not n:
        return 0
    c = tracker.processed
    held = tracker.highest_held()
    top = max(offsets[-1], held if held is not None else c)
    # An upper bound of the text now: every finished offset grew it by its bound.
    rough = PREFIX_BYTES + tracker.finished_count * item_max(max(0, top - c))
    if soft is not None and rough <= soft:
        return n
    if _worst(tracker, rough, offsets, n) <= limit:
        return n
    size = encoded_size(tracker)
    if soft is not None and size <= soft:
        return n
    lo, hi = 0, n  # fits(lo) is true (k = 0 hands out nothing); find the largest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _worst(tracker, size, offsets, mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0 and tracker.live_count == 0:
        return 1
    return lo


def _runs(committed: int, offsets: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for off in sorted({o for o in offsets if o >= committed}):
        if runs and off == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((off, 1))
    return runs


@icontract.require(lambda budget: budget >= 0, enabled=ENABLED)
@icontract.ensure(
    lambda committed, budget, result: len(encode_finished(committed, result)) <= budget,
    "the prefix fits",
    enabled=ENABLED,
)
@icontract.ensure(
    lambda committed, offsets, result: (
        result == tuple(sorted({o for o in offsets if o >= committed}))[: len(result)]
    ),
    "the lowest offsets, in order",
    enabled=ENABLED,
)
def fitting_prefix(committed: int, offsets: Sequence[int], budget: int) -> tuple[int, ...]:
    """The offsets of the longest prefix of runs of ``offsets`` (those at or above
    ``committed``) whose text (:func:`~htmqc.core.position_text.encode_finished`)
    is at most ``budget`` bytes: the items kept encode exactly as before, so the
    text is a prefix of the whole one. At-least-once's backstop (module docs)."""
    out: list[int] = []
    used = 0
    prev = committed
    for start, length in _runs(committed, offsets):
        gap = start - prev
        item = len(str(gap)) + (len(str(length)) + 1 if length > 1 else 0) + (1 if out else 0)
        if used + item > budget:
            break
        used += item
        out.extend(range(start, start + length))
        prev = start + length
    return tuple(out)
