"""Zombie fencing against the bundled broker, exactly-once into PostgreSQL.

Two ``htmqc run`` processes in one group. A stalls inside an open transaction
(the handler :func:`tests.runtime.handlers.stalling_record` blocks on a flag
file right after writing its row) and is then SIGSTOPped, so its heartbeats
stop too; B joins, the group evicts A after ``session.timeout.ms`` and gives B
every partition; B claims them (bumping their fences) and stores everything.
Then A is SIGCONTinued: it finishes its batch and commits its late transaction,
which the sink must reject (A logs ``fenced:``); the row A wrote in it must not
exist, and every produced id has exactly one effect.

PostgreSQL, not SQLite: a stopped SQLite writer would hold the file lock.
"""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from htmqc.broker import Broker
from htmqc.produce import produce
from tests.runtime.test_modes_broker import PgTables, kill_left, pg_tables
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]


@pytest.fixture
def pg() -> Iterator[PgTables]:
    """Fresh PostgreSQL tables for one test (see :func:`pg_tables`)."""
    with pg_tables() as tables:
        yield tables


def test_stopped_zombie_late_transaction_is_fenced(
    broker: Broker, new_topic: Any, pg: PgTables, tmp_path: Path
) -> None:
    topic, n, stall_at = new_topic(partitions=4), 4000, 1000
    produce(broker.bootstrap, topic, n, keys=100)
    flag = tmp_path / "stall"
    marker = Path(f"{flag}.stalled")
    flag.touch()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    args = [
        "tests.runtime.handlers:stalling_record",
        "--group",
        f"g-zombie-{uuid.uuid4().hex[:6]}",
        "--mode",
        "exactly-once",
        "--sink",
        pg.sink,
        "--txn-messages",
        "100",
        "--idle-exit",
        "3",
    ]
    env = {
        "HTMQC_TEST_TABLE": pg.effects,
        "HTMQC_TEST_STALL": str(flag),
        "HTMQC_TEST_STALL_AT": str(stall_at),
    }
    a = htmqc_run(broker.bootstrap, topic, *args, env=env, log=log_a)
    b = None
    try:
        wait_for(marker.exists, 60, "A to stall inside a transaction")
        stalled_id, stalled_pid = map(int, marker.read_text().split())
        assert stalled_pid == a.pid and stalled_id >= stall_at
        a.send_signal(signal.SIGSTOP)  # heartbeats stop: the group will evict A
        flag.unlink()  # when A runs again, it goes on at once
        before = pg.stored()
        assert 0 < before < n, "A should have committed some transactions before stalling"
        # A's open transaction holds its row for stalled_id; nobody else sees it
        assert stalled_id not in {r[0] for r in pg.rows()}
        b = htmqc_run(broker.bootstrap, topic, *args, env=env, log=log_b)
        wait_for(lambda: pg.stored() == n, 90, "B to take A's partitions and store everything")
        assert "fenced" not in log_a.read_text()
        a.send_signal(signal.SIGCONT)  # the zombie wakes up inside its old transaction
        wait_for(lambda: "fenced: " in log_a.read_text(), 30, "A's late commit to be fenced")
        assert finish(a, 60) == 0, log_a.read_text()[-2000:]
        assert finish(b, 60) == 0, log_b.read_text()[-2000:]
    finally:
        kill_left(a, b)
    assert "postgresql sink: partition" in log_a.read_text()
    rows = pg.rows()
    ids = Counter(r[0] for r in rows)
    assert sorted(ids) == list(range(n)), "lost effects"
    assert [i for i, c in ids.items() if c > 1] == [], "the zombie's late transaction was stored"
    [stalled_row] = [r for r in rows if r[0] == stalled_id]
    assert stalled_row[3] == b.pid, "the stalled message's effect must be B's, not A's"
    assert pg.stored() == n
