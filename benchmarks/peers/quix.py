"""Contender: Quix Streams 3.28 (``quixstreams``).

Modes: ``at-least-once`` and ``exactly-once`` (``processing_guarantee``, no
output), and ``exactly-once-kafka``: exactly-once with ``to_topic`` writing
each value to ``TOPIC-quix-out`` (Kafka→Kafka). The shared handler runs in
``sdf.update(..., metadata=True)``; the application stops itself once
``count`` messages were handled. Quix's default 5 s commit interval is kept.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers.common import Meter

MODES = ("at-least-once", "exactly-once", "exactly-once-kafka")


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "at-least-once",
    latency: bool = False,
    ids_path: str | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with a Quix application; return the shared figures."""
    import logging

    from quixstreams import Application

    meter = Meter(count, latency=latency, ids_path=ids_path)
    guarantee = "at-least-once" if mode == "at-least-once" else "exactly-once"
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=guarantee,
        use_changelog_topics=False,
        loglevel=logging.WARNING,
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                               "fetch.wait.max.ms": 100},
    )
    source = app.topic(topic, value_deserializer="bytes", key_deserializer="bytes")
    sdf = app.dataframe(source)

    def handle(value: Any, _key: Any, timestamp: int, _headers: Any) -> None:
        meter.handle(value, timestamp)
        if meter.seen == count:
            app.stop()

    sdf = sdf.update(handle, metadata=True)
    if mode == "exactly-once-kafka":
        sink = app.topic(f"{topic}-quix-out", value_serializer="bytes", key_serializer="bytes")
        sdf = sdf.to_topic(sink)
    app.run()  # until the handler calls app.stop()
    return meter.result("quix", mode)

