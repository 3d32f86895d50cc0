"""The Kafka→Kafka sink against a real (bundled) broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from htmqc import KafkaTx
from htmqc.broker import Broker
from htmqc.core import Commit, TopicPartition
from htmqc.errors import RuntimeFailure
from htmqc.kafka_defaults import consumer_config, producer_config
from htmqc.sinks import Fenced, Position, Sink, SinkStateError, open_sink
from htmqc.sinks.kafka import KafkaSink
from htmqc.sinks.kafka_positions import DEFAULT_POSITIONS_TOPIC

from .kafka_support import group_consumer, make_topics, produce_plain, read_all

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]


class Setup:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        names = make_topics(bootstrap, {"in": 1, "out": 1})
        self.src, self.out = names["in"], names["out"]
        self.group = f"g-{uuid.uuid4().hex[:8]}"
        self.tp: TopicPartition = (self.src, 0)
        produce_plain(bootstrap, self.src, [b"m%d" % i for i in range(10)])
        self.consumer = group_consumer(bootstrap, self.group, self.src)
        self.sinks: list[KafkaSink] = []

    def sink(self, member_id: str = "m1") -> KafkaSink:
        sink = open_sink(f"kafka:{self.out}", bootstrap=self.bootstrap, member_id=member_id)
        assert isinstance(sink, KafkaSink)
        sink.open(self.group)
        sink.bind(self.consumer)
        self.sinks.append(sink)
        return sink

    def committed(self) -> tuple[int, str]:
        [ktp] = self.consumer.committed([KafkaTopicPartition(self.src, 0)], timeout=10)
        return ktp.offset, ktp.metadata or ""

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.consumer.close()


@pytest.fixture
def setup(broker: Broker) -> Iterator[Setup]:
    s = Setup(broker.bootstrap)
    yield s
    s.close()


def commit_of(tp: TopicPartition, offset: int, finished_above: tuple[int, ...] = ()) -> Commit:
    return Commit(tp=tp, epoch=1, offset=offset, finished_above=finished_above)


@pytest.mark.brokers("tansu", "kafka", "kafka3")  # kafka3: min.insync.replicas=2
def test_output_visible_to_read_committed_only_after_commit(setup: Setup) -> None:
    sink = setup.sink()
    assert isinstance(sink, Sink)
    pos = sink.claim([setup.tp], default_start=lambda tp: 0)[setup.tp]
    assert pos == Position(0, (), pos.fence)
    txn = sink.begin()
    assert isinstance(txn.handle, KafkaTx)  # what a handler gets: htmqc.KafkaTx
    for i in range(3):
        with txn.message():
            txn.handle.send(None, b"out%d" % i, key=b"k")
    assert read_all(setup.bootstrap, setup.out, committed_only=False) == [b"out0", b"out1", b"out2"]
    assert read_all(setup.bootstrap, setup.out, committed_only=True) == []
    assert setup.committed()[0] < 0
    txn.commit([(commit_of(setup.tp, 3, (5, 6)), pos.fence)])
    assert read_all(setup.bootstrap, setup.out, committed_only=True) == [b"out0", b"out1", b"out2"]
    offset, metadata = setup.committed()
    # Tansu 0.6 drops commit metadata (test_commit_metadata_comes_back); the
    # positions topic holds finished_above on any broker
    assert offset == 3 and metadata in {"htmqc1:2:2", ""}
    again = setup.sink("m2").claim([setup.tp], default_start=lambda tp: pytest.fail("unused"))
    assert again[setup.tp].committed == 3 and again[setup.tp].finished_above == (5, 6)
    # the positions topic is replicated like any topic of the cluster (3 on kafka3)
    meta = AdminClient({"bootstrap.servers": setup.bootstrap}).list_topics(timeout=10)
    [positions] = meta.topics[DEFAULT_POSITIONS_TOPIC].partitions.values()
    assert len(positions.replicas) == min(3, len(meta.brokers))


@pytest.mark.tansu_deviation(
    "Tansu 0.6 drops the metadata of offsets committed in a transaction (htmqc "
    "keeps finished_above in its positions topic too); Kafka returns it"
)
def test_commit_metadata_comes_back(setup: Setup) -> None:
    sink = setup.sink()
    fence = sink.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    txn = sink.begin()
    with txn.message():
        txn.handle.send(None, b"out")
    txn.commit([(commit_of(setup.tp, 3, (5, 6)), fence)])
    assert setup.committed() == (3, "htmqc1:2:2")


@pytest.mark.tansu_deviation(
    "Tansu 0.6 accepts offsets sent to a transaction with an outdated group "
    "generation; Kafka rejects them (ILLEGAL_GENERATION), the group-level fence "
    "of KIP-447"
)
def test_offsets_of_an_outdated_generation_are_rejected(broker: Broker) -> None:
    names = make_topics(broker.bootstrap, {"in": 2})
    topic, group = names["in"], f"g-{uuid.uuid4().hex[:8]}"
    produce_plain(broker.bootstrap, topic, [b"m"])
    first = Consumer(consumer_config(broker.bootstrap, group))
    second = Consumer(consumer_config(broker.bootstrap, group))
    producer = Producer(producer_config(broker.bootstrap, transactional_id=group))
    try:
        first.subscribe([topic])
        wait_assigned([first], lambda: len(first.assignment()) == 2)
        stale = first.consumer_group_metadata()
        second.subscribe([topic])  # a rebalance: the group's generation moves on
        wait_assigned([first, second], lambda: len(second.assignment()) == 1)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"out")
        with pytest.raises(KafkaException) as info:
            producer.send_offsets_to_transaction([KafkaTopicPartition(topic, 0, 1)], stale, 30)
        assert info.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
        producer.abort_transaction(30)
    finally:
        first.close()
        second.close()


def wait_assigned(consumers: list[Any], done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "the group did not settle"
        for consumer in consumers:
            consumer.poll(0.1)


def test_finished_above_of_an_older_commit_does_not_come_back(setup: Setup) -> None:
    sink = setup.sink()
    fence = sink.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    for offset, above in [(2, (4,)), (5, ())]:
        txn = sink.begin()
        with txn.message():
            txn.handle.send(None, b"o%d" % offset)
        txn.commit([(commit_of(setup.tp, offset, above), fence)])
    again = setup.sink("m2").claim([setup.tp], default_start=lambda tp: 0)[setup.tp]
    assert (again.committed, again.finished_above) == (5, ())


def test_aborted_transaction_and_failed_message_leave_nothing(setup: Setup) -> None:
    sink = setup.sink()
    fence = sink.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    txn = sink.begin()
    with txn.message():
        txn.handle.send(setup.out, b"aborted")
    txn.abort()
    txn.abort()
    txn = sink.begin()
    with pytest.raises(ValueError), txn.message():
        txn.handle.send(None, b"failed-message")
        raise ValueError("handler failed")
    with txn.message():
        txn.handle.send(None, b"kept", headers={"h": b"1"})
    txn.commit([(commit_of(setup.tp, 2), fence)])
    assert read_all(setup.bootstrap, setup.out, committed_only=True) == [b"kept"]
    assert b"failed-message" not in read_all(setup.bootstrap, setup.out, committed_only=False)
    assert setup.committed()[0] == 2


class _Ends:
    """The producer of a transaction, recording which transactional end it was given."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("abort_transaction", "commit_transaction", "send_offsets_to_transaction"):
            self.calls.append(name)
        return getattr(self._producer, name)


def _empty_commit(setup: Setup, *, flush: bool) -> list[str]:
    """Send a record, then commit no offsets (the transaction is aborted); the
    transactional calls the producer got."""
    sink = setup.sink()
    sink.claim([setup.tp], default_start=lambda tp: 0)
    txn = sink.begin()
    ends = txn._producer = _Ends(txn._producer)
    with txn.message():
        txn.handle.send(None, b"x")
    if flush:  # the record reaches the broker inside the open transaction
        assert txn._producer.flush(10) == 0
    txn.commit([])
    return ends.calls


def test_empty_commit_aborts(setup: Setup) -> None:
    assert _empty_commit(setup, flush=False) == ["abort_transaction"]
    assert setup.committed()[0] < 0


@pytest.mark.tansu_deviation(
    "Tansu 0.6 serves the records an aborted transaction had sent to read_committed "
    "readers; Kafka hides them. Without the flush the record reached Tansu before the "
    "abort only now and then (the producer's linger), so the test passed or failed by load"
)
def test_empty_commit_hides_what_it_sent(setup: Setup) -> None:
    _empty_commit(setup, flush=True)
    assert read_all(setup.bootstrap, setup.out, committed_only=True, wait=1.0) == []


def run_zombie_and_successor(setup: Setup) -> None:
    """A member restarted with the same member id fences its predecessor: the
    old transaction is rejected and the successor's commits."""
    zombie = setup.sink("same")
    fence = zombie.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    txn = zombie.begin()
    with txn.message():
        txn.handle.send(None, b"zombie")
    # The zombie's record is on the broker (in its open transaction) before the
    # successor fences it, as with a real zombie that stalled mid-transaction.
    assert txn._producer.flush(10) == 0
    successor = setup.sink("same")
    new_fence = successor.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    with pytest.raises(Fenced) as info:
        txn.commit([(commit_of(setup.tp, 1), fence)])
    assert info.value.tps == (setup.tp,)
    t2 = successor.begin()
    with t2.message():
        t2.handle.send(None, b"successor")
    t2.commit([(commit_of(setup.tp, 1), new_fence)])
    assert setup.committed()[0] == 1


def test_zombie_producer_is_fenced(setup: Setup) -> None:
    run_zombie_and_successor(setup)
    assert b"successor" in read_all(setup.bootstrap, setup.out, committed_only=True)


@pytest.mark.tansu_deviation(
    "Tansu 0.6 does not abort a fenced producer's open transaction: its records "
    "become visible with the successor's commit (same transactional.id); Kafka aborts them",
)
def test_fenced_producer_output_stays_invisible(setup: Setup) -> None:
    run_zombie_and_successor(setup)
    assert read_all(setup.bootstrap, setup.out, committed_only=True) == [b"successor"]


def test_stale_local_fence_is_rejected(setup: Setup) -> None:
    sink = setup.sink()
    old = sink.claim([setup.tp], default_start=lambda tp: 0)[setup.tp].fence
    sink.claim([setup.tp], default_start=lambda tp: 0)
    txn = sink.begin()
    with txn.message():
        txn.handle.send(None, b"stale")
    with pytest.raises(Fenced, match=r"\[0\]"):
        txn.commit([(commit_of(setup.tp, 1), old)])
    assert read_all(setup.bootstrap, setup.out, committed_only=True, wait=1.0) == []
    assert sink.begin() is not None  # the sink is usable again


def test_claim_needs_a_bound_consumer(broker: Broker) -> None:
    sink = KafkaSink("out", bootstrap=broker.bootstrap)
    with pytest.raises(SinkStateError) as info:
        sink.claim([("in", 0)], default_start=lambda tp: 0)
    assert "bind(consumer)" in info.value.line()


def test_unreachable_broker_is_a_one_line_failure() -> None:
    sink = KafkaSink("out", bootstrap="127.0.0.1:1", timeout=2)
    with pytest.raises(RuntimeFailure, match=r"127\.0\.0\.1:1") as info:
        sink.open("g")
    assert "\n" not in info.value.line()


class _MovingCoordinator:
    """A bound consumer whose ``committed`` first fails ``failures`` times with ``code``."""

    def __init__(self, code: int, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def committed(self, parts: list[KafkaTopicPartition], timeout: float) -> list[Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code, "coordinator moved"))
        return [KafkaTopicPartition(p.topic, p.partition, -1001) for p in parts]


def _read_offsets_from(sink: KafkaSink, consumer: Any) -> None:
    """Bind ``consumer`` and let the sink read the committed offsets from it (the
    sink reads them with a consumer of its own, off the group consumer's thread)."""
    sink.bind(consumer)
    sink._offsets = consumer


def test_claim_waits_out_a_moving_group_coordinator() -> None:
    """A coordinator that moves or loads (a broker restart, a new offsets-topic
    leader: seen on the three-node cluster) is asked again until the timeout;
    any other error, or one that outlasts the timeout, is a one-line failure."""
    sink = KafkaSink("out", bootstrap="127.0.0.1:1", timeout=2)
    moving = _MovingCoordinator(KafkaError.NOT_COORDINATOR, failures=3)
    _read_offsets_from(sink, moving)
    assert sink.claim([("in", 0)], default_start=lambda tp: 7)[("in", 0)].committed == 7
    assert moving.calls == 4
    for consumer in (
        _MovingCoordinator(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, failures=1000),
        _MovingCoordinator(KafkaError.GROUP_AUTHORIZATION_FAILED, failures=1),
    ):
        _read_offsets_from(sink, consumer)
        with pytest.raises(RuntimeFailure, match="reading the committed offsets") as info:
            sink.claim([("in", 0)], default_start=lambda tp: 0)
        assert "\n" not in info.value.line()
    assert consumer.calls == 1
