"""The checker's inputs (plain records) and its output (:class:`AuditReport`).

Records are ``NamedTuple`` s rather than dataclasses: an audit streams millions
of effect rows, and a tuple is the cheapest record Python builds. Unknown
fields are ``None``. Partitions are integers of one topic.

Anomalies (names follow Jepsen's Kafka workload where one fits):

``lost``
    produced, not aborted, and neither stored as an effect nor dead-lettered.
``duplicate``
    an id whose effect is stored more than once.
``dlq-and-effect``
    an id both dead-lettered and stored as an effect.
``aborted-read``
    an effect of an id produced in an aborted transaction (Jepsen's G1a).
``order-violation``
    per (key, partition), consider the *first* stored effect of each id in
    storage order; an effect whose offset is below the largest offset of an
    effect of the same key and partition stored before it is a violation
    (production order within a partition is offset order).
``nonmonotonic-commit``
    a partition's committed offset lower than the previous observation of it.
``fenced-write``
    an effect written with a generation (fence) lower than the largest
    generation that already wrote to its partition: a zombie wrote after it had
    been superseded.
``unexpected``
    an effect of an id that was never produced (and is not an aborted id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

ANOMALIES: tuple[str, ...] = (
    "lost",
    "duplicate",
    "dlq-and-effect",
    "aborted-read",
    "order-violation",
    "nonmonotonic-commit",
    "fenced-write",
    "unexpected",
)

DEFAULT_EXAMPLES = 10


class Produced(NamedTuple):
    """A produced message: its id and, when known, key, partition and offset."""

    id: str
    key: str | None = None
    partition: int | None = None
    offset: int | None = None


class Effect(NamedTuple):
    """One row the sink stored, in storage order. Missing key, partition or
    offset are taken from the produced record of the same id."""

    id: str
    key: str | None = None
    partition: int | None = None
    offset: int | None = None
    generation: int | None = None


class DlqEntry(NamedTuple):
    """A dead-lettered id and why."""

    id: str
    reason: str = ""


class CommitObservation(NamedTuple):
    """A committed offset of a partition as observed at one moment; a history is
    a sequence of these in observation order."""

    partition: int
    offset: int


@dataclass
class AuditReport:
    """Counts and up to ``limit`` examples per anomaly, plus input totals.

    Which examples are kept when there are more than ``limit`` is
    implementation-defined; :meth:`to_json` lists them sorted.
    """

    limit: int = DEFAULT_EXAMPLES
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {name: [] for name in ANOMALIES}
    )
    totals: dict[str, int] = field(default_factory=dict)
    engine: str = "python"

    @property
    def ok(self) -> bool:
        """True iff no anomaly was found."""
        return not any(self.counts.values())

    def add(self, anomaly: str, example: dict[str, Any]) -> None:
        """Count one occurrence of ``anomaly``; keep ``example`` if there is room."""
        self.counts[anomaly] += 1
        kept = self.examples[anomaly]
        if len(kept) < self.limit:
            kept.append(example)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``ok``, ``counts``, ``examples``, ``totals``, ``engine``."""
        return {
            "ok": self.ok,
            "counts": dict(self.counts),
            "examples": {
                name: sorted(found, key=lambda e: json.dumps(e, sort_keys=True))
                for name, found in self.examples.items()
            },
            "totals": dict(self.totals),
            "engine": self.engine,
        }

    def summary(self) -> str:
        """A few lines for people: totals, then each anomaly found with examples."""
        totals = ", ".join(f"{k} {v}" for k, v in self.totals.items())
        lines = [f"audit ({self.engine}): {'OK' if self.ok else 'ANOMALIES'} ({totals})"]
        for name in ANOMALIES:
            n = self.counts[name]
            if n:
                shown = self.to_json()["examples"][name][:3]
                lines.append(f"  {name}: {n}, e.g. {json.dumps(shown)}")
        return "\n".join(lines)
