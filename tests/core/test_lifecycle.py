"""The transition table: its shape, and that the tracker follows it edge for edge."""

from __future__ import annotations

import pytest

from htmqc.core import FINISHED, TRANSITIONS, Event, IllegalTransition, MessageState
from htmqc.core.lifecycle import INITIAL, step
from htmqc.core.partition import PartitionTracker
from tests.core.tables import shortest_paths


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
