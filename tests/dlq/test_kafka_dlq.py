"""``htmqc dlq`` on Kafka DLQ topics: list and show with filters, redrive exactly
once (partial, full, again; and a crash in the middle of a redrive)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.broker import Broker, create_topic
from htmqc.dlq.entries import Selection
from htmqc.dlq.kafka_source import KafkaDlq, redrive_group
from htmqc.kafka_defaults import producer_config
from htmqc.runtime.delivery import AtLeastOnce
from htmqc.sinks.kafka_positions import DEFAULT_POSITIONS_TOPIC
from tests.dlq.support import Msg, info, read_topic
from tests.dlq.test_sql_dlq import run

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]


def dead_letter_topic(broker: Broker, new_topic: Any, count: int = 6) -> str:
    """A 2-partition topic whose DLQs hold ``count`` dead letters: id i comes
    from partition i % 2, offset 10 + i; every 3rd is poison, odd ones ``app.Bad``."""
    topic = new_topic(partitions=2)
    for name in (f"{topic}.dlq", f"{topic}.dlq.poison"):
        create_topic(broker.bootstrap, name, 1)
    alo = AtLeastOnce(None, lambda: Producer(producer_config(broker.bootstrap)))
    for i in range(count):
        kind = "poison" if i % 3 == 2 else "failed"
        error = "app.Bad" if i % 2 else "builtins.ValueError"
        msg = Msg(topic, i % 2, 10 + i, f"k{i}".encode(), f"v{i}".encode(), [("h", b"%d" % i)])
        alo.dead_letter(topic, msg, info(kind, error, f"bad {i}", last=2000.0 + i))
    alo.close()
    return topic


def listing(capsys: pytest.CaptureFixture[str], bootstrap: str, topic: str, *flt: str) -> list[Any]:
    code, out, err = run(capsys, "list", "--bootstrap", bootstrap, "--topic", topic, "--json", *flt)
    assert code == 0, err
    return list(json.loads(out))


def test_list_and_show_with_filters(broker: Broker, new_topic: Any, capsys: Any) -> None:
    topic = dead_letter_topic(broker, new_topic)
    stray = Producer(producer_config(broker.bootstrap))
    stray.produce(f"{topic}.dlq", b"not a dead letter")
    assert stray.flush(10) == 0
    bs = broker.bootstrap

    def offsets(*flt: str) -> list[int]:
        return [e["offset"] for e in listing(capsys, bs, topic, *flt)]

    assert offsets() == [10, 11, 13, 14, 12, 15]  # T.dlq first, then T.dlq.poison
    assert offsets("--poison") == [12, 15]
    assert offsets("--kind", "poison") == [12, 15]
    assert offsets("--partition", "1") == [11, 13, 15]
    assert offsets("--offset-from", "12", "--offset-to", "14") == [13, 14, 12]
    assert offsets("--error-class", "Bad") == [11, 13, 15]
    assert offsets("--error-class", "builtins.ValueError", "--kind", "failed") == [10, 14]
    assert offsets("--since", "2003", "--until", "2004.5") == [13, 14]
    assert offsets("--limit", "2") == [10, 11]
    entries = listing(capsys, bs, topic)
    assert entries[0]["id"] == f"{topic}.dlq/0/0" and entries[-1]["id"] == f"{topic}.dlq.poison/0/1"
    assert [h["value"] for h in entries[0]["headers"]] == ["0"]
    code, out, err = run(capsys, "list", "--bootstrap", bs, "--topic", topic)
    assert code == 0 and len(out.splitlines()) == 7
    assert "1 records on the DLQ topics are not htmqc dead letters" in err

    for ident, expected in (
        (f"{topic}.dlq/0/3", f"{topic}/0/14"),
        ("0/2", f"{topic}/1/13"),
        ("1", f"{topic}/1/11"),
    ):
        code, out, err = run(capsys, "show", "--bootstrap", bs, "--topic", topic, ident)
        assert code == 0, err
        assert f"original:       {expected}" in out
    code, out, _ = run(
        capsys, "show", "--bootstrap", bs, "--topic", topic, "--poison", "1", "--json"
    )
    assert json.loads(out)["offset"] == 15 and json.loads(out)["kind"] == "poison"
    for bad, text in (
        ("5", "no dead letter at"),
        ("x/y", "malformed"),
        ("other/0/1", "not a dead"),
    ):
        code, _, err = run(capsys, "show", "--bootstrap", bs, "--topic", topic, bad)
        assert code == 2 and text in err and len(err.splitlines()) == 1, err


def test_redrive_partial_full_and_again(broker: Broker, new_topic: Any, capsys: Any) -> None:
    topic = dead_letter_topic(broker, new_topic)
    bs = broker.bootstrap
    code, out, err = run(
        capsys, "redrive", "--bootstrap", bs, "--topic", topic, "--error-class", "Bad"
    )
    assert code == 0, err
    assert out.splitlines()[-1].startswith("redrove 3 dead letters")
    assert [e["offset"] for e in listing(capsys, bs, topic, "--pending")] == [10, 14, 12]
    code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic)
    assert code == 0 and out.splitlines()[-1].startswith("redrove 3 dead letters"), err
    code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic)
    assert code == 0 and out.splitlines()[-1].startswith("redrove 0 dead letters"), err
    assert all(e["redriven"] for e in listing(capsys, bs, topic))

    records = read_topic(bs, topic, 2, 6)
    got = sorted(
        (m.value().decode(), m.partition(), m.key(), dict(m.headers())["htmqc-redrive-of"].decode())
        for m in records
    )
    dlq, poison = f"{topic}.dlq", f"{topic}.dlq.poison"
    assert got == [
        ("v0", 0, b"k0", f"{dlq}/0/0"),
        ("v1", 1, b"k1", f"{dlq}/0/1"),
        ("v2", 0, b"k2", f"{poison}/0/0"),
        ("v3", 1, b"k3", f"{dlq}/0/2"),
        ("v4", 0, b"k4", f"{dlq}/0/3"),
        ("v5", 1, b"k5", f"{poison}/0/1"),
    ]
    assert records[0].headers()[0][0] == "h", "the original headers come first"


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset of ``topic`` (every partition it has)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-ends"})
    try:
        meta = probe.list_topics(topic, timeout=10).topics[topic]
        return {p: probe.get_watermark_offsets(KafkaTP(topic, p), timeout=10)[1]
                for p in sorted(meta.partitions)}  # fmt: skip
    finally:
        probe.close()


def redrive_marks(bootstrap: str, topic: str) -> list[tuple[str, int, int, str]]:
    """The redrive group's committed positions (offset and metadata) on both DLQs."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": redrive_group(topic)})
    try:
        marks = reader.committed([KafkaTP(f"{topic}.dlq", 0), KafkaTP(f"{topic}.dlq.poison", 0)],
                                 timeout=10)  # fmt: skip
        return [(m.topic, m.partition, m.offset, m.metadata or "") for m in marks]
    finally:
        reader.close()


def dry_run(capsys: Any, bootstrap: str, topic: str, *flt: str) -> set[str]:
    """The ids ``redrive --dry-run`` lists (its table's first column), checked
    against its summary line."""
    code, out, err = run(capsys, "redrive", "--bootstrap", bootstrap, "--topic", topic,
                         "--dry-run", *flt)  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[0] == "id" and lines[-1].startswith("dry run: ")
    ids = {line.split()[0] for line in lines[1:-1]}
    assert lines[-1] == (f"dry run: {len(ids)} dead letters would be redriven to {topic}; "
                         "nothing was written")  # fmt: skip
    return ids


def test_redrive_dry_run_lists_exactly_what_the_redrive_writes_and_changes_nothing(
    broker: Broker, new_topic: Any, capsys: Any
) -> None:
    """After a partial redrive (marks below and above the committed offset), the dry
    run of a selection lists the entries the real redrive of that selection then
    writes, no more, no fewer; and the dry runs leave the redrive marks, the source
    topic and the positions topic as they were."""
    topic = dead_letter_topic(broker, new_topic, count=9)
    bs, dlq, poison = broker.bootstrap, f"{topic}.dlq", f"{topic}.dlq.poison"
    code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic,
                         "--error-class", "Bad")  # fmt: skip  (ids 1, 3, 5, 7)
    assert code == 0 and out.splitlines()[-1].startswith("redrove 4 dead letters"), err
    written = list(read_topic(bs, topic, 2, 4))
    assert len(written) == 4
    # dlq holds ids 0 1 3 4 6 7 (offsets 0-5), poison 2 5 8 (offsets 0-2)
    pending = {f"{dlq}/0/0", f"{dlq}/0/3", f"{dlq}/0/4", f"{poison}/0/0", f"{poison}/0/2"}
    marks, ends = redrive_marks(bs, topic), end_offsets(bs, topic)
    positions = end_offsets(bs, DEFAULT_POSITIONS_TOPIC)

    assert dry_run(capsys, bs, topic) == pending
    assert dry_run(capsys, bs, topic, "--error-class", "Bad") == set()
    partial = dry_run(capsys, bs, topic, "--partition", "0", "--offset-from", "12",
                      "--offset-to", "14")
    assert partial == {f"{dlq}/0/3", f"{poison}/0/0"}  # ids 4 (offset 14) and 2 (12)
    assert redrive_marks(bs, topic) == marks, "a dry run moved the redrive marks"
    assert end_offsets(bs, topic) == ends, "a dry run wrote to the source topic"
    assert end_offsets(bs, DEFAULT_POSITIONS_TOPIC) == positions, "a dry run wrote positions"

    def redrive(*flt: str, before: int) -> set[str]:
        """Redrive for real: the ids of the records it wrote back."""
        code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic, *flt)
        assert code == 0, err
        got = read_topic(bs, topic, 2, before)
        assert out.splitlines()[-1].startswith(f"redrove {len(got) - len(written)} dead")
        new = [m for m in got if m.value() not in {w.value() for w in written}]
        written.extend(new)
        return {dict(m.headers())["htmqc-redrive-of"].decode() for m in new}

    assert redrive("--partition", "0", "--offset-from", "12", "--offset-to", "14",
                   before=6) == partial
    rest = dry_run(capsys, bs, topic)
    assert rest == pending - partial
    assert redrive(before=9) == rest
    assert dry_run(capsys, bs, topic) == set()


def test_redrive_dry_run_fails_as_the_redrive_does_when_a_partition_is_gone(
    broker: Broker, new_topic: Any, capsys: Any
) -> None:
    """A dead letter from partition 3 of a topic that now has 2: the redrive cannot
    write it back, so the dry run does not list it as redrivable: both fail in one
    line naming the partition, and neither writes anything."""
    topic = dead_letter_topic(broker, new_topic, count=2)
    alo = AtLeastOnce(None, lambda: Producer(producer_config(broker.bootstrap)))
    alo.dead_letter(topic, Msg(topic, 3, 40, b"k", b"v", None), info())
    alo.close()
    bs, ends = broker.bootstrap, end_offsets(broker.bootstrap, topic)
    for extra in (["--dry-run"], []):
        code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic, *extra)
        assert code == 1 and f"cannot redrive to {topic}/3: no such partition" in err, out + err
        assert len(err.strip().splitlines()) == 1, err
    assert dry_run(capsys, bs, topic, "--partition", "1") == {f"{topic}.dlq/0/1"}
    assert end_offsets(bs, topic) == ends


class Crash(BaseException):
    """The redrive process dies (no abort, no cleanup of the transaction)."""


class DyingProducer:
    """Delegates to a real producer; at the ``die_at``-th commit the process
    "dies": the transaction's records, still in the client (a long linger),
    vanish with it, and the transaction stays open on the broker with the
    redrive marks already sent to it."""

    def __init__(self, real: Any, die_at: int) -> None:
        self.real, self.die_at, self.commits = real, die_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def commit_transaction(self, timeout: float) -> None:
        self.commits += 1
        if self.commits == self.die_at:
            self.real.purge(in_queue=True, in_flight=False)
            raise Crash()
        self.real.commit_transaction(timeout)


def test_a_crash_mid_redrive_neither_loses_nor_duplicates(
    broker: Broker, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The records of the dying transaction never reach the broker: the bundled
    # broker (Tansu) shows records of aborted transactions to read_committed
    # readers (tests/broker/test_produce.py pins that), which Kafka does not.
    topic = dead_letter_topic(broker, new_topic, count=9)
    real_producer = KafkaDlq._producer
    monkeypatch.setattr(
        KafkaDlq, "_producer", lambda self: DyingProducer(real_producer(self), die_at=2)
    )
    dying = KafkaDlq(
        broker.bootstrap,
        topic,
        timeout=15,
        kafka_config={"linger.ms": 20000, "message.timeout.ms": 50000},
    )
    with pytest.raises(Crash):
        dying.redrive(Selection(), chunk=2)
    monkeypatch.setattr(KafkaDlq, "_producer", real_producer)
    # The next redrive fences the dead one (its open transaction, with its marks,
    # is aborted) and writes exactly the entries whose transaction never committed.
    report = KafkaDlq(broker.bootstrap, topic, timeout=15).redrive(Selection(), chunk=2)
    assert report.redriven == 7
    assert KafkaDlq(broker.bootstrap, topic, timeout=15).redrive(Selection()).redriven == 0
    values = Counter(m.value() for m in read_topic(broker.bootstrap, topic, 2, 9))
    assert values == Counter(f"v{i}".encode() for i in range(9))


@pytest.mark.brokers("kafka")
def test_redrive_marks_beyond_the_metadata_limit_ride_in_the_positions_topic(
    broker: Broker, new_topic: Any, capsys: Any
) -> None:
    # A partial redrive leaves marks above its committed offset; with the broker's
    # limit given below their text, the commit goes without metadata and the marks
    # are read back from the positions topic: the full redrive then does the rest once.
    topic = dead_letter_topic(broker, new_topic, count=120)
    bs, dlq = broker.bootstrap, f"{topic}.dlq"
    code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic,
                         "--error-class", "Bad", "--commit-metadata-bytes", "64")  # fmt: skip
    assert code == 0 and out.splitlines()[-1].startswith("redrove 60 dead letters"), err
    reader = Consumer({"bootstrap.servers": bs, "group.id": redrive_group(topic)})
    try:
        [mark] = reader.committed([KafkaTP(dlq, 0)], timeout=10)
    finally:
        reader.close()
    assert mark.offset == 0 and not mark.metadata, "the marks' text is over 64 bytes"
    code, out, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic)
    assert code == 0 and out.splitlines()[-1].startswith("redrove 60 dead letters"), err
    values = Counter(m.value().decode() for m in read_topic(bs, topic, 2, 120))
    assert values == Counter(f"v{i}" for i in range(120))
    code, _, err = run(capsys, "redrive", "--bootstrap", bs, "--topic", topic,
                       "--commit-metadata-bytes", "10")  # fmt: skip
    assert code == 2 and "--commit-metadata-bytes must be at least 64" in err
