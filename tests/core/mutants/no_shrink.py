"""pytest plugin for :mod:`tests.core.mutants.measure`: the loaded Hypothesis
profile without shrinking and without the example database.

Whether a seed finds a failure is decided before shrinking starts, so the
count of catches is the profile's; shrinking would only make each caught run
minutes longer, and the database would replay one seed's failure in the next.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Runs after ``tests/conftest.py`` loaded the profile named by ``HYPOTHESIS_PROFILE``."""
    loaded = settings.default
    settings.register_profile(
        "measure",
        parent=loaded,
        phases=tuple(p for p in loaded.phases if p not in (Phase.shrink, Phase.explain)),
        database=None,
    )
    settings.load_profile("measure")
