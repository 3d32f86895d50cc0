"""OpenTelemetry spans (``htmqc run --otel``; needs the ``otel`` extra).

One span per run of messages a lane hands to the handler, not per message (a
span costs microseconds): ``htmqc.process`` with the OpenTelemetry messaging
attributes (``messaging.system=kafka``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.batch.message_count``)
plus ``htmqc.first_offset`` and ``htmqc.last_offset``. It is the current span
while the handlers run, so spans a handler opens become its children. Commits
get ``htmqc.commit`` spans (``htmqc.mode``, ``htmqc.partitions``).

Only the OpenTelemetry *API* is used: where spans go (OTLP, console, nothing)
is the SDK's configuration, set up by the application or by
``opentelemetry-instrument``; without an SDK every span is a no-op.
Attributes carry topic names and numbers only, never message content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from htmqc.core.decisions import TopicPartition
from htmqc.errors import UsageError

#: ``span(tp, msgs)``: a context manager around one lane run.
BatchSpan = Callable[[TopicPartition, Sequence[Any]], AbstractContextManager[Any]]


def _tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        raise UsageError(
            "--otel needs the OpenTelemetry API, which is not installed",
            "pip install 'htmqc[otel]' (and an SDK/exporter of your choice)",
        ) from None
    return trace.get_tracer("htmqc")


def batch_spans() -> BatchSpan:
    """The span factory lanes call around each run.

    :raises UsageError: OpenTelemetry is not installed.
    """
    tracer = _tracer()

    def span(tp: TopicPartition, msgs: Sequence[Any]) -> AbstractContextManager[Any]:
        return tracer.start_as_current_span(  # type: ignore[no-any-return]
            "htmqc.process",
            attributes={
                "messaging.system": "kafka",
                "messaging.destination.name": tp[0],
                "messaging.destination.partition.id": str(tp[1]),
                "messaging.batch.message_count": len(msgs),
                "htmqc.first_offset": msgs[0].offset() if msgs else -1,
                "htmqc.last_offset": msgs[-1].offset() if msgs else -1,
            },
        )

    return span


def commit_spans(mode: str) -> Callable[[int], AbstractContextManager[Any]]:
    """``span(partitions)`` around one commit (``mode``: the delivery mode).

    :raises UsageError: OpenTelemetry is not installed.
    """
    tracer = _tracer()

    def span(partitions: int) -> AbstractContextManager[Any]:
        return tracer.start_as_current_span(  # type: ignore[no-any-return]
            "htmqc.commit", attributes={"htmqc.mode": mode, "htmqc.partitions": partitions}
        )

    return span
