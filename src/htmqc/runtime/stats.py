"""What the loop counts: in-flight figures, finished messages, the flow
interval, poll gaps, and the metrics it pushes (all on the poll thread).

Observability reads these (``/state.json`` ``extra``, tests, benchmarks);
nothing here steers the loop except through :class:`~htmqc.core.flow.FlowWindow`,
which sees :meth:`Stats.take_interval` once a second.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from htmqc.runtime.lanes import Done

if TYPE_CHECKING:
    from htmqc.observe.metrics import Metrics


class Stats:
    """The loop's counters (see module docs)."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics
        #: Fetched, started, unfinished messages, and their value bytes.
        self.in_flight = 0
        self.in_flight_bytes = 0
        #: Highest in-flight message count and bytes seen (tests, benchmarks).
        self.peak_in_flight = 0
        self.peak_in_flight_bytes = 0
        self.finished = 0
        self.received = 0
        #: Rebalance callbacks that gave this member partitions (tests: no rebalance storm).
        self.assignments = 0
        self.dlq_counts: dict[str, int] = {}
        #: Messages moved to the retry topic.
        self.retries_forwarded = 0
        #: Fetched batches cut short because the offsets finished out of order could
        #: outgrow the commit metadata (:mod:`htmqc.core.metadata_budget`).
        self.throttled = 0
        #: Longest time between two ``consume`` calls, seconds (from the loop's clock).
        self.max_poll_gap = 0.0
        self._last_poll: float | None = None
        #: Clock when the first message arrived, and when the loop stopped (benchmarks).
        self.first_message_at: float | None = None
        self.stopped_at: float | None = None
        self._iv_done = 0
        self._iv_errors = 0
        self._iv_elapsed = 0.0
        #: Timed reports not yet in the histograms (:meth:`flush_metrics`).
        self._timed: list[Done] = []

    def polled(self, now: float) -> None:
        """A ``consume`` call starts at ``now``."""
        last = self._last_poll
        if last is not None and now - last > self.max_poll_gap:
            self.max_poll_gap = now - last
        self._last_poll = now

    def started(self, count: int, nbytes: int) -> None:
        """``count`` messages of ``nbytes`` value bytes were handed to workers."""
        self.in_flight += count
        self.in_flight_bytes += nbytes
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        if self.in_flight_bytes > self.peak_in_flight_bytes:
            self.peak_in_flight_bytes = self.in_flight_bytes

    def let_go(self, count: int, nbytes: int) -> None:
        """``count`` in-flight messages were dropped unfinished (revoke, fence)."""
        self.in_flight -= count
        self.in_flight_bytes -= nbytes

    def succeeded(self, tp: tuple[str, int], done: Done) -> None:
        """A run of messages finished successfully."""
        n = len(done.offsets)
        self.in_flight -= n
        self.in_flight_bytes -= done.nbytes
        self.finished += n
        self._iv_done += n
        self._iv_elapsed += done.elapsed
        if self.metrics is not None:
            self.metrics.processed(tp[0], tp[1], "succeeded", n)
            if done.ticks:
                self._timed.append(done)

    def failed(self, tp: tuple[str, int]) -> None:
        """One handler call failed."""
        self._iv_errors += 1
        self._iv_done += 1
        if self.metrics is not None:
            self.metrics.processed(tp[0], tp[1], "failed")

    def left(self, nbytes: int) -> None:
        """One message finished without an effect (dead letter, retry topic)."""
        self.in_flight -= 1
        self.in_flight_bytes -= nbytes
        self.finished += 1

    def dead_lettered(self, tp: tuple[str, int], kind: str) -> None:
        """One dead letter of ``kind`` was written."""
        self.dlq_counts[kind] = self.dlq_counts.get(kind, 0) + 1
        if self.metrics is not None:
            self.metrics.processed(tp[0], tp[1], "dead_lettered")
            self.metrics.dead_lettered(kind)

    def take_interval(self) -> tuple[int, int, float]:
        """Completions, failures and handler seconds since the last call."""
        out = (self._iv_done, self._iv_errors, self._iv_elapsed)
        self._iv_done = self._iv_errors = 0
        self._iv_elapsed = 0.0
        return out

    def flush_metrics(self) -> None:
        """Put the latencies of the timed reports into the histograms, all at once
        (a histogram update has a fixed cost, so it is paid per turn, not per run)."""
        timed, self._timed = self._timed, []
        m = self.metrics
        if m is None or not timed:
            return
        stamps: list[float] = []
        histogram = m.processing_latency
        for done in timed:
            if done.ticks:
                histogram.observe_ticks(done.ticks)
            if done.stamps_ms:
                stamps += done.stamps_ms
        if stamps:
            m.observe_end_to_end(time.time(), stamps)
