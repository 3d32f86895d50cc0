"""Prometheus metrics for a consumer, cheap enough for the hot path.

Theory of operation
-------------------
A :class:`Metrics` object owns its own :class:`~prometheus_client.CollectorRegistry`
(never the global default one), so a process or a test can hold several.

Two kinds of figures, two costs:

* **Events** (messages processed, retries, dead letters, duplicates, rebalances,
  contract violations, latencies) are pushed by the runtime, *per batch*:
  :meth:`Metrics.processed` adds ``n`` at once, :meth:`Metrics.observe_latencies`
  and :meth:`Metrics.observe_end_to_end` take a whole batch of values. A batch
  histogram update sorts the values (in C) and bisects once per bucket, so its
  Python work is per bucket, not per message.
* **State** (offsets, lag, in-flight count, flow window, paused partitions) is
  never pushed: a collector reads the :class:`~htmqc.observe.state.StateSource`
  when Prometheus scrapes, so it costs nothing per message.

Metric names (all prefixed ``htmqc_``)::

    messages_processed_total{topic,partition,outcome}   counter; outcome in OUTCOMES
    processing_latency_seconds                         histogram (handler time)
    end_to_end_latency_seconds                         histogram (now - message timestamp)
    commit_latency_seconds                             histogram
    retries_total                                      counter
    dlq_total{kind}                                    counter; kind in DLQ_KINDS
    duplicates_suppressed_total                        counter
    metadata_throttled_total                           counter (batches cut short)
    rebalances_total                                   counter
    contract_violations_total                          counter
    breaker_transitions_total{event}                   counter; event: a BreakerEvent value
    breaker_open                                       gauge (scrape time): 1 unless closed
    consumer_lag{topic,partition}                      gauge (scrape time; needs high watermark)
    in_flight                                          gauge (scrape time)
    flow_window                                        gauge (scrape time; if a flow window exists)
    paused_partitions                                  gauge (scrape time)
    offset{topic,partition,kind}                       gauge (scrape time); committed|processed|next
    state_up                                           gauge: 1 if the state source answered

and, unprefixed, prometheus_client's ``process_*`` (resident and virtual memory,
CPU seconds, open and maximum file descriptors, start time) of this process.

Labels carry only topic names, partition numbers and the fixed words above:
never message content, keys or configuration values. An unknown ``outcome`` or
``kind`` raises :class:`ValueError`, so label sets stay small and known.
Error rate, as the alert rules compute it: ``outcome="failed"`` over all outcomes
(``failed`` counts handler attempts that raised, whether retried or dead-lettered).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from operator import add, sub
from typing import Any

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from htmqc.dlq.record import DLQ_KINDS
from htmqc.observe.state import StateSource

#: Allowed values of the ``outcome`` label of ``htmqc_messages_processed_total``.
OUTCOMES = ("succeeded", "failed", "dead_lettered")
#: Values of the ``kind`` label of ``htmqc_offset``.
OFFSET_KINDS = ("committed", "processed", "next")

#: Handler time and commit time buckets, seconds.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
#: End-to-end (message timestamp to done) buckets, seconds.
END_TO_END_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)


class BatchHistogram:
    """A Prometheus histogram that takes whole batches of observations.

    Holds cumulative bucket counts (``le`` is inclusive, as Prometheus wants),
    the count and the sum. Thread-safe: updates and reads take one lock per batch.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        bounds = tuple(sorted(float(b) for b in buckets))
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct and non-empty")
        self.name = name
        self.documentation = documentation
        self.bounds = bounds
        self._bounds_ms = tuple(b * 1000.0 for b in bounds)
        self._cumulative = [0] * len(bounds)
        self._count = 0
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Sequence[float]) -> None:
        """Add a batch of observations (seconds)."""
        n = len(values)
        if not n:
            return
        self._observe(n, float(sum(values)), values)

    def observe_ticks(self, ticks: Sequence[float]) -> None:
        """Add the gaps between consecutive clock readings ``ticks`` (a run's start,
        then one reading after each message): ``len(ticks) - 1`` observations whose
        sum is ``ticks[-1] - ticks[0]``, without building the list of gaps."""
        n = len(ticks) - 1
        if n < 1:
            return
        total = ticks[-1] - ticks[0]
        if total <= self.bounds[0]:
            # Gaps are >= 0 (a monotonic clock), so none exceeds their sum: all of
            # them fall in the first bucket. The common case for fast handlers: O(1).
            self._add(n, total, [n] * len(self.bounds))
            return
        self._observe(n, total, map(sub, ticks[1:], ticks[:-1]))

    def _observe(self, n: int, total: float, values: Iterable[float]) -> None:
        # Only values above the first bound are sorted: fast handlers (the case where
        # per-message cost matters) land in the first bucket and cost one comparison.
        first = self.bounds[0]
        ordered = sorted([v for v in values if v > first])
        small = n - len(ordered)
        below = [small + bisect_right(ordered, b) for b in self.bounds]
        self._add(n, total, below)

    def observe_ages(self, now: float, timestamps_ms: Sequence[float]) -> None:
        """Add ``now - t`` for each timestamp (milliseconds since the epoch, Kafka's
        unit), without a per-value subtraction: ``now - t/1000 <= b`` exactly when
        ``t >= now * 1000 - b * 1000``. Kafka timestamps of one partition are
        nearly increasing, which makes the sort close to linear. Timestamps
        ``<= 0`` (Kafka's "not available", -1) are left out."""
        ordered = sorted(timestamps_ms)
        missing = bisect_right(ordered, 0.0)
        if missing:
            del ordered[:missing]
        n = len(ordered)
        if not n:
            return
        now_ms = now * 1000.0
        below = [n - bisect_left(ordered, now_ms - b) for b in self._bounds_ms]
        self._add(n, n * now - float(sum(ordered)) / 1000.0, below)

    def _add(self, n: int, total: float, below: list[int]) -> None:
        with self._lock:
            self._count += n
            self._sum += total
            self._cumulative = list(map(add, self._cumulative, below))

    def snapshot(self) -> tuple[list[int], int, float]:
        """``(cumulative bucket counts, count, sum)``, read consistently."""
        with self._lock:
            return list(self._cumulative), self._count, self._sum

    def family(self) -> HistogramMetricFamily:
        """The histogram as a metric family for a collector."""
        cumulative, count, total = self.snapshot()
        buckets = [(floatToGoString(b), c) for b, c in zip(self.bounds, cumulative, strict=True)]
        buckets.append(("+Inf", count))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=total
        )


class _ScrapeCollector(Collector):
    """Reads the histograms and the state source when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m = self._metrics
        yield m.processing_latency.family()
        yield m.end_to_end_latency.family()
        yield m.commit_latency.family()
        yield from _state_families(m.source)


def _state_families(source: StateSource | None) -> Iterator[Metric]:
    up = GaugeMetricFamily("htmqc_state_up", "1 if the state source answered the last scrape")
    if source is None:
        up.add_metric([], 0)
        yield up
        return
    try:
        doc: dict[str, Any] = source.state()
    except Exception:
        # A broken source must not take the counters down with it.
        up.add_metric([], 0)
        yield up
        return
    up.add_metric([], 1)
    yield up
    lag = GaugeMetricFamily(
        "htmqc_consumer_lag",
        "Broker high watermark minus committed offset",
        labels=["topic", "partition"],
    )
    offset = GaugeMetricFamily(
        "htmqc_offset",
        "Partition offsets (Kafka convention: next offset to read)",
        labels=["topic", "partition", "kind"],
    )
    for p in doc.get("partitions", ()):
        labels = [str(p["topic"]), str(p["partition"])]
        if p.get("lag") is not None:
            lag.add_metric(labels, p["lag"])
        for kind in OFFSET_KINDS:
            offset.add_metric([*labels, kind], p[kind])
    yield lag
    yield offset
    yield _gauge("htmqc_in_flight", "Messages fetched and not finished", doc.get("in_flight", 0))
    yield _gauge(
        "htmqc_paused_partitions",
        "Partitions whose fetching is paused",
        doc.get("paused_partitions", 0),
    )
    breaker = (doc.get("extra") or {}).get("breaker")
    if breaker is not None:
        yield _gauge(
            "htmqc_breaker_open",
            "1 while the circuit breaker holds work back (not closed)",
            0 if breaker.get("state") == "Closed" else 1,
        )
    flow = doc.get("flow")
    if flow is not None:
        yield _gauge("htmqc_flow_window", "Adaptive in-flight window (AIMD)", flow["window"])


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class Metrics:
    """All htmqc metrics, in a registry of their own (see module docs).

    ``source``: where scrape-time gauges come from; may be set later
    (:attr:`source`), e.g. once the runtime has built its core.
    """

    def __init__(self, source: StateSource | None = None) -> None:
        self.source = source
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._processed = Counter(
            "htmqc_messages_processed",
            "Handler outcomes per partition",
            ["topic", "partition", "outcome"],
            registry=r,
        )
        self._retries = Counter("htmqc_retries", "Messages scheduled for a retry", registry=r)
        self._dlq = Counter("htmqc_dlq", "Messages written to a dead-letter queue", ["kind"],
                            registry=r)
        self._duplicates = Counter(
            "htmqc_duplicates_suppressed",
            "Messages not run again because the sink already held their effect",
            registry=r,
        )
        self._rebalances = Counter("htmqc_rebalances", "Group rebalances seen", registry=r)
        self._throttled = Counter(
            "htmqc_metadata_throttled",
            "Fetched batches cut short: the offsets finished out of order could outgrow "
            "the commit metadata",
            registry=r,
        )
        self._violations = Counter(
            "htmqc_contract_violations", "Core contract violations detected", registry=r
        )
        self._lag_failures = Counter(
            "htmqc_kafka_lag_commit_failures",
            "Exactly-once into a database: failed commits of the stored watermark to the "
            "group's offsets (a copy for lag tools, never read back)",
            registry=r,
        )
        self._breaker = Counter(
            "htmqc_breaker_transitions",
            "Circuit-breaker state changes, by event",
            ["event"],
            registry=r,
        )
        # Known label values start at zero, so increase() and alerts see the first event.
        self._dlq_children = {kind: self._dlq.labels(kind) for kind in DLQ_KINDS}
        self._processed_children: dict[tuple[str, int, str], Any] = {}
        self.processing_latency = BatchHistogram(
            "htmqc_processing_latency_seconds", "Handler time per message", LATENCY_BUCKETS
        )
        self.end_to_end_latency = BatchHistogram(
            "htmqc_end_to_end_latency_seconds",
            "From the message timestamp to the end of its handling",
            END_TO_END_BUCKETS,
        )
        self.commit_latency = BatchHistogram(
            "htmqc_commit_latency_seconds", "Time from commit request to ack", LATENCY_BUCKETS
        )
        r.register(_ScrapeCollector(self))
        ProcessCollector(registry=r)

    # -- events (hot path: call once per batch) ------------------------------------------

    def processed(self, topic: str, partition: int, outcome: str, n: int = 1) -> None:
        """``n`` messages of ``topic``/``partition`` had ``outcome`` (one of :data:`OUTCOMES`).

        :raises ValueError: unknown ``outcome``.
        """
        key = (topic, partition, outcome)
        child = self._processed_children.get(key)
        if child is None:
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
            child = self._processed.labels(topic, str(partition), outcome)
            self._processed_children[key] = child
        child.inc(n)

    def observe_latencies(self, values: Sequence[float]) -> None:
        """Handler times of a batch of messages, seconds."""
        self.processing_latency.observe_many(values)

    def observe_end_to_end(self, now: float, timestamps_ms: Sequence[float]) -> None:
        """A batch finished at ``now`` (unix seconds); its messages' Kafka timestamps (ms)."""
        self.end_to_end_latency.observe_ages(now, timestamps_ms)

    def observe_commit_latencies(self, values: Sequence[float]) -> None:
        """Commit request-to-ack times, seconds."""
        self.commit_latency.observe_many(values)

    def retried(self, n: int = 1) -> None:
        """``n`` messages were scheduled for a retry."""
        self._retries.inc(n)

    def dead_lettered(self, kind: str, n: int = 1) -> None:
        """``n`` messages went to the DLQ as ``kind`` (one of :data:`DLQ_KINDS`).

        :raises ValueError: unknown ``kind``.
        """
        child = self._dlq_children.get(kind)
        if child is None:
            raise ValueError(f"kind must be one of {DLQ_KINDS}, got {kind!r}")
        child.inc(n)

    def duplicates_suppressed(self, n: int = 1) -> None:
        """``n`` messages were not run again: the sink already held them."""
        self._duplicates.inc(n)

    def metadata_throttled(self, n: int = 1) -> None:
        """``n`` fetched batches were cut short to keep the commit metadata in bounds."""
        self._throttled.inc(n)

    def rebalanced(self, n: int = 1) -> None:
        """A rebalance happened."""
        self._rebalances.inc(n)

    def lag_commit_failed(self, n: int = 1) -> None:
        """``n`` commits of a stored watermark to the group's offsets (lag tools) failed."""
        self._lag_failures.inc(n)

    def breaker(self, event: str) -> None:
        """The circuit breaker changed state by ``event`` (a ``BreakerEvent`` value)."""
        self._breaker.labels(event).inc()

    def contract_violated(self, n: int = 1) -> None:
        """A core contract was violated (a bug: the alert fires on any)."""
        self._violations.inc(n)

    # -- exposition ----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """Everything in the Prometheus text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
