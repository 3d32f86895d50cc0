"""Moving a consumer group's stored positions: the rules of ``htmqc positions``.

Pure functions, shared by the Kafka group offsets
(:mod:`htmqc.sinks.group_offsets`) and the SQL positions tables
(:meth:`htmqc.sinks.sql.SqlSink.reposition`).

Targets (:class:`Request`): ``earliest`` (the log's low watermark), ``latest``
(its high watermark), an offset, or the stored position plus ``N`` (``skip``).
A target below the low watermark or above the high watermark is refused
unless ``force`` (below: those records are gone, the consumer would jump to
``auto.offset.reset``; above: records written later would be skipped
unseen). ``skip`` needs a stored position.

Offsets finished out of order above the position (``finished_above``) follow
one rule (:func:`carried_finished`):

* moving forward (or not at all) keeps those at or above the new position:
  their effects are stored, and running them again would store them twice;
  those below it are covered by the new position anyway;
* moving backward clears them all: the user asked for everything from the new
  position to run again, and keeping them would skip exactly those offsets,
  which no longer sit above a position that covers the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from htmqc.errors import UsageError

RequestKind = Literal["earliest", "latest", "offset", "skip"]


@dataclass(frozen=True, slots=True)
class Request:
    """Where to move: ``earliest``, ``latest``, ``offset`` (``amount`` is the
    offset) or ``skip`` (``amount`` offsets forward; negative: backward)."""

    kind: RequestKind
    amount: int = 0

    def describe(self) -> str:
        """The request as the command line spells it."""
        if self.kind == "skip":
            return f"skip {self.amount}"
        return f"--to {self.amount if self.kind == 'offset' else self.kind}"


@dataclass(frozen=True, slots=True)
class Watermarks:
    """A partition's log: ``low`` is its first offset, ``high`` the next one written."""

    low: int
    high: int


@dataclass(frozen=True, slots=True)
class Move:
    """One partition's position before and after a move (``before`` ``None``:
    nothing was stored)."""

    partition: int
    before: int | None
    after: int
    finished_before: tuple[int, ...] = ()
    finished_after: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether anything stored changes."""
        return self.before != self.after or self.finished_before != self.finished_after

    def describe(self) -> str:
        """``P: BEFORE->AFTER`` (``none`` for no stored position), plus what
        happened to the finished offsets."""
        before = "none" if self.before is None else str(self.before)
        text = f"{self.partition}: {before}->{self.after}"
        dropped = len(set(self.finished_before) - set(self.finished_after))
        if dropped and self.after < (self.before if self.before is not None else self.after):
            text += f" (cleared {dropped} finished above)"
        elif dropped:
            text += f" ({dropped} finished above now covered)"
        return text


def new_position(
    request: Request,
    partition: int,
    stored: int | None,
    marks: Watermarks,
    *,
    force: bool,
) -> int:
    """The position ``request`` moves ``partition`` to.

    :raises UsageError: ``skip`` without a stored position; a target outside
        ``[marks.low, marks.high]`` without ``force``; a negative target.
    """
    if request.kind == "earliest":
        return marks.low
    if request.kind == "latest":
        return marks.high
    if request.kind == "offset":
        target = request.amount
    else:
        if stored is None:
            raise UsageError(
                f"partition {partition} has no stored position to skip from",
                f"give it one first: htmqc positions seek --to OFFSET --partition {partition}",
            )
        target = stored + request.amount
    if target < 0:
        raise UsageError(
            f"{request.describe()} would move partition {partition} to {target}, below offset 0",
            "choose a target of 0 or more",
        )
    if not force and target < marks.low:
        raise UsageError(
            f"{request.describe()} would move partition {partition} to {target}, below its "
            f"low watermark {marks.low} (those records are gone)",
            "use --to earliest, or --force to store it anyway",
        )
    if not force and target > marks.high:
        raise UsageError(
            f"{request.describe()} would move partition {partition} to {target}, past its "
            f"high watermark {marks.high} (records written later would be skipped)",
            "use --to latest, or --force to store it anyway",
        )
    return target


def carried_finished(before: int | None, finished: Iterable[int], after: int) -> tuple[int, ...]:
    """The offsets finished above the position that stay stored when it moves
    from ``before`` to ``after`` (module docs): all at or above ``after`` when
    moving forward or staying, none when moving backward."""
    if before is not None and after < before:
        return ()
    return tuple(sorted({o for o in finished if o >= after}))


def plan(
    request: Request,
    partition: int,
    stored: int | None,
    finished: Sequence[int],
    marks: Watermarks,
    *,
    force: bool,
) -> Move:
    """The :class:`Move` of one partition (:func:`new_position`,
    :func:`carried_finished`). :raises UsageError: as :func:`new_position`."""
    after = new_position(request, partition, stored, marks, force=force)
    return Move(
        partition,
        stored,
        after,
        tuple(sorted(finished)),
        carried_finished(stored, finished, after),
    )


def summary(moves: Sequence[Move], topic: str, group: str, *, dry_run: bool) -> str:
    """The one-line report: ``moved 3 partitions of T for group G: 0: 10->0, ...``
    (dry run: ``dry run: would move ...; nothing was changed``). Partitions
    that stay where they are are counted, not listed."""
    changed = [m for m in moves if m.changed]
    same = len(moves) - len(changed)
    noun = "partition" if len(changed) == 1 else "partitions"
    verb = "would move" if dry_run else "moved"
    head = f"{verb} {len(changed)} {noun} of {topic} for group {group}"
    text = head + (": " + ", ".join(m.describe() for m in changed) if changed else "")
    if same:
        text += f"; {same} already there"
    return f"dry run: {text}; nothing was changed" if dry_run else text


def show_offsets(offsets: Iterable[int], limit: int = 8) -> str:
    """Offsets as runs, ``102-104,110``; at most ``limit`` runs, then ``...(+N)``."""
    runs: list[list[int]] = []
    for off in sorted(set(offsets)):
        if runs and off == runs[-1][1] + 1:
            runs[-1][1] = off
        else:
            runs.append([off, off])
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit]]
    more = len(runs) - limit
    return ",".join(shown) + (f",...(+{more} runs)" if more > 0 else "") if shown else "-"
