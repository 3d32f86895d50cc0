"""Tests of the peer benchmark harness (``python -m benchmarks.peers``).

Unit tests: the meter (effects store, commit-time latency, the SIGKILL point),
the presets (full by default, ``--quick``), the goals check, the README table
and the charts. The broker test runs the whole harness at tiny size with the
contenders the main venv has (the raw loop, htmqc exactly-once into SQLite)
and checks every measure's shape; the SIGKILL test is in ``test_peers_kill.py``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.charts import write_charts
from benchmarks.peers import kill, runner
from benchmarks.peers.common import Meter, latency_point, latency_summary, parse_id
from benchmarks.peers.table import BEGIN, END, markers, render, update_readme
from htmqc.audit import Effect
from htmqc.audit.load import effects_from_sqlite
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


def test_handler_latency_ends_at_the_handler_commit_latency_at_the_commit() -> None:
    now_ms = time.time() * 1000.0
    handler = Meter(10, latency="handler")
    handler.handle(message_value(0, 20), now_ms - 5_000)  # the first: sets the window start
    handler.handle(message_value(1, 20), now_ms + 1_000)  # produced "after": counted
    assert len(handler.latencies_ms) == 1
    commit = Meter(10, latency="commit")
    commit.handle(message_value(0, 20), now_ms - 5_000)
    soon = time.time() * 1000.0 + 1.0  # "produced" after the first message arrived
    commit.handle(message_value(1, 20), soon)
    commit.handle(message_value(2, 20), soon)
    assert commit.latencies_ms == []  # nothing is visible before the commit
    time.sleep(0.05)
    commit.committed()
    assert len(commit.latencies_ms) == 2 and min(commit.latencies_ms) >= 40.0
    commit.committed()  # an empty commit adds nothing
    result = commit.result("x", "exactly-once")
    assert result["latency_at"] == "commit" and result["latency_ms"]["n"] == 2
    assert result["latency_samples_ms"] == sorted(result["latency_samples_ms"])
    assert (latency_point("exactly-once-kafka"), latency_point("at-least-once")) == (
        "commit", "handler")
    with pytest.raises(ValueError, match="latency"):
        Meter(1, latency="sometimes")


def test_meter_stores_one_effect_row_per_call(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    meter = Meter(3, store=str(db))
    for i in (4, 5, 4):
        meter.handle(message_value(i, 20), None, b"k1", 2, 10 + i)
    meter.result("x", "m")
    effects = list(effects_from_sqlite(db))
    assert [(e.id, e.key, e.partition, e.offset) for e in effects] == [
        ("4", "k1", 2, 14), ("5", "k1", 2, 15), ("4", "k1", 2, 14)]


@pytest.mark.slow  # a child process is killed
def test_meter_kills_its_process_right_after_the_kill_at_th_call(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    code = (
        "from benchmarks.peers.common import Meter\n"
        "from htmqc.produce import message_value\n"
        f"m = Meter(10, store={str(db)!r}, kill_at=3)\n"
        "for i in range(10):\n"
        "    m.handle(message_value(i, 20))\n"
        "print('survived')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False, env=runner._env())
    assert done.returncode == -9 and "survived" not in done.stdout
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM effects").fetchone() == (3,)


def test_journal_tells_which_ids_were_in_the_open_transaction(tmp_path: Path) -> None:
    journal = tmp_path / "journal.txt"
    meter = Meter(10, journal=str(journal))
    for i in (1, 2):
        meter.handle(message_value(i, 20))
    meter.committed()
    for i in (3, 4):
        meter.handle(message_value(i, 20))
    meter.close()
    assert journal.read_text().split() == ["1", "2", "C", "3", "4"]
    assert kill.open_transaction_ids(journal) == ["3", "4"]
    assert kill.open_transaction_ids(tmp_path / "missing.txt") == []


def test_hide_aborted_drops_one_copy_of_open_ids_stored_twice() -> None:
    served = [Effect("3"), Effect("1"), Effect("3"), Effect("4"), Effect("5"), Effect("5")]
    kept, dropped = kill.hide_aborted(served, ["3", "4"])
    # "3": the aborted copy goes; "4": stored once (never reached the broker), kept;
    # "5": not in the open transaction, a real duplicate, kept
    assert (kept, dropped) == ([Effect("1"), Effect("3"), Effect("4"), Effect("5"),
                                Effect("5")], 1)
    figures = kill.audit_effects(6, kept)
    assert (figures["duplicates"], figures["extra_effects"], figures["lost"]) == (1, 1, 2)
    assert figures["anomalies"] == {"lost": 2, "duplicate": 1} and not figures["audit_ok"]


def test_presets_full_by_default_quick_on_request_explicit_values_win() -> None:
    full = runner.parse_args([])
    assert (full.count, full.repeat, full.sizes) == (1_000_000, 3, [100, 1024])
    assert full.latency_seconds > 0 and not full.no_kill and full.kill_count >= 10_000
    quick = runner.parse_args(["--quick"])
    assert quick.count < 100_000 and quick.repeat == 1 and quick.kill_count < full.kill_count
    assert runner.parse_args(["--quick", "--count", "777"]).count == 777
    assert runner.parse_args(["--kill"]).no_kill is False  # the old flag still parses
    with pytest.raises(SystemExit):
        runner.parse_args(["--kill", "--no-kill"])


def _goal_doc(alo: float, kk: float, kk_dups: int) -> dict[str, Any]:
    rates = {"raw": 1000.0, "htmqc_alo": alo, "quix_kk": 100.0, "htmqc_kk": kk}
    return {"throughput": {"100": {k: {"rate": v} for k, v in rates.items()}},
            "duplicates_after_kill": {"htmqc_kk": {"duplicates": kk_dups, "lost": 0}}}


def test_goals_check_against_the_issue_thresholds() -> None:
    met = runner.goals(_goal_doc(alo=850.0, kk=200.0, kk_dups=0))
    assert met["100"] == {"kk_vs_quix": 2.0, "kk_vs_quix_met": True,
                          "alo_vs_raw": 0.85, "alo_vs_raw_met": True}
    assert met["kk_duplicates_met"] is True
    missed = runner.goals(_goal_doc(alo=849.0, kk=199.0, kk_dups=1))
    assert missed["100"]["kk_vs_quix_met"] is False and missed["100"]["alo_vs_raw_met"] is False
    assert missed["kk_duplicates_met"] is False
    text = runner.goals_text(missed)
    assert "1.99x" in text and "85%" in text and "MISSED" in text
    on_kafka = runner.goals(_goal_doc(alo=899.0, kk=200.0, kk_dups=0), "kafka")
    assert on_kafka["issue"] == "issue 17" and on_kafka["100"]["alo_vs_raw_met"] is False
    assert "90%" in runner.goals_text(on_kafka)
    unmeasured = runner.goals({"throughput": {"100": {"raw": {"rate": 1.0}}}})
    assert unmeasured["100"]["kk_vs_quix"] is None and "kk_duplicates" not in unmeasured
    assert "not measured" in runner.goals_text(unmeasured)


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


def test_each_broker_has_its_own_table(tmp_path: Path) -> None:
    """A run on Kafka fills its own block and leaves Tansu's alone, and back."""
    readme = tmp_path / "README.md"
    readme.write_text(README_BEFORE)
    update_readme(readme, _doc(1000.0, 250.0))
    update_readme(readme, _doc(1000.0, 500.0), "kafka")
    begin, end = markers("kafka")
    text = readme.read_text()
    assert (begin, end) != (BEGIN, END)
    tansu = text.split(BEGIN, 1)[1].split(END, 1)[0]
    kafka = text.split(begin, 1)[1].split(end, 1)[0]
    assert "| OTHER | 100 B | 250 | 0.25 |" in tansu and "| OTHER | 100 B | 500 | 0.50 |" in kafka
    update_readme(readme, _doc(1000.0, 750.0))
    again = readme.read_text()
    assert again.count(begin) == 1 and kafka in again and "| 750 |" not in kafka


def _full_doc() -> dict[str, Any]:
    doc = _doc(1000.0, 500.0)
    doc["latency"] = {"other": {"offered_rate": 2000.0, "seconds": 3.0, "achieved_rate": 1990,
                                "ends_at": "commit", "samples_ms": [1.0, 2.0, 40.0],
                                "latency_ms": {"n": 3, "p50": 2.0, "p99": 40.0, "p999": 40.0,
                                               "max": 40.0}}}
    doc["duplicates_after_kill"] = {
        "raw": {"count": 100, "killed_after": 50, "store": "SQLite effects table",
                "restart_handled": 60, "effects": 110, "duplicates": 10, "extra_effects": 10,
                "lost": 0, "anomalies": {"duplicate": 10}, "audit_ok": False},
        "other": {"count": 100, "error": "run 2 exited with 1: boom"}}
    doc["goals"] = {"100": {"kk_vs_quix": None, "kk_vs_quix_met": None, "alo_vs_raw": 0.5,
                            "alo_vs_raw_met": False}}
    return doc


def test_table_shows_latency_kill_audit_and_goals() -> None:
    text = render(_full_doc())
    assert "| OTHER | commit | 3 | 2.0 | 40.0 | 40.0 | 40.0 | 1,990 |" in text
    row = "| RAW | SQLite effects table | 100 | 50 | 60 | 110 | 10 | 10 | 0 | duplicate 10 |"
    assert row in text
    assert "| OTHER | — | 100 | not measured: run 2 exited with 1: boom |" in text
    assert "at-least-once = 50% of the raw loop (goal ≥ 85%: **missed**)" in text


def test_charts_are_written_as_png(tmp_path: Path) -> None:
    written = write_charts(_full_doc(), tmp_path)
    assert [p.name for p in written] == ["peers_throughput.png", "peers_latency_cdf.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kafka = write_charts(_full_doc(), tmp_path, "-kafka")
    assert [p.name for p in kafka] == ["peers_throughput-kafka.png", "peers_latency_cdf-kafka.png"]


@pytest.mark.broker
def test_harness_measures_throughput_resources_and_latency(broker: Broker, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README_BEFORE)
    code = runner.main([
        "--bootstrap", broker.bootstrap, "--contenders", "raw,htmqc_eo,htmqc_alo_ll",
        "--count", "2000",
        "--sizes", "100", "--repeat", "1", "--latency-rate", "1000", "--latency-seconds", "5",
        "--no-kill", "--results", str(tmp_path), "--readme", str(readme), "--timeout", "60",
    ])
    assert code == 0
    doc = json.loads((tmp_path / "peers.json").read_text())
    assert set(doc) >= {"machine", "throughput", "slots", "count", "sizes", "repeat", "latency",
                        "goals", "charts"}
    assert doc["machine"]["cores"] and doc["machine"]["librdkafka"]
    for key in ("raw", "htmqc_eo", "htmqc_alo_ll"):
        run = doc["throughput"]["100"][key]
        assert run["ok"] == 1, run
        assert run["rate"] > 0 and run["cpu_s_per_million"] > 0 and run["peak_rss_mib"] > 10
        assert run["cpu_s_process"] > 0
        lat = doc["latency"][key]
        assert lat["ends_at"] == ("commit" if key == "htmqc_eo" else "handler")
        assert lat["latency_ms"]["n"] > 500, lat["latency_ms"]  # the paced run was measured
        assert 0 < lat["latency_ms"]["p50"] <= lat["latency_ms"]["p99"] <= lat["latency_ms"][
            "p999"] <= lat["latency_ms"]["max"]
        assert lat["samples_ms"]
        assert lat["assigned_first"], "latency measured before the group owned the partitions"
    assert doc["goals"]["100"]["alo_vs_raw"] is None  # htmqc_alo did not run
    assert sorted(doc["charts"]) == ["peers_latency_cdf.png", "peers_throughput.png"]
    assert (tmp_path / "peers_latency_cdf.png").exists()
    text = readme.read_text()
    assert "stale table" not in text and "hand-written intro" in text
    assert "| raw confluent-kafka loop (async commit per batch) | 100 B |" in text
    assert "| 1.00 |" in text  # the raw loop's ratio to itself
    assert "| htmqc exactly-once into SQLite | commit |" in text
