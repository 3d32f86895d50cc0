"""``htmqc-kafka``'s offsets without Spark or a broker: where a query goes on
from, and that every skipped offset is reported as a loss (no silent loss),
compared with a direct statement of what was due and what is still there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from htmqc.spark.kafka_offsets import (
    LossNote,
    Snapshot,
    SourceOffset,
    continue_from,
    ends,
    initial_positions,
    notes_due,
)
from htmqc.spark.kafka_options import EARLIEST, LATEST, Offsets

TOPICS = ("a", "b")
partitions = st.tuples(st.sampled_from(TOPICS), st.integers(0, 3))


@st.composite
def marks(draw: st.DrawFn) -> tuple[int, int]:
    low = draw(st.integers(0, 50))
    return low, low + draw(st.integers(0, 50))


@st.composite
def histories(draw: st.DrawFn) -> tuple[SourceOffset, Snapshot]:
    """A checkpoint and the partitions now: same or changed topic ids, partitions
    kept, gone or added, offsets inside, below or past what is there now."""
    before = draw(st.dictionaries(partitions, st.integers(0, 120), max_size=6))
    now = draw(st.dictionaries(partitions, marks(), max_size=6))
    ids_before = {t: draw(st.sampled_from(["id1", "id2"])) for t, _ in before}
    ids_now = {t: draw(st.sampled_from(["id1", "id2"])) for t, _ in now}
    return SourceOffset(before, ids_before), Snapshot(now, ids_now)


def due_but_gone(previous: SourceOffset, now: Snapshot) -> set[tuple[str, int]]:
    """The partitions of which the query would skip something, stated directly."""
    out: set[tuple[str, int]] = set()
    topics_before = {t for t, _ in previous.next}
    for (topic, part), offset in previous.next.items():
        here = now.partitions.get((topic, part))
        if (
            previous.topic_ids.get(topic) != now.topic_ids.get(topic)
            or here is None
            or not here[0] <= offset <= here[1]
        ):
            out.add((topic, part))
    for (topic, part), (low, _) in now.partitions.items():
        if topic in topics_before and (topic, part) not in previous.next and low > 0:
            out.add((topic, part))  # a partition added after the query began, already trimmed
    return out


@given(histories())
def test_a_restart_skips_nothing_unless_it_reports_a_loss(
    history: tuple[SourceOffset, Snapshot],
) -> None:
    previous, now = history
    start, losses = continue_from(previous, now)
    assert set(start) == set(now.partitions)
    for tp, (low, high) in now.partitions.items():
        assert low <= start[tp] <= high
    gone = due_but_gone(previous, now)
    assert bool(losses) == bool(gone)
    reported = {(loss.topic, loss.partition) for loss in losses}
    for topic, part in gone:  # each one named, alone or by its recreated topic
        assert (topic, part) in reported or (topic, -1) in reported
    for tp, offset in previous.next.items():
        if tp not in gone:
            assert start.get(tp, offset) == offset  # goes on exactly where it stopped


@given(histories())
def test_skipped_offsets_are_counted(history: tuple[SourceOffset, Snapshot]) -> None:
    previous, now = history
    _, losses = continue_from(previous, now)
    deleted = {
        tp: now.partitions[tp][0] - offset
        for tp, offset in previous.next.items()
        if tp in now.partitions
        and previous.topic_ids.get(tp[0]) == now.topic_ids.get(tp[0])
        and offset < now.partitions[tp][0]
    }
    assert sum(loss.skipped or 0 for loss in losses if loss.kind == "deleted") == sum(
        deleted.values()
    )
    counted = previous.with_losses(losses)
    assert counted.loss_events == len(losses)
    assert SourceOffset.from_json(counted.to_json()) == counted


def test_a_recreated_topic_is_read_from_its_start_and_reported() -> None:
    previous = SourceOffset({("a", 0): 300, ("a", 1): 280}, {"a": "old"})
    now = Snapshot({("a", 0): (0, 150), ("a", 1): (0, 140)}, {"a": "new"})
    start, losses = continue_from(previous, now)
    assert start == {("a", 0): 0, ("a", 1): 0}
    assert [loss.line() for loss in losses] == [
        "a recreated: topic id old is now new; what the old topic held after the checkpoint is gone"
    ]


@given(
    st.dictionaries(partitions, st.tuples(st.integers(0, 100), st.integers(0, 100)), max_size=6),
    st.none() | st.integers(1, 150),
)
def test_ends_respect_the_limit_and_always_move(
    ranges: dict[tuple[str, int], tuple[int, int]], limit: int | None
) -> None:
    start = {tp: a for tp, (a, _) in ranges.items()}
    highs = {tp: a + b for tp, (a, b) in ranges.items()}
    end = ends(start, highs, limit)
    backlog = sum(highs[tp] - start[tp] for tp in start)
    taken = sum(end[tp] - start[tp] for tp in start)
    for tp in start:
        assert start[tp] <= end[tp] <= highs[tp]
    if limit is None or backlog <= limit:
        assert end == highs
    else:
        # Spark's rule: a share below one offset rounds up to one per partition.
        assert taken <= limit + len(start)
        assert taken > 0


def test_starting_offsets_outside_the_partition_are_losses() -> None:
    now = Snapshot({("a", 0): (10, 20), ("a", 1): (0, 5), ("a", 2): (0, 9)})
    wanted = Offsets("specific", {("a", 0): 4, ("a", 1): 7, ("a", 2): EARLIEST})
    start, losses = initial_positions(wanted, now)
    assert start == {("a", 0): 10, ("a", 1): 5, ("a", 2): 0}
    assert [(loss.partition, loss.kind, loss.skipped) for loss in losses] == [
        (0, "deleted", 6),
        (1, "backwards", None),
    ]
    assert initial_positions(Offsets("specific", {("a", 0): LATEST}), Snapshot({("a", 0): (1, 9)}))[
        0
    ] == {("a", 0): 9}


def test_old_checkpoints_are_read() -> None:
    """The first htmqc-kafka kept ``{"topic/partition": next}``."""
    assert SourceOffset.from_json({"a/0": 5, "b.c/1": 7}).next == {("a", 0): 5, ("b.c", 1): 7}


# -- loss notes: read-time deletions counted once ------------------------------------


def _note_losses(
    previous: SourceOffset, notes: dict[tuple[str, int], LossNote]
) -> tuple[list[int], dict[tuple[str, int], int]]:
    losses, counted = notes_due(previous, notes)
    return [loss.skipped or 0 for loss in losses], counted


def test_a_note_of_the_batch_just_read_is_counted_once() -> None:
    note = {("a", 0): LossNote(200, 100, 30)}
    first = SourceOffset({("a", 0): 200, ("a", 1): 50}, notes="g")
    assert _note_losses(first, note) == ([30], {("a", 0): 200})
    # The partition did not move on: the next planning starts at the same end.
    stalled = SourceOffset({("a", 0): 200, ("a", 1): 60}, notes="g", counted={("a", 0): 200})
    assert _note_losses(stalled, note) == ([], {("a", 0): 200})
    # It moved on: the old note no longer matches, and the listing is dropped.
    moved = SourceOffset({("a", 0): 260, ("a", 1): 60}, notes="g", counted={("a", 0): 200})
    assert _note_losses(moved, note) == ([], {})


def test_a_note_at_another_end_is_not_this_batchs() -> None:
    previous = SourceOffset({("a", 0): 200}, notes="g")
    assert _note_losses(previous, {("a", 0): LossNote(150, 100, 10)}) == ([], {})
    assert _note_losses(previous, {("b", 0): LossNote(200, 100, 10)}) == ([], {})


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.integers(1, 9)), min_size=1, max_size=12
    )
)
def test_each_note_is_counted_exactly_once_however_batches_go(
    steps: list[tuple[int, bool, int]],
) -> None:
    """Batches of one partition: each moves on by ``advance`` (0: an empty batch)
    and its reader leaves a note (skipping ``n``) or not; the next planning
    counts what is due, the source's commit removes the counted notes or fails
    to. Every note is counted exactly once."""
    position, offset = 0, SourceOffset({("a", 0): 0}, notes="g")
    store: dict[tuple[str, int], LossNote] = {}
    written = counted_total = 0
    for advance, noted, n in steps:
        start, position = position, position + advance
        if advance and noted:  # only a batch that read something leaves a note
            store[("a", 0)] = LossNote(position, start, n)
            written += n
        offset = SourceOffset({("a", 0): position}, notes="g", counted=offset.counted)
        losses, counted = notes_due(offset, store)
        counted_total += sum(loss.skipped or 0 for loss in losses)
        offset = SourceOffset({("a", 0): position}, notes="g", counted=counted)
        if n % 2:  # the commit's removal worked (or not)
            for tp, end in counted.items():
                if tp in store and store[tp].end == end:
                    del store[tp]
    assert counted_total == written


def test_notes_and_what_was_counted_survive_the_checkpoint() -> None:
    offset = SourceOffset({("a", 0): 5}, notes="g", counted={("a", 0): 5})
    assert SourceOffset.from_json(offset.to_json()) == offset
