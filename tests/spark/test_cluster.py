"""The pipeline on a Spark standalone cluster (a master and two workers on
loopback, executors in processes of their own), not only ``local[2]``:
``htmqc-kafka`` and Spark's ``kafka`` source into the exactly-once SQL sink,
with an executor killed (``SIGKILL``) in the middle of the stream, and with
the driver's whole process group killed mid-stream and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from htmqc.audit import Produced, audit
from htmqc.audit.load import effects_from_source
from htmqc.produce import produce
from tests.services import postgres_url, require_module
from tests.spark.topics import ID_COLUMNS, reader, write_aborted

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

require_module("pyspark")
from htmqc.spark.cluster import SparkCluster, start_cluster  # noqa: E402
from htmqc.spark.session import connector_jars, spark_session  # noqa: E402
from htmqc.spark.sinks import SqlBatchSink  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    with start_cluster(workers=2, cores=2, memory="1g") as running:
        yield running


@pytest.mark.brokers("kafka")
@pytest.mark.parametrize(
    "fmt",
    [
        # The sink recognises a replayed batch whatever the source: Spark's own runs
        # in the long tier (`--kafka-full`), saving two minutes of a CPU-bound run.
        pytest.param("kafka", marks=pytest.mark.kafka_full),
        "htmqc-kafka",
    ],
)
def test_driver_killed_mid_stream_then_restarted_stores_every_id_once(
    cluster: SparkCluster, broker: Any, new_topic: Callable[..., str], tmp_path: Path, fmt: str
) -> None:
    """Killed after the sink stored batch 1 and before Spark recorded it, so the
    restart replays batch 1. Runs before ``cluster_spark`` exists: this driver
    is the cluster's only app."""
    if fmt == "kafka" and not connector_jars():
        pytest.fail("Spark's Kafka connector is not fetched: run `make setup`")
    topic = new_topic(partitions=4)
    produce(broker.bootstrap, topic, 4000, keys=8, transactional=True)
    table = f"driver_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(postgres_url(), table, table)
    assert sink.last_batch() is None  # creates the batch table now, not racing the driver
    args = [cluster.url, broker.bootstrap, topic, postgres_url(), table, str(tmp_path / "ck"), fmt]
    command = [sys.executable, "-m", "tests.spark.driver_main", *args]
    mark = tmp_path / "batch-1-stored"
    with (tmp_path / "driver.log").open("wb") as log:
        driver = subprocess.Popen([*command, str(mark)], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 180
        while not mark.exists():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the driver stored no batch 1 in 180 s"
            time.sleep(0.1)
        os.killpg(driver.pid, signal.SIGKILL)  # Python and its JVM, before Spark's commit
        driver.wait()
    assert sink.last_batch() == 1  # stored; Spark's commit log does not have it
    restarted = subprocess.run(command, capture_output=True, timeout=300)
    assert restarted.returncode == 0, restarted.stderr.decode()[-2000:]
    effects = list(effects_from_source(f"{postgres_url()}?table={table}"))
    report = audit([Produced(f"{i:012d}") for i in range(4000)], effects)
    assert report.ok, report.summary()
    assert len(effects) == 4000


@pytest.fixture(scope="module")
def cluster_spark(cluster: SparkCluster) -> Iterator[Any]:
    with spark_session(
        cluster.url,
        app="htmqc-cluster-tests",
        spark__executor__memory="512m",
        spark__executor__cores="1",
        spark__cores__max="2",
    ) as session:
        yield session


@pytest.mark.brokers("kafka")
@pytest.mark.parametrize("fmt", ["htmqc-kafka", "kafka"])
def test_stream_into_the_sql_sink_on_two_workers_with_an_executor_killed(
    cluster: SparkCluster,
    cluster_spark: Any,
    broker: Any,
    new_topic: Callable[..., str],
    tmp_path: Path,
    fmt: str,
) -> None:
    if fmt == "kafka" and not connector_jars():
        pytest.fail("Spark's Kafka connector is not fetched: run `make setup`")
    topic = new_topic(partitions=4)
    produce(broker.bootstrap, topic, 2000, keys=8, transactional=True)
    write_aborted(broker.bootstrap, topic, range(2000, 2200), keys=8)
    produce(broker.bootstrap, topic, 2000, keys=8, transactional=True, start_id=2200)
    table = f"cluster_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(postgres_url(), table, table)
    seen: dict[str, list[int]] = {"killed": []}

    def store(df: Any, batch_id: int) -> None:
        if batch_id == 1 and not seen["killed"]:
            seen["killed"] = cluster.kill_executors(0)  # the master starts a new one
        sink(df, batch_id)

    options = {"kafka.isolation.level": "read_committed", "maxOffsetsPerTrigger": "1000"}
    rows = reader(cluster_spark, broker.bootstrap, topic, fmt, **options).selectExpr(*ID_COLUMNS)
    query = (
        rows.writeStream.foreachBatch(store)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
    assert query.exception() is None
    assert seen["killed"], "worker 0 had no executor to kill"
    assert all(cluster.executor_pids(i) for i in range(2))  # executors are other processes
    produced = [Produced(f"{i:012d}") for i in [*range(2000), *range(2200, 4200)]]
    effects = list(effects_from_source(f"{postgres_url()}?table={table}"))
    report = audit(produced, effects, aborted=[f"{i:012d}" for i in range(2000, 2200)])
    assert report.ok, report.summary()
    assert len(effects) == 4000


@pytest.mark.brokers("kafka")
def test_a_staging_task_retried_after_its_rows_committed_adds_nothing_twice(
    cluster_spark: Any,
    broker: Any,
    new_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task of the SQL sink's staging job commits its rows, then fails; the
    cluster (4 attempts per task) runs it again: the retry replaces that
    task's staging rows, so each row is stored once."""
    from htmqc.spark import sinks
    from tests.spark.failing_writer import FailingOnce, failed_marks

    for mark in failed_marks():
        mark.unlink()
    monkeypatch.setattr(sinks, "_StageWriter", FailingOnce)
    topic = new_topic(partitions=4)
    produce(broker.bootstrap, topic, 3000, keys=8, transactional=True)
    table = f"retried_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(postgres_url(), table, table)
    options = {"kafka.isolation.level": "read_committed", "maxOffsetsPerTrigger": "1000"}
    rows = reader(cluster_spark, broker.bootstrap, topic, "htmqc-kafka", **options)
    query = (
        rows.selectExpr(*ID_COLUMNS).writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
    assert query.exception() is None
    assert len(failed_marks()) >= 3, "no staging task failed after committing"
    effects = list(effects_from_source(f"{postgres_url()}?table={table}"))
    report = audit([Produced(f"{i:012d}") for i in range(3000)], effects)
    assert report.ok, report.summary()
    assert len(effects) == 3000
