"""Edge cases of the offset tracker and the consumer core, one by one."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from htmqc.core import (
    Commit,
    ConsumerCore,
    DeadLetter,
    DeadLetterKind,
    Event,
    FailureKind,
    IllegalTransition,
    MessageState,
    NotAssigned,
    OffsetOrderError,
    PartitionTracker,
    RetryAt,
    RetryPolicy,
    RetryTopic,
)

TP = ("orders", 3)


def running(core: ConsumerCore, epoch: int, offsets: list[int], end: int | None = None) -> None:
    core.started_many(TP, epoch, list(core.fetched(TP, epoch, offsets, end)))


@pytest.fixture
def core() -> ConsumerCore:
    return ConsumerCore(RetryPolicy(max_retries=2, base_delay=1.0, max_delay=8.0))


# -- gaps ------------------------------------------------------------------------------------


def test_gaps_inside_a_fetched_range_count_as_finished(core: ConsumerCore) -> None:
    e = core.assign(TP, 10)
    running(core, e, [10, 13, 17], end=20)  # 11, 12, 14-16, 18, 19 are gaps
    core.succeeded(TP, e, 10)
    assert core.tracker(TP).processed == 13
    core.succeeded_many(TP, e, [13, 17])
    assert core.tracker(TP).processed == core.tracker(TP).next == 20


def test_a_batch_starting_above_next_leaves_a_gap(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [5])
    assert core.tracker(TP).processed == 5
    core.succeeded(TP, e, 5)
    assert core.commit_requested(TP) == Commit(tp=TP, epoch=e, offset=6)


def test_a_range_of_only_gaps_moves_the_watermark(core: ConsumerCore) -> None:
    e = core.assign(TP, 7)
    assert list(core.fetched(TP, e, [], end=12)) == []
    t = core.tracker(TP)
    assert (t.processed, t.next) == (12, 12)


def test_an_empty_batch_without_end_changes_nothing(core: ConsumerCore) -> None:
    e = core.assign(TP, 7)
    assert list(core.fetched(TP, e, [])) == []
    assert core.tracker(TP).next == 7


# -- order errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offsets", "end", "message"),
    [
        ([3, 4], None, "below next"),
        ([6, 6], None, "strictly increasing"),
        ([7, 6], None, "strictly increasing"),
        (range(9, 5, -1), None, "strictly increasing"),  # a range need not count up
        (range(9, 5, -2), None, "strictly increasing"),
        # as many offsets as the span holds, yet not consecutive: the consecutive-batch
        # shortcut must compare them all, not the ends
        ([5, 7, 6, 8], None, "strictly increasing"),
        ([5, 5, 7], None, "strictly increasing"),
        ([6, 8], 8, "not above the last offset"),
        ([], 4, "below next"),
    ],
)
def test_out_of_order_fetches_are_rejected_and_change_nothing(
    core: ConsumerCore, offsets: Sequence[int], end: int | None, message: str
) -> None:
    e = core.assign(TP, 5)
    before = core.snapshot()
    with pytest.raises(OffsetOrderError, match=message):
        core.fetched(TP, e, offsets, end)
    assert core.snapshot() == before


def test_negative_start_is_rejected() -> None:
    with pytest.raises(OffsetOrderError):
        PartitionTracker(-1)
    with pytest.raises(OffsetOrderError):
        ConsumerCore().assign(TP, -1)


# -- illegal completions ---------------------------------------------------------------------


def test_completing_twice_is_illegal(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1])
    core.succeeded(TP, e, 1)
    with pytest.raises(IllegalTransition, match="offset 1 is already finished"):
        core.succeeded(TP, e, 1)


@pytest.mark.parametrize("offset", [9, 1])  # 1: next itself
def test_completing_an_offset_never_fetched_is_illegal(core: ConsumerCore, offset: int) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0])
    with pytest.raises(IllegalTransition, match=r"never fetched \(next is 1\)"):
        core.succeeded(TP, e, offset)


def test_starting_twice_names_the_offset_not_a_revoke(core: ConsumerCore) -> None:
    """The revoke message is for a draining partition only: a second start of a running
    offset says what state the offset is in."""
    e = core.assign(TP, 0)
    running(core, e, [0])
    with pytest.raises(IllegalTransition, match="offset 0 is Processing, needs Pending"):
        core.started(TP, e, 0)


def test_completing_a_pending_offset_is_illegal(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    core.fetched(TP, e, [0])
    with pytest.raises(IllegalTransition, match="is Pending, needs Processing"):
        core.succeeded(TP, e, 0)


def test_batches_are_all_or_nothing(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1, 2])
    before = core.snapshot()
    with pytest.raises(IllegalTransition):
        core.succeeded_many(TP, e, [0, 1, 7])
    with pytest.raises(IllegalTransition, match="appears twice"):
        core.succeeded_many(TP, e, [0, 0])
    assert core.snapshot() == before


# -- commits and acks ------------------------------------------------------------------------


def test_commit_hands_out_the_watermark_once(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1, 2, 3])
    core.succeeded_many(TP, e, [0, 1, 3])
    commit = core.commit_requested(TP)
    assert commit == Commit(tp=TP, epoch=e, offset=2, finished_above=(3,))
    assert core.commit_requested(TP) is None


def test_commit_decisions_compare_offsets_by_value_not_identity() -> None:
    """Offsets above 256 are distinct ``int`` objects even when equal (CPython caches
    only small ones): after gaps moved the watermark and an ack made exactly it durable,
    nothing is left to request (found by a surviving
    mutant, ``>`` made ``is not``, which small offsets cannot tell apart)."""
    base = 10**12
    t = PartitionTracker(base)
    t.apply_many(Event.START, t.fetched([base], base + 1))
    t.apply_many(Event.SUCCEED, [base])
    assert t.commit_requested() == base + 1
    t.apply_many(Event.START, t.fetched([base + 5], base + 6))  # base+1..base+4: gaps
    assert t.processed == base + 5
    assert t.commit_acked(int(str(base + 5))) is True  # equal, another object
    assert t.commit_requested() is None


def test_acks_late_twice_or_out_of_order_never_move_committed_back(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1, 2, 3])
    core.succeeded_many(TP, e, [0, 1])
    first = core.commit_requested(TP)
    core.succeeded_many(TP, e, [2, 3])
    second = core.commit_requested(TP)
    assert first and second
    assert core.commit_acked(TP, e, second.offset) is True
    assert core.commit_acked(TP, e, first.offset) is False  # overtaken
    assert core.commit_acked(TP, e, second.offset) is False  # duplicate
    assert core.tracker(TP).committed == 4


def test_an_ack_above_the_watermark_is_illegal(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1])
    with pytest.raises(IllegalTransition, match="above the watermark"):
        core.commit_acked(TP, e, 2)


def test_a_failed_commit_is_requested_again(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0])
    core.succeeded(TP, e, 0)
    commit = core.commit_requested(TP)
    assert commit and core.commit_requested(TP) is None
    core.commit_failed(TP, e, commit.offset)
    again = core.commit_requested(TP)
    assert again is not None and again.offset == commit.offset


def test_acks_for_a_revoked_partition_are_ignored(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1])
    core.succeeded(TP, e, 0)
    final = core.revoked(TP)
    assert final == Commit(tp=TP, epoch=e, offset=1)
    assert core.commit_acked(TP, e, 1) is False
    e2 = core.assign(TP, 0)
    assert e2 != e
    assert core.commit_acked(TP, e, 1) is False  # the old epoch stays stale
    assert core.tracker(TP).committed == 0
    assert core.succeeded(TP, e, 1) is False  # a worker that outlived its assignment


def test_events_for_a_partition_never_assigned_are_late_not_errors(core: ConsumerCore) -> None:
    assert core.succeeded(TP, 1, 0) is False
    assert list(core.fetched(TP, 1, [0])) == []
    assert core.commit_requested(TP) is None
    with pytest.raises(NotAssigned):
        core.tracker(TP)


def test_assigning_twice_is_illegal(core: ConsumerCore) -> None:
    core.assign(TP, 0)
    with pytest.raises(IllegalTransition, match="already assigned"):
        core.assign(TP, 0)


# -- revoke, crash, restore ------------------------------------------------------------------


def test_draining_stops_new_work_but_lets_running_work_finish(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    core.fetched(TP, e, [0, 1])
    core.started(TP, e, 0)
    core.revoking(TP)
    with pytest.raises(IllegalTransition, match="being revoked"):
        core.started(TP, e, 1)
    with pytest.raises(IllegalTransition, match="being revoked"):
        core.fetched(TP, e, [2])
    assert core.succeeded(TP, e, 0) is True
    assert core.revoked(TP) == Commit(tp=TP, epoch=e, offset=1)


def test_restore_after_crash_skips_offsets_the_sink_already_holds(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0, 1, 2, 3])
    core.succeeded_many(TP, e, [1, 3])
    commit = core.commit_requested(TP)
    assert commit == Commit(tp=TP, epoch=e, offset=0, finished_above=(1, 3))
    core.crashed()
    assert core.snapshot() == {}
    e2 = core.restored(TP, commit.offset, commit.finished_above)
    assert list(core.fetched(TP, e2, [0, 1, 2, 3])) == [0, 2]
    core.started_many(TP, e2, [0])
    core.succeeded(TP, e2, 0)
    # 1 is carried forward: a second crash must not re-run it either.
    assert core.commit_requested(TP) == Commit(tp=TP, epoch=e2, offset=2, finished_above=(3,))


def test_finished_above_must_not_lie_below_the_start() -> None:
    with pytest.raises(OffsetOrderError, match="below start 5"):
        PartitionTracker(5, finished_above=[4, 6])


def test_a_commit_whose_watermark_the_sink_holds_can_be_restored(core: ConsumerCore) -> None:
    # Found by the stateful test: restored with 1 held, the fetch ends right
    # below it and 0 finishes, so the commit is (1, (1,)). Restoring from it was
    # refused ("finished_above offsets must be above start"): a crash loop.
    e = core.assign(TP, 0, finished_above=[1])
    running(core, e, [0])
    core.succeeded(TP, e, 0)
    commit = core.commit_requested(TP)
    assert commit == Commit(tp=TP, epoch=e, offset=1, finished_above=(1,))
    core.crashed()
    e2 = core.restored(TP, commit.offset, commit.finished_above)
    assert list(core.fetched(TP, e2, [1, 2])) == [2]  # 1 does not run again
    assert core.tracker(TP).processed == 2


def test_an_empty_finishing_batch_makes_no_commit_due(core: ConsumerCore) -> None:
    # Found by the stateful test: an empty succeeded_many made the core hand out
    # a commit of the same watermark; nothing had finished.
    e = core.assign(TP, 0)
    running(core, e, [0, 1])
    core.succeeded(TP, e, 0)
    assert core.commit_requested(TP) is not None
    core.succeeded_many(TP, e, [])
    core.dead_lettered_many(TP, e, [])
    assert core.commit_requested(TP) is None


# -- failures and retries --------------------------------------------------------------------


def test_failures_retry_with_capped_backoff_then_dead_letter(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0])
    first = core.failed(TP, e, 0, FailureKind.UNKNOWN, now=100.0, jitter=1.0)
    assert first == RetryAt(tp=TP, epoch=e, offset=0, attempt=1, at=101.0)
    assert core.tracker(TP).state_of(0) is MessageState.RETRYING
    core.retry_due(TP, e, 0)
    second = core.failed(TP, e, 0, FailureKind.RETRYABLE, now=200.0, jitter=1.0)
    assert isinstance(second, RetryAt) and second.at == 202.0
    core.retry_due(TP, e, 0)
    third = core.failed(TP, e, 0, FailureKind.UNKNOWN, now=300.0, jitter=0.5)
    assert third == DeadLetter(tp=TP, epoch=e, offset=0, attempts=3, kind=DeadLetterKind.FAILED)
    assert core.tracker(TP).processed == 0  # Failed still holds the watermark
    core.dead_lettered(TP, e, 0)
    assert core.tracker(TP).processed == 1


def test_permanent_failures_dead_letter_at_once(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0])
    decision = core.failed(TP, e, 0, FailureKind.PERMANENT, now=0.0, jitter=0.0)
    permanent = DeadLetterKind.PERMANENT
    assert decision == DeadLetter(tp=TP, epoch=e, offset=0, attempts=1, kind=permanent)


def test_a_retrying_message_cannot_succeed_before_it_runs_again(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    running(core, e, [0])
    core.failed(TP, e, 0, FailureKind.UNKNOWN, now=0.0, jitter=0.0)
    with pytest.raises(IllegalTransition, match="is Retrying, needs Processing"):
        core.succeeded(TP, e, 0)


# -- memory ----------------------------------------------------------------------------------


def test_memory_is_bounded_by_the_window() -> None:
    t = PartitionTracker(0)
    for start in range(0, 5000, 500):
        offsets = list(range(start, start + 500))
        t.fetched(offsets)
        t.apply_many(Event.START, offsets)
        t.apply_many(Event.SUCCEED, offsets[::-1])
        assert len(t._order) == 0 and len(t._live) == 0
    assert t.processed == t.next == 5000


def test_an_empty_poll_while_draining_is_no_event(core: ConsumerCore) -> None:
    e = core.assign(TP, 0)
    core.revoking(TP)
    assert list(core.fetched(TP, e, [])) == []
    with pytest.raises(IllegalTransition, match="being revoked"):
        core.fetched(TP, e, [], end=3)


def test_offsets_held_by_the_sink_stay_in_every_commit_until_fetched(core: ConsumerCore) -> None:
    # TLC's counterexample (model small_eos_forget_skip): restored with 2 held by
    # the sink, 0 finishes before 2 is fetched again; the commit must still carry 2,
    # or a sink that replaces its stored set forgets it and 2 runs twice.
    e = core.assign(TP, 0, finished_above=[2])
    running(core, e, [0], end=1)
    core.succeeded(TP, e, 0)
    assert core.commit_requested(TP) == Commit(tp=TP, epoch=e, offset=1, finished_above=(2,))


def test_finished_means_below_next_and_no_longer_live(core: ConsumerCore) -> None:
    """``is_finished``: covered by a fetch (below ``next``, gaps included) and not
    live; ``next`` itself and everything above it is not finished."""
    e = core.assign(TP, 0)
    running(core, e, [0, 1, 3], end=5)
    core.succeeded(TP, e, 1)
    t = core.tracker(TP)
    assert t.next == 5
    assert [o for o in range(8) if t.is_finished(o)] == [1, 2, 4]


def test_partitions_lists_each_held_partition_with_its_epoch_and_tracker() -> None:
    """What the stateful invariants iterate: an empty listing would make them vacuous."""
    core = ConsumerCore()
    first, second = core.assign(("t", 0), 3), core.assign(("t", 1), 0)
    listed = {tp: (epoch, tracker.next) for tp, epoch, tracker in core.partitions()}
    assert listed == {("t", 0): (first, 3), ("t", 1): (second, 0)}
    core.revoked(("t", 0))
    assert [tp for tp, _, _ in core.partitions()] == [("t", 1)]


def test_the_api_takes_its_options_by_keyword() -> None:
    """``retry`` and ``retry_topic`` of the core, and ``held_for`` of ``failed``, are
    keyword arguments, as the runtime and the docs pass them."""
    core = ConsumerCore(retry=RetryPolicy(max_retries=0),
                        retry_topic=RetryTopic(name="t.retry", min_delay=1e9))  # fmt: skip
    e = core.assign(TP, 0)
    running(core, e, [0])
    decision = core.failed(TP, e, 0, FailureKind.RETRYABLE, 0.0, 0.5, held_for=None)
    assert isinstance(decision, DeadLetter)
    # Keyword only: a slip of one position cannot pass a time as held_for.
    with pytest.raises(TypeError):
        core.failed(TP, e, 0, FailureKind.RETRYABLE, 0.0, 0.5, None)  # type: ignore[misc]
    # ... and the rest may be named.
    named = ConsumerCore(retry=RetryPolicy(max_retries=0))
    e = named.assign(TP, 0)
    running(named, e, [0])
    assert named.failed(tp=TP, epoch=e, offset=0, failure=FailureKind.RETRYABLE,
                        now=0.0, jitter=0.5) is not None  # fmt: skip
