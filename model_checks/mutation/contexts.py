"""A pytest plugin for ``make mutate``'s baseline: each test file's lines apart.

Loaded (``-p model_checks.mutation.contexts``) while the baseline runs a pytest
check under ``coverage``: the lines a test executes are recorded under its
file's coverage context (the file part of its node id), and the lines executed
outside any test (imports, collection) under the empty context. The kill chain
then runs, for a mutant, only the test files that executed one of its lines
(:meth:`model_checks.mutation.kill.Baseline.narrowed`). Files, not single
tests: a module-scoped fixture runs in the first test of its file that needs
it, so its lines would be charged to that test alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import coverage
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Charge the lines of ``item``'s setup, call and teardown to its file."""
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid.split("::", 1)[0])
    yield
    if cov is not None:
        cov.switch_context("")
