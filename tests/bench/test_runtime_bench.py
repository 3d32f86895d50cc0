"""The runtime benchmark's chart and the engine benchmark's stand-in consumer."""

from __future__ import annotations

from pathlib import Path

from benchmarks.engine_bench import batches, engine_us
from benchmarks.runtime_bench import chart


def test_chart_is_a_png(tmp_path: Path) -> None:
    results = {
        "count": 1000, "size": 100, "partitions": 8, "rounds": 3,
        "msg_per_s": {"raw_loop": 300_000.0, "raw_sqlite": 150_000.0,
                      "at_least_once": 280_000.0, "exactly_once_sqlite": 120_000.0},
    }
    path = chart(results, tmp_path / "runtime.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000


def test_engine_bench_runs_every_message_through_the_engine() -> None:
    assert engine_us(batches(5000), 5000, None) > 0  # asserts finished == handled == count
