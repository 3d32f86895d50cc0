"""Running a Hypothesis state machine against a mutant, which it must reject."""

from __future__ import annotations

import icontract
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

#: Deterministic and without shrinking: finding a failure is the point.
MUTANT_SETTINGS = settings(
    max_examples=2000,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def assert_rejected(machine: type[RuleBasedStateMachine], **overrides: object) -> None:
    """``machine`` with its class attributes ``overrides`` (the mutant) must fail:
    a comparison or invariant of the machine, or a contract of the core."""
    mutated = type(f"{machine.__name__}Mutated", (machine,), dict(overrides))
    with pytest.raises((AssertionError, icontract.ViolationError)):
        run_state_machine_as_test(mutated, settings=MUTANT_SETTINGS)
