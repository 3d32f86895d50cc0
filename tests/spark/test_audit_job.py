"""The Spark audit job agrees with the single-process checker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from htmqc.audit import ANOMALIES, Effect, Produced, audit
from htmqc.audit.model import AuditReport
from htmqc.cli import main
from htmqc.spark.audit_job import audit_files, audit_records
from tests.audit.files import write_scenario
from tests.audit.scenario import EXPECTED_EXAMPLE, Scenario, clean, combined

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def both(spark: Any, s: Scenario) -> tuple[AuditReport, AuditReport]:
    kwargs = {"dlq": s.dlq, "committed": s.committed, "aborted": s.aborted}
    return audit(s.produced, s.effects, **kwargs), audit_records(
        spark, s.produced, s.effects, **kwargs
    )


def comparable(report: AuditReport) -> dict[str, Any]:
    data = report.to_json()
    del data["engine"]
    return data


def test_clean_run_agrees(spark: Any) -> None:
    local, distributed = both(spark, clean())
    assert distributed.ok
    assert comparable(local) == comparable(distributed)


def test_every_anomaly_agrees(spark: Any) -> None:
    local, distributed = both(spark, combined())
    assert distributed.counts == dict.fromkeys(ANOMALIES, 1)
    assert distributed.to_json()["examples"] == {a: [EXPECTED_EXAMPLE[a]] for a in ANOMALIES}
    assert comparable(local) == comparable(distributed)


def test_files_agree_and_cli_spark_exit_code(spark: Any, tmp_path: Path) -> None:
    paths = write_scenario(combined(), tmp_path)
    names = {k: str(paths[k]) for k in ("produced", "dlq", "committed", "aborted")}
    from_jsonl = audit_files(spark, effects=str(paths["effects"]), **names)
    from_sqlite = audit_files(
        spark, effects=f"sqlite:///{paths['sqlite']}?generation=fence", **names
    )
    assert comparable(from_jsonl) == comparable(from_sqlite)
    assert from_jsonl.counts == dict.fromkeys(ANOMALIES, 1)
    args = ["audit", "--spark", "--produced", names["produced"], "--effects", names["produced"]]
    # produced ids stored as effects once each: a clean audit (the session is reused).
    assert main(args) == 0


def test_edge_cases_agree(spark: Any) -> None:
    produced = [Produced(str(i), "k", 0, i) for i in range(4)]
    cases = [
        # a replayed duplicate is not also an order violation
        Scenario(produced, [Effect("0"), Effect("1"), Effect("2"), Effect("1"), Effect("3")]),
        # fields come from the produced record; order is per key
        Scenario(
            [*produced, Produced("9", "other", 0, 9)],
            [Effect("9"), Effect("2"), Effect("0"), Effect("1"), Effect("3")],
        ),
        # generations: only a lower one after a higher one is fenced
        Scenario(
            produced,
            [
                Effect("0", generation=1),
                Effect("1", generation=3),
                Effect("2", generation=2),
                Effect("3", generation=3),
            ],
        ),
    ]
    expected = [{"duplicate": 1}, {"order-violation": 2}, {"fenced-write": 1}]
    for s, want in zip(cases, expected, strict=True):
        local, distributed = both(spark, s)
        assert {k: v for k, v in distributed.counts.items() if v} == want
        assert comparable(local) == comparable(distributed)
