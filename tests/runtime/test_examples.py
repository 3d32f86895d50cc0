"""The example applications, run as a user would: ``python -m examples.payments`` into
SQLite and PostgreSQL across a SIGKILL, ``htmqc run examples.enrich:tier`` Kafka→Kafka,
``htmqc run examples.http_score:score`` (async, rate-limited HTTP calls)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class ScoringService:
    """A stand-in for the HTTP service of :mod:`examples.http_score`: records each
    request's arrival time and body; answers 400 to ``p-bad`` events and 503 to
    the first try of ``p-7``."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, bytes]] = []
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                with service.lock:
                    service.requests.append((time.monotonic(), body))
                    first_try = sum(b == body for _, b in service.requests) == 1
                event = json.loads(body) if body.startswith(b"{") else {}
                status = (400 if event.get("id") == "p-bad" or not event
                          else 503 if event.get("id") == "p-7" and first_try else 200)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self) -> Counter[str]:
        with self.lock:
            bodies = [b for _, b in self.requests]
        return Counter(json.loads(b)["id"] for b in bodies if b.startswith(b"{")
                       and "id" in json.loads(b))


def test_async_http_handler_keeps_the_rate_and_dead_letters_refusals(
    broker: Broker, new_topic: Any
) -> None:
    n, rate = 300, 100.0
    topic = new_topic(partitions=4)
    records = [(f"acct-{i % 40}".encode(), json.dumps({"id": f"p-{i}", "account": f"acct-{i % 40}",
                                                       "amount": i + 1}).encode())
               for i in range(n)]
    produce(broker.bootstrap, topic, n + len(MALFORMED), records=records + MALFORMED)
    service = ScoringService()
    try:
        proc = htmqc_run(broker.bootstrap, topic, "examples.http_score:score", "--group",
                         f"score-{uuid.uuid4().hex[:6]}", "--workers", "8",
                         "--backoff-ms", "50", "--idle-exit", "3",
                         env={"SCORE_URL": service.url, "SCORE_RATE": str(rate)})
        assert finish(proc, 120) == 0
        ids = service.ids()
        # Every event reached the service; p-7 twice (its 503 was retried).
        assert set(ids) >= {f"p-{i}" for i in range(n)}
        assert ids["p-7"] >= 2
        assert ids["p-bad"] == 1  # a 4xx is permanent: never tried again
        # The rate held with eight requests in flight: no one-second window saw more
        # than `rate` requests plus the bucket's burst of one.
        times = sorted(t for t, _ in service.requests)
        busiest = max(bisect_right(times, t + 1.0) - i for i, t in enumerate(times))
        assert busiest <= rate + 1, busiest
        assert times[-1] - times[0] >= (len(times) - 1) / rate - 0.05
    finally:
        service.server.shutdown()
        service.server.server_close()
    # The two events the service refused (4xx) were dead-lettered, not retried.
    dead = read_all(broker.bootstrap, f"{topic}.dlq")
    assert sorted(r.value for r in dead) == sorted(v for _k, v in MALFORMED)
