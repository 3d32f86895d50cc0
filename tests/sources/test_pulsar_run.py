"""``htmqc run --source pulsar`` end to end: the same core and runtime over an Apache
Pulsar partitioned topic, in subprocesses, against a private standalone broker
(tests/sources/conftest.py).

* ``--create-topic`` creates the partitioned topic, a missing one is refused in one
  line;
* pulsar-client's C++ lines go through ``--log-format json`` at ``--log-level DEBUG``
  and are not shown below it.

Exactly-once into SQLite across a SIGKILL and dead letters to ``TOPIC.dlq``, shared by
every source, and at-least-once across a SIGKILL with a standby (the standby takes the
dead member's Exclusive subscription, which the broker drops with the connection),
shared with RabbitMQ, and a member frozen inside a transaction while the standby takes
its lease (the lease's zombie, shared by every source), are in test_source_contract.py.
The audit helpers are the Kafka tests' (tests/runtime/test_run_broker.py,
test_modes_broker.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.sources.pulsar import PulsarClient, produce
from htmqc.sources.pulsar_server import PulsarServer
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
)
from tests.sources.support import positions

pytestmark = pytest.mark.slow


def pulsar(*args: str) -> list[str]:
    """``htmqc run`` arguments after the handler, with ``--source pulsar``."""
    return ["--source", "pulsar", *args]


def test_create_topic_and_a_missing_topic(
    pulsar_server: PulsarServer,
    client: PulsarClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    url, topic = pulsar_server.bootstrap, topic_name()
    log = tmp_path / "missing.log"
    db = tmp_path / "eo.db"
    once = exactly_once_args(db, "g-new", "--idle-exit", "2")
    proc = htmqc_run(url, topic, "examples.effects:record", *pulsar(*once), log=log)
    assert finish(proc, 60) == 2
    text = log.read_text()
    assert f"topic {topic!r} does not exist" in text and "--create-topic" in text
    proc = htmqc_run(
        url, topic, "examples.effects:record", *pulsar(*once, "--create-topic", "3"), log=log
    )
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    assert client.partitions(topic) == 3
    produce(url, topic, 30, partitions=3, client=client)
    # Stop on the count, not on idleness: a loaded box can take longer than
    # any idle bound before the first delivery (CI once exited with none).
    counted = exactly_once_args(db, "g-new", "--max-messages", "30")
    proc = htmqc_run(url, topic, "examples.effects:record", *pulsar(*counted), log=log)
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    assert sorted(effect_ids(db)) == list(range(30))
    assert positions(db) == {0: 10, 1: 10, 2: 10}


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_the_clients_own_lines_are_json_and_shown_only_at_debug(
    pulsar_server: PulsarServer,
    client: PulsarClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
    level: str,
) -> None:
    url, topic = pulsar_server.bootstrap, topic_name()
    produce(url, topic, 20, partitions=2, client=client)
    log = tmp_path / "run.log"
    proc = htmqc_run(
        url, topic, "examples.effects:record",
        *pulsar(*exactly_once_args(tmp_path / "eo.db", "g-log", "--idle-exit", "2",
                                   "--log-format", "json", "--log-level", level)),
        log=log,
    )  # fmt: skip
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # each one JSON
    loggers = {line["logger"] for line in lines}
    assert ("pulsar" in loggers) is (level == "DEBUG"), sorted(loggers)


