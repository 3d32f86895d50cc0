"""The transition table: its shape, and that the tracker follows it edge for edge."""

from __future__ import annotations

import re

import pytest

from htmqc.core import FINISHED, TRANSITIONS, Event, IllegalTransition, MessageState, lifecycle
from htmqc.core.lifecycle import INITIAL, step
from htmqc.core.partition import PartitionTracker
from tests.core.tables import row_edit, shortest_paths, with_entry, without


def test_the_table_is_the_documented_lifecycle() -> None:
    S, E = MessageState, Event
    assert {(s, e, t) for s, row in TRANSITIONS.items() for e, t in row.items()} == {
        (S.PENDING, E.START, S.PROCESSING),
        (S.PROCESSING, E.SUCCEED, S.SUCCEEDED),
        (S.PROCESSING, E.FAIL, S.FAILED),
        (S.FAILED, E.SCHEDULE_RETRY, S.RETRYING),
        (S.RETRYING, E.RETRY_DUE, S.PROCESSING),
        (S.FAILED, E.DEAD_LETTER, S.DEAD_LETTERED),
        (S.FAILED, E.HAND_OFF, S.HANDED_OFF),
    }
    assert INITIAL is S.PENDING


def test_finished_states_are_exactly_the_terminal_ones() -> None:
    terminal = {s for s, row in TRANSITIONS.items() if not row}
    assert terminal == FINISHED


def test_every_state_is_reachable_from_pending() -> None:
    seen, frontier = {INITIAL}, [INITIAL]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(MessageState)


def test_illegal_steps_raise_key_error() -> None:
    with pytest.raises(KeyError):
        step(MessageState.SUCCEEDED, Event.START)


@pytest.mark.parametrize("source", list(MessageState))
@pytest.mark.parametrize("event", list(Event))
def test_the_tracker_allows_exactly_the_tables_edges(source: MessageState, event: Event) -> None:
    t = PartitionTracker(0)
    t.fetched([0, 1])  # 1 keeps the watermark from passing 0 once it finishes
    for e in shortest_paths(TRANSITIONS, INITIAL)[source]:
        t.apply(e, 0)
    before = t.snapshot()
    if event in TRANSITIONS[source]:
        target = t.apply(event, 0)
        assert target is TRANSITIONS[source][event]
        assert t.state_of(0) is (None if target in FINISHED else target)
        assert t.is_finished(0) == (target in FINISHED)
    else:
        with pytest.raises(IllegalTransition):
            t.apply(event, 0)
        assert t.snapshot() == before


# -- the import-time table guard (``EDGES`` is derived from the table) ----------------

S, E = MessageState, Event
#: Each way to break the lifecycle table, and what the guard says of it.
LIFECYCLE_BREAKS = {
    "an event from two states": (
        row_edit(TRANSITIONS, S.RETRYING, lambda row: with_entry(row, E.START, S.PROCESSING)),
        f"event {E.START.value} has two source states",
    ),
    "an event with no edge": (
        row_edit(TRANSITIONS, S.FAILED, lambda row: without(row, E.HAND_OFF)),
        f"events with no edge: {[E.HAND_OFF.value]}",
    ),
    "events with no edge, and an edge on no event": (
        row_edit(TRANSITIONS, S.FAILED,
                 lambda row: with_entry(without(row, E.HAND_OFF), "NoEvent", S.FAILED)),
        f"events with no edge: {[E.HAND_OFF.value]}",
    ),
}  # fmt: skip


@pytest.mark.parametrize("broken", sorted(LIFECYCLE_BREAKS))
def test_the_lifecycle_guard_refuses_a_broken_table(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard that derives ``EDGES`` refuses each way to break the table, naming
    exactly what is wrong (the shipped table passes: the module imported)."""
    table, says = LIFECYCLE_BREAKS[broken]
    monkeypatch.setattr(lifecycle, "TRANSITIONS", table)
    with pytest.raises(AssertionError, match=re.escape(says) + "$"):
        lifecycle._edges()
    monkeypatch.undo()
    assert lifecycle._edges() == lifecycle.EDGES
