"""What every non-Kafka source must do alike, run on each (``nats``, ``rabbitmq-stream``,
``pulsar``) against its private server (tests/sources/conftest.py): a seek fetches again
and a pause hides a partition; commits are stored in order and reported inside
``consume`` (with their metadata where the source keeps it); a missing topic or a second
one is refused in one line, and so is a server that does not answer; ``htmqc run``
exactly-once into SQLite across a SIGKILL stores every effect once and resumes at the
sink's positions; the dead-letter producer publishes to ``TOPIC.dlq`` and
``TOPIC.dlq.poison``, and a run's at-least-once dead letters reach ``TOPIC.dlq``. Where
two sources share a test NATS does not (its offsets have holes, its successor waits out
a lease), the test names them: dense offsets with keys, headers and watermarks, a
standby member that takes over when the first goes, at-least-once across a SIGKILL with
a standby. Every source: a member frozen inside a transaction while a standby takes its
lease is fenced and stops. What differs per source is in ``test_nats_*.py``,
``test_rabbitmq_*.py`` and ``test_pulsar_*.py``."""

from __future__ import annotations

import asyncio
import importlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.produce import message_key
from tests.runtime.test_modes_broker import audit_sigkill_restart, kill, kill_left, pg_tables
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for
from tests.sources.support import (
    HANDLERS,
    ZombieFiles,
    assign_at,
    check_commits,
    check_exactly_once_across_sigkill,
    check_exactly_once_through_kills,
    check_offsets,
    check_seek_and_pause,
    check_traces,
    check_zombie_stored_nothing,
    drain,
    stalling_member,
    traced,
)

pytestmark = pytest.mark.slow

#: ``--source`` -> (server fixture, module, client class, consumer class, keeps metadata).
SOURCES = {
    "nats": ("nats_server", "htmqc.sources.nats", "NatsClient", "NatsConsumer", True),
    "rabbitmq-stream": (
        "rabbitmq_server", "htmqc.sources.rabbitmq", "RabbitStreamClient",
        "RabbitStreamConsumer", False,
    ),
    "pulsar": ("pulsar_server", "htmqc.sources.pulsar", "PulsarClient", "PulsarConsumer", True),
}  # fmt: skip
#: Messages of the exactly-once run (NATS's test had 8,000 before it was shared).
EXACTLY_ONCE_COUNT = {"nats": 8000, "rabbitmq-stream": 5000, "pulsar": 5000}


@dataclass
class Source:
    """One source under test: its server's URL, admin client and adapter module."""

    name: str
    url: str
    client: Any
    module: Any
    consumer_class: Any
    keeps_metadata: bool
    server: Any

    def produce(self, topic: str, count: int, partitions: int) -> None:
        self.module.produce(self.url, topic, count, partitions=partitions, client=self.client)

    def consumer(self, group: str, **kw: Any) -> Any:
        return self.consumer_class(self.url, group, **kw)


@pytest.fixture(params=sorted(SOURCES))
def source(request: pytest.FixtureRequest) -> Iterator[Source]:
    server_fixture, module_name, client_class, consumer_class, keeps = SOURCES[request.param]
    server = request.getfixturevalue(server_fixture)
    module = importlib.import_module(module_name)
    url = getattr(server, "bootstrap", server.url)  # Pulsar's carries its admin port
    client = getattr(module, client_class)(url)
    try:
        yield Source(request.param, url, client, module, getattr(module, consumer_class), keeps,
                     server)
    finally:
        client.close()


def test_seek_refetches_and_pause_hides_a_partition(
    source: Source, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    source.produce(topic, 200, 2)
    consumer = source.consumer("g")
    try:
        check_seek_and_pause(consumer, topic)
    finally:
        consumer.close()


def test_commits_are_stored_in_order_and_acknowledged_inside_consume(
    source: Source, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    source.produce(topic, 10, 2)
    check_commits(
        lambda **kw: source.consumer("grp", **kw), topic,
        lambda p: source.client.committed("grp", topic, p), keeps=source.keeps_metadata,
    )  # fmt: skip


def test_exactly_once_into_sqlite_across_sigkill(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic, n = topic_name(), EXACTLY_ONCE_COUNT[source.name]
    source.produce(topic, n, 4)
    check_exactly_once_across_sigkill(source.url, topic, ["--source", source.name], tmp_path, n)


def test_exactly_once_through_repeated_consumer_kills(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic, n = topic_name(), 3000
    source.produce(topic, n, 4)
    check_exactly_once_through_kills(source.url, topic, ["--source", source.name], tmp_path, n)


def drop_lease(source: Source, group: str, topic: str) -> None:
    """Make the broker let go of a frozen member's lease now. A Pulsar broker drops
    a silent client's subscription only once its keepalive gives up, so the lease
    topic is unloaded, as Pulsar's load balancer does; RabbitMQ's lease goes after two
    missed heartbeats (10 s) and NATS's key expires (10 s) by themselves."""
    if source.name == "pulsar":
        from htmqc.sources.pulsar import lease_topic

        lease = lease_topic(group, topic).removeprefix("persistent://")
        source.server.admin("PUT", f"/v2/persistent/{lease}/unload")


def test_a_frozen_member_whose_lease_is_taken_over_stores_nothing_late(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    """The lease's zombie, as tests/runtime/test_zombie_broker.py does it on Kafka: member
    A, exactly-once into PostgreSQL, stalls inside an open transaction
    (:func:`tests.runtime.handlers.stalling_record`) and is then frozen (SIGSTOP: a long
    GC pause, a stalled VM). The broker lets its lease go (:func:`drop_lease`); the
    standby B takes the lease, claims the partitions (bumping their fences) and stores
    everything. When A wakes inside its old transaction, it finds its lease lost and
    stops with one error line and no traceback; if its late commit comes first (always
    on Pulsar, whose lease is only in doubt for a 10 s grace; sometimes on NATS and
    RabbitMQ, whose lease is found lost at once), it is fenced; the row A wrote in that
    transaction does not exist, every message has exactly one effect, and both traces
    are behaviours of the model. B stays (idle) while A wakes, so A's lease cannot come
    back. PostgreSQL, not SQLite: a frozen SQLite writer keeps the file locked, so B
    would wait for A instead."""
    url, topic, n, stall_at = source.url, topic_name(), 3000, 800
    group = f"g-zombie-{uuid.uuid4().hex[:6]}"
    source.produce(topic, n, 2)
    files = ZombieFiles.under(tmp_path)
    flag, marker = files.flag, files.marker
    log_a, log_b, trace_a, trace_b = files.log_a, files.log_b, files.trace_a, files.trace_b
    with pg_tables() as pg:
        args, env = stalling_member(source.name, group, pg, flag, stall_at)
        a = htmqc_run(url, topic, *args, *traced(trace_a), env=env, log=log_a)
        b = None
        try:
            wait_for(marker.exists, 60, "A to stall inside a transaction")
            stalled_id, stalled_pid = map(int, marker.read_text().split())
            assert stalled_pid == a.pid and stalled_id >= stall_at
            b = htmqc_run(url, topic, *args, *traced(trace_b), "--idle-exit", "25", env=env,
                          log=log_b)  # fmt: skip
            wait_for(lambda: "waiting as a standby" in log_b.read_text(), 30, "the standby")
            a.send_signal(signal.SIGSTOP)
            flag.unlink()  # when A runs again, it goes on at once
            before = pg.stored()
            assert 0 < before < n, "A should have committed some transactions before stalling"
            drop_lease(source, group, topic)
            wait_for(lambda: pg.stored() == n, 120, "B to take the lease and store everything")
            assert "took the lease" in log_b.read_text()
            assert "fenced" not in log_a.read_text()
            a.send_signal(signal.SIGCONT)  # the zombie wakes up inside its old transaction
            code = finish(a, 60)
            assert "stopping" not in log_b.read_text(), "B left before A's lease was lost"
            assert finish(b, 60) == 0, log_b.read_text()[-2000:]
        finally:
            kill_left(a, b)
        text = log_a.read_text()
        errors = [line for line in text.splitlines() if line.startswith("htmqc: error:")]
        assert code != 0 and len(errors) == 1 and "lease" in errors[0], text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        if source.name == "pulsar":  # its 10 s grace outlasts the late commit, always
            assert "fenced: " in text, text[-3000:]
        check_zombie_stored_nothing(pg, n, stalled_id, b.pid)
    check_traces("exactly-once", trace_a, trace_b)


#: The sources whose offsets are dense (NATS's have holes where messages were
#: deleted) and whose standby takes over as soon as the first member goes (a NATS
#: successor waits out the lease): test_nats_adapter.py and test_nats_run.py.
DENSE_WITH_STANDBY = ["pulsar", "rabbitmq-stream"]


@pytest.mark.parametrize("source", DENSE_WITH_STANDBY, indirect=True)
def test_offsets_are_dense_per_partition_with_keys_headers_and_watermarks(
    source: Source, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    source.produce(topic, 300, 3)
    consumer = source.consumer("g")
    try:
        check_offsets(consumer, topic, {p: list(range(100)) for p in range(3)}, 100)
    finally:
        consumer.close()


@pytest.mark.parametrize("source", DENSE_WITH_STANDBY, indirect=True)
def test_a_second_member_waits_as_a_standby_and_takes_over_when_the_first_goes(
    source: Source, topic_name: Callable[[], str]
) -> None:
    """The lease (Pulsar's Exclusive subscription, RabbitMQ's lease queue) goes with
    the first member's connection: the standby takes over at once."""
    topic = topic_name()
    source.produce(topic, 20, 2)
    first = source.consumer("g")
    second = source.consumer("g")
    try:
        first.subscribe([topic], on_assign=assign_at({}))
        assert len(drain(first, 20)) == 20
        second.subscribe([topic], on_assign=assign_at({}))
        assert drain(second, 1, timeout=1.5) == [], "the standby gets nothing"
        first.close()
        began = time.monotonic()
        assert len(drain(second, 20)) == 20
        assert time.monotonic() - began < 5, "the lease went with the first member"
    finally:
        first.close()
        second.close()


#: The first stream a missing topic ``nope`` would have, as a refusal names it.
MISSING_STREAM = {
    "nats": "nope-0", "rabbitmq-stream": "nope-0", "pulsar": ".*nope-partition-0"
}  # fmt: skip


def test_subscribe_refuses_a_missing_topic_and_a_second_topic(
    source: Source, topic_name: Callable[[], str]
) -> None:
    consumer = source.consumer("g")
    topic = topic_name()
    source.produce(topic, 1, 1)
    try:
        with pytest.raises(UsageError, match=f"has no streams {MISSING_STREAM[source.name]}"):
            consumer.subscribe(["nope"])
        with pytest.raises(UsageError, match="consumes one topic"):
            consumer.subscribe(["a", "a_retry"])  # not a's retry topic
        with pytest.raises(UsageError, match=f"topic '{topic}.retry' has no streams") as info:
            consumer.subscribe([topic, f"{topic}.retry"])  # not made yet
        assert "run with --retry-topic: it makes them" in info.value.line()
    finally:
        consumer.close()


#: ``--source`` -> (the bootstrap of a server that is not there, the refusal).
UNREACHABLE = {
    "nats": ("nats://127.0.0.1:1", "cannot reach NATS"),
    "rabbitmq-stream": ("rabbitmq-stream://127.0.0.1:1", "cannot reach RabbitMQ's stream port"),
    "pulsar": ("pulsar://127.0.0.1:1?admin-port=2", "cannot reach Pulsar"),
}


@pytest.mark.parametrize("name", sorted(UNREACHABLE))
def test_an_unreachable_server_is_one_line(name: str) -> None:
    _server, module_name, _client, consumer_class, _keeps = SOURCES[name]
    consumer = getattr(importlib.import_module(module_name), consumer_class)
    url, says = UNREACHABLE[name]
    with pytest.raises(RuntimeFailure, match=says) as info:
        consumer(url, "g", connect_seconds=0.5)
    assert "\n" not in info.value.line()


#: Messages of the at-least-once run across a SIGKILL.
AT_LEAST_ONCE_COUNT = {"rabbitmq-stream": 5000, "pulsar": 6000}


@pytest.mark.parametrize("source", DENSE_WITH_STANDBY, indirect=True)
def test_at_least_once_across_sigkill_a_standby_takes_over_and_loses_nothing(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    """At-least-once over a 4-partition topic across a SIGKILL, with a standby
    started before the kill: nothing lost, the standby takes the dead member's
    lease, starts at its commits, and the duplicates are exactly the killed
    process's uncommitted window."""
    url, topic, n, group = source.url, topic_name(), AT_LEAST_ONCE_COUNT[source.name], "g-alo"
    source.produce(topic, n, 4)
    out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    args = [f"{HANDLERS}:log_order", "--source", source.name, "--group", group]

    def committed() -> int:
        return sum(source.client.committed(group, topic, p) or 0 for p in range(4))

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


#: A dead letter as the tests read it: value, key, headers (as text).
Letter = tuple[bytes, str, dict[str, str]]


def dead_letters(source: Source, topic: str, suffix: str = ".dlq") -> list[Letter]:
    """The messages of ``TOPIC`` + ``suffix`` (``.dlq``, ``.dlq.poison``, or a retry
    topic's partition, :data:`RETRY_PARTITION`) now: a NATS subject (of the stream
    ``TOPIC-dlq`` or ``TOPIC-retry``; the key a header), a Pulsar topic, a RabbitMQ
    stream. A message without a key has the key ``""``."""
    client, name = source.client, f"{topic}{suffix}"
    if source.name == "pulsar":
        return [(m.data(), m.partition_key(), dict(m.properties())) for m in client.read(name)]
    if source.name == "nats":

        async def fetch() -> list[Letter]:
            retry = suffix == RETRY_PARTITION["nats"]
            stream = source.module.stream_name(f"{topic}.retry", 0) if retry else f"{topic}-dlq"
            sub = await client.js.pull_subscribe(name, stream=stream)
            msgs = await sub.fetch(10, timeout=2)
            await sub.unsubscribe()
            out = []
            for m in msgs:
                headers = dict(m.headers or {})
                out.append((m.data, headers.pop(source.module.KEY_HEADER, ""), headers))
            return out

        return client.call(fetch())  # type: ignore[no-any-return]

    async def read() -> list[Letter]:  # every message of the stream: read for 0.5 s
        from rstream import amqp_decoder

        got: list[Letter] = []

        def on_message(msg: Any, ctx: Any) -> None:
            m = source.module.convert(name, 0, ctx.offset, ctx.timestamp, msg)
            headers = {k: v.decode() for k, v in m.headers() or []}
            got.append((m.value(), (m.key() or b"").decode(), headers))

        sid = await client.consumer.subscribe(name, on_message, decoder=amqp_decoder)
        await asyncio.sleep(0.5)
        await client.consumer.unsubscribe(sid)
        return got

    return client.call(read())  # type: ignore[no-any-return]


#: ``--source`` -> its dead-letter producer (:class:`~htmqc.ports.ProducerPort`).
PRODUCERS = {
    "nats": "NatsProducer", "rabbitmq-stream": "RabbitStreamProducer", "pulsar": "PulsarProducer"
}  # fmt: skip


def test_dead_letters_go_to_their_own_streams(
    source: Source, topic_name: Callable[[], str]
) -> None:
    """The dead-letter producer publishes to ``TOPIC.dlq`` and ``TOPIC.dlq.poison``
    (created on first use), key and headers kept, and reports each delivery."""
    topic = topic_name()
    producer = getattr(source.module, PRODUCERS[source.name])(source.url, topic)
    outcomes: list[Any] = []
    try:
        producer.produce(
            f"{topic}.dlq", value=b"v", key=b"k", headers=[("why", b"boom")],
            on_delivery=lambda err, _m: outcomes.append(err),
        )  # fmt: skip
        producer.produce(f"{topic}.dlq.poison", value=b"p", key=None, headers=None)
        assert producer.flush(10) == 0
    finally:
        producer.close()
    assert outcomes == [None]
    assert dead_letters(source, topic) == [(b"v", "k", {"why": "boom"})]
    assert [value for value, _key, _headers in dead_letters(source, topic, ".dlq.poison")] == [
        b"p"
    ]


def test_at_least_once_dead_letters_are_published_to_the_dlq(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic = topic_name()
    source.produce(topic, 50, 2)
    log = tmp_path / "run.log"
    proc = htmqc_run(
        source.url, topic, f"{HANDLERS}:poison_five", "--source", source.name,
        "--group", "g-dlq", "--max-retries", "0", "--idle-exit", "2", log=log,
    )  # fmt: skip
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    assert sum(source.client.committed("g-dlq", topic, p) or 0 for p in range(2)) == 50
    letters = dead_letters(source, topic)
    assert len(letters) == 1
    value, key, headers = letters[0]
    assert value.startswith(b"000000000005")
    assert key == "k5"
    assert headers["htmqc-dlq-source"] == f"{topic}/1/2"
    assert headers["htmqc-dlq-error-class"].endswith("ValueError")


#: Where the one partition of a source's retry topic ``TOPIC.retry`` is (``--retry-topic``).
RETRY_PARTITION = {
    "nats": ".retry.0", "pulsar": ".retry-partition-0", "rabbitmq-stream": ".retry-0"
}  # fmt: skip


def test_retries_wait_in_the_retry_topic_and_the_partition_moves_on(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    """``--retry-topic``, as tests/runtime/test_retry_topic_broker.py on Kafka: a
    message that fails is written to the one-partition topic ``TOPIC.retry`` (made at
    start) and its partition moves on; it runs again from there once its
    ``htmqc-retry-after`` time has come (failing again, it goes back with the next
    attempt); one that never works is dead-lettered to ``TOPIC.dlq`` after
    ``--max-retries``. Every other message is handled once, and the retry partition's
    position is committed to its end."""
    topic, count, keys, group = topic_name(), 300, 10, "g-retry"
    flaky, hopeless = [3, 50, 151], 7  # fail twice then work; always fail
    source.module.produce(source.url, topic, count, partitions=1, keys=keys,
                          client=source.client)  # fmt: skip
    out, log = tmp_path / "handled.txt", tmp_path / "run.log"
    proc = htmqc_run(
        source.url, topic, "tests.runtime.failure_handlers:fail_twice_then_log",
        "--source", source.name, "--group", group, "--retry-topic", "--retry-topic-ms", "0",
        "--backoff-ms", "300", "--backoff-max-ms", "600", "--max-retries", "2",
        "--idle-exit", "4",
        env={"HTMQC_TEST_OUT": str(out), "HTMQC_TEST_POISON": ",".join(map(str, flaky)),
             "HTMQC_TEST_HOPELESS": str(hopeless)},
        log=log,
    )  # fmt: skip
    assert finish(proc, 120) == 0, log.read_text()[-3000:]
    rows = [line.split() for line in out.read_text().splitlines()]
    handled = {int(r[0]): r for r in rows}
    assert len(rows) == len(handled) == count - 1, "lost or handled twice"
    assert hopeless not in handled
    retry = f"{topic}.retry"
    for ident in flaky:
        _, read_from, at_ms, due_ms = handled[ident]
        assert read_from == retry, "a retried message ran from the main topic"
        assert int(at_ms) >= int(due_ms) > 0, "ran before its retry-after time"
    order = [int(r[0]) for r in rows]
    for ident in flaky:  # the partition moved on: a later message of its key ran first
        later = next(i for i in range(ident + 1, count)
                     if message_key(i, keys) == message_key(ident, keys))  # fmt: skip
        assert order.index(later) < order.index(ident)
    assert source.client.partitions(retry) == 1
    records = dead_letters(source, topic, RETRY_PARTITION[source.name])
    attempts = sorted(int(headers["htmqc-retry-attempt"]) for _, _, headers in records)
    assert attempts == [1] * (len(flaky) + 1) + [2] * (len(flaky) + 1)
    [(_, _, dead)] = dead_letters(source, topic)
    assert (dead["htmqc-dlq-kind"], dead["htmqc-dlq-retries"]) == ("failed", "2")
    # Committed to the retry partition's end. On RabbitMQ the end can be past the
    # records: each stored commit is an entry of the stream and takes an offset (a
    # hole for readers), so commits made while records were still being written
    # leave holes between them.
    end = source.client.watermarks(retry, 0)[1]
    assert source.client.committed(group, retry, 0) == end >= len(records)
