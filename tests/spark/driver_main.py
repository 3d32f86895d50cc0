"""A streaming driver in a process of its own, for the driver-kill test:
``python -m tests.spark.driver_main MASTER BOOTSTRAP TOPIC TARGET TABLE CHECKPOINT``
reads TOPIC through ``htmqc-kafka`` (500 offsets per batch, ``availableNow``)
into ``SqlBatchSink(TARGET, TABLE, query=TABLE)`` and exits when it is read."""

from __future__ import annotations

import sys

from htmqc.spark.session import spark_session
from htmqc.spark.sinks import SqlBatchSink
from tests.spark.topics import ID_COLUMNS, reader


def main(argv: list[str]) -> int:
    master, bootstrap, topic, target, table, checkpoint = argv
    with spark_session(
        master, app="htmqc-driver", spark__cores__max="2", spark__executor__memory="512m"
    ) as spark:
        rows = reader(spark, bootstrap, topic, maxOffsetsPerTrigger="500").selectExpr(*ID_COLUMNS)
        query = (
            rows.writeStream.foreachBatch(SqlBatchSink(target, table, table))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
