"""One pipeline of a chaos run: a consumer group, its sink, and what judges it.

A run has one pipeline per sink (``postgresql``, ``sqlite``, ``kafka``), all
reading the same input topic in their own consumer groups, so the same broker
faults hit every sink at once. :class:`Pipeline` holds the group, the sink's
store (:class:`~htmqc.chaos.store.RunStore` for the databases,
:class:`~htmqc.chaos.kafka_store.KafkaRunStore` for Kafka→Kafka) and the
committed-offset history; it tells the injector when the group moved on
(:meth:`Pipeline.moved_since`: a claim raised a fence, or the Kafka group's
membership changed). :meth:`Pipeline.judge` runs the audit
(:func:`htmqc.audit.audit`) over the stored effects, dead letters and the
history, and beside it the sink's own checks (*findings*):

``fenced-write-after-claim`` (PostgreSQL)
    an effect committed by a generation after a newer one had claimed its
    partition (:class:`~htmqc.chaos.store.ClaimCheck`);
``unstamped-effect`` (PostgreSQL)
    an effect row without a commit stamp (the storage order would be unknown);
``g1a-aborted-read`` (Kafka)
    an output record read under ``read_committed`` whose transaction never
    asked to commit (:class:`~htmqc.chaos.kafka_store.AbortedReadCheck`).

Every count must be 0, and every poison id dead-lettered, for the pipeline
to be ``ok``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from htmqc.audit import AuditReport, CommitObservation, Produced, audit
from htmqc.chaos.kafka_store import KafkaRunStore
from htmqc.chaos.store import ClaimCheck, RunStore

KEYS = 1000
"""Distinct keys of the produced messages (``k{id % KEYS}``)."""


@dataclass
class History:
    """The committed-offset observations of one group (only changes are kept)."""

    last: dict[int, int] = field(default_factory=dict)
    observations: list[CommitObservation] = field(default_factory=list)

    def observe(self, committed: dict[int, int]) -> int:
        """Record what changed; return the sum of the committed offsets (messages stored)."""
        for part, off in sorted(committed.items()):
            if self.last.get(part) != off:
                self.last[part] = off
                self.observations.append(CommitObservation(part, off))
        return sum(self.last.values())


@dataclass
class Finding:
    """A sink-specific anomaly count with up to a few examples."""

    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "examples": self.examples}


@dataclass
class PipelineResult:
    """What :meth:`Pipeline.judge` found."""

    sink: str
    group: str
    audit: AuditReport
    findings: dict[str, Finding]
    positions: dict[int, int]
    stored: int
    poison_missing: list[int]

    @property
    def ok(self) -> bool:
        return (
            self.audit.ok
            and all(f.count == 0 for f in self.findings.values())
            and not self.poison_missing
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sink": self.sink,
            "group": self.group,
            "ok": self.ok,
            "stored": self.stored,
            "positions": {str(k): v for k, v in sorted(self.positions.items())},
            "findings": {name: f.to_json() for name, f in self.findings.items()},
            "poison_not_dead_lettered": self.poison_missing,
            "audit": self.audit.to_json(),
        }

    def summary(self) -> list[str]:
        lines = [f"[{self.sink}] {self.audit.summary()}"]
        for name, f in self.findings.items():
            if f.count:
                lines.append(f"  [{self.sink}] {name}: {f.count}, e.g. {f.examples[:3]}")
        if self.poison_missing:
            lines.append(f"  [{self.sink}] poison ids not dead-lettered: {self.poison_missing}")
        return lines


class Pipeline:
    """One consumer group and its sink (see module docs)."""

    def __init__(
        self, sink: str, group: str, store: RunStore | KafkaRunStore, partitions: int
    ) -> None:
        self.sink = sink
        self.group = group
        self.store = store
        self.partitions = partitions
        self.history = History()

    @property
    def sink_url(self) -> str:
        return self.store.sink_url

    def committed(self, *, fresh: bool = False) -> dict[int, int]:
        """The stored positions (``partition -> committed``) now."""
        if isinstance(self.store, KafkaRunStore):
            return self.store.committed(self.partitions, fresh=fresh)
        return self.store.committed()

    def observe(self, *, fresh: bool = False) -> int:
        """Observe the positions into the history; return how many messages are stored."""
        return self.history.observe(self.committed(fresh=fresh))

    # -- the injector's Ownership --------------------------------------------------------

    def snapshot(self) -> object:
        if isinstance(self.store, KafkaRunStore):
            return self.store.ownership()
        return self.store.fences()

    def moved_since(self, before: object) -> bool:
        if isinstance(self.store, KafkaRunStore):
            assert isinstance(before, frozenset)
            return self.store.moved_since(before)
        assert isinstance(before, dict)
        now = self.store.fences()
        return any(fence > before.get(part, 0) for part, fence in now.items())

    # -- the verdict ---------------------------------------------------------------------

    def judge(self, messages: int, poison_ids: list[int]) -> PipelineResult:
        """Audit the pipeline (see module docs), after its consumers stopped."""
        store = self.store
        dead = store.dead_letters()
        findings: dict[str, Finding] = {}
        if isinstance(store, KafkaRunStore):
            report = audit(
                _produced(messages), store.effects(), dlq=dead, committed=self.history.observations
            )
            g1a = store.aborted_reads
            findings["g1a-aborted-read"] = Finding(g1a.count, g1a.examples)
        else:
            claims = ClaimCheck(store.claims())
            report = audit(
                _produced(messages),
                store.effects(claims),
                dlq=dead,
                committed=self.history.observations,
            )
            findings["fenced-write-after-claim"] = Finding(claims.count, claims.examples)
            findings["unstamped-effect"] = Finding(store.unstamped())
        dead_ids = {d.id for d in dead}
        return PipelineResult(
            sink=self.sink,
            group=self.group,
            audit=report,
            findings=findings,
            positions=dict(self.history.last),
            stored=sum(self.history.last.values()),
            poison_missing=[i for i in poison_ids if str(i) not in dead_ids],
        )


def _produced(messages: int) -> Iterator[Produced]:
    for i in range(messages):
        yield Produced(str(i), f"k{i % KEYS}")
