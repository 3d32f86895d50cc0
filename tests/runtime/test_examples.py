"""The example applications, run as a user would: ``python -m examples.payments`` into
SQLite and PostgreSQL across a SIGKILL, ``htmqc run examples.enrich:tier`` Kafka→Kafka."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from examples.enrich import tier_of

from htmqc.broker import Broker
from htmqc.produce import produce
from tests.broker.readback import read_all
from tests.broker.test_broker_cli import ENV
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for
from tests.services import postgres_url

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
N, ACCOUNTS = 20_000, 40
#: Two events no retry can fix: dead-lettered as permanent, never stored.
MALFORMED = [(b"acct-0", b'{"id": "p-bad"}'), (b"acct-1", b'"not an object"')]


def events() -> list[tuple[bytes | None, bytes]]:
    out: list[tuple[bytes | None, bytes]] = []
    for i in range(N):
        account = f"acct-{i % ACCOUNTS}"
        event = {"id": f"p-{i}", "account": account, "amount": (i * 7919) % 2_000_000 + 1}
        out.append((account.encode(), json.dumps(event).encode()))
    return out[:1000] + MALFORMED + out[1000:]


def expected_balances() -> dict[str, int]:
    sums: Counter[str] = Counter()
    for _key, value in events():
        event = json.loads(value)
        if isinstance(event, dict) and "amount" in event:
            sums[event["account"]] += event["amount"]
    return dict(sums)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database: a SQLite file, or a PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    import psycopg

    base = postgres_url()
    name = f"payments_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    try:
        yield f"{base.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite:///"):
        try:
            with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
                return list(db.execute(sql).fetchall())
        except sqlite3.OperationalError:  # no table yet
            return []
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        try:
            return list(db.execute(sql).fetchall())  # type: ignore[arg-type]
        except psycopg.errors.UndefinedTable:  # no table yet
            return []


@pytest.mark.parametrize("batch", [False, True], ids=["per-message", "batch"])
def test_payments_into_a_database_once_across_a_sigkill(
    broker: Broker, new_topic: Any, database: str, batch: bool
) -> None:
    topic = new_topic(partitions=4)
    produce(broker.bootstrap, topic, N + len(MALFORMED), records=events())
    cmd = [sys.executable, "-m", "examples.payments", "--bootstrap", broker.bootstrap,
           "--topic", topic, "--group", f"ledger-{uuid.uuid4().hex[:6]}", "--sink", database,
           *(["--batch"] if batch else [])]

    def paid() -> int:
        rows = query(database, "SELECT COUNT(*) FROM payments")
        return int(rows[0][0]) if rows else 0

    first = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: paid() >= 2000, 90, "the first payments")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert paid() < N
    second = subprocess.run([*cmd, "--idle-exit", "2"], cwd=ROOT, env=ENV, capture_output=True,
                            text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.startswith("payments: ")
    ids = Counter(r[0] for r in query(database, "SELECT id FROM payments"))
    assert sorted(ids) == sorted(f"p-{i}" for i in range(N))
    assert dict(query(database, "SELECT account, balance FROM balances")) == expected_balances()
    ledger = Counter(r[0] for r in query(database, "SELECT payment FROM ledger"))
    assert len(ledger) == N and set(ledger.values()) == {1}, "a payment counted twice"
    dead = query(database, "SELECT kind, reason FROM htmqc_dead_letters")
    assert [d[0] for d in dead] == ["permanent", "permanent"], dead
    assert all("payment" in d[1] for d in dead)


def test_enrichment_kafka_to_kafka(broker: Broker, new_topic: Any) -> None:
    topic, out = new_topic(partitions=4), new_topic(partitions=4)
    produce(broker.bootstrap, topic, N + len(MALFORMED), records=events())
    proc = htmqc_run(broker.bootstrap, topic, "examples.enrich:tier", "--group",
                     f"enrich-{uuid.uuid4().hex[:6]}", "--mode", "exactly-once",
                     "--sink", f"kafka:{out}", "--idle-exit", "2")
    assert finish(proc, 120) == 0
    got = [(r.key, json.loads(r.value)) for r in read_all(broker.bootstrap, out)]
    assert sorted(e["id"] for _k, e in got) == sorted(f"p-{i}" for i in range(N))
    for key, event in got:
        assert key == event["account"].encode()
        assert event["tier"] == tier_of(event["amount"])
    assert {tier_of(1), tier_of(10_000), tier_of(2_000_000)} == {"small", "medium", "large"}
