"""A SparkSession for htmqc's jobs and tests.

PySpark starts Python workers with ``PYSPARK_PYTHON`` (default: ``python3`` on
the PATH, which lacks htmqc's dependencies) and binds to the host's address;
:func:`spark_session` points both at this interpreter and loopback unless the
caller set them. Small shuffles (``spark.sql.shuffle.partitions`` 4) and no UI
keep ``local[N]`` jobs fast.

Spark's own Kafka connector (``format("kafka")``) is put on the classpath
(``spark.jars``) when its jars are there: ``make setup`` resolves them from Maven
Central into ``build/spark-kafka/libs`` (``tools/spark-kafka/pom.xml``;
``$HTMQC_SPARK_KAFKA_LIBS`` overrides the folder). :func:`connector_jars` lists
them and :func:`require_connector` says how to get them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError

LIBS_ENV = "HTMQC_SPARK_KAFKA_LIBS"
REPO_LIBS = Path(__file__).resolve().parents[3] / "build" / "spark-kafka" / "libs"


def connector_jars() -> list[str]:
    """The jars of Spark's Kafka connector, or ``[]`` when they are not there."""
    libs = Path(os.environ.get(LIBS_ENV) or REPO_LIBS)
    jars = sorted(str(j) for j in libs.glob("*.jar"))
    return jars if any("spark-sql-kafka" in Path(j).name for j in jars) else []


def require_connector() -> list[str]:
    """:func:`connector_jars`, or a :class:`UsageError` saying how to fetch them."""
    jars = connector_jars()
    if not jars:
        raise UsageError(
            "Spark's Kafka connector (spark-sql-kafka-0-10) is not in "
            f"{os.environ.get(LIBS_ENV) or REPO_LIBS}",
            "run `make setup` (it fetches it from Maven Central), set "
            f"{LIBS_ENV}, or read with format('htmqc-kafka')",
        )
    return jars


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
    jars = connector_jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    spark = builder.getOrCreate()
    from htmqc.spark.kafka_source import register

    register(spark)
    return spark


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
