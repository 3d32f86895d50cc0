"""The Apache Pulsar adapter (:class:`htmqc.sources.pulsar.PulsarConsumer`) against a
private standalone broker (:mod:`htmqc.sources.pulsar_server`): offsets dense per
partition from the broker-entry index (batched and not, across a new ledger), keys and
headers, watermarks; a seek inside a batch and past the end (then new messages); the
redelivery filter (a reader that delivers again after a reconnect); commits with their
metadata in the commit topic, reported only once the broker confirmed them; the lease
(an Exclusive subscription: a standby takes over when the holder goes, a member whose
subscription stays disconnected stops, an unload is survived); bootstrap URLs. Run-level
evidence is in ``test_pulsar_run.py``; seek, pause, ordered commits, refusals in one line
and the dead-letter producer, shared with NATS and RabbitMQ, and dense offsets with
keys, headers and watermarks and a standby's takeover, shared with RabbitMQ, in
``test_source_contract.py``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.produce import parse_id
from htmqc.sources.pulsar import (
    Endpoint,
    EntryLookup,
    OffsetMapper,
    PulsarClient,
    PulsarConsumer,
    _Fetch,
    endpoint_of,
    produce,
)
from htmqc.sources.pulsar_server import PulsarServer
from tests.sources.support import assign_at, drain
from tests.sources.test_pulsar_offsets import Log, model

pytestmark = pytest.mark.slow


def test_a_seek_inside_a_batch_and_past_the_end_then_new_messages(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 250, partitions=1, client=client)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "g")
    try:
        consumer.subscribe([topic], on_assign=assign_at({0: 250}))  # the log end
        assert drain(consumer, 1, timeout=1.5) == [], "nothing at or past the end yet"
        produce(pulsar_server.bootstrap, topic, 50, partitions=1, start_id=250, client=client)
        got = drain(consumer, 50)
        assert [m.offset() for m in got] == list(range(250, 300)), "none skipped, none again"
        assert [parse_id(m.value()) for m in got] == list(range(250, 300))
        for at in (137, 0, 299):  # batches of up to 100: 137 is inside one
            consumer.seek(KafkaTP(topic, 0, at))
            got = drain(consumer, 300 - at)
            assert [m.offset() for m in got] == list(range(at, 300))
            assert [parse_id(m.value()) for m in got] == list(range(at, 300))
    finally:
        consumer.close()


def model_lookup(log: Log) -> EntryLookup:
    """The broker-entry index of a model partition's entries."""
    entries = model(log)
    return lambda ledger, entry: entries[(ledger, entry)]


class _Redelivering:
    """A reader that delivers ``ids`` in order (some again), then times out."""

    def __init__(self, ids: list[tuple[int, int, int]]) -> None:
        self.ids = list(ids)

    def read_next(self, _timeout: int) -> Any:
        import pulsar

        if not self.ids:
            raise pulsar.Timeout()
        return _Msg(self.ids.pop(0))


class _Msg:
    def __init__(self, mid: tuple[int, int, int]) -> None:
        self.mid = mid

    def message_id(self) -> Any:
        ledger, entry, batch = self.mid

        class Id:
            def ledger_id(self) -> int:
                return ledger

            def entry_id(self) -> int:
                return entry

            def batch_index(self) -> int:
                return batch

        return Id()

    def partition_key(self) -> str:
        return ""

    def properties(self) -> dict[str, str]:
        return {}

    def data(self) -> bytes:
        return repr(self.mid).encode()

    def publish_timestamp(self) -> int:
        return 1_700_000_000_000


def test_a_redelivered_id_is_dropped_before_the_mapper_sees_it() -> None:
    # Ledger 5: entries 0 (one message), 1 (a batch of 3), 2 (one). After a reconnect
    # the reader delivers entry 1 again from its start, then goes on.
    ids = [(5, 0, -1), (5, 1, 0), (5, 1, 1), (5, 1, 0), (5, 1, 1), (5, 1, 2), (5, 2, -1)]
    fetch = _Fetch("t", 0, 0, OffsetMapper(model_lookup([(5, [1, 3, 1])])))
    got = fetch.read(_Redelivering(ids), 100)
    assert [m.offset() for m in got] == [0, 1, 2, 3, 4]
    assert [m.value() for m in got] == [repr(i).encode() for i in ids[:3] + ids[5:]]


def test_messages_below_the_start_of_a_session_are_not_handed_out() -> None:
    # A read from offset 3 that starts at its entry's first message (offset 1).
    fetch = _Fetch("t", 0, 3, OffsetMapper(model_lookup([(5, [1, 3, 1])])))
    got = fetch.read(_Redelivering([(5, 1, 0), (5, 1, 1), (5, 1, 2), (5, 2, -1)]), 100)
    assert [m.offset() for m in got] == [3, 4]


def test_commits_keep_their_metadata_and_survive_a_broker_restart(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 10, partitions=2, client=client)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "gc")
    try:
        done = consumer.commit(
            offsets=[KafkaTP(topic, 0, 3, metadata="finished:5,6"), KafkaTP(topic, 1, 2)],
            asynchronous=False,
        )
        assert [(p.partition, p.offset) for p in done] == [(0, 3), (1, 2)]
    finally:
        consumer.close()
    pulsar_server.restart()  # an orderly restart: the commit topic is kept
    assert client.committed("gc", topic, 0) == 3
    assert client.commit_metadata("gc", topic, 0) == "finished:5,6"
    again = PulsarConsumer(pulsar_server.bootstrap, "gc")
    try:
        got = again.committed([KafkaTP(topic, 0), KafkaTP(topic, 1)])
        assert [(p.offset, p.metadata) for p in got] == [(3, "finished:5,6"), (2, None)]
        again.subscribe([topic])  # assigned without offsets: at the commits
        got_msgs = drain(again, 6)
        assert sorted((m.partition(), m.offset()) for m in got_msgs) == [
            (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)
        ]
    finally:
        again.close()


def test_a_commit_is_reported_only_once_the_broker_confirmed_it(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 10, partitions=1, client=client)
    acks: list[Any] = []
    consumer = PulsarConsumer(
        pulsar_server.bootstrap, "gk", on_commit=lambda e, p: acks.append((e, p))
    )
    assert pulsar_server.process is not None
    pid = pulsar_server.process.pid
    try:
        consumer.commit(offsets=[KafkaTP(topic, 0, 1)], asynchronous=False)  # the topic exists
        os.kill(pid, signal.SIGSTOP)  # a broker that answers nothing: no confirmation
        try:
            consumer.commit(offsets=[KafkaTP(topic, 0, 7, metadata="m")])
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                consumer.consume(10, 0.1)
            assert acks == [], "a commit was reported before the broker confirmed it"
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not acks and time.monotonic() < deadline:
            consumer.consume(10, 0.1)
        assert [(e, [p.offset for p in parts]) for e, parts in acks] == [(None, [7])]
        assert client.committed("gk", topic, 0) == 7
    finally:
        consumer.close()


def test_the_lease_holds_no_backlog_of_the_topic(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    """The lease is a subscription on an empty topic of its own: the consumed
    topic gets no durable subscription that would keep all its messages."""
    import json

    from htmqc.sources.pulsar import PulsarAdmin, lease_topic, topic_path

    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 50, partitions=2, client=client)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "g-backlog")
    admin = PulsarAdmin(endpoint_of(pulsar_server.bootstrap).admin_url)
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        assert len(drain(consumer, 50)) == 50
        stats = json.loads(admin._get(f"{topic_path(topic)}/partitioned-stats")[0])
        assert "g-backlog" not in stats.get("subscriptions", {})
        lease = lease_topic("g-backlog", topic).removeprefix("persistent://")
        held = json.loads(admin._get(f"{lease}/stats")[0])["subscriptions"]["g-backlog"]
        assert held["msgBacklog"] == 0 and held["type"] == "Exclusive"
    finally:
        consumer.close()


def test_a_lease_that_cannot_be_taken_stops_the_member_in_one_line(
    pulsar_server: PulsarServer,
    client: PulsarClient,
    topic_name: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker that refuses to create the lease topic (no auto-creation, or no
    permission): the member does not retry forever; ``consume`` raises one line."""
    from htmqc.sources.pulsar import AdminError, PulsarAdmin

    def refuse(self: Any, topic: str) -> None:
        raise AdminError(403, f"Pulsar admin PUT {topic} answered 403", "check the role")

    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 5, partitions=1, client=client)
    monkeypatch.setattr(PulsarAdmin, "create_plain", refuse)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "g-refused")
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        with pytest.raises(RuntimeFailure, match="lease of group 'g-refused' cannot be taken"):
            drain(consumer, 5, timeout=10)
    finally:
        consumer.close()


def test_a_member_whose_lease_stays_disconnected_stops(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 10, partitions=1, client=client)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "gl", lease_grace=1.0)
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        assert len(drain(consumer, 10)) == 10
        pulsar_server.restart()  # the lease's connection goes: another member may take it
        with pytest.raises(RuntimeFailure, match=r"lease of group 'gl' .* was lost") as info:
            drain(consumer, 1, timeout=10)
        assert "\n" not in info.value.line()
    finally:
        consumer.close()


def test_unloaded_partitions_reconnect_without_a_repeat_or_a_skip(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    """A topic unload (what Pulsar's load balancer does) disconnects the readers, and
    an unload of the lease topic the lease subscription; both reconnect within the
    lease's grace and the member goes on, holding the lease again."""
    from htmqc.sources.pulsar import lease_topic

    topic = topic_name()
    lease = lease_topic("gu", topic).removeprefix("persistent://")

    def lease_consumers() -> int:
        stats = pulsar_server.admin("GET", f"/v2/persistent/{lease}/stats")
        return len(stats["subscriptions"].get("gu", {}).get("consumers", []))

    produce(pulsar_server.bootstrap, topic, 400, partitions=2, client=client)
    consumer = PulsarConsumer(pulsar_server.bootstrap, "gu")
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        got = drain(consumer, 150)
        for _ in range(3):
            pulsar_server.admin("PUT", f"/v2/persistent/public/default/{topic}/unload")
            pulsar_server.admin("PUT", f"/v2/persistent/{lease}/unload")
            got += drain(consumer, 50)
            deadline = time.monotonic() + 20
            while lease_consumers() != 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert lease_consumers() == 1, "the lease subscription did not come back"
        produce(pulsar_server.bootstrap, topic, 200, partitions=2, start_id=400, client=client)
        got += drain(consumer, 600 - len(got), timeout=30)
        for p in range(2):
            offsets = [m.offset() for m in got if m.partition() == p]
            assert offsets == list(range(300)), f"partition {p}"
        assert sorted(parse_id(m.value()) for m in got) == list(range(600))
    finally:
        consumer.close()


def test_bootstrap_urls() -> None:
    assert endpoint_of("pulsar://h:1") == Endpoint("pulsar://h:1", "http://h:8080", "h", 1)
    assert endpoint_of("pulsar://h?admin-port=9") == Endpoint(
        "pulsar://h:6650", "http://h:9", "h", 6650
    )
    assert endpoint_of("pulsar://h:1?admin=https://a:4").admin_url == "https://a:4"
    for bad in ("nats://h:1", "h:1", "", "pulsar://h:x", "pulsar://h?admin-port=x",
                "pulsar://h?admin=ftp://a"):  # fmt: skip
        with pytest.raises(UsageError):
            endpoint_of(bad)
