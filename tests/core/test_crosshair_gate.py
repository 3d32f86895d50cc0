"""The CrossHair gate must be able to fail: it finds one-line bugs in a copy of
the real core (:mod:`tests.core.mutants.table`), each within a per-condition
budget stated below next to the ``make crosshair`` one, and passes the real
offset mapping."""

import shutil
from pathlib import Path

import pytest

from model_checks.crosshair_gate import check
from tests.core.mutants.table import BY_NAME

pytestmark = pytest.mark.formal
SRC = Path(__file__).parents[2] / "src"


# Mutants CrossHair finds, one per kind of contract (a fetch's held set, a batch's
# source states, a commit's held offsets, the epoch fence), each with the CPU seconds
# per condition it is tested at: twice what it needed on a quiet box, because CrossHair's
# budget is CPU time and a shared box's CPU time per step varies (a CI run missed
# apply_many_any_source at 4 s). Measured on 2026-11-27 (`check` at 1, 2, 3, 4 s):
# fetched_boundary, finished_above_no_held and consumer_ignores_epoch at 1 s, so the
# gate's 4 s has a 4x margin; apply_many_any_source at 3 s, not 2 s, so the gate's 4 s
# has only 1.33x and the test gives it four times that, 12 s (at twice, 6 s, a CI run
# beside a mutation run missed it on 2026-11-28). CrossHair also finds
# commit_acked_above_watermark, commit_failed_no_unsent and empty_batch_makes_commit_due
# at 4 s, commit_requested_next at 10 s and apply_no_unsent at 20 s per condition; not
# consumer_commit_without_held (10 s), nor the two that no postcondition can state
# (consumer_assign_drops_held, restore_refuses_held_start). The stateful test catches
# all of them.
FOUND = {
    "fetched_boundary": 2 * 1.0,
    "apply_many_any_source": 4 * 3.0,
    "finished_above_no_held": 2 * 1.0,
    "consumer_ignores_epoch": 2 * 1.0,
}
#: A miss is tried again at 4 and 16 times the budget: what a step costs on a box
#: shared with a mutation run or a CI worker varies past any fixed margin (a
#: mutation run's baseline missed fetched_boundary at 2 s while tests ran beside
#: it, 2026-11-28). The claim tested is that CrossHair finds the bug, not how fast.
RETRIES = (1, 4, 16)


@pytest.mark.parametrize("name", FOUND)
def test_crosshair_finds_the_bug_in_a_copy_of_the_real_core(name: str, tmp_path: Path) -> None:
    mutant = BY_NAME[name]
    shutil.copytree(SRC / "htmqc", tmp_path / "htmqc", ignore=shutil.ignore_patterns("__pycache__"))
    path, line = mutant.apply(tmp_path)
    for budget in (FOUND[name] * k for k in RETRIES):
        result = check(f"{path}:{line}", per_condition_timeout=budget)
        counterexamples = [f for f in result.findings if f.line > 0]  # line 0: CrossHair failed
        if counterexamples:
            break
    assert counterexamples, f"CrossHair accepted {mutant.what} at {budget} s: {result.findings}"


def test_crosshair_passes_the_offset_mapping() -> None:
    core = SRC / "htmqc" / "core" / "offsets.py"
    assert check(core, per_condition_timeout=2).findings == []
