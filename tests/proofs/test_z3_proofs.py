"""The Z3 proofs: every lemma is proved, every mutant is caught, nothing is vacuous."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import z3

import proofs
from htmqc.core.lifecycle import EDGES, Event, MessageState
from proofs import differential, model, obligation, run, tracker
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
    monkeypatch.setattr(run, "DIFFERENTIAL", lambda: differential.check(differential.Domain(top=1)))
    monkeypatch.chdir(tmp_path)
    assert run.main() == 0
    data = json.loads((tmp_path / run.REPORT).read_text())
    assert data["ok"] is True
    assert data["failures"] == []
    assert data["differential"]["disagreement"] is None
    assert data["differential"]["states"] > 100
    assert [o["verdict"] for o in data["obligations"]] == ["PROVED", "COUNTEREXAMPLE"]


def test_main_fails_when_a_mutant_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    x = z3.Int("x")
    survivor = Obligation("mutant:harmless", [x >= 0], x + 1 > 0, "not a bug", "COUNTEREXAMPLE")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "all_obligations", lambda: iter([survivor]))
    monkeypatch.setattr(run, "DIFFERENTIAL", lambda: differential.check(differential.Domain(top=1)))
    assert run.main() == 1
    assert "FAILED: mutant:harmless" in capsys.readouterr().out


@pytest.mark.parametrize("mutant,broken", tracker.MUTANTS, ids=lambda m: getattr(m, "name", ""))
def test_a_mutant_breaks_the_invariant_it_is_there_for(
    mutant: model.Transition, broken: str
) -> None:
    outcome = outcomes()[mutant.name]
    assert outcome.verdict == "COUNTEREXAMPLE", outcome.line()
    assert broken in outcome.model.split("; breaks ")[1].split(", "), outcome.line()


def test_the_readme_lists_every_invariant_and_mutant() -> None:
    readme = (Path(proofs.__file__).parent / "README.md").read_text()
    for i in model.INVARIANTS:
        assert f"| `{i.name}` | {i.group} | {i.doc} |" in readme, i.name
    for mutant, broken in tracker.MUTANTS:
        what = mutant.doc.removeprefix("MUTANT: ")
        assert f"| `{mutant.name}` | {what} | `{broken.rstrip(chr(39))}` |" in readme, mutant.name


def test_instantiated_premises_prove_only_what_follows() -> None:
    # The fallback when model-based instantiation times out: universals become
    # their instances at the problem's constants, an existential a fresh constant.
    a, b = (z3.Array(n, z3.IntSort(), z3.BoolSort()) for n in "ab")
    o, c = z3.Ints("o c")
    implies = z3.ForAll([o], z3.Implies(a[o], b[o]))
    follows = obligation._instantiated([implies, a[c]], z3.Not(b[c]))
    assert z3.Solver().check(*follows) == z3.unsat
    everywhere = z3.ForAll([o], b[o])
    does_not = obligation._instantiated([implies, a[c]], z3.Not(everywhere))
    assert z3.Solver().check(*does_not) == z3.sat
