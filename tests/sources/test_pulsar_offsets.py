"""Pulsar offsets (:mod:`htmqc.sources.pulsar`): the broker-entry index as dense
offsets. On a model log (ledgers of entries of batches, entries a reader skips, reads
from the middle of a batch) :class:`OffsetMapper` answers each message's true offset;
on a real standalone broker, batched and unbatched messages across a restart (a new
ledger) map to 0..n-1 per partition, the watermarks agree, and ``locate`` finds each
offset's message id.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from htmqc.sources.pulsar import (
    Entry,
    OffsetMapper,
    PulsarAdmin,
    PulsarConsumer,
    message_offset,
    partition_topic,
    topic_path,
)
from htmqc.sources.pulsar_server import PulsarServer
from tests.services import require_module


def test_names_and_the_offset_formula() -> None:
    assert topic_path("t") == "public/default/t"
    assert topic_path("persistent://a/b/t") == "a/b/t"
    assert partition_topic("a/b/t", 3) == "persistent://a/b/t-partition-3"
    assert message_offset(index=7, messages=1, batch_index=-1) == 7
    assert [message_offset(9, 3, b) for b in range(3)] == [7, 8, 9]
    assert Entry(index=9, messages=3).first == 7


#: A model partition: ledgers (ids growing, sparse) of entries of ``messages`` each.
Log = list[tuple[int, list[int]]]


def model(log: Log) -> dict[tuple[int, int], Entry]:
    """Each entry's broker index, as AppendIndexMetadataInterceptor writes it."""
    out = {}
    index = -1
    for ledger, entries in log:
        for entry, messages in enumerate(entries):
            index += messages
            out[(ledger, entry)] = Entry(index, messages)
    return out


def deliveries(log: Log, skipped: set[int], start: int) -> list[tuple[int, int, int, int]]:
    """``(ledger, entry, batch index, true offset)`` of what a reader gets, in order:
    every message from the ``start``-th one on, less the entries numbered in ``skipped``
    (markers, aborted transactions)."""
    out = []
    n = 0
    offset = 0
    for ledger, entries in log:
        for entry, messages in enumerate(entries):
            for b in range(messages):
                if n not in skipped and offset >= start:
                    out.append((ledger, entry, b if messages > 1 else -1, offset))
                offset += 1
            n += 1
    return out


logs = st.lists(
    st.lists(st.integers(1, 4), min_size=0, max_size=6), min_size=1, max_size=4
).map(lambda ledgers: [(3 + 7 * i, entries) for i, entries in enumerate(ledgers)])


@settings(max_examples=300, deadline=None)
@given(log=logs, skipped=st.sets(st.integers(0, 30), max_size=5), start=st.integers(0, 40))
def test_the_mapper_answers_every_true_offset(log: Log, skipped: set[int], start: int) -> None:
    entries = model(log)
    looked: list[tuple[int, int]] = []

    def lookup(ledger: int, entry: int) -> Entry:
        looked.append((ledger, entry))
        return entries[(ledger, entry)]

    mapper = OffsetMapper(lookup)
    got = deliveries(log, skipped, start)
    assert [mapper.offset(ledger, entry, b) for ledger, entry, b, _ in got] == [
        offset for *_, offset in got
    ]
    # Looked up: the first entry, one after each skipped entry, one per new ledger.
    seen_entries = list(dict.fromkeys((ledger, entry) for ledger, entry, *_ in got))
    assert len(looked) <= 1 + len(skipped) + len(log)
    assert set(looked) <= set(seen_entries)


def test_a_run_of_consecutive_entries_needs_one_lookup_per_ledger() -> None:
    log: Log = [(5, [3, 1, 2, 1]), (9, [2, 2])]
    entries = model(log)
    mapper = OffsetMapper(lambda ledger, entry: entries[(ledger, entry)])
    got = deliveries(log, set(), 0)
    assert [mapper.offset(*d[:3]) for d in got] == list(range(11))
    assert mapper.lookups == 2
    mapper.reset()  # after a seek, the next message is looked up
    assert mapper.offset(9, 1, 1) == 10 and mapper.lookups == 3


def test_a_batch_read_from_its_middle_is_not_counted_whole() -> None:
    log: Log = [(5, [1, 4, 1])]
    entries = model(log)
    mapper = OffsetMapper(lambda ledger, entry: entries[(ledger, entry)])
    assert mapper.offset(5, 0, -1) == 0
    # Entry 1 follows (derived), but read from its third message: its size is unknown.
    assert [mapper.offset(5, 1, 2), mapper.offset(5, 1, 3)] == [3, 4]
    assert mapper.offset(5, 2, -1) == 5
    assert mapper.lookups == 2


@pytest.mark.slow
def test_a_real_broker_numbers_each_partition_densely(
    pulsar_server: PulsarServer, topic_name: Callable[[], str]
) -> None:
    pulsar: Any = require_module("pulsar")
    name = topic_name()
    topic = pulsar_server.create_partitioned_topic(name, 2)
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)

    def write(count: int, batched: bool) -> None:
        client = pulsar.Client(pulsar_server.url, logger=logger)
        producer = client.create_producer(
            topic, batching_enabled=batched, batching_max_messages=5,
            batching_max_publish_delay_ms=20,
        )  # fmt: skip
        for i in range(count):
            producer.send_async(f"{batched}{i}".encode(), None)
        producer.flush()
        client.close()

    write(40, batched=True)
    write(10, batched=False)
    pulsar_server.restart()  # the partitions go on in new ledgers
    write(20, batched=True)

    admin = PulsarAdmin(pulsar_server.admin_url)
    ids: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    client = pulsar.Client(pulsar_server.url, logger=logger)
    try:
        consumer = client.subscribe(
            topic, "offsets", consumer_type=pulsar.ConsumerType.Failover,
            initial_position=pulsar.InitialPosition.Earliest,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while sum(map(len, ids.values())) < 70 and time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            mid = message.message_id()
            part = int(message.topic_name().rsplit("-", 1)[1])
            ids[part].append((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
        consumer.close()
    finally:
        client.close()
    assert sum(map(len, ids.values())) == 70
    for part, got in ids.items():
        assert len({ledger for ledger, *_ in got}) == 2, "the restart began a new ledger"
        mapper = OffsetMapper(lambda ledger, entry, p=part: admin.entry(name, p, ledger, entry))
        assert [mapper.offset(*i) for i in got] == list(range(len(got)))
        assert mapper.lookups == 2  # the first entry, the first of the new ledger
        assert admin.watermarks(name, part) == (0, len(got))
        assert [admin.locate(name, part, o) for o in range(len(got))] == got
        assert admin.locate(name, part, len(got)) is None


class GrowingAdmin(PulsarAdmin):
    """The admin calls of a partition (model ``log``) that a producer appends to: the
    ``n``-th read of the ledgers sees the first ``seen[n]`` entries (the last count
    for every later read); each entry's index is the model's."""

    def __init__(self, log: Log, seen: list[int]) -> None:
        super().__init__("http://127.0.0.1:1")
        self.order = [(ledger, entry) for ledger, entries in log for entry in range(len(entries))]
        self.entries = model(log)
        self.seen = seen
        self.reads = 0

    def ledgers(self, topic: str, partition: int) -> list[tuple[int, int]]:
        shown = self.order[: self.seen[min(self.reads, len(self.seen) - 1)]]
        self.reads += 1
        counts: dict[int, int] = {}
        for ledger, _entry in shown:
            counts[ledger] = counts.get(ledger, 0) + 1
        return list(counts.items())

    def entry(self, topic: str, partition: int, ledger: int, entry: int) -> Entry:
        return self.entries[(ledger, entry)]


@settings(max_examples=300, deadline=None)
@given(log=logs, data=st.data())
def test_a_reader_starts_before_every_message_at_or_above_its_offset_while_the_log_grows(
    log: Log, data: st.DataObject
) -> None:
    """A reader opened at a position while a producer appends (a partition handed
    over, then written to) misses nothing: its start entry precedes every entry that
    holds an offset at or above the position, and it reads from the earliest only when
    the partition held no entry. (Two reads of the ledgers, one to search and one for
    the last entry, started readers past the entries appended between them: CI lost
    86 messages of a partition so.)"""
    pulsar: Any = require_module("pulsar")
    admin = GrowingAdmin(log, [])
    total = len(admin.order)
    first = data.draw(st.integers(0, total), label="entries at the first read")
    admin.seen = [first, *sorted(data.draw(st.lists(st.integers(first, total), max_size=3)))]
    messages = sum(sum(es) for _l, es in log)
    offset = data.draw(st.integers(0, messages + 2), label="offset")
    consumer = SimpleNamespace(admin=admin)
    mid, inclusive = PulsarConsumer._start_id(consumer, "t", 0, offset)  # type: ignore[arg-type]
    assert inclusive
    needed = [i for i, at in enumerate(admin.order) if admin.entries[at].index >= offset]
    if mid is pulsar.MessageId.earliest:
        assert first == 0, "read from the earliest though the partition held entries"
        return
    start = admin.order.index((mid.ledger_id(), mid.entry_id()))
    assert not needed or start <= needed[0], (
        f"starts at entry {start}, after entry {needed[0]} which holds offset {offset} or above"
    )


@pytest.mark.slow
def test_a_reader_started_at_a_located_offset_reads_on_from_it(
    pulsar_server: PulsarServer, topic_name: Callable[[], str]
) -> None:
    """The fetch cursor of a seek: a reader at ``locate(offset)``, inclusive, starts at
    that message even inside a batch, and the mapper numbers what follows."""
    pulsar: Any = require_module("pulsar")
    name = topic_name()
    topic = pulsar_server.create_partitioned_topic(name, 1)
    admin = PulsarAdmin(pulsar_server.admin_url)
    client = pulsar.Client(pulsar_server.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=5,
            batching_max_publish_delay_ms=20,
        )  # fmt: skip
        for i in range(20):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        for start in (0, 3, 7, 19):
            located = admin.locate(name, 0, start)
            assert located is not None
            ledger, entry, batch = located
            reader = client.create_reader(
                partition_topic(name, 0),
                pulsar.MessageId(ledger_id=ledger, entry_id=entry, batch_index=batch),
                start_message_id_inclusive=True,
            )
            mapper = OffsetMapper(lambda led, ent: admin.entry(name, 0, led, ent))
            got = []
            while reader.has_message_available():
                message = reader.read_next(5000)
                mid = message.message_id()
                offset = mapper.offset(mid.ledger_id(), mid.entry_id(), mid.batch_index())
                got.append((offset, message.data()))
            reader.close()
            assert got == [(o, f"m{o}".encode()) for o in range(start, 20)]
            assert mapper.lookups == 1
    finally:
        client.close()
