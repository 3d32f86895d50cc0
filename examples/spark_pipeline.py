"""A Spark pipeline: a Kafka topic into PostgreSQL (or SQLite), exactly once.

Spark's own Kafka connector (``format("kafka")``, fetched by ``make setup``)
reads the topic with ``read_committed``; :class:`htmqc.spark.sinks.SqlBatchSink`
stores each micro-batch once, from the executors, in one transaction per
batch, so a crash and a restart on the same checkpoint store every record once.
``failOnDataLoss`` stays ``true`` (records deleted under the checkpoint stop
the query), and :class:`htmqc.spark.topic_guard.TopicGuard` stops it when the
topic was deleted and recreated, which Spark's connector alone would not
notice (it goes on at the old offsets, skipping the new topic's records).

Each row is the record's ``id`` (the first 12 bytes of its value, as
``htmqc produce`` writes it, so ``htmqc audit`` can check the table), ``key``,
``value`` (text), ``partition``, ``offset`` and ``timestamp``. With
``--latest-per-key`` the table keeps one row per key, the last one read
(``mode="upsert"``, ``keys=("key",)``).

Run it (``--once`` reads what is there and exits; without it, a micro-batch
every ``--every`` seconds until Ctrl-C)::

    python -m examples.spark_pipeline --bootstrap 127.0.0.1:9092 --topic orders \\
        --sink postgresql://127.0.0.1/test --table orders_out --checkpoint /data/ck/orders
    htmqc audit --spark --produced kafka://127.0.0.1:9092/orders \\
        --effects 'postgresql://127.0.0.1/test?table=orders_out'

``--source htmqc-kafka`` reads through htmqc's own source instead (same
options; for a machine without the connector's jars).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from htmqc.errors import UsageError
from htmqc.spark.session import require_connector, spark_session
from htmqc.spark.sinks import SqlBatchSink
from htmqc.spark.topic_guard import TopicGuard

COLUMNS = (
    "cast(substring(value, 1, 12) AS string) AS id",
    "cast(key AS string) AS key",
    "cast(value AS string) AS value",
    "partition",
    "offset",
    "timestamp",
)
"""What each stored row holds, as Spark SQL over the Kafka source's columns."""


def rows(spark: Any, source: str, bootstrap: str, topic: str, per_trigger: int | None) -> Any:
    """The stream of ``topic`` from its earliest offset, ``read_committed``, as rows to store."""
    stream = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
    )
    if per_trigger is not None:
        stream = stream.option("maxOffsetsPerTrigger", str(per_trigger))
    return stream.load().selectExpr(*COLUMNS)


def sink_for(target: str, table: str, latest_per_key: bool) -> SqlBatchSink:
    """The exactly-once sink; its batch record is named after the table."""
    if latest_per_key:
        return SqlBatchSink(target, table, query=table, mode="upsert", keys=("key",))
    return SqlBatchSink(target, table, query=table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka brokers, host:port[,...]")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--sink", required=True, help="postgresql://... URL or a SQLite file")
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    parser.add_argument("--source", choices=("kafka", "htmqc-kafka"), default="kafka")
    parser.add_argument("--master", default="local[2]", help="local[N] or spark://host:port")
    parser.add_argument("--latest-per-key", action="store_true", help="upsert on the key")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--once", action="store_true", help="read what is there, then exit")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between batches")
    args = parser.parse_args(argv)

    try:
        if args.source == "kafka":
            require_connector()  # one line saying how to fetch the jars, not a Java trace
        return run(args)
    except UsageError as exc:
        print(f"spark_pipeline: {exc.line()}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """Start the query; return when it has read everything (``--once``) or on Ctrl-C."""
    sink: Any = sink_for(args.sink, args.table, args.latest_per_key)
    if args.source == "kafka":  # htmqc-kafka compares topic ids itself
        sink = TopicGuard(sink, args.bootstrap, [args.topic])
    with spark_session(args.master, app=f"htmqc-example-{args.table}") as spark:
        writer = (
            rows(spark, args.source, args.bootstrap, args.topic, args.max_offsets_per_trigger)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
        )
        if args.once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{args.every} seconds")
        query = writer.start()
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            pass
        finally:
            query.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
