"""A driver of its own for the stop test (its JVM's stderr is the test's to read):
``python -m tests.spark.stop_main WORKDIR SINK...`` runs, for each ``SINK``
(``sql``, ``parquet``, or ``plain``: a ``foreachBatch`` of its own running a
Spark job, wrapped in :func:`htmqc.spark.sinks.stoppable`), a processing-time
query of Spark's ``rate`` source whose batches take seconds (a slow UDF), and
calls ``query.stop()`` while a batch's job runs. Prints one line per query:
``SINK exception=<query.exception()>``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from htmqc.spark.session import spark_session
from htmqc.spark.sinks import ParquetBatchSink, SqlBatchSink, stoppable


def main(argv: list[str]) -> int:
    work, *kinds = argv
    folder = Path(work)
    with spark_session("local[2]", app="htmqc-stop") as spark:
        from pyspark.sql import functions as F

        started = folder / "job-started"

        def slow(value: int) -> int:
            started.touch()
            time.sleep(0.5)
            return value

        slow_udf = F.udf(slow, "long")
        for kind in kinds:
            sink: Any
            if kind == "sql":
                sink = SqlBatchSink(folder / "out.db", "t", "q")
            elif kind == "parquet":
                sink = ParquetBatchSink(folder / "parquet")
            else:
                sink = stoppable(lambda df, batch_id: df.foreachPartition(lambda rows: None))
            started.unlink(missing_ok=True)
            rows = spark.readStream.format("rate").option("rowsPerSecond", "20").load()
            query = (
                rows.withColumn("value", slow_udf("value"))
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(folder / f"ck-{kind}"))
                .trigger(processingTime="1 second")
                .start()
            )
            deadline = time.monotonic() + 120
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # inside the batch's job (10 rows a task, 0.5 s a row)
            query.stop()
            print(f"{kind} exception={query.exception()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
