"""The model comparisons of the partition gate and the failure rules reject
one-line bugs in a *copy* of the real ``core/gate.py`` and ``core/failures.py``
(:data:`tests.core.mutants.table.GATE_MUTANTS`, ``FAILURE_MUTANTS``), with
contracts off so that the comparison with the naive model
(``model_checks/reference_gate.py``, ``reference_failures.py``) is what
catches them; the unmutated copy passes the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.mutants.on_copy import run_on_copy
from tests.core.mutants.table import FAILURE_MUTANTS, GATE_MUTANTS, Mutant

pytestmark = pytest.mark.formal

GATE = "tests.core.test_gate:GateVersusReference"
FAILURES = "tests.core.test_failures:FailuresVersusReference"
CASES = [(m, GATE) for m in GATE_MUTANTS] + [(m, FAILURES) for m in FAILURE_MUTANTS]


@pytest.mark.parametrize("machine", [GATE, FAILURES])
def test_the_unmutated_copy_passes(machine: str, tmp_path: Path) -> None:
    outcome = run_on_copy(None, machine, tmp_path)
    assert outcome.core == str(tmp_path / "src" / "htmqc" / "core")
    assert outcome.verdict == "passed", outcome.detail


@pytest.mark.parametrize(("mutant", "machine"), CASES, ids=lambda x: getattr(x, "name", ""))
def test_the_model_comparison_rejects_the_mutated_copy(
    mutant: Mutant, machine: str, tmp_path: Path
) -> None:
    outcome = run_on_copy(mutant, machine, tmp_path)
    assert outcome.core == str(tmp_path / "src" / "htmqc" / "core")
    assert outcome.verdict == "caught", f"{mutant.what}: {outcome.verdict} {outcome.detail}"
