"""``htmqc.Consumer``, the library API: options resolved as the CLI's, handlers checked
when registered, ``run()`` and ``start()``/``stop()`` against a broker."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import htmqc
from htmqc import Consumer
from htmqc.broker import Broker
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.produce import parse_id, produce
from htmqc.runtime.options import SINK_DEFAULTS, RunOptions
from tests.runtime.test_modes_broker import group_committed

BASE = {"bootstrap": "127.0.0.1:1", "topic": "t", "group": "g"}


@pytest.mark.slow  # imports htmqc in a fresh interpreter
def test_import_htmqc_stays_light_and_exports_the_api() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, htmqc; print('confluent_kafka' in sys.modules, "
         "'htmqc.runtime' in sys.modules); htmqc.SqlTx, htmqc.KafkaTx, htmqc.Message; "
         "print('confluent_kafka' in sys.modules, 'htmqc.runtime' in sys.modules); "
         "htmqc.Consumer; print('htmqc.runtime' in sys.modules)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert loaded == ["False", "False", "False", "False", "True"]
    assert htmqc.Consumer is Consumer
    assert {"Consumer", "Message", "SqlTx", "KafkaTx"} <= set(htmqc.__all__)
    with pytest.raises(AttributeError):
        _ = htmqc.Nope  # type: ignore[attr-defined]


def test_options_resolve_like_the_cli_with_the_sinks_defaults() -> None:
    """A library user gets the kafka: sink's transaction size, a profile's values and
    the schema's defaults, exactly as ``htmqc run`` would; what is given wins."""
    kk = Consumer(**BASE, mode="exactly-once", sink="kafka:out")
    assert kk.options.txn_messages == SINK_DEFAULTS["kafka"]["txn_messages"]
    assert Consumer(**BASE, mode="exactly-once", sink="kafka:out",
                    txn_messages=7).options.txn_messages == 7
    assert Consumer(**BASE, profile="low-latency").options.poll_wait_ms == 2.0
    plain = Consumer(**BASE).options
    assert plain.max_in_flight == RunOptions(**BASE).max_in_flight
    assert Consumer(**BASE, kafka_config={"fetch.wait.max.ms": 5, "check.crcs": True}) \
        .options.kafka_config == {"fetch.wait.max.ms": "5", "check.crcs": "true"}


def test_the_environment_does_not_leak_into_a_library_consumer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HTMQC_MAX_IN_FLIGHT", "5")
    toml = tmp_path / "c.toml"
    toml.write_text("[run]\nworkers = 9\n")
    monkeypatch.setenv("HTMQC_CONFIG", str(toml))
    options = Consumer(**BASE).options
    assert options.max_in_flight != 5 and options.workers != 9


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({**BASE, "max_inflight": 3}, "unknown option 'max_inflight'"),
        ({"topic": "t", "group": "g"}, "--bootstrap is required"),
        ({**BASE, "mode": "twice"}, "is not a delivery mode"),
        ({**BASE, "max_in_flight": 0}, "max-in-flight"),
    ],
)
def test_bad_options_fail_when_built(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(UsageError, match=error):
        Consumer(**kwargs)


NO_TOPIC = {"bootstrap": "127.0.0.1:1", "group": "g"}


def test_topics_take_a_list_as_topic_does() -> None:
    """``topics=[...]`` (or ``topic=[...]``) is ``--topic a,b``; a string is taken as
    ``--topic`` takes it; per-topic handlers register against the listed names."""
    assert Consumer(**NO_TOPIC, topics=["orders", "refunds"]).options.topic == "orders,refunds"
    assert Consumer(**NO_TOPIC, topic=["orders", "refunds"]).options.topic == "orders,refunds"
    assert Consumer(**NO_TOPIC, topics=("orders",)).options.topic == "orders"
    assert Consumer(**NO_TOPIC, topics="orders,refunds").options.topic == "orders,refunds"
    assert Consumer(**NO_TOPIC, topics=[r"^orders\..*"]).options.topic == r"^orders\..*"
    consumer = Consumer(**NO_TOPIC, topics=["orders", "refunds"])
    consumer.handler(lambda msg: None, topic="refunds")
    with pytest.raises(UsageError, match="is not one this consumer reads"):
        consumer.handler(lambda msg: None, topic="other")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topics": []}, "topics= is an empty list"),
        ({"topic": ()}, "topic= is an empty list"),
        ({"topics": ["orders", 3]}, "topics= lists 3, a int, not a topic name"),
        ({"topic": ["orders", None]}, "topic= lists None, a NoneType, not a topic name"),
        ({"topics": ["orders", " "]}, "topics= lists an empty topic name"),
        ({"topics": ["orders,refunds"]}, "topics= lists 'orders,refunds', which holds a comma"),
        ({"topics": {"orders"}}, "topics= must be a topic name or a list of them, got a set"),
        ({"topics": ["orders", "orders"]}, "--topic names 'orders' twice"),
        ({"topics": ["orders", "^r.*"]}, "mixes a pattern with other entries"),
        ({"topic": "orders", "topics": ["refunds"]}, "both topic= and topics= given"),
    ],
)
def test_a_bad_topic_list_is_one_line_when_built(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(UsageError) as caught:
        Consumer(**NO_TOPIC, **kwargs)
    assert error in caught.value.line() and "\n" not in caught.value.line()


def test_handlers_are_checked_when_registered() -> None:
    consumer = Consumer(**BASE, mode="exactly-once", sink="sqlite:///x.db")
    with pytest.raises(UsageError):
        consumer.handler(lambda msg: None)  # exactly-once calls handler(msg, tx)

    @consumer.handler
    def handle(msg: Any, tx: Any) -> None:
        pass

    with pytest.raises(UsageError, match="has a handler already"):
        consumer.handler(handle)
    with pytest.raises(UsageError, match="no handler registered"):
        Consumer(**BASE).run()
    with pytest.raises(UsageError, match="is not running"):
        Consumer(**BASE).stop()
    failing = Consumer(lambda msg: None, **BASE)  # 127.0.0.1:1: the broker is unreachable
    with pytest.raises(RuntimeFailure):
        failing.run()
    with pytest.raises(UsageError, match="ran already"):
        failing.start()


@pytest.mark.broker
def test_run_blocks_until_max_messages_and_commits(broker: Broker, new_topic: Any) -> None:
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 300, keys=10)
    seen: list[int] = []
    group = f"api-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(lambda msg: seen.append(parse_id(msg.value())),
                        bootstrap=broker.bootstrap, topic=topic, group=group,
                        max_messages=300, log_format="text")
    assert consumer.run() == 300
    assert sorted(seen) == list(range(300))
    assert group_committed(broker.bootstrap, group, topic, 2) == 300
    with pytest.raises(UsageError, match="ran already"):
        consumer.run()


@pytest.mark.broker
def test_a_topics_list_reads_every_listed_topic(broker: Broker, new_topic: Any) -> None:
    first, second = new_topic(partitions=1), new_topic(partitions=2)
    produce(broker.bootstrap, first, 20, keys=5)
    produce(broker.bootstrap, second, 30, keys=5)
    seen: list[str | None] = []
    consumer = Consumer(lambda msg: seen.append(msg.topic()), bootstrap=broker.bootstrap,
                        topics=[first, second], group=f"api-{uuid.uuid4().hex[:6]}",
                        max_messages=50)  # fmt: skip
    assert consumer.run() == 50
    assert sorted(seen) == sorted([first] * 20 + [second] * 30)


@pytest.mark.broker
def test_run_on_another_thread_is_stopped_by_stop(broker: Broker, new_topic: Any) -> None:
    """An application runs ``run()`` on its own thread (no signals there) and ends it
    with ``stop()`` from another: ``run()`` returns what it finished."""
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 50, keys=5)
    seen: list[int] = []
    consumer = Consumer(lambda msg: seen.append(1), bootstrap=broker.bootstrap, topic=topic,
                        group=f"api-{uuid.uuid4().hex[:6]}")
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(consumer.run()))
    thread.start()
    deadline = time.monotonic() + 60
    while len(seen) < 50:
        assert time.monotonic() < deadline, f"handled {len(seen)} of 50"
        time.sleep(0.05)
    assert consumer.stop() is None
    thread.join(30)
    assert not thread.is_alive() and result == [50]


@pytest.mark.broker
def test_a_failure_before_the_run_is_raised_by_start(
    broker: Broker, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics port is taken: start() raises (not stop(), later), and the consumer
    it had connected is closed."""
    import socket

    from htmqc.runtime.loop import Engine

    discarded: list[Engine] = []
    original = Engine.discard
    monkeypatch.setattr(Engine, "discard", lambda self: (discarded.append(self), original(self)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        consumer = Consumer(lambda msg: None, bootstrap=broker.bootstrap,
                            topic=new_topic(partitions=1), group=f"api-{uuid.uuid4().hex[:6]}",
                            metrics_port=taken.getsockname()[1])
        with pytest.raises(Exception, match=r"(?i)address|port|in use"):
            consumer.start()
    assert len(discarded) == 1 and not consumer.running


@pytest.mark.broker
def test_start_and_stop_exactly_once_from_a_thread(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    """Embedded: start() returns once connected, the handler runs on htmqc's threads,
    stop() ends it as SIGTERM would (everything finished is committed once)."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 500, keys=10)
    db = tmp_path / "effects.db"
    consumer = Consumer(bootstrap=broker.bootstrap, topic=topic, group=f"api-{uuid.uuid4().hex}",
                        mode="exactly-once", sink=f"sqlite:///{db}")

    @consumer.handler
    def record(msg: Any, tx: Any) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY)")
        tx.execute("INSERT INTO effects (id) VALUES (?)", (parse_id(msg.value()),))

    consumer.start()
    assert consumer.running
    assert threading.current_thread() is threading.main_thread()
    deadline = time.monotonic() + 60
    while stored(db) < 500:
        assert time.monotonic() < deadline, f"stored {stored(db)} of 500"
        time.sleep(0.05)
    assert consumer.stop(timeout=30) == 500
    assert not consumer.running
    with sqlite3.connect(db) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT id FROM effects")) == list(range(500))


def stored(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0])
    except sqlite3.Error:
        return 0
