"""``open_sink``: a sink from its URL (the ``--sink`` option)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from htmqc.errors import UsageError
from htmqc.sinks.base import Sink
from htmqc.sinks.urls import parse_sink_url


def open_sink(
    url: str,
    *,
    bootstrap: str | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    member_id: str | None = None,
    metadata_max_bytes: int | None = None,
) -> Sink:
    """The sink named by ``url`` (see :mod:`htmqc.sinks.urls`), not yet opened:
    call ``open(group)`` to connect. ``bootstrap``, ``kafka_config`` (librdkafka
    settings for the producer), ``member_id`` (part of the transactional id) and
    ``metadata_max_bytes`` (the broker's ``offset.metadata.max.bytes``) are for
    ``kafka:TOPIC`` and ignored otherwise. Raises :class:`UsageError`
    for a malformed URL or an SQLite path that cannot be written."""
    parsed = parse_sink_url(url)
    if parsed.kind == "sqlite":
        from htmqc.sinks.sqlite import SqliteSink

        return SqliteSink(parsed.target, table_prefix=parsed.table_prefix, display=parsed.display)
    if parsed.kind == "postgresql":
        from htmqc.sinks.postgresql import PostgresSink

        return PostgresSink(parsed.target, table_prefix=parsed.table_prefix, display=parsed.display)
    if not bootstrap:
        raise UsageError(
            f"sink {parsed.display} needs a Kafka bootstrap server", "pass --bootstrap HOST:PORT"
        )
    from htmqc.sinks.kafka import KafkaSink

    sink = KafkaSink(
        parsed.target, bootstrap=bootstrap, kafka_config=kafka_config, member_id=member_id
    )
    if metadata_max_bytes is not None:
        sink.metadata_max_bytes = metadata_max_bytes
    return sink
