"""The run's tables: effects come back in commit order, so a late zombie write is
seen as one by the audit (PostgreSQL commit stamps; SQLite rowid order)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from htmqc.audit import Produced, audit
from htmqc.chaos.store import ClaimCheck, RunStore
from htmqc.produce import message_value
from htmqc.sinks.postgresql import PostgresSink
from tests.services import postgres_url


@pytest.fixture
def pg_store() -> Iterator[RunStore]:
    url = postgres_url()
    store = RunStore(pg_url=url)
    store.create()
    try:
        yield store
    finally:
        store.drop()


def insert(conn: psycopg.Connection, store: RunStore, ident: int, gen: int) -> None:
    conn.execute(
        f'INSERT INTO {store.effects_table} (id, msg_key, "partition", "offset", generation) '
        "VALUES (%s, %s, 0, %s, %s)",
        (ident, "k", ident, gen),
    )


def test_postgresql_effects_come_in_commit_order(pg_store: RunStore) -> None:
    assert pg_store.pg_url is not None
    with psycopg.connect(pg_store.pg_url) as zombie, psycopg.connect(pg_store.pg_url) as owner:
        insert(zombie, pg_store, 0, 1)  # the zombie writes first (generation 1)...
        insert(owner, pg_store, 0, 2)
        insert(owner, pg_store, 1, 2)
        owner.commit()  # ...the new owner (generation 2) commits first...
        insert(zombie, pg_store, 1, 1)
        zombie.commit()  # ...and the zombie commits late
        with psycopg.connect(pg_store.pg_url) as rolled_back:
            insert(rolled_back, pg_store, 9, 3)
            rolled_back.rollback()
    effects = list(pg_store.effects())
    assert [(e.id, e.generation) for e in effects] == [("0", 2), ("1", 2), ("0", 1), ("1", 1)]
    assert pg_store.unstamped() == 0
    report = audit([Produced("0"), Produced("1")], effects)
    assert report.counts["fenced-write"] == 2
    assert report.counts["duplicate"] == 2


def test_postgresql_positions_claims_and_dead_letters(pg_store: RunStore) -> None:
    assert pg_store.pg_url is not None
    assert pg_store.committed() == {}  # the table exists (made by the sink), no rows yet
    assert pg_store.dead_letters() == []
    assert f"table_prefix={pg_store.prefix}" in pg_store.sink_url
    sink = PostgresSink(pg_store.pg_url, table_prefix=pg_store.prefix)
    sink.open("g")
    try:
        sink.claim([("t", 0), ("t", 1)], default_start=lambda tp: 5)
        sink.claim([("t", 1)], default_start=lambda tp: 5)
    finally:
        sink.close()
    assert pg_store.committed() == {0: 5, 1: 5}
    assert sorted((p, f) for _s, p, f in pg_store.claims()) == [(0, 1), (1, 1), (1, 2)]
    with psycopg.connect(pg_store.pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pg_store.dlq_table} (id INT, msg_value BYTEA, reason TEXT)")
        conn.execute(
            f"INSERT INTO {pg_store.dlq_table} VALUES (1, %s, 'PoisonMessage: x')",
            (message_value(42, 100),),
        )
    [entry] = pg_store.dead_letters()
    assert entry.id == "42" and entry.reason == "PoisonMessage: x"


def test_a_late_commit_after_a_claim_is_a_fenced_write(pg_store: RunStore) -> None:
    """The zombie (generation 1) commits after the new owner claimed (fence 2) but
    before the new owner wrote anything: effects alone look ordered, the claims
    do not."""
    assert pg_store.pg_url is not None
    sink = PostgresSink(pg_store.pg_url, table_prefix=pg_store.prefix)
    sink.open("g")
    try:
        sink.claim([("t", 0)], default_start=lambda tp: 0)  # the zombie's claim: fence 1
        with psycopg.connect(pg_store.pg_url) as zombie:
            insert(zombie, pg_store, 0, 1)
            sink.claim([("t", 0)], default_start=lambda tp: 0)  # the new owner: fence 2
            zombie.commit()
        with psycopg.connect(pg_store.pg_url) as owner:
            insert(owner, pg_store, 0, 2)
            owner.commit()
    finally:
        sink.close()
    check = ClaimCheck(pg_store.claims())
    effects = list(pg_store.effects(check))
    assert audit([Produced("0")], effects).counts["fenced-write"] == 0  # blind without claims
    assert check.count == 1
    assert check.examples == [{"id": "0", "partition": 0, "generation": 1, "claimed": 2}]


def test_sqlite_effects_in_rowid_order(tmp_path: Path) -> None:
    store = RunStore(path=tmp_path / "c.db")
    store.create()
    conn = store._connect()
    for ident, gen in ((0, 1), (1, 2), (2, 1)):
        conn.execute(
            f'INSERT INTO {store.effects_table} (id, msg_key, "partition", "offset", generation) '
            "VALUES (?, 'k', 0, ?, ?)",
            (ident, ident, gen),
        )
    assert [(e.id, e.generation) for e in store.effects()] == [("0", 1), ("1", 2), ("2", 1)]
    assert store.unstamped() == 0
    store.drop()
    assert not (tmp_path / "c.db").exists()
