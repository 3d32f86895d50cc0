"""A SparkSession for htmqc's jobs and tests.

PySpark starts Python workers with ``PYSPARK_PYTHON`` (default: ``python3`` on
the PATH, which lacks htmqc's dependencies) and binds to the host's address;
:func:`spark_session` points both at this interpreter and loopback unless the
caller set them. Small shuffles (``spark.sql.shuffle.partitions`` 4) and no UI
keep ``local[N]`` jobs fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from htmqc.errors import UsageError


def prepare_environment() -> None:
    """Set ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` and ``SPARK_LOCAL_IP`` if unset."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def build_session(master: str = "local[2]", app: str = "htmqc", **conf: str) -> Any:
    """A new (or the active) SparkSession on ``master``; extra ``conf`` keys use dots
    written as ``__``, e.g. ``spark__sql__shuffle__partitions="8"``."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError(
            "PySpark is not installed", "pip install 'htmqc[spark]' (pyspark>=4.0)"
        ) from None
    prepare_environment()
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("HTMQC_SPARK_DRIVER_MEMORY", "2g"))
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    return builder.getOrCreate()


@contextmanager
def spark_session(master: str = "local[2]", app: str = "htmqc", **conf: str) -> Iterator[Any]:
    """:func:`build_session`, stopped on exit unless it was already running (then
    the caller that started it stops it)."""
    try:
        from pyspark.sql import SparkSession

        running = SparkSession.getActiveSession() is not None
    except ImportError:
        running = False  # build_session reports the missing extra
    spark = build_session(master, app, **conf)
    try:
        yield spark
    finally:
        if not running:
            spark.stop()
