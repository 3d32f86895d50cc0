"""Metrics: names, values, batch updates, and the cost per message."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from htmqc.observe import DLQ_KINDS, Metrics
from htmqc.observe.metrics import LATENCY_BUCKETS, BatchHistogram
from tests.observe.conftest import ORDERS_0, Scenario

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: Every metric name the brief and the dashboard rely on (as exposed).
EXPOSED = {
    "htmqc_messages_processed_total",
    "htmqc_processing_latency_seconds_bucket",
    "htmqc_end_to_end_latency_seconds_bucket",
    "htmqc_commit_latency_seconds_bucket",
    "htmqc_consumer_lag",
    "htmqc_in_flight",
    "htmqc_flow_window",
    "htmqc_paused_partitions",
    "htmqc_retries_total",
    "htmqc_dlq_total",
    "htmqc_duplicates_suppressed_total",
    "htmqc_metadata_throttled_total",
    "htmqc_rebalances_total",
    "htmqc_contract_violations_total",
    "htmqc_offset",
    "htmqc_state_up",
}


def parse(text: bytes | str) -> Samples:
    if isinstance(text, bytes):
        text = text.decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_every_metric_is_exposed_with_the_right_values(scenario: Scenario) -> None:
    m = Metrics(scenario.source())
    m.processed("orders", 0, "succeeded", 33)
    m.processed("orders", 1, "failed", 1)
    m.retried()
    m.dead_lettered("poison")
    m.duplicates_suppressed(4)
    m.rebalanced()
    m.contract_violated()
    m.observe_latencies([0.002, 0.02])
    m.observe_end_to_end(1000.0, [999_000.0])
    m.observe_commit_latencies([0.003])
    s = parse(m.exposition())
    assert {name for name, _ in s} >= EXPOSED
    assert value(s, "htmqc_messages_processed_total",
                 topic="orders", partition="0", outcome="succeeded") == 33
    assert value(s, "htmqc_messages_processed_total",
                 topic="orders", partition="1", outcome="failed") == 1
    assert value(s, "htmqc_retries_total") == 1
    assert value(s, "htmqc_dlq_total", kind="poison") == 1
    assert value(s, "htmqc_dlq_total", kind="failed") == 0  # known kinds start at zero
    assert value(s, "htmqc_duplicates_suppressed_total") == 4
    assert value(s, "htmqc_rebalances_total") == 1
    assert value(s, "htmqc_contract_violations_total") == 1
    assert value(s, "htmqc_processing_latency_seconds_count") == 2
    assert value(s, "htmqc_processing_latency_seconds_bucket", le="0.005") == 1
    assert value(s, "htmqc_processing_latency_seconds_bucket", le="+Inf") == 2
    assert value(s, "htmqc_end_to_end_latency_seconds_sum") == pytest.approx(1.0)
    assert value(s, "htmqc_end_to_end_latency_seconds_bucket", le="0.5") == 0
    assert value(s, "htmqc_end_to_end_latency_seconds_bucket", le="1.0") == 1
    assert value(s, "htmqc_commit_latency_seconds_count") == 1
    # scrape-time gauges, straight from the core
    for tp, (committed, processed, nxt) in {
        ("orders", "0"): (120, 130, 160), ("orders", "1"): (40, 40, 50),
        ("audit.events", "3"): (7, 7, 7),
    }.items():
        labels = {"topic": tp[0], "partition": tp[1]}
        assert value(s, "htmqc_offset", kind="committed", **labels) == committed
        assert value(s, "htmqc_offset", kind="processed", **labels) == processed
        assert value(s, "htmqc_offset", kind="next", **labels) == nxt
    assert value(s, "htmqc_consumer_lag", topic="orders", partition="0") == 80
    assert value(s, "htmqc_consumer_lag", topic="orders", partition="1") == 40
    assert ("htmqc_consumer_lag", frozenset({("topic", "audit.events"), ("partition", "3")})) \
        not in s  # no high watermark known: no lag sample
    assert value(s, "htmqc_in_flight") == 32
    assert value(s, "htmqc_flow_window") == 1050
    assert value(s, "htmqc_paused_partitions") == 1
    assert value(s, "htmqc_state_up") == 1


def test_gauges_move_with_the_core_at_scrape_time(scenario: Scenario) -> None:
    m = Metrics(scenario.source())
    scenario.core.succeeded_many(ORDERS_0, scenario.epochs[ORDERS_0], [*range(130, 140)])
    s = parse(m.exposition())
    assert value(s, "htmqc_offset", topic="orders", partition="0", kind="processed") == 142
    assert value(s, "htmqc_in_flight") == 22


def test_batch_counters_add_up() -> None:
    m = Metrics()
    rng = random.Random(7)
    want: dict[tuple[str, int, str], int] = {}
    for _ in range(300):
        key = (rng.choice(["a", "b"]), rng.randrange(3), rng.choice(["succeeded", "failed"]))
        n = rng.randrange(1, 500)
        m.processed(*key, n)
        want[key] = want.get(key, 0) + n
    dlq = dict.fromkeys(DLQ_KINDS, 0)
    for _ in range(50):
        kind, n = rng.choice(DLQ_KINDS), rng.randrange(1, 5)
        m.dead_lettered(kind, n)
        dlq[kind] += n
    s = parse(m.exposition())
    for (topic, partition, outcome), n in want.items():
        got = value(s, "htmqc_messages_processed_total",
                    topic=topic, partition=str(partition), outcome=outcome)
        assert got == n
    assert sum(v for (name, _), v in s.items() if name == "htmqc_messages_processed_total") \
        == sum(want.values())
    for kind, n in dlq.items():
        assert value(s, "htmqc_dlq_total", kind=kind) == n
    assert value(s, "htmqc_state_up") == 0  # no source yet


def test_batch_histogram_matches_prometheus_client_histogram() -> None:
    rng = random.Random(3)
    ref_registry = CollectorRegistry()
    ref = Histogram("ref", "reference", buckets=LATENCY_BUCKETS, registry=ref_registry)
    mine = BatchHistogram("mine", "batch", LATENCY_BUCKETS)
    for _ in range(40):
        batch = [rng.choice([rng.expovariate(20), rng.choice(LATENCY_BUCKETS)])
                 for _ in range(rng.randrange(0, 200))]  # include exact bucket bounds
        mine.observe_many(batch)
        for v in batch:
            ref.observe(v)
    reg = CollectorRegistry()
    reg.register(type("C", (), {"collect": lambda self: [mine.family()]})())
    got, want = parse(generate_latest(reg)), parse(generate_latest(ref_registry))
    for (name, labels), v in want.items():
        if name.startswith("ref_") and not name.endswith("_created"):
            assert got[("mine" + name[3:], labels)] == pytest.approx(v), (name, labels)


@given(
    start=st.floats(0, 1e6),
    gaps=st.lists(
        st.one_of(st.floats(0, 40), st.sampled_from(LATENCY_BUCKETS), st.just(0.0)), max_size=60
    ),
)
def test_observe_ticks_equals_observing_the_gaps(start: float, gaps: list[float]) -> None:
    ticks = [start]
    for gap in gaps:
        ticks.append(ticks[-1] + gap)
    by_ticks = BatchHistogram("a", "a", LATENCY_BUCKETS)
    by_values = BatchHistogram("b", "b", LATENCY_BUCKETS)
    by_ticks.observe_ticks(ticks)
    by_values.observe_many([b - a for a, b in itertools.pairwise(ticks)])
    (cum_t, n_t, sum_t), (cum_v, n_v, sum_v) = by_ticks.snapshot(), by_values.snapshot()
    assert (cum_t, n_t) == (cum_v, n_v)
    assert sum_t == pytest.approx(sum_v, rel=1e-9, abs=1e-6)


def test_end_to_end_ages_match_explicit_latencies() -> None:
    rng = random.Random(5)
    now = 1_795_000_000.123
    stamps = [now * 1000 - rng.uniform(0, 700_000) for _ in range(500)]
    ages = BatchHistogram("a", "a", (*LATENCY_BUCKETS, 60.0, 300.0))
    explicit = BatchHistogram("b", "b", (*LATENCY_BUCKETS, 60.0, 300.0))
    ages.observe_ages(now, stamps)
    explicit.observe_many([now - t / 1000 for t in stamps])
    (ca, na, sa), (cb, nb, sb) = ages.snapshot(), explicit.snapshot()
    assert ca == cb and na == nb == 500
    # The batch sum is n*now - sum(t)/1000 on numbers near 1.8e12: float64 keeps
    # it to about a millisecond in total, far below a scrape's resolution.
    assert sa == pytest.approx(sb, abs=1e-2)


def test_missing_timestamps_are_left_out() -> None:
    h = BatchHistogram("e", "e", (1.0, 10.0))
    h.observe_ages(100.0, [-1, 0, 99_500.0, 95_000.0])
    assert h.snapshot() == ([1, 2], 2, pytest.approx(5.5))
    h.observe_ages(100.0, [-1])
    assert h.snapshot()[1] == 2


def test_label_values_are_checked() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="outcome"):
        m.processed("t", 0, "password=hunter2", 1)
    with pytest.raises(ValueError, match="kind"):
        m.dead_lettered("other")


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.processed("t", 0, "succeeded", 5)
    sb = parse(b.exposition())
    assert not any(name == "htmqc_messages_processed_total" for name, _ in sb)
    assert value(parse(a.exposition()), "htmqc_messages_processed_total",
                 topic="t", partition="0", outcome="succeeded") == 5


def test_a_broken_source_does_not_break_the_scrape() -> None:
    class Broken:
        def state(self) -> dict:
            raise RuntimeError("core busy")

    m = Metrics(Broken())
    m.retried(2)
    s = parse(m.exposition())
    assert value(s, "htmqc_state_up") == 0 and value(s, "htmqc_retries_total") == 2


def _best_cpu_ns(fns: dict[str, Callable[[], None]], rounds: int = 5) -> dict[str, int]:
    """Best-of-``rounds`` thread CPU time of each function, rounds interleaved
    (CPU time, so other processes on the machine do not inflate it)."""
    best = dict.fromkeys(fns, 1 << 62)
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.thread_time_ns()
            fn()
            best[name] = min(best[name], time.thread_time_ns() - t0)
    return best


def _overhead(size: int, rng: random.Random) -> str:
    """Batched metrics vs per-message prometheus_client, ns per message, for one
    batch size; 100,000 messages, 8 partitions."""
    batches = 100_000 // size
    lat = [[rng.expovariate(500) for _ in range(size)] for _ in range(batches)]
    now = time.time()
    # Kafka timestamps of one partition's batch increase (produce order).
    ts = [sorted(now * 1000 - rng.uniform(0, 5000) for _ in range(size))
          for _ in range(batches)]
    m = Metrics()
    ref_reg = CollectorRegistry()
    ref_c = Counter("c", "c", ["topic", "partition", "outcome"], registry=ref_reg)
    ref_h1 = Histogram("h1", "h", buckets=LATENCY_BUCKETS, registry=ref_reg)
    ref_h2 = Histogram("h2", "h", buckets=LATENCY_BUCKETS, registry=ref_reg)

    def baseline() -> None:  # what the runtime does anyway: hold the batch
        for i in range(batches):
            _ = (lat[i], ts[i])

    def batched() -> None:
        for i in range(batches):
            m.processed("orders", i & 7, "succeeded", size)
            m.observe_latencies(lat[i])
            m.observe_end_to_end(now, ts[i])

    def naive() -> None:
        for i in range(batches):
            for v, t in zip(lat[i], ts[i], strict=True):
                ref_c.labels("orders", str(i & 7), "succeeded").inc()
                ref_h1.observe(v)
                ref_h2.observe(now - t / 1000)

    best = _best_cpu_ns({"base": baseline, "batched": batched, "naive": naive})
    fast = (best["batched"] - best["base"]) / (batches * size)
    slow = (best["naive"] - best["base"]) / (batches * size)
    return (
        f"batch={size}: batched metrics {fast:.0f} ns/msg; "
        f"naive per-message prometheus_client {slow:.0f} ns/msg; budget 175 ns/msg"
    )


def test_measure_overhead_per_message() -> None:
    """Reports (does not assert) the hot-path cost of metrics per message: counter,
    handler-latency histogram and end-to-end histogram, thread CPU time."""
    rng = random.Random(1)
    lines = [_overhead(size, rng) for size in (100, 500)]
    out = Path(__file__).resolve().parents[2] / "build" / "observe" / "metrics-overhead.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
