"""Exactly-once sinks: the user's effects and the consumer's positions stored
in one transaction (SQLite, PostgreSQL, Kafka→Kafka). See :mod:`htmqc.sinks.base`
for the contract and :func:`open_sink` for the URLs."""

from htmqc.sinks.base import (
    Fenced,
    Position,
    Sink,
    SinkStateError,
    SinkTransaction,
    SinkUnavailable,
    TransactionAborted,
)
from htmqc.sinks.factory import open_sink
from htmqc.sinks.urls import redact_url

__all__ = [
    "Fenced",
    "Position",
    "Sink",
    "SinkStateError",
    "SinkTransaction",
    "SinkUnavailable",
    "TransactionAborted",
    "open_sink",
    "redact_url",
]
