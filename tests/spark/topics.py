"""What the Spark tests read: a stream of a topic with the audit's columns, and
records of aborted transactions that are really in the log.

``htmqc produce --abort-every`` purges an aborted transaction's records before
they are sent (its producer lingers until the commit), so on Apache Kafka the
log holds none of them. :func:`write_aborted` flushes them first, then aborts:
a ``read_uncommitted`` reader sees them, a ``read_committed`` one must not.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from htmqc.kafka_defaults import producer_config
from htmqc.produce import ID_HEADER, message_key, message_value


def write_aborted(bootstrap: str, topic: str, ids: range, keys: int) -> None:
    """Write messages ``ids`` (as ``htmqc produce`` would) in a transaction
    flushed to the log, then abort it."""
    producer = Producer(
        producer_config(bootstrap, transactional_id=f"htmqc-aborted-{uuid.uuid4().hex[:8]}")
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in ids:
        producer.produce(
            topic, message_value(i, 100), message_key(i, keys), headers=[(ID_HEADER, str(i))]
        )
    assert producer.flush(60) == 0
    producer.abort_transaction(60)


ID_COLUMNS = (
    "cast(substring(value, 1, 12) as string) AS id",
    "cast(key AS string) AS key",
    "partition",
    "offset",
)
"""A record's id (``htmqc produce``'s value head), key, partition and offset."""


def reader(spark: Any, bootstrap: str, topic: str, fmt: str = "htmqc-kafka", **options: str) -> Any:
    """``readStream`` of ``topic`` through ``fmt`` from the earliest offset, with ``options``."""
    stream = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        stream = stream.option(name, value)
    return stream.load()


def run_query(
    spark: Any,
    bootstrap: str,
    topic: str,
    checkpoint: Path,
    sink: Callable[[Any, int], None],
    fmt: str = "htmqc-kafka",
    **options: str,
) -> Any:
    """One ``availableNow`` run of ``topic`` through ``fmt`` into ``sink``, resuming
    from ``checkpoint``; the query, stopped."""
    rows = reader(spark, bootstrap, topic, fmt, **options).selectExpr(*ID_COLUMNS)
    query = (
        rows.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    return query


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again with ``partitions`` (a new topic id,
    empty), waiting out Kafka's asynchronous deletion."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result()
    deadline = time.monotonic() + 30
    while True:  # deletion is asynchronous: TOPIC_ALREADY_EXISTS until it is done
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
            return
        except KafkaException:
            assert time.monotonic() < deadline, f"{topic} not recreated in 30 s"
            time.sleep(0.3)
