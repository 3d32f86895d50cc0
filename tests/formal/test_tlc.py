"""The TLC runner and gate: the small models, expected failures, trace parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_checks import tlc, tlc_cli

pytestmark = pytest.mark.formal

# A transcript in TLC's -tool format: two states, y does not change, and a
# value that spans several lines.
TRANSCRIPT = """\
@!@!@STARTMSG 2110:1 @!@!@
Invariant Small is violated.
@!@!@ENDMSG 2110 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
1: <Initial predicate>
/\\ x = 0
/\\ y = [ a |-> 1,
      b |-> 2 ]

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
2: <Next line 13, col 12 to line 13, col 45 of module Counter>
/\\ x = 1
/\\ y = [ a |-> 1,
      b |-> 2 ]

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2199:0 @!@!@
3 states generated, 2 distinct states found, 0 states left on queue.
@!@!@ENDMSG 2199 @!@!@
@!@!@STARTMSG 2194:0 @!@!@
The depth of the complete state graph search is 2.
@!@!@ENDMSG 2194 @!@!@
"""


def coverage_message(text: str) -> str:
    """One action-coverage message of TLC's -tool output."""
    return f"@!@!@STARTMSG 2772:0 @!@!@\n{text}\n@!@!@ENDMSG 2772 @!@!@\n"


# Two cumulative reports (the last one counts) and an action that never fired.
COVERAGE = "".join(
    coverage_message(text)
    for text in [
        "<Assign line 160, col 1 to line 160, col 12 of module Consumer>: 3:5",
        "<Fetched line 222, col 1 to line 222, col 13 of module Consumer (224 5 232 38)>: 0:0",
        "<Assign line 160, col 1 to line 160, col 12 of module Consumer>: 4:9",
        "<Fetched line 222, col 1 to line 222, col 13 of module Consumer (224 5 232 38)>: 1:2",
        "<Crashed line 199, col 1 to line 199, col 10 of module Consumer>: 0:0",
    ]
)


def test_parse_output_reads_the_last_coverage_report() -> None:
    assert tlc.parse_output(COVERAGE)["coverage"] == {"Assign": 9, "Fetched": 2, "Crashed": 0}


def _passing(coverage: dict[str, int]) -> tlc.TlcResult:
    return tlc.TlcResult(
        model="m", module="M.tla", config="m.cfg", passed=True, exit_code=0, violated=None,
        distinct_states=11, states_generated=20, depth=3, seconds=1.0, coverage=coverage,
    )


@pytest.mark.parametrize(
    ("idle", "coverage", "reason"),
    [
        ([], {"Assign": 3, "Crashed": 0}, "actions never fire: Crashed"),
        (["Crashed"], {"Assign": 3, "Crashed": 2}, "actions listed idle fire: Crashed"),
        (["Crash"], {"Assign": 3, "Crashed": 0}, "unknown idle actions Crash"),
        ([], {}, "no action coverage"),
    ],
    ids=["silent", "idle-fires", "unknown-idle", "none"],
)
def test_gate_requires_every_action_to_fire(
    idle: list[str], coverage: dict[str, int], reason: str
) -> None:
    verdict = tlc_cli.judge({"name": "m", "expected": "pass", "idle": idle}, _passing(coverage))
    assert not verdict.matches and reason in verdict.reason
    fine = tlc_cli.judge(
        {"name": "m", "expected": "pass", "idle": ["Crashed"]},
        _passing({"Assign": 3, "Crashed": 0}),
    )
    assert fine.matches and fine.reason == "pass, 1/2 actions fire"


def test_an_action_idle_in_every_passing_model_fails_the_gate() -> None:
    entry = {"name": "m", "expected": "pass", "idle": ["Crashed"]}
    verdicts = [
        tlc_cli.judge(entry, _passing({"Assign": 3, "Crashed": 0})),
        tlc_cli.judge(entry, _passing({"Assign": 1, "Crashed": 0})),
    ]
    assert tlc_cli.never_fired(verdicts) == ["Crashed"]
    verdicts.append(tlc_cli.judge({"name": "n", "expected": "pass"}, _passing({"Crashed": 1})))
    assert tlc_cli.never_fired(verdicts) == []


def test_parse_output_reads_violation_counts_and_trace() -> None:
    facts = tlc.parse_output(TRANSCRIPT)
    assert facts["violated"] == "Small"
    assert facts["distinct_states"] == 2
    assert facts["states_generated"] == 3
    assert facts["depth"] == 2
    states = facts["counterexample"]
    assert isinstance(states, list)
    assert [s.index for s in states] == [1, 2]
    assert states[0].values == {"x": "0", "y": "[ a |-> 1, b |-> 2 ]"}
    assert states[1].action.startswith("<Next line 13")


def test_counterexample_printout_shows_only_changed_variables() -> None:
    states = tlc.parse_output(TRANSCRIPT)["counterexample"]
    assert isinstance(states, list)
    text = tlc.format_counterexample(states)
    assert text.splitlines() == [
        "state 1: <Initial predicate>",
        "    x = 0",
        "    y = [ a |-> 1, b |-> 2 ]",
        "state 2: <Next line 13, col 12 to line 13, col 45 of module Counter>",
        "    x = 1",
    ]


def test_counter_spec_counterexample_from_a_real_tlc_run() -> None:
    result = tlc.run_model("test_counter", "Counter.tla", "Counter.cfg", timeout=120)
    assert not result.passed
    assert result.exit_code == 12
    assert result.violated == "Small"
    assert [s.values["x"] for s in result.counterexample] == ["0", "1", "2"]
    assert [s.values["y"] for s in result.counterexample] == ["FALSE", "TRUE", "FALSE"]
    report = tlc.write_report([result], "test_counter")
    assert json.loads(report.read_text())[0]["violated"] == "Small"
    assert not list((tlc.BUILD_DIR / "meta").glob("test_counter-*"))  # its metadir went


def test_a_tlc_that_cannot_start_leaves_no_metadir_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def cannot_start(*args: object, **kwargs: object) -> None:
        raise OSError("exec format error")

    monkeypatch.setattr(tlc, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(tlc.subprocess, "Popen", cannot_start)
    with pytest.raises(OSError, match="exec format error"):
        tlc.run_model("test_counter", "Counter.tla", "Counter.cfg")
    assert list((tmp_path / "meta").iterdir()) == []


def _manifest(tmp_path: Path, expected: str) -> Path:
    entry = {
        "name": "test_counter_gate", "size": "unit", "module": "Counter.tla",
        "config": "Counter.cfg", "expected": expected,
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"models": [entry]}))
    return path


@pytest.mark.parametrize(
    ("expected", "status"),
    [("Small", 0), ("pass", 1), ("TypeOK", 1)],
    ids=["right-property", "broken-expect-pass", "broken-wrong-property"],
)
def test_gate_reports_a_broken_expectation_as_a_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], expected: str, status: int
) -> None:
    manifest = _manifest(tmp_path, expected)
    assert tlc_cli.main(["--config", "unit", "--manifest", str(manifest)]) == status
    out = capsys.readouterr().out
    assert ("MISMATCH" in out) == (status != 0)


def test_gate_reports_a_changed_state_count_as_a_mismatch() -> None:
    entry = {"name": "m", "expected": "pass", "distinct_states": 10}
    result = _passing({"Assign": 1})
    assert not tlc_cli.judge(entry, result).matches
    entry["distinct_states"] = 11
    assert tlc_cli.judge(entry, result).matches


def test_unknown_size_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert tlc_cli.main(["--config", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no models of size 'huge'; choose from")
    assert "\n" not in err


def test_small_gate_passes_with_expected_failures(capsys: pytest.CaptureFixture[str]) -> None:
    """Every small model: the passing ones pass with the recorded state counts
    and every action firing, and the at-least-once duplicate and the mutants
    fail with their property."""
    status = tlc_cli.main(["--config", "small", "--timeout", "300"])
    out = capsys.readouterr().out
    assert status == 0, out
    for name, prop in [
        ("small_alo_duplicate", "NoDuplicateEffect"),
        ("small_mutant_commit_next", "NoLoss"),
        ("small_mutant_no_fence", "NoDuplicateEffect"),
        ("small_mutant_no_epoch", "NoLoss"),
        ("small_eos_forget_skip", "NoDuplicateEffect"),
        ("small_liveness_unfair", "AllFinished"),
    ]:
        assert f"{name}: {prop} violated, as expected" in out


def test_a_run_over_its_timeout_is_killed_and_reported_not_passed() -> None:
    result = tlc.run_model("test_counter_timeout", "Counter.tla", "Counter.cfg", timeout=0.05)
    assert not result.passed
    assert result.violated == "timeout"
    verdict = tlc_cli.judge({"name": "c", "expected": "Small"}, result)
    assert not verdict.matches
    assert verdict.reason.startswith("timed out")
