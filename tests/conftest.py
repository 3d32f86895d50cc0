"""Shared pytest fixtures: the bundled broker and fresh topics on it; and the
Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci`` (default, bounded),
``thorough`` (``make verify-long``) and ``fast`` (a developer's quick run; it
misses bugs that ``ci`` finds).

Tests that use them carry ``@pytest.mark.broker``. One broker serves the
whole session (it starts in well under a second and keeps data in memory);
each test gets its own uniquely named topics, so tests do not see each
other's messages.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from htmqc.broker import Broker, create_topic, start_broker
from htmqc.errors import HtmqcError

TopicFactory = Callable[..., str]

#: profile -> (max_examples, stateful_step_count); the tests set no budgets of their own.
PROFILES = {"ci": (300, 100), "thorough": (5000, 200), "fast": (40, 50)}
for _name, (_examples, _steps) in PROFILES.items():
    settings.register_profile(
        _name,
        max_examples=_examples,
        stateful_step_count=_steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def pytest_configure(config: pytest.Config) -> None:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (default ``ci``)."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if name not in PROFILES:
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} is not a profile; use one of {', '.join(PROFILES)}"
        )
    settings.load_profile(name)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """One bundled broker on a free loopback port for the whole session."""
    try:
        running = start_broker()
    except HtmqcError as exc:
        pytest.fail(f"cannot start the bundled broker: {exc.line()}", pytrace=False)
    with running:
        yield running


@pytest.fixture
def new_topic(broker: Broker, request: pytest.FixtureRequest) -> TopicFactory:
    """``new_topic(partitions=1, prefix=None) -> name``: a fresh topic on ``broker``."""

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        base = prefix or re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:40]
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, name, partitions)
        return name

    return make


@pytest.fixture
def topic_factory(new_topic: TopicFactory) -> TopicFactory:
    """The same factory as :func:`new_topic`, under the name other suites use."""
    return new_topic
