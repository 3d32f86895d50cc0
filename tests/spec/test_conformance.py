"""The conformance vectors: the core passes every one, and they are up to date."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from spec.conformance import generate, replay

FILES = replay.vector_files()


def test_there_are_vectors_for_every_scenario() -> None:
    stems = {p.stem for p in FILES}
    assert set(generate.SCENARIOS) <= stems
    assert {f"random_{s}" for s in generate.RANDOM_SEEDS} <= stems


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_core_conforms(path: Path) -> None:
    vector = replay.load(path)
    assert vector["steps"]
    assert list(replay.mismatches(vector)) == []


def test_committed_vectors_equal_a_fresh_generation(tmp_path: Path) -> None:
    assert generate.stale_files() == []
    (tmp_path / "extra.json").write_text("{}")
    assert "extra.json" in generate.stale_files(tmp_path)


def test_generation_is_deterministic() -> None:
    assert generate.vectors() == generate.vectors()


def test_the_vectors_cover_both_error_types() -> None:
    errors = {s.get("error") for p in FILES for s in replay.load(p)["steps"]}
    assert {"IllegalTransition", "OffsetOrderError"} <= errors


def test_replay_detects_a_wrong_expected_state() -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / "out_of_order_completion.json"))
    last = vector["steps"][-1]
    last["state"]["orders/0"]["processed"] += 1
    problems = list(replay.mismatches(vector))
    assert len(problems) == 1
    assert "state" in problems[0]


def test_replay_detects_a_wrong_answer_and_a_missing_error() -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / "illegal_events.json"))
    first_error = next(i for i, s in enumerate(vector["steps"]) if "error" in s)
    vector["steps"][first_error]["error"] = "IllegalTransition"
    answered = next(i for i, s in enumerate(vector["steps"]) if "result" in s)
    vector["steps"][answered]["result"] = 99
    problems = list(replay.mismatches(vector))
    assert any("raised OffsetOrderError" in p for p in problems)
    assert any("answered 1; expected 99" in p for p in problems)
