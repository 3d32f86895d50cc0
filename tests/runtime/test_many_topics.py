"""Many topics: ``--topic a,b`` and ``--topic '^pattern'``, per-topic handlers in the
library API, dead letters to each source topic's DLQ, htmqc's own topics never read
from a pattern (:mod:`htmqc.runtime.subscription`)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc import Consumer, Permanent
from htmqc.broker import Broker
from htmqc.errors import UsageError
from htmqc.produce import parse_id, produce
from htmqc.runtime.handlers import HandlerMisuse, by_topic
from htmqc.runtime.loop import Engine
from htmqc.runtime.options import RunOptions
from htmqc.runtime.subscription import Subscription
from htmqc.testing import FakeConsumer, make_logs
from tests.broker.readback import read_all
from tests.runtime.test_modes_broker import group_committed

BASE = {"bootstrap": "127.0.0.1:1", "group": "g"}


@pytest.mark.parametrize(
    ("text", "topics", "pattern"),
    [("orders", ("orders",), False), ("orders, refunds", ("orders", "refunds"), False),
     (r"^orders\..*", (r"^orders\..*",), True)],
)
def test_a_subscription_is_a_list_or_one_pattern(
    text: str, topics: tuple[str, ...], pattern: bool
) -> None:
    parsed = Subscription.parse(text)
    assert (parsed.topics, parsed.pattern) == (topics, pattern)
    assert parsed.single == (None if pattern or len(topics) > 1 else topics[0])


@pytest.mark.parametrize(
    ("text", "error"),
    [("a,,b", "empty topic name"), ("a,b,a", "names 'a' twice"), ("^a.*,b", "mixes a pattern"),
     ("^a(", "not a regular expression")],
)
def test_a_bad_subscription_is_one_line(text: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        Subscription.parse(text)


def test_each_listed_topic_gets_its_own_retry_topic() -> None:
    assert Subscription.of("a", with_retry_topic=True).retry_topics() == {"a": "a.retry"}
    both = Subscription.of("a,b", with_retry_topic=True)
    assert both.retry_topics() == {"a": "a.retry", "b": "b.retry"}
    with pytest.raises(UsageError, match="--retry-topic needs the source topics listed"):
        Subscription.of("^a.*", with_retry_topic=True)
    with pytest.raises(UsageError, match=r"--topic lists 'a\.retry', the retry topic of 'a'"):
        Subscription.of("a,a.retry", with_retry_topic=True)
    assert Subscription.of("a,a.retry", with_retry_topic=False).topics == ("a", "a.retry")


def test_a_pattern_never_reads_htmqcs_own_topics() -> None:
    pattern = Subscription.parse("^orders.*")
    assert pattern.wants("orders-eu")
    for own in ("orders-eu.dlq", "orders-eu.dlq.poison", "orders-eu.retry"):
        assert not pattern.wants(own)
    listed = Subscription.parse("orders-eu.dlq")  # listed by name: read, as asked
    assert listed.wants("orders-eu.dlq")


class Msg:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


def test_by_topic_routes_messages_batches_and_retry_records() -> None:
    seen: list[tuple[str, str]] = []
    call = by_topic({"a": lambda m: seen.append(("a", m.topic())),
                     "b": lambda m: seen.append(("b", m.topic()))},
                    lambda m: seen.append(("default", m.topic())))
    for topic in ("a", "b", "a.retry", "c"):
        call(Msg(topic))
    assert seen == [("a", "a"), ("b", "b"), ("a", "a.retry"), ("default", "c")]
    batch = by_topic({"b": lambda msgs, tx: seen.append(("batch", msgs[0].topic()))}, None)
    batch([Msg("b"), Msg("b")], None)
    assert seen[-1] == ("batch", "b")
    with pytest.raises(HandlerMisuse, match="no handler for topic 'z'"):
        batch([Msg("z")], None)


def test_by_topic_refuses_def_and_async_def_together() -> None:
    async def asynchronous(msg: Any) -> None:
        pass

    with pytest.raises(UsageError, match="mix def and async def"):
        by_topic({"a": lambda msg: None, "b": asynchronous}, None)


def test_per_topic_handlers_are_checked_when_registered_and_run() -> None:
    consumer = Consumer(**BASE, topic="a,b")
    consumer.handler(lambda msg: None, topic="a")
    with pytest.raises(UsageError, match="handler already for topic 'a'"):
        consumer.handler(lambda msg: None, topic="a")
    with pytest.raises(UsageError, match="'c' is not one this consumer reads"):
        consumer.handler(lambda msg: None, topic="c")
    with pytest.raises(UsageError, match="no handler for topic 'b'"):
        consumer.run()
    on_pattern = Consumer(**BASE, topic="^x-.*")
    on_pattern.handler(topic="x-1")(lambda msg: None)
    with pytest.raises(UsageError, match="need a default"):
        on_pattern.run()


@pytest.mark.broker
def test_two_topics_with_a_handler_each_and_a_dlq_each(broker: Broker, new_topic: Any) -> None:
    a, b = new_topic(partitions=2), new_topic(partitions=2)
    produce(broker.bootstrap, a, 200, keys=10)
    produce(broker.bootstrap, b, 100, keys=10)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    group = f"many-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(bootstrap=broker.bootstrap, topic=f"{a},{b}", group=group,
                        max_messages=300, log_format="text")

    @consumer.handler(topic=a)
    def on_a(msg: Any) -> None:
        assert msg.topic() == a
        seen["a"].append(parse_id(msg.value()))

    @consumer.handler(topic=b)
    def on_b(msg: Any) -> None:
        assert msg.topic() == b
        n = parse_id(msg.value())
        if n % 25 == 0:
            raise Permanent(f"refund {n} is malformed")
        seen["b"].append(n)

    assert consumer.run() == 300
    assert sorted(seen["a"]) == list(range(200))
    assert sorted(seen["b"]) == [n for n in range(100) if n % 25]
    assert group_committed(broker.bootstrap, group, a, 2) == 200
    assert group_committed(broker.bootstrap, group, b, 2) == 100
    dead = read_all(broker.bootstrap, f"{b}.dlq")
    assert sorted(parse_id(r.value) for r in dead) == [0, 25, 50, 75]
    assert read_all(broker.bootstrap, f"{a}.dlq") == []


@pytest.mark.broker
def test_a_pattern_reads_its_topics_and_not_its_own_dead_letters(
    broker: Broker, new_topic: Any
) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    a, b = new_topic(partitions=2, prefix=prefix), new_topic(partitions=1, prefix=prefix)
    produce(broker.bootstrap, a, 150, keys=10)
    produce(broker.bootstrap, b, 50, keys=10)
    # a's DLQ exists before the run, so the pattern matches it from the first assignment;
    # one partition, so it reads back in write order (an auto-created topic may have more)
    produce(broker.bootstrap, f"{a}.dlq", 5, keys=1, partitions=1)
    topics: list[str] = []

    def handle(msg: Any) -> None:
        topics.append(msg.topic())
        if parse_id(msg.value()) == 7:
            raise Permanent("seven is refused")  # to <topic>.dlq, which the pattern matches

    consumer = Consumer(handle, bootstrap=broker.bootstrap, topic=f"^{prefix}-.*",
                        group=f"pat-{uuid.uuid4().hex[:6]}", max_messages=200,
                        idle_exit=3.0, log_format="text")
    assert consumer.run() == 200
    assert sorted(set(topics)) == sorted([a, b])
    assert len(topics) == 200  # no dead letter was read back
    assert [parse_id(r.value) for r in read_all(broker.bootstrap, f"{a}.dlq")] == [*range(5), 7]
    assert [parse_id(r.value) for r in read_all(broker.bootstrap, f"{b}.dlq")] == [7]


@pytest.mark.broker
def test_exactly_once_over_two_topics_into_sqlite(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    a, b = new_topic(partitions=2), new_topic(partitions=3)
    produce(broker.bootstrap, a, 120, keys=10)
    produce(broker.bootstrap, b, 90, keys=10)
    db = tmp_path / "out.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE seen (topic TEXT, id INTEGER, PRIMARY KEY (topic, id))")

    def store(msg: Any, tx: Any) -> None:
        tx.execute("INSERT INTO seen VALUES (?, ?)", (msg.topic(), parse_id(msg.value())))

    consumer = Consumer(store, bootstrap=broker.bootstrap, topic=f"{a},{b}",
                        group=f"eo-{uuid.uuid4().hex[:6]}", mode="exactly-once",
                        sink=f"sqlite:///{db}", max_messages=210, log_format="text")
    assert consumer.run() == 210
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT topic, count(*), min(id), max(id) FROM seen GROUP BY topic")
        assert sorted(rows) == sorted([(a, 120, 0, 119), (b, 90, 0, 89)])
        positions = dict(conn.execute(
            "SELECT topic, SUM(committed) FROM htmqc_positions GROUP BY topic"))
    assert positions == {a: 120, b: 90}


class Unassigns:
    """A consumer that records ``incremental_unassign`` (the rebalance callbacks' part)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def incremental_unassign(self, partitions: list[Any]) -> None:
        self.calls.append(partitions)


@pytest.mark.parametrize("callback", ["on_revoke", "on_lost"])
def test_moving_only_unread_partitions_is_not_a_revoke(
    callback: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pattern's own-topic partitions are never read: the group moving only them
    must not wait for running work, commit early or roll a transaction back."""
    engine = Engine(lambda msg: None, RunOptions(bootstrap="fake:1", topic="^t-.*", group="g"),
                    FakeConsumer.from_logs(make_logs("t-a", 1, 1, keys=1)))
    handled: list[list[Any]] = []
    monkeypatch.setattr(engine.ownership, callback, lambda consumer, parts: handled.append(parts))
    consumer = Unassigns()
    getattr(engine, callback)(consumer, [KafkaTP("t-a.dlq", 0), KafkaTP("t-a.retry", 0)])
    assert handled == [] and consumer.calls == [[]]
    getattr(engine, callback)(consumer, [KafkaTP("t-a.dlq", 0), KafkaTP("t-a", 0)])
    assert [[(p.topic, p.partition) for p in parts] for parts in handled] == [[("t-a", 0)]]


@pytest.mark.broker
def test_retries_of_each_topic_wait_in_that_topics_retry_topic(
    broker: Broker, new_topic: Any
) -> None:
    a, b = new_topic(partitions=1), new_topic(partitions=1)
    produce(broker.bootstrap, a, 40, keys=5)
    produce(broker.bootstrap, b, 40, keys=5)
    flaky, hopeless = {(a, 3), (b, 5)}, (b, 7)  # fail twice then work; always fail
    tries: dict[tuple[str, int], int] = {}
    ran_from: dict[tuple[str, int], str] = {}

    def handle(msg: Any) -> None:
        topic = msg.topic().removesuffix(".retry")
        key = (topic, parse_id(msg.value()))
        tries[key] = tries.get(key, 0) + 1
        if key == hopeless or (key in flaky and tries[key] <= 2):
            raise RuntimeError(f"{key} fails")
        ran_from[key] = msg.topic()

    consumer = Consumer(handle, bootstrap=broker.bootstrap, topic=f"{a},{b}",
                        group=f"retry-{uuid.uuid4().hex[:6]}", retry_topic=True,
                        retry_topic_ms=0, backoff_ms=200, backoff_max_ms=400, max_retries=2,
                        idle_exit=3.0, log_format="text")
    consumer.run()
    assert set(ran_from) == {(t, n) for t in (a, b) for n in range(40)} - {hopeless}
    assert {ran_from[k] for k in flaky} == {f"{a}.retry", f"{b}.retry"}
    assert ran_from[(a, 3)] == f"{a}.retry" and ran_from[(b, 5)] == f"{b}.retry"
    # each retry topic holds only its own source's messages (two hand-offs each)
    assert sorted(parse_id(r.value) for r in read_all(broker.bootstrap, f"{a}.retry")) == [3, 3]
    assert sorted(parse_id(r.value) for r in read_all(broker.bootstrap, f"{b}.retry")) \
        == [5, 5, 7, 7]  # fmt: skip
    assert [parse_id(r.value) for r in read_all(broker.bootstrap, f"{b}.dlq")] == [7]
    assert read_all(broker.bootstrap, f"{a}.dlq") == []
