"""``examples/spark_pipeline.py`` run as a user would (``python -m``): Spark's own
Kafka connector into PostgreSQL through the exactly-once SQL sink, resumed from
its checkpoint, audited; and the upsert mode keeping the last row per key."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.audit import Produced, audit
from htmqc.audit.load import effects_from_source
from htmqc.produce import produce
from tests.services import postgres_url, require_module
from tests.spark.topics import write_aborted

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

require_module("pyspark")
from htmqc.spark.session import connector_jars  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def example(*args: str) -> None:
    """Run the example to the end of the topic (``--once``); fail with its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "examples.spark_pipeline", "--once", *args],
        cwd=ROOT, env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def table_rows(table: str, columns: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(postgres_url()) as conn:
        return [tuple(r) for r in conn.execute(f'SELECT {columns} FROM "{table}"')]


@pytest.mark.brokers("kafka")
def test_the_spark_example_stores_every_record_once_across_restarts(
    broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    if not connector_jars():
        pytest.fail("Spark's Kafka connector is not fetched: run `make setup`")
    topic = new_topic(partitions=3)
    produce(broker.bootstrap, topic, 600, keys=12, transactional=True)
    write_aborted(broker.bootstrap, topic, range(600, 700), keys=12)  # in the log
    table, latest = f"ex_{uuid.uuid4().hex[:8]}", f"ex_latest_{uuid.uuid4().hex[:8]}"
    common = ["--bootstrap", broker.bootstrap, "--topic", topic, "--sink", postgres_url()]
    example(*common, "--table", table, "--checkpoint", str(tmp_path / "ck"),
            "--max-offsets-per-trigger", "250")  # fmt: skip
    produce(broker.bootstrap, topic, 300, keys=12, start_id=700)
    example(*common, "--table", table, "--checkpoint", str(tmp_path / "ck"))
    effects = list(effects_from_source(f"{postgres_url()}?table={table}"))
    produced = [Produced(f"{i:012d}") for i in [*range(600), *range(700, 1000)]]
    report = audit(produced, effects, aborted=[f"{i:012d}" for i in range(600, 700)])
    assert report.ok, report.summary()
    assert len(effects) == 900

    example(*common, "--table", latest, "--checkpoint", str(tmp_path / "ck-latest"),
            "--latest-per-key")  # fmt: skip
    last: dict[str, tuple[int, int]] = {}
    for _id, key, part, offset in table_rows(table, 'id, key, "partition", "offset"'):
        last[key] = max(last.get(key, (-1, -1)), (part, offset))
    stored = table_rows(latest, 'key, "partition", "offset"')
    assert len(stored) == 12
    assert {key: (part, offset) for key, part, offset in stored} == last
