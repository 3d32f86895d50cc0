"""The ``htmqc-kafka`` source and the exactly-once batch sinks against a broker:
restart from the checkpoint, aborted transactions, a failure inside
``foreachBatch``, data loss (``failOnDataLoss``), and the same rows as Spark's
own connector; every run is checked by the audit."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.audit import Effect, Produced, audit
from htmqc.audit.load import effects_from_source
from htmqc.produce import produce
from tests.services import require_module
from tests.spark.topics import ID_COLUMNS, reader, recreate_topic, run_query, write_aborted

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

pyspark = require_module("pyspark")
from pyspark.errors import StreamingQueryException  # noqa: E402

from htmqc.spark.session import connector_jars  # noqa: E402
from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink  # noqa: E402

Batch = Callable[[Any, int], None]


def produced_ids(count: int, start: int = 0) -> list[Produced]:
    return [Produced(f"{i:012d}") for i in range(start, start + count)]


def parquet_effects(spark: Any, folder: Path) -> list[Effect]:
    rows = spark.read.parquet(str(folder)).orderBy("batch", "partition", "offset").collect()
    return [Effect(r.id, r.key, r.partition, r.offset) for r in rows]


def sqlite_ids(db: Path) -> list[str]:
    """Ids in table ``t`` of ``db``, in storage order."""
    return [e.id for e in effects_from_source(f"sqlite:///{db}?table=t")]


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
        maxOffsetsPerTrigger="700",
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

    options = {"maxOffsetsPerTrigger": "100"}
    with pytest.raises(StreamingQueryException, match="injected crash"):
        run_query(spark, broker.bootstrap, topic, tmp_path / "ck", crash_after_store, **options)
    assert failed == [1]
    # ... so the restart replays batch 1, which the sink recognises and skips.
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", crash_after_store, **options)
    report = audit(produced_ids(300), effects_from_source(f"sqlite:///{db}"))
    assert report.ok, report.summary()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT batch_id FROM htmqc_spark_batches").fetchone()[0] >= 2


@pytest.mark.brokers("tansu", "kafka")
def test_a_fresh_checkpoint_on_a_used_sink_fails_instead_of_skipping(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Issue 21: the sink said 'batch 0: 1000 rows' and stored 0 rows."""
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 300, keys=3)
    db, parquet = tmp_path / "out.db", tmp_path / "parquet"
    small = {"maxOffsetsPerTrigger": "100"}
    sinks = {"sql": SqlBatchSink(db, "t", "q"), "parquet": ParquetBatchSink(parquet)}
    for name, sink in sinks.items():
        run_query(spark, broker.bootstrap, topic, tmp_path / f"{name}1", sink, **small)
    assert len(sqlite_ids(db)) == 300
    for name, sink in sinks.items():
        with pytest.raises(StreamingQueryException, match=rf"holds the batches of query .*{name}1"):
            run_query(spark, broker.bootstrap, topic, tmp_path / f"{name}2", sink)
    assert len(sqlite_ids(db)) == 300
    run_query(
        spark, broker.bootstrap, topic, tmp_path / "ck3", SqlBatchSink(db, "t", "q", adopt=True)
    )
    assert len(sqlite_ids(db)) == 600  # adopted: ck3's batch 0 is its own, all 300 again
    first = parquet_effects(spark, parquet)
    adopting = ParquetBatchSink(parquet, adopt=True)
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck4", adopting, **small)
    stored = parquet_effects(spark, parquet)
    assert stored[:300] == first  # the old query's batches untouched, the new ones after them
    assert sorted(e.id for e in stored[300:]) == [p.id for p in produced_ids(300)]


@pytest.mark.brokers("kafka")
def test_recreated_topic_is_data_loss(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Issue 21: a restart on the old checkpoint skipped ~300 records silently.
    Recreated with fewer partitions: the loss names the topic, not only partition 1."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 600, keys=4)
    db = tmp_path / "out.db"
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", SqlBatchSink(db, "t", "q"))
    recreate_topic(broker.bootstrap, topic, 1)  # and fewer partitions than before
    produce(broker.bootstrap, topic, 900, keys=4, start_id=1000)
    sink = SqlBatchSink(db, "t", "q")
    with pytest.raises(StreamingQueryException, match=rf"data loss: {topic} recreated: topic id"):
        run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    assert len(sqlite_ids(db)) == 600
    query = run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink, failOnDataLoss="false")
    assert sorted(sqlite_ids(db)) == [p.id for p in produced_ids(600) + produced_ids(900, 1000)]
    ends = [p["sources"][0]["endOffset"] for p in query.recentProgress]
    assert any('"@lost":{"offsets":0,"events":1}' in e.replace(" ", "") for e in ends), ends


@pytest.mark.brokers("kafka")
def test_a_deleted_topic_is_data_loss(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Deleted and not recreated: every partition the checkpoint holds is gone."""
    from confluent_kafka.admin import AdminClient

    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 200, keys=4)
    db = tmp_path / "out.db"
    sink = SqlBatchSink(db, "t", "q")
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result()
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:  # deletion is asynchronous
        assert time.monotonic() < deadline, f"{topic} still listed after 30 s"
        time.sleep(0.3)
    with pytest.raises(
        StreamingQueryException, match=rf"data loss: {topic}/0 gone: .*{topic}/1 gone"
    ):
        run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    query = run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink, failOnDataLoss="false")
    assert query.exception() is None
    assert len(sqlite_ids(db)) == 200


@pytest.mark.brokers("kafka")
def test_deleted_records_are_data_loss_and_counted(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 100, keys=2)
    db = tmp_path / "out.db"
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", SqlBatchSink(db, "t", "q"))
    produce(broker.bootstrap, topic, 100, keys=2, start_id=100)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 150)])[TopicPartition(topic, 0, 150)].result()
    sink = SqlBatchSink(db, "t", "q")
    with pytest.raises(
        StreamingQueryException, match=rf"{topic}/0 deleted: next offset 100 < earliest 150"
    ):
        run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    query = run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink, failOnDataLoss="false")
    assert sqlite_ids(db) == [p.id for p in produced_ids(100) + produced_ids(50, 150)]
    ends = [p["sources"][0]["endOffset"] for p in query.recentProgress]
    assert any('"@lost":{"offsets":50,"events":1}' in e.replace(" ", "") for e in ends), ends


@pytest.mark.brokers("kafka")
def test_partitions_added_mid_stream_are_read_from_offset_zero(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 100, keys=2)
    db = tmp_path / "out.db"
    sink = SqlBatchSink(db, "t", "q")
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result()
    produce(broker.bootstrap, topic, 300, keys=30, start_id=100)
    run_query(spark, broker.bootstrap, topic, tmp_path / "ck", sink)
    effects = list(effects_from_source(f"sqlite:///{db}?table=t"))
    assert audit(produced_ids(400), effects).ok
    assert {e.partition for e in effects} == {0, 1, 2}


@pytest.mark.brokers("kafka")
def test_spark_connector_and_htmqc_kafka_read_the_same_rows(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Aborted transactions (gaps of aborted records and markers) read both ways."""
    if not connector_jars():
        pytest.skip("Spark's Kafka connector is not fetched: run `make setup`")
    topic = new_topic(partitions=3)
    produce(broker.bootstrap, topic, 1000, keys=9, transactional=True)
    write_aborted(broker.bootstrap, topic, range(1000, 1300), keys=9)  # in the log
    produce(broker.bootstrap, topic, 1000, keys=9, transactional=True, start_id=1300)
    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    stored: dict[str, list[tuple[Any, ...]]] = {}
    for fmt in ("kafka", "htmqc-kafka"):
        rows: list[tuple[Any, ...]] = []

        def keep(df: Any, batch_id: int, rows: list[tuple[Any, ...]] = rows) -> None:
            rows.extend(tuple(r) for r in df.select(*columns).collect())

        stream = reader(
            spark, broker.bootstrap, topic, fmt,
            maxOffsetsPerTrigger="1000", **{"kafka.isolation.level": "read_committed"},
        )  # fmt: skip
        query = (
            stream.writeStream.foreachBatch(keep)
            .option("checkpointLocation", str(tmp_path / fmt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        query.stop()
        stored[fmt] = sorted(rows, key=lambda r: (r[3], r[4]))
        batch = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .load()
            .select(*columns)
            .orderBy("partition", "offset")
        )
        assert [tuple(r) for r in batch.collect()] == stored[fmt]
    assert len(stored["kafka"]) == 2000
    assert stored["htmqc-kafka"] == stored["kafka"]


@pytest.mark.brokers("kafka")
def test_subscribe_pattern_picks_up_new_topics_and_assign_reads_only_its_partitions(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """subscribePattern, assign and includeHeaders in a stream, on a broker."""
    prefix = f"pat-{uuid.uuid4().hex[:6]}"
    first = new_topic(partitions=2, prefix=prefix)
    produce(broker.bootstrap, first, 60, keys=8)
    new_topic(partitions=1, prefix=f"other-{prefix}")  # does not match: never read

    def stream(checkpoint: str, **options: str) -> list[Any]:
        frame = spark.readStream.format("htmqc-kafka").option(
            "kafka.bootstrap.servers", broker.bootstrap
        )
        for name, value in {"startingOffsets": "earliest", **options}.items():
            frame = frame.option(name, value)
        rows: list[Any] = []
        headers = options.get("includeHeaders") == "true"
        query = (
            frame.load()
            .selectExpr("topic", "partition", "offset", *(["headers"] if headers else []))
            .writeStream.foreachBatch(lambda df, _: rows.extend(df.collect()))
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        query.stop()
        assert query.exception() is None
        return rows

    pattern = {"subscribePattern": f"{prefix}-.*", "includeHeaders": "true"}
    before = stream("pattern", **pattern)
    assert len(before) == 60 and {r.topic for r in before} == {first}
    assert all(r.headers[0].key == "htmqc-id" for r in before)
    second = new_topic(partitions=1, prefix=prefix)  # created mid-stream, matches
    produce(broker.bootstrap, second, 25, keys=8)
    produce(broker.bootstrap, first, 15, keys=8, start_id=60)
    after = stream("pattern", **pattern)
    assert sorted(r.offset for r in after if r.topic == second) == list(range(25))
    assert len(after) == 40  # the first topic goes on where it stopped
    of_first = {(r.partition, r.offset) for r in before + after if r.topic == first}
    assigned = stream("assign", assign=f'{{"{first}": [1]}}')
    assert {r.topic for r in assigned} == {first}
    assert sorted((r.partition, r.offset) for r in assigned) == sorted(
        (part, offset) for part, offset in of_first if part == 1
    )
    assert assigned and len(assigned) < 75


@pytest.mark.brokers("kafka")
def test_planning_does_not_grow_a_second_per_partition(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Issue 21: latestOffset took about 1 s per partition (3,993 ms for 4)."""
    topic = new_topic(partitions=16)
    produce(broker.bootstrap, topic, 1600, keys=64)
    stream = reader(spark, broker.bootstrap, topic, maxOffsetsPerTrigger="800")
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    query.stop()
    progress = query.recentProgress
    assert sum(p["numInputRows"] for p in progress) == 1600
    worst = max(p["durationMs"].get("latestOffset", 0) for p in progress)
    assert worst < 1500, [p["durationMs"] for p in progress]


@pytest.mark.brokers("kafka")
def test_batch_read_by_offsets_and_timestamps_with_headers(
    spark: Any, broker: Any, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 40, keys=16)  # 16 keys: both partitions get records
    middle = int(time.time() * 1000) + 1
    time.sleep(0.05)
    produce(broker.bootstrap, topic, 40, keys=16, start_id=40)

    def read(**options: str) -> list[Any]:
        frame = (
            spark.read.format("htmqc-kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic)
        )
        for name, value in options.items():
            frame = frame.option(name, value)
        return frame.load().selectExpr(*ID_COLUMNS, "timestampType").collect()

    assert len(read()) == 80
    late = read(startingTimestamp=str(middle), startingOffsetsByTimestampStrategy="latest")
    assert sorted(r.id for r in late) == [p.id for p in produced_ids(40, 40)]
    assert {r.timestampType for r in late} == {0}  # CreateTime, as Spark numbers it
    per_partition = f'{{"{topic}": {{"0": {middle}, "1": {middle}}}}}'
    assert sorted(r.id for r in read(startingOffsetsByTimestamp=per_partition)) == sorted(
        r.id for r in late
    )
    far = f'{{"{topic}": {{"0": {middle}, "1": {middle + 3_600_000}}}}}'  # nothing after it
    with pytest.raises(Exception, match=rf"{topic}/1 has no record at or after"):
        read(startingOffsetsByTimestamp=far)
    first = read(endingOffsets=f'{{"{topic}": {{"0": 5, "1": 5}}}}')
    assert sorted((r.partition, r.offset) for r in first) == [
        (p, o) for p in (0, 1) for o in range(5)
    ]
    with pytest.raises(Exception, match=rf"endingOffsets 999 for {topic}/0 is past its end"):
        read(endingOffsets=f'{{"{topic}": {{"0": 999, "1": -1}}}}')
    headers = (
        spark.read.format("htmqc-kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .select("headers")
        .first()
    )
    assert headers.headers[0].key == "htmqc-id"


def test_a_bad_option_fails_load_with_one_line(spark: Any) -> None:
    """Issue 21: a ValueError, then PySpark's UnboundLocalError, at awaitTermination."""
    stream = spark.readStream.format("htmqc-kafka").option("subscribe", "t")
    with pytest.raises(Exception, match=r"needs the option kafka\.bootstrap\.servers") as caught:
        stream.load()
    assert "UnboundLocalError" not in str(caught.value)
    bad = stream.option("kafka.bootstrap.servers", "127.0.0.1:9").option(
        "maxOffsetsPerTrigger", "0"
    )
    with pytest.raises(Exception, match=r"maxOffsetsPerTrigger='0' is below 1; pass an integer"):
        bad.load()
    with pytest.raises(Exception, match=r'property: "no\.such\.setting"'):
        bad.option("maxOffsetsPerTrigger", "5").option("kafka.no.such.setting", "1").load()


@pytest.mark.brokers("kafka")
def test_a_wrong_address_or_partition_is_named(
    spark: Any, broker: Any, new_topic: Callable[..., str]
) -> None:
    """Issue 21: an unknown partition in the offsets JSON was ignored; a wrong
    bootstrap gave _TRANSPORT without naming the address."""
    from htmqc.loopback import free_port

    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 10, keys=2)

    def read(bootstrap: str, **options: str) -> Any:
        frame = spark.read.format("htmqc-kafka").option("kafka.bootstrap.servers", bootstrap)
        for name, value in {"subscribe": topic, **options}.items():
            frame = frame.option(name, value)
        return frame.load().collect()

    nine = f'{{"{topic}": {{"0": 0, "1": 0, "9": 0}}}}'
    with pytest.raises(Exception, match=rf"offsets given for {topic}/9, which do not exist"):
        read(broker.bootstrap, startingOffsets=nine)
    with pytest.raises(Exception, match=rf"no offset given for {topic}/1"):
        read(broker.bootstrap, startingOffsets=f'{{"{topic}": {{"0": 0}}}}')
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=rf"cannot list topics at {nowhere} .*kafka\.bootstrap"):
        read(nowhere)
