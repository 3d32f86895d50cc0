"""One SparkSession per test module (``local[2]``), and the ``spark`` marker:
every test that starts Spark carries it, so ``-m "not spark"`` runs without
Spark's JVMs (the fast tier)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import require_module


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: starts Spark (a JVM)")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    require_module("pyspark")
    from htmqc.spark.session import spark_session

    with spark_session("local[2]", app="htmqc-tests") as session:
        yield session
