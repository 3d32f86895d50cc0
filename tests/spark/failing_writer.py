"""A staging writer for the retried-task test (``tests/spark/test_cluster.py``),
in a module of its own so the executors import it by name: the first attempt
of each batch's partition 0 commits its staging rows and then fails, as a task
whose executor dies after its ``COPY`` committed; Spark runs it again."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from htmqc.spark.sinks import _StageWriter


def failed_marks(token_prefix: str = "") -> list[Path]:
    """The marks of the attempts that failed on purpose (one per batch)."""
    return sorted(Path(tempfile.gettempdir()).glob(f"htmqc-failed-once-{token_prefix}*"))


class FailingOnce(_StageWriter):
    """:class:`~htmqc.spark.sinks._StageWriter` whose partition 0 fails once per
    batch, after its staging rows are committed."""

    def __call__(self, rows: Iterator[Any]) -> None:
        from pyspark import TaskContext

        super().__call__(rows)
        context = TaskContext.get()
        mark = Path(tempfile.gettempdir()) / f"htmqc-failed-once-{self.token}"
        if context is not None and context.partitionId() == 0 and not mark.exists():
            mark.touch()
            raise RuntimeError("planted: the task fails after its staging rows committed")
