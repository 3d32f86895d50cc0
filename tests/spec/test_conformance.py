"""The conformance vectors: the core passes every one, they are up to date, they
exercise the whole API (core, gate, failure decision, breaker), and the replay
compares everything a step says."""

from __future__ import annotations

import copy
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.core import ConsumerCore, DeadLetterKind
from htmqc.core.breaker import Breaker, BreakerEvent, BreakerState
from htmqc.core.gate import Gate
from spec.conformance import breaker, failures, gate, generate, replay

FILES = replay.vector_files()


def test_there_are_vectors_for_every_scenario() -> None:
    stems = {p.stem for p in FILES}
    assert set(generate.SCENARIOS) <= stems
    assert {f"random_{s}" for s in generate.RANDOM_SEEDS} <= stems
    for kind in (gate, failures, breaker):
        assert set(kind.SCENARIOS) <= stems
        assert {f"{kind.KIND}_random_{s}" for s in kind.RANDOM_SEEDS} <= stems


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [v for v in map(replay.load, FILES) if v.get("kind") == kind]


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


def test_every_vector_says_in_one_line_what_it_pins() -> None:
    for path in FILES:
        description = replay.load(path)["description"]
        assert description and "\n" not in description, path.stem


def test_the_vectors_exercise_every_event_of_the_api() -> None:
    views = {"partitions", "tracker", "epoch", "snapshot", "commits"}
    api = {name for name in dir(ConsumerCore) if not name.startswith("_")} - views
    vectors = [replay.load(path) for path in FILES]
    ops = {step["op"] for v in vectors if "kind" not in v for step in v["steps"]}
    assert ops == api
    gate_views = {"state", "fetching", "partitions", "paused", "holds", "snapshot", "fence_grace"}
    gate_api = {name for name in dir(Gate) if not name.startswith("_")} - gate_views
    gate_ops = {step["op"] for v in vectors if v.get("kind") == "gate" for step in v["steps"]}
    assert gate_ops == gate_api
    breaker_views = {"state", "closed", "fetch_paused", "allowance", "held_for",
                     "window_counts", "snapshot", "policy", "reason", "error_class", "trips"}
    breaker_api = {name for name in dir(Breaker) if not name.startswith("_")} - breaker_views
    breaker_ops = {s["op"] for v in vectors if v.get("kind") == "breaker" for s in v["steps"]}
    assert breaker_ops == breaker_api
    assert {s["op"] for v in _of_kind("failures") for s in v["steps"]} == {"decide"}


def test_the_failure_vectors_meet_every_row_of_the_rule_table() -> None:
    rows = {
        failures._row(s["result"], s["args"]["held_for"] is not None)
        for v in _of_kind("failures") for s in v["steps"]
    }
    assert rows == set(failures.ROWS) == {k.value for k in DeadLetterKind} | {
        "hold", "hand_off", "retry"}


def test_the_breaker_vectors_meet_every_event_state_and_refusal() -> None:
    steps = [s for v in _of_kind("breaker") for s in v["steps"]]
    assert {s.get("result") for s in steps} >= {e.value for e in BreakerEvent}
    assert {s["state"]["state"] for s in steps} == {b.value for b in BreakerState}
    assert {s["state"]["reason"] for s in steps} == {"", "consecutive", "failure_rate"}
    assert "IllegalTransition" in {s.get("error") for s in steps}


def test_a_failures_step_has_no_state_and_a_state_is_a_mismatch() -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / "failures_budget.json"))
    assert all(set(s) == {"op", "args", "result"} for s in vector["steps"])
    vector["steps"][0]["state"] = {}
    problems = list(replay.mismatches(vector))
    assert len(problems) == 1 and "carries a state" in problems[0]


def test_replay_refuses_an_unknown_kind() -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / "failures_budget.json"))
    vector["kind"] = "flow"
    assert list(replay.mismatches(vector)) == [
        "failures_budget: kind 'flow'; this replay reads core, gate, failures, breaker"]


@pytest.mark.parametrize(
    ("name", "index", "change"),
    [
        ("gate_fence_and_reclaim", 6, lambda s: s.update(result=[])),
        ("gate_assign_and_holds", 1, lambda s: s["result"][0]["tps"].reverse()),
        ("gate_retry_wait", 2, lambda s: s["state"]["partitions"]["t.retry/0"].update(until=51.0)),
        ("failures_backoff_bits", 0, lambda s: s["result"].update(
            at=math.nextafter(s["result"]["at"], math.inf))),
        ("failures_retry_topic", 3, lambda s: s["result"].update(attempt=4)),
        ("failures_retry_topic", 3, lambda s: s["result"].update(topic="orders")),
        ("failures_breaker_hold", 1, lambda s: s["result"].update(at=1000.05)),
        ("failures_too_large_first", 1, lambda s: s["result"].update(kind="poison")),
        ("failures_echo", 0, lambda s: s["result"].update(offset=2**63 - 2)),
        ("breaker_streak_trip", 11, lambda s: s.update(result=None)),
        ("breaker_streak_trip", 3, lambda s: s["state"].update(streak=1)),
        ("breaker_window_buckets", 7, lambda s: s["state"].update(window_calls=2)),
        ("breaker_open_time_bits", 2, lambda s: s["state"].update(held_for=0.6)),
        ("breaker_probe_backoff", 13, lambda s: s["state"].update(backoff=8.0)),
        ("breaker_refused_and_ignored", 0, lambda s: s.update(result=s.pop("error") and None)),
        ("breaker_probe_backoff", 9, lambda s: s["state"].update(error_class="db.Down")),
    ],
)
def test_a_changed_gate_failures_or_breaker_step_is_a_mismatch(
    name: str, index: int, change: Callable[[dict[str, Any]], None]
) -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / f"{name}.json"))
    assert list(replay.mismatches(vector)) == []
    change(vector["steps"][index])
    assert list(replay.mismatches(vector))


def _first_step(name: str, decision: str) -> tuple[dict[str, Any], dict[str, Any]]:
    vector = copy.deepcopy(replay.load(replay.VECTORS / f"{name}.json"))
    step = next(
        s for s in vector["steps"] if isinstance(s.get("result"), dict)
        and s["result"]["type"] == decision
    )
    return vector, step


@pytest.mark.parametrize(
    ("name", "decision", "field", "change"),
    [
        ("finished_above_contents", "Commit", "finished_above", lambda v: v[:-1]),
        ("finished_above_contents", "Commit", "epoch", lambda v: v + 1),
        ("finished_above_contents", "Commit", "tp", lambda v: v + "0"),
        ("backoff_and_jitter", "RetryAt", "at", lambda v: math.nextafter(v, math.inf)),
        ("backoff_and_jitter", "RetryAt", "attempt", lambda v: v + 1),
        ("retries_max_1", "DeadLetter", "attempts", lambda v: v + 1),
        ("retries_max_1", "DeadLetter", "kind", lambda v: {"failed": "permanent"}.get(v, "failed")),
    ],
)
def test_replay_compares_every_field_of_a_decision(
    name: str, decision: str, field: str, change: Any
) -> None:
    vector, step = _first_step(name, decision)
    step["result"][field] = change(step["result"][field])
    problems = list(replay.mismatches(vector))
    assert len(problems) == 1
    assert f"expected {step['result']!r}" in problems[0]


def test_replay_refuses_another_format() -> None:
    vector = copy.deepcopy(replay.load(FILES[0]))
    vector["format"] = 1
    assert list(replay.mismatches(vector)) == [f"{vector['name']}: format 1; this replay reads 2"]


def test_main_prints_one_line_per_vector(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(FILES) + 1
    assert lines[-1] == f"{len(FILES)} vectors conform"


def test_main_stops_at_the_first_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a_wrong", "b_wrong", "c_right"):
        shutil.copy(replay.VECTORS / "happy_path.json", tmp_path / f"{name}.json")
    for name in ("a_wrong", "b_wrong"):
        vector = replay.load(tmp_path / f"{name}.json")
        vector["steps"][0]["result"] = 7
        (tmp_path / f"{name}.json").write_text(generate.dumps(vector))
    assert replay.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("FAIL  a_wrong: ")
    assert replay.main(["--keep-going", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["FAIL", "FAIL", "ok", "2"]


def test_main_names_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    (tmp_path / "broken.json").write_text("{")
    assert replay.main([str(tmp_path / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "broken.json is not a JSON vector" in err


def test_replay_detects_a_wrong_answer_and_a_missing_error() -> None:
    vector = copy.deepcopy(replay.load(replay.VECTORS / "illegal_events.json"))
    first_error = next(i for i, s in enumerate(vector["steps"]) if "error" in s)
    vector["steps"][first_error]["error"] = "IllegalTransition"
    answered = next(i for i, s in enumerate(vector["steps"]) if "result" in s)
    vector["steps"][answered]["result"] = 99
    problems = list(replay.mismatches(vector))
    assert any("raised OffsetOrderError" in p for p in problems)
    assert any("answered 1; expected 99" in p for p in problems)
