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
shared with RabbitMQ, are in test_source_contract.py. Here: a member frozen inside a
transaction while the standby takes its lease (the lease's zombie) is fenced. The audit
helpers are the Kafka tests' (tests/runtime/test_run_broker.py, test_modes_broker.py).
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.sources.pulsar import PulsarClient, produce
from htmqc.sources.pulsar_server import PulsarServer
from tests.runtime.test_modes_broker import kill, pg_tables
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    wait_for,
)
from tests.sources.support import check_traces, positions, traced

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


def test_a_frozen_member_whose_lease_is_taken_over_is_fenced(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    """The lease's zombie, as tests/runtime/test_zombie_broker.py does it on Kafka:
    member A, exactly-once into PostgreSQL, stalls inside an open transaction
    (:func:`tests.runtime.handlers.stalling_record`) and is then frozen (SIGSTOP: a
    long GC pause, a stalled VM). The broker drops its lease subscription (a topic
    unload, as Pulsar's load balancer does) and cannot reach A; the standby B takes
    the lease, claims the partitions (bumping their fences) and stores everything.
    When A wakes inside its old transaction, its late commit is fenced, its lease
    is found lost after the grace, and it stops with a one-line error; the row A
    wrote in that transaction does not exist, and every message has exactly one
    effect. PostgreSQL, not SQLite: a frozen SQLite writer keeps the file locked, so
    B would wait for A instead."""
    from htmqc.sources.pulsar import lease_topic

    url, topic, n, stall_at = pulsar_server.bootstrap, topic_name(), 3000, 800
    group = f"g-zombie-{uuid.uuid4().hex[:6]}"
    produce(url, topic, n, partitions=2, client=client)
    flag = tmp_path / "stall"
    marker = Path(f"{flag}.stalled")
    flag.touch()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    trace_a, trace_b = tmp_path / "a.trace", tmp_path / "b.trace"
    with pg_tables() as pg:
        args = ["tests.runtime.handlers:stalling_record", "--source", "pulsar", "--group",
                group, "--mode", "exactly-once", "--sink", pg.sink, "--txn-messages", "100"]
        env = {"HTMQC_TEST_TABLE": pg.effects, "HTMQC_TEST_STALL": str(flag),
               "HTMQC_TEST_STALL_AT": str(stall_at)}  # fmt: skip
        a = htmqc_run(url, topic, *args, *traced(trace_a), env=env, log=log_a)
        b = None
        try:
            wait_for(marker.exists, 60, "A to stall inside a transaction")
            stalled_id, stalled_pid = map(int, marker.read_text().split())
            assert stalled_pid == a.pid and stalled_id >= stall_at
            # B stays (idle) while A wakes: A's lease cannot come back, and is lost
            b = htmqc_run(url, topic, *args, *traced(trace_b), "--idle-exit", "25", env=env,
                          log=log_b)  # fmt: skip
            wait_for(lambda: "waiting as a standby" in log_b.read_text(), 30, "the standby")
            a.send_signal(signal.SIGSTOP)
            flag.unlink()  # when A runs again, it goes on at once
            before = pg.stored()
            assert 0 < before < n, "A should have committed some transactions before stalling"
            lease = lease_topic(group, topic).removeprefix("persistent://")
            pulsar_server.admin("PUT", f"/v2/persistent/{lease}/unload")
            wait_for(lambda: pg.stored() == n, 90, "B to take the lease and store everything")
            assert "took the lease" in log_b.read_text()
            assert "fenced" not in log_a.read_text()
            a.send_signal(signal.SIGCONT)  # the zombie wakes up inside its old transaction
            wait_for(lambda: "fenced: " in log_a.read_text(), 30, "A's late commit to be fenced")
            code = finish(a, 60)
            assert "stopping" not in log_b.read_text(), "B left before A's lease was lost"
            assert finish(b, 60) == 0, log_b.read_text()[-2000:]
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    kill(proc)
        text = log_a.read_text()
        assert code != 0 and "was lost" in text, text[-2000:]
        errors = [line for line in text.splitlines() if line.startswith("htmqc: error:")]
        assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
        rows = pg.rows()
        ids = Counter(r[0] for r in rows)
        assert sorted(ids) == list(range(n)), "lost effects"
        twice = [i for i, c in ids.items() if c > 1]
        assert twice == [], "the zombie's late transaction was stored"
        [stalled_row] = [r for r in rows if r[0] == stalled_id]
        assert stalled_row[3] == b.pid, "the stalled message's effect must be B's, not A's"
        assert pg.stored() == n
    check_traces("exactly-once", trace_a, trace_b)
