"""``--retry-topic``: long backoffs wait in ``<topic>.retry``, freeing the partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from htmqc.broker import Broker
from htmqc.kafka_defaults import consumer_config
from htmqc.produce import message_key, produce
from tests.runtime.test_run_broker import finish, htmqc_run

pytestmark = pytest.mark.broker


def _read_all(bootstrap: str, topic: str, expect: int) -> list[Any]:
    consumer = Consumer(consumer_config(bootstrap, f"reader-{topic}"))
    consumer.subscribe([topic])
    out: list[Any] = []
    try:
        for _ in range(200):
            out += [m for m in consumer.consume(100, 0.1) if m.error() is None]
            if len(out) >= expect:
                break
    finally:
        consumer.close()
    return out


def test_retries_wait_in_the_retry_topic_and_the_partition_moves_on(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    count, keys = 300, 10
    flaky = [3, 50, 151]  # fail twice, then work
    hopeless = 7  # always fails: dead-lettered after --max-retries
    produce(broker.bootstrap, topic, count, keys=keys)
    out, log = tmp_path / "handled.txt", tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, "tests.runtime.failure_handlers:fail_twice_then_log",
        "--group", "g-retry", "--retry-topic", "--retry-topic-ms", "0",
        "--backoff-ms", "300", "--backoff-max-ms", "600", "--max-retries", "2",
        "--idle-exit", "3",
        env={"HTMQC_TEST_OUT": str(out), "HTMQC_TEST_POISON": ",".join(map(str, flaky)),
             "HTMQC_TEST_HOPELESS": str(hopeless)},
        log=log,
    )
    assert finish(proc, 90) == 0, log.read_text()[-3000:]
    rows = [line.split() for line in out.read_text().splitlines()]
    handled = {int(r[0]): r for r in rows}
    assert len(rows) == len(handled) == count - 1, "lost or handled twice"
    assert hopeless not in handled
    for ident in flaky:
        _, source, at_ms, due_ms = handled[ident]
        assert source == f"{topic}.retry", "a retried message ran from the main topic"
        assert int(at_ms) >= int(due_ms) > 0, "ran before its retry-after time"
    # The partition moved on: a later message of a retried message's key finished first.
    order = [int(r[0]) for r in rows]
    for ident in flaky:
        later_same_key = [
            i for i in range(ident + 1, count)
            if message_key(i, keys) == message_key(ident, keys) and i in handled
        ]
        assert order.index(later_same_key[0]) < order.index(ident)
    records = _read_all(broker.bootstrap, f"{topic}.retry", 2 * len(flaky) + 2)
    attempts = sorted(
        int(dict(m.headers())["htmqc-retry-attempt"]) for m in records
    )
    assert attempts == [1] * (len(flaky) + 1) + [2] * (len(flaky) + 1)
    dead = _read_all(broker.bootstrap, f"{topic}.dlq", 1)
    assert len(dead) == 1
    headers = dict(dead[0].headers())
    assert headers["htmqc-dlq-kind"] == b"failed"
    assert headers["htmqc-dlq-retries"] == b"2"


@pytest.mark.slow  # runs `htmqc run`
def test_retry_topic_with_a_database_sink_is_refused(tmp_path: Path) -> None:
    proc = htmqc_run(
        "127.0.0.1:1", "t", "examples.effects:record", "--group", "g", "--mode",
        "exactly-once", "--sink", f"sqlite:///{tmp_path / 'x.db'}", "--retry-topic",
        log=tmp_path / "run.log",
    )
    assert finish(proc, 30) == 2
    text = (tmp_path / "run.log").read_text()
    assert "cannot move a message atomically" in text and "Traceback" not in text
