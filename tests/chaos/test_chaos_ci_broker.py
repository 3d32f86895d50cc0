"""The CI-size chaos run (issue 6 acceptance): 100,000 messages, 4 partitions,
2 consumers, 10 faults of every family (seed 20: a kill, a zombie, network
delay/drop/reset, sink slowdown and errors, handler errors, poison messages),
under 5 minutes: nothing lost, nothing duplicated, no order violation, no
backward commit, no fenced write, every trace valid. The JSON report is
written to the test's temporary directory and its summary printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from htmqc.chaos.harness import ChaosConfig, run_chaos
from tests.services import postgres_url

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_ci_size_chaos_run(tmp_path: Path, broker_kind: str) -> None:
    url = postgres_url()
    config = ChaosConfig(
        broker=broker_kind,
        seed=20,
        partitions=4,
        consumers=2,
        messages=100_000,
        faults=10,
        pg_url=url,
        produce_seconds=40.0,
        timeout=250.0,
        trace_dir=tmp_path / "traces",
        work_dir=tmp_path / "work",
        progress=False,
    )
    result = run_chaos(config)
    report = result.to_json()
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    print(result.summary())
    kinds = {i["kind"] for i in result.injected}
    assert len(result.injected) >= 5
    assert {"kill", "zombie", "poison"} <= kinds and len(kinds) >= 6
    assert result.completed, result.summary()
    counts = result.audit.counts
    assert counts["lost"] == 0 and counts["duplicate"] == 0 and counts["order-violation"] == 0
    assert result.ok, result.summary()
    assert result.audit.totals["effects"] + result.audit.totals["dlq"] == 100_000
    assert result.traces and all(t["ok"] for t in result.traces)
    assert result.wall_seconds < 300
