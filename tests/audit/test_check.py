"""The single-process checker: each anomaly on a doctored run, and the clean run."""

from __future__ import annotations

import pytest

from htmqc.audit import ANOMALIES, AuditReport, DlqEntry, Effect, Produced, audit
from tests.audit.scenario import DOCTORINGS, EXPECTED_EXAMPLE, Scenario, clean, combined


def run(s: Scenario, limit: int = 10) -> AuditReport:
    return audit(
        iter(s.produced),
        iter(s.effects),
        dlq=iter(s.dlq),
        committed=iter(s.committed),
        aborted=iter(s.aborted),
        limit=limit,
    )


def test_clean_run_is_ok() -> None:
    report = run(clean())
    assert report.ok
    assert report.counts == dict.fromkeys(ANOMALIES, 0)
    assert report.totals["effects"] == 8
    assert "OK" in report.summary()


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_each_doctoring_yields_exactly_its_anomaly(anomaly: str) -> None:
    report = run(DOCTORINGS[anomaly](clean()))
    assert not report.ok
    assert report.counts == {a: int(a == anomaly) for a in ANOMALIES}
    assert report.examples[anomaly] == [EXPECTED_EXAMPLE[anomaly]]
    assert anomaly in report.summary()


def test_all_doctorings_together() -> None:
    report = run(combined())
    assert report.counts == dict.fromkeys(ANOMALIES, 1)
    assert report.to_json()["examples"] == {a: [EXPECTED_EXAMPLE[a]] for a in ANOMALIES}


def test_examples_are_capped_but_counts_are_not() -> None:
    s = clean()
    report = audit(s.produced, [], limit=3)
    assert report.counts["lost"] == 8
    assert len(report.examples["lost"]) == 3


def test_order_is_per_key_and_partition() -> None:
    # k0 and k1 interleave freely; only order within one key matters.
    produced = [Produced(str(i), f"k{i % 2}", 0, i) for i in range(4)]
    effects = [Effect("1"), Effect("3"), Effect("0"), Effect("2")]
    assert audit(produced, effects).ok


def test_a_replayed_duplicate_is_not_also_an_order_violation() -> None:
    produced = [Produced(str(i), "k", 0, i) for i in range(3)]
    effects = [Effect("0"), Effect("1"), Effect("2"), Effect("1")]
    report = audit(produced, effects)
    assert report.counts["duplicate"] == 1
    assert report.counts["order-violation"] == 0


def test_effect_fields_default_to_the_produced_record() -> None:
    # The effect rows carry only ids; key/partition/offset come from production.
    produced = [Produced(str(i), "k", 0, i) for i in range(3)]
    report = audit(produced, [Effect("2"), Effect("0"), Effect("1")])
    assert report.counts["order-violation"] == 2


@pytest.mark.parametrize(
    "ids",
    [
        ["7", "8", "9", "10", "11"],  # canonical integers
        ["07", "08", "09", "10", "11"],  # zero-padded to one width
        ["a", "b", "c", "d", "e"],  # strings
        ["1", "02", "3", "x", "5"],  # mixed: falls back to strings
        ["1", "1000000", "5", "3", "9"],  # sparse integers
    ],
)
def test_id_formats_are_matched_exactly(ids: list[str]) -> None:
    produced = [Produced(i) for i in ids]
    stored = [Effect(i) for i in ids[1:]]
    # Near-misses of a produced id are other ids, never the produced one.
    near = [Effect(n) for n in ("007", "0", "7 ", "-1", "x1")]
    report = audit(produced, stored + near)
    assert report.examples["lost"] == [{"id": ids[0], "key": None, "partition": None,
                                        "offset": None}]
    assert {e["id"] for e in report.examples["unexpected"]} == {"007", "0", "7 ", "-1", "x1"}


def test_a_repeated_produced_id_counts_once() -> None:
    for ids in (["1", "2", "2"], ["a", "b", "b"], ["1", "900", "900"]):
        report = audit([Produced(i) for i in ids], [Effect(ids[0]), Effect(ids[1])])
        assert report.ok, ids
        assert report.totals["produced"] == 3


def test_dead_lettered_or_aborted_ids_without_effect_are_not_lost() -> None:
    produced = [Produced(str(i)) for i in range(3)]
    report = audit(produced, [Effect("0")], dlq=[DlqEntry("1", "poison")], aborted=["2"])
    assert report.ok, report.counts


def test_an_aborted_id_missing_from_the_produced_list_is_an_aborted_read_only() -> None:
    report = audit([Produced("1")], [Effect("1"), Effect("77")], aborted=["77"])
    assert report.counts == {a: int(a == "aborted-read") for a in ANOMALIES}
