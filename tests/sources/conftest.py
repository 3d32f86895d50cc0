"""A private NATS JetStream server per test module (``nats-server -js`` on a free
port, a temporary store; stopped and removed afterwards), a private Apache Pulsar
standalone broker likewise, a private RabbitMQ node with streams per test session
(:mod:`htmqc.sources.rabbitmq_server`, ~3-5 s to start), and fresh topic names.

A missing ``nats-server`` or ``nats-py`` (Java, Pulsar's jars or ``pulsar-client``;
``rabbitmq-server``, ``rstream`` or ``pika``)
skips on a developer's machine and fails under ``CI=true`` (:mod:`tests.services`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from htmqc.sources.nats_server import NatsServer, start_nats
from htmqc.sources.pulsar_server import PulsarServer, start_pulsar
from htmqc.sources.rabbitmq_server import RabbitServer, start_rabbitmq
from tests.services import (
    require_module,
    require_nats_server,
    require_pulsar,
    require_rabbitmq_server,
)

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


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitServer]:
    """A running RabbitMQ node with the stream plugin for the session's tests."""
    binary = require_rabbitmq_server()
    require_module("rstream")
    require_module("pika")
    with start_rabbitmq(binary=binary) as server:
        yield server


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An admin and producing client of the server the test asked for: a
    :class:`~htmqc.sources.rabbitmq.RabbitStreamClient` with ``rabbitmq_server``, a
    :class:`~htmqc.sources.pulsar.PulsarClient` with ``pulsar_server``, else a
    :class:`~htmqc.sources.nats.NatsClient`."""
    if "rabbitmq_server" in request.fixturenames:
        from htmqc.sources.rabbitmq import RabbitStreamClient

        c: Any = RabbitStreamClient(request.getfixturevalue("rabbitmq_server").url)
    elif "pulsar_server" in request.fixturenames:
        from htmqc.sources.pulsar import PulsarClient

        c = PulsarClient(request.getfixturevalue("pulsar_server").bootstrap)
    else:
        from htmqc.sources.nats import NatsClient

        c = NatsClient(request.getfixturevalue("nats_server").url)
    yield c
    c.close()


@pytest.fixture
def topic_name() -> Callable[[], str]:
    """A fresh topic name (streams are created by whoever produces first)."""
    return lambda: f"t{uuid.uuid4().hex[:10]}"
