"""Spark's ``kafka`` source and ``htmqc-kafka`` into Spark's ``noop`` sink and into
htmqc's exactly-once sinks, beside a plain confluent-kafka loop, over the same
topic, in one run.

Starts one Apache Kafka node (``htmqc.kafka_cluster``), produces ``--count``
100-byte records (``htmqc produce``'s format) on ``--partitions`` partitions
in committed transactions, then:

- ``confluent-kafka loop``: one consumer, assign + consume until every record
  is read (read_committed), values touched, nothing else: the ceiling;
- each source: one warm-up query on a small topic, then one
  ``trigger(availableNow=True)`` query of the whole topic per sink
  (read_committed for both), timed from ``start()`` to its end, so planning is
  included; ``plan_ms`` sums the progress reports' ``latestOffset`` and
  ``planning`` durations. Sinks: ``noop`` (the raw rows), and the rows
  ``id, key, value, partition, offset, timestamp`` into
  ``SqlBatchSink`` (PostgreSQL, ``--postgres``) and ``ParquetBatchSink``; the
  rows stored are counted afterwards and must equal ``--count``.

Usage: ``python -m benchmarks.spark_sources [--count 200000] [--partitions 4]
[--postgres postgresql://127.0.0.1:5432/test]
[--out benchmarks/results/spark_sources.json]``. Needs ``make setup`` (Kafka's
and Spark's connector jars) and PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


COLUMNS = (
    "cast(substring(value, 1, 12) AS string) AS id",
    "cast(key AS string) AS key",
    "value",
    "partition",
    "offset",
    "timestamp",
)
SINKS = ("noop", "postgresql", "parquet")


def spark_query(
    spark: Any,
    fmt: str,
    bootstrap: str,
    topic: str,
    work: Path,
    sink: str = "noop",
    postgres: str = "",
) -> dict[str, Any]:
    """One availableNow query of ``topic`` through ``fmt`` into ``sink``; the rows
    it stored (``noop``: the rows read)."""
    from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink

    frame = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    name = f"{fmt}-{sink}-{uuid.uuid4().hex[:6]}"
    table = "bench_" + name.replace("-", "_")
    if sink == "noop":
        writer = frame.writeStream.format("noop")
    elif sink == "postgresql":
        writer = frame.selectExpr(*COLUMNS).writeStream.foreachBatch(
            SqlBatchSink(postgres, table, query=table)
        )
    else:
        writer = frame.selectExpr(*COLUMNS).writeStream.foreachBatch(ParquetBatchSink(work / name))
    started = time.perf_counter()
    query = (
        writer.option("checkpointLocation", str(work / f"ck-{name}"))
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
    if sink == "postgresql":
        import psycopg

        with psycopg.connect(postgres, autocommit=True) as conn:
            stored = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
            conn.execute(f"DROP TABLE {table}")
    elif sink == "parquet":
        stored = spark.read.parquet(str(work / name)).count()
        shutil.rmtree(work / name)
    else:
        stored = rows
    return {"rows": rows, "stored": stored, "seconds": round(seconds, 3), "plan_ms": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
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
                for sink in SINKS:  # warm-up: the JVM's classes, the Python workers
                    spark_query(spark, fmt, kafka.bootstrap, warm, work, sink, args.postgres)
            for sink in SINKS:
                for fmt in ("kafka", "htmqc-kafka"):
                    entry = spark_query(
                        spark, fmt, kafka.bootstrap, topic, work, sink, args.postgres
                    )
                    if entry["stored"] != args.count:
                        raise SystemExit(f"{fmt} into {sink} stored {entry['stored']} rows")
                    entry["rows_per_s"] = round(entry["rows"] / entry["seconds"])
                    results[f"{fmt} -> {sink}"] = entry
    shutil.rmtree(work, ignore_errors=True)
    loop = results["confluent-kafka loop"]
    loop["rows_per_s"] = round(loop["rows"] / loop["seconds"])
    for sink in SINKS:
        ratio = (
            results[f"htmqc-kafka -> {sink}"]["rows_per_s"]
            / results[f"kafka -> {sink}"]["rows_per_s"]
        )
        results[f"htmqc-kafka / kafka -> {sink}"] = round(ratio, 2)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
