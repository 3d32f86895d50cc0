"""The ``htmqc-kafka`` streaming source and the exactly-once batch sinks, against
the bundled broker: restart from the checkpoint, aborted transactions, and a
failure injected inside ``foreachBatch``; every run is checked by the audit."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.audit import Effect, Produced, audit
from htmqc.audit.load import effects_from_source
from htmqc.produce import produce
from tests.services import require_module

pytestmark = [pytest.mark.slow, pytest.mark.broker]

pyspark = require_module("pyspark")
from pyspark.errors import StreamingQueryException  # noqa: E402

from htmqc.spark.kafka_source import register  # noqa: E402
from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink  # noqa: E402

Batch = Callable[[Any, int], None]


def run_query(
    spark: Any, bootstrap: str, topic: str, checkpoint: Path, sink: Batch, **options: str
) -> None:
    """One ``availableNow`` run of ``topic`` into ``sink``, resuming from ``checkpoint``."""
    register(spark)
    reader = spark.readStream.format("htmqc-kafka").option("bootstrap", bootstrap)
    for name, value in {"topics": topic, **options}.items():
        reader = reader.option(name, value)
    rows = reader.load().selectExpr(
        "cast(substring(value, 1, 12) as string) AS id",
        "cast(key AS string) AS key",
        "partition",
        "offset",
    )
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


def produced_ids(count: int, start: int = 0) -> list[Produced]:
    return [Produced(f"{i:012d}") for i in range(start, start + count)]


def parquet_effects(spark: Any, folder: Path) -> list[Effect]:
    rows = spark.read.parquet(str(folder)).orderBy("batch", "partition", "offset").collect()
    return [Effect(r.id, r.key, r.partition, r.offset) for r in rows]


def test_restart_from_checkpoint_stores_every_id_once(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    db, parquet = tmp_path / "out.db", tmp_path / "parquet"
    sql_sink, parquet_sink = SqlBatchSink(db, "effects", "q"), ParquetBatchSink(parquet)

    def both(df: Any, batch_id: int) -> None:
        sql_sink(df, batch_id)
        parquet_sink(df, batch_id)

    produce(broker.bootstrap, topic, 200, keys=5)
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", both)
    assert audit(produced_ids(200), effects_from_source(f"sqlite:///{db}")).ok
    produce(broker.bootstrap, topic, 150, keys=5, start_id=200)
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", both)
    for effects in (effects_from_source(f"sqlite:///{db}"), parquet_effects(spark, parquet)):
        report = audit(produced_ids(350), effects)
        assert report.ok, report.summary()
        assert report.totals["effects"] == 350


@pytest.mark.brokers("tansu", "kafka")
def test_aborted_transactions_are_never_read(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    written = produce(broker.bootstrap, topic, 3000, keys=4, transactional=True, abort_every=2)
    assert len(written.aborted_ids) == 1000
    db = tmp_path / "out.db"
    # Batches of 700 offsets end inside transactions and on their markers.
    run_query(
        spark, broker.bootstrap, topic, tmp_path / "ck", SqlBatchSink(db, "effects", "q"),
        maxRecordsPerBatch="700",
    )  # fmt: skip
    report = audit(
        produced_ids(3000),
        effects_from_source(f"sqlite:///{db}"),
        aborted=[f"{i:012d}" for i in written.aborted_ids],
    )
    assert report.counts["aborted-read"] == 0
    assert report.ok, report.summary()
    assert report.totals["effects"] == 2000


def test_failure_inside_foreach_batch_then_restart_stays_exactly_once(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 300, keys=7)
    db = tmp_path / "out.db"
    sink = SqlBatchSink(db, "effects", "q")
    failed: list[int] = []

    def crash_after_store(df: Any, batch_id: int) -> None:
        sink(df, batch_id)  # stored and committed ...
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("injected crash before Spark records the batch")

    options = {"maxRecordsPerBatch": "100"}
    with pytest.raises(StreamingQueryException, match="injected crash"):
        run_query(spark, broker.bootstrap, topic, tmp_path / "ck", crash_after_store, **options)
    assert failed == [1]
    # ... so the restart replays batch 1, which the sink recognises and skips.
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", crash_after_store, **options)
    report = audit(produced_ids(300), effects_from_source(f"sqlite:///{db}"))
    assert report.ok, report.summary()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT batch_id FROM htmqc_spark_batches").fetchone()[0] >= 2
