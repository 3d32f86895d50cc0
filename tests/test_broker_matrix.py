"""The broker matrix of tests/conftest.py: which test runs on which broker, and how.

Collected in a child pytest (nothing runs, no broker starts), as a developer
would see it with ``pytest --collect-only``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test collects in a child pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    "tests/runtime/test_modes_broker.py",
    "tests/sinks/test_kafka_sink.py",
    "tests/broker/test_broker_process.py",
    "tests/runtime/test_retry_topic_broker.py",
]
MODES = "tests/runtime/test_modes_broker.py::"
SINK = "tests/sinks/test_kafka_sink.py::"


def collected(*options: str, extra_path: Path | None = None) -> set[str]:
    """The lines naming tests that a child pytest collecting :data:`MODULES` with
    ``options`` prints (``extra_path``: also importable, for a plugin)."""
    path = [str(ROOT), str(ROOT / "src"), *([str(extra_path)] if extra_path else [])]
    command = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, *options, *MODULES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_default_matrix() -> None:
    ids = collected()
    # a module marked brokers("tansu", "kafka"); group_protocol adds the KIP-848 twin
    sigkill = f"{MODES}test_exactly_once_kafka_to_kafka_across_sigkill"
    assert {f"{sigkill}[{k}]" for k in ("tansu", "kafka", "kafka-consumer")} <= ids
    assert f"{sigkill}[tansu-consumer]" not in ids
    # a test that asks for one kind only
    assert (
        f"{MODES}test_consumer_protocol_fences_a_new_member_with_a_member_id_in_use[kafka]" in ids
    )
    assert not any("member_id_in_use[tansu]" in i for i in ids)
    # kafka3 where a test asks for it
    assert f"{SINK}test_output_visible_to_read_committed_only_after_commit[kafka3]" in ids
    # an unmarked broker module runs on Tansu only by default
    retry = [i for i in ids if "test_retry_topic_broker.py::test_retries" in i]
    assert retry and all(i.endswith("[tansu]") for i in retry)


def test_kafka_full_adds_kafka_except_to_tests_of_the_bundled_broker() -> None:
    ids = collected("--kafka-full")
    retry = {i for i in ids if "test_retry_topic_broker.py::test_retries" in i}
    assert {i.rsplit("[", 1)[1] for i in retry} == {"tansu]", "kafka]"}
    process = "tests/broker/test_broker_process.py::"
    assert (
        f"{process}test_create_topic_is_idempotent_but_rejects_another_partition_count[kafka]"
        in ids
    )
    assert f"{process}test_start_on_a_given_port_and_reject_a_taken_one[tansu]" in ids
    assert f"{process}test_start_on_a_given_port_and_reject_a_taken_one[kafka]" not in ids


_PLUGIN = """
def pytest_collection_finish(session):
    for item in session.items:
        xfail = item.get_closest_marker("xfail")
        strict = xfail is not None and xfail.kwargs.get("strict") is True
        kafka = item.get_closest_marker("kafka") is not None
        print("MARKS", item.nodeid, "strict-xfail" if strict else "-", "kafka" if kafka else "-")
"""


def test_deviations_are_strict_xfails_on_tansu_only(tmp_path: Path) -> None:
    (tmp_path / "print_marks.py").write_text(_PLUGIN)
    ids = collected("-p", "print_marks", "-s", extra_path=tmp_path)
    marks = {
        line.split()[1]: tuple(line.split()[2:])
        for line in ids_lines(ids)
        if "test_commit_metadata_comes_back" in line or "joins_and_leaves" in line
    }
    assert marks[f"{SINK}test_commit_metadata_comes_back[tansu]"] == ("strict-xfail", "-")
    assert marks[f"{SINK}test_commit_metadata_comes_back[kafka]"] == ("-", "kafka")
    rebalance = f"{MODES}test_exactly_once_kafka_to_kafka_as_a_consumer_joins_and_leaves"
    assert marks[f"{rebalance}[tansu]"] == ("-", "-")
    assert marks[f"{rebalance}[kafka-consumer]"] == ("-", "kafka")
    on_kafka = collected("-m", "kafka")
    assert on_kafka and all("[kafka" in i for i in on_kafka)


def ids_lines(lines: set[str]) -> list[str]:
    return [line for line in lines if line.startswith("MARKS ")]
