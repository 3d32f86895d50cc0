"""tests/services.py: a missing service skips on a developer's machine and fails in CI."""

from __future__ import annotations

import pytest

from tests import services


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception),
                                             ("", pytest.skip.Exception),
                                             ("false", pytest.skip.Exception)])
def test_missing_fails_only_in_ci(monkeypatch: pytest.MonkeyPatch, ci: str,
                                  outcome: type[BaseException]) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="Redis is down"):
        services.missing("Redis is down")


def test_a_tool_that_is_not_there_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no-such-tool-htmqc is not installed"):
        services.require_tool("no-such-tool-htmqc", "nothing")
