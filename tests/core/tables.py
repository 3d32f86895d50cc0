"""Helpers for tests generated from a transition table (``TRANSITIONS[state][event]``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from typing import TypeVar

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
