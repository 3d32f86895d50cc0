"""``htmqc replay``: feed a segment through the runtime, offline and deterministic.

:func:`replay` runs the same :class:`~htmqc.runtime.Engine` as ``htmqc run``,
with a :class:`~htmqc.replay.consumer.SegmentConsumer` in place of the Kafka
consumer, so the handler sees the captured records in the captured order and
the same sinks store their effects. What makes two replays of one segment
identical (same handler calls, same trace lines, same effects):

* the engine's clock is a :class:`VirtualClock` that advances a fixed tick per
  reading, so commit and transaction timing depend only on the work done;
* handlers run on the poll thread (``workers = 1``, no thread pool), with the
  fixed flow window (``--flow fixed``) and without the engine's time slice
  between polls (the whole backlog runs before the next poll);
* retry delays are zero (a retry runs at the next turn of the loop), since
  wall-clock backoff would make the interleaving depend on the machine;
* ``--faults SEED``: handler exceptions from a seeded
  :class:`~htmqc.replay.faults.FaultSchedule`.

At-least-once dead letters are kept in memory (:class:`LocalDeadLetters`; no
broker is needed) and reported; exactly-once ones go into the sink, as in a
live run. The replay ends when the segment is served and the engine has been
idle for a short virtual while.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError
from htmqc.progress import progress as show_progress
from htmqc.replay.consumer import SegmentConsumer
from htmqc.replay.faults import FaultSchedule
from htmqc.replay.segment import SegmentReader
from htmqc.runtime.engine import Engine
from htmqc.runtime.options import EXACTLY_ONCE, MODES, RunOptions

#: Seconds the virtual clock advances per reading.
TICK = 0.001
#: Virtual seconds of idleness after which a finished replay stops.
IDLE_EXIT = 0.5


class VirtualClock:
    """A clock that advances ``tick`` seconds each time it is read."""

    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return self.readings * self.tick


class ReplayEngine(Engine):
    """The runtime engine, running the whole backlog between two polls."""

    def run_backlog(self, budget: float = math.inf) -> None:
        super().run_backlog(budget)


class LocalDeadLetters:
    """The dead-letter producer of an offline replay: keeps the records."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, list[Any]]] = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[Any] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self.records.append((topic, key, value, list(headers or [])))
        if on_delivery is not None:
            on_delivery(None, None)

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def sources(self) -> list[str]:
        """``topic/partition/offset`` of each dead-lettered record, in order."""
        out = []
        for _topic, _key, _value, headers in self.records:
            for name, raw in headers:
                if name == "htmqc-dlq-source" and raw is not None:
                    out.append(bytes(raw).decode())
        return out


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
        batch_size=batch_size,
    )
    dead = LocalDeadLetters()
    started = time.perf_counter()
    try:
        with show_progress(len(reader), "replayed", enabled=progress) as advance:
            consumer = SegmentConsumer(reader, on_progress=advance)
            engine = ReplayEngine(
                handler,
                options,
                consumer,
                sink=opened,
                producer_factory=lambda: dead,
                clock=VirtualClock(),
                seed=faults or 0,
            )
            consumer.on_commit = engine.on_commit
            finished = engine.run(install_signals=False)
    finally:
        reader.close()
        if opened is not None and hasattr(opened, "close"):
            opened.close()
    return ReplayReport(
        path=str(path),
        records=len(reader),
        delivered=consumer.delivered,
        finished=finished,
        seconds=round(time.perf_counter() - started, 3),
        faults_scheduled=len(schedule.failures) if schedule else 0,
        faults_injected=schedule.injected if schedule else 0,
        dead_letters=dead.sources(),
        trace=trace,
    )
