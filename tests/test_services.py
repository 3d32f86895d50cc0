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


def test_no_test_skips_a_missing_module_silently() -> None:
    """``pytest.importorskip`` skips under CI too: a test needing a module calls
    :func:`services.require_module` instead (fails under ``CI=true``)."""
    from pathlib import Path

    here = Path(__file__).parent
    call = "pytest." + "importorskip("  # split: this file is scanned too
    offenders = [str(path.relative_to(here)) for path in sorted(here.rglob("*.py"))
                 if call in path.read_text(encoding="utf-8")]
    assert offenders == []


def test_a_module_that_is_not_there_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_htmqc is not importable"):
        services.require_module("no_such_module_htmqc")
