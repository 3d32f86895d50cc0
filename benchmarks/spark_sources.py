"""Spark's ``kafka`` source and ``htmqc-kafka`` into Spark's ``noop`` sink, beside a
plain confluent-kafka loop, over the same topic, in one run.

Starts one Apache Kafka node (``htmqc.kafka_cluster``), produces ``--count``
100-byte records (``htmqc produce``'s format) on ``--partitions`` partitions
in committed transactions, then:

- ``confluent-kafka loop``: one consumer, assign + consume until every record
  is read (read_committed), values touched, nothing else: the ceiling;
- each source: one warm-up query on a small topic, then one
  ``trigger(availableNow=True)`` query of the whole topic into ``noop``
  (read_committed for both), timed from ``start()`` to its end, so planning is
  included; ``plan_ms`` sums the progress reports' ``latestOffset`` and
  ``planning`` durations.

Usage: ``python -m benchmarks.spark_sources [--count 200000] [--partitions 4]
[--out benchmarks/results/spark_sources.json]``. Needs ``make setup`` (Kafka's
and Spark's connector jars).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from htmqc.kafka_cluster import start_kafka
from htmqc.produce import produce


def plain_loop(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """Seconds a bare assign-and-consume loop takes to read ``count`` records."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    started = time.perf_counter()
    while seen < count:
        for msg in consumer.consume(10_000, timeout=1.0):
            if msg.error() is None:
                seen += len(msg.value() or b"") > 0
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds


def spark_query(
    spark: Any, fmt: str, bootstrap: str, topic: str, checkpoint: Path
) -> dict[str, Any]:
    """One availableNow query of ``topic`` through ``fmt`` into ``noop``."""
    frame = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    started = time.perf_counter()
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    plan = sum(
        p["durationMs"].get("latestOffset", 0) + p["durationMs"].get("queryPlanning", 0)
        for p in progress
    )
    return {"rows": rows, "seconds": round(seconds, 3), "plan_ms": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/spark_sources.json")
    args = parser.parse_args()

    from htmqc.spark.session import require_connector, spark_session

    require_connector()
    work = Path(f"/tmp/htmqc-spark-bench-{uuid.uuid4().hex[:8]}")
    results: dict[str, Any] = {"count": args.count, "partitions": args.partitions, "size": 100}
    results["load_1m"] = round(os.getloadavg()[0], 2)
    with start_kafka() as kafka:
        topic, warm = f"bench-{uuid.uuid4().hex[:6]}", f"warm-{uuid.uuid4().hex[:6]}"
        produce(kafka.bootstrap, warm, 1000, partitions=args.partitions, transactional=True)
        produce(kafka.bootstrap, topic, args.count, partitions=args.partitions, transactional=True)
        seconds = plain_loop(kafka.bootstrap, topic, args.partitions, args.count)
        results["confluent-kafka loop"] = {"rows": args.count, "seconds": round(seconds, 3)}
        with spark_session("local[2]", app="htmqc-bench") as spark:
            for fmt in ("kafka", "htmqc-kafka"):
                spark_query(spark, fmt, kafka.bootstrap, warm, work / f"warm-{fmt}")
                results[fmt] = spark_query(spark, fmt, kafka.bootstrap, topic, work / fmt)
    for name in ("confluent-kafka loop", "kafka", "htmqc-kafka"):
        entry = results[name]
        entry["rows_per_s"] = round(entry["rows"] / entry["seconds"])
    results["htmqc-kafka / kafka"] = round(
        results["htmqc-kafka"]["rows_per_s"] / results["kafka"]["rows_per_s"], 2
    )
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
