"""Runtime throughput: a raw confluent-kafka loop against htmqc's modes.

One broker (``--broker``: the bundled Tansu, or a single-node Apache Kafka),
one topic (``--count`` x 100-byte messages, 8 partitions); each variant
consumes the whole topic with its own consumer group, in this process, and is
timed from its first message to its last (group joins are left out). Variants:
the raw loop (``consume`` batches, a Python call per message, an async commit
per batch), the raw loop calling the SQLite handler with a SQLite commit per
batch (the limit for exactly-once into SQLite), htmqc at-least-once, htmqc
exactly-once into SQLite (the demo handler: one INSERT per message), htmqc
exactly-once Kafka→Kafka (one output record per message), and at-least-once
again with metrics on (what ``--metrics-port`` costs). Every variant runs
``--rounds`` times, interleaved (the broker's speed on this shared box
drifts); results go to ``benchmarks/results/runtime.json`` (on Kafka
``runtime-kafka.json``): every run, the medians, each median's ratio to the
raw loop, and the metrics overhead.

Run with contracts off: ``HTMQC_CONTRACTS=0 python -m benchmarks.runtime_bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from benchmarks.brokers import BROKERS, describe, running, suffix
from htmqc.broker import create_topic
from htmqc.core import CONTRACTS_ENABLED
from htmqc.kafka_defaults import consumer_config
from htmqc.produce import produce
from htmqc.progress import progress
from htmqc.runtime import RunOptions, build_engine
from htmqc.runtime.options import SINK_DEFAULTS

RESULTS = Path(__file__).resolve().parent / "results" / "runtime.json"
PARTITIONS = 8


def raw_loop(
    bootstrap: str,
    topic: str,
    count: int,
    group: str = "bench-raw",
    handler: Callable[[Any], Any] | None = None,
    after_batch: Callable[[], Any] | None = None,
) -> float:
    """msg/s of a plain confluent-kafka loop: ``handler`` per message (default: a
    counter), ``after_batch`` after each batch, then an async Kafka commit."""
    consumer = Consumer(consumer_config(bootstrap, group))
    consumer.subscribe([topic])
    seen = 0
    first = 0.0
    total = [0]

    def count_only(msg: Any) -> None:
        total[0] += 1

    handle = handler or count_only
    try:
        while seen < count:
            msgs = consumer.consume(1000, 0.1)
            if not msgs:
                continue
            if not first:
                first = time.perf_counter()
            last: dict[tuple[str, int], int] = {}
            for m in msgs:
                handle(m)
                last[(m.topic(), m.partition())] = m.offset()
            if after_batch is not None:
                after_batch()
            seen += len(msgs)
            consumer.commit(
                offsets=[TopicPartition(t, p, o + 1) for (t, p), o in last.items()],
                asynchronous=True,
            )
        return count / (time.perf_counter() - first)
    finally:
        consumer.close()


def raw_sqlite_loop(bootstrap: str, topic: str, count: int, group: str, db: Path) -> float:
    """The raw loop calling the exactly-once benchmark's handler (one INSERT per
    message) on a plain SQLite cursor, one SQLite commit per batch: the limit
    for the exactly-once SQLite mode (without its guarantees)."""
    from examples.effects import record

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = FULL")
    cur = conn.cursor()
    cur.execute("BEGIN")
    state = {"cur": cur}

    def commit() -> None:
        cur.execute("COMMIT")
        cur.execute("BEGIN")

    try:
        return raw_loop(
            bootstrap, topic, count, group, lambda m: record(m, state["cur"]), commit
        )
    finally:
        cur.execute("COMMIT")
        conn.close()


def htmqc_rate(
    bootstrap: str,
    topic: str,
    count: int,
    handler: Any,
    *,
    metrics: Any = None,
    **options: Any,
) -> float:
    """msg/s of one htmqc engine run over the whole topic (``metrics``: count
    events into this :class:`~htmqc.observe.Metrics`, as ``--metrics-port`` does)."""
    opts = RunOptions(bootstrap=bootstrap, topic=topic, max_messages=count, **options)
    engine = build_engine(handler, opts, metrics=metrics)
    engine.run(install_signals=False)
    assert engine.finished >= count, engine.finished
    assert engine.first_message_at is not None and engine.stopped_at is not None
    return count / (engine.stopped_at - engine.first_message_at)


CHART = RESULTS.with_name("runtime.png")
_LABELS = {
    "raw_loop": "raw loop (limit)",
    "raw_sqlite": "raw loop + SQLite handler (limit)",
    "at_least_once": "htmqc at-least-once",
    "at_least_once_metrics": "htmqc at-least-once + metrics",
    "exactly_once_sqlite": "htmqc exactly-once SQLite",
    "exactly_once_kafka": "htmqc exactly-once Kafka->Kafka",
}


def chart(results: dict[str, Any], path: Path = CHART) -> Path:
    """Horizontal bars of the median msg/s, each labelled with its ratio to the raw
    loop (and, for exactly-once SQLite, to the raw SQLite loop)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = results["msg_per_s"]
    names = [n for n in _LABELS if n in rates]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.4))
    bars = ax.barh(range(len(names)), [rates[n] for n in names], color="#4c72b0")
    raw = rates["raw_loop"]
    for name, bar in zip(names, bars, strict=True):
        label = f" {rates[name]:,.0f}  ({rates[name] / raw:.2f}x raw"
        if name == "exactly_once_sqlite" and "raw_sqlite" in rates:
            label += f", {rates[name] / rates['raw_sqlite']:.2f}x raw SQLite"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label + ")",
                va="center", fontsize=8)
    ax.set_yticks(range(len(names)), [_LABELS[n] for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(rates.values()) * 1.6)
    ax.set_xlabel(f"msg/s, median of {results['rounds']} interleaved rounds")
    ax.set_title(f"htmqc runtime, {results['count']:,} x {results['size']} B, "
                 f"{results['partitions']} partitions\n{results.get('broker', 'bundled broker')}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--rounds`` times, interleaved; print and store the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--broker", choices=BROKERS, default="tansu")
    args = parser.parse_args(argv)
    from examples.effects import record
    from examples.transform import upper

    from htmqc.observe import Metrics

    counted = [0]

    def count_only(msg: Any) -> None:
        counted[0] += 1

    work = Path(tempfile.mkdtemp(prefix="htmqc-bench-"))
    results: dict[str, Any] = {
        "count": args.count,
        "partitions": PARTITIONS,
        "size": 100,
        "rounds": args.rounds,
        "contracts": CONTRACTS_ENABLED,
        "broker": describe(args.broker),
        "runs": {},
    }
    runs: dict[str, list[float]] = results["runs"]
    with running(args.broker) as b:
        topic = "bench"
        create_topic(b, topic, PARTITIONS)
        create_topic(b, "bench-out", PARTITIONS)
        produce(b, topic, args.count, keys=1000, size=100)
        variants: dict[str, Any] = {
            "raw_loop": lambda r: raw_loop(b, topic, args.count, group=f"bench-raw-{r}"),
            "raw_sqlite": lambda r: raw_sqlite_loop(
                b, topic, args.count, f"bench-raw-db-{r}", work / f"raw-{r}.db"
            ),
            "at_least_once": lambda r: htmqc_rate(
                b, topic, args.count, count_only, group=f"bench-alo-{r}"
            ),
            "at_least_once_metrics": lambda r: htmqc_rate(
                b, topic, args.count, count_only, group=f"bench-alo-m-{r}", metrics=Metrics()
            ),
            "exactly_once_sqlite": lambda r: htmqc_rate(
                b,
                topic,
                args.count,
                record,
                group=f"bench-eo-{r}",
                mode="exactly-once",
                sink=f"sqlite:///{work / f'bench-{r}.db'}",
            ),
            "exactly_once_kafka": lambda r: htmqc_rate(
                b,
                topic,
                args.count,
                upper,
                group=f"bench-k2k-{r}",
                mode="exactly-once",
                sink="kafka:bench-out",
                # What `htmqc run` gives a kafka: sink (RunOptions alone has the schema's).
                **SINK_DEFAULTS["kafka"],
            ),
        }
        with progress(args.rounds * len(variants), "benchmark runs") as advance:
            for r in range(args.rounds):
                for name, run in variants.items():
                    rate = run(r)
                    runs.setdefault(name, []).append(rate)
                    print(f"round {r + 1} {name:<24} {rate:>10,.0f} msg/s", flush=True)
                    advance(1)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    results["msg_per_s"] = medians
    raw = medians["raw_loop"]
    results["ratio_to_raw"] = {k: round(v / raw, 3) for k, v in medians.items()}
    results["exactly_once_sqlite_to_raw_sqlite"] = round(
        medians["exactly_once_sqlite"] / medians["raw_sqlite"], 3
    )
    results["metrics_overhead"] = round(
        1 - medians["at_least_once_metrics"] / medians["at_least_once"], 3
    )
    print(json.dumps({k: results[k] for k in (
        "ratio_to_raw", "exactly_once_sqlite_to_raw_sqlite", "metrics_overhead")}))
    end = suffix(args.broker)
    out = RESULTS.with_name(f"runtime{end}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}; chart: {chart(results, CHART.with_name(f'runtime{end}.png'))}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HTMQC_CONTRACTS", "0")
    sys.exit(main())
