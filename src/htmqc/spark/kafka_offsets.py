"""Offsets of the ``htmqc-kafka`` source: what Spark's checkpoint holds, how a
restart or the next trigger continues from it, and data loss.

Theory of operation
-------------------
Spark keeps, per micro-batch, the source's end offset as JSON
(:meth:`SourceOffset.to_json`): Spark's connector's shape ``{"topic": {"0": 42}}``
(the next offset to read per partition), plus ``"@ids"`` (each topic's Kafka
topic id when it was read; ``@`` cannot start a topic name) and ``"@lost"``
(offsets skipped and loss events so far, with ``failOnDataLoss=false``). The
counts show in ``query.lastProgress["sources"][0]["endOffset"]``. With
``failOnDataLoss=false`` it also holds ``"@notes"``: the Kafka group that carries
*loss notes* from the executors, and the notes already counted (below).

Before each trigger the reader looks at the partitions as they are now
(:class:`Snapshot`: each partition's earliest and end offsets, each topic's id)
and :func:`continue_from` decides where each partition goes on from. Loss is
anything the query was due to read and now cannot:

* ``recreated``: the topic id changed (deleted and created again): the new
  topic is read from its earliest offset; what the old one held past the
  checkpoint is gone;
* ``gone``: a partition (or its topic) no longer exists, e.g. fewer partitions;
* ``deleted``: the next offset is below the earliest (retention, ``delete_records``):
  read on from the earliest, ``earliest - next`` offsets skipped;
* ``backwards``: the next offset is past the partition's end (truncation, or a
  recreated topic on a broker without topic ids): read on from the end, as
  Spark's connector does;
* ``added-late``: a new partition whose earliest offset is not 0.

The caller fails the query on any loss (``failOnDataLoss=true``) or logs and
counts it.

*Records deleted while a batch reads them* are seen by the executor reading
them, not by the planner, and the two run in different processes. With
``failOnDataLoss=false`` the reader leaves a **loss note** where the planner can
find it: the committed offset of the batch's partition in a Kafka group of the
query's own (``"@notes"``), at the range's end, its metadata saying how many
offsets it skipped. Spark plans batch ``k+1`` only after batch ``k`` ran, so the
next planning sees the note of every partition whose next offset is that end:
:func:`notes_due` turns each into a counted loss once (a note already listed as
counted, while its partition has not moved on, is not counted again); the
source's ``commit`` removes the notes an offset lists, after Spark has written
that offset. A retried task writes the same note again (same end), so it is
counted once. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from htmqc.spark.kafka_options import EARLIEST, LATEST, Offsets

TopicPartition = tuple[str, int]
_IDS, _LOST, _NOTES = "@ids", "@lost", "@notes"


@dataclass(frozen=True)
class Snapshot:
    """The partitions read now: ``(low, high)`` per partition (earliest and end
    offsets) and topic ids (a topic may lack one)."""

    partitions: Mapping[TopicPartition, tuple[int, int]]
    topic_ids: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DataLoss:
    """One partition's loss; ``skipped`` is the count of offsets skipped if known."""

    topic: str
    partition: int
    kind: str
    detail: str
    skipped: int | None = None

    def line(self) -> str:
        where = self.topic if self.partition < 0 else f"{self.topic}/{self.partition}"
        return f"{where} {self.kind}: {self.detail}"


class DataLossError(RuntimeError):
    """The query would skip records it was due to read (``failOnDataLoss=true``)."""

    def __init__(self, losses: list[DataLoss]) -> None:
        shown = "; ".join(loss.line() for loss in losses[:5])
        more = f" (+{len(losses) - 5} more)" if len(losses) > 5 else ""
        super().__init__(
            f"htmqc-kafka: data loss: {shown}{more}; set failOnDataLoss=false to skip it "
            'and count it in the source\'s endOffset["@lost"]'
        )
        self.losses = losses


@dataclass(frozen=True)
class LossNote:
    """An executor's note: it read ``partition`` up to ``end`` and skipped
    ``skipped`` offsets that were deleted under it (the batch began at ``start``)."""

    end: int
    start: int
    skipped: int


@dataclass(frozen=True)
class SourceOffset:
    """The next offset per partition, topic ids, the loss counts so far, and the
    loss-note group with the notes counted and not yet outrun (module docs)."""

    next: Mapping[TopicPartition, int]
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    lost_offsets: int = 0
    loss_events: int = 0
    notes: str | None = None
    counted: Mapping[TopicPartition, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _by_topic(self.next)
        if self.topic_ids:
            out[_IDS] = dict(sorted(self.topic_ids.items()))
        if self.loss_events:
            out[_LOST] = {"offsets": self.lost_offsets, "events": self.loss_events}
        if self.notes is not None:
            out[_NOTES] = {"group": self.notes, "counted": _by_topic(self.counted)}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceOffset:
        """Also reads the first ``htmqc-kafka``'s ``{"topic/0": 42}`` checkpoints."""
        lost = data.get(_LOST) or {}
        notes = data.get(_NOTES) or {}
        return cls(
            _from_topics(data),
            dict(data.get(_IDS) or {}),
            int(lost.get("offsets", 0)),
            int(lost.get("events", 0)),
            notes.get("group"),
            _from_topics(notes.get("counted") or {}),
        )

    def with_losses(self, losses: list[DataLoss]) -> SourceOffset:
        skipped = sum(loss.skipped or 0 for loss in losses)
        return replace(
            self,
            lost_offsets=self.lost_offsets + skipped,
            loss_events=self.loss_events + len(losses),
        )


def _by_topic(offsets: Mapping[TopicPartition, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (topic, part), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = offset
    return out


def _from_topics(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for key, value in data.items():
        if key.startswith("@"):
            continue
        if isinstance(value, dict):
            for part, offset in value.items():
                out[(key, int(part))] = int(offset)
        else:
            topic, _, part = key.rpartition("/")
            out[(topic, int(part))] = int(value)
    return out


def notes_due(
    previous: SourceOffset, notes: Mapping[TopicPartition, LossNote]
) -> tuple[list[DataLoss], dict[TopicPartition, int]]:
    """The loss notes of the batch that ended at ``previous`` (module docs), as
    losses, and what the next offset lists as counted: these notes, and those
    ``previous`` listed whose partition has not moved on since (the next
    planning starts where they end, so it would otherwise count them again)."""
    losses: list[DataLoss] = []
    counted: dict[TopicPartition, int] = {}
    for tp, note in sorted(notes.items()):
        if previous.next.get(tp) != note.end or previous.counted.get(tp) == note.end:
            continue
        losses.append(
            DataLoss(
                *tp, "deleted",
                f"{note.skipped} offsets of the batch {note.start}..{note.end - 1} were "
                "deleted while it read them (counted from the reader's note)",
                note.skipped,
            )
        )  # fmt: skip
        counted[tp] = note.end
    for tp, end in previous.counted.items():
        if previous.next.get(tp) == end:
            counted.setdefault(tp, end)
    return losses, counted


def initial_positions(
    wanted: Offsets, now: Snapshot
) -> tuple[dict[TopicPartition, int], list[DataLoss]]:
    """Where a new query starts (``startingOffsets``); a given offset outside
    ``[low, high]`` is a loss, as in Spark's connector."""
    start: dict[TopicPartition, int] = {}
    losses: list[DataLoss] = []
    for tp, (low, high) in sorted(now.partitions.items()):
        if wanted.where != "specific":
            start[tp] = low if wanted.where == "earliest" else high
            continue
        chosen = wanted.per_partition[tp]
        if chosen == EARLIEST:
            start[tp] = low
        elif chosen == LATEST:
            start[tp] = high
        else:
            start[tp] = _place(tp, chosen, low, high, "starting offset", losses)
    return start, losses


def _place(
    tp: TopicPartition, offset: int, low: int, high: int, what: str, losses: list[DataLoss]
) -> int:
    """``offset`` moved into ``[low, high]``; a move is a loss, appended to ``losses``."""
    if offset < low:
        losses.append(DataLoss(*tp, "deleted", f"{what} {offset} < earliest {low}", low - offset))
        return low
    if offset > high:
        losses.append(DataLoss(*tp, "backwards", f"{what} {offset} > end {high}"))
        return high
    return offset


def continue_from(
    previous: SourceOffset, now: Snapshot
) -> tuple[dict[TopicPartition, int], list[DataLoss]]:
    """Where each partition of ``now`` goes on from after ``previous``, and the
    losses on the way (see the module docs). New topics and partitions start at
    their earliest offset."""
    start: dict[TopicPartition, int] = {}
    losses: list[DataLoss] = []
    recreated = {
        topic
        for topic, old in previous.topic_ids.items()
        if topic in now.topic_ids and now.topic_ids[topic] != old
    }
    for topic in sorted(recreated):
        losses.append(
            DataLoss(
                topic, -1, "recreated",
                f"topic id {previous.topic_ids[topic]} is now {now.topic_ids[topic]}; "
                "what the old topic held after the checkpoint is gone",
            )
        )  # fmt: skip
    for tp, offset in sorted(previous.next.items()):
        if tp not in now.partitions and tp[0] not in recreated:
            losses.append(DataLoss(*tp, "gone", f"the partition no longer exists (next {offset})"))
    known_topics = {t for t, _ in previous.next}
    for tp, (low, high) in sorted(now.partitions.items()):
        was = previous.next.get(tp)
        if tp[0] in recreated or was is None:
            start[tp] = low
            if was is None and tp[0] in known_topics and tp[0] not in recreated and low > 0:
                losses.append(
                    DataLoss(*tp, "added-late", f"new partition starts at {low}, not 0", low)
                )
        else:
            start[tp] = _place(tp, was, low, high, "next offset", losses)
    return start, losses


def ends(
    start: Mapping[TopicPartition, int],
    highs: Mapping[TopicPartition, int],
    limit: int | None,
) -> dict[TopicPartition, int]:
    """Each partition's end for this batch: its high, or with ``limit`` offsets in
    all, each partition's share of ``limit`` by its backlog (Spark's
    ``maxOffsetsPerTrigger`` rule: a share below one offset rounds up)."""
    backlog = {tp: max(0, highs[tp] - offset) for tp, offset in start.items()}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return {tp: start[tp] + size for tp, size in backlog.items()}
    out: dict[TopicPartition, int] = {}
    for tp, size in backlog.items():
        share = limit * size / total
        step = int(share) if share >= 1 else (1 if size else 0)
        out[tp] = start[tp] + min(size, step)
    return out
