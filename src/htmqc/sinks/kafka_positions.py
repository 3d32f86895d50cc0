"""``finished_above`` for the Kafka→Kafka sink, kept where every broker keeps it.

Kafka stores a string of metadata with each committed offset, and the sink puts
``finished_above`` there (:func:`~htmqc.sinks.encoding.encode_metadata`). Some
brokers drop that string (the bundled Tansu 0.6 does), and then a restart would
run out-of-order finished messages again and send their output twice. So the
sink also writes, in the same transaction, a record to a compacted *positions
topic* (default ``htmqc-positions``, one partition) keyed by
``group/topic/partition`` with the committed offset and ``finished_above``.
It writes one only when ``finished_above`` is not empty; a record applies only
while its ``committed`` equals the group's committed offset, so an older record
never resurrects offsets of an earlier commit.

Reading it (on ``claim``) consumes the topic ``read_committed`` up to its end,
which waits for transactions still open on it (a zombie's, bounded by its
``transaction.timeout.ms``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from htmqc.core.decisions import TopicPartition
from htmqc.errors import RuntimeFailure

DEFAULT_POSITIONS_TOPIC = "htmqc-positions"


def record_key(group: str, tp: TopicPartition) -> bytes:
    """The compaction key of a partition's record."""
    return json.dumps([group, tp[0], tp[1]]).encode()


def record_value(committed: int, encoded_finished: str) -> bytes:
    return json.dumps({"committed": committed, "finished_above": encoded_finished}).encode()


def ensure_topic(bootstrap: str, topic: str, extra: dict[str, Any], timeout: float) -> None:
    """Create the one-partition compacted positions topic if it is missing."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **_client_settings(extra)})
    futures = admin.create_topics(
        # replication -1: the broker's default. With 1, the positions of every group
        # would sit on one broker of a replicated cluster: its loss would block every
        # Kafka-sink transaction (and brokers before Kafka 4.0 refuse acks=all writes
        # to it when min.insync.replicas is 2).
        [NewTopic(topic, 1, -1, config={"cleanup.policy": "compact"})],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise RuntimeFailure(
            f"kafka sink: cannot create the positions topic {topic!r}: {exc}",
            "create it (1 partition, cleanup.policy=compact) or allow topic creation",
        ) from exc


def read_positions(
    bootstrap: str,
    topic: str,
    group: str,
    tps: Iterable[TopicPartition],
    extra: dict[str, Any],
    timeout: float,
) -> dict[TopicPartition, tuple[int, str]]:
    """The latest committed record (``committed``, encoded finished_above) per partition."""
    wanted = {record_key(group, tp): tp for tp in tps}
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **_client_settings(extra),
            "group.id": f"htmqc-positions-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    found: dict[TopicPartition, tuple[int, str]] = {}
    try:
        _low, high = reader.get_watermark_offsets(KafkaTopicPartition(topic, 0), timeout)
        if high <= 0:
            return found
        ktp = KafkaTopicPartition(topic, 0, 0)
        reader.assign([ktp])
        deadline = time.monotonic() + timeout
        while True:
            for msg in reader.consume(500, 0.2):
                key, raw = msg.key(), msg.value()
                if msg.error() is not None or key is None or raw is None or key not in wanted:
                    continue
                value = json.loads(raw)
                found[wanted[key]] = (int(value["committed"]), str(value["finished_above"]))
            [pos] = reader.position([KafkaTopicPartition(topic, 0)])
            if pos.offset >= high:
                return found
            if time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"kafka sink: reading the positions topic {topic!r} did not reach its end "
                    f"({pos.offset} of {high}) within {timeout:g} s",
                    "a transaction on it is still open; retry once it ends or times out",
                )
    except KafkaException as exc:
        raise RuntimeFailure(
            f"kafka sink: reading the positions topic {topic!r} failed: {exc}",
            "check that the broker is reachable",
        ) from exc
    finally:
        reader.close()


def _client_settings(extra: dict[str, Any]) -> dict[str, Any]:
    """Connection settings (security, addresses) shared with the producer."""
    return {
        k: v
        for k, v in extra.items()
        if k.startswith(("security.", "sasl.", "ssl.", "client.", "socket.", "broker."))
    }
