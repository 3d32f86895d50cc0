"""Backoff and the retry decision, as properties."""

import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core import FailureKind, RetryPolicy

policies = st.builds(
    lambda base, extra, n: RetryPolicy(max_retries=n, base_delay=base, max_delay=base + extra),
    st.floats(0, 100),
    st.floats(0, 1000),
    st.integers(0, 20),
)


@given(policies, st.integers(1, 10**6), st.floats(0, 1))
def test_backoff_is_never_negative_and_never_above_its_cap(
    p: RetryPolicy, attempt: int, jitter: float
) -> None:
    d = p.delay(attempt, jitter)
    assert 0 <= d <= p.max_delay and math.isfinite(d)


@given(policies, st.integers(1, 40))
def test_full_jitter_spans_zero_to_the_exponential_ceiling(p: RetryPolicy, attempt: int) -> None:
    assert p.delay(attempt, 0.0) == 0.0
    ceiling = min(p.max_delay, p.base_delay * 2 ** (attempt - 1))
    assert p.delay(attempt, 1.0) == pytest.approx(ceiling)


@pytest.mark.parametrize(
    "kwargs", [{"max_retries": -1}, {"base_delay": 5, "max_delay": 1}, {"base_delay": -1}]
)
def test_bad_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


class DatabaseBusy(Exception):
    pass


class Deadlock(DatabaseBusy):
    pass


def test_classification_of_handler_exceptions() -> None:
    from htmqc import Permanent, Retryable, classify

    class BadPayload(Permanent):
        pass

    assert classify(Retryable("try later")) is FailureKind.RETRYABLE
    assert classify(BadPayload("no")) is FailureKind.PERMANENT
    assert classify(KeyError("x")) is FailureKind.UNKNOWN
    mapping = {DatabaseBusy: FailureKind.RETRYABLE, Deadlock: FailureKind.PERMANENT}
    assert classify(Deadlock(), mapping) is FailureKind.PERMANENT  # most specific wins
    assert classify(DatabaseBusy(), mapping) is FailureKind.RETRYABLE
    assert classify(ValueError(), {Exception: FailureKind.PERMANENT}) is FailureKind.PERMANENT


def test_the_default_policy_is_the_one_the_spec_states() -> None:
    """spec/README.md §4 states the core's default policy (a core built without
    one uses it, and the retry options take their defaults from it)."""
    spec = (Path(__file__).resolve().parents[2] / "spec" / "README.md").read_text()
    section = spec.split("## 4. ", 1)[1].split("\n## ", 1)[0]
    stated = re.search(
        r"`max_retries` \(integer ≥ 0,\s+default (\d+)\).*?defaults ([\d.]+) and ([\d.]+)\)",
        section, re.S,
    )
    assert stated, "spec/README.md §4 no longer states the default policy"
    p = RetryPolicy()
    assert (p.max_retries, p.base_delay, p.max_delay) == (
        int(stated[1]), float(stated[2]), float(stated[3]))
