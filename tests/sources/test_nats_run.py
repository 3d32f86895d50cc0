"""``htmqc run --source nats`` end to end: the same core and runtime over NATS
JetStream, in subprocesses, against a private ``nats-server`` (tests/sources/conftest.py).

* at-least-once over a 4-partition topic across a SIGKILL: nothing lost, the
  successor waits for the dead member's lease, starts at the commits in the KV
  bucket, and the duplicates are exactly the killed process's uncommitted window;
* deleted and purged messages (holes in the stream sequence) are gaps: the rest
  is stored exactly once and the positions reach the log end.

Exactly-once into SQLite across a SIGKILL and dead letters to ``TOPIC.dlq`` (a
subject here), shared by every source, are in test_source_contract.py. The audit
helpers are the Kafka tests' (tests/runtime/test_run_broker.py, test_modes_broker.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.sources.nats import NatsClient, produce, stream_name
from htmqc.sources.nats_server import NatsServer
from tests.runtime.test_modes_broker import audit_sigkill_restart, kill
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    wait_for,
)
from tests.sources.support import HANDLERS, check_traces, positions, traced

pytestmark = pytest.mark.slow


def nats(*args: str) -> list[str]:
    """``htmqc run`` arguments after the handler, with ``--source nats``."""
    return ["--source", "nats", *args]


def test_at_least_once_across_sigkill_loses_nothing(
    nats_server: NatsServer,
    client: NatsClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    topic, n, group = topic_name(), 8000, "g-alo"
    produce(nats_server.url, topic, n, partitions=4, client=client)
    out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    args = [f"{HANDLERS}:log_order", *nats("--group", group)]

    def committed() -> int:
        return sum(client.committed(group, topic, p) or 0 for p in range(4))

    first = htmqc_run(
        nats_server.url, topic, *args, *traced(trace1), env={"HTMQC_TEST_OUT": str(out1)}, log=log1
    )
    try:
        wait_for(lambda: committed() >= 1500, 60, "the first commits")
    finally:
        kill(first)
    second = htmqc_run(
        nats_server.url, topic, *args, *traced(trace2), "--idle-exit", "2",
        env={"HTMQC_TEST_OUT": str(out2)}, log=log2,
    )  # fmt: skip
    assert finish(second, 90) == 0, log2.read_text()[-2000:]
    # The killed member's lease outlives it (up to LEASE_SECONDS): the successor waits.
    assert "waiting as a standby" in log2.read_text()
    audit_sigkill_restart(out1, out2, log2, topic, n)
    assert committed() == n
    check_traces("at-least-once", trace1, trace2)


def test_deleted_and_purged_messages_are_gaps(
    nats_server: NatsServer,
    client: NatsClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    topic, n = topic_name(), 3000
    produce(nats_server.url, topic, n, partitions=2, client=client)
    # Message i is on partition i % 2 at offset i // 2.
    deleted = {(0, 5), (0, 6), (0, 700), (1, 1499), (1, 300)}
    for p, offset in deleted:
        client.delete_message(topic, p, offset)
    client.call(client.js.purge_stream(stream_name(topic, 1), seq=101))  # offsets 0..99 gone
    gone = {2 * o + p for p, o in deleted} | {2 * o + 1 for o in range(100)}
    db, log = tmp_path / "gaps.db", tmp_path / "run.log"
    proc = htmqc_run(
        nats_server.url, topic, "examples.effects:record",
        *nats(*exactly_once_args(db, "g-gaps", "--idle-exit", "2")), log=log,
    )  # fmt: skip
    assert finish(proc, 60) == 0, log.read_text()[-2000:]
    ids = effect_ids(db)
    assert len(ids) == len(set(ids)), "duplicated effects"
    assert set(ids) == set(range(n)) - gone
    assert positions(db) == {p: client.watermarks(topic, p)[1] for p in range(2)}, (
        "the positions did not pass the gaps to the log end"
    )
