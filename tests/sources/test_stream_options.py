"""What does not apply to a non-Kafka source (``--source nats``, ``rabbitmq-stream``,
``pulsar``) is refused before anything connects, in one line each
(:func:`htmqc.runtime.launch.check_stream_options`); no server needed."""

from __future__ import annotations

from typing import Any

import pytest

from htmqc.errors import UsageError
from htmqc.runtime.launch import check_stream_options
from htmqc.runtime.options import RunOptions

BOOTSTRAP = {
    "nats": "nats://127.0.0.1:4222", "rabbitmq-stream": "rabbitmq-stream://127.0.0.1:5552",
    "pulsar": "pulsar://127.0.0.1:6650?admin-port=8080",
}  # fmt: skip
NAME = {"nats": "NATS", "rabbitmq-stream": "RabbitMQ", "pulsar": "Pulsar"}
REFUSED = [
    ({"mode": "exactly-once"}, "exactly-once needs a sink"),
    ({"mode": "exactly-once", "sink": "kafka:out"}, "a kafka: sink cannot commit a {name}"),
    ({"kafka_config": {"fetch.min.bytes": "1"}}, "--kafka-config .* --source {source}"),
    ({"group_protocol": "consumer"}, "--group-protocol does not apply to --source {source}"),
    ({"member_id": "m1"}, "--member-id does not apply to --source {source}"),
    ({"topic": "a.b"}, "topic 'a.b' cannot name a {name}"),
    ({"group": "g/1"}, "group 'g/1' cannot name a {name}"),
]
BAD_BOOTSTRAP = {"nats": ("http://x:1", "not a NATS URL"),
                 "rabbitmq-stream": ("nats://x:1", "not a RabbitMQ stream URL"),
                 "pulsar": ("http://x:1", "not a Pulsar URL")}  # fmt: skip


def _options(source: str, **kw: Any) -> RunOptions:
    base = {"bootstrap": BOOTSTRAP[source], "topic": "t", "group": "g", "source": source}
    return RunOptions(**{**base, **kw})


@pytest.mark.parametrize("source", sorted(BOOTSTRAP))
@pytest.mark.parametrize(("kw", "says"), REFUSED)
def test_what_does_not_apply_is_refused_in_one_line(
    source: str, kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(UsageError, match=says.format(name=NAME[source], source=source)) as info:
        check_stream_options(_options(source, **kw))
    assert "\n" not in info.value.line()


@pytest.mark.parametrize("source", sorted(BOOTSTRAP))
def test_a_bootstrap_of_another_kind_is_refused(source: str) -> None:
    bad, says = BAD_BOOTSTRAP[source]
    with pytest.raises(UsageError, match=says):
        check_stream_options(_options(source, bootstrap=bad))


@pytest.mark.parametrize("source", sorted(BOOTSTRAP))
def test_what_applies_passes(source: str) -> None:
    check_stream_options(_options(source, mode="exactly-once", sink="sqlite:///x.db"))


@pytest.mark.parametrize("source", sorted(BOOTSTRAP))
def test_a_retry_topic_at_least_once_only(source: str) -> None:
    """``--retry-topic``: every source reads ``TOPIC.retry`` beside ``TOPIC``,
    at-least-once; with a database sink it is refused, as on Kafka (the move to the
    retry topic cannot be part of the database transaction)."""
    check_stream_options(_options(source, retry_topic=True))
    says = "--retry-topic with a database sink cannot move a message atomically"
    with pytest.raises(UsageError, match=says) as info:
        check_stream_options(_options(source, retry_topic=True, mode="exactly-once",
                                      sink="sqlite:///x.db"))  # fmt: skip
    assert "\n" not in info.value.line()
