"""A pytest plugin for ``make mutate``'s baseline: each test file's lines apart.

Loaded (``-p model_checks.mutation.contexts``) while the baseline runs a pytest
check under ``coverage``: the lines a test executes are recorded under its
file's coverage context (the file part of its node id), and the lines executed
outside any test (imports, collection) under the empty context. The kill chain
then runs, for a mutant, only the test files that executed one of its lines
(:meth:`model_checks.mutation.kill.Baseline.narrowed`). Files, not single
tests, and the setup of a fixture wider than a function under the empty
context: such a fixture runs in the first test that needs it and serves the
others, so its lines would be charged to that test alone. What stays assumed:
the code under test keeps no cache across tests (``src/htmqc/core`` has none)
and starts no thread that outlives a test.
"""

from __future__ import annotations

from collections.abc import Iterator

import coverage
import pytest

_file = [""]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Charge the lines of ``item``'s setup, call and teardown to its file."""
    cov = coverage.Coverage.current()
    _file[0] = item.nodeid.split("::", 1)[0]
    if cov is not None:
        cov.switch_context(_file[0])
    yield
    _file[0] = ""
    if cov is not None:
        cov.switch_context("")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[None]:
    """A fixture wider than a function (session, package, module, class) serves other
    tests, and other files, than the one that set it up: its lines count as import's
    (every file depends on them), so a mutant reaching them runs the whole check."""
    cov = coverage.Coverage.current()
    shared = cov is not None and fixturedef.scope != "function"
    if shared:
        assert cov is not None
        cov.switch_context("")
    yield
    if shared:
        assert cov is not None
        cov.switch_context(_file[0])
