"""Contender: Quix Streams 3.28 (``quixstreams``).

Modes: ``at-least-once`` and ``exactly-once`` (``processing_guarantee``, no
output), and ``exactly-once-kafka``: exactly-once with ``to_topic`` writing
each value to the output topic (Kafka→Kafka). The shared handler runs in
``sdf.update(..., metadata=True)``; the application stops itself once
``count`` messages were handled. Quix's default 5 s commit interval is kept;
latency in the exactly-once modes ends when the checkpoint commit returns.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers.common import Meter

MODES = ("at-least-once", "exactly-once", "exactly-once-kafka")


def _time_commits(checkpoint_class: Any, meter: Meter) -> None:
    """Call ``meter.committed()`` after every Quix checkpoint commit returns.

    A Quix checkpoint commit flushes the producer and commits the offsets (in
    exactly-once mode: commits the Kafka transaction holding both), so its
    return is when the checkpoint's messages became visible downstream.
    """
    original = checkpoint_class.commit

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        meter.committed()
        return out

    checkpoint_class.commit = commit


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "at-least-once",
    latency: str | None = None,
    store: str | None = None,
    kill_at: int | None = None,
    journal: str | None = None,
    out_topic: str | None = None,
    idle_exit: float | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with a Quix application; return the shared figures.

    ``out_topic`` (default ``TOPIC-quix-out``) receives the values in
    ``exactly-once-kafka`` mode; ``idle_exit`` is not used (stops at ``count``).
    """
    import logging

    from quixstreams import Application, message_context
    from quixstreams.checkpointing import checkpoint as quix_checkpoint

    meter = Meter(count, latency=latency, store=store, kill_at=kill_at, journal=journal)
    _time_commits(quix_checkpoint.Checkpoint, meter)
    eo = mode != "at-least-once"
    guarantee = "exactly-once" if eo else "at-least-once"
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=guarantee,
        use_changelog_topics=False,
        loglevel=logging.WARNING,
        # The loopback timing htmqc uses, and its fetch.queue.backoff.ms (see
        # htmqc.kafka_defaults): with librdkafka's 1 s default a fast reader idles
        # whenever its local queue fills, so the runtimes would not be compared.
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                               "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10},
        # A stable transactional.id per group (Quix draws a random one by default): a
        # restarted instance then fences the transaction a killed one left open. The
        # bundled broker never times such a transaction out, so with a random id every
        # read_committed reader of the output would wait behind it forever.
        producer_extra_config={"transactional.id": f"{group}-quix"} if eo else {},
    )
    source = app.topic(topic, value_deserializer="bytes", key_deserializer="bytes")
    sdf = app.dataframe(source)

    def handle(value: Any, key: Any, timestamp: int, _headers: Any) -> None:
        if store is None:
            meter.handle(value, timestamp, key)
        else:  # the effect row wants the input position too
            context = message_context()
            meter.handle(value, timestamp, key, context.partition, context.offset)
        if meter.seen == count:
            app.stop()

    sdf = sdf.update(handle, metadata=True)
    if mode == "exactly-once-kafka":
        sink = app.topic(out_topic or f"{topic}-quix-out", value_serializer="bytes",
                         key_serializer="bytes")
        sdf = sdf.to_topic(sink)
    app.run()  # until the handler calls app.stop()
    return meter.result("quix", mode)

