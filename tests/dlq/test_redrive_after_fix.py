"""Redrive after a fix, end to end: ``htmqc run`` dead-letters the messages its
handler cannot handle yet; the handler is fixed; ``htmqc dlq redrive`` writes
them back; the consumer runs again: every message's effect exists exactly once,
and a second redrive changes nothing."""

from __future__ import annotations

import json
import random
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from htmqc.broker import Broker
from htmqc.produce import produce
from tests.dlq.support import read_topic
from tests.dlq.test_sql_dlq import run
from tests.runtime.test_run_broker import effect_ids, finish, htmqc_run

pytestmark = [pytest.mark.broker, pytest.mark.brokers("tansu", "kafka")]
COUNT = 300


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-hw"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def consume(
    broker: Broker, topic: str, handler: str, sink: list[str], broken: Path, log: Path
) -> None:
    """One ``htmqc run`` until idle, exactly once, a quick retry policy."""
    proc = htmqc_run(
        broker.bootstrap,
        topic,
        handler,
        "--group", "g-fix", "--mode", "exactly-once", *sink,
        "--max-retries", "1", "--backoff-ms", "5", "--backoff-max-ms", "20", "--idle-exit", "2",
        env={"HTMQC_TEST_BROKEN": str(broken)},
        log=log,
    )  # fmt: skip
    assert finish(proc, 90) == 0, log.read_text()[-3000:]


def test_redrive_after_a_fix_into_sqlite(
    broker: Broker, new_topic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=3)
    produce(broker.bootstrap, topic, COUNT, keys=30)
    broken_ids = sorted(random.Random(5).sample(range(COUNT), 20))
    broken = tmp_path / "broken"
    broken.write_text(",".join(map(str, broken_ids)))
    db, log = tmp_path / "eo.db", tmp_path / "run.log"
    sink = ["--sink", f"sqlite:///{db}"]
    handler = "tests.dlq.handlers:record_unless_broken"

    consume(broker, topic, handler, sink, broken, log)
    assert sorted(effect_ids(db)) == sorted(set(range(COUNT)) - set(broken_ids))
    code, out, err = run(capsys, "list", "--sink", f"sqlite:///{db}", "--json")
    letters = json.loads(out)
    assert code == 0 and len(letters) == len(broken_ids), err
    kinds = Counter(e["kind"] for e in letters)
    assert kinds == Counter(
        "permanent" if int(e["value"][:12]) % 3 == 0 else "failed" for e in letters
    )
    assert all(e["group"] == "g-fix" and e["topic"] == topic for e in letters)

    broken.write_text("")  # the fix
    code, out, err = run(capsys, "redrive", "--sink", f"sqlite:///{db}", "--bootstrap",
                         broker.bootstrap)  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"redrove {len(broken_ids)} dead letters")
    consume(broker, topic, handler, sink, broken, log)
    ids = Counter(effect_ids(db))
    assert sorted(ids) == list(range(COUNT)), "lost effects"
    assert max(ids.values()) == 1, "duplicated effects"

    marks = high_watermarks(broker.bootstrap, topic, 3)
    code, out, err = run(capsys, "redrive", "--sink", f"sqlite:///{db}", "--bootstrap",
                         broker.bootstrap)  # fmt: skip
    assert code == 0 and out.splitlines()[-1].startswith("redrove 0 dead letters"), err
    assert high_watermarks(broker.bootstrap, topic, 3) == marks, "a second redrive wrote"
    with sqlite3.connect(db) as conn:
        assert (
            conn.execute(
                "SELECT COUNT(*) FROM htmqc_dead_letters WHERE redriven_at IS NULL"
            ).fetchone()[0]
            == 0
        )
    print(f"redrive after fix (SQLite): {len(broken_ids)} of {COUNT} redriven, effects once")


def test_redrive_after_a_fix_kafka_to_kafka(
    broker: Broker, new_topic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=2)
    out_topic = new_topic(partitions=1, prefix="out")
    produce(broker.bootstrap, topic, COUNT, keys=30)
    broken_ids = sorted(random.Random(6).sample(range(COUNT), 15))
    broken = tmp_path / "broken"
    broken.write_text(",".join(map(str, broken_ids)))
    log = tmp_path / "run.log"
    sink = ["--sink", f"kafka:{out_topic}"]
    handler = "tests.dlq.handlers:forward_unless_broken"

    consume(broker, topic, handler, sink, broken, log)
    code, out, err = run(capsys, "list", "--bootstrap", broker.bootstrap, "--topic", topic,
                         "--json")  # fmt: skip
    assert code == 0, err
    assert sorted(int(e["value"][:12]) for e in json.loads(out)) == broken_ids

    broken.write_text("")
    code, out, err = run(capsys, "redrive", "--bootstrap", broker.bootstrap, "--topic", topic)
    assert code == 0 and out.splitlines()[-1].startswith(f"redrove {len(broken_ids)} "), err
    consume(broker, topic, handler, sink, broken, log)
    code, out, err = run(capsys, "redrive", "--bootstrap", broker.bootstrap, "--topic", topic)
    assert code == 0 and out.splitlines()[-1].startswith("redrove 0 dead letters"), err

    outputs = Counter(int(m.value()) for m in read_topic(broker.bootstrap, out_topic, 1, COUNT))
    assert sorted(outputs) == list(range(COUNT)), "lost effects"
    assert max(outputs.values()) == 1, "duplicated effects"
