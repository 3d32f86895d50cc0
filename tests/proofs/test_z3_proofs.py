"""The Z3 proofs: every lemma is proved, every mutant is caught, nothing is vacuous."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import z3

from htmqc.core.lifecycle import EDGES, Event, MessageState
from proofs import run, tracker
from proofs.obligation import Obligation, Outcome, discharge

pytestmark = pytest.mark.formal

# Building obligations is cheap; discharging them happens once, on first use.
EXPECTED = {ob.name: ob.expect for ob in run.all_obligations()}
LEMMAS = sorted(n for n, e in EXPECTED.items() if e == "PROVED")
MUTANTS = sorted(n for n, e in EXPECTED.items() if e == "COUNTEREXAMPLE")


@functools.cache
def outcomes() -> dict[str, Outcome]:
    return {o.name: o for o in run.run(run.all_obligations(), echo=False)}


@pytest.mark.parametrize("name", LEMMAS)
def test_lemma_is_proved(name: str) -> None:
    assert outcomes()[name].verdict == "PROVED", outcomes()[name].line()


@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_is_caught(name: str) -> None:
    outcome = outcomes()[name]
    assert outcome.verdict == "COUNTEREXAMPLE", outcome.line()
    assert outcome.model, "a counterexample names its values"


def test_every_edge_is_proved_in_both_forms() -> None:
    for event in Event:
        assert f"apply[{event.value}]" in LEMMAS
        assert f"apply_many[{event.value}]" in LEMMAS
    assert len(EDGES) == len(Event)


def test_the_required_mutants_are_in_the_run() -> None:
    assert "mutant:commit_requested_hands_out_next" in MUTANTS
    assert "mutant:fetched_no_advance_over_gap" in MUTANTS
    assert "mutant:late_ack_moves_committed_back" in MUTANTS


def test_a_wrong_edge_in_the_table_is_refuted() -> None:
    wrong = {**EDGES, Event.START: (MessageState.DEAD_LETTERED, MessageState.PROCESSING)}
    verdicts = {
        o.name: o.verdict for o in run.run(tracker.obligations(wrong), echo=False)
    }
    assert verdicts["apply[started]"] == "COUNTEREXAMPLE"
    assert verdicts["apply_many[started]"] == "COUNTEREXAMPLE"


def test_contradictory_premises_are_not_a_proof() -> None:
    x = z3.Int("x")
    outcome = discharge(Obligation("contradiction", [x > 1, x < 0], x == 5, "vacuous"))
    assert outcome.verdict == "VACUOUS"
    assert not outcome.ok


def test_main_writes_report_and_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lemma and a mutant are enough here: the full run is the tests above.
    chosen = {"init", "mutant:commit_requested_hands_out_next"}
    everything = run.all_obligations

    def subset() -> Iterator[Obligation]:
        return (o for o in everything() if o.name in chosen)

    monkeypatch.setattr(run, "all_obligations", subset)
    monkeypatch.chdir(tmp_path)
    assert run.main() == 0
    data = json.loads((tmp_path / run.REPORT).read_text())
    assert data["ok"] is True
    assert data["failures"] == []
    assert [o["verdict"] for o in data["obligations"]] == ["PROVED", "COUNTEREXAMPLE"]


def test_main_fails_when_a_mutant_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    x = z3.Int("x")
    survivor = Obligation("mutant:harmless", [x >= 0], x + 1 > 0, "not a bug", "COUNTEREXAMPLE")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "all_obligations", lambda: iter([survivor]))
    assert run.main() == 1
    assert "FAILED: mutant:harmless" in capsys.readouterr().out
