"""The ``foreachBatch`` sinks store a batch id once, however often it is replayed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink
from tests.services import postgres_url

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "out.db")
    return postgres_url()


def rows_of(sink: SqlBatchSink) -> list[tuple[Any, ...]]:
    conn = sink._connect()
    try:
        cur = conn.cursor()
        cur.execute(f'SELECT id, payload FROM "{sink.table}" ORDER BY id')
        return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def test_sql_sink_skips_a_replayed_batch(spark: Any, target: str) -> None:
    name = f"t_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(target, name, query=name)
    first = spark.createDataFrame([(1, b"a"), (2, b"b")], "id LONG, payload BINARY")
    second = spark.createDataFrame([(3, b"c")], "id LONG, payload BINARY")
    assert sink.last_batch() is None
    sink(first, 0)
    sink(first, 0)  # replay after a crash between the store and Spark's commit
    sink(second, 1)
    sink(first, 0)  # an old batch never comes back
    assert rows_of(sink) == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert sink.last_batch() == 1
    other = SqlBatchSink(target, name, query=f"{name}-other")  # batch ids are per query
    other(second, 0)
    assert len(rows_of(sink)) == 4


def test_sql_sink_rolls_back_a_failed_batch(spark: Any, tmp_path: Path) -> None:
    sink = SqlBatchSink(tmp_path / "out.db", "t", query="q")
    sink(spark.createDataFrame([(1, b"a")], "id LONG, payload BINARY"), 0)
    broken = spark.createDataFrame([(2, b"b", 5)], "id LONG, payload BINARY, extra LONG")
    with pytest.raises(Exception, match="extra"):
        sink(broken, 1)  # the table has no column 'extra': nothing of batch 1 stays
    assert sink.last_batch() == 0
    assert rows_of(sink) == [(1, b"a")]


def test_parquet_sink_writes_each_batch_once(spark: Any, tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path / "out")
    df = spark.createDataFrame([(1,), (2,)], "id LONG")
    sink(df, 0)
    sink(df, 0)
    sink(df.limit(1), 1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["batch=0", "batch=1"]
    stored = spark.read.parquet(str(tmp_path / "out"))
    assert sorted((r.batch, r.id) for r in stored.collect()) == [(0, 1), (0, 2), (1, 1)]
