"""librdkafka settings htmqc uses, and the faster timing for a loopback broker.

Consumers commit manually (the runtime decides what is safe to commit), so
auto-commit and the automatic offset store are off; assignment is
cooperative-sticky; a new group starts from the earliest offset; reads are
``read_committed`` so aborted transactional records are never handed out.

With librdkafka's default timing a group join takes ~23 s on the bundled
broker (Tansu waits out the session/rebalance timeouts before it completes
the first generation). :data:`LOCAL_BROKER_CONSUMER` brings that to a few
seconds; it is applied only when :func:`is_local` says every bootstrap server
is a loopback address, because such short timeouts are wrong for a real
cluster across a network. User overrides always win, applied last.

KIP-848 (``group.protocol=consumer``, Kafka 4.0 and later): the broker assigns
partitions and owns the session and heartbeat timing, and librdkafka refuses
:data:`CLASSIC_ONLY` settings under it, so :func:`consumer_config` leaves out
the defaults among them (a user's own override is kept: librdkafka's refusal
then names it). A loopback Apache Kafka from :mod:`htmqc.kafka_cluster` sets
the broker side to the same timing as :data:`LOCAL_BROKER_CONSUMER`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

KafkaConfig = dict[str, Any]

CONSUMER_BASE: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "partition.assignment.strategy": "cooperative-sticky",
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    # librdkafka stops fetching a partition whose local queue is past
    # queued.min.messages (100,000) or queued.max.messages.kbytes (64 MiB) and
    # then waits this long before it looks again; its default, 1,000 ms, idles a
    # consumer that drains the queue faster than that (a backlog after downtime:
    # the bundled broker's 1M-message topic was read at 171K-253K msg/s with it,
    # 750K-1.19M with 10 ms). The queue bounds still hold; checking them more
    # often costs a timer wake-up.
    "fetch.queue.backoff.ms": 10,
}
"""Consumer settings for a runtime that stores and commits offsets itself."""

LOCAL_BROKER_CONSUMER: Mapping[str, Any] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "max.poll.interval.ms": 10000,
    "topic.metadata.refresh.interval.ms": 5000,
    "fetch.wait.max.ms": 100,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1000,
}
"""Timing that makes group joins on the bundled loopback broker take seconds."""

PRODUCER_BASE: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "none",
}
"""Producer settings: idempotent, batched, with a deep local queue."""

LOCAL_BROKER_PRODUCER: Mapping[str, Any] = {
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1000,
    "transaction.timeout.ms": 60000,
}
"""Producer timing for the bundled loopback broker."""

CLASSIC_PROTOCOL = "classic"
CONSUMER_PROTOCOL = "consumer"
CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")
"""Consumer settings of the classic group protocol that ``group.protocol=consumer`` refuses."""

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _host_of(server: str) -> str:
    server = server.strip()
    for prefix in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://"):
        if server.upper().startswith(prefix):
            server = server[len(prefix) :]
    if server.startswith("["):  # [::1]:9092
        return server[1 : server.find("]")]
    host, sep, _port = server.rpartition(":")
    return host if sep and host.count(":") == 0 else server


def is_local(bootstrap: str) -> bool:
    """Whether every server in ``bootstrap`` is a loopback address."""
    servers = [s for s in bootstrap.split(",") if s.strip()]
    if not servers:
        return False
    for server in servers:
        host = _host_of(server)
        if host.lower() in _LOCAL_NAMES:
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def consumer_config(
    bootstrap: str,
    group: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    group_protocol: str = CLASSIC_PROTOCOL,
) -> KafkaConfig:
    """Consumer config: base settings, local timing if loopback, then overrides.

    ``group_protocol="consumer"`` (or ``group.protocol=consumer`` among the
    overrides) joins with KIP-848's protocol, without the defaults of
    :data:`CLASSIC_ONLY`.
    """
    overrides = overrides or {}
    config: KafkaConfig = {"bootstrap.servers": bootstrap, "group.id": group}
    config.update(CONSUMER_BASE)
    if is_local(bootstrap):
        config.update(LOCAL_BROKER_CONSUMER)
    if group_protocol != CLASSIC_PROTOCOL:
        config["group.protocol"] = group_protocol
    config.update(overrides)
    if str(config.get("group.protocol", CLASSIC_PROTOCOL)).lower() == CONSUMER_PROTOCOL:
        for key in CLASSIC_ONLY:
            if key not in overrides:
                config.pop(key, None)
    return config


def producer_config(
    bootstrap: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    transactional_id: str | None = None,
) -> KafkaConfig:
    """Producer config: base settings, local timing if loopback, then overrides.

    ``transactional_id`` makes it a transactional producer.
    """
    config: KafkaConfig = {"bootstrap.servers": bootstrap}
    config.update(PRODUCER_BASE)
    if is_local(bootstrap):
        config.update(LOCAL_BROKER_PRODUCER)
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    config.update(overrides or {})
    return config
