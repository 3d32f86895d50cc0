"""The import-time guards over the core's constant tables (``_check_table`` in
:mod:`htmqc.core.breaker` and :mod:`htmqc.core.gate`): each refuses every way a
table can be broken, not only the shipped table (which passes). An edit that
breaks a table fails the import, so these checks are the tables' contract."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest

from htmqc.core import breaker, gate

B, BE = breaker.BreakerState, breaker.BreakerEvent
G, V = gate.GateState, gate.GateEvent


def _without(mapping: Mapping[Any, Any], key: Any) -> Mapping[Any, Any]:
    return MappingProxyType({k: v for k, v in mapping.items() if k != key})


def _with(mapping: Mapping[Any, Any], key: Any, value: Any) -> Mapping[Any, Any]:
    return MappingProxyType({**mapping, key: value})


def _row_edit(
    table: Mapping[Any, Mapping[Any, Any]], state: Any, edit: Callable[[Mapping[Any, Any]], Any]
) -> Mapping[Any, Mapping[Any, Any]]:
    return _with(table, state, edit(table[state]))


#: Each way to break the breaker's tables, and the guard's message that names it.
BREAKER_BREAKS: dict[str, dict[str, Any]] = {
    "a state without a row": {"TRANSITIONS": _without(breaker.TRANSITIONS, B.OPEN)},
    "a row for no state": {"TRANSITIONS": _with(breaker.TRANSITIONS, "Extra", {})},
    "a state without an allowance": {"ALLOWANCE": _without(breaker.ALLOWANCE, B.PROBING)},
    "an allowance for no state": {"ALLOWANCE": _with(breaker.ALLOWANCE, "Extra", 0)},
    "an event without an edge": {
        "TRANSITIONS": _row_edit(breaker.TRANSITIONS, B.PROBING,
                                 lambda row: _without(row, BE.PROBE_LOST)),
    },
    "an event with two edges": {
        "TRANSITIONS": _row_edit(breaker.TRANSITIONS, B.CLOSED,
                                 lambda row: _with(row, BE.PROBE_LOST, B.OPEN)),
    },
}  # fmt: skip
BREAKER_SAYS = {
    "a state without a row": "needs a row and an allowance",
    "a row for no state": "needs a row and an allowance",
    "a state without an allowance": "needs a row and an allowance",
    "an allowance for no state": "needs a row and an allowance",
    "an event without an edge": "exactly one edge",
    "an event with two edges": "exactly one edge",
}


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any, dict[str, Any]], None]]:
    def apply(module: Any, names: dict[str, Any]) -> None:
        for name, value in names.items():
            monkeypatch.setattr(module, name, value)

    yield apply


def test_the_shipped_tables_pass() -> None:
    breaker._check_table()
    gate._check_table()


@pytest.mark.parametrize("broken", sorted(BREAKER_BREAKS))
def test_the_breaker_guard_refuses_a_broken_table(
    broken: str, patched: Callable[[Any, dict[str, Any]], None]
) -> None:
    patched(breaker, BREAKER_BREAKS[broken])
    with pytest.raises(AssertionError, match=BREAKER_SAYS[broken]):
        breaker._check_table()


#: Each way to break the gate's tables (each caught by its own check).
GATE_BREAKS: dict[str, dict[str, Any]] = {
    "a state without a row": {"TRANSITIONS": _without(gate.TRANSITIONS, G.FENCED)},
    "a row for no state": {"TRANSITIONS": _with(gate.TRANSITIONS, "Extra", {})},
    "an event with no edge": {
        "TRANSITIONS": MappingProxyType({
            s: _without(row, V.FENCE_GRACE_OVER) for s, row in gate.TRANSITIONS.items()
        }),
    },
    "a state the group cannot take a partition from": {
        "TRANSITIONS": _row_edit(gate.TRANSITIONS, G.ACTIVE, lambda row: _without(row, V.LOST)),
    },
    "lost leading elsewhere than unassigned": {
        "TRANSITIONS": _row_edit(gate.TRANSITIONS, G.ACTIVE,
                                 lambda row: _with(row, V.LOST, G.FENCED)),
    },
    "paused always and with the holds": {"FOLLOWS_HOLDS": frozenset({G.ACTIVE, G.FENCED})},
    "a seeking edge not in the table": {
        "SEEKS": frozenset({*gate.SEEKS, (G.UNASSIGNED, V.RETRY_WAIT)}),
    },
    "a timed state its event cannot leave": {
        "TIMED": MappingProxyType({**gate.TIMED, G.ACTIVE: V.FENCE_GRACE_OVER}),
    },
    "an unreachable state": {
        "TRANSITIONS": MappingProxyType({
            s: MappingProxyType({e: (G.ACTIVE if t is G.WAITING else t) for e, t in row.items()})
            for s, row in gate.TRANSITIONS.items()
        }),
    },
}  # fmt: skip
GATE_SAYS = {
    "a state without a row": "every gate state needs a row",
    "a row for no state": "every gate state needs a row",
    "an event with no edge": "events with no edge",
    "a state the group cannot take a partition from": "can take a partition away",
    "lost leading elsewhere than unassigned": "can take a partition away",
    "paused always and with the holds": "paused always or with the holds",
    "a seeking edge not in the table": "a seeking edge",
    "a timed state its event cannot leave": "a timed state cannot be left",
    "an unreachable state": "unreachable gate states",
}


@pytest.mark.parametrize("broken", sorted(GATE_BREAKS))
def test_the_gate_guard_refuses_a_broken_table(
    broken: str, patched: Callable[[Any, dict[str, Any]], None]
) -> None:
    patched(gate, GATE_BREAKS[broken])
    with pytest.raises(AssertionError, match=GATE_SAYS[broken]):
        gate._check_table()
