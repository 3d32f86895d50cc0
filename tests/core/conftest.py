"""Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci`` (default, bounded)
and ``thorough`` (``make verify-long``)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=300,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=5000,
    stateful_step_count=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
