"""Trace validation: is a ``htmqc run --trace`` file a behaviour of the model?

Contract
--------
:func:`validate_trace` reads one trace (JSON lines, :mod:`htmqc.runtime.trace`,
design notes §5) and returns a :class:`TraceReport`: ``ok`` is true when the
trace is accepted by every check that ran, else ``violations`` names the first
offending line, its event and partition, and the problem.
:func:`validate_lines` does the same for trace lines held in memory (JSON
texts or already decoded objects), e.g. from a Hypothesis state machine that
drives a :class:`~htmqc.runtime.trace.TracingCore` writing to a
``io.StringIO``::

    out = io.StringIO()
    core = TracingCore(out)
    ...  # drive it
    report = validate_lines(out.getvalue().splitlines(), mode="exactly-once")
    assert report.ok, report.summary()

Two checks:

1. **Reference replay** (always; any size). The trace is replayed through
   :class:`model_checks.reference.ReferenceConsumer`, per partition and per
   assignment epoch, and after each batch the recorded ``next``,
   ``processed``, ``committed``, ``requested``, ``unsent`` and
   ``finished_above`` must equal the model's. Beyond what the model itself
   refuses (an event from the wrong lifecycle state, a batch below ``next``,
   an ack above the watermark, work started while draining) the replay checks:

   * ``committed <= processed <= next`` in every recorded state;
   * every ``commit_requested`` line hands out what the model hands out: the
     watermark, only when something finished since the last request, with the
     model's ``finished_above`` and the assignment's epoch (and, exactly-once,
     the fence token that assignment's claim got);
   * no commit beyond the watermark (``commit_acked``/``commit_failed`` offset
     ``<= processed``; an acked commit moves ``committed`` forward);
   * every offset list a line carries (a fetched batch, ``above``,
     ``finished_above``) names each offset once, in increasing order, as the
     runtime writes them;
   * no event for a partition this member does not hold (an effect after its
     epoch ended: revoked, crashed, or before its assignment);
   * epochs: every assignment gets a fresh, larger epoch (the model's number:
     one trace is one process) and every line of the assignment carries it;
   * fences: each claim of a partition gets a larger fence token than the last;
   * the durable position never moves backwards: a new assignment starts at or
     above every offset this trace saw acked for the partition;
   * a final commit handed out by ``revoked`` is the watermark, announced by
     the ``commit_requested`` line just before.

   Lines of one batch (consecutive, same partition, event and recorded state)
   are applied one offset at a time and compared once, after the last.
   Cost: amortised O(1) per line plus O(in-flight window) per batch (finished
   offsets below the watermark are dropped from the model as it goes). The
   file is read as it is replayed: memory holds one batch and the model, never
   the whole trace (a 218 MB chaos trace once took 1.6 GB read whole).

2. **TLC** (small traces: at most :data:`TLC_MAX_LINES` lines and offsets
   below :data:`TLC_MAX_OFFSETS`; or forced with ``tlc=True``). The trace is
   turned into a TLA+ module of constants (``TraceRun.tla``, see
   :func:`tla_module`) for ``tla/TraceConsumer.tla``, which EXTENDS
   ``Consumer.tla`` and lets each step be only the spec action the next trace
   line names (spec/refinement.md maps the names), with every recorded field
   (watermarks, requested, unsent, finished above, epoch, fence, what a commit
   request handed out) matched against the spec's view. TLC, run by
   :func:`model_checks.tlc.run_model` in a child JVM, then reports the
   invariant ``TraceUnmatched`` violated if a behaviour of the spec matches the
   whole trace (accepted); if it finishes without, no behaviour does
   (rejected, with the deepest line matched). Any of the spec's own invariants
   failing on the way also rejects.

Trace format notes: a line's ``state`` has ``next``, ``processed``,
``committed``, ``requested``, ``unsent``, ``epoch`` and ``finished_above``
(``{}`` once the partition is no longer held). Traces written before
``requested`` was recorded (2026-11-23) are refused with a one-line usage
error: record them again. ``assign`` lines carry ``"above"`` (offsets the
sink held); ``commit_requested`` lines ``"above"`` and ``"epoch"`` of the
commit; both ``"fence"`` in exactly-once runs. A last line cut short (the
process was killed in the middle of a write) is ignored and noted in the
report; a malformed line anywhere else is a violation. One trace file is one
process: a restarted process must write a new file.

Command line::

    python -m model_checks.trace_validation [--tlc|--no-tlc] [--mode MODE] TRACE...

prints one line per trace and exits 0 if all are valid, 1 if any is not,
2 on bad usage (a missing file, a trace in the old format).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from htmqc.errors import HtmqcError, RuntimeFailure, UsageError
from model_checks.reference import ReferenceConsumer, RefError, RefPartition
from model_checks.tlc import BUILD_DIR, TLA_DIR, run_model

#: Largest trace (lines) that TLC checks by default.
TLC_MAX_LINES = 400
#: TLC's per-offset functions span 0..max offset: keep that small by default.
TLC_MAX_OFFSETS = 48
#: Events of the trace vocabulary (spec/refinement.md, lifecycle.Event values).
EVENTS = frozenset(
    {
        "assign",
        "fetched",
        "started",
        "succeeded",
        "failed",
        "retry_scheduled",
        "retry_due",
        "dead_lettered",
        "handed_off",
        "commit_requested",
        "commit_acked",
        "commit_failed",
        "revoking",
        "revoked",
        "crashed",
    }
)
_LIFECYCLE = (
    "started", "succeeded", "failed", "retry_scheduled", "retry_due", "dead_lettered", "handed_off"
)
#: The spec's retry-topic partition in a trace with hand-offs: the records it
#: receives are the spec's ``rlog``; a trace of the member does not say which
#: partition of the retry topic they went to, and need not.
_RETRY_PARTITION = "(retry topic)"
_MODES = ("at-least-once", "exactly-once")
_DEEPEST = re.compile(r'<<"deepest", (\d+)>>')
#: The fields of a recorded state (besides the three watermarks).
_STATE_KEYS = ("next", "processed", "committed", "requested", "unsent", "epoch", "finished_above")
_runs = count()


@dataclass(frozen=True)
class Line:
    """One trace line. ``state`` (next, processed, committed) is ``None`` when
    the line carries none (``revoked``, ``crashed``: the partition is no longer
    held); so are ``requested``, ``unsent``, ``epoch``. ``above`` is the
    line's own list (``assign``: held by the sink; ``commit_requested``: the
    commit's ``finished_above``), ``finished`` the state's ``finished_above``;
    ``commit_epoch`` the commit's epoch."""

    number: int
    p: str
    ev: str
    off: int | None
    state: tuple[int, int, int] | None
    above: tuple[int, ...] = ()
    requested: int | None = None
    unsent: bool | None = None
    epoch: int | None = None
    finished: tuple[int, ...] = ()
    fence: int | None = None
    commit_epoch: int | None = None

    @property
    def recorded(self) -> tuple[Any, ...]:
        """Everything the line's ``state`` recorded."""
        return (self.state, self.requested, self.unsent, self.epoch, self.finished)


@dataclass(frozen=True)
class Violation:
    """The first line the check refused, and why."""

    line: int
    event: str
    partition: str
    problem: str
    check: str = "reference"

    def text(self) -> str:
        """One human line."""
        return f"line {self.line} ({self.event} {self.partition}): {self.problem} [{self.check}]"


@dataclass
class TlcVerdict:
    """What TLC said about a trace."""

    accepted: bool
    deepest: int | None
    violated: str | None
    distinct_states: int | None
    seconds: float


@dataclass
class TraceReport:
    """The verdict on one trace file (see module docs)."""

    path: str
    lines: int
    batches: int
    partitions: list[str]
    epochs: int
    truncated_tail: bool = False
    violations: list[Violation] = field(default_factory=list)
    tlc: TlcVerdict | None = None

    @property
    def ok(self) -> bool:
        """Accepted by every check that ran."""
        return not self.violations and (self.tlc is None or self.tlc.accepted)

    def summary(self) -> str:
        """One line: the verdict and the first problem, if any."""
        checks = "reference" + (" + TLC" if self.tlc is not None else "")
        head = f"{self.path}: {self.lines} lines, {len(self.partitions)} partitions, "
        head += f"{self.epochs} epochs"
        if self.truncated_tail:
            head += " (cut-short last line ignored)"
        if self.ok:
            return f"{head}: valid ({checks})"
        return f"{head}: INVALID: {self.violations[0].text()}"

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (``ok`` included)."""
        return {**asdict(self), "ok": self.ok}


class _Reject(Exception):
    """Internal: the replay stops at the first violation."""

    def __init__(self, line: Line, problem: str) -> None:
        super().__init__(problem)
        self.violation = Violation(line.number, line.ev, line.p, problem)


# -- reading ------------------------------------------------------------------------------


class _OldFormat(ValueError):
    """A line written before the trace recorded ``requested`` and the rest."""


_Chunk = bytes | str | Mapping[str, Any]


class _Reader:
    """Parses trace lines one at a time (:meth:`lines`), so that a trace is
    validated in memory bounded by its largest batch, not its length. After
    the iteration, ``truncated`` and ``problem`` are what :func:`read_trace`
    returns beside the lines."""

    def __init__(self, name: str, *, cut_short_tail: bool) -> None:
        self.name = name
        self.cut_short_tail = cut_short_tail
        self.truncated = False
        self.problem: Violation | None = None
        self._offsets = _OffsetCache()

    def lines(self, chunks: Iterable[tuple[_Chunk, bool]]) -> Iterator[Line]:
        """Each chunk with ``last``: true for a file's final piece when it has no
        newline (a write a kill cut short); stops at the first malformed line.

        :raises UsageError: a line is in the old format.
        """
        for number, (chunk, last) in enumerate(chunks, start=1):
            if isinstance(chunk, bytes | str) and not chunk.strip():
                continue
            try:
                yield _parse(number, chunk, self._offsets)
            except _OldFormat as exc:
                raise UsageError(
                    f"trace {self.name} line {number} is in the old format ({exc})",
                    "record the trace again with this version of htmqc (--trace)",
                ) from None
            except ValueError as exc:
                if self.cut_short_tail and last:
                    self.truncated = True
                else:
                    self.problem = Violation(number, "?", "?", f"malformed line: {exc}", "format")
                return


def _file_chunks(path: str | Path) -> Iterator[tuple[bytes, bool]]:
    """A trace file's lines, read as they are needed; ``last`` marks a final
    line without its newline.

    :raises UsageError: the file cannot be opened.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the generator
    except OSError as exc:
        raise UsageError(
            f"cannot read trace {path}: {exc.strerror or exc}", "pass the file --trace wrote"
        ) from None
    with f:
        for raw in f:
            yield raw, not raw.endswith(b"\n")


def _memory_chunks(chunks: Iterable[_Chunk]) -> Iterator[tuple[_Chunk, bool]]:
    items = list(chunks)
    for k, chunk in enumerate(items, start=1):
        yield chunk, k == len(items)


def read_trace(path: str | Path) -> tuple[list[Line], bool, Violation | None]:
    """``(lines, truncated_tail, format_problem)`` of a trace file, all in memory
    (:func:`validate_trace` streams instead).

    Reading stops at the first malformed line, which becomes ``format_problem``
    (unless it is the last line and has no newline: a write cut short, ignored).

    :raises UsageError: the file cannot be read, or it is in the old format.
    """
    reader = _Reader(str(path), cut_short_tail=True)
    lines = list(reader.lines(_file_chunks(path)))
    return lines, reader.truncated, reader.problem


def parse_lines(
    chunks: Iterable[bytes | str | Mapping[str, Any]],
    *,
    name: str = "<memory>",
    cut_short_tail: bool = False,
) -> tuple[list[Line], bool, Violation | None]:
    """Trace lines (JSON texts or decoded objects) as :class:`Line` values:
    ``(lines, truncated_tail, format_problem)`` as :func:`read_trace`.

    :raises UsageError: the lines are in the old format.
    """
    reader = _Reader(name, cut_short_tail=cut_short_tail)
    lines = list(reader.lines(_memory_chunks(chunks)))
    return lines, reader.truncated, reader.problem


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}, not an offset")
    return value


def _offsets(value: Any, what: str) -> tuple[int, ...]:
    """An offset list as written (:func:`htmqc.runtime.trace.compact_offsets`):
    offsets and ``[first, last]`` runs (``first < last``), expanded in the order
    written. Order and repeats are kept for the checks downstream; traces from
    before the runs (plain offsets only) read the same."""
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    out: list[int] = []
    for item in value:
        if isinstance(item, list):
            if len(item) != 2:
                raise ValueError(f"{what} holds {item!r}, not an offset or [first, last]")
            first, last = _int(item[0], what), _int(item[1], what)
            if first >= last:
                raise ValueError(f"{what} holds the run {item!r}: its first is not below its last")
            out.extend(range(first, last + 1))
        else:
            out.append(_int(item, what))
    return tuple(out)


class _OffsetCache:
    """The last offset list read for each key, reused when a line repeats it
    (every line of a batch carries the same state): a batch then holds one
    copy of its ``finished_above``, not one per line."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, tuple[int, ...]]] = {}

    def get(self, key: str, value: Any, what: str) -> tuple[int, ...]:
        held = self._last.get(key)
        if held is not None and held[0] == value:
            return held[1]
        offsets = _offsets(value, what)
        self._last[key] = (value, offsets)
        return offsets


def _parse(
    number: int, chunk: bytes | str | Mapping[str, Any], cache: _OffsetCache | None = None
) -> Line:
    cache = cache or _OffsetCache()
    if isinstance(chunk, Mapping):
        data: Any = chunk
    else:
        try:
            data = json.loads(chunk)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    p, ev = data.get("p"), data.get("ev")
    if not isinstance(p, str) or "/" not in p:
        raise ValueError(f'"p" is {p!r}, not "topic/partition"')
    if ev not in EVENTS:
        raise ValueError(f"unknown event {ev!r}")
    off = data.get("off")
    off = None if off is None else _int(off, '"off"')
    raw_state = data.get("state")
    if not isinstance(raw_state, Mapping):
        raise ValueError('"state" is not an object')
    fields: dict[str, Any] = {}
    state = None
    if raw_state:
        if "next" in raw_state and "requested" not in raw_state:
            raise _OldFormat("its states have no requested, unsent, epoch")
        missing = [k for k in _STATE_KEYS if k not in raw_state]
        if missing:
            raise ValueError(f'"state" lacks {", ".join(missing)}')
        state = tuple(_int(raw_state[k], k) for k in ("next", "processed", "committed"))
        if not isinstance(raw_state["unsent"], bool):
            raise ValueError(f'"unsent" is {raw_state["unsent"]!r}, not true or false')
        fields = {
            "requested": _int(raw_state["requested"], "requested"),
            "unsent": raw_state["unsent"],
            "epoch": _int(raw_state["epoch"], "epoch"),
            "finished": cache.get("finished", raw_state["finished_above"], '"finished_above"'),
        }
    above = cache.get("above", data.get("above", []), '"above"')
    fence = data.get("fence")
    if fence is not None:
        fields["fence"] = _int(fence, '"fence"')
    if ev == "commit_requested":
        fields["commit_epoch"] = _int(data.get("epoch"), '"epoch"')
    return Line(number, p, ev, off, state, above, **fields)  # type: ignore[arg-type]


def batches(lines: Iterable[Line]) -> list[list[Line]]:
    """Consecutive lines of one partition, event and recorded state: one batch
    (the runtime writes a batch event as one line per offset, each with the
    state after the whole batch). ``assign``, ``revoked``, ``crashed``,
    ``commit_*`` lines stand alone."""
    return list(iter_batches(lines))


def iter_batches(lines: Iterable[Line]) -> Iterator[list[Line]]:
    """:func:`batches`, one at a time: each is yielded once the line after it
    (or the end) shows it complete."""
    alone = (
        "assign", "revoked", "crashed", "commit_requested", "commit_acked", "commit_failed",
        "revoking",
    )
    current: list[Line] = []
    for line in lines:
        last = current[-1] if current else None
        if (
            last is not None
            and line.ev not in alone
            and (last.p, last.ev, last.recorded) == (line.p, line.ev, line.recorded)
        ):
            current.append(line)
        else:
            if current:
                yield current
            current = [line]
    if current:
        yield current


def fetched_offsets(offsets: list[int], end: int) -> list[int]:
    """The offsets a fetched batch of lines with these ``off`` values and state
    ``next == end`` lists: none for a gap report (``fetched([], end)`` is written
    as one line whose offset is ``end``), else all of them, as written."""
    return [] if offsets == [end] else offsets


def _tp(name: str) -> tuple[str, int]:
    topic, _, part = name.rpartition("/")
    return (topic, int(part)) if part.isdigit() else (name, -1)


# -- 1. reference replay ------------------------------------------------------------------


class _Replay:
    """Replays batches through the reference model (see module docs)."""

    def __init__(self) -> None:
        self.ref = ReferenceConsumer(max_retries=1 << 30)
        self.acked: dict[str, int] = {}
        self.crashed: set[str] = set()
        self.assignments = 0
        #: The last recorded state of each held partition (this epoch).
        self.last: dict[str, tuple[int, int, int]] = {}
        #: The fence token of each partition's last claim, and of its current one.
        self.fences: dict[str, int] = {}
        self.fence: dict[str, int | None] = {}
        #: The last line of each partition (a final commit must follow its request).
        self.previous: dict[str, Line] = {}

    def part(self, line: Line) -> RefPartition:
        part = self.ref.parts.get(_tp(line.p))
        if part is None:
            raise _Reject(
                line,
                "event for a partition this member does not hold "
                "(after its epoch ended: a stale-epoch effect)",
            )
        return part

    def batch(self, batch: list[Line]) -> None:
        first = batch[0]
        ev = first.ev
        try:
            if ev == "assign":
                self.assign(first)
            elif ev == "fetched":
                self.fetched(batch)
            elif ev in _LIFECYCLE:
                part = self.part(first)
                offsets = [_need_off(x) for x in batch]
                self.ref.event(ev, _tp(first.p), part.epoch, offsets)
            elif ev == "commit_requested":
                self.commit_requested(first)
            elif ev in ("commit_acked", "commit_failed"):
                self.commit(first)
            elif ev == "revoking":
                self.part(first)
                self.ref.revoking(_tp(first.p))
            elif ev == "revoked":
                self.revoked(first)
            elif ev == "crashed":
                if _tp(first.p) in self.ref.parts:
                    self.crashed = {f"{t}/{p}" for t, p in self.ref.parts}
                    self.ref.crashed()
                elif first.p not in self.crashed:
                    raise _Reject(first, "crash of a partition this member did not hold")
        except RefError as exc:
            raise _Reject(batch[-1], f"the model refuses it: {exc}") from None
        self.compare(batch[-1])
        self.previous[first.p] = batch[-1]

    def assign(self, line: Line) -> None:
        committed = _need_off(line)
        floor = self.acked.get(line.p, 0)
        if committed < floor:
            raise _Reject(
                line,
                f"committed offset moved backwards: assigned at {committed}, "
                f"but {floor} was acked before",
            )
        tp = _tp(line.p)
        if tp in self.ref.parts:
            raise _Reject(line, "assigned while already held")
        if line.fence is not None:
            last = self.fences.get(line.p)
            if last is not None and line.fence <= last:
                raise _Reject(
                    line, f"claim got fence {line.fence}, not above the last claim's {last}"
                )
            self.fences[line.p] = line.fence
        self.fence[line.p] = line.fence
        if list(line.above) != sorted(set(line.above)):
            raise _Reject(line, f"assign carries above {list(line.above)}, not in increasing order")
        self.ref.assign(tp, committed, line.above)
        self.last.pop(line.p, None)
        self.assignments += 1
        self.crashed.discard(line.p)

    def fetched(self, batch: list[Line]) -> None:
        first = batch[0]
        part = self.part(first)
        if first.state is None:
            raise _Reject(first, "fetched without a state")
        end = first.state[0]
        offsets = fetched_offsets([_need_off(x) for x in batch], end)
        if any(o >= end for o in offsets):
            raise _Reject(first, f"fetched offsets {offsets} reach past next={end}")
        if end <= part.next:
            raise _Reject(first, f"fetched does not move next ({part.next} -> {end})")
        self.ref.fetched(_tp(first.p), part.epoch, offsets, end)

    def commit_requested(self, line: Line) -> None:
        part = self.part(line)
        above = part.observe()["finished_above"]
        off = self.ref.commit_requested(_tp(line.p))
        if off is None:
            raise _Reject(line, "commit requested with nothing finished since the last request")
        if line.off != off:
            raise _Reject(line, f"commit hands out {line.off}, the watermark is {off}")
        if list(line.above) != above:
            raise _Reject(
                line, f"commit carries finished_above {list(line.above)}, the model {above}"
            )
        if line.commit_epoch != part.epoch:
            raise _Reject(
                line, f"commit of epoch {line.commit_epoch}, the assignment's is {part.epoch}"
            )
        fence = self.fence.get(line.p)
        if line.fence is not None and fence is not None and line.fence != fence:
            raise _Reject(line, f"commit carries fence {line.fence}, the claim got {fence}")

    def commit(self, line: Line) -> None:
        part = self.part(line)
        off = _need_off(line)
        watermark = part.processed()
        if off > watermark:
            raise _Reject(line, f"commit {off} beyond the watermark (processed={watermark})")
        if line.ev == "commit_failed":
            self.ref.commit_failed(_tp(line.p), part.epoch, off)
            return
        if not self.ref.commit_acked(_tp(line.p), part.epoch, off):
            raise _Reject(line, f"ack of {off} does not move committed={part.committed}")
        self.acked[line.p] = max(self.acked.get(line.p, 0), off)

    def revoked(self, line: Line) -> None:
        part = self.part(line)
        if line.off is not None:
            if line.off != part.processed():
                raise _Reject(
                    line, f"final commit {line.off} is not the watermark {part.processed()}"
                )
            before = self.previous.get(line.p)
            if before is None or (before.ev, before.off) != ("commit_requested", line.off):
                raise _Reject(line, f"final commit {line.off} without its commit_requested line")
        elif self.ref.commit_requested(_tp(line.p)) is not None:
            raise _Reject(line, "revoked without the final commit the model hands out")
        self.ref.parts.pop(_tp(line.p))

    def compare(self, line: Line) -> None:
        part = self.ref.parts.get(_tp(line.p))
        if line.state is None:
            if part is not None:
                raise _Reject(line, "the line carries no state but the partition is held")
            return
        nxt, processed, committed = line.state
        if not committed <= processed <= nxt:
            raise _Reject(
                line,
                f"invariant committed <= processed <= next broken "
                f"({committed}, {processed}, {nxt})",
            )
        if part is None:
            raise _Reject(line, "the line carries a state but the partition is not held")
        before = self.last.get(line.p)
        if before is not None:
            names = ("next", "processed", "committed")
            for name, old, new in zip(names, before, line.state, strict=True):
                if new < old:
                    raise _Reject(line, f"{name} went backwards within an epoch ({old} -> {new})")
        self.last[line.p] = line.state
        model = (part.next, part.processed(), part.committed)
        if model != line.state:
            raise _Reject(
                line,
                "recorded state (next, processed, committed) = "
                f"{line.state} but the model has {model}",
            )
        observed = part.observe()
        recorded = {
            "requested": line.requested,
            "unsent": line.unsent,
            "epoch": line.epoch,
            "finished_above": list(line.finished),
        }
        for name, value in recorded.items():
            expected = part.unsent if name == "unsent" else observed[name]
            if value != expected:
                raise _Reject(line, f"recorded {name} {value!r} but the model has {expected!r}")
        _prune(part, model[1])


def _need_off(line: Line) -> int:
    if line.off is None:
        raise _Reject(line, '"off" is missing')
    return line.off


def _prune(part: RefPartition, processed: int) -> None:
    """Forget finished offsets below the watermark (they can never change again:
    any later event on them is refused either way). Keeps replay linear."""
    states = part.states
    if len(states) < 64:
        return
    for o in [o for o in states if o < processed]:
        del states[o]
        part.failures.pop(o, None)


def replay_reference(lines: Iterable[Line]) -> tuple[Violation | None, int, int]:
    """Replay ``lines`` through the reference model: ``(first violation or None,
    batches, assignments)``. Reads ``lines`` once, to the end (the batches are
    all counted); the replay stops at the first violation."""
    replay = _Replay()
    violation: Violation | None = None
    n = 0
    for batch in iter_batches(lines):
        n += 1
        if violation is None:
            try:
                replay.batch(batch)
            except _Reject as exc:
                violation = exc.violation
    return violation, n, replay.assignments


# -- 2. TLC ---------------------------------------------------------------------------------


def _tla_set(values: Any) -> str:
    return "{" + ", ".join(str(v) for v in sorted(values)) + "}"


def _tla_seq(values: Sequence[int]) -> str:
    """A line's offset list as written (order and repeats kept: the spec checks
    them, see ``Lists`` in TraceConsumer.tla)."""
    return "<<" + ", ".join(str(v) for v in values) + ">>"


def _tla_fun(mapping: dict[str, str]) -> str:
    return " @@ ".join(f"({json.dumps(k)} :> {v})" for k, v in sorted(mapping.items()))


def tla_module(lines: Sequence[Line], mode: str, name: str = "TraceRun") -> tuple[str, str]:
    """``(module text, cfg text)``: the trace as constants for TraceConsumer.tla.

    Every trace line becomes one record of ``Trace``, except a fetched batch,
    which is one record (the spec's ``Fetched`` covers a range in one step).
    A record's offset lists (``offs``, ``fa``, ``above``) are TLA+ sequences
    holding exactly what the lines wrote, so that a repeated or misordered
    offset reaches the spec instead of vanishing into a set.
    """
    if mode not in _MODES:
        raise UsageError(f"unknown mode {mode!r}", f"use one of {', '.join(_MODES)}")
    handoffs = sum(1 for x in lines if x.ev == "handed_off")
    parts = sorted({x.p for x in lines} | ({_RETRY_PARTITION} if handoffs else set()))
    log: dict[str, set[int]] = {p: set() for p in parts}
    end: dict[str, int] = {p: 0 for p in parts}
    start: dict[str, int] = {}
    start_above: dict[str, tuple[int, ...]] = {}
    first_fence: dict[str, int] = {}
    assigns: dict[str, int] = {p: 0 for p in parts}
    fails: dict[tuple[str, int, int], int] = {}
    records: list[str] = []
    highest = 0
    for batch in batches(lines):
        first = batch[0]
        p = first.p
        if first.state is not None:
            end[p] = max(end[p], first.state[0])
        for x in batch:
            if x.off is not None:
                highest = max(highest, x.off)
            highest = max([highest, *x.above, *x.finished])
        if first.ev == "assign":
            assigns[p] += 1
            if p not in start:
                start[p], start_above[p] = first.off or 0, first.above
            if p not in first_fence and first.fence is not None:
                first_fence[p] = first.fence
        elif first.ev == "failed":
            for x in batch:
                key = (p, assigns[p], x.off or 0)
                fails[key] = fails.get(key, 0) + 1
        if first.ev == "fetched":
            nxt = first.state[0] if first.state else 0
            offs = fetched_offsets([-1 if x.off is None else x.off for x in batch], nxt)
            log[p].update(o for o in offs if 0 <= o < nxt)
            records.append(_record(batch[-1], offs, check=True))
        else:
            for k, x in enumerate(batch):
                records.append(_record(x, [], check=k == len(batch) - 1))
    max_end = max([highest + 1, *end.values(), *start.values(), 1])
    for p in parts:
        end[p] = max([end[p], start.get(p, 0), *(o + 1 for o in start_above.get(p, ()))])
    module = "\n".join(
        [
            f"---- MODULE {name} ----",
            "\\* Generated by model_checks/trace_validation.py from one trace: do not edit.",
            "EXTENDS TraceConsumer",
            f"RunPartitions == {{{', '.join(json.dumps(p) for p in parts)}}}",
            f"RunLog == {_tla_fun({p: _tla_set(log[p]) for p in parts})}",
            f"RunEnd == {_tla_fun({p: str(end[p]) for p in parts})}",
            f"RunStart == {_tla_fun({p: str(start.get(p, 0)) for p in parts})}",
            f"RunStartAbove == {_tla_fun({p: _tla_set(start_above.get(p, ())) for p in parts})}",
            f"RunFirstFence == {_tla_fun({p: str(first_fence.get(p, 0)) for p in parts})}",
            f"RunRetryPartition == {json.dumps(_RETRY_PARTITION)}",
            "RunTrace == <<",
            ",\n".join(records),
            ">>",
            f"\\* MaxEnd = {max_end}",
            "====",
            "",
        ]
    )
    crashes = sum(1 for x in lines if x.ev == "crashed")
    top_fence = max([0, *(x.fence for x in lines if x.fence is not None)])
    cfg = "\n".join(
        [
            "\\* Generated by model_checks/trace_validation.py: trace validation of one trace.",
            "CONSTANTS",
            "    Partitions <- RunPartitions",
            "    Log <- RunLog",
            "    End <- RunEnd",
            "    Start <- RunStart",
            "    StartAbove <- RunStartAbove",
            "    FirstFence <- RunFirstFence",
            "    Trace <- RunTrace",
            "    Members = {m1}",
            "    M = m1",
            "    NoMember = NoMember",
            f"    Workers = {len({(x.p, x.off) for x in lines if x.ev == 'started'}) + 1}",
            f"    MaxRetries = {max([0, *fails.values()])}",
            f"    MaxEpoch = {max([max([0, *assigns.values()]) + 1, top_fence])}",
            f"    MaxCrashes = {crashes}",
            f"    MaxExpiries = {sum(1 for x in lines if x.ev == 'revoked')}",
            "    TransientFailures = TRUE",
            f'    MODE = "{mode}"',
            "    FENCE = TRUE",
            "    EPOCH_CHECK = TRUE",
            "    COMMIT_NEXT = FALSE",
            "    FORGET_SKIP = FALSE",
            "    RECLAIM = TRUE",
            "    EXPLICIT_PAUSE = TRUE",
            "    MaxRaces = 0",
            "    MaxTrips = 0",
            "    FlowWindow = 0",
            f"    RetryTopic = {'TRUE' if handoffs else 'FALSE'}",
            f"    RetryPartition {'<- RunRetryPartition' if handoffs else '= NoRetry'}",
            f"    RetryCap = {handoffs}",
            '    FailureFacts = {"too_large", "poison", "permanent"'
            + (', "long"}' if handoffs else "}"),
            "INIT TraceInit",
            "NEXT TraceNext",
            "INVARIANTS TraceUnmatched TypeOK OffsetOrder WorkTagged NoLoss"
            + (" NoDuplicateEffect" if mode == "exactly-once" else ""),
            "PROPERTY CommittedMonotonic",
            "",
        ]
    )
    return module, cfg


def _record(line: Line, offs: list[int], *, check: bool) -> str:
    nxt, processed, committed = line.state if line.state is not None else (0, 0, 0)
    epoch = line.commit_epoch if line.ev == "commit_requested" else line.epoch
    return (
        f'[ev |-> "{line.ev}", p |-> {json.dumps(line.p)}, '
        f"off |-> {-1 if line.off is None else line.off}, offs |-> {_tla_seq(offs)}, "
        f"check |-> {'TRUE' if check else 'FALSE'}, "
        f"held |-> {'TRUE' if line.state is not None else 'FALSE'}, "
        f"next |-> {nxt}, processed |-> {processed}, committed |-> {committed}, "
        f"requested |-> {line.requested or 0}, "
        f"unsent |-> {'TRUE' if line.unsent else 'FALSE'}, "
        f"fa |-> {_tla_seq(line.finished)}, epoch |-> {epoch or 0}, "
        f"above |-> {_tla_seq(line.above)}, "
        f"fence |-> {-1 if line.fence is None else line.fence}]"
    )


def tlc_fits(lines: Sequence[Line]) -> bool:
    """Small enough for TLC by default (:data:`TLC_MAX_LINES`, :data:`TLC_MAX_OFFSETS`)."""
    if len(lines) > TLC_MAX_LINES:
        return False
    top = max(
        [0, *(x.off or 0 for x in lines), *(x.state[0] for x in lines if x.state is not None)]
    )
    return top < TLC_MAX_OFFSETS


def check_with_tlc(
    lines: Sequence[Line], mode: str = "at-least-once", *, timeout: float = 300.0
) -> TlcVerdict:
    """Run TLC on the trace (see module docs) in a fresh directory under
    ``build/tlc/trace/``; return its verdict.

    :raises RuntimeFailure: TLC could not run or failed to parse the model.
    """
    model = f"trace_{os.getpid()}_{next(_runs)}"
    workdir = BUILD_DIR / "trace" / model
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    for spec in ("Consumer.tla", "TraceConsumer.tla"):
        shutil.copyfile(TLA_DIR / spec, workdir / spec)
    module, cfg = tla_module(lines, mode)
    (workdir / "TraceRun.tla").write_text(module)
    (workdir / "TraceRun.cfg").write_text(cfg)
    result = run_model(model, "TraceRun.tla", "TraceRun.cfg", tla_dir=workdir, timeout=timeout)
    log_path = BUILD_DIR / "logs" / f"{model}.log"
    output = log_path.read_text() if log_path.is_file() else ""
    deepest = max((int(n) for n in _DEEPEST.findall(output)), default=0)
    if result.violated == "timeout" or (result.errors and result.violated is None):
        raise RuntimeFailure(
            f"TLC could not check the trace: {(result.errors or ['timeout'])[0].splitlines()[0]}",
            f"see {log_path} and {workdir}",
        )
    shutil.rmtree(workdir, ignore_errors=True)
    log_path.unlink(missing_ok=True)
    return TlcVerdict(
        accepted=result.violated == "TraceUnmatched",
        deepest=deepest,
        violated=None if result.violated == "TraceUnmatched" else result.violated,
        distinct_states=result.distinct_states,
        seconds=result.seconds,
    )


def _record_lines(lines: Sequence[Line]) -> list[Line]:
    """The trace line behind each record of ``Trace`` (see :func:`tla_module`)."""
    out: list[Line] = []
    for batch in batches(lines):
        out.extend(batch[:1] if batch[0].ev == "fetched" else batch)
    return out


def _tlc_violation(lines: Sequence[Line], verdict: TlcVerdict) -> Violation:
    records = _record_lines(lines)
    at = records[min(verdict.deepest or 0, len(records) - 1)]
    if verdict.violated:
        problem = f"the spec's {verdict.violated} fails along the trace (TLC)"
    else:
        problem = "no behaviour of Consumer.tla takes this step (TLC)"
    return Violation(at.number, at.ev, at.p, problem, "tlc")


# -- entry points ---------------------------------------------------------------------------


def validate_trace(
    path: str | Path, *, tlc: bool | None = None, mode: str = "at-least-once"
) -> TraceReport:
    """Validate one trace file (see module docs).

    ``tlc``: ``None`` runs TLC only on small traces (:func:`tlc_fits`), ``True``
    always, ``False`` never. ``mode`` is the run's delivery mode (it decides
    the spec's MODE for TLC).

    :raises UsageError: the file cannot be read, is in the old format, or
        ``mode`` is unknown.
    :raises RuntimeFailure: TLC was asked for and could not run.
    """
    _check_mode(mode)
    reader = _Reader(str(path), cut_short_tail=True)
    return _validate(str(path), reader, reader.lines(_file_chunks(path)), tlc, mode)


def validate_lines(
    lines: Iterable[str | bytes | Mapping[str, Any]],
    *,
    tlc: bool | None = False,
    mode: str = "at-least-once",
    name: str = "<memory>",
) -> TraceReport:
    """Validate trace lines held in memory: JSON texts (as
    :class:`~htmqc.runtime.trace.TracingCore` writes them) or decoded objects.
    The checks and the report are :func:`validate_trace`'s; TLC runs only when
    asked (``tlc=True``, or ``None`` for small traces), since it takes seconds.

    :raises UsageError: the lines are in the old format, or ``mode`` is unknown.
    :raises RuntimeFailure: TLC was asked for and could not run.
    """
    _check_mode(mode)
    reader = _Reader(name, cut_short_tail=False)
    return _validate(name, reader, reader.lines(_memory_chunks(lines)), tlc, mode)


def _check_mode(mode: str) -> None:
    if mode not in _MODES:
        raise UsageError(f"unknown mode {mode!r}", f"use one of {', '.join(_MODES)}")


class _Tally:
    """Counts the lines passing through it, their partitions, and keeps the
    first ones for TLC (all of them when ``keep_all``)."""

    def __init__(self, keep_all: bool) -> None:
        self.count = 0
        self.partitions: set[str] = set()
        self.kept: list[Line] = []
        self._keep_all = keep_all

    def through(self, lines: Iterable[Line]) -> Iterator[Line]:
        for line in lines:
            self.count += 1
            self.partitions.add(line.p)
            if self._keep_all or self.count <= TLC_MAX_LINES + 1:
                self.kept.append(line)
            yield line


def _validate(
    name: str, reader: _Reader, lines: Iterable[Line], tlc: bool | None, mode: str
) -> TraceReport:
    """Replay the lines as they are read; TLC on the kept ones when asked or
    when the whole trace is small (:func:`tlc_fits`)."""
    tally = _Tally(keep_all=tlc is True)
    violation, n_batches, epochs = replay_reference(tally.through(lines))
    report = TraceReport(
        path=name,
        lines=tally.count,
        batches=n_batches,
        partitions=sorted(tally.partitions),
        epochs=epochs,
        truncated_tail=reader.truncated,
    )
    problem = reader.problem
    if problem is not None:
        report.violations.append(problem)
    elif violation is not None:
        report.violations.append(violation)
    kept = tally.kept
    if problem is None and kept and (tlc or (tlc is None and tlc_fits(kept))):
        report.tlc = check_with_tlc(kept, mode)
        if not report.tlc.accepted and not report.violations:
            report.violations.append(_tlc_violation(kept, report.tlc))
    return report


def validate_traces(
    paths: Sequence[str | Path], *, tlc: bool | None = None, mode: str = "at-least-once"
) -> list[TraceReport]:
    """:func:`validate_trace` for each path."""
    return [validate_trace(p, tlc=tlc, mode=mode) for p in paths]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see module docs)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_checks.trace_validation",
        description="Validate htmqc --trace files against the reference model and TLA+ spec.",
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--tlc",
        dest="tlc",
        action="store_true",
        default=None,
        help="always run TLC (default: only for small traces)",
    )
    group.add_argument("--no-tlc", dest="tlc", action="store_false", help="reference replay only")
    parser.add_argument("--mode", choices=_MODES, default="at-least-once")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = parser.parse_args(argv)
    try:
        reports = validate_traces(args.traces, tlc=args.tlc, mode=args.mode)
    except HtmqcError as exc:
        print(f"trace_validation: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        for report in reports:
            print(report.summary())
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
