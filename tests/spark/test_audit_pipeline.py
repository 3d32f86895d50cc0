"""``htmqc audit --spark`` reads what a Spark pipeline writes: the produced ids
from the topic itself (read_committed, aborted records as aborted ids), the
effects straight from the PostgreSQL table and the Parquet directory."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.cli import main
from htmqc.produce import produce
from tests.services import postgres_url, require_module
from tests.spark.topics import ID_COLUMNS, reader, write_aborted

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

require_module("pyspark")
from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink  # noqa: E402


@pytest.mark.brokers("kafka")
def test_audit_reads_the_topic_the_table_and_the_parquet_directory(
    spark: Any, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(partitions=3)
    produce(broker.bootstrap, topic, 1000, keys=6, transactional=True)
    write_aborted(broker.bootstrap, topic, range(1000, 1300), keys=6)
    produce(broker.bootstrap, topic, 1000, keys=6, transactional=True, start_id=1300)
    table = f"audit_{uuid.uuid4().hex[:8]}"
    sql, parquet = SqlBatchSink(postgres_url(), table, table), ParquetBatchSink(tmp_path / "pq")

    def both(df: Any, batch_id: int) -> None:
        sql(df, batch_id)
        parquet(df, batch_id)

    options = {"maxOffsetsPerTrigger": "800"}
    rows = reader(spark, broker.bootstrap, topic, "htmqc-kafka", **options).selectExpr(*ID_COLUMNS)
    query = (
        rows.writeStream.foreachBatch(both)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    query.stop()

    def audit(effects: str) -> dict[str, Any]:
        out = tmp_path / "report.json"
        args = ["audit", "--spark", "--produced", f"kafka://{broker.bootstrap}/{topic}"]
        code = main([*args, "--effects", effects, "--json", str(out)])
        report: dict[str, Any] = json.loads(out.read_text())
        assert code == (0 if not any(report["counts"].values()) else 1)
        return report

    for effects in (f"{postgres_url()}?table={table}", f"parquet:{tmp_path / 'pq'}"):
        report = audit(effects)
        assert not any(report["counts"].values()), report["counts"]
        assert report["totals"]["produced"] == 2000
        assert report["totals"]["aborted"] == 300  # in the log, read_uncommitted only
        assert report["totals"]["effects"] == report["totals"]["produced"]
    # A row gone from the table, one stored twice in Parquet: both seen.
    conn = sql._connect()
    try:
        cur = conn.cursor()
        cur.execute(f'DELETE FROM "{table}" WHERE id = (SELECT min(id) FROM "{table}")')
        conn.commit()
    finally:
        conn.close()
    assert audit(f"{postgres_url()}?table={table}")["counts"]["lost"] == 1
    again = spark.read.parquet(str(tmp_path / "pq" / "batch=0")).limit(1)
    again.write.parquet(str(tmp_path / "pq" / "batch=99"))
    assert audit(f"parquet:{tmp_path / 'pq'}")["counts"]["duplicate"] == 1


def test_topic_and_parquet_need_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    produced = tmp_path / "p.jsonl"
    produced.write_text('{"id": "1"}\n')
    assert main(["audit", "--produced", "kafka://h:1/t", "--effects", str(produced)]) == 2
    assert main(["audit", "--produced", str(produced), "--effects", f"parquet:{tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("--produced kafka://... needs --spark; add --spark")
    assert "--effects parquet:... needs --spark" in err[1]
