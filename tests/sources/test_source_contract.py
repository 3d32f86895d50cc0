"""What every non-Kafka source must do alike, run on each (``nats``,
``rabbitmq-stream``, ``pulsar``) against its private server (tests/sources/conftest.py): a seek
fetches again and a pause hides a partition; commits are stored in order and
reported inside ``consume`` (with their metadata where the source keeps it); and
``htmqc run`` exactly-once into SQLite across a SIGKILL stores every effect once
and resumes at the sink's positions. What differs per source is in
``test_nats_*.py``, ``test_rabbitmq_*.py`` and ``test_pulsar_*.py``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sources.support import (
    check_commits,
    check_exactly_once_across_sigkill,
    check_exactly_once_through_kills,
    check_seek_and_pause,
)

pytestmark = pytest.mark.slow

#: ``--source`` -> (server fixture, module, client class, consumer class, keeps metadata).
SOURCES = {
    "nats": ("nats_server", "htmqc.sources.nats", "NatsClient", "NatsConsumer", True),
    "rabbitmq-stream": (
        "rabbitmq_server", "htmqc.sources.rabbitmq", "RabbitStreamClient",
        "RabbitStreamConsumer", False,
    ),
    "pulsar": ("pulsar_server", "htmqc.sources.pulsar", "PulsarClient", "PulsarConsumer", True),
}  # fmt: skip
#: Messages of the exactly-once run (NATS's test had 8,000 before it was shared).
EXACTLY_ONCE_COUNT = {"nats": 8000, "rabbitmq-stream": 5000, "pulsar": 5000}


@dataclass
class Source:
    """One source under test: its server's URL, admin client and adapter module."""

    name: str
    url: str
    client: Any
    module: Any
    consumer_class: Any
    keeps_metadata: bool

    def produce(self, topic: str, count: int, partitions: int) -> None:
        self.module.produce(self.url, topic, count, partitions=partitions, client=self.client)

    def consumer(self, group: str, **kw: Any) -> Any:
        return self.consumer_class(self.url, group, **kw)


@pytest.fixture(params=sorted(SOURCES))
def source(request: pytest.FixtureRequest) -> Iterator[Source]:
    server_fixture, module_name, client_class, consumer_class, keeps = SOURCES[request.param]
    server = request.getfixturevalue(server_fixture)
    module = importlib.import_module(module_name)
    url = getattr(server, "bootstrap", server.url)  # Pulsar's carries its admin port
    client = getattr(module, client_class)(url)
    try:
        yield Source(request.param, url, client, module, getattr(module, consumer_class), keeps)
    finally:
        client.close()


def test_seek_refetches_and_pause_hides_a_partition(
    source: Source, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    source.produce(topic, 200, 2)
    consumer = source.consumer("g")
    try:
        check_seek_and_pause(consumer, topic)
    finally:
        consumer.close()


def test_commits_are_stored_in_order_and_acknowledged_inside_consume(
    source: Source, topic_name: Callable[[], str]
) -> None:
    topic = topic_name()
    source.produce(topic, 10, 2)
    check_commits(
        lambda **kw: source.consumer("grp", **kw), topic,
        lambda p: source.client.committed("grp", topic, p), keeps=source.keeps_metadata,
    )  # fmt: skip


def test_exactly_once_into_sqlite_across_sigkill(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic, n = topic_name(), EXACTLY_ONCE_COUNT[source.name]
    source.produce(topic, n, 4)
    check_exactly_once_across_sigkill(source.url, topic, ["--source", source.name], tmp_path, n)


def test_exactly_once_through_repeated_consumer_kills(
    source: Source, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic, n = topic_name(), 3000
    source.produce(topic, n, 4)
    check_exactly_once_through_kills(source.url, topic, ["--source", source.name], tmp_path, n)
