"""One SparkSession per test module (``local[2]``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import require_module


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    require_module("pyspark")
    from htmqc.spark.session import spark_session

    with spark_session("local[2]", app="htmqc-tests") as session:
        yield session
