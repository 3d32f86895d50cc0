"""``htmqc capture`` against the bundled broker, and a replay of the capture
that stores the same effects and positions as the live run did."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from htmqc.broker import Broker
from htmqc.cli import main
from htmqc.produce import produce
from htmqc.replay import SegmentReader
from model_checks.trace_validation import validate_trace

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]


def live_run(bootstrap: str, topic: str, db: Path, log: Path) -> int:
    """``htmqc run`` exactly-once into ``db`` until idle; its exit code."""
    cmd = [
        sys.executable,
        "-m",
        "htmqc",
        "run",
        "tests.replay.handlers:record",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        "g-live",
        "--mode",
        "exactly-once",
        "--sink",
        f"sqlite:///{db}",
        "--idle-exit",
        "2",
    ]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        return proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"htmqc run did not finish: {log.read_text()[-2000:]}") from None


def stored(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Effects (without the wall-clock column) and positions."""
    with sqlite3.connect(db) as conn:
        effects = conn.execute(
            'SELECT id, msg_key, "partition", "offset", produced_ms FROM effects '
            'ORDER BY "partition", "offset"'
        ).fetchall()
        positions = conn.execute(
            'SELECT topic, "partition", committed FROM htmqc_positions ORDER BY "partition"'
        ).fetchall()
    return effects, positions


def test_capture_then_replay_stores_what_the_live_run_stored(
    broker: Broker, new_topic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=2)
    report = produce(broker.bootstrap, topic, 3000, keys=10, transactional=True, abort_every=3)
    assert report.aborted_ids  # aborted transactions leave gaps in the offsets
    live_db, log = tmp_path / "live.db", tmp_path / "run.log"
    assert live_run(broker.bootstrap, topic, live_db, log) == 0, log.read_text()[-2000:]

    seg = tmp_path / "capture.seg"
    assert (
        main(["capture", "--bootstrap", broker.bootstrap, "--topic", topic, "--out", str(seg)]) == 0
    )
    line = capsys.readouterr().out
    assert line.startswith(f"captured {report.count} records of {topic}")
    with SegmentReader(seg) as reader:
        assert len(reader) == report.count
        ids = sorted(int(bytes(m.value_view() or b"")[:12]) for m in reader)
    assert not set(ids) & set(report.aborted_ids)

    replay_db, trace = tmp_path / "replay.db", tmp_path / "replay.jsonl"
    assert (
        main(
            [
                "replay",
                str(seg),
                "tests.replay.handlers:record",
                "--mode",
                "exactly-once",
                "--sink",
                f"sqlite:///{replay_db}",
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith(f"replayed {report.count} of {report.count}")
    live, replayed = stored(live_db), stored(replay_db)
    assert len(live[0]) == report.count
    assert replayed == live
    verdict = validate_trace(trace, mode="exactly-once", tlc=False)
    assert verdict.ok, verdict.summary()


def test_capture_a_range_and_bad_ranges(
    broker: Broker, new_topic: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(200):
        for p in (0, 1):
            producer.produce(topic, f"{i:012d}".encode(), key=b"k", partition=p)
    assert producer.flush(20) == 0
    seg = tmp_path / "part.seg"
    assert (
        main(
            [
                "capture",
                "--bootstrap",
                broker.bootstrap,
                "--topic",
                topic,
                "--out",
                str(seg),
                "--partitions",
                "1",
                "--from",
                "10",
                "--to",
                "1:60",
                "--timeout",
                "20",
            ]
        )
        == 0
    )
    with SegmentReader(seg) as reader:
        assert list(reader.ranges) == [(topic, 1)] and reader.ranges[(topic, 1)].end == 60
        assert [m.offset() for m in reader] == list(range(10, 60))
    whole = tmp_path / "whole.seg"
    assert (
        main(
            [
                "capture",
                "--bootstrap",
                broker.bootstrap,
                "--topic",
                topic,
                "--out",
                str(whole),
                "--timeout",
                "20",
            ]
        )
        == 0
    )
    with SegmentReader(whole) as reader:
        # to the end, even where the broker's high watermark lags (Tansu)
        assert len(reader) == 400
        assert {tp: (r.start, r.end) for tp, r in reader.ranges.items()} == {
            (topic, 0): (0, 200),
            (topic, 1): (0, 200),
        }
    capsys.readouterr()
    base = ["capture", "--bootstrap", broker.bootstrap, "--out", str(tmp_path / "x.seg")]
    assert main([*base, "--topic", topic, "--to", "100000", "--timeout", "1"]) == 1
    assert "not complete after 1s" in capsys.readouterr().err
    assert main([*base, "--topic", topic, "--from", "5", "--to", "3"]) == 2
    assert "outside its log" in capsys.readouterr().err
    assert main([*base, "--topic", topic, "--partitions", "7"]) == 2
    assert "has no partition 7" in capsys.readouterr().err
    assert main([*base, "--topic", f"{topic}-missing"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*base, "--topic", topic, "--from", "x"]) == 2
    assert "is not an offset" in capsys.readouterr().err
    assert not (tmp_path / "x.seg").exists() and not (tmp_path / "x.seg.tmp").exists()
