"""``htmqc replay``: feed a segment through the runtime, offline and deterministic.

:func:`replay` runs the same :class:`~htmqc.runtime.Engine` as ``htmqc run``,
with a :class:`~htmqc.testing.FakeConsumer` serving the segment in place of the
Kafka consumer (:func:`segment_consumer`: in file order, a paused partition's
next record ends a batch instead of being skipped), so the handler sees the
captured records in the captured order and the same sinks store their effects.
What makes two replays of one segment identical (same handler calls, same
trace lines, same effects):

* the engine's one clock is a :class:`VirtualClock` that advances a fixed tick
  per reading (wall time too), so commit and transaction timing depend only on
  the work done (``txn_ms`` ends a transaction in virtual time too: the
  exactly-once worker reads the same clock);
* one worker (``workers = 1``), the fixed flow window (``--flow fixed``), and
  the engine in lockstep: after each turn it waits until the worker is idle,
  so every event comes in an order that is a function of the input;
* retry delays are zero (a retry runs at the next turn of the loop), since
  wall-clock backoff would make the interleaving depend on the machine;
* ``--faults SEED``: handler exceptions from a seeded
  :class:`~htmqc.replay.faults.FaultSchedule`.

At-least-once dead letters are kept in memory (a
:class:`~htmqc.testing.FakeProducer`; no broker is needed) and reported;
exactly-once ones go into the sink, as in a live run. The replay ends when the
segment is served and the engine has been idle for a short virtual while.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError
from htmqc.progress import progress as show_progress
from htmqc.replay.faults import FaultSchedule
from htmqc.replay.segment import SegmentReader
from htmqc.runtime.loop import Engine
from htmqc.runtime.options import EXACTLY_ONCE, MODES, RunOptions
from htmqc.testing import FakeConsumer, FakeProducer

#: Seconds the virtual clock advances per reading.
TICK = 0.001
#: Virtual seconds of idleness after which a finished replay stops.
IDLE_EXIT = 0.5


#: Unix seconds the virtual wall clock starts at (2026-01-01).
WALL_START = 1_767_225_600.0


class VirtualClock:
    """A :class:`~htmqc.ports.Clock` that advances ``tick`` seconds each time it
    is read (monotonic and wall alike; thread-safe)."""

    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self.readings = 0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        """The next reading."""
        with self._lock:
            self.readings += 1
            return self.readings * self.tick

    def wall(self) -> float:
        """The next reading, as unix seconds from :data:`WALL_START`."""
        return WALL_START + self.monotonic()


def segment_consumer(
    reader: SegmentReader, on_progress: Callable[[int], None] | None = None
) -> FakeConsumer:
    """A consumer serving ``reader``'s records in file order (module docs)."""
    return FakeConsumer(
        reader,
        ranges={tp: (r.start, r.end) for tp, r in reader.ranges.items()},
        strict=True,
        idle_sleep=0.0,
        on_progress=on_progress,
    )


@dataclass
class ReplayReport:
    """What a replay did."""

    path: str
    records: int
    delivered: int
    finished: int
    seconds: float
    faults_scheduled: int = 0
    faults_injected: int = 0
    dead_letters: list[str] = field(default_factory=list)
    trace: str | None = None

    def summary(self) -> str:
        """One line for the terminal."""
        line = (
            f"replayed {self.delivered} of {self.records} records from {self.path} in "
            f"{self.seconds:.2f}s: {self.finished} finished"
        )
        if self.faults_scheduled:
            line += f", {self.faults_injected} injected faults on {self.faults_scheduled} records"
        if self.dead_letters:
            line += f", {len(self.dead_letters)} dead-lettered (in memory)"
        if self.trace:
            line += f"; trace in {self.trace}"
        return line


def replay(
    path: str | Path,
    handler: Callable[..., Any],
    *,
    mode: str = "at-least-once",
    sink: str | None = None,
    group: str = "htmqc-replay",
    faults: int | None = None,
    fault_rate: float = 0.02,
    max_failures: int = 4,
    trace: str | None = None,
    max_retries: int = 3,
    txn_messages: int = 1000,
    txn_ms: float = 100.0,
    batch_size: int = 500,
    progress: bool = False,
) -> ReplayReport:
    """Replay the segment at ``path`` through ``handler`` (see module docs).

    :raises SegmentError: the segment is corrupt or truncated (nothing ran).
    :raises UsageError: bad mode, no sink in exactly-once mode, several topics.
    """
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    if mode == EXACTLY_ONCE and not sink:
        raise UsageError("exactly-once needs a sink", "pass --sink sqlite:///PATH")
    reader = SegmentReader(path)
    topics = sorted({t for t, _ in reader.ranges})
    if len(topics) != 1:
        reader.close()
        raise UsageError(
            f"segment {path} holds {len(topics)} topics, replay takes one",
            "capture one topic per segment",
        )
    schedule = None
    if faults is not None:
        schedule = FaultSchedule.build(faults, len(reader), fault_rate, max_failures)
        handler = schedule.wrap(handler)
    opened = None
    if sink:
        from htmqc.sinks import open_sink

        opened = open_sink(sink)
        opened.open(group)
    options = RunOptions(
        bootstrap=f"segment:{path}",
        topic=topics[0],
        group=group,
        mode=mode,
        sink=sink,
        workers=1,
        flow="fixed",
        trace=trace,
        idle_exit=IDLE_EXIT,
        max_retries=max_retries,
        backoff_ms=0.0,
        backoff_max_ms=0.0,
        txn_messages=txn_messages,
        txn_ms=txn_ms,
        batch_size=batch_size,
    )
    dead = FakeProducer()
    started = time.perf_counter()
    try:
        with show_progress(len(reader), "replayed", enabled=progress) as advance:
            consumer = segment_consumer(reader, on_progress=advance)
            engine = Engine(
                handler,
                options,
                consumer,
                sink=opened,
                producer_factory=lambda: dead,
                clock=VirtualClock(),
                seed=faults or 0,
                lockstep=True,
            )
            consumer.on_commit = engine.on_commit
            finished = engine.run(install_signals=False)
    finally:
        reader.close()
        if opened is not None:
            opened.close()
    return ReplayReport(
        path=str(path),
        records=len(reader),
        delivered=consumer.delivered,
        finished=finished,
        seconds=round(time.perf_counter() - started, 3),
        faults_scheduled=len(schedule.failures) if schedule else 0,
        faults_injected=schedule.injected if schedule else 0,
        dead_letters=dead.header_values("htmqc-dlq-source"),
        trace=trace,
    )
