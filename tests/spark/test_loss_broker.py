"""``htmqc-kafka``'s loss paths on Apache Kafka, without Spark's JVM (the real
planner and reader, called as Spark calls them):

* records deleted between a batch's planning and its read: the reader skips
  them and leaves a loss note in the query's notes group, the planner counts it
  once in ``"@lost"``, and the source's commit blanks it
  (:mod:`htmqc.spark.loss_notes`). Kafka only: the bundled broker drops commit
  metadata, where the note lives;
* a partition truncated under the checkpoint (its end now below the next offset,
  with no topic id to tell a recreated topic: a checkpoint of the first
  ``htmqc-kafka``, or a broker without topic ids): ``backwards``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from htmqc.produce import produce
from tests.services import require_module
from tests.spark.topics import recreate_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark]

require_module("pyspark")
from confluent_kafka import TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

from htmqc.spark import kafka_source, loss_notes  # noqa: E402
from htmqc.spark.kafka_offsets import SourceOffset  # noqa: E402
from htmqc.spark.kafka_options import parse_options  # noqa: E402
from htmqc.spark.kafka_source import KafkaStreamReader  # noqa: E402


@pytest.fixture(autouse=True)
def _close_readers_consumers() -> Iterator[None]:
    """The reader keeps one consumer per settings (an executor's cache): close
    them before the session's broker stops."""
    yield
    while kafka_source._CONSUMERS:
        kafka_source._CONSUMERS.popitem()[1].close()


def lost(offset: dict[str, Any]) -> dict[str, int]:
    return dict(json.loads(json.dumps(offset)).get("@lost") or {})


@pytest.mark.brokers("kafka")
def test_records_deleted_between_planning_and_reading_are_counted_once(
    broker: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 200, keys=2)
    options = parse_options(
        {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
         "failOnDataLoss": "false"},
        batch=False,
    )  # fmt: skip
    reader = KafkaStreamReader(options)
    group = loss_notes.new_group()
    # Batch 0 was planned as [0, 200) ...
    start = SourceOffset({(topic, 0): 0}, notes=group).to_json()
    end = SourceOffset({(topic, 0): 200}, notes=group).to_json()
    (part,) = reader.partitions(start, end)
    # ... then retention took the first 150 records before the executor read them.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tp = TopicPartition(topic, 0, 150)
    admin.delete_records([tp])[tp].result()
    read = [o for batch in reader.read(part) for o in batch.column("offset").to_pylist()]
    assert read == list(range(150, 200))
    try:
        first = reader.latestOffset(end, ReadAllAvailable())
        assert lost(first) == {"offsets": 150, "events": 1}
        assert first["@notes"] == {"group": group, "counted": {topic: {"0": 200}}}
        # Nothing new, the note still there: not counted again.
        again = reader.latestOffset(first, ReadAllAvailable())
        assert lost(again) == {"offsets": 150, "events": 1}
        reader.commit(first)  # Spark wrote ``first``: its counted notes go
        assert loss_notes.read_notes(admin, group) == {}
        produce(broker.bootstrap, topic, 10, keys=2, start_id=200)
        later = reader.latestOffset(again, ReadAllAvailable())
        assert lost(later) == {"offsets": 150, "events": 1}
        assert later[topic] == {"0": 210}
    finally:
        reader.stop()


@pytest.mark.brokers("kafka")
def test_a_query_that_fails_on_data_loss_keeps_no_notes(
    broker: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 5, keys=1)
    strict = KafkaStreamReader(
        parse_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic},
                      batch=False)
    )  # fmt: skip
    lenient = KafkaStreamReader(
        parse_options({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic,
                       "failOnDataLoss": "false", "startingOffsets": "earliest"}, batch=False)
    )  # fmt: skip
    try:
        assert "@notes" not in strict.initialOffset()
        first = lenient.initialOffset()
        assert first["@notes"]["group"].startswith(loss_notes.GROUP_PREFIX)
        # A checkpoint written without notes (failOnDataLoss was true) gets a group.
        plain = SourceOffset({(topic, 0): 0}).to_json()
        assert lenient.latestOffset(plain, ReadAllAvailable())["@notes"]["group"]
    finally:
        strict.stop()
        lenient.stop()


@pytest.mark.brokers("kafka")
def test_a_partition_truncated_under_the_checkpoint_is_data_loss(
    broker: Any, new_topic: Callable[..., str]
) -> None:
    from htmqc.spark.kafka_offsets import DataLossError

    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 300, keys=2)
    recreate_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 100, keys=2)
    # The first htmqc-kafka's checkpoint shape: offsets only, no topic ids.
    checkpoint = {f"{topic}/0": 300}
    settings = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}
    strict = KafkaStreamReader(parse_options(settings, batch=False))
    lenient = KafkaStreamReader(parse_options({**settings, "failOnDataLoss": "false"},
                                              batch=False))  # fmt: skip
    try:
        with pytest.raises(
            DataLossError, match=rf"{topic}/0 backwards: next offset 300 > end 100"
        ):
            strict.latestOffset(checkpoint, ReadAllAvailable())
        going_on = lenient.latestOffset(checkpoint, ReadAllAvailable())
        assert going_on[topic] == {"0": 100}  # on from the end, as Spark's connector does
        assert lost(going_on) == {"offsets": 0, "events": 1}
    finally:
        strict.stop()
        lenient.stop()
