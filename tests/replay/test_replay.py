"""Replay through the runtime engine, offline: determinism, faults, order,
the segment consumer's contract, and the command line."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.cli import main
from htmqc.replay import PartitionRange, SegmentReader, SegmentWriter
from htmqc.replay.faults import FaultSchedule
from htmqc.replay.run import replay, segment_consumer
from model_checks.trace_validation import validate_trace
from tests.replay import handlers

TOPIC = "orders"


def make_segment(path: Path, per_partition: int = 60) -> Path:
    """Two partitions interleaved, keys k0..k4, offsets with gaps (every 7th
    offset of partition 1 missing, and the range of partition 0 ends past its
    last record)."""
    ranges = [
        PartitionRange(TOPIC, 0, 0, per_partition + 3),
        PartitionRange(TOPIC, 1, 10, 10 + per_partition + per_partition // 7 + 1),
    ]
    with SegmentWriter(path, ranges) as w:
        off1 = 10
        for i in range(per_partition):
            w.append(
                TOPIC,
                0,
                i,
                1_000 + i,
                0,
                f"k{i % 5}".encode(),
                f"{i:012d}".encode() + b"." * 20,
                [("htmqc-id", str(i).encode())],
            )
            if (off1 - 10) % 7 == 6:
                off1 += 1  # a gap
            w.append(
                TOPIC, 1, off1, 2_000 + i, 0, f"k{i % 5}".encode(), f"{100_000 + i:012d}".encode()
            )
            off1 += 1
    return path


def rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        effects = conn.execute(
            'SELECT id, msg_key, "partition", "offset", produced_ms FROM effects '
            'ORDER BY "partition", "offset"'
        ).fetchall()
        positions = conn.execute(
            'SELECT topic, "partition", committed FROM htmqc_positions ORDER BY "partition"'
        ).fetchall()
    return [*effects, *positions]


def test_replay_twice_gives_identical_traces_and_effects(tmp_path: Path) -> None:
    seg = make_segment(tmp_path / "in.seg")
    runs = []
    for n in (1, 2):
        db, trace = tmp_path / f"out{n}.db", tmp_path / f"trace{n}.jsonl"
        report = replay(
            seg,
            handlers.record,
            mode="exactly-once",
            sink=f"sqlite:///{db}",
            faults=7,
            fault_rate=0.1,
            max_failures=3,
            trace=str(trace),
            txn_messages=16,
        )
        assert report.delivered == report.records == report.finished == 120
        assert report.faults_injected > 5
        runs.append((trace.read_bytes(), rows(db), report.faults_injected))
    assert runs[0] == runs[1]
    trace_text = runs[0][0].decode()
    assert '"retry_due"' in trace_text and '"commit_acked"' in trace_text
    effects = [r for r in runs[0][1] if len(r) == 5]
    assert len(effects) == len({(r[2], r[3]) for r in effects}) == 120
    positions = [r for r in runs[0][1] if len(r) == 3]
    assert positions == [(TOPIC, 0, 63), (TOPIC, 1, 79)], "gaps up to the range end"
    verdict = validate_trace(tmp_path / "trace1.jsonl", mode="exactly-once", tlc=False)
    assert verdict.ok, verdict.summary()


def test_the_transaction_timer_fires_under_the_virtual_clock(tmp_path: Path) -> None:
    """``txn_ms`` ends transactions in replay too (issue 16, item 8: the
    exactly-once timer read ``time.monotonic()`` itself, so under the virtual
    clock only ``txn_messages`` ended one). Deterministic: the same commits twice."""
    seg = make_segment(tmp_path / "in.seg")
    acked = []
    for n, txn_ms in ((1, 40.0), (2, 40.0), (3, 10_000.0)):
        trace = tmp_path / f"t{n}.jsonl"
        replay(
            seg,
            handlers.record,
            mode="exactly-once",
            sink=f"sqlite:///{tmp_path / f'{n}.db'}",
            trace=str(trace),
            txn_messages=1_000_000,
            txn_ms=txn_ms,
            batch_size=500,  # one batch: only the worker's own timer can end a transaction
        )
        acked.append([line for line in trace.read_text().splitlines() if "commit_acked" in line])
    assert acked[0] == acked[1]
    assert len(acked[0]) > 2 * len(acked[2]), (len(acked[0]), len(acked[2]))


def test_fault_schedule_is_a_function_of_the_seed() -> None:
    a = FaultSchedule.build(3, 1000, 0.05)
    assert a.failures == FaultSchedule.build(3, 1000, 0.05).failures
    assert a.failures != FaultSchedule.build(4, 1000, 0.05).failures
    assert 20 < len(a.failures) < 90 and set(a.failures.values()) <= {1, 2, 3, 4}
    # a longer segment keeps the schedule of the common prefix
    longer = FaultSchedule.build(3, 2000, 0.05).failures
    assert {i: k for i, k in longer.items() if i < 1000} == a.failures
    with pytest.raises(ValueError):
        FaultSchedule.build(3, 10, 1.5)


def test_at_least_once_replay_runs_each_record_once_in_partition_order(tmp_path: Path) -> None:
    seg = make_segment(tmp_path / "in.seg")
    seen: list[tuple[int, int]] = []
    report = replay(seg, lambda m: seen.append((m.partition(), m.offset())), faults=None)
    assert report.finished == report.records == len(seen) == 120
    with SegmentReader(seg) as reader:
        captured = [(m.partition(), m.offset()) for m in reader]
    for p in (0, 1):
        assert [o for q, o in seen if q == p] == [o for q, o in captured if q == p]
    again: list[tuple[int, int]] = []
    replay(seg, lambda m: again.append((m.partition(), m.offset())))
    assert again == seen


def test_faults_hold_back_only_their_key(tmp_path: Path) -> None:
    seg = make_segment(tmp_path / "in.seg")
    seen: list[tuple[int, bytes, int]] = []
    report = replay(
        seg,
        lambda m: seen.append((m.partition(), m.key(), m.offset())),
        faults=11,
        fault_rate=0.2,
        max_failures=2,
    )
    assert report.faults_injected >= 10 and report.finished == 120
    assert len(seen) == 120
    for p in (0, 1):
        for key in {k for q, k, _ in seen if q == p}:
            offsets = [o for q, k, o in seen if (q, k) == (p, key)]
            assert offsets == sorted(offsets), "per-key order broken by a retry"


def test_segment_consumer_seek_back_and_pause(tmp_path: Path) -> None:
    seg = make_segment(tmp_path / "in.seg", per_partition=5)
    reader = SegmentReader(seg)
    consumer = segment_consumer(reader)
    assigned: list[Any] = []

    def on_assign(c: Any, parts: list[Any]) -> None:
        assigned.extend(parts)
        c.incremental_assign(
            [KafkaTP(p.topic, p.partition, 2 if p.partition == 0 else -1001) for p in parts]
        )

    consumer.subscribe([TOPIC], on_assign=on_assign, on_revoke=None, on_lost=None)
    first = consumer.consume(3, 0)
    # file order: (0,0) (1,10) (0,1) (1,11) (0,2) (1,12) (0,3) ...; partition 0 starts at 2
    assert [(m.partition(), m.offset()) for m in first] == [(1, 10), (1, 11), (0, 2)]
    assert [(p.topic, p.partition) for p in assigned] == [(TOPIC, 0), (TOPIC, 1)]
    consumer.pause([KafkaTP(TOPIC, 0)])
    held = consumer.consume(10, 0)  # stops at partition 0's next record: no skipping ahead
    assert [(m.partition(), m.offset()) for m in held] == [(1, 12)]
    consumer.resume([KafkaTP(TOPIC, 0)])
    consumer.seek(KafkaTP(TOPIC, 1, 10))
    again = consumer.consume(2, 0)
    assert [(m.partition(), m.offset()) for m in again] == [(1, 10), (1, 11)]
    assert consumer.position([KafkaTP(TOPIC, 1)])[0].offset == 12
    rest = consumer.consume(100, 0)
    assert [(m.partition(), m.offset()) for m in rest] == [
        (1, 12),
        (0, 3),
        (1, 13),
        (0, 4),
        (1, 14),
    ]
    assert consumer.exhausted()
    assert consumer.position([KafkaTP(TOPIC, 0)])[0].offset == 8  # range end: a gap
    assert consumer.get_watermark_offsets(KafkaTP(TOPIC, 1)) == (10, 16)
    del first, held, again, rest
    reader.close()


def test_cli_replay_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seg = make_segment(tmp_path / "in.seg")
    db = tmp_path / "cli.db"
    code = main(
        [
            "replay",
            str(seg),
            "tests.replay.handlers:record",
            "--mode",
            "exactly-once",
            "--sink",
            f"sqlite:///{db}",
            "--faults",
            "5",
            "--fault-max-failures",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("replayed 120 of 120 records") and "injected" in out
    assert len(rows(db)) == 122
    broken = tmp_path / "broken.seg"
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x40
    broken.write_bytes(bytes(data))
    assert main(["replay", str(broken), "tests.replay.handlers:record"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "checksum mismatch" in err and "Traceback" not in err
    broken.write_bytes(seg.read_bytes()[:-3])
    assert main(["replay", str(broken), "tests.replay.handlers:record"]) == 1
    assert "truncated" in capsys.readouterr().err
    assert main(["replay", str(seg), "tests.replay.handlers:nothing"]) == 2
    assert main(["replay", str(seg), "tests.replay.handlers:record", "--fault-rate", "2"]) == 2
    assert main(["replay", str(seg), "tests.replay.handlers:record", "--mode", "exactly-once"]) == 2
    assert "needs a sink" in capsys.readouterr().err
