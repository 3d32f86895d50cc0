"""A streaming driver in a process of its own, for the driver-kill test:
``python -m tests.spark.driver_main MASTER BOOTSTRAP TOPIC TARGET TABLE CHECKPOINT FORMAT [MARK]``
reads TOPIC through FORMAT (``kafka``, Spark's connector, or ``htmqc-kafka``;
read_committed, 500 offsets per batch, ``availableNow``) into
``SqlBatchSink(TARGET, TABLE, query=TABLE)`` and exits when it is read.

With ``MARK`` (a file path) it creates ``MARK`` once batch 1 is stored and then
waits, so a kill lands after the sink's commit and before Spark's: the
restart replays batch 1, which the sink must recognise."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from htmqc.spark.session import spark_session
from htmqc.spark.sinks import SqlBatchSink
from tests.spark.topics import ID_COLUMNS, reader


def main(argv: list[str]) -> int:
    master, bootstrap, topic, target, table, checkpoint, fmt, *mark = argv
    sink = SqlBatchSink(target, table, table)

    def store(df: Any, batch_id: int) -> None:
        sink(df, batch_id)
        if mark and batch_id == 1:
            Path(mark[0]).touch()
            time.sleep(600)  # killed here

    with spark_session(
        master, app="htmqc-driver", spark__cores__max="2", spark__executor__memory="512m"
    ) as spark:
        options = {"maxOffsetsPerTrigger": "500", "kafka.isolation.level": "read_committed"}
        rows = reader(spark, bootstrap, topic, fmt, **options).selectExpr(*ID_COLUMNS)
        query = (
            rows.writeStream.foreachBatch(store)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
