"""``htmqc run --source pulsar`` end to end: the same core and runtime over an Apache
Pulsar partitioned topic, in subprocesses, against a private standalone broker
(tests/sources/conftest.py).

* at-least-once over a 4-partition topic across a SIGKILL, with a standby started
  before the kill: nothing lost, the standby takes the dead member's Exclusive
  subscription (the broker drops it with the connection), starts at the commits in
  the commit topic, and the duplicates are exactly the killed process's uncommitted
  window;
* at-least-once dead letters are published to the topic ``TOPIC.dlq``;
* ``--create-topic`` creates the partitioned topic, a missing one is refused in one
  line;
* pulsar-client's C++ lines go through ``--log-format json`` at ``--log-level DEBUG``
  and are not shown below it.

Exactly-once into SQLite across a SIGKILL, shared by every source, is in
test_source_contract.py. The audit helpers are the Kafka tests'
(tests/runtime/test_run_broker.py, test_modes_broker.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.sources.pulsar import PulsarClient, produce
from htmqc.sources.pulsar_server import PulsarServer
from tests.runtime.test_modes_broker import audit_sigkill_restart, kill
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    wait_for,
)
from tests.sources.support import HANDLERS, check_traces, positions, traced

pytestmark = pytest.mark.slow


def pulsar(*args: str) -> list[str]:
    """``htmqc run`` arguments after the handler, with ``--source pulsar``."""
    return ["--source", "pulsar", *args]


def test_at_least_once_across_sigkill_a_standby_takes_over_and_loses_nothing(
    pulsar_server: PulsarServer,
    client: PulsarClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    url, topic, n, group = pulsar_server.bootstrap, topic_name(), 6000, "g-alo"
    produce(url, topic, n, partitions=4, client=client)
    out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    args = [f"{HANDLERS}:log_order", *pulsar("--group", group)]

    def committed() -> int:
        return sum(client.committed(group, topic, p) or 0 for p in range(4))

    first = htmqc_run(
        url, topic, *args, *traced(trace1), env={"HTMQC_TEST_OUT": str(out1)}, log=log1
    )
    second = None
    try:
        wait_for(lambda: committed() >= 200, 60, "the first commits")
        second = htmqc_run(
            url, topic, *args, *traced(trace2), "--idle-exit", "2",
            env={"HTMQC_TEST_OUT": str(out2)}, log=log2,
        )  # fmt: skip
        wait_for(lambda: "waiting as a standby" in log2.read_text(), 30, "the standby")
        wait_for(lambda: committed() >= 1600, 60, "more commits")
    finally:
        kill(first)
    assert second is not None
    assert finish(second, 90) == 0, log2.read_text()[-2000:]
    assert not out2.exists() or out2.stat().st_size > 0
    audit_sigkill_restart(out1, out2, log2, topic, n)
    assert committed() == n
    check_traces("at-least-once", trace1, trace2)


def test_at_least_once_dead_letters_go_to_a_dlq_topic(
    pulsar_server: PulsarServer,
    client: PulsarClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    url, topic = pulsar_server.bootstrap, topic_name()
    produce(url, topic, 50, partitions=2, client=client)
    log = tmp_path / "run.log"
    proc = htmqc_run(
        url, topic, f"{HANDLERS}:poison_five",
        *pulsar("--group", "g-dlq", "--max-retries", "0", "--idle-exit", "2"), log=log,
    )  # fmt: skip
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    assert sum(client.committed("g-dlq", topic, p) or 0 for p in range(2)) == 50
    letters = client.read(f"{topic}.dlq")
    assert len(letters) == 1
    letter = letters[0]
    assert letter.data().startswith(b"000000000005")
    assert letter.partition_key() == "k5"
    props = letter.properties()
    assert props["htmqc-dlq-source"] == f"{topic}/1/2"
    assert props["htmqc-dlq-error-class"].endswith("ValueError")


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
    proc = htmqc_run(url, topic, "examples.effects:record", *pulsar(*once), log=log)
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
