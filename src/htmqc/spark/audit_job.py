"""The audit checker as a Spark job: same definitions, same report.

Inputs are DataFrames (build them with :func:`audit_files` or
:func:`audit_records`):

* ``produced``: ``id`` string, ``key`` string, ``partition`` int, ``offset`` long;
* ``effects``: the same plus ``generation`` long and ``seq`` long (storage order);
* ``dlq``: ``id``, ``reason``, ``seq``; ``committed``: ``partition``, ``offset``,
  ``seq`` (observation order); ``aborted``: ``id``.

Each anomaly of :mod:`htmqc.audit.model` is one DataFrame; ``order-violation``
and ``fenced-write`` are running maxima over windows ordered by ``seq``
(``rowsBetween(unboundedPreceding, -1)``), ``nonmonotonic-commit`` a ``lag``.
The single-process checker saturates duplicate counts at 255; Spark does not.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from htmqc.audit import load
from htmqc.audit.model import (
    DEFAULT_EXAMPLES,
    AuditReport,
    CommitObservation,
    DlqEntry,
    Effect,
    Produced,
)
from htmqc.errors import UsageError

PRODUCED_DDL = "id STRING, key STRING, partition INT, offset LONG"
EFFECTS_JSON_DDL = PRODUCED_DDL + ", generation LONG, fence LONG"
EFFECTS_DDL = PRODUCED_DDL + ", generation LONG, seq LONG"
DLQ_DDL = "id STRING, reason STRING, seq LONG"
COMMITTED_DDL = "partition INT, offset LONG, seq LONG"
ABORTED_DDL = "id STRING"
EFFECTS_DDL_NAMES = ("id", "key", "partition", "offset", "generation")
KAFKA_SCHEME, PARQUET_SCHEME = "kafka://", "parquet:"
_CHUNK = 100_000


def audit_frames(
    produced: Any,
    effects: Any,
    dlq: Any,
    committed: Any,
    aborted: Any,
    limit: int = DEFAULT_EXAMPLES,
) -> AuditReport:
    """Run the audit over DataFrames with the columns in the module docs."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    report = AuditReport(limit=limit, engine="spark")
    prod = produced.dropDuplicates(["id"]).cache()
    aborted_ids = aborted.select(F.col("id").cast("string")).distinct().cache()
    dlq_ids = dlq.groupBy("id").agg(F.min_by("reason", "seq").alias("reason")).cache()
    stored = (
        effects.alias("e")
        .join(
            prod.select(
                "id",
                F.col("key").alias("p_key"),
                F.col("partition").alias("p_partition"),
                F.col("offset").alias("p_offset"),
            ),
            "id",
            "left",
        )
        .select(
            "id",
            "seq",
            "generation",
            F.coalesce("key", "p_key").alias("key"),
            F.coalesce("partition", "p_partition").alias("partition"),
            F.coalesce("offset", "p_offset").alias("offset"),
        )
        .cache()
    )
    per_id = stored.groupBy("id").agg(F.count(F.lit(1)).alias("count")).cache()

    frames: dict[str, Any] = {
        "lost": prod.join(per_id, "id", "left_anti")
        .join(dlq_ids, "id", "left_anti")
        .join(aborted_ids, "id", "left_anti")
        .select("id", "key", "partition", "offset"),
        "duplicate": per_id.where("count > 1").select("id", "count"),
        "dlq-and-effect": per_id.join(dlq_ids, "id").select("id", "reason"),
        "aborted-read": per_id.join(aborted_ids, "id").select("id"),
        "unexpected": per_id.join(prod, "id", "left_anti")
        .join(aborted_ids, "id", "left_anti")
        .select("id"),
    }
    before = Window.unboundedPreceding
    first = stored.withColumn(
        "nth", F.row_number().over(Window.partitionBy("id").orderBy("seq"))
    ).where("nth = 1 AND key IS NOT NULL AND partition IS NOT NULL AND offset IS NOT NULL")
    frames["order-violation"] = (
        first.withColumn(
            "after_offset",
            F.max("offset").over(
                Window.partitionBy("key", "partition").orderBy("seq").rowsBetween(before, -1)
            ),
        )
        .where("offset < after_offset")
        .select("id", "key", "partition", "offset", "after_offset")
    )
    frames["fenced-write"] = (
        stored.where("generation IS NOT NULL AND partition IS NOT NULL")
        .withColumn(
            "after_generation",
            F.max("generation").over(
                Window.partitionBy("partition").orderBy("seq").rowsBetween(before, -1)
            ),
        )
        .where("generation < after_generation")
        .select("id", "partition", "generation", "after_generation")
    )
    by_partition = Window.partitionBy("partition").orderBy("seq")
    frames["nonmonotonic-commit"] = (
        committed.withColumn("from", F.lag("offset").over(by_partition))
        .withColumn("index", F.row_number().over(by_partition) - 1)
        .where("offset < from")
        .select("partition", "index", "from", F.col("offset").alias("to"))
    )

    _collect(report, frames, limit)
    totals = (
        produced.agg(F.count(F.lit(1)).alias("produced"))
        .crossJoin(stored.agg(F.count(F.lit(1)).alias("effects")))
        .crossJoin(dlq.agg(F.count(F.lit(1)).alias("dlq")))
        .crossJoin(aborted.agg(F.count(F.lit(1)).alias("aborted")))
        .crossJoin(committed.agg(F.count(F.lit(1)).alias("commit_observations")))
        .first()
    )
    report.totals = {k: int(v) for k, v in totals.asDict().items()}
    for frame in (prod, aborted_ids, dlq_ids, stored, per_id):
        frame.unpersist()
    return report


def _collect(report: AuditReport, frames: dict[str, Any], limit: int) -> None:
    """One Spark job for all anomalies: counts and the first ``limit`` examples of
    each (by their JSON text), as JSON objects with nulls kept."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keep_nulls = {"ignoreNullFields": "false"}
    union = None
    for name, frame in frames.items():
        part = frame.select(
            F.lit(name).alias("anomaly"),
            F.to_json(F.struct(*frame.columns), keep_nulls).alias("example"),
        )
        union = part if union is None else union.unionAll(part)
    assert union is not None
    rows = (
        union.withColumn("total", F.count(F.lit(1)).over(Window.partitionBy("anomaly")))
        .withColumn("nth", F.row_number().over(Window.partitionBy("anomaly").orderBy("example")))
        .where(F.col("nth") <= max(limit, 1))
        .collect()
    )
    for row in rows:
        report.counts[row.anomaly] = int(row.total)
        if row.nth <= limit:
            report.examples[row.anomaly].append(json.loads(row.example))


def _numbered(rows: Iterable[tuple[Any, ...]]) -> Iterable[tuple[Any, ...]]:
    return ((*row, seq) for seq, row in enumerate(rows))


def _frame(spark: Any, rows: Iterable[tuple[Any, ...]], ddl: str) -> Any:
    """A DataFrame from Python rows, built in chunks so memory stays bounded."""
    frame = None
    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == _CHUNK:
            part = spark.createDataFrame(chunk, ddl)
            frame = part if frame is None else frame.unionAll(part)
            chunk = []
    if chunk or frame is None:
        part = spark.createDataFrame(chunk, ddl)
        frame = part if frame is None else frame.unionAll(part)
    return frame


def audit_records(
    spark: Any,
    produced: Iterable[Produced],
    effects: Iterable[Effect],
    *,
    dlq: Iterable[DlqEntry] = (),
    committed: Iterable[CommitObservation] = (),
    aborted: Iterable[str] = (),
    limit: int = DEFAULT_EXAMPLES,
) -> AuditReport:
    """The Spark audit over Python records (same arguments as :func:`htmqc.audit.audit`)."""
    return audit_frames(
        _frame(spark, produced, PRODUCED_DDL),
        _frame(spark, _numbered(effects), EFFECTS_DDL),
        _frame(spark, _numbered(dlq), DLQ_DDL),
        _frame(spark, _numbered(committed), COMMITTED_DDL),
        _frame(spark, ((str(a),) for a in aborted), ABORTED_DDL),
        limit,
    )


def effects_frame_from_jsonl(spark: Any, path: str) -> Any:
    """Effects read by Spark from a JSON-lines file; ``seq`` is file order
    (``monotonically_increasing_id`` grows with the split index and the line)."""
    from pyspark.sql import functions as F

    return (
        spark.read.schema(EFFECTS_JSON_DDL)
        .json(path)
        .select(
            "id",
            "key",
            "partition",
            "offset",
            F.coalesce("generation", "fence").alias("generation"),
            F.monotonically_increasing_id().alias("seq"),
        )
    )


def effects_frame_from_parquet(spark: Any, directory: str) -> Any:
    """Effects from a Parquet directory (:class:`htmqc.spark.sinks.ParquetBatchSink`'s
    ``batch=N`` folders, or any): ``seq`` is batch, then file, then row order."""
    from pyspark.sql import functions as F

    if not Path(directory).is_dir():
        raise UsageError(f"no Parquet directory at {directory}", "check the parquet: path")
    frame = spark.read.parquet(directory)
    present = set(frame.columns)
    if "id" not in present:
        raise UsageError(
            f"the Parquet files in {directory} have no column 'id' (have {sorted(present)})",
            "store the message id in a column named id",
        )
    types = dict(zip(EFFECTS_DDL_NAMES, ("string", "string", "int", "long", "long"), strict=True))
    picked = [
        (F.col(name) if name in present else F.lit(None)).cast(kind).alias(name)
        for name, kind in types.items()
    ]
    generation = "generation" if "generation" in present else "fence"
    if generation in present:
        picked[-1] = F.col(generation).cast("long").alias("generation")
    order = [F.col("batch")] if "batch" in present else []
    return (
        frame.select(
            *picked,
            *order,
            F.input_file_name().alias("_file"),
            F.monotonically_increasing_id().alias("_row"),
        )
        .orderBy(*order, "_file", "_row")
        .select(*types, F.monotonically_increasing_id().alias("seq"))
    )


def topic_frames(spark: Any, url: str) -> tuple[Any, Any]:
    """Produced ids (read_committed) and aborted ids from the topic itself.

    ``url``: ``kafka://BOOTSTRAP/TOPIC``. A record's id is the first
    :data:`htmqc.produce.ID_WIDTH` bytes of its value, as ``htmqc produce``
    writes them; aborted ids are those a ``read_uncommitted`` read sees and a
    ``read_committed`` one does not (so audit a topic no transaction is writing
    to any more).
    """
    from pyspark.sql import functions as F

    from htmqc.produce import ID_WIDTH

    bootstrap, _, topic = url[len(KAFKA_SCHEME) :].rpartition("/")
    if not bootstrap or not topic:
        raise UsageError(f"bad Kafka URL {url!r}", "use kafka://HOST:PORT/TOPIC")

    def read(isolation: str) -> Any:
        return (
            spark.read.format("htmqc-kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", isolation)
            .load()
            .select(
                F.expr(f"cast(substring(value, 1, {ID_WIDTH}) as string)").alias("id"),
                F.col("key").cast("string").alias("key"),
                "partition",
                "offset",
            )
        )

    produced = read("read_committed").cache()
    aborted = read("read_uncommitted").select("id").subtract(produced.select("id"))
    return produced, aborted


def effects_frame(spark: Any, effects: str, validate: bool = True) -> Any:
    """Effects from ``parquet:DIR``, a SQL table (:func:`htmqc.audit.load.effects_from_source`)
    or a JSON-lines file read by Spark."""
    if effects.startswith(PARQUET_SCHEME):
        return effects_frame_from_parquet(spark, effects[len(PARQUET_SCHEME) :])
    if effects.startswith(("sqlite:", "postgresql://", "postgres://")):
        return _frame(spark, _numbered(load.effects_from_source(effects)), EFFECTS_DDL)
    if validate:
        for _ in load.effects_from_jsonl(effects):
            pass
    return effects_frame_from_jsonl(spark, effects)


def audit_files(
    spark: Any,
    *,
    produced: str,
    effects: str,
    dlq: str | None = None,
    committed: str | None = None,
    aborted: str | None = None,
    limit: int = DEFAULT_EXAMPLES,
    validate: bool = True,
) -> AuditReport:
    """The Spark audit over the files ``htmqc audit`` takes (see :mod:`htmqc.audit.load`),
    and over what a Spark pipeline writes: ``produced`` may be ``kafka://BOOTSTRAP/TOPIC``
    (:func:`topic_frames`; its aborted ids are added to ``aborted``), ``effects``
    ``parquet:DIR`` or ``postgresql://...?table=T``.

    JSON-lines produced ids, the topic and Parquet effects are read by Spark itself;
    SQL effects, the DLQ, the commit history and aborted ids go through the Python
    loaders.
    ``validate`` first reads the JSON-lines files in Python so that a bad line is a
    :class:`~htmqc.errors.UsageError` (Spark's reader would turn it into nulls).
    """
    from pyspark.sql import functions as F

    topic_aborted = None
    if produced.startswith(KAFKA_SCHEME):
        produced_df, topic_aborted = topic_frames(spark, produced)
    else:
        if validate:
            for _ in load.produced_from_jsonl(produced):
                pass
        produced_df = spark.read.schema(PRODUCED_DDL).json(produced)
    effects_df = effects_frame(spark, effects, validate)
    dlq_df = _frame(spark, _numbered(load.dlq_from_jsonl(dlq) if dlq else ()), DLQ_DDL)
    commits = load.commits_from_jsonl(committed) if committed else ()
    committed_df = _frame(spark, _numbered(commits), COMMITTED_DDL)
    aborted_rows = ((a,) for a in (load.aborted_from_file(aborted) if aborted else ()))
    aborted_df = _frame(spark, aborted_rows, ABORTED_DDL).select(F.col("id"))
    if topic_aborted is not None:
        aborted_df = aborted_df.unionAll(topic_aborted)
    return audit_frames(produced_df, effects_df, dlq_df, committed_df, aborted_df, limit)
