"""The settings of one ``htmqc run`` (what :mod:`htmqc.config` produces)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

AT_LEAST_ONCE = "at-least-once"
EXACTLY_ONCE = "exactly-once"
MODES = (AT_LEAST_ONCE, EXACTLY_ONCE)
#: ``--flow``: ``adaptive`` moves the in-flight window by AIMD between
#: ``min_in_flight`` and ``max_in_flight``; ``fixed`` keeps it at ``max_in_flight``.
FLOWS = ("adaptive", "fixed")
LOG_FORMATS = ("text", "json")
#: ``--group-protocol``: Kafka's classic rebalance protocol, or KIP-848's ``consumer``
#: protocol (Kafka 4.0 and later; the broker assigns and keeps the session timeout).
GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Everything the engine needs besides the handler.

    ``workers``: handler threads for at-least-once (0 counts as 1; handlers never
    run on the poll thread); exactly-once runs them on the one transaction
    thread, one at a time, inside the sink transaction. ``max_in_flight``: fetched but
    unfinished messages before partitions are paused. ``txn_messages`` /
    ``txn_ms``: bounds of one exactly-once transaction. ``commit_ms``: how often
    at-least-once commits. ``max_messages``/``idle_exit``: stop conditions for
    tests and demos. ``max_message_bytes``: larger values are dead-lettered.
    ``shutdown_seconds``: how long revoke and shutdown wait for running work.
    ``sink_retry_seconds``: how long an exactly-once sink that lost its
    database is reconnected (with backoff) before the run stops with exit 1.
    ``trace``: a file to append core transitions to (:mod:`htmqc.runtime.trace`).

    Failures: ``max_retries`` retries with full-jitter backoff from ``backoff_ms``
    capped at ``backoff_max_ms``; ``poison_threshold`` failures of one message
    within ``poison_window`` seconds send it to ``<topic>.dlq.poison`` at once.
    ``permanent_errors`` / ``retryable_errors``: comma-separated
    ``module:Class`` exception types the handler may raise, classified as
    :class:`~htmqc.Permanent` / :class:`~htmqc.Retryable` (most specific wins).
    ``member_id``: a name for this member that stays the same across restarts
    (and differs between live members): it becomes the Kafka sink's
    ``transactional.id`` (``htmqc-GROUP-MEMBER``), so a restarted member fences
    and aborts its crashed predecessor's open transaction at once, and the
    consumer's ``group.instance.id`` (static membership: a quick restart keeps
    its partitions). Without it the transactional id is random per process.
    ``group_protocol`` (:data:`GROUP_PROTOCOLS`): ``consumer`` joins with
    KIP-848's protocol (librdkafka ``group.protocol=consumer``): the broker
    assigns partitions and owns the session and heartbeat timing, so the
    classic-only settings are not sent. Under it a ``member_id`` already held
    by a live member fences the *new* member (it stops at start with one line),
    where the classic protocol fences the old one.
    ``retry_topic``: backoffs of at least ``retry_topic_ms`` wait in
    ``<topic>.retry`` instead of in memory (:mod:`htmqc.runtime.retry_topic`).
    Flow: ``flow`` (:data:`FLOWS`), ``min_in_flight``, ``latency_target_ms``
    (mean handler time above it halves the window), ``max_in_flight_bytes``
    (value bytes fetched and unfinished). Observability: ``metrics_port`` (serve
    /metrics, /state, /state.json on ``metrics_host``), ``redis_url`` (mirror the
    backpressure state into a Redis key), ``log_format`` (:data:`LOG_FORMATS`),
    ``otel`` (OpenTelemetry spans per batch and commit: :mod:`htmqc.observe.tracing`).
    """

    bootstrap: str
    topic: str
    group: str
    mode: str = AT_LEAST_ONCE
    sink: str | None = None
    workers: int = 1
    max_in_flight: int = 10_000
    txn_messages: int = 1000
    txn_ms: float = 100.0
    commit_ms: float = 500.0
    kafka_config: dict[str, Any] = field(default_factory=dict)
    create_topic: int | None = None
    max_messages: int | None = None
    idle_exit: float | None = None
    max_message_bytes: int | None = None
    shutdown_seconds: float = 10.0
    sink_retry_seconds: float = 60.0
    batch_size: int = 1000
    connect_seconds: float = 10.0
    trace: str | None = None
    max_retries: int = 3
    backoff_ms: float = 100.0
    backoff_max_ms: float = 30_000.0
    poison_threshold: int = 5
    poison_window: float = 60.0
    flow: str = "adaptive"
    min_in_flight: int = 16
    latency_target_ms: float = 1000.0
    max_in_flight_bytes: int = 256 * 1024 * 1024
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    redis_url: str | None = None
    log_format: str = "text"
    otel: bool = False
    retry_topic: bool = False
    retry_topic_ms: float = 5000.0
    permanent_errors: str | None = None
    member_id: str | None = None
    retryable_errors: str | None = None
    group_protocol: str = "classic"
