"""A guard for Spark's own Kafka connector: a topic recreated under a checkpoint.

Spark's connector (``format("kafka")``) keeps only offsets in its checkpoint.
When a topic is deleted and created again and the new topic has grown past
the old offsets, a restart goes on at the old offsets in the new topic and
skips every record below them, with no error and no warning, even with
``failOnDataLoss=true`` (``tests/spark/test_topic_guard.py`` shows it on
Apache Kafka). ``htmqc-kafka`` compares Kafka topic ids and fails instead.

:class:`TopicGuard` brings that check to a pipeline on Spark's connector: it
wraps the ``foreachBatch`` function, asks Kafka for the topics' ids before each
batch, and compares them with the ids it kept beside the query's checkpoint
(``<checkpoint>/htmqc_topic_ids.json``, written after each stored batch). A
topic whose id changed, or that is gone, fails the batch with one line before
any of its rows are read; a restart fails the same way until the checkpoint is
replaced (the usual fix: a new checkpoint, ``startingOffsets=earliest``) or
``accept_recreated=True`` is passed, which logs the change and goes on (the
new topic's records below the old offsets stay skipped: Spark has already
planned the batch from them).

The checkpoint must be on a local filesystem (a ``file:`` URI or a path).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from htmqc.errors import UsageError
from htmqc.spark.sinks import query_identity

log = logging.getLogger("htmqc.spark.topic_guard")
IDS_FILE = "htmqc_topic_ids.json"
_GONE = "(gone)"


class TopicRecreated(RuntimeError):
    """A topic the query reads has another id than when its checkpoint was written."""


def topic_ids(bootstrap: str, topics: Iterable[str], config: Mapping[str, str]) -> dict[str, str]:
    """Each topic's Kafka topic id now; a topic that does not exist is absent."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    out: dict[str, str] = {}
    futures = admin.describe_topics(TopicCollection(sorted(topics)), request_timeout=15)
    for topic, future in futures.items():
        try:
            out[topic] = str(future.result().topic_id)
        except KafkaException as exc:
            if "UNKNOWN_TOPIC" not in str(exc):
                raise
    return out


def _local(checkpoint: str) -> Path:
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        raise UsageError(
            f"TopicGuard keeps topic ids beside the checkpoint, which is on {parsed.scheme}:",
            "use a local checkpoint, or read with format('htmqc-kafka'), which checks topic ids",
        )
    return Path(parsed.path if parsed.scheme else checkpoint)


class TopicGuard:
    """``foreachBatch(TopicGuard(sink, bootstrap, topics))``: ``sink(df, batch_id)``
    runs only while ``topics`` are the topics the checkpoint was written for
    (see the module docs). ``kafka_config``: extra AdminClient settings (TLS,
    SASL), librdkafka names."""

    def __init__(
        self,
        func: Callable[[Any, int], None],
        bootstrap: str,
        topics: Iterable[str],
        *,
        accept_recreated: bool = False,
        kafka_config: Mapping[str, str] | None = None,
    ) -> None:
        self.func = func
        self.bootstrap = bootstrap
        self.topics = tuple(sorted(set(topics)))
        if not self.topics:
            raise UsageError("TopicGuard needs the topics the query reads", "pass topics=('t',)")
        self.accept_recreated = accept_recreated
        self.kafka_config = dict(kafka_config or {})

    def __call__(self, df: Any, batch_id: int) -> None:
        me = query_identity(df)
        if not me.checkpoint:
            raise UsageError(
                "TopicGuard found no checkpoint for this query",
                "call it from writeStream.foreachBatch with a checkpointLocation",
            )
        path = _local(me.checkpoint) / IDS_FILE
        now = topic_ids(self.bootstrap, self.topics, self.kafka_config)
        kept: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        changed = {
            t: (kept[t], now.get(t, _GONE))
            for t in self.topics
            if t in kept and kept[t] != now.get(t)
        }
        if changed:
            what = "; ".join(f"{t}: topic id {a} is now {b}" for t, (a, b) in changed.items())
            line = (
                f"topic recreated or deleted since checkpoint {path.parent} was written ({what}); "
                f"Spark's Kafka connector would go on at the old offsets and skip records silently"
            )
            if not self.accept_recreated:
                raise TopicRecreated(
                    f"{line}: start a new checkpoint (startingOffsets=earliest), or pass "
                    "accept_recreated=True to go on anyway"
                )
            log.warning("TopicGuard (accept_recreated=True): %s; going on", line)
        self.func(df, batch_id)
        record = {**kept, **{t: now[t] for t in self.topics if t in now}}
        if record != kept:
            temp = path.with_name(f"{IDS_FILE}.{uuid.uuid4().hex}")
            temp.write_text(json.dumps(record, sort_keys=True))
            os.replace(temp, path)
