"""Smoke tests of the peer benchmark harness (``python -m benchmarks.peers``).

The broker test runs the whole harness on 2,000 messages with the raw
contender only, in a worker process, and checks the JSON shape and that the
README table is regenerated between its markers without touching the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import runner
from benchmarks.peers.common import Meter, latency_summary, parse_id
from benchmarks.peers.table import BEGIN, END, update_readme
from htmqc.broker import Broker
from htmqc.produce import message_value
from htmqc.produce import parse_id as htmqc_parse_id

README_BEFORE = f"# Benchmarks\n\nhand-written intro\n\n{BEGIN}\nstale table\n{END}\n\nfooter\n"


def test_parse_id_matches_the_produce_format() -> None:
    for i in (0, 7, 123_456_789_012):
        assert parse_id(message_value(i, 100)) == htmqc_parse_id(message_value(i, 100)) == i


def test_meter_times_first_to_count_th_and_sums_ids() -> None:
    exact = Meter(3)
    for i in range(3):
        exact.handle(message_value(i, 20))
    assert exact.done and exact.result("x", "m")["rate"] is not None  # stops at the 3rd
    meter = Meter(3)
    for i in range(5):
        meter.handle(message_value(i, 20))
    result = meter.result("x", "m")
    assert result["seen"] == 5
    assert result["checksum"] == 0 + 1 + 2 + 3 + 4
    assert result["rate"] is not None and result["rate"] > 0
    assert Meter(3).result("x", "m")["rate"] is None  # never reached count


def test_latency_percentiles_by_nearest_rank() -> None:
    summary = latency_summary([float(x) for x in range(1, 1001)])
    assert (summary["n"], summary["p50"], summary["p99"], summary["p999"]) == (1000, 500, 990, 999)
    assert latency_summary([])["p50"] is None


def _doc(rate_raw: float, rate_other: float) -> dict[str, Any]:
    machine = {"cores": 2, "memory_gib": 1.0, "python": "3.11", "confluent_kafka": "x",
               "librdkafka": "y", "broker": "b", "load_1m_at_start": 1.0}
    summary = {"repeats": 1, "ok": 1, "cpu_s_per_million": 1.0, "peak_rss_mib": 1.0, "count": 10}
    return {"started_utc": "now", "command": "cmd", "count": 10, "partitions": 8, "repeat": 1,
            "machine": machine, "slots": {"raw": {"label": "RAW"}, "other": {"label": "OTHER"}},
            "throughput": {"100": {"raw": {**summary, "rate": rate_raw},
                                   "other": {**summary, "rate": rate_other}}}}


def test_table_is_replaced_between_markers_only(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README_BEFORE)
    update_readme(readme, _doc(1000.0, 250.0))
    update_readme(readme, _doc(1000.0, 500.0))  # a second run replaces, never appends
    text = readme.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "stale table" not in text
    assert text.startswith("# Benchmarks\n\nhand-written intro\n\n") and text.endswith("\nfooter\n")
    assert "| OTHER | 100 B | 500 | 0.50 |" in text


@pytest.mark.broker
def test_harness_runs_the_raw_contender_end_to_end(broker: Broker, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README_BEFORE)
    code = runner.main([
        "--bootstrap", broker.bootstrap, "--contenders", "raw", "--count", "2000",
        "--sizes", "100", "--repeat", "1", "--latency-seconds", "0", "--no-charts",
        "--results", str(tmp_path), "--readme", str(readme), "--timeout", "60",
    ])
    assert code == 0
    doc = json.loads((tmp_path / "peers.json").read_text())
    assert set(doc) >= {"machine", "throughput", "slots", "count", "sizes", "repeat"}
    assert doc["machine"]["cores"] and doc["machine"]["librdkafka"]
    raw = doc["throughput"]["100"]["raw"]
    assert raw["ok"] == 1, raw
    assert raw["rate"] > 0 and raw["cpu_s_per_million"] > 0 and raw["peak_rss_mib"] > 10
    text = readme.read_text()
    assert "stale table" not in text and "hand-written intro" in text
    assert "| raw confluent-kafka loop (async commit per batch) | 100 B |" in text
    assert "| 1.00 |" in text  # the raw loop's ratio to itself
