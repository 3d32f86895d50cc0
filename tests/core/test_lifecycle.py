"""The transition table: its shape, and that the tracker follows it edge for edge."""

from __future__ import annotations

import pytest

from htmqc.core import FINISHED, TRANSITIONS, Event, IllegalTransition, MessageState
from htmqc.core.lifecycle import INITIAL, step
from htmqc.core.partition import PartitionTracker


def test_the_table_is_the_documented_lifecycle() -> None:
    S, E = MessageState, Event
    assert {(s, e, t) for s, row in TRANSITIONS.items() for e, t in row.items()} == {
        (S.PENDING, E.START, S.PROCESSING),
        (S.PROCESSING, E.SUCCEED, S.SUCCEEDED),
        (S.PROCESSING, E.FAIL, S.FAILED),
        (S.FAILED, E.SCHEDULE_RETRY, S.RETRYING),
        (S.RETRYING, E.RETRY_DUE, S.PROCESSING),
        (S.FAILED, E.DEAD_LETTER, S.DEAD_LETTERED),
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


def path_to(state: MessageState) -> list[Event]:
    """The shortest event path from Pending to ``state`` through the table."""
    paths = {INITIAL: []}
    frontier = [INITIAL]
    while frontier:
        source = frontier.pop(0)
        for event, target in TRANSITIONS[source].items():
            if target not in paths:
                paths[target] = [*paths[source], event]
                frontier.append(target)
    return paths[state]


@pytest.mark.parametrize("source", list(MessageState))
@pytest.mark.parametrize("event", list(Event))
def test_the_tracker_allows_exactly_the_tables_edges(source: MessageState, event: Event) -> None:
    t = PartitionTracker(0)
    t.fetched([0, 1])  # 1 keeps the watermark from passing 0 once it finishes
    for e in path_to(source):
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
