"""The ``foreachBatch`` sinks store a batch id once, however often it is replayed;
rows go from the executors (never through the driver), typed, appended or upserted."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from htmqc.spark.sinks import BindingError, ParquetBatchSink, SqlBatchSink
from tests.services import postgres_url

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "out.db")
    return postgres_url()


@pytest.fixture
def no_driver_rows(spark: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail if a sink pulls a batch's rows to the driver (on PySpark's DataFrame
    classes: the classic one overrides the public one's methods)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a sink pulled rows through the driver")

    for cls in type(spark.range(1)).__mro__:
        for name in ("collect", "toLocalIterator", "toPandas", "take", "toArrow"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, refuse)
    yield


def rows_of(sink: SqlBatchSink, columns: str = "id, payload") -> list[tuple[Any, ...]]:
    conn = sink._connect()
    try:
        cur = conn.cursor()
        cur.execute(f'SELECT {columns} FROM "{sink.table}" ORDER BY id')
        return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def test_sql_sink_skips_a_replayed_batch(spark: Any, target: str, no_driver_rows: None) -> None:
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


def test_upsert_keeps_the_last_row_of_each_key(spark: Any, target: str) -> None:
    name = f"u_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(target, name, query=name, mode="upsert", keys=("id",))
    schema = "id LONG, payload BINARY"
    sink(spark.createDataFrame([(1, b"a"), (2, b"b"), (1, b"a2")], schema).coalesce(1), 0)
    sink(spark.createDataFrame([(2, b"b2"), (3, b"c")], schema), 1)
    sink(spark.createDataFrame([(2, b"zz")], schema), 1)  # a replay changes nothing
    assert rows_of(sink) == [(1, b"a2"), (2, b"b2"), (3, b"c")]


def test_postgres_columns_get_proper_types(spark: Any) -> None:
    name = f"ty_{uuid.uuid4().hex[:8]}"
    sink = SqlBatchSink(postgres_url(), name, query=name)
    df = spark.sql(
        "SELECT 1L AS id, 2.5D AS d, true AS b, DATE'2026-01-02' AS day, "
        "CAST(12.34 AS DECIMAL(10,2)) AS amount, CAST(7 AS SMALLINT) AS small, "
        "TIMESTAMP'2026-01-02 03:04:05' AS at, array(named_struct('k', 'x')) AS items"
    )
    sink(df, 0)
    conn = sink._connect()
    try:
        cur = conn.cursor()
        cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position",
            (name,),
        )
        types = dict(cur.fetchall())
        cur.execute(f'SELECT d, b, day, amount, small, at, items FROM "{name}"')
        row = cur.fetchone()
    finally:
        conn.close()
    assert types == {
        "id": "bigint",
        "d": "double precision",
        "b": "boolean",
        "day": "date",
        "amount": "numeric",
        "small": "smallint",
        "at": "timestamp with time zone",
        "items": "jsonb",
        "_htmqc_seq": "bigint",
    }
    assert row == (
        2.5,
        True,
        dt.date(2026, 1, 2),
        decimal.Decimal("12.34"),
        7,
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        [{"k": "x"}],
    )


def test_parquet_sink_writes_each_batch_once(spark: Any, tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path / "out")
    df = spark.createDataFrame([(1,), (2,)], "id LONG")
    sink(df, 0)
    sink(df, 0)
    sink(df.limit(1), 1)
    batches = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("batch="))
    assert batches == ["batch=0", "batch=1"]
    stored = spark.read.parquet(str(tmp_path / "out"))
    assert sorted((r.batch, r.id) for r in stored.collect()) == [(0, 1), (0, 2), (1, 1)]


def test_parquet_sink_removes_what_a_killed_batch_left(spark: Any, tmp_path: Path) -> None:
    sink = ParquetBatchSink(tmp_path / "out")
    df = spark.createDataFrame([(1,)], "id LONG")
    sink(df, 0)
    left = tmp_path / "out" / "_tmp-batch=1-deadbeef"  # as a kill -9 mid-write leaves it
    left.mkdir()
    (left / "part-0.parquet").write_bytes(b"partial")
    sink(df, 1)
    assert not left.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_htmqc_query.json",
        "batch=0",
        "batch=1",
    ]


def test_parquet_sink_adopts_another_querys_directory_only_when_asked(
    spark: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    old = spark.createDataFrame([(1,), (2,)], "id LONG")
    ParquetBatchSink(out)(old, 0)
    ParquetBatchSink(out)(old, 1)
    (out / "_htmqc_query.json").write_text(
        json.dumps({"query_id": "q-old", "checkpoint": "/ck/old"})
    )  # as another query's run leaves it; this one is "direct"
    with pytest.raises(BindingError, match=r"of query q-old \(checkpoint /ck/old\), not of"):
        ParquetBatchSink(out)(old, 0)
    sink = ParquetBatchSink(out, adopt=True)
    new = spark.createDataFrame([(3,)], "id LONG")
    sink(new, 0)
    sink(new, 0)  # a replay of the adopting query's batch 0: stored, skipped
    sink(spark.createDataFrame([(4,)], "id LONG"), 1)
    ParquetBatchSink(out)(new, 1)  # adopted: the plain sink is this query's now
    binding = json.loads((out / "_htmqc_query.json").read_text())
    assert (binding["base"], binding["adopted_from"]["query_id"]) == (2, "q-old")
    stored = spark.read.parquet(str(out)).orderBy("batch", "id").collect()
    assert [(r.batch, r.id) for r in stored] == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 3), (3, 4)]
