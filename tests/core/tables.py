"""Helpers for tests generated from a transition table (``TRANSITIONS[state][event]``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

S = TypeVar("S", bound=Hashable)
E = TypeVar("E")


def shortest_paths(table: Mapping[S, Mapping[E, S]], start: S) -> dict[S, list[E]]:
    """For every state reachable from ``start``, the shortest list of events
    that leads there through ``table`` (breadth first, in table order)."""
    paths: dict[S, list[E]] = {start: []}
    frontier = deque([start])
    while frontier:
        source = frontier.popleft()
        for event, target in table[source].items():
            if target not in paths:
                paths[target] = [*paths[source], event]
                frontier.append(target)
    return paths


# -- broken copies of a table, for the import-time guards' tests ---------------------


def without(mapping: Mapping[Any, Any], key: Any) -> Mapping[Any, Any]:
    """``mapping`` without ``key`` (read-only, like the core's tables)."""
    return MappingProxyType({k: v for k, v in mapping.items() if k != key})


def with_entry(mapping: Mapping[Any, Any], key: Any, value: Any) -> Mapping[Any, Any]:
    """``mapping`` with ``key`` set to ``value``."""
    return MappingProxyType({**mapping, key: value})


def row_edit(
    table: Mapping[Any, Mapping[Any, Any]], state: Any, edit: Callable[[Mapping[Any, Any]], Any]
) -> Mapping[Any, Mapping[Any, Any]]:
    """``table`` with ``state``'s row replaced by ``edit(row)``."""
    return with_entry(table, state, edit(table[state]))
