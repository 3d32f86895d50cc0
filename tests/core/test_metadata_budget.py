"""The commit-metadata budget (:mod:`htmqc.core.metadata_budget`): the growth and
window bounds checked exhaustively on small cases, and the key property: a
partition that hands out work only as :func:`admissible` allows never commits
metadata over the limit, whatever order its work finishes in."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from functools import cache
from itertools import combinations
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core.lifecycle import Event
from htmqc.core.metadata_budget import (
    DEFAULT_LIMIT,
    MIN_LIMIT,
    PREFIX_BYTES,
    admissible,
    encoded_size,
    fitting_prefix,
    item_max,
    window_max,
)
from htmqc.core.partition import PartitionTracker
from htmqc.core.position_text import decode_finished, encode_finished


def size(base: int, offsets: set[int]) -> int:
    return len(encode_finished(base, offsets))


def subsets(width: int) -> list[set[int]]:
    return [set(c) for n in range(width + 1) for c in combinations(range(width), n)]


@pytest.mark.parametrize("width", range(13))
def test_one_more_offset_grows_the_text_by_at_most_item_max_exhaustive(width: int) -> None:
    for s in subsets(width):
        for o in range(width):
            if o not in s:
                assert size(0, s | {o}) - size(0, s) <= item_max(o), (sorted(s), o)


def test_item_max_is_reached_at_every_distance_but_a_power_of_ten() -> None:
    # the bound is not loose: finishing the offset at distance d after a run that
    # ends at the watermark + 1 adds ",{d-1}" (and d 0 or 1 extends a run: +2);
    # only at d = 10, 100, ... has d - 1 a digit fewer than d
    for d in range(3000):
        before = {1} if d == 0 else {0}
        grown = size(0, before | {d}) - size(0, before)
        short = d >= 10 and str(d).rstrip("0") == "1"
        assert grown == item_max(d) - short, d


@given(
    st.sets(st.integers(0, 3000), max_size=60),
    st.integers(0, 3000),
    st.sampled_from([1, 9, 10, 99, 100, 999]),
)
def test_growth_bound_with_long_gaps_and_runs(s: set[int], o: int, run: int) -> None:
    # long runs and multi-digit gaps: "9:9" -> "8:10", "d" -> "d:2", gap digits
    s = s | set(range(1000, 1000 + run))
    if o not in s:
        assert size(0, s | {o}) - size(0, s) <= item_max(o)


@pytest.mark.parametrize("width", range(15))
def test_window_bound_exhaustive(width: int) -> None:
    assert max(size(0, s) for s in subsets(width)) <= window_max(width)


def test_window_max_is_a_whole_number_of_bytes_and_nothing_for_no_window() -> None:
    assert window_max(0) == 0  # an empty window holds no offset: the text is ""
    assert all(type(window_max(w)) is int for w in range(100))


@cache
def _best_ending(p: int) -> int:
    """The longest text of a set in [0, p) whose last run ends at p (exclusive)."""
    best = -1
    for length in range(1, p + 1):
        start = p - length
        run = len(str(length)) + 1 if length > 1 else 0
        best = max(best, len(str(start)) + run)  # the first item, gap from 0
        for gap in range(1, start + 1):
            before = _best_ending(start - gap)
            if before >= 0:
                best = max(best, before + 1 + len(str(gap)) + run)
    return best


@pytest.mark.parametrize("width", [20, 40, 60])
def test_window_bound_against_the_exact_maximum(width: int) -> None:
    exact = max([0] + [_best_ending(p) for p in range(1, width + 1)])
    assert exact <= window_max(width) <= exact + 2


@given(st.sets(st.integers(1, 400), max_size=80))
def test_finishing_the_watermark_offset_never_grows_the_text(s: set[int]) -> None:
    # the offset at the watermark (base 0) finishes: the new base is the next
    # unfinished offset, the set keeps what lies above it
    done = s | {0}
    new_base = next(o for o in range(len(done) + 2) if o not in done)
    assert size(new_base, {o for o in done if o >= new_base}) <= size(0, s)


# -- the key property: admission keeps every completion order within the limit ------------


def _hand_out(t: PartitionTracker, offsets: Sequence[int]) -> None:
    for o in t.fetched(offsets):
        t.apply(Event.START, o)


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, list[int], list[tuple[str, int]]]:
    limit = draw(st.integers(PREFIX_BYTES + 1, PREFIX_BYTES + 60))
    start = draw(st.integers(0, 2000))
    held = sorted(draw(st.sets(st.integers(start, start + 300), max_size=12)))
    while held and PREFIX_BYTES + size(start, set(held)) > limit:
        held.pop()
    steps = draw(
        st.lists(
            st.tuples(st.sampled_from(["fetch", "finish", "fail"]), st.integers(0, 10**6)),
            min_size=1,
            max_size=120,
        )
    )
    return limit, start, held, steps


@given(runs(), st.randoms(use_true_random=False))
def test_admitted_work_never_outgrows_the_limit(
    run: tuple[int, int, list[int], list[tuple[str, int]]], rnd: object
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    limit, start, held, steps = run
    t = PartitionTracker(start, held)
    assert encoded_size(t) <= limit
    throttled = 0
    for kind, n in steps:
        if kind == "fetch" and not t.draining:
            first = t.next + (n % 3 if n % 5 == 0 else 0)  # sometimes a gap
            batch: list[int] = []
            o = first
            for i in range(1 + n % 40):
                batch.append(o)
                o += 1 + (2 if (n >> i) % 11 == 0 else 0)
            k = admissible(t, batch, limit)
            throttled += k < len(batch)
            _hand_out(t, batch[:k])
        elif t.live_count:
            live = sorted(t.in_flight())
            o = live[n % len(live)]
            if kind == "fail":  # a failure finishes later (a retry or a dead letter)
                t.apply(Event.FAIL, o)
                t.apply(Event.DEAD_LETTER, o)
            else:
                t.apply(Event.SUCCEED, o)
        # a commit made now would carry this text
        assert encoded_size(t) <= limit, t.snapshot()


def _longest_texts(t: PartitionTracker, live: Sequence[int], batch: Sequence[int]) -> list[int]:
    """``out[k]``: the longest commit metadata (prefix included) reachable once
    ``batch[:k]`` is handed out: the text depends only on the set of finished
    offsets, so every set of ``live`` and ``batch[:k]`` is tried (every completion
    order passes through each). ``t`` has all of ``batch`` handed out already: the
    rest of it, unfinished and above, changes no text of those sets."""
    universe = [*live, *batch]
    out = [0] * (len(batch) + 1)
    for mask in range(1 << len(universe)):
        done = [o for i, o in enumerate(universe) if mask >> i & 1]
        after = copy.deepcopy(t)
        after.apply_many(Event.SUCCEED, done)
        k = max((i + 1 for i in range(len(batch)) if mask >> (len(live) + i) & 1), default=0)
        out[k] = max(out[k], encoded_size(after))
    for k in range(1, len(out)):
        out[k] = max(out[k], out[k - 1])
    return out


#: Offsets whose every item is as long as ``item_max`` says (a gap of ``g - 1``
#: digits as many as the highest offset's), and a jump across two decades.
FAMILIES = {
    "gap 2": [0, 2, 4, 6, 8],
    "gap 11": [0, 11, 22, 33, 44, 55, 66, 77, 88, 99],
    "gap 101": [0, 101, 202, 303, 404, 505, 606, 707, 808],
    "gap 1001": [0, 1001, 2002, 3003, 4004, 5005, 6006, 7007],
    "jump": [0, 5, 150, 151, 1500],
}


@pytest.mark.parametrize("start", [0, 1000])
@pytest.mark.parametrize(("live", "done"), [(0, 0), (1, 0), (2, 0), (3, 0), (1, 2), (1, 3)])
@pytest.mark.parametrize("family", FAMILIES)
def test_admission_is_sound_and_within_a_byte_of_the_truth(
    family: str, live: int, done: int, start: int
) -> None:
    """Against every set of finished offsets (not the bound itself): what is handed
    out can never give a text over the limit, and where each item really is as
    long as the bound says, no more than one byte of the limit is left unused
    (the first item has no comma): a bound loosened or tightened by an item, or
    computed for a lower offset than the batch's highest, or from the watermark's
    offset rather than the distance to it, fails here. ``live`` offsets are handed
    out before the batch and not finished, the ``done`` after them finished."""
    offsets = [start + o for o in FAMILIES[family]]
    before, batch = offsets[: live + done], offsets[live + done :]
    t = PartitionTracker(start)
    _hand_out(t, before)
    t.apply_many(Event.SUCCEED, before[live:])
    everything = copy.deepcopy(t)
    _hand_out(everything, batch)
    truth = _longest_texts(everything, before[:live], batch)
    for limit in range(max(PREFIX_BYTES + 1, truth[0]), truth[-1] + 4):  # the live fit
        k = admissible(t, batch, limit)
        assert truth[k] <= limit, (limit, k, truth)
        if family != "jump":  # its items are shorter than the bound: no tightness
            best = max(j for j in range(len(truth)) if j == 0 or truth[j] + 1 <= limit)
            assert k >= best, (limit, k, best, truth)


#: Held offsets (restored from the sink) of the window tests: one a first hand-out
#: covers, and one more in the gap before the batch (which starts at 10), at its
#: first offset, or above it.
HOLDS = {"none": [], "below": [2, 8], "first": [2, 10], "above": [2, 30]}


def _window_case(start: int, held: str, live: int) -> tuple[PartitionTracker, list[int]]:
    """Offsets ``start`` to ``start + live`` handed out (one of them finished or
    held, the rest live), then a batch of nine from ``start + 10``."""
    holds = [start + o for o in HOLDS[held]]
    t = PartitionTracker(start, holds)
    _hand_out(t, range(start, start + live + 1))
    if held == "none":
        t.apply(Event.SUCCEED, start + 2)
    return t, list(range(start + 10, start + 19))


@pytest.mark.parametrize("start", [0, 1000])
@pytest.mark.parametrize("held", HOLDS)
def test_what_the_window_bound_admits_is_sound(start: int, held: str) -> None:
    """Three live offsets and one finished (or held) below the batch: whatever the
    limit, no set of the live and admitted offsets finishing (every set is tried)
    gives a text over it, with the window bound in play or, for a held offset
    above the batch, out of it."""
    t, batch = _window_case(start, held, 3)
    everything = copy.deepcopy(t)
    _hand_out(everything, batch)
    holds = {start + o for o in HOLDS[held]}
    truth = _longest_texts(everything, sorted(t.in_flight()), [o for o in batch if o not in holds])
    if held == "first":  # the held one finishes no text of its own: count it as admitted
        truth = truth[:1] + truth
    for limit in range(max(PREFIX_BYTES + 1, truth[0]), truth[-1] + 4):
        k = admissible(t, batch, limit)
        assert truth[k] <= limit, (limit, k, truth)


@pytest.mark.parametrize("start", [0, 1000])
@pytest.mark.parametrize("held", ["none", "below", "first"])
def test_where_only_the_window_bound_fits_it_decides(start: int, held: str) -> None:
    """Six live offsets (and distances of two digits) make the per-offset bound the
    larger for every ``k``; then the batch is cut exactly where spec §4d's window
    bound, ``window_max(h + 1 - c)``, reaches the limit when no held offset lies
    above the batch's first (a held one in the gap before it, or at it, does not
    count)."""
    t, batch = _window_case(start, held, 6)
    assert t.live_count == 6
    c = t.processed
    for limit in range(PREFIX_BYTES + 1, PREFIX_BYTES + window_max(batch[-1] + 2 - c)):
        k = admissible(t, batch, limit)
        fits = [j for j in range(1, len(batch) + 1)
                if PREFIX_BYTES + window_max(batch[j - 1] + 1 - c) <= limit]  # fmt: skip
        assert k == max(fits, default=0), (limit, k, fits)


def test_a_long_batch_is_cut_where_its_prefixes_are() -> None:
    """A search over a long batch (an answer past the integers CPython caches) ends
    where handing out a prefix alone would: the first ``m`` offsets give
    ``min(m, k)``, since the bound only grows with ``k``."""
    t = PartitionTracker(0)
    _hand_out(t, range(600))
    t.apply_many(Event.SUCCEED, range(1, 600, 2))
    batch = range(600, 2600)
    limit = PREFIX_BYTES + window_max(1000)
    k = admissible(t, batch, limit)
    assert 256 < k < len(batch)
    for m in (1, k - 1, k, k + 1, len(batch)):
        assert admissible(t, batch[:m], limit) == min(m, k), m


def test_an_empty_batch_hands_out_nothing() -> None:
    assert admissible(PartitionTracker(0), [], 4096) == 0
    assert admissible(PartitionTracker(5), [], 4096, soft=4096) == 0


@st.composite
def jumpy_states(draw: st.DrawFn) -> tuple[PartitionTracker, list[int], list[int], int]:
    """A tracker with a few live offsets (some finished around them), a batch whose
    gaps cross decades, and how far above what the live work needs the limit is."""
    steps = st.sampled_from([1, 2, 3, 9, 10, 11, 90, 99, 100, 101, 990, 1000])
    start = draw(st.integers(0, 120))
    earlier = [start]
    for _ in range(draw(st.integers(0, 5))):
        earlier.append(earlier[-1] + draw(steps))
    t = PartitionTracker(start)
    _hand_out(t, earlier)
    done = draw(st.sets(st.sampled_from(earlier), max_size=len(earlier)))
    t.apply_many(Event.SUCCEED, sorted(done))
    live = sorted(t.in_flight())[:3]
    for o in sorted(set(t.in_flight()) - set(live)):
        t.apply(Event.SUCCEED, o)
    batch = [t.next + draw(st.sampled_from([0, 1, 9, 99]))]
    for _ in range(draw(st.integers(0, 5))):
        batch.append(batch[-1] + draw(steps))
    return t, live, batch, draw(st.integers(0, 24))


@given(jumpy_states())
def test_no_finishing_set_of_admitted_work_outgrows_the_limit(
    state: tuple[PartitionTracker, list[int], list[int], int],
) -> None:
    t, live, batch, extra = state
    everything = copy.deepcopy(t)
    _hand_out(everything, batch)
    truth = _longest_texts(everything, live, batch)
    limit = max(PREFIX_BYTES + 1, truth[0]) + extra  # the live work fits (as admitted)
    k = admissible(t, batch, limit)
    assert truth[k] <= limit, (k, truth, t.snapshot())


@given(st.integers(PREFIX_BYTES + 1, 200), st.integers(0, 10**6))
def test_a_partition_with_nothing_live_always_goes_on(limit: int, seed: int) -> None:
    t = PartitionTracker(seed % 1000, [seed % 1000 + 5 + i * 3 for i in range(seed % 7)])
    assert admissible(t, [t.next, t.next + 1], limit) >= 1


def test_the_limits_are_the_ones_the_spec_states() -> None:
    """spec/README.md §4d names Kafka's default ``offset.metadata.max.bytes`` and
    the smallest ``--commit-metadata-bytes``: the code's constants say the same.
    A default above the broker's lets the exactly-once Kafka sink hand out work
    whose commit the broker refuses."""
    spec = (Path(__file__).resolve().parents[2] / "spec" / "README.md").read_text()
    section = spec.split("## 4d.", 1)[1].split("\n## ", 1)[0]
    default = re.search(r"`offset\.metadata\.max\.bytes`, (\d+) by default", section)
    smallest = re.search(r"`--commit-metadata-bytes`, at least (\d+)", section)
    assert default and smallest, "spec/README.md §4d no longer states the limits"
    assert (int(default[1]), int(smallest[1])) == (DEFAULT_LIMIT, MIN_LIMIT)


def test_the_common_case_is_not_held_back_by_a_short_window() -> None:
    # everything in order, a window of 3000 offsets: no throttle (window bound)
    t = PartitionTracker(0)
    assert admissible(t, range(3000), 4096) == 3000
    _hand_out(t, range(3000))
    t.apply_many(Event.SUCCEED, range(1000))
    assert admissible(t, range(3000, 4000), 4096) == 1000


def test_fragmented_finished_set_throttles_until_the_live_work_finishes() -> None:
    t = PartitionTracker(0)
    _hand_out(t, range(6000))
    t.apply_many(Event.SUCCEED, range(1, 6000, 2))  # "1,1,1,...": 6000 bytes if all odd
    assert encoded_size(t) > 4096 // 2
    assert admissible(t, range(6000, 7000), 4096) == 0
    t.apply_many(Event.SUCCEED, range(0, 6000, 2))
    assert t.live_count == 0
    assert admissible(t, range(6000, 7000), 4096) == 1000


def test_soft_threshold_admits_everything_until_the_text_passes_it() -> None:
    t = PartitionTracker(0)
    _hand_out(t, range(5000))
    assert admissible(t, range(5000, 6000), 4096) < 1000  # the worst case is too long
    assert admissible(t, range(5000, 6000), 4096, soft=2048) == 1000  # the text is short
    t.apply_many(Event.SUCCEED, range(1, 5000, 2))  # 5000 bytes of text
    assert admissible(t, range(5000, 6000), 4096, soft=2048) == 0
    # "at most soft": the text's own length is still below it, one byte less is not
    text = encoded_size(t)
    assert admissible(t, range(5000, 6000), 4096, soft=text) == 1000
    assert admissible(t, range(5000, 6000), 4096, soft=text + 1) == 1000
    assert admissible(t, range(5000, 6000), 4096, soft=text - 1) == 0


@st.composite
def run_offsets(draw: st.DrawFn) -> set[int]:
    """Offsets in runs: (gap, length) pairs from 0, some of them below where
    ``committed`` will be, plus scattered ones; runs are what ``_runs`` finds."""
    out: set[int] = set()
    at = 0
    for gap, length in draw(st.lists(st.tuples(st.integers(0, 120), st.integers(1, 40)),
                                     max_size=30)):
        at += gap
        out.update(range(at, at + length))
        at += length
    return out | draw(st.sets(st.integers(0, 4000), max_size=60))


@given(st.integers(0, 1000), st.sets(st.integers(0, 4000), max_size=300) | run_offsets(),
       st.integers(0, 600))
def test_fitting_prefix_is_the_longest_prefix_of_runs_that_fits(
    committed: int, offsets: set[int], budget: int
) -> None:
    kept = fitting_prefix(committed, sorted(offsets), budget)
    text = encode_finished(committed, kept)
    whole = encode_finished(committed, offsets)
    assert len(text) <= budget
    assert decode_finished(committed, text) == kept
    items = whole.split(",") if whole else []
    kept_items = text.split(",") if text else []
    assert items[: len(kept_items)] == kept_items  # whole runs, each encoded as before
    if len(kept_items) < len(items):  # the next run would not have fitted
        assert len(",".join(items[: len(kept_items) + 1])) > budget


def test_fitting_prefix_keeps_or_drops_a_run_whole() -> None:
    # one run of five from committed: "0:5" is 3 bytes
    assert fitting_prefix(10, range(10, 15), 2) == ()
    assert fitting_prefix(10, range(10, 15), 3) == tuple(range(10, 15))
    # runs 12-13 and 20-22: "2:2,6:3"; the first alone is 3 bytes
    assert fitting_prefix(10, [12, 13, 20, 21, 22], 6) == (12, 13)
    assert fitting_prefix(10, [12, 13, 20, 21, 22], 7) == (12, 13, 20, 21, 22)
    # past the cached small integers (``is`` is not ``==`` there)
    assert fitting_prefix(1000, range(1000, 1005), 3) == tuple(range(1000, 1005))
