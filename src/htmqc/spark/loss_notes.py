"""Loss notes: how an executor tells the planner about records deleted while a
batch read them (:mod:`htmqc.spark.kafka_offsets`, module docs).

A note is the committed offset of one partition in the query's notes group
(a Kafka consumer group that no consumer ever joins): the offset is the end of
the batch's range, the commit metadata ``{"start": S, "skipped": N}``. Writing
one is a standalone offset commit; reading them, one ``OffsetFetch`` for the
group; clearing them, one offset commit with empty metadata. A failure to write or read a note
is logged and never fails the query: the loss itself was already logged by the
executor that skipped it (a note that could not be read when it was due is not
counted later once its partition moved on).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from htmqc.spark.kafka_offsets import LossNote, TopicPartition

log = logging.getLogger("htmqc.spark.kafka")
GROUP_PREFIX = "htmqc-spark-losses-"
#: Seconds a note's write, read or removal waits for the cluster.
TIMEOUT = 15.0


def new_group() -> str:
    """A notes group of its own for a new query."""
    return f"{GROUP_PREFIX}{uuid.uuid4().hex}"


def write_note(
    config: Mapping[str, str], group: str, tp: TopicPartition, note: LossNote
) -> bool:
    """Commit ``note`` for ``tp`` in ``group``; whether the broker took it."""
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka import TopicPartition as TP

    metadata = json.dumps({"start": note.start, "skipped": note.skipped})
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TP(*tp, note.end, metadata=metadata)], asynchronous=False)
        return True
    except KafkaException as exc:
        log.warning("htmqc-kafka: could not leave the loss note of %s/%s for counting in "
                    '"@lost" (%s); the loss is in this log line only', *tp, exc)
        return False
    finally:
        consumer.close()


def read_notes(admin: Any, group: str) -> dict[TopicPartition, LossNote]:
    """Every note in ``group`` (none if the group has none or cannot be read)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException

    try:
        future = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=TIMEOUT
        )[group]
        found = future.result().topic_partitions or []
    except KafkaException as exc:
        log.warning("htmqc-kafka: could not read the loss notes of %s (%s); a note of "
                    "the last batch is counted at the next planning only if its partition "
                    "has not moved on: else the loss stays in the executors' logs only",
                    group, exc)  # fmt: skip
        return {}
    notes: dict[TopicPartition, LossNote] = {}
    for tp in found:
        if tp.offset < 0 or not tp.metadata:
            continue
        try:
            data = json.loads(tp.metadata)
            notes[(tp.topic, tp.partition)] = LossNote(
                tp.offset, int(data["start"]), int(data["skipped"])
            )
        except (ValueError, KeyError, TypeError):
            log.warning("htmqc-kafka: a loss note of %s/%s in %s is not ours: %r",
                        tp.topic, tp.partition, group, tp.metadata)
    return notes


def clear_notes(admin: Any, group: str, counted: Mapping[TopicPartition, int]) -> None:
    """Blank the notes ``counted`` lists that are still there unchanged (a note
    written since, at another end, stays): the offset stays, its metadata goes
    (Kafka's ``OffsetDelete`` is not in confluent-kafka's admin API)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
    from confluent_kafka import TopicPartition as TP

    if not counted:
        return
    present = read_notes(admin, group)
    stale = [TP(*tp, end, metadata="") for tp, end in sorted(counted.items())
             if tp in present and present[tp].end == end]
    if not stale:
        return
    try:
        admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, stale)], request_timeout=TIMEOUT
        )[group].result()
    except KafkaException as exc:
        log.warning("htmqc-kafka: could not blank counted loss notes of %s (%s); "
                    "they are not counted twice", group, exc)
