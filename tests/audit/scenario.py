"""A tiny clean run and doctorings that each introduce exactly one anomaly.

Eight ids ``00``..``07``; id i has key ``k{i % 2}``, partition ``i % 2``,
offset ``i // 2``; the sink stored each once in production order, writer
generation 1; commits only move forward. Shared by the Spark agreement test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from htmqc.audit.model import CommitObservation, DlqEntry, Effect, Produced

N = 8


@dataclass(frozen=True)
class Scenario:
    produced: list[Produced]
    effects: list[Effect]
    dlq: list[DlqEntry] = field(default_factory=list)
    committed: list[CommitObservation] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)


def ident(i: int) -> str:
    return f"{i:02d}"


def clean() -> Scenario:
    produced = [Produced(ident(i), f"k{i % 2}", i % 2, i // 2) for i in range(N)]
    effects = [Effect(p.id, p.key, p.partition, p.offset, 1) for p in produced]
    committed = [CommitObservation(p, o) for o in (1, 3, 3, 4) for p in (0, 1)]  # repeats are fine
    return Scenario(produced, effects, committed=committed)


def _position(effects: list[Effect], ident: str) -> int:
    return next(i for i, e in enumerate(effects) if e.id == ident)


def _lost(s: Scenario) -> Scenario:
    return replace(s, effects=[e for e in s.effects if e.id != "01"])


def _duplicate(s: Scenario) -> Scenario:
    return replace(s, effects=[*s.effects, s.effects[_position(s.effects, "06")]])


def _dlq_and_effect(s: Scenario) -> Scenario:
    return replace(s, dlq=[DlqEntry("03", "poison")])


def _aborted_read(s: Scenario) -> Scenario:
    extra = Produced("08", "k0", 0, 4)
    return replace(
        s,
        produced=[*s.produced, extra],
        effects=[*s.effects, Effect("08", "k0", 0, 4, 1)],
        aborted=["08"],
    )


def _order_violation(s: Scenario) -> Scenario:
    e = list(s.effects)
    i, j = _position(e, "02"), _position(e, "04")
    e[i], e[j] = e[j], e[i]  # id 04 (k0, offset 2) stored before 02 (k0, offset 1)
    return replace(s, effects=e)


def _nonmonotonic_commit(s: Scenario) -> Scenario:
    return replace(s, committed=[*s.committed, CommitObservation(1, 2)])


def _fenced_write(s: Scenario) -> Scenario:
    # Partition 1 is taken over by generation 2 at id 03; the old writer stores 05 anyway.
    gens = {"03": 2, "05": 1, "07": 2}
    return replace(
        s, effects=[e._replace(generation=gens.get(e.id, e.generation)) for e in s.effects]
    )


def _unexpected(s: Scenario) -> Scenario:
    return replace(s, effects=[*s.effects, Effect("99", "k1", 1, 9)])


DOCTORINGS: dict[str, Callable[[Scenario], Scenario]] = {
    "lost": _lost,
    "duplicate": _duplicate,
    "dlq-and-effect": _dlq_and_effect,
    "aborted-read": _aborted_read,
    "order-violation": _order_violation,
    "nonmonotonic-commit": _nonmonotonic_commit,
    "fenced-write": _fenced_write,
    "unexpected": _unexpected,
}

EXPECTED_EXAMPLE = {
    "lost": {"id": "01", "key": "k1", "partition": 1, "offset": 0},
    "duplicate": {"id": "06", "count": 2},
    "dlq-and-effect": {"id": "03", "reason": "poison"},
    "aborted-read": {"id": "08"},
    "order-violation": {"id": "02", "key": "k0", "partition": 0, "offset": 1, "after_offset": 2},
    "nonmonotonic-commit": {"partition": 1, "index": 4, "from": 4, "to": 2},
    "fenced-write": {"id": "05", "partition": 1, "generation": 1, "after_generation": 2},
    "unexpected": {"id": "99"},
}


def combined() -> Scenario:
    """Every doctoring at once (they touch different ids)."""
    s = clean()
    for doctor in DOCTORINGS.values():
        s = doctor(s)
    return s
