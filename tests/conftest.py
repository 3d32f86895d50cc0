"""Shared pytest fixtures: the bundled broker and fresh topics on it; and the
Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci`` (default, bounded)
and ``thorough`` (``make verify-long``).

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
