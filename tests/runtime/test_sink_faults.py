"""A sink whose database goes away is reconnected with backoff; the partitions
are claimed again and re-read from the stored positions; after
``--sink-retry-seconds`` the run stops with one line (issue 16, item 6).

SQLite here (a file locked by another process past the busy timeout, no
broker); PostgreSQL with ``pg_terminate_backend`` and a database that refuses
connections against the bundled broker.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from htmqc.broker import Broker
from htmqc.produce import produce
from htmqc.runtime import Engine, RunOptions
from htmqc.sinks.sqlite import SqliteSink
from tests.runtime.test_modes_broker import PgTables
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for
from tests.services import postgres_url

HANDLERS = "tests.runtime.handlers"


def test_a_locked_sqlite_file_is_waited_out_and_nothing_is_lost_or_doubled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from htmqc.testing import FakeConsumer

    db = tmp_path / "locked.db"
    sink = SqliteSink(db, busy_timeout=0.2)
    sink.open("g")
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE fx (id INTEGER)")
    n = 3000
    logs = {("t", p): [(b"k", f"{p * n + i}".encode()) for i in range(n)] for p in range(2)}
    consumer = FakeConsumer.from_logs(logs)
    locked = threading.Event()

    def lock_for_a_while() -> None:
        # Take the write lock as soon as the runtime's open transaction lets go
        # (trying faster than SQLite's own busy wait, which the runtime would win).
        other = sqlite3.connect(db, timeout=0, isolation_level=None)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                other.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError:
                time.sleep(0.0002)
        locked.set()
        time.sleep(1.5)
        other.execute("COMMIT")
        other.close()

    started = threading.Event()

    def handler(msg: Any, tx: Any) -> None:
        ident = int(msg.value())
        if started.is_set() and not locked.is_set():
            # Before the write: a transaction that has just been committed leaves
            # the lock free long enough for the other connection to take it, even
            # on a loaded machine (else the run might finish first).
            time.sleep(0.002)
        tx.execute("INSERT INTO fx (id) VALUES (?)", (ident,))
        if ident == 1000 and not started.is_set():
            started.set()
            threading.Thread(target=lock_for_a_while, daemon=True).start()
        time.sleep(0.0002)

    opts = RunOptions(
        bootstrap="f:1", topic="t", group="g", mode="exactly-once", sink=f"sqlite:///{db}",
        txn_messages=200, max_messages=2 * n, sink_retry_seconds=30,
    )
    engine = Engine(handler, opts, consumer, sink=sink)
    engine.run(install_signals=False)
    assert locked.is_set()
    assert "sink failed, reconnecting" in caplog.text and "database is locked" in caplog.text
    with sqlite3.connect(db) as conn:
        ids = Counter(r[0] for r in conn.execute("SELECT id FROM fx"))
        stored = conn.execute("SELECT SUM(committed) FROM htmqc_positions").fetchone()[0]
    assert sorted(ids) == list(range(2 * n)), "lost effects"
    assert max(ids.values()) == 1, "duplicated effects"
    assert stored == 2 * n


def test_sqlite_errors_that_mean_unavailable() -> None:
    from htmqc.sinks import SinkUnavailable

    sink = SqliteSink(":memory:")
    assert sink.unavailable(sqlite3.OperationalError("database is locked"))
    assert sink.unavailable(sqlite3.ProgrammingError("Cannot operate on a closed database."))
    assert not sink.unavailable(sqlite3.OperationalError("no such table: fx"))
    assert not sink.unavailable(sqlite3.IntegrityError("UNIQUE constraint failed"))
    failure = sink.failure("committing", sqlite3.OperationalError("database is locked"))
    assert isinstance(failure, SinkUnavailable) and "\n" not in failure.line()


# -- PostgreSQL, against the bundled broker ------------------------------------------------


def _terminate(base: str, app: str) -> int:
    """``pg_terminate_backend`` every connection named ``app``; how many there were."""
    import psycopg

    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        ).fetchall()
    return len(rows)


@pytest.fixture
def pg() -> Iterator[PgTables]:
    """Fresh PostgreSQL tables for one test."""
    from tests.runtime.test_modes_broker import pg_tables

    with pg_tables() as tables:
        yield tables


@pytest.mark.broker
@pytest.mark.parametrize("handler", ["table_record", "async_table_record"])
def test_postgresql_backend_terminated_twice_mid_run(
    broker: Broker, new_topic: Any, pg: PgTables, tmp_path: Path, handler: str
) -> None:
    """``async_table_record``: the sink reconnects with a new ``AsyncConnection``
    on the handler loop, and the handler gets that connection's cursor."""
    topic, n = new_topic(partitions=4), 6000
    produce(broker.bootstrap, topic, n, keys=100)
    app, log = f"htmqc-{uuid.uuid4().hex[:8]}", tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, f"{HANDLERS}:{handler}", "--group", f"g-{app}",
        "--mode", "exactly-once", "--sink", f"{pg.sink}&application_name={app}",
        "--txn-messages", "200", "--idle-exit", "3",
        env={"HTMQC_TEST_TABLE": pg.effects}, log=log,
    )
    try:
        for at_least in (1000, 3000):
            wait_for(lambda at=at_least: pg.stored() >= at, 60, f"{at_least} stored")
            assert _terminate(pg.base, app) >= 1, "no backend to terminate"
        assert finish(proc, 120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert text.count("sink failed, reconnecting") >= 2, text[-3000:]
    assert "Traceback" not in text
    ids = Counter(r[0] for r in pg.rows())
    assert sorted(ids) == list(range(n)), "lost effects"
    assert [i for i, c in ids.items() if c > 1] == [], "duplicated effects"
    assert pg.stored() == n


@contextmanager
def own_database() -> Iterator[str]:
    """A PostgreSQL database of this test only (so it can refuse connections
    without disturbing anyone else's); its URL. Dropped on exit."""
    import psycopg

    base = postgres_url()
    name = f"htmqc_fault_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")  # type: ignore[arg-type]
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            conn.execute(f"DROP DATABASE IF EXISTS {name}")  # type: ignore[arg-type]


@pytest.mark.broker
def test_a_database_that_stays_away_stops_the_run_with_one_line(
    broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    import psycopg

    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, 100_000, keys=100)
    log = tmp_path / "run.log"
    with own_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute('CREATE TABLE fx (id BIGINT, "partition" INT, "offset" BIGINT, pid INT)')
        name = url.rsplit("/", 1)[1]
        proc = htmqc_run(
            broker.bootstrap, topic, f"{HANDLERS}:table_record", "--group", f"g-{name}",
            "--mode", "exactly-once", "--sink", url, "--sink-retry-seconds", "3",
            env={"HTMQC_TEST_TABLE": "fx"}, log=log,
        )
        try:
            def stored() -> int:
                with psycopg.connect(url, autocommit=True) as c:
                    try:
                        return int(c.execute(
                            "SELECT COALESCE(SUM(committed), 0) FROM htmqc_positions"
                        ).fetchone()[0])  # type: ignore[index]
                    except psycopg.errors.UndefinedTable:
                        return 0

            wait_for(lambda: stored() >= 500, 60, "the first transactions")
            base = postgres_url()
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")  # type: ignore[arg-type]
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
            gone = time.monotonic()
            code = finish(proc, 60)
            took = time.monotonic() - gone
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    text = log.read_text()
    assert code == 1, text[-2000:]
    assert took < 3 + 10, f"gave up after {took:.1f} s"
    assert "Traceback" not in text, text[-3000:]
    last = [line for line in text.splitlines() if line.startswith("htmqc: error:")]
    assert len(last) == 1, text[-2000:]
    assert "stayed unavailable for 3 s" in last[0] and "--sink-retry-seconds" in last[0]
