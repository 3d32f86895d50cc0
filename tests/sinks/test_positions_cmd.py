"""``htmqc positions show|reset|seek|skip`` on Kafka group offsets and on the
SQL positions tables (SQLite, PostgreSQL): what moves, what a dry run and a
refusal leave alone, the fence a move takes, and the offsets finished above a
position when it moves."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.api import Consumer as HtmqcConsumer
from htmqc.broker import Broker, create_topic
from htmqc.cli import main
from htmqc.kafka_cluster import KafkaCluster
from htmqc.sinks import Fenced
from htmqc.sinks.encoding import encode_finished, encode_metadata
from htmqc.sinks.kafka import KafkaSink
from htmqc.sinks.kafka_positions import ensure_topic, record_key, record_value
from htmqc.sinks.moves import Move, Request, Watermarks, carried_finished, plan, summary
from tests.runtime.test_run_broker import wait_for
from tests.sinks.conftest import GROUP, Backend, commit_of, write_effect
from tests.sinks.kafka_support import group_consumer

AnyBroker = Broker | KafkaCluster


# -- the rules, without a broker ---------------------------------------------------------


def test_finished_offsets_kept_moving_forward_cleared_moving_backward() -> None:
    # forward: the ones at or above the new position stay (their effects are stored)
    assert carried_finished(10, (12, 15, 20), 13) == (15, 20)
    assert carried_finished(10, (12, 15), 10) == (12, 15)
    # backward: all cleared, or the move would skip exactly those
    assert carried_finished(10, (12, 15), 5) == ()
    assert carried_finished(None, (), 5) == ()


def test_targets_and_bounds() -> None:
    marks = Watermarks(3, 10)
    assert plan(Request("earliest"), 0, 7, (), marks, force=False).after == 3
    assert plan(Request("latest"), 0, 7, (), marks, force=False).after == 10
    assert plan(Request("skip", 2), 0, 7, (9,), marks, force=False) == Move(0, 7, 9, (9,), (9,))
    assert plan(Request("skip", 5), 0, 7, (), marks, force=True).after == 12
    with pytest.raises(Exception, match="past its high watermark 10"):
        plan(Request("skip", 4), 0, 7, (), marks, force=False)
    with pytest.raises(Exception, match="below its low watermark 3"):
        plan(Request("offset", 2), 0, 7, (), marks, force=False)
    with pytest.raises(Exception, match="no stored position to skip from"):
        plan(Request("skip", 1), 0, None, (), marks, force=True)
    line = summary([Move(0, 10, 0, (12,), ()), Move(1, 5, 5)], "orders", "g", dry_run=False)
    assert line == "moved 1 partition of orders for group g: 0: 10->0 (cleared 1 finished above)" \
        "; 1 already there"  # fmt: skip


# -- helpers -----------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``htmqc positions ARGV``: exit code, stdout, stderr."""
    try:
        code = main(["positions", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def fill(bootstrap: str, topic: str, per_partition: int, partitions: int = 1) -> None:
    """``per_partition`` records on each partition, one produce request each (the
    bundled broker's high watermark lags inside a multi-record batch)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, value=f"id={i}".encode(), partition=p)
            assert producer.flush(10) == 0


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[int, dict[str, Any]]:
    code, out, err = cli(capsys, "show", "--json", *argv)
    assert code == 0, err
    return {row["partition"]: row for row in json.loads(out)}


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("htmqc: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- SQL positions ------------------------------------------------------------------------


@pytest.fixture
def sql_topic(tansu_broker: Broker) -> str:
    """A two-partition topic with 10 records on each."""
    topic = f"pos-{uuid.uuid4().hex[:8]}"
    create_topic(tansu_broker.bootstrap, topic, 2)
    fill(tansu_broker.bootstrap, topic, 10, partitions=2)
    return topic


def sql_args(broker: Broker, backend: Backend, topic: str) -> list[str]:
    return ["--bootstrap", broker.bootstrap, "--group", GROUP, "--topic", topic,
            "--sink", backend.url]  # fmt: skip


def store(backend: Backend, topic: str, positions: dict[int, tuple[int, tuple[int, ...]]]) -> None:
    """Commit ``positions`` (partition -> committed, finished above) as a member would."""
    sink = backend.sink()
    try:
        tps = [(topic, p) for p in positions]
        fences = sink.claim(tps, default_start=lambda tp: 0)
        txn = sink.begin()
        txn.commit([(commit_of((topic, p), c, f), fences[(topic, p)].fence)
                    for p, (c, f) in positions.items()])  # fmt: skip
    finally:
        sink.close()


def test_sql_show_seek_skip_reset(
    backend: Backend, tansu_broker: Broker, sql_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = sql_args(tansu_broker, backend, sql_topic)
    store(backend, sql_topic, {0: (6, (8, 9)), 1: (4, ())})
    rows = shown(capsys, *args)
    assert (rows[0]["position"], rows[0]["low"], rows[0]["high"]) == (6, 0, 10)
    assert rows[0]["finished_above"] == [8, 9] and rows[0]["lag"] == 2
    assert rows[0]["fence"] == 1 and rows[1]["lag"] == 6
    code, out, err = cli(capsys, "show", *args)
    assert code == 0 and "fence" in out and "8-9" in out, err

    # forward: keeps the finished offsets above the new position
    code, out, err = cli(capsys, "skip", "3", "--partition", "0", *args)
    assert code == 0, err
    assert out.strip() == f"moved 1 partition of {sql_topic} for group {GROUP}: 0: 6->9 " \
        "(1 finished above now covered)"  # fmt: skip
    assert backend.positions()[(sql_topic, 0)][:2] == (9, "0")  # 9 is still finished above
    # backward: clears them, or offset 9 would be skipped when 2.. runs again
    code, out, err = cli(capsys, "seek", "--to", "2", *args)
    assert code == 0, err
    assert out.strip() == f"moved 2 partitions of {sql_topic} for group {GROUP}: " \
        "0: 9->2 (cleared 1 finished above), 1: 4->2"  # fmt: skip
    positions = backend.positions()
    assert positions[(sql_topic, 0)][:2] == (2, "") and positions[(sql_topic, 1)][:2] == (2, "")
    code, out, err = cli(capsys, "reset", "--to", "latest", "--partition", "1", *args)
    assert code == 0 and out.strip().endswith("1: 2->10"), err
    code, out, err = cli(capsys, "reset", "--to", "earliest", *args)
    assert code == 0 and out.strip().endswith("0: 2->0, 1: 10->0"), (out, err)
    assert backend.positions()[(sql_topic, 1)][0] == 0
    assert shown(capsys, *args)[1]["lag"] == 10


def test_sql_dry_run_and_refusals_change_nothing(
    backend: Backend, tansu_broker: Broker, sql_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = sql_args(tansu_broker, backend, sql_topic)
    store(backend, sql_topic, {0: (3, (5,)), 1: (8, ())})
    before = backend.positions()
    for move in (["seek", "--to", "1"], ["reset", "--to", "latest"], ["skip", "2"]):
        code, out, err = cli(capsys, *move, "--dry-run", *args)
        assert code == 0, err
        assert out.startswith("dry run: would move 2 partitions") and "nothing was changed" in out
        assert backend.positions() == before  # fences included: no member was fenced
    # partition 0 could move 3 forward, partition 1 cannot (8 + 3 > 10): nothing moves
    code, out, err = cli(capsys, "skip", "3", *args)
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "partition 1 to 11, past its high watermark 10" in line and "--force" in line
    assert backend.positions() == before
    code, _, err = cli(capsys, "seek", "--to", "-1", *args)
    assert code == 2 and "below offset 0" in one_line_error(err)
    code, _, err = cli(capsys, "seek", "--to", "1", "--partition", "7", *args)
    assert code == 2 and "has no partition 7" in one_line_error(err)
    assert backend.positions() == before
    code, out, err = cli(capsys, "skip", "3", "--force", *args)
    assert code == 0 and out.strip().endswith("1: 8->11"), err


def test_sql_move_fences_a_running_member(
    backend: Backend, tansu_broker: Broker, sql_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member holding the old fence cannot store effects or a position after
    the seek: its commit is refused as a zombie's and the new position stands."""
    tp = (sql_topic, 0)
    seek = ["positions", "seek", "--to", "3", "--partition", "0",
            *sql_args(tansu_broker, backend, sql_topic)]  # fmt: skip
    member = backend.sink()
    try:
        fence = member.claim([tp], default_start=lambda _tp: 0)[tp].fence
        txn = member.begin()
        write_effect(txn, member, tp, 7)
        if backend.kind == "postgresql":
            # mid-transaction: the seek takes the row's fence before the member commits
            assert main(seek) == 0, capsys.readouterr()
            with pytest.raises(Fenced):
                txn.commit([(commit_of(tp, 8), fence)])
            assert backend.effects() == set()
        else:
            # SQLite: the member holds the file's write lock, so the seek waits for
            # its commit (which is still legal), then takes the fence
            codes: list[int] = []
            seeker = threading.Thread(target=lambda: codes.append(main(seek)))
            seeker.start()
            time.sleep(0.5)
            txn.commit([(commit_of(tp, 8), fence)])
            seeker.join(60)
            assert codes == [0], capsys.readouterr()
            assert backend.effects() == {(sql_topic, 0, 7)}
        assert backend.positions()[tp][0] == 3
        # the member's next transaction, with its old fence, is refused
        txn = member.begin()
        write_effect(txn, member, tp, 9)
        with pytest.raises(Fenced):
            txn.commit([(commit_of(tp, 10), fence)])
        assert (sql_topic, 0, 9) not in backend.effects()
        assert backend.positions()[tp][0] == 3
        # claiming again (what the runtime does after its fence grace) reads the new position
        assert member.claim([tp], default_start=lambda _tp: 0)[tp].committed == 3
    finally:
        member.close()


def test_seek_back_then_htmqc_run_reprocesses_from_there(
    backend: Backend, tansu_broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"pos-run-{uuid.uuid4().hex[:8]}"
    create_topic(tansu_broker.bootstrap, topic, 1)
    fill(tansu_broker.bootstrap, topic, 10)
    seen = f"{backend.prefix}seen"
    backend.query(f"CREATE TABLE {seen} (off INTEGER NOT NULL, run INTEGER NOT NULL)")
    for run in (1, 2):
        consume_once(tansu_broker, topic, backend, seen, run)
        if run == 1:
            assert backend.positions()[(topic, 0)][0] == 10
            args = sql_args(tansu_broker, backend, topic)
            code, out, err = cli(capsys, "seek", "--to", "4", *args)
            assert code == 0 and out.strip().endswith("0: 10->4"), err
    rows = backend.query(f"SELECT run, off FROM {seen} ORDER BY run, off")
    assert [off for run, off in rows if run == 1] == list(range(10))
    assert [off for run, off in rows if run == 2] == list(range(4, 10))


def consume_once(broker: Broker, topic: str, backend: Backend, table: str, run: int) -> None:
    """An exactly-once run of the runtime until idle: one row per message in ``table``."""
    consumer = HtmqcConsumer(
        bootstrap=broker.bootstrap, topic=topic, group=GROUP, mode="exactly-once",
        sink=backend.url, idle_exit=1.5,
    )  # fmt: skip

    @consumer.handler
    def handle(msg: Any, tx: Any) -> None:
        p = "?" if type(tx).__module__.startswith("sqlite3") else "%s"
        tx.execute(f"INSERT INTO {table} (off, run) VALUES ({p}, {p})", (msg.offset(), run))

    consumer.run()


def test_running_consumer_is_fenced_by_seek_and_resumes_from_the_new_position(
    backend: Backend, tansu_broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live ``htmqc`` member: its next commit after the seek is refused (the
    records it handled are rolled back, not stored over the new position); after
    its fence grace it claims the partition again and runs 4.. once more."""
    topic = f"pos-live-{uuid.uuid4().hex[:8]}"
    create_topic(tansu_broker.bootstrap, topic, 1)
    fill(tansu_broker.bootstrap, topic, 10)
    seen = f"{backend.prefix}seen"
    backend.query(f"CREATE TABLE {seen} (off INTEGER NOT NULL, run INTEGER NOT NULL)")
    consumer = HtmqcConsumer(
        bootstrap=tansu_broker.bootstrap, topic=topic, group=GROUP, mode="exactly-once",
        sink=backend.url, kafka_config={"session.timeout.ms": 6000},
    )  # fmt: skip

    @consumer.handler
    def handle(msg: Any, tx: Any) -> None:
        p = "?" if type(tx).__module__.startswith("sqlite3") else "%s"
        tx.execute(f"INSERT INTO {seen} (off, run) VALUES ({p}, 0)", (msg.offset(),))

    def offsets() -> list[int]:
        return sorted(int(r[0]) for r in backend.query(f"SELECT off FROM {seen}"))

    consumer.start()
    try:
        wait_for(lambda: len(offsets()) >= 10, 60, "the first ten records")
        wait_for(lambda: backend.positions()[(topic, 0)][0] == 10, 30, "position 10")
        code, out, err = cli(capsys, "seek", "--to", "4", *sql_args(tansu_broker, backend, topic))
        assert code == 0 and out.strip().endswith("0: 10->4"), err
        fill(tansu_broker.bootstrap, topic, 2)  # offsets 10, 11: the member's next commit
        wait_for(lambda: len(offsets()) >= 18, 90, "4..11 once more")
        time.sleep(1.0)
    finally:
        consumer.stop(30)
    assert offsets() == sorted([*range(10), *range(4, 12)])
    assert backend.positions()[(topic, 0)][0] == 12




# -- Kafka positions ---------------------------------------------------------------------


def kafka_commit(
    bootstrap: str,
    group: str,
    topic: str,
    positions_topic: str,
    positions: dict[int, tuple[int, tuple[int, ...]]],
) -> None:
    """Store ``positions`` as the Kafka->Kafka sink does: the committed offsets with
    the finished ones in the metadata, and a positions-topic record where any finished."""
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                          "enable.auto.commit": False})  # fmt: skip
    try:
        committer.commit(
            offsets=[KafkaTP(topic, p, c, metadata=encode_metadata(c, f))
                     for p, (c, f) in positions.items()],
            asynchronous=False,
        )  # fmt: skip
    finally:
        committer.close()
    records = {p: cf for p, cf in positions.items() if cf[1]}
    if records:
        ensure_topic(bootstrap, positions_topic, {}, 30)
        producer = Producer({"bootstrap.servers": bootstrap})
        for p, (c, f) in records.items():
            producer.produce(positions_topic, key=record_key(group, (topic, p)),
                             value=record_value(c, encode_finished(c, f)))  # fmt: skip
        assert producer.flush(10) == 0


@pytest.fixture
def kafka_case(broker: AnyBroker, new_topic: Any) -> Iterator[tuple[str, str, str, list[str]]]:
    """A two-partition topic with 10 records each, a group and a positions topic of
    this test; and the options naming them."""
    topic = new_topic(partitions=2)
    fill(broker.bootstrap, topic, 10, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    positions_topic = f"positions-{uuid.uuid4().hex[:8]}"
    yield topic, group, positions_topic, [
        "--bootstrap", broker.bootstrap, "--group", group, "--topic", topic,
        "--positions-topic", positions_topic,
    ]  # fmt: skip


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
def test_kafka_show_seek_skip_reset(
    broker: AnyBroker,
    kafka_case: tuple[str, str, str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, group, positions_topic, args = kafka_case
    kafka_commit(broker.bootstrap, group, topic, positions_topic, {0: (6, (8, 9)), 1: (4, ())})
    rows = shown(capsys, *args)
    assert (rows[0]["position"], rows[0]["low"], rows[0]["high"], rows[0]["lag"]) == (6, 0, 10, 2)
    # Kafka keeps the commit metadata; the bundled broker drops it (the positions topic has them)
    assert rows[0]["finished_above"] == [8, 9]
    assert rows[0]["source"] in {"metadata", "positions topic"}
    assert (rows[1]["position"], rows[1]["lag"]) == (4, 6)
    before = shown(capsys, *args)
    code, out, err = cli(capsys, "seek", "--to", "2", "--dry-run", *args)
    assert code == 0 and out.startswith("dry run: would move 2 partitions"), err
    assert shown(capsys, *args) == before

    code, out, err = cli(capsys, "seek", "--to", "2", *args)
    assert code == 0, err
    assert out.strip() == f"moved 2 partitions of {topic} for group {group}: " \
        "0: 6->2 (cleared 2 finished above), 1: 4->2"  # fmt: skip
    rows = shown(capsys, *args)
    assert (rows[0]["position"], rows[0]["finished_above"]) == (2, [])
    # The group runs 2..5 again and commits 6 with nothing finished above, as the sink
    # does (on a broker that drops metadata, the old record (6: 8, 9) must not count)
    kafka_commit(broker.bootstrap, group, topic, positions_topic, {0: (6, ())})
    assert shown(capsys, *args)[0]["finished_above"] == []
    sink = KafkaSink("unused", bootstrap=broker.bootstrap, positions_topic=positions_topic)
    sink.open(group)
    member = group_consumer(broker.bootstrap, group, topic)
    try:
        sink.bind(member)
        claimed = sink.claim([(topic, 0)], default_start=lambda tp: 0)[(topic, 0)]
        assert (claimed.committed, claimed.finished_above) == (6, ())
    finally:
        sink.close()
        member.close()

    code, out, err = cli(capsys, "skip", "1", "--partition", "0", *args)
    assert code == 0 and out.strip().endswith("0: 6->7"), err
    code, out, err = cli(capsys, "reset", "--to", "latest", "--partition", "1", *args)
    assert code == 0 and out.strip().endswith("1: 2->10"), err
    code, _, err = cli(capsys, "skip", "4", *args)  # 7+4 > 10: nothing moves
    assert code == 2 and "past its high watermark 10" in one_line_error(err)
    rows = shown(capsys, *args)
    assert (rows[0]["position"], rows[1]["position"]) == (7, 10)


def committed_metadata(bootstrap: str, group: str, topic: str) -> tuple[int, str]:
    """Partition 0's committed offset and metadata, as the broker keeps them."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = reader.committed([KafkaTP(topic, 0)], timeout=10)
        return tp.offset, tp.metadata or ""
    finally:
        reader.close()


@pytest.mark.broker
@pytest.mark.brokers("kafka")
def test_kafka_move_keeps_metadata_within_the_brokers_limit(
    broker: AnyBroker, new_topic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A move keeps the finished offsets above the new position; whether they ride in the
    # commit metadata is decided by the broker's limit the user gives, as the consumer's is.
    topic = new_topic(partitions=1)
    fill(broker.bootstrap, topic, 120)
    group, positions_topic = f"g-{uuid.uuid4().hex[:8]}", f"positions-{uuid.uuid4().hex[:8]}"
    args = ["--bootstrap", broker.bootstrap, "--group", group, "--topic", topic,
            "--positions-topic", positions_topic]  # fmt: skip
    finished = tuple(range(4, 120, 2))
    kafka_commit(broker.bootstrap, group, topic, positions_topic, {0: (2, finished)})
    text = encode_metadata(3, finished)
    assert 64 < len(text) < 4096

    code, out, err = cli(capsys, "skip", "1", "--commit-metadata-bytes", str(len(text) - 1), *args)
    assert code == 0 and out.strip().endswith("0: 2->3"), err
    assert committed_metadata(broker.bootstrap, group, topic) == (3, "")
    row = shown(capsys, *args)[0]
    assert (row["finished_above"], row["source"]) == (list(finished), "positions topic")

    code, out, err = cli(capsys, "skip", "2", "--commit-metadata-bytes", str(len(text)), *args)
    assert code == 0 and out.strip().endswith("0: 3->5 (1 finished above now covered)"), err
    kept = finished[1:]
    assert committed_metadata(broker.bootstrap, group, topic) == (5, encode_metadata(5, kept))
    assert shown(capsys, *args)[0]["source"] == "metadata"

    code, _, err = cli(capsys, "skip", "1", "--commit-metadata-bytes", "10", *args)
    assert code == 2 and "--commit-metadata-bytes must be at least 64" in one_line_error(err)


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
def test_kafka_move_refused_while_the_group_has_live_members(
    broker: AnyBroker,
    kafka_case: tuple[str, str, str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, group, positions_topic, args = kafka_case
    kafka_commit(broker.bootstrap, group, topic, positions_topic, {0: (5, ()), 1: (5, ())})
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                       "enable.auto.commit": False, "session.timeout.ms": 6000})  # fmt: skip
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment()
        code, out, err = cli(capsys, "seek", "--to", "0", *args)
        assert code == 2 and out == ""
        line = one_line_error(err)
        assert f"group {group!r} has live members" in line and "stop the group's" in line
        code, out, err = cli(capsys, "seek", "--to", "0", "--dry-run", *args)
        assert code == 2, out
        # --force skips htmqc's check; Kafka's own rule still refuses, in one line
        code, out, err = cli(capsys, "seek", "--to", "0", "--force", *args)
        assert code == 1 and "live members" in one_line_error(err)
        assert [r["position"] for r in shown(capsys, *args).values()] == [5, 5]
    finally:
        member.close()
    code, out, err = cli(capsys, "seek", "--to", "0", *args)
    assert code == 0 and out.strip().endswith("0: 5->0, 1: 5->0"), err


def test_bad_input_is_one_line_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--group", "g", "--topic", "t"]
    cases = [
        (["seek", "--to", "1", "--topic", "t", "--bootstrap", "127.0.0.1:1"], 2, "pass --group"),
        (["seek", "--to", "1", *base], 2, "pass --bootstrap"),
        (["skip", "1", *base, "--bootstrap", "b:1", "--sink", "mysql://x"], 2, "unknown sink URL"),
        (["show", *base, "--bootstrap", "b:1", "--sink", f"sqlite:///{tmp_path}/none.db"], 2,
         "no SQLite file"),
        (["show", *base, "--bootstrap", "127.0.0.1:1", "--timeout", "1"], 1,
         "check that the broker runs"),
        (["seek", "--to", "x", *base], 2, "invalid int value"),
    ]  # fmt: skip
    for argv, code, text in cases:
        got, out, err = cli(capsys, *argv)
        assert (got, out) == (code, ""), (argv, err)
        assert text in one_line_error(err), (argv, err)
