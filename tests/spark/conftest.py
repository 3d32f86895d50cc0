"""One SparkSession per test module (``local[2]``), and the Spark markers.

``spark``: every test that starts Spark (``-m "not spark"`` runs without Java);
``spark_long``: the heavy ones (a standalone cluster, crash tests, benchmarks'
comparisons), run by the long tier only: they are skipped unless ``HTMQC_SPARK_LONG=1``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import require_module


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts Spark (a JVM)")
    config.addinivalue_line(
        "markers", "spark_long: a heavy Spark test, run only with HTMQC_SPARK_LONG=1 (long tier)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("HTMQC_SPARK_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="the long Spark tier: set HTMQC_SPARK_LONG=1")
    for item in items:
        if item.get_closest_marker("spark_long") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    require_module("pyspark")
    from htmqc.spark.session import spark_session

    with spark_session("local[2]", app="htmqc-tests") as session:
        yield session
