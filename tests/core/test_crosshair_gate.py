"""The CrossHair gate must be able to fail: it rejects a known-wrong function."""

from pathlib import Path

import pytest

from model_checks.crosshair_gate import check

pytestmark = pytest.mark.formal
MUTANT = Path(__file__).parent / "mutants" / "commit_next.py"


def test_crosshair_finds_the_counterexample_in_a_wrong_commit() -> None:
    result = check(MUTANT, per_condition_timeout=5)
    assert result.findings, "CrossHair accepted a commit that hands out `next`"
    assert any("offset_to_commit" in f.message for f in result.findings)


def test_crosshair_passes_the_offset_mapping() -> None:
    core = Path(__file__).parents[2] / "src" / "htmqc" / "core" / "offsets.py"
    assert check(core, per_condition_timeout=2).findings == []
