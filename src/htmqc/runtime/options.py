"""The settings of one ``htmqc run`` (what :mod:`htmqc.config` produces), and the
one schema they come from.

Each field of :class:`RunOptions` is declared once, with its type, default,
help text, bounds and choices (:func:`opt`); :data:`OPTIONS` reads them back,
and from it :mod:`htmqc.config` builds its field table, its limits and its
choices, and ``htmqc run`` its command-line flags (``--max-in-flight`` for
``max_in_flight``). A new option is one line here.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from htmqc.core.breaker import BreakerPolicy
from htmqc.core.metadata_budget import DEFAULT_LIMIT, MIN_LIMIT
from htmqc.core.retry import RetryPolicy

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
#: ``--value-format`` / ``--key-format`` (:mod:`htmqc.runtime.decode`): ``bytes`` hands
#: the handler the raw message; the others decode it first, the last three through a
#: Confluent Schema Registry (``--schema-registry``).
FORMATS = ("bytes", "json", "avro", "protobuf", "json-schema")
#: ``--source``: the log consumed. ``kafka`` (confluent-kafka), or ``nats``: NATS
#: JetStream through :class:`htmqc.sources.nats.NatsConsumer` (one stream per
#: partition, a single member; ``--bootstrap nats://HOST:PORT``).
#: ``rabbitmq-stream``: RabbitMQ streams through
#: :class:`htmqc.sources.rabbitmq.RabbitStreamConsumer` (one stream per partition, a
#: single member; ``--bootstrap rabbitmq-stream://HOST:PORT``).
#: ``pulsar``: an Apache Pulsar partitioned topic through
#: :class:`htmqc.sources.pulsar.PulsarConsumer` (a single member;
#: ``--bootstrap pulsar://HOST:PORT?admin-port=N``).
KAFKA, NATS, RABBITMQ_STREAM, PULSAR = "kafka", "nats", "rabbitmq-stream", "pulsar"
SOURCES = (KAFKA, NATS, RABBITMQ_STREAM, PULSAR)

#: ``--profile``: defaults tuned for a goal. An option given on the command line,
#: in the environment or in ``--config`` wins over its profile's value.
#: ``throughput`` is the schema's own defaults. ``low-latency`` trades throughput
#: for time-to-effect: an idle poll waits at most 2 ms for a batch to fill (each
#: wait bounds how long a message that has arrived sits in librdkafka's queue,
#: at the cost of up to 500 wake-ups a second), consume calls take 200 records,
#: and an exactly-once transaction commits every 5 ms (its records count as
#: done only when it commits).
PROFILES: dict[str, dict[str, Any]] = {
    "throughput": {},
    "low-latency": {"poll_wait_ms": 2.0, "batch_size": 200, "txn_ms": 5.0},
}

#: Defaults that depend on the sink's kind (:data:`htmqc.sinks.urls.SinkKind`), in
#: force for the options given nowhere and not set by the profile. A Kafka
#: transaction costs far more than a database's: its commit flushes every record
#: produced in it and waits for the coordinator to write the markers on every
#: partition it touched (milliseconds on loopback), and the handlers wait
#: meanwhile; 10,000 messages (``txn_ms`` still bounds the age) made Kafka->Kafka
#: 2-3x faster on Apache Kafka than 1,000 (benchmarks/README.md).
SINK_DEFAULTS: dict[str, dict[str, Any]] = {
    "kafka": {"txn_messages": 10_000},
}

#: The circuit breaker's failure-rate window (seconds): the core's, not an option.
_BREAKER_WINDOW = BreakerPolicy().window
#: The core's default retry policy (spec §4): the retry options' defaults.
_RETRY = RetryPolicy()

#: A bound: ``(lowest, highest, lowest allowed itself)``.
Limits = tuple[float, float, bool]


@dataclass(frozen=True, slots=True)
class Spec:
    """How an option is offered: help text, bounds, choices, metavar; ``cli``
    false for options that are not flags (``kafka_config`` has its own)."""

    help: str = ""
    limits: Limits | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    cli: bool = True


def opt(
    default: Any = MISSING,
    help: str = "",
    *,
    limits: Limits | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
) -> Any:
    """A :class:`RunOptions` field with its :class:`Spec` (no default: required)."""
    spec = Spec(help, limits, choices, metavar)
    if default is MISSING:
        return field(metadata={"htmqc": spec})
    return field(default=default, metadata={"htmqc": spec})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """Everything the engine needs besides the handler.

    ``workers``: handler threads for at-least-once (0 counts as 1; handlers never
    run on the poll thread); exactly-once runs them on the one transaction
    thread, one at a time, inside the sink transaction. ``max_in_flight``: fetched but
    unfinished messages before partitions are paused. ``txn_messages`` /
    ``txn_ms``: bounds of one exactly-once transaction (``txn_messages``'s default
    depends on the sink: :data:`SINK_DEFAULTS`). ``commit_ms``: how often
    at-least-once commits. ``kafka_lag_commits``: exactly-once into a database
    (a sink without :attr:`~htmqc.ports.Sink.commits_group_offsets`), also
    commit each watermark the database stored to the group's offsets, after the
    database commit, asynchronously and best effort, for lag tools; never read
    back. ``max_messages``/``idle_exit``: stop conditions for
    tests and demos. ``max_message_bytes``: larger values are dead-lettered.
    ``shutdown_seconds``: how long revoke and shutdown wait for running work.
    ``sink_retry_seconds``: how long an exactly-once sink that lost its
    database is reconnected (with backoff) before the run stops with exit 1.
    ``trace``: a file to append core transitions to (:mod:`htmqc.runtime.trace`).
    ``python_cpu``: the one CPU of the poll thread and the handler threads
    (:mod:`htmqc.runtime.affinity`).

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
    ``commit_metadata_bytes``: the broker's ``offset.metadata.max.bytes``; the
    offsets finished out of order travel in the commit's metadata, and a partition
    whose set could outgrow it gets no more work until it drains
    (:mod:`htmqc.core.metadata_budget`; Kafka commits only: the exactly-once Kafka
    sink, and at-least-once, which throttles from half of it).
    ``source`` (:data:`SOURCES`): ``nats`` consumes NATS JetStream streams
    ``TOPIC-0`` .. ``TOPIC-(N-1)`` (:mod:`htmqc.sources.nats`) as one member,
    at-least-once commits in a KV bucket, exactly-once into a SQL sink;
    ``rabbitmq-stream`` consumes RabbitMQ streams named the same way
    (:mod:`htmqc.sources.rabbitmq`), at-least-once commits by the streams' offset
    tracking (one number: the finished-above set is not kept), exactly-once into
    a SQL sink; ``pulsar`` consumes a partitioned Pulsar topic
    (:mod:`htmqc.sources.pulsar`), at-least-once commits in a compacted commit
    topic, exactly-once into a SQL sink.
    ``retry_topic``: backoffs of at least ``retry_topic_ms`` wait in
    ``<topic>.retry`` instead of in memory (:mod:`htmqc.runtime.retry_topic`).
    Flow: ``flow`` (:data:`FLOWS`), ``min_in_flight``, ``latency_target_ms``
    (mean handler time above it halves the window), ``max_in_flight_bytes``
    (value bytes fetched and unfinished). Observability: ``metrics_port`` (serve
    /metrics, /state, /state.json on ``metrics_host``), ``redis_url`` (mirror the
    backpressure state into a Redis key), ``log_format`` (:data:`LOG_FORMATS`),
    ``otel`` (OpenTelemetry spans per batch and commit: :mod:`htmqc.observe.tracing`).
    Decoding (:mod:`htmqc.runtime.decode`): ``value_format`` / ``key_format``
    (:data:`FORMATS`), ``schema_registry`` (the registry's URL), ``protobuf_type`` /
    ``key_protobuf_type`` (``module:Class``) or ``message_types`` (the library API's
    Protobuf classes as objects, by side: ``{"value": cls, "key": cls}``).
    """

    bootstrap: str = opt(
        help="Kafka bootstrap servers HOST:PORT (nats://HOST:PORT with --source nats, "
        "rabbitmq-stream://HOST:PORT with --source rabbitmq-stream, "
        "pulsar://HOST:PORT?admin-port=N with --source pulsar)"
    )
    topic: str = opt(
        help="the topic to consume; several: a,b,c; a pattern: ^regex (librdkafka's "
        "convention; topics created later join; <topic>.dlq/.retry names are never read)"
    )
    group: str = opt(help="consumer group")
    mode: str = opt(AT_LEAST_ONCE, "delivery mode", choices=MODES)
    sink: str | None = opt(
        None, "sqlite:///PATH | postgresql://... | kafka:TOPIC (exactly-once)"
    )
    workers: int = opt(1, "handler threads (at-least-once)", limits=(0, 1024, True))
    python_cpu: int | None = opt(
        None, "run the poll loop and the handler threads on this CPU only (librdkafka's "
        "threads keep every CPU); faster when handlers hold the GIL",
        limits=(0, 65_535, True), metavar="CPU",
    )  # fmt: skip
    max_in_flight: int = opt(
        10_000, "unfinished messages before pausing", limits=(1, 10_000_000, True)
    )
    txn_messages: int = opt(
        1000, f"messages per sink transaction ({SINK_DEFAULTS['kafka']['txn_messages']} for a "
        "kafka: sink)",
        limits=(1, 10_000_000, True),
    )
    txn_ms: float = opt(
        100.0, "milliseconds per sink transaction", limits=(0, 86_400_000, False)
    )
    commit_ms: float = opt(
        500.0, "at-least-once commit interval, ms (exactly-once: of the lag commits)",
        limits=(0, 86_400_000, False),
    )
    kafka_lag_commits: bool = opt(
        True, "exactly-once into a database: also commit the stored watermarks to the "
        "consumer group, after the database commit (at most every --commit-ms, and on "
        "revoke and shutdown), asynchronously and best effort, so "
        "kafka-consumer-groups, Burrow and KEDA see the lag; never read back (positions "
        "come from the database only). Default on; --no-kafka-lag-commits leaves the "
        "group's offsets unset",
    )  # fmt: skip
    kafka_config: dict[str, Any] = field(
        default_factory=dict, metadata={"htmqc": Spec(cli=False)}
    )
    create_topic: int | None = opt(
        None, "create the topic if it is missing", limits=(1, 10_000, True),
        metavar="PARTITIONS",
    )  # fmt: skip
    max_messages: int | None = opt(
        None, "stop after N messages finished", limits=(1, 2**63 - 1, True)
    )
    idle_exit: float | None = opt(
        None, "stop when nothing arrived for SECONDS", limits=(0, 31_536_000, False),
        metavar="SECONDS",
    )  # fmt: skip
    max_message_bytes: int | None = opt(
        None, "dead-letter larger messages", limits=(1, 2**31 - 1, True)
    )
    shutdown_seconds: float = opt(
        10.0, "bound on waiting for running work", limits=(0, 86_400, True)
    )
    sink_retry_seconds: float = opt(
        60.0, "how long to reconnect a lost exactly-once database before exit 1",
        limits=(0, 86_400, True),
    )  # fmt: skip
    batch_size: int = opt(1000, "messages per consume() call", limits=(1, 1_000_000, True))
    poll_wait_ms: float = opt(
        100.0, "longest wait of an idle consume() for its batch to fill, ms (shorter: lower "
        "latency, more wake-ups)", limits=(0, 10_000, False),
    )  # fmt: skip
    profile: str = opt(
        "throughput", "defaults tuned for throughput or low-latency (given options win)",
        choices=tuple(PROFILES),
    )  # fmt: skip
    connect_seconds: float = opt(
        10.0, "how long to wait for the broker", limits=(0, 86_400, False)
    )
    trace: str | None = opt(None, "append core transitions as JSON lines", metavar="FILE")
    max_retries: int = opt(
        _RETRY.max_retries, "retries before dead-lettering", limits=(0, 1_000_000, True)
    )
    backoff_ms: float = opt(
        _RETRY.base_delay * 1000.0, "first retry backoff, full jitter",
        limits=(0, 86_400_000, True),
    )
    backoff_max_ms: float = opt(
        _RETRY.max_delay * 1000.0, "backoff cap", limits=(0, 86_400_000, True)
    )
    breaker_consecutive: int = opt(
        10, "different messages failing in a row with one error class that open the "
        "circuit breaker (a number above the stream's size turns this trigger off)",
        limits=(1, 2**63 - 1, True),
    )  # fmt: skip
    breaker_failure_rate: float = opt(
        0.5, f"share of failed calls within {_BREAKER_WINDOW:g} s that opens the circuit "
        "breaker", limits=(0, 1, False),
    )  # fmt: skip
    breaker_min_calls: int = opt(
        20, f"calls within {_BREAKER_WINDOW:g} s before --breaker-failure-rate applies (a "
        "number above the stream's size turns this trigger off)", limits=(1, 2**63 - 1, True),
    )  # fmt: skip
    poison_threshold: int = opt(
        5, "failures within --poison-window that make poison", limits=(1, 1_000_000, True)
    )
    poison_window: float = opt(
        60.0, "see --poison-threshold", limits=(0, 31_536_000, False), metavar="SECONDS"
    )
    flow: str = opt("adaptive", "in-flight window: adaptive (AIMD) or fixed", choices=FLOWS)
    min_in_flight: int = opt(16, "smallest adaptive window", limits=(1, 10_000_000, True))
    latency_target_ms: float = opt(
        1000.0, "mean handler time that shrinks the window", limits=(0, 86_400_000, False)
    )
    max_in_flight_bytes: int = opt(
        256 * 1024 * 1024, "value bytes before pausing", limits=(1, 2**40, True)
    )
    metrics_port: int | None = opt(
        None, "serve /metrics, /state, /healthz, /readyz (0: a free port)",
        limits=(0, 65_535, True),
    )  # fmt: skip
    metrics_host: str = opt("127.0.0.1", "address for --metrics-port")
    liveness_seconds: float = opt(
        10.0, "/healthz fails when the poll loop has not turned for this long plus "
        "--shutdown-seconds", limits=(0, 86_400, False),
    )  # fmt: skip
    redis_url: str | None = opt(None, "mirror backpressure into redis://host:port/db")
    log_format: str = opt("text", "log lines as text or json", choices=LOG_FORMATS)
    batch: bool = opt(
        False, "the handler takes a list of one partition's messages, handler(msgs[, tx]); a "
        "call that raises is run again one message per call",
    )
    otel: bool = opt(False, "OpenTelemetry spans (extra: otel)")
    retry_topic: bool = opt(
        False, "long backoffs wait in <topic>.retry (each listed topic its own), freeing the "
        "partition (breaks per-key order)"
    )
    retry_topic_ms: float = opt(
        5000.0, "shortest backoff sent to the retry topic", limits=(0, 86_400_000, True)
    )
    permanent_errors: str | None = opt(
        None, "exception types never retried", metavar="MODULE:CLASS,..."
    )
    member_id: str | None = opt(
        None,
        "stable name of this member (transactional id, static membership); unique per "
        "live member",
    )
    retryable_errors: str | None = opt(
        None, "exception types always retried", metavar="MODULE:CLASS,..."
    )
    group_protocol: str = opt(
        "classic", "consumer-group protocol (consumer: KIP-848, Kafka 4+)",
        choices=GROUP_PROTOCOLS,
    )  # fmt: skip
    value_format: str = opt(
        "bytes", "decode values before the handler: msg.decoded_value() (a record that "
        "does not decode is dead-lettered)", choices=FORMATS,
    )  # fmt: skip
    key_format: str = opt(
        "bytes", "decode keys before the handler: msg.decoded_key()", choices=FORMATS
    )
    schema_registry: str | None = opt(
        None, "Confluent Schema Registry URL (avro, protobuf, json-schema)", metavar="URL"
    )
    protobuf_type: str | None = opt(
        None, "the generated Protobuf class of the values (--value-format protobuf)",
        metavar="MODULE:CLASS",
    )  # fmt: skip
    key_protobuf_type: str | None = opt(
        None, "the generated Protobuf class of the keys (--key-format protobuf)",
        metavar="MODULE:CLASS",
    )  # fmt: skip
    message_types: dict[str, Any] = field(
        default_factory=dict, metadata={"htmqc": Spec(cli=False)}
    )
    commit_metadata_bytes: int = opt(
        DEFAULT_LIMIT, "longest offset-commit metadata the broker takes (its "
        "offset.metadata.max.bytes); a partition whose out-of-order offsets could outgrow "
        "it is throttled", limits=(MIN_LIMIT, 2**31 - 1, True),
    )  # fmt: skip
    source: str = opt(
        "kafka", "the log to consume: kafka, nats (JetStream, one member; "
        "--bootstrap nats://HOST:PORT), rabbitmq-stream (RabbitMQ streams, one "
        "member; --bootstrap rabbitmq-stream://HOST:PORT), or pulsar (a partitioned "
        "Pulsar topic, one member; --bootstrap pulsar://HOST:PORT?admin-port=N)",
        choices=SOURCES,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Option:
    """One option as :data:`OPTIONS` lists it: ``kind`` is ``int``, ``float``,
    ``str`` or ``bool``; ``default`` is ``None`` for an optional one and
    :data:`REQUIRED_VALUE` for a required one."""

    name: str
    kind: type
    default: Any
    spec: Spec

    @property
    def flag(self) -> str:
        """The command-line flag (``--max-in-flight``)."""
        return "--" + self.name.replace("_", "-")


#: The default of a required option.
REQUIRED_VALUE: Any = MISSING
_KINDS = {"int": int, "float": float, "str": str, "bool": bool}


def _options() -> tuple[Option, ...]:
    out = []
    for f in fields(RunOptions):
        spec = f.metadata["htmqc"]
        if not spec.cli:
            continue
        kind = _KINDS[str(f.type).split("|")[0].strip()]
        out.append(Option(f.name, kind, f.default, spec))
    return tuple(out)


#: Every option that is a flag, a config-file key and an ``HTMQC_*`` variable.
OPTIONS: tuple[Option, ...] = _options()
