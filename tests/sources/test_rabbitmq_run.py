"""``htmqc run --source rabbitmq-stream`` end to end: the same core and runtime over
RabbitMQ streams, in subprocesses, against a private node (tests/sources/conftest.py).

* offsets deleted by retention (the head of a small stream) are a gap: the rest is
  stored exactly once and the positions reach the log end;
* a node that crashes and restarts under a member loses nothing.

Exactly-once into SQLite across a SIGKILL and dead letters to ``TOPIC.dlq``, shared by
every source, and at-least-once across a SIGKILL with a standby (the standby takes the
dead member's lease, its AMQP connection gone; offset tracking keeps one number, so
the work finished above the watermark is in the duplicated window), shared with
Pulsar, are in test_source_contract.py. The audit helpers are the Kafka tests'
(tests/runtime/test_run_broker.py, test_modes_broker.py).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from htmqc.sources.rabbitmq import RabbitStreamClient, produce
from htmqc.sources.rabbitmq_server import RabbitServer
from tests.runtime.test_modes_broker import kill
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    wait_for,
)
from tests.sources.support import HANDLERS, positions

pytestmark = pytest.mark.slow


def rabbit(*args: str) -> list[str]:
    """``htmqc run`` arguments after the handler, with ``--source rabbitmq-stream``."""
    return ["--source", "rabbitmq-stream", *args]


def settled_watermarks(
    client: RabbitStreamClient, topic: str, partitions: int, quiet: float = 1.5
) -> dict[int, tuple[int, int]]:
    """Each partition's watermarks once retention is done: RabbitMQ deletes segments
    after they roll over, in the background, so the low mark may still move after the
    last write (a run reading then finds more gone than a read just before it saw: it
    failed so once in CI, on a loaded box). Read until unchanged for ``quiet`` seconds
    (at most 30 s)."""
    marks = {p: client.watermarks(topic, p) for p in range(partitions)}
    stable_since = time.monotonic()
    deadline = stable_since + 30
    while time.monotonic() - stable_since < quiet:
        assert time.monotonic() < deadline, f"retention never settled: {marks}"
        time.sleep(0.25)
        now = {p: client.watermarks(topic, p) for p in range(partitions)}
        if now != marks:
            marks, stable_since = now, time.monotonic()
    return marks


def test_offsets_deleted_by_retention_are_a_gap(
    rabbitmq_server: RabbitServer,
    client: RabbitStreamClient,
    topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:
    url, topic, n = rabbitmq_server.url, topic_name(), 1400
    client.create_topic(topic, 2, max_length_bytes=30_000, stream_max_segment_size_bytes=5_000)
    produce(url, topic, 200, partitions=2, client=client)
    assert client.watermarks(topic, 0) == (0, 100)
    db, log = tmp_path / "gaps.db", tmp_path / "run.log"
    once = exactly_once_args(db, "g-gaps", "--idle-exit", "2")
    args = ["examples.effects:record", *rabbit(*once)]
    assert finish(htmqc_run(url, topic, *args, log=log), 60) == 0, log.read_text()[-2000:]
    assert positions(db) == {0: 100, 1: 100}
    for start in range(200, n, 200):  # retention is applied as segments roll over
        produce(url, topic, 200, partitions=2, start_id=start, client=client)
    marks = settled_watermarks(client, topic, 2)
    assert all(100 < low < high == n // 2 for low, high in marks.values()), marks
    # Message i is on partition i % 2 at offset i // 2; the sink's positions (100)
    # are below the first offsets kept: the run reads from there, a gap.
    gone = {i for i in range(n) if 100 <= i // 2 < marks[i % 2][0]}
    assert finish(htmqc_run(url, topic, *args, log=log), 60) == 0, log.read_text()[-2000:]
    ids = effect_ids(db)
    assert len(ids) == len(set(ids)), "duplicated effects"
    assert set(ids) == set(range(n)) - gone
    with sqlite3.connect(db) as conn:
        rows = conn.execute('SELECT id, "partition", "offset" FROM effects').fetchall()
    assert all((p, o) == (i % 2, i // 2) for i, p, o in rows), "an offset is not the stream's"
    assert positions(db) == {p: n // 2 for p in range(2)}, "the positions did not reach the end"


def test_a_node_that_crashes_and_restarts_under_a_member_loses_nothing(
    topic_name: Callable[[], str], tmp_path: Path
) -> None:
    """The node is SIGKILLed under a running member and started again on its
    store: the member, whose lease connection died, stops with exit 1 and one
    line (no traceback); a new member resumes at the offsets the node tracked,
    and between the two every message ran, each run without duplicates."""
    from htmqc.sources.rabbitmq_server import start_rabbitmq
    from tests.services import require_rabbitmq_server

    with start_rabbitmq(binary=require_rabbitmq_server()) as server:
        url, topic, n, group = server.url, topic_name(), 20000, "g-restart"
        client = RabbitStreamClient(url)
        try:
            produce(url, topic, n, partitions=4, client=client)

            def committed() -> int:
                return sum(client.committed(group, topic, p) or 0 for p in range(4))

            out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
            log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
            args = [f"{HANDLERS}:log_order", *rabbit("--group", group)]
            first = htmqc_run(url, topic, *args, env={"HTMQC_TEST_OUT": str(out1)}, log=log1)
            try:
                wait_for(lambda: committed() >= 2000, 60, "the first commits")
                client.close()
                server.restart()
                code = finish(first, 60)
            finally:
                kill(first)
            text = log1.read_text()
            assert code == 1, text[-2000:]
            assert "Traceback" not in text, text[-2000:]
            client = RabbitStreamClient(url)

            def recovered() -> bool:  # a restarted node serves its streams a moment later
                try:
                    committed()
                except Exception:
                    return False
                return True

            wait_for(recovered, 60, "the streams after the restart")
            at_restart = committed()
            second = htmqc_run(
                url, topic, *args, "--idle-exit", "2",
                env={"HTMQC_TEST_OUT": str(out2)}, log=log2,
            )  # fmt: skip
            assert finish(second, 120) == 0, log2.read_text()[-2000:]
            assert committed() == n
        finally:
            client.close()

    def ids_of(path: Path) -> list[int]:
        return [int(line.split()[2]) for line in path.read_text().splitlines()]

    ids1, ids2 = ids_of(out1), ids_of(out2)
    assert len(set(ids1)) == len(ids1) and len(set(ids2)) == len(ids2)
    assert set(ids1) | set(ids2) == set(range(n)), "lost messages"
    assert len(ids2) == n - at_restart, "the new member did not resume at the tracked offsets"
