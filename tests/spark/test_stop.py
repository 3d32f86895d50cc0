"""``query.stop()`` while a sink's batch job runs stops the query cleanly.

Issue 21: stopping processing-time queries with tiny batches logged a
``StackOverflowError`` from ``java.util.regex``: Spark matches the Python
traceback of the interrupted ``foreachBatch`` call against a regular
expression that recurses once per character (see
:class:`htmqc.spark.sinks.BatchInterrupted`). The driver runs in a process of
its own so that its JVM's stderr can be read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import require_module

pytestmark = [pytest.mark.slow, pytest.mark.spark]

require_module("pyspark")
ROOT = Path(__file__).resolve().parents[2]


def test_stopping_inside_a_batch_job_is_a_clean_stop(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    kinds = ["sql", "parquet", "plain"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.stop_main", str(tmp_path), *kinds],
        cwd=ROOT, env=env, capture_output=True, timeout=600,
    )  # fmt: skip
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    assert out.splitlines() == [f"{kind} exception=None" for kind in kinds], err[-3000:]
    assert "StackOverflowError" not in err, err[err.find("StackOverflowError") - 500 :][:1500]
    assert "Query terminated with error" not in err  # the stop was seen as a stop
