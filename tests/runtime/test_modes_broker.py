"""``htmqc run`` delivery modes against a real broker, across crashes.

They run on the bundled broker and on Apache Kafka (``[tansu]``/``[kafka]``, see
tests/conftest.py); the ones that take ``group_protocol`` also under KIP-848's
consumer protocol on Kafka (``[kafka-consumer]``).

* exactly-once into PostgreSQL across a SIGKILL mid-transaction;
* exactly-once Kafka->Kafka (``--sink kafka:OUT``) across a SIGKILL, and as a
  second consumer joins and leaves; the output is read ``read_committed``;
* at-least-once across a SIGKILL: nothing lost, and the duplicates are exactly
  the messages the killed process finished past the group's committed offsets.

The PostgreSQL tests use 127.0.0.1:5432, database ``test`` (started by
:func:`tests.services.postgres_url`), with tables of
a unique prefix per test, dropped afterwards. :func:`pg_tables` is shared with
``test_zombie_broker.py``.
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from htmqc.broker import Broker
from htmqc.produce import parse_id, produce
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    stored,
    wait_for,
)
from tests.services import postgres_url

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]

HANDLERS = "tests.runtime.handlers"


# -- PostgreSQL ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PgTables:
    """A PostgreSQL sink with its own table prefix, and its effects table
    ``(id, partition, offset, pid)`` written by :func:`handlers.table_record`."""

    base: str
    prefix: str

    @property
    def sink(self) -> str:
        """The ``--sink`` URL."""
        return f"{self.base}?table_prefix={self.prefix}"

    @property
    def effects(self) -> str:
        """The effects table (``$HTMQC_TEST_TABLE`` of the handlers)."""
        return f"{self.prefix}effects"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Run ``sql`` on a fresh autocommit connection (sees committed data only)."""
        import psycopg

        with psycopg.connect(self.base, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    def stored(self) -> int:
        """Sum of the committed positions (0 before the sink made its table)."""
        import psycopg

        try:
            rows = self.query(f"SELECT COALESCE(SUM(committed), 0) FROM {self.prefix}positions")
        except psycopg.errors.UndefinedTable:
            return 0
        return int(rows[0][0])

    def rows(self) -> list[tuple[int, int, int, int]]:
        """Every stored effect: ``(id, partition, offset, pid)``."""
        return [
            (int(i), int(p), int(o), int(pid))
            for i, p, o, pid in self.query(
                f'SELECT id, "partition", "offset", pid FROM {self.effects}'
            )
        ]


@contextmanager
def pg_tables() -> Iterator[PgTables]:
    """A :class:`PgTables` with its effects table created; all its tables are
    dropped on exit."""
    base = postgres_url()
    pg = PgTables(base, f"t{uuid.uuid4().hex[:10]}_")
    pg.query(
        f'CREATE TABLE {pg.effects} (id BIGINT NOT NULL, "partition" INTEGER NOT NULL, '
        '"offset" BIGINT NOT NULL, pid INTEGER NOT NULL)'
    )
    try:
        yield pg
    finally:
        pg.query(
            f"DROP TABLE IF EXISTS {pg.effects}, {pg.prefix}positions, {pg.prefix}dead_letters"
        )


@pytest.fixture
def pg() -> Iterator[PgTables]:
    """Fresh PostgreSQL tables for one test (see :func:`pg_tables`)."""
    with pg_tables() as tables:
        yield tables


# -- Kafka helpers ------------------------------------------------------------------------


def group_committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """Sum of ``group``'s committed offsets on ``topic`` (unset counts as 0)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        return sum(max(0, c.offset) for c in probe.committed(parts, timeout=10))
    finally:
        probe.close()


def read_ids(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float) -> list[int]:
    """The ids of every record a fresh ``read_committed`` reader gets from
    ``topic``: read until ``expect`` arrived (or ``timeout``), then 1.5 s more,
    so duplicates past ``expect`` are seen too."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    ids: list[int] = []
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(ids) >= expect:
                deadline = min(deadline, time.monotonic() + 1.5)
            for msg in reader.consume(1000, 0.2):
                if msg.error() is None:
                    ids.append(parse_id(msg.value() or b""))
        return ids
    finally:
        reader.close()


def audit_sigkill_restart(out1: Path, out2: Path, log2: Path, topic: str, n: int) -> None:
    """At-least-once across a SIGKILL, from the handler's output of the killed run
    (``out1``) and its successor's (``out2``, ``log2``) on a 4-partition ``topic`` of
    ``n`` messages killed after at least 1,500: nothing lost, each run without
    duplicates of its own, the successor resuming at the committed offsets, and
    exactly the killed run's finished-but-uncommitted window run twice."""

    def ids_of(path: Path) -> list[int]:
        return [int(line.split()[2]) for line in path.read_text().splitlines()]

    ids1, ids2 = ids_of(out1), ids_of(out2)
    assert len(set(ids1)) == len(ids1) and len(set(ids2)) == len(ids2)
    assert set(ids1) | set(ids2) == set(range(n)), "lost messages"
    starts = assigned_starts(log2, topic)
    assert sorted(starts) == [0, 1, 2, 3]
    resumed_at = sum(starts.values())
    assert 1500 <= resumed_at < n
    assert len(ids2) == n - resumed_at, "the successor did not start at the committed offsets"
    window = len(ids1) - resumed_at  # finished by the killed process, not committed
    assert len(set(ids1) & set(ids2)) == window, "a message ran twice outside the window"


def assigned_starts(log: Path, topic: str) -> dict[int, int]:
    """Partition -> the offset the run's first assignment of it started at
    (from the ``assigned TOPIC/P@OFFSET`` lines of the log)."""
    starts: dict[int, int] = {}
    pattern = re.compile(rf"{re.escape(topic)}/(\d+)@(\d+)")
    for line in log.read_text().splitlines():
        if "htmqc.runtime: assigned " in line:
            for part, offset in pattern.findall(line):
                starts.setdefault(int(part), int(offset))
    return starts


def kill(proc: Any) -> None:
    """SIGKILL ``proc`` and reap it."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def kill_left(*procs: Any) -> None:
    """SIGKILL each of ``procs`` that was started and still runs (stopped ones too)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            kill(proc)


# -- exactly-once into PostgreSQL ----------------------------------------------------------


@pytest.mark.parametrize("handler", ["table_record", "async_table_record"])
def test_exactly_once_into_postgresql_across_sigkill(
    broker: Broker, new_topic: Any, pg: PgTables, tmp_path: Path, group_protocol: str,
    handler: str,
) -> None:
    """``async_table_record`` is ``async def``: its ``tx`` is a ``psycopg.AsyncCursor``
    of the sink's ``AsyncConnection`` on the handler loop, in the same transaction."""
    topic, n = new_topic(partitions=4), 6000
    produce(broker.bootstrap, topic, n, keys=100)
    log = tmp_path / "run.log"
    args = [
        f"{HANDLERS}:{handler}",
        "--group",
        f"g-pgkill-{uuid.uuid4().hex[:6]}",
        "--mode",
        "exactly-once",
        "--sink",
        pg.sink,
        "--txn-messages",
        "300",
        "--group-protocol",
        group_protocol,
    ]
    env = {"HTMQC_TEST_TABLE": pg.effects}
    first = htmqc_run(broker.bootstrap, topic, *args, env=env, log=log)
    try:
        wait_for(lambda: pg.stored() >= 1500, 60, "the first transactions")
    finally:
        kill(first)  # mid-transaction: rows of an open transaction die with it
    at_kill = pg.stored()
    assert at_kill < n
    second = htmqc_run(broker.bootstrap, topic, *args, "--idle-exit", "2", env=env, log=log)
    assert finish(second, 90) == 0, log.read_text()[-2000:]
    rows = pg.rows()
    ids = Counter(r[0] for r in rows)
    assert sorted(ids) == list(range(n)), "lost effects"
    assert [i for i, c in ids.items() if c > 1] == [], "duplicated effects"
    by_pid = Counter(r[3] for r in rows)
    assert by_pid[first.pid] == at_kill, "the killed process's effects and positions disagree"
    assert by_pid[second.pid] == n - at_kill
    assert pg.stored() == n


# -- exactly-once Kafka->Kafka --------------------------------------------------------------


def kafka_args(out: str, group: str, *extra: str) -> list[str]:
    return [
        f"{HANDLERS}:slow_forward",
        "--group",
        group,
        "--mode",
        "exactly-once",
        "--sink",
        f"kafka:{out}",
        *extra,
    ]


def kafka_sigkill_scenario(
    bootstrap: str, new_topic: Any, tmp_path: Path, *, stall_nth: int, extra: tuple[str, ...] = ()
) -> None:
    """Run ``stalling_forward`` until it stalls at position ``stall_nth`` of a
    transaction (after earlier transactions committed), SIGKILL it there, run a
    successor to the end; the output must hold every input id exactly once."""
    topic, out, n = new_topic(partitions=4), new_topic(partitions=4, prefix="out"), 6000
    produce(bootstrap, topic, n, keys=100)
    group, log = f"g-kkill-{uuid.uuid4().hex[:6]}", tmp_path / "run.log"
    flag = tmp_path / "stall"
    marker = Path(f"{flag}.stalled")
    flag.touch()
    env = {
        "HTMQC_TEST_STALL": str(flag),
        # Past the first two transactions (300 messages each, ids spread over 4
        # partitions), so some are committed when the process is killed.
        "HTMQC_TEST_STALL_AT": "3000",
        "HTMQC_TEST_STALL_NTH": str(stall_nth),
    }
    # Transactions of 300 messages: the time bound must not end them first (the
    # handler runs off the poll thread, so a transaction ends on its own clock).
    args = [*kafka_args(out, group, "--txn-messages", "300", "--txn-ms", "60000", *extra)]
    args[0] = f"{HANDLERS}:stalling_forward"
    first = htmqc_run(bootstrap, topic, *args, env=env, log=log)
    try:
        wait_for(marker.exists, 60, "the first process to stall inside a transaction")
        time.sleep(0.5)  # output produced earlier in the transaction reaches the broker
    finally:
        kill(first)  # inside an open transaction
    flag.unlink()
    at_kill = group_committed(bootstrap, group, topic, 4)
    assert 0 < at_kill < n
    second = htmqc_run(bootstrap, topic, *args, "--idle-exit", "2", env=env, log=log)
    assert finish(second, 90) == 0, log.read_text()[-2000:]
    assert group_committed(bootstrap, group, topic, 4) == n, "the successor's commits stalled"
    ids = Counter(read_ids(bootstrap, out, 4, n, 30))
    assert sorted(ids) == list(range(n)), f"lost output: {n - len(ids)} ids missing"
    assert [i for i, c in ids.items() if c > 1] == [], "duplicated output"


def test_exactly_once_kafka_to_kafka_across_sigkill(
    broker: Broker, new_topic: Any, tmp_path: Path, group_protocol: str
) -> None:
    """Killed at the first message of a transaction: its work so far is lost
    with the process and redone by the successor; nothing of that transaction
    had reached the broker (see the test below for the other case)."""
    kafka_sigkill_scenario(
        broker.bootstrap,
        new_topic,
        tmp_path,
        stall_nth=0,
        extra=("--group-protocol", group_protocol),
    )


@pytest.mark.tansu_deviation(
    "Tansu 0.6 never ends a transaction whose producer died (no "
    "transaction.timeout.ms): with its records on the output partitions, the "
    "successor's transactions (another transactional.id) commit without error but "
    "neither their output nor their offsets ever become visible; Kafka aborts the "
    "dead transaction after transaction.timeout.ms",
)
def test_kafka_to_kafka_sigkill_with_an_open_transaction_on_the_broker(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    """Killed at message 250 of a transaction: an earlier piece of it is on the
    broker. A broker honouring the (here 5 s) transaction timeout aborts it."""
    kafka_sigkill_scenario(
        broker.bootstrap,
        new_topic,
        tmp_path,
        stall_nth=250,
        extra=("--kafka-config", "transaction.timeout.ms=5000"),
    )


def test_exactly_once_kafka_to_kafka_as_a_consumer_joins_and_leaves(
    broker: Broker, new_topic: Any, tmp_path: Path, group_protocol: str
) -> None:
    topic, out, n = new_topic(partitions=4), new_topic(partitions=4, prefix="out"), 12000
    produce(broker.bootstrap, topic, n, keys=100)
    group, log = f"g-krb-{uuid.uuid4().hex[:6]}", tmp_path / "run.log"
    args = kafka_args(out, group, "--txn-messages", "100", "--group-protocol", group_protocol)
    a = htmqc_run(broker.bootstrap, topic, *args, log=log)
    b = None
    try:
        wait_for(
            lambda: group_committed(broker.bootstrap, group, topic, 4) >= 500,
            60,
            "the first member's progress",
        )
        b = htmqc_run(broker.bootstrap, topic, *args, log=log)
        wait_for(
            lambda: log.read_text().count("INFO htmqc.runtime: assigned") >= 2,
            60,
            "the second member's assignment",
        )
        assert "revoked" in log.read_text()
        time.sleep(1.0)
        b.send_signal(signal.SIGTERM)  # leaves the group gracefully
        assert finish(b, 30) == 0
        # A gets B's partitions back and finishes everything (an idle exit could
        # race the rebalance after B left); then it is stopped.
        wait_for(
            lambda: group_committed(broker.bootstrap, group, topic, 4) >= n,
            120,
            "A to finish after B left",
        )
        a.send_signal(signal.SIGTERM)
        assert finish(a, 30) == 0, log.read_text()[-2000:]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                kill(proc)
    assert group_committed(broker.bootstrap, group, topic, 4) == n
    ids = Counter(read_ids(broker.bootstrap, out, 4, n, 30))
    assert sorted(ids) == list(range(n)), f"lost output: {n - len(ids)} ids missing"
    assert [i for i, c in ids.items() if c > 1] == [], "duplicated output"


# -- at-least-once --------------------------------------------------------------------------


def test_at_least_once_across_sigkill_loses_nothing(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    """Nothing is lost; the duplicates are exactly the messages the killed
    process finished beyond the group's committed offsets (its uncommitted
    window), which the successor, starting there, runs again."""
    topic, n = new_topic(partitions=4), 8000
    produce(broker.bootstrap, topic, n, keys=100)
    group = f"g-alokill-{uuid.uuid4().hex[:6]}"
    out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    args = [f"{HANDLERS}:log_order", "--group", group]
    first = htmqc_run(broker.bootstrap, topic, *args, env={"HTMQC_TEST_OUT": str(out1)}, log=log1)
    try:
        wait_for(
            lambda: group_committed(broker.bootstrap, group, topic, 4) >= 1500,
            60,
            "the first commits",
        )
    finally:
        kill(first)
    second = htmqc_run(
        broker.bootstrap,
        topic,
        *args,
        "--idle-exit",
        "2",
        env={"HTMQC_TEST_OUT": str(out2)},
        log=log2,
    )
    assert finish(second, 90) == 0, log2.read_text()[-2000:]
    audit_sigkill_restart(out1, out2, log2, topic, n)
    assert group_committed(broker.bootstrap, group, topic, 4) == n


@pytest.mark.tansu_deviation(
    "Tansu 0.6 serves an aborted transaction's records to read_committed "
    "readers: the dead transaction is fenced and aborted at once (all the successor's "
    "output is visible, unlike the case above), but its aborted records show up too; "
    "Kafka hides them",
)
def test_kafka_to_kafka_sigkill_with_a_stable_member_id_fences_the_dead_transaction(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    """The scenario above with ``--member-id``: the restarted member has the same
    transactional id, so ``init_transactions`` fences and aborts the dead
    transaction at once, on any broker, without waiting for a timeout."""
    kafka_sigkill_scenario(
        broker.bootstrap,
        new_topic,
        tmp_path,
        stall_nth=250,
        extra=("--member-id", f"m-{uuid.uuid4().hex[:6]}"),
    )


# -- KIP-848: --member-id under the consumer group protocol ---------------------------------


@pytest.mark.brokers("kafka")
def test_consumer_protocol_fences_a_new_member_with_a_member_id_in_use(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    """Under ``--group-protocol consumer`` a ``group.instance.id`` held by a live
    member fences the *new* member (the classic protocol fences the old one): the
    newcomer stops with one line and exit code 1, and the live member goes on to
    store every effect once."""
    topic, n = new_topic(partitions=4), 8000
    produce(broker.bootstrap, topic, n, keys=100)
    db, group, member = tmp_path / "eo.db", f"g-848-{uuid.uuid4().hex[:6]}", "m-1"
    args = [
        f"{HANDLERS}:slow_record",
        *exactly_once_args(db, group, "--txn-messages", "300"),
        "--group-protocol",
        "consumer",
        "--member-id",
        member,
    ]
    live_log, new_log = tmp_path / "live.log", tmp_path / "new.log"
    live = htmqc_run(broker.bootstrap, topic, *args, "--idle-exit", "2", log=live_log)
    try:
        wait_for(lambda: stored(db) >= 500, 60, "the live member's first transactions")
        newcomer = htmqc_run(broker.bootstrap, topic, *args, log=new_log)
        assert finish(newcomer, 60) == 1, new_log.read_text()[-2000:]
        assert finish(live, 120) == 0, live_log.read_text()[-2000:]
    finally:
        if live.poll() is None:
            kill(live)
    [line] = [x for x in new_log.read_text().splitlines() if x.startswith("htmqc: error:")]
    assert line == (
        f"htmqc: error: --member-id '{member}' is held by a live member of group '{group}'; "
        "under --group-protocol consumer the new member is fenced; give each live member its "
        "own --member-id; after a crash, start again once the broker's "
        "group.consumer.session.timeout.ms (45 s by default) has passed"
    )
    assert "Traceback" not in new_log.read_text()
    ids = effect_ids(db)
    assert sorted(ids) == list(range(n)), "lost or duplicated effects"
