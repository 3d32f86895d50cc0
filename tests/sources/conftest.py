"""A private NATS JetStream server per test module (``nats-server -js`` on a free
port, a temporary store; stopped and removed afterwards), a private Apache Pulsar
standalone broker likewise, and fresh topic names.

A missing ``nats-server`` or ``nats-py`` (Java, Pulsar's jars or ``pulsar-client``)
skips on a developer's machine and fails under ``CI=true`` (:mod:`tests.services`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from htmqc.sources.nats_server import NatsServer, start_nats
from htmqc.sources.pulsar_server import PulsarServer, start_pulsar
from tests.services import require_module, require_nats_server, require_pulsar

TopicFactory = Callable[..., str]


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    """A running JetStream server for the module's tests."""
    binary = require_nats_server()
    require_module("nats")
    with start_nats(binary=binary) as server:
        yield server


@pytest.fixture(scope="module")
def pulsar_server() -> Iterator[PulsarServer]:
    """A running Pulsar standalone broker for the module's tests (about 8 s to start)."""
    require_pulsar()
    with start_pulsar() as server:
        yield server


@pytest.fixture
def topic_name() -> Callable[[], str]:
    """A fresh topic name (streams are created by whoever produces first)."""
    return lambda: f"t{uuid.uuid4().hex[:10]}"
