"""Lag the standard tools see (issue 19, item 2): exactly-once into a database
also commits each stored watermark to the consumer group's offsets.

What is checked:

* against a broker (the bundled one and Apache Kafka), with the group's
  offsets read the way ``kafka-consumer-groups``, Burrow and KEDA read them
  (``AdminClient.list_consumer_group_offsets``):
  - (a) after an exactly-once run into SQLite, every partition's lag (high
    watermark minus the group's committed offset) is 0, and the committed offset
    is the position the database stored: for a run that ends idle after many
    transactions, and for one whose only transaction the shutdown commits (its
    lag commit lands before the consumer closes); on Kafka under both group
    protocols;
  - (b) the group's offsets are never read back: set ahead on one partition and
    behind on the other before a run (of a fresh database, then of one that has
    positions), the run resumes from the database's positions, each message's
    effect is stored once, none is lost;
  - (c) ``--no-kafka-lag-commits`` leaves the group's offsets unset;
  - Tansu 0.6 lists a wrong high watermark (a ``tansu_deviation``), so there the
    log end is read through instead;
* against a fake consumer (no broker): the value is the core's committed
  watermark (equal to the database's position), a commit librdkafka refuses or
  reports failed is counted and logged once without stopping the run, and a
  ``kafka:`` sink (which commits the offsets in its transactions) gets no
  second commit; the option's flag, variable and keyword.

Each was seen failing with its feature broken: lag commits off (a, b's last
check, the fake's value test), the option ignored (c, the fake's off test),
positions taken from the group's offsets on assignment (b, both halves), a
value not the core's (+1), failures not counted or raising.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from examples.effects import record

from htmqc.broker import Broker
from htmqc.core import Commit
from htmqc.kafka_cluster import KafkaCluster
from htmqc.observe import Metrics
from htmqc.produce import produce
from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import open_sink
from htmqc.sinks.kafka import KafkaSink
from htmqc.testing import FakeConsumer
from tests.runtime.test_run_broker import effect_ids, exactly_once_args, finish, htmqc_run

TOPIC = "lag"
#: librdkafka's "no offset" (the group has none committed).
OFFSET_INVALID = -1001
TpOffsets = dict[tuple[str, int], int]


# -- reading the group the way the lag tools do --------------------------------------------


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """``group``'s committed offset of each partition of ``topic`` (-1001: none),
    through the admin API (OffsetFetch), as ``kafka-consumer-groups`` reads it."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    request = ConsumerGroupTopicPartitions(
        group, [KafkaTP(topic, p) for p in range(partitions)]
    )
    result = admin.list_consumer_group_offsets([request], request_timeout=30)[group].result(30)
    return {tp.partition: int(tp.offset) for tp in result.topic_partitions}


def set_group_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` (partition -> offset) to ``group`` from outside it, as an
    operator's ``kafka-consumer-groups --reset-offsets`` would (the group is empty)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    request = ConsumerGroupTopicPartitions(
        group, [KafkaTP(topic, p, o) for p, o in sorted(offsets.items())]
    )
    admin.alter_consumer_group_offsets([request], request_timeout=30)[group].result(30)
    assert group_offsets(bootstrap, group, topic, max(offsets) + 1) == offsets


def listed_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark as the broker lists it (ListOffsets latest:
    what ``kafka-consumer-groups`` subtracts the committed offset from)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "lag-probe", "log_level": 0})
    try:
        return {
            p: int(probe.get_watermark_offsets(KafkaTP(topic, p), timeout=10)[1])
            for p in range(partitions)
        }
    finally:
        probe.close()


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's log end: one past the last record, read through (Tansu 0.6
    lists the last batch's base offset + 1 instead: see
    :func:`test_listed_high_watermark_is_the_log_end`); on Kafka the same as
    :func:`listed_ends`, which is asserted."""
    listed = listed_ends(bootstrap, topic, partitions)
    probe = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "lag-probe", "log_level": 0,
        "enable.auto.commit": False, "isolation.level": "read_uncommitted",
    })  # fmt: skip
    ends = dict.fromkeys(range(partitions), 0)
    try:
        probe.assign([KafkaTP(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = probe.consume(500, 1.0)
            for msg in batch:
                if msg.error() is None:
                    ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)
            if not batch and all(ends[p] >= listed[p] for p in range(partitions)):
                break
    finally:
        probe.close()
    return ends


def db_positions(db: Path, topic: str) -> dict[int, int]:
    """The positions the SQLite sink stored for ``topic``."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            'SELECT "partition", committed FROM htmqc_positions WHERE topic = ?', (topic,)
        ).fetchall()
    return {int(p): int(c) for p, c in rows}


#: ``htmqc run`` stops once the topic was idle for 2 s, after many transactions.
IDLE_EXIT = ("--idle-exit", "2", "--txn-messages", "50")


def run_eo(
    broker: Broker | KafkaCluster,
    topic: str,
    db: Path,
    group: str,
    log: Path,
    *extra: str,
    until: tuple[str, ...] = IDLE_EXIT,
) -> None:
    """One ``htmqc run`` exactly-once into SQLite (by default until the topic is
    idle for 2 s)."""
    proc = htmqc_run(
        broker.bootstrap,
        topic,
        "examples.effects:record",
        *exactly_once_args(db, group, *until, *extra),
        log=log,
    )
    assert finish(proc, 120) == 0, log.read_text()[-3000:]


def wait_lag_zero(
    bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 20
) -> tuple[dict[int, int], dict[int, int]]:
    """The group's offsets and the high watermarks, once they are equal (lag 0)
    or when ``timeout`` passed: a broker may show a commit a moment after the ack."""
    deadline = time.monotonic() + timeout
    while True:
        high = high_watermarks(bootstrap, topic, partitions)
        committed = group_offsets(bootstrap, group, topic, partitions)
        if committed == high or time.monotonic() > deadline:
            return committed, high
        time.sleep(0.2)


# -- against a broker ----------------------------------------------------------------------


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
@pytest.mark.parametrize("ending", ["idle", "stop"])
def test_lag_is_zero_once_everything_is_stored(
    broker: Broker | KafkaCluster,
    broker_kind: str,
    group_protocol: str,
    new_topic: Any,
    tmp_path: Path,
    ending: str,
) -> None:
    """(a) The lag tools' arithmetic, high watermark minus the group's committed
    offset, gives 0 after the run; and each committed offset is the database's.
    ``idle``: many transactions, the run ends idle; ``stop``: one transaction,
    committed by the shutdown (``--max-messages``), whose lag commit must land
    before the consumer closes. On Kafka the high watermark is the one the broker
    lists (ListOffsets, what the tools read); Tansu lists a wrong one
    (:func:`test_listed_high_watermark_is_the_log_end`). On Kafka under both
    group protocols (classic, KIP-848's consumer)."""
    partitions = 3
    topic = new_topic(partitions=partitions)
    produce(broker.bootstrap, topic, 1200, keys=50)
    db, log, group = tmp_path / "eo.db", tmp_path / "run.log", f"lag-{topic}"
    one_at_shutdown = ("--max-messages", "1200", "--txn-ms", "600000", "--txn-messages", "100000")
    run_eo(
        broker, topic, db, group, log, "--group-protocol", group_protocol,
        until=IDLE_EXIT if ending == "idle" else one_at_shutdown,
    )  # fmt: skip
    assert sorted(effect_ids(db)) == list(range(1200))
    committed, high = wait_lag_zero(broker.bootstrap, group, topic, partitions)
    lag = {p: high[p] - committed[p] for p in range(partitions)}
    assert all(committed[p] >= 0 for p in range(partitions)), f"no group offsets: {committed}"
    assert lag == dict.fromkeys(range(partitions), 0), (committed, high)
    assert committed == db_positions(db, topic)
    if broker_kind != "tansu":
        assert listed_ends(broker.bootstrap, topic, partitions) == high


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
def test_the_database_position_wins_over_a_wrong_group_offset(
    broker: Broker | KafkaCluster, new_topic: Any, tmp_path: Path
) -> None:
    """(b) The group's offsets are a copy for lag tools, never read back: set ahead
    on one partition (read back, it would lose messages) and behind on the other
    (it would run stored messages again), the runs still resume from the
    database; every message's effect is stored exactly once."""
    topic = new_topic(partitions=2)
    bootstrap = broker.bootstrap
    db, log, group = tmp_path / "eo.db", tmp_path / "run.log", f"lag-{topic}"
    produce(bootstrap, topic, 400, keys=20)
    high = high_watermarks(bootstrap, topic, 2)
    # A database that never saw the topic: it starts at the log start, not at the
    # group's offsets (partition 0 "done", partition 1 half way).
    set_group_offsets(bootstrap, group, topic, {0: high[0], 1: high[1] // 2})
    run_eo(broker, topic, db, group, log)
    assert sorted(effect_ids(db)) == list(range(400)), "messages lost to the group's offsets"
    assert db_positions(db, topic) == high
    # More messages; the group's offsets are rewound on partition 0 and moved to the
    # new end on partition 1. The database's positions (the old ends) win.
    produce(bootstrap, topic, 400, keys=20, start_id=400)
    new_high = high_watermarks(bootstrap, topic, 2)
    assert all(new_high[p] > high[p] for p in range(2))
    set_group_offsets(bootstrap, group, topic, {0: 0, 1: new_high[1]})
    run_eo(broker, topic, db, group, log)
    ids = effect_ids(db)
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"{len(twice)} messages stored twice (the group's offset was read)"
    assert sorted(ids) == list(range(800)), "messages lost (the group's offset was read)"
    assert db_positions(db, topic) == new_high
    committed, high_now = wait_lag_zero(bootstrap, group, topic, 2)
    assert committed == high_now == new_high, "the lag commits did not overwrite the wrong ones"


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
def test_no_kafka_lag_commits_leaves_the_group_offsets_unset(
    broker: Broker | KafkaCluster, new_topic: Any, tmp_path: Path
) -> None:
    """(c) ``--no-kafka-lag-commits``: the database holds the positions, the group none."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 300, keys=20)
    db, log, group = tmp_path / "eo.db", tmp_path / "run.log", f"lag-{topic}"
    run_eo(broker, topic, db, group, log, "--no-kafka-lag-commits")
    assert sorted(effect_ids(db)) == list(range(300))
    assert db_positions(db, topic) == high_watermarks(broker.bootstrap, topic, 2)
    time.sleep(1)  # an asynchronous commit, had one been sent, would show by now
    unset = dict.fromkeys(range(2), OFFSET_INVALID)
    assert group_offsets(broker.bootstrap, group, topic, 2) == unset


@pytest.mark.broker
@pytest.mark.tansu_deviation(
    "lists the last record batch's base offset + 1 as a partition's high watermark, "
    "so lag tools see a wrong lag whatever is committed"
)
def test_listed_high_watermark_is_the_log_end(
    broker: Broker | KafkaCluster, new_topic: Any
) -> None:
    """The high watermark lag tools read (ListOffsets latest) is the log end."""
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 300, keys=20)
    assert listed_ends(broker.bootstrap, topic, 1) == {0: 300}


# -- against a fake consumer ---------------------------------------------------------------


def _consumer(partitions: int, count: int) -> FakeConsumer:
    """``count`` records on each of ``partitions`` partitions, with the numbered
    values ``examples.effects:record`` parses (ids unique across partitions)."""
    return FakeConsumer.from_logs({
        (TOPIC, p): [(f"k{i % 7}".encode(), f"{p * count + i:012d}".encode())
                     for i in range(count)]
        for p in range(partitions)
    })  # fmt: skip


def _engine(
    db: Path,
    consumer: FakeConsumer,
    *,
    metrics: Metrics | None = None,
    **options: Any,
) -> Engine:
    sink = open_sink(f"sqlite:///{db}")
    sink.open("g")
    opts = RunOptions(
        bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=f"sqlite:///{db}",
        txn_messages=40, **options,
    )  # fmt: skip
    engine = Engine(record, opts, consumer, sink=sink, metrics=metrics)
    consumer.on_commit = engine.on_commit
    return engine


def _sqlite_positions(db: Path) -> TpOffsets:
    with sqlite3.connect(db) as conn:
        rows = conn.execute('SELECT topic, "partition", committed FROM htmqc_positions')
        return {(t, int(p)): int(c) for t, p, c in rows}


def test_each_commit_is_a_watermark_the_core_acked_after_the_database_commit(
    tmp_path: Path,
) -> None:
    """The values come from the core: each Kafka commit is a watermark the database
    had stored when it was sent (never ahead of it), rising, ending at the end."""
    db = tmp_path / "eo.db"
    consumer = _consumer(2, 300)
    engine = _engine(db, consumer, max_messages=600)
    stored_when_sent: list[tuple[TpOffsets, TpOffsets]] = []
    commit = consumer.commit

    def spy(offsets: list[KafkaTP] | None = None, asynchronous: bool = True) -> Any:
        sent = {(p.topic, p.partition): p.offset for p in offsets or []}
        stored_when_sent.append((sent, _sqlite_positions(db)))
        return commit(offsets=offsets, asynchronous=asynchronous)

    consumer.commit = spy  # type: ignore[method-assign]
    assert engine.run(install_signals=False) == 600
    assert stored_when_sent, "nothing was committed to the group"
    last: TpOffsets = {}
    for sent, stored in stored_when_sent:
        for tp, offset in sent.items():
            assert offset == stored[tp], "a Kafka commit is not what the database holds"
            assert offset > last.get(tp, -1), "a watermark committed twice or backwards"
            last[tp] = offset
    assert {tp: c[0] for tp, c in consumer.commits.items()} == _sqlite_positions(db) == {
        (TOPIC, 0): 300, (TOPIC, 1): 300,
    }
    assert engine.alo.lag_commits >= 2 and engine.alo.lag_failures == 0


def test_lag_commits_are_at_most_one_per_commit_interval_and_the_last_is_never_left(
    tmp_path: Path,
) -> None:
    """With ``--commit-ms`` 0 each database commit is copied (a Kafka commit per
    transaction); with an hour, only the first and the shutdown's, which carries
    the last watermarks: the group's offsets end at the database's positions
    either way. Copying per transaction regardless, or not at the shutdown,
    fails it."""
    calls: dict[float, int] = {}
    for commit_ms in (0.0, 3_600_000.0):
        db = tmp_path / f"eo-{commit_ms:g}.db"
        consumer = _consumer(2, 300)
        engine = _engine(db, consumer, max_messages=600, commit_ms=commit_ms)
        assert engine.run(install_signals=False) == 600
        calls[commit_ms] = len(consumer.commit_calls)
        assert {tp: c[0] for tp, c in consumer.commits.items()} == _sqlite_positions(db) == {
            (TOPIC, 0): 300, (TOPIC, 1): 300,
        }
    assert calls[0.0] >= 600 // 40, "not a lag commit per transaction without a bound"
    assert calls[3_600_000.0] == 2, "the lag commits are not bounded by --commit-ms"


def test_a_watermark_of_a_partition_no_longer_held_under_its_epoch_is_never_copied(
    tmp_path: Path,
) -> None:
    """A lag copy waits up to ``--commit-ms``; a partition lost or revoked (and
    maybe assigned again, under a new epoch) meanwhile is not ours to copy: the
    next owner's copy may already be there, and ours would move the group's
    offset backwards. Copying every waiting watermark fails it."""
    consumer = _consumer(2, 10)
    engine = _engine(tmp_path / "eo.db", consumer, max_messages=20)
    held = engine.core.assign((TOPIC, 0), 0)  # the core holds partition 0 only
    assert engine.eo is not None
    engine.eo._lag_due = {
        (TOPIC, 0): Commit(tp=(TOPIC, 0), epoch=held + 1, offset=7),  # an older assignment's
        (TOPIC, 1): Commit(tp=(TOPIC, 1), epoch=held, offset=5),  # not held
    }
    engine.eo.copy_lag(0.0, force=True)
    assert consumer.commit_calls == [] and engine.eo._lag_due == {}
    engine.eo._lag_due = {(TOPIC, 0): Commit(tp=(TOPIC, 0), epoch=held, offset=7)}
    engine.eo.copy_lag(0.0, force=True)
    assert consumer.commit_calls == [{(TOPIC, 0): 7}]


def test_off_commits_nothing_to_the_group(tmp_path: Path) -> None:
    consumer = _consumer(2, 100)
    engine = _engine(tmp_path / "eo.db", consumer, max_messages=200, kafka_lag_commits=False)
    assert engine.run(install_signals=False) == 200
    assert consumer.commit_calls == [] and consumer.commits == {}
    assert _sqlite_positions(tmp_path / "eo.db") == {(TOPIC, 0): 100, (TOPIC, 1): 100}


def test_a_failing_lag_commit_is_counted_logged_once_and_never_stops_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka refuses every commit at once: the run still stores everything,
    the failures are counted (engine and metric), and one line is logged."""
    db = tmp_path / "eo.db"
    consumer = _consumer(2, 200)
    metrics = Metrics()
    # A lag commit per transaction (no --commit-ms bound): many failures, one line.
    engine = _engine(db, consumer, metrics=metrics, max_messages=400, commit_ms=0)

    def refuse(offsets: list[KafkaTP] | None = None, asynchronous: bool = True) -> Any:
        raise KafkaException(KafkaError(KafkaError._STATE, "coordinator unknown"))

    consumer.commit = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="htmqc.runtime"):
        assert engine.run(install_signals=False) == 400
    assert _sqlite_positions(db) == {(TOPIC, 0): 200, (TOPIC, 1): 200}
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0] == 400
    failures = engine.alo.lag_failures
    assert failures >= 4 and engine.alo.lag_commits == 0
    lines = [r for r in caplog.records if "for lag tools only" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    exposed = metrics.exposition().decode()
    assert f"htmqc_kafka_lag_commit_failures_total {float(failures)}" in exposed


def test_a_lag_commit_the_broker_rejects_is_counted_not_told_to_the_core(
    tmp_path: Path,
) -> None:
    """An error in ``on_commit`` (the broker refused the commit) is counted; the
    core is not told (no ``commit_failed``: the database holds the position)."""
    db = tmp_path / "eo.db"
    consumer = _consumer(1, 100)
    engine = _engine(db, consumer, max_messages=100, commit_ms=0)  # a copy per transaction
    on_commit = engine.on_commit

    calls, delivered = [0], [0]

    def rejected(err: Any, partitions: list[Any]) -> None:
        """Every other callback fails whole (``err``), the others per partition."""
        calls[0] += 1
        delivered[0] += len(partitions)
        if calls[0] % 2:
            on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), partitions)
            return
        error = KafkaError(KafkaError.ILLEGAL_GENERATION)
        on_commit(None, [SimpleNamespace(topic=p.topic, partition=p.partition,
                                         offset=p.offset, error=error) for p in partitions])

    consumer.on_commit = rejected
    told: list[Any] = []
    failed = engine.core.commit_failed
    engine.core.commit_failed = lambda *a: told.append(a) or failed(*a)  # type: ignore[method-assign]
    assert engine.run(install_signals=False) == 100
    # Each rejected partition counted (the last commit's outcome may come after close).
    assert engine.alo.lag_failures == delivered[0] >= 2 and calls[0] >= 2
    assert told == []
    assert _sqlite_positions(db) == {(TOPIC, 0): 100}


def test_a_kafka_sink_gets_no_second_commit(tmp_path: Path) -> None:
    """Kafka->Kafka commits the offsets inside its transactions: left alone."""
    sink = KafkaSink("out", bootstrap="127.0.0.1:1")
    assert sink.commits_group_offsets
    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once",
                      sink="kafka:out")  # fmt: skip
    engine = Engine(record, opts, FakeConsumer([]), sink=sink)
    assert engine.eo is not None and engine.eo.lag is None
    sql = open_sink(f"sqlite:///{tmp_path / 'eo.db'}")
    assert not sql.commits_group_offsets


def test_the_option_is_on_by_default_and_off_by_flag_environment_or_keyword(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--kafka-lag-commits/--no-kafka-lag-commits``, ``HTMQC_KAFKA_LAG_COMMITS``,
    ``kafka_lag_commits=``; the help says what it does."""
    import argparse

    from htmqc import config
    from htmqc.api import Consumer as ApiConsumer
    from htmqc.cli import run_cmd

    top = argparse.ArgumentParser()
    run_cmd.register(top.add_subparsers())
    base = ["run", "m:f", "--bootstrap", "b:1", "--topic", "t", "--group", "g"]

    def resolved(argv: list[str], environ: dict[str, str] | None = None) -> RunOptions:
        args = vars(top.parse_args([*base, *argv]))
        cli = {k: v for k, v in args.items()
               if k not in {"kafka_config", "config", "func", "log_level", "handler"}}
        return config.resolve(cli, {}, environ=environ or {})

    assert resolved([]).kafka_lag_commits is True
    assert resolved(["--no-kafka-lag-commits"]).kafka_lag_commits is False
    assert resolved(["--kafka-lag-commits"], {"HTMQC_KAFKA_LAG_COMMITS": "false"}).kafka_lag_commits
    assert resolved([], {"HTMQC_KAFKA_LAG_COMMITS": "false"}).kafka_lag_commits is False
    options = dict(bootstrap="b:1", topic="t", group="g", mode="exactly-once", sink="sqlite:///x")
    assert ApiConsumer(**options, kafka_lag_commits=False).options.kafka_lag_commits is False
    with pytest.raises(SystemExit):
        top.parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--kafka-lag-commits, --no-kafka-lag-commits" in text
    assert "never read back" in text
