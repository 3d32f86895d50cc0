"""Spark's own Kafka connector skips a recreated topic's records silently;
:class:`htmqc.spark.topic_guard.TopicGuard` fails the batch instead (issue 21:
"topic deleted and recreated; restart on the old checkpoint skipped ~300
records silently"), on Apache Kafka."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.audit.load import effects_from_source
from htmqc.produce import produce
from tests.services import require_module
from tests.spark.topics import recreate_topic, run_query

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

require_module("pyspark")
from pyspark.errors import StreamingQueryException  # noqa: E402

from htmqc.spark.session import connector_jars  # noqa: E402
from htmqc.spark.sinks import SqlBatchSink  # noqa: E402
from htmqc.spark.topic_guard import IDS_FILE, TopicGuard  # noqa: E402


def run(spark: Any, bootstrap: str, topic: str, checkpoint: Path, sink: Any) -> Any:
    """One ``availableNow`` run of ``topic`` through Spark's connector into ``sink``."""
    committed = {"kafka.isolation.level": "read_committed"}
    return run_query(spark, bootstrap, topic, checkpoint, sink, "kafka", **committed)


def ids(db: Path, table: str) -> list[str]:
    return [e.id for e in effects_from_source(f"sqlite:///{db}?table={table}")]


@pytest.mark.brokers("kafka")
def test_a_recreated_topic_under_spark_connector_is_caught_by_the_guard(
    spark: Any,
    broker: Any,
    new_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not connector_jars():
        pytest.fail("Spark's Kafka connector is not fetched: run `make setup`")
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 600, keys=4)
    db, ck = tmp_path / "out.db", tmp_path / "ck"
    guarded = TopicGuard(SqlBatchSink(db, "t", "q"), broker.bootstrap, [topic])
    run(spark, broker.bootstrap, topic, ck, guarded)
    assert len(ids(db, "t")) == 600
    assert (ck / IDS_FILE).exists()
    recreate_topic(broker.bootstrap, topic, 2)  # as many partitions: the connector sees no change
    produce(broker.bootstrap, topic, 900, keys=4, start_id=1000)
    shutil.copytree(ck, tmp_path / "ck-plain")

    # Spark's connector alone: no error, and most of the new topic never read.
    plain = run(spark, broker.bootstrap, topic, tmp_path / "ck-plain", SqlBatchSink(db, "p", "p"))
    assert plain.exception() is None
    assert len(ids(db, "p")) < 900

    with pytest.raises(StreamingQueryException, match=rf"topic recreated or deleted .*{topic}: "):
        run(spark, broker.bootstrap, topic, ck, guarded)
    assert len(ids(db, "t")) == 600  # nothing of the batch stored
    with pytest.raises(StreamingQueryException, match="topic recreated"):
        run(spark, broker.bootstrap, topic, ck, guarded)  # and again after a restart
    accepting = TopicGuard(
        SqlBatchSink(db, "t", "q"), broker.bootstrap, [topic], accept_recreated=True
    )
    with caplog.at_level(logging.WARNING, logger="htmqc.spark.topic_guard"):
        run(spark, broker.bootstrap, topic, ck, accepting)
    assert any("accept_recreated=True" in m for m in caplog.messages)
    assert len(ids(db, "t")) == 600 + len(ids(db, "p"))
    run(spark, broker.bootstrap, topic, ck, guarded)  # the new ids are the checkpoint's now
