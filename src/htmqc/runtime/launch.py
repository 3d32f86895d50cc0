"""Start a run: load the handler, check the broker and topic, open the sink,
build the consumer and the :class:`~htmqc.runtime.loop.Engine`.

Every problem found here is a one-line :class:`~htmqc.errors.UsageError`
(bad input: exit 2) or :class:`~htmqc.errors.RuntimeFailure` (exit 1) that
names the fix; no secret (librdkafka passwords, URL passwords) is ever put in
a message.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from contextlib import ExitStack, suppress
from typing import TYPE_CHECKING, Any

from htmqc.core.retry import FailureKind
from htmqc.dlq.record import dlq_topic, poison_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.logs import LIBRDKAFKA_LOGGER, flush_repeats, limit_repeats
from htmqc.runtime import affinity
from htmqc.runtime.decode import wants_decoding
from htmqc.runtime.handlers import check_handler
from htmqc.runtime.loop import Engine
from htmqc.runtime.options import EXACTLY_ONCE, NATS, PULSAR, RABBITMQ_STREAM, RunOptions
from htmqc.runtime.subscription import Subscription

if TYPE_CHECKING:
    from htmqc.observe import Metrics
    from htmqc.runtime.decode import Decoders

log = logging.getLogger("htmqc.runtime")



def load_handler(spec: str) -> Callable[..., Any]:
    """The callable named ``MODULE:FUNCTION``.

    :raises UsageError: malformed spec, unknown module or function, not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"handler {spec!r} is not MODULE:FUNCTION", "pass e.g. examples.count:handle"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageError(
                f"handler module {module_name!r} not found",
                "check the name and that its directory is on PYTHONPATH",
            ) from None
        raise UsageError(
            f"handler module {module_name!r} failed to import: it needs {exc.name!r}",
            "install the missing module",
        ) from None
    except Exception as exc:
        raise UsageError(
            f"handler module {module_name!r} failed to import: {type(exc).__name__}: {exc}",
            "fix the module so that it imports",
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(
                f"module {module_name!r} has no attribute {attr!r}",
                "check the function name after the colon",
            )
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(
            f"handler {spec!r} is a {type(target).__name__}, not a function",
            "point at a function taking the message (and the transaction handle)",
        )
    return target  # type: ignore[no-any-return]


def load_error_kinds(options: RunOptions) -> dict[type[BaseException], FailureKind]:
    """The user's exception classification from ``--permanent-errors`` and
    ``--retryable-errors`` (comma-separated ``module:Class``).

    :raises UsageError: a name that is not ``module:Class``, cannot be imported,
        or is not an exception type; or a type named in both lists.
    """
    kinds: dict[type[BaseException], FailureKind] = {}
    for flag, text, kind in (
        ("--permanent-errors", options.permanent_errors, FailureKind.PERMANENT),
        ("--retryable-errors", options.retryable_errors, FailureKind.RETRYABLE),
    ):
        for name in (n.strip() for n in (text or "").split(",")):
            if not name:
                continue
            try:
                cls = load_handler(name)
            except UsageError as exc:
                raise UsageError(f"{flag}: {exc.problem}", exc.fix) from None
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise UsageError(
                    f"{flag}: {name} is not an exception class", "name an Exception subclass"
                )
            if kinds.get(cls, kind) is not kind:
                raise UsageError(
                    f"{name} is in both --permanent-errors and --retryable-errors",
                    "keep it in one of them",
                )
            kinds[cls] = kind
    return kinds


def check_topic(
    bootstrap: str,
    topic: str,
    create: int | None,
    connect_seconds: float,
    kafka_config: dict[str, Any] | None = None,
) -> None:
    """Wait (bounded) for the broker; make sure ``topic`` exists (or create it).

    ``kafka_config``: the user's librdkafka settings; the connection ones
    (TLS, SASL) are used for these checks too.

    :raises RuntimeFailure: the broker cannot be reached.
    :raises UsageError: the topic does not exist and ``create`` is not given.
    """
    from confluent_kafka.admin import AdminClient

    from htmqc.broker import connection_settings, create_topic, wait_reachable

    wait_reachable(bootstrap, timeout=connect_seconds, config=kafka_config)
    admin = AdminClient(
        {**connection_settings(kafka_config), "bootstrap.servers": bootstrap, "log_level": 0}
    )
    try:
        # All topics: asking for one by name may auto-create it on some brokers.
        meta = admin.list_topics(timeout=connect_seconds).topics.get(topic)
    except Exception as exc:
        raise RuntimeFailure(
            f"cannot read metadata of topic {topic!r} from {bootstrap}: {type(exc).__name__}",
            "check --bootstrap and that the broker is up",
        ) from None
    if meta is not None and meta.error is None and meta.partitions:
        return
    if create is None:
        raise UsageError(
            f"topic {topic!r} does not exist on {bootstrap}",
            "create it (htmqc produce, or pass --create-topic PARTITIONS)",
        )
    create_topic(bootstrap, topic, create, config=kafka_config)


def build_engine(
    handler: Callable[..., Any], options: RunOptions, *, metrics: Metrics | None = None
) -> Engine:
    """Everything :func:`run` needs, checked (the handler's signature first,
    before anything connects); the caller runs it."""
    check_handler(handler, options.mode)
    if options.python_cpu is not None:
        affinity.check(options.python_cpu)
    limit_repeats()  # htmqc's and librdkafka's repeated lines (htmqc.logs)
    decoders = None
    if wants_decoding(options):  # formats checked, Protobuf classes imported: no I/O yet
        from htmqc.serde import build_decoders

        decoders = build_decoders(options)
    # What is opened on the way (the registry client, the sink, the consumer) is
    # closed again if a later step refuses to start; the engine owns it otherwise.
    with ExitStack() as opened:
        if decoders is not None:
            opened.callback(_quietly, decoders.close)
        if options.source in STREAM_SOURCES:
            built = build_stream_engine(handler, options, metrics=metrics, decoders=decoders)
        else:
            built = _build_kafka_engine(handler, options, metrics, decoders, opened)
        opened.pop_all()
    return built


def _build_kafka_engine(
    handler: Callable[..., Any],
    options: RunOptions,
    metrics: Metrics | None,
    decoders: Decoders | None,
    opened: ExitStack,
) -> Engine:
    """:func:`build_engine` for a Kafka source; what it opens is pushed on ``opened``."""
    from confluent_kafka import Consumer, KafkaException, Producer

    from htmqc.kafka_defaults import consumer_config, producer_config
    from htmqc.sinks import open_sink

    if options.mode == EXACTLY_ONCE and not options.sink:
        raise UsageError(
            "exactly-once needs a sink",
            "pass --sink sqlite:///PATH (or postgresql://, kafka:TOPIC)",
        )
    sink = None
    if options.mode == EXACTLY_ONCE:
        assert options.sink is not None
        sink = open_sink(
            options.sink,
            bootstrap=options.bootstrap,
            kafka_config=producer_overrides(options.kafka_config),
            member_id=options.member_id,
            metadata_max_bytes=options.commit_metadata_bytes,
        )
        opened.callback(_quietly, sink.close)
        if options.retry_topic and not sink.writes_kafka:
            raise UsageError(
                "--retry-topic with a database sink cannot move a message atomically",
                "use at-least-once or a kafka: sink, or drop --retry-topic",
            )
    subscription = Subscription.of(options.topic, options.retry_topic)
    if subscription.pattern and sink is not None and sink.writes_kafka:
        raise UsageError(
            "a kafka: sink writes dead letters inside its transactions, to DLQ topics that "
            f"must exist first; a pattern (--topic {options.topic!r}) names none in advance",
            "list the topics (--topic a,b) with a kafka: sink",
        )
    if subscription.pattern:
        from htmqc.broker import wait_reachable

        wait_reachable(options.bootstrap, timeout=options.connect_seconds,
                       config=options.kafka_config)
    for topic in () if subscription.pattern else subscription.topics:
        check_topic(
            options.bootstrap,
            topic,
            options.create_topic,
            options.connect_seconds,
            options.kafka_config,
        )
    for name in subscription.retry_topics().values() if options.retry_topic else ():
        _ensure_topic(options.bootstrap, name, options.kafka_config)
    dead_letter_topics = [name for topic in subscription.topics if not subscription.pattern
                          for name in (dlq_topic(topic), poison_topic(topic))]
    if sink is not None:
        sink.open(options.group)
        if sink.writes_kafka:  # its dead letters are written inside its transactions
            for name in dead_letter_topics:
                _ensure_topic(options.bootstrap, name, options.kafka_config)
    engine: list[Engine] = []
    config = consumer_config(
        options.bootstrap,
        options.group,
        dict(options.kafka_config),
        group_protocol=options.group_protocol,
    )
    if options.member_id and "group.instance.id" not in config:
        config["group.instance.id"] = options.member_id
    config["on_commit"] = lambda err, parts: engine[0].on_commit(err, parts)

    users_cb = config.get("error_cb")

    def on_error(err: Any) -> None:
        """Errors such as "all brokers down" reach ``error_cb`` only, never ``consume``;
        a callback of the user's own (``kafka_config``) is called too, first."""
        if callable(users_cb):
            users_cb(err)
        if engine:
            engine[0].on_consumer_error(err)

    config["error_cb"] = on_error
    config.setdefault("logger", librdkafka_logger())
    try:
        consumer = Consumer(config)
    except KafkaException as exc:
        raise UsageError(
            f"invalid Kafka setting: {exc.args[0].str() if exc.args else 'unknown'}",
            "check the --kafka-config keys and values",
        ) from None
    opened.callback(_quietly, consumer.close)

    def producer() -> Any:
        """The dead-letter (and retry-topic) producer; its topics are created if missing
        (a pattern's, when first written to)."""
        for name in dead_letter_topics:
            _ensure_topic(options.bootstrap, name, options.kafka_config)
        made = Producer(
            producer_config(options.bootstrap, producer_overrides(options.kafka_config))
        )
        if not subscription.pattern:
            return made
        return CreatingProducer(
            made, lambda name: _ensure_topic(options.bootstrap, name, options.kafka_config)
        )

    engine.append(
        Engine(
            handler,
            options,
            consumer,
            sink=sink,
            producer_factory=producer,
            metrics=metrics,
            error_kinds=load_error_kinds(options),
            decoders=decoders,
        )
    )
    return engine[0]


def _quietly(close: Callable[[], object]) -> None:
    """``close()``, its own failure suppressed: the start-up error that made the
    caller clean up is the one to report."""
    with suppress(Exception):
        close()


class CreatingProducer:
    """A producer that creates each topic the first time it writes to it: the DLQ
    topics of a pattern subscription's topics are not known when it starts.
    Everything else is the wrapped producer's."""

    def __init__(self, producer: Any, ensure: Callable[[str], None]) -> None:
        self._producer = producer
        self._ensure = ensure
        self._known: set[str] = set()

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """``ensure(topic)`` once, then the wrapped ``produce``."""
        if topic not in self._known:
            self._ensure(topic)
            self._known.add(topic)
        self._producer.produce(topic, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)
#: The non-Kafka sources: ``--source`` value -> (name in messages, its module).
STREAM_SOURCES = {
    NATS: ("NATS", "nats"), RABBITMQ_STREAM: ("RabbitMQ", "rabbitmq"), PULSAR: ("Pulsar", "pulsar")
}


def check_stream_options(options: RunOptions) -> None:
    """Refuse what does not apply to a non-Kafka source (``--source nats``,
    ``rabbitmq-stream`` or ``pulsar``), one line each, before anything connects.

    :raises UsageError: a bad ``--bootstrap``, a topic or group the source cannot
        name, exactly-once without a SQL sink, a ``kafka:`` sink, ``--retry-topic``
        exactly-once, ``--kafka-config``, ``--group-protocol consumer`` or
        ``--member-id``.
    """
    from htmqc.sinks.urls import parse_sink_url

    name, module = STREAM_SOURCES[options.source]
    source = options.source
    adapter = importlib.import_module(f"htmqc.sources.{module}")
    adapter.check_name("topic", options.topic)
    adapter.check_name("group", options.group)
    if source == NATS:
        adapter.address_of(options.bootstrap)
    else:
        adapter.endpoint_of(options.bootstrap)
    if options.mode == EXACTLY_ONCE and not options.sink:
        raise UsageError(
            "exactly-once needs a sink", "pass --sink sqlite:///PATH (or postgresql://...)"
        )
    if options.sink and parse_sink_url(options.sink).kind == "kafka":
        raise UsageError(
            f"a kafka: sink cannot commit a {name} source's positions atomically",
            f"use --sink sqlite:///PATH or postgresql://... with --source {source}",
        )
    if options.retry_topic and options.mode == EXACTLY_ONCE:
        raise UsageError(
            "--retry-topic with a database sink cannot move a message atomically",
            "use at-least-once, or drop --retry-topic",
        )
    if options.kafka_config:
        raise UsageError(
            f"--kafka-config (librdkafka settings) does not apply to --source {source}",
            "drop the [kafka] settings and HTMQC_KAFKA_* variables",
        )
    if options.group_protocol != "classic":
        raise UsageError(
            f"--group-protocol does not apply to --source {source} (one member, no group "
            "protocol)",
            "drop --group-protocol",
        )
    if options.member_id:
        raise UsageError(
            f"--member-id does not apply to --source {source} (no static membership, no "
            "Kafka transactions)",
            "drop --member-id",
        )


def build_stream_engine(
    handler: Callable[..., Any],
    options: RunOptions,
    *,
    metrics: Metrics | None = None,
    decoders: Any = None,
) -> Engine:
    """:func:`build_engine` for a non-Kafka source: the options checked
    (:func:`check_stream_options`), the topic's streams made sure of (created with
    ``--create-topic``), the sink opened, the adapter's consumer built
    (:class:`~htmqc.sources.nats.NatsConsumer`,
    :class:`~htmqc.sources.rabbitmq.RabbitStreamConsumer`,
    :class:`~htmqc.sources.pulsar.PulsarConsumer`); dead letters of
    at-least-once go to the source's own streams (its producer class)."""
    from htmqc.sinks import open_sink

    check_stream_options(options)
    if options.source == NATS:
        from htmqc.sources.nats import NatsClient as Client
        from htmqc.sources.nats import NatsConsumer as Consumer
        from htmqc.sources.nats import NatsProducer as Producer
        from htmqc.sources.nats import stream_name
    elif options.source == PULSAR:
        from htmqc.sources.pulsar import PulsarClient as Client  # type: ignore[assignment]
        from htmqc.sources.pulsar import PulsarConsumer as Consumer  # type: ignore[assignment]
        from htmqc.sources.pulsar import PulsarProducer as Producer  # type: ignore[assignment]
        from htmqc.sources.pulsar import partition_topic as stream_name
    else:
        from htmqc.sources.rabbitmq import RabbitStreamClient as Client  # type: ignore[assignment]
        from htmqc.sources.rabbitmq import (  # type: ignore[assignment]
            RabbitStreamConsumer as Consumer,
        )
        from htmqc.sources.rabbitmq import (  # type: ignore[assignment]
            RabbitStreamProducer as Producer,
        )
        from htmqc.sources.rabbitmq import stream_name

    client = Client(options.bootstrap, options.connect_seconds)
    try:
        if client.partitions(options.topic) == 0:
            if options.create_topic is None:
                raise UsageError(
                    f"topic {options.topic!r} does not exist on {options.bootstrap} (no stream "
                    f"{stream_name(options.topic, 0)})",
                    "create it, or pass --create-topic PARTITIONS",
                )
            client.create_topic(options.topic, options.create_topic)
        if options.retry_topic:
            client.create_retry_topic(options.topic)
    finally:
        client.close()
    sink = None
    if options.mode == EXACTLY_ONCE:
        assert options.sink is not None
        sink = open_sink(options.sink, bootstrap=options.bootstrap, member_id=options.member_id)
        sink.open(options.group)
    engine: list[Engine] = []
    try:
        consumer = Consumer(
            options.bootstrap,
            options.group,
            on_commit=lambda err, parts: engine[0].on_commit(err, parts),
            connect_seconds=options.connect_seconds,
        )
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    engine.append(
        Engine(
            handler,
            options,
            consumer,
            sink=sink,
            producer_factory=lambda: Producer(options.bootstrap, options.topic),
            metrics=metrics,
            error_kinds=load_error_kinds(options),
            decoders=decoders,
        )
    )
    return engine[0]


def _ensure_topic(bootstrap: str, name: str, kafka_config: dict[str, Any] | None = None) -> None:
    """Create ``name`` (one partition) unless it exists."""
    from htmqc.broker import create_topic
    from htmqc.errors import HtmqcError

    try:
        create_topic(bootstrap, name, 1, config=kafka_config)
    except HtmqcError as exc:  # exists already (maybe with other partitions): fine
        log.debug("topic %s: %s", name, exc.line())


#: librdkafka consumer-only settings that a producer refuses.
_CONSUMER_ONLY = (
    "group.",
    "session.",
    "heartbeat.",
    "max.poll.",
    "auto.offset.",
    "enable.auto.",
    "isolation.",
    "partition.assignment.",
    "fetch.",
    "auto.commit.",
)


def librdkafka_logger() -> logging.Logger:
    """The logger librdkafka's own lines go to (``htmqc.librdkafka``, as
    confluent-kafka's ``logger`` setting), rate-limited with htmqc's own loggers
    by :func:`htmqc.logs.limit_repeats`."""
    limit_repeats()
    return logging.getLogger(LIBRDKAFKA_LOGGER)


def producer_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The ``--kafka-config`` settings that also apply to producers."""
    return {k: v for k, v in config.items() if not k.startswith(_CONSUMER_ONLY)}


def run(spec: str, options: RunOptions) -> int:
    """Load ``spec`` (``MODULE:FUNCTION``) and run it until stopped; return the
    messages finished (:func:`run_handler`)."""
    return run_handler(load_handler(spec), options)


def run_handler(handler: Callable[..., Any], options: RunOptions) -> int:
    """Run ``handler`` until stopped (SIGTERM/SIGINT on the main thread, or
    ``max_messages``, ``idle_exit``); return the messages finished."""
    engine, metrics = prepare(handler, options)
    return serve(engine, metrics, options)


def prepare(handler: Callable[..., Any], options: RunOptions) -> tuple[Engine, Metrics | None]:
    """Everything checked and connected, nothing consumed yet: the engine, and the
    metrics it reports to when ``metrics_port`` is set.

    :raises UsageError: a bad handler, option or URL (before anything connects).
    :raises RuntimeFailure: the broker or the sink cannot be reached.
    """
    from htmqc.observe import Metrics
    from htmqc.observe.redis_mirror import parse_redis_url

    if options.redis_url:
        parse_redis_url(options.redis_url)  # bad URLs fail before anything starts
    metrics = Metrics() if options.metrics_port is not None else None
    return build_engine(handler, options, metrics=metrics), metrics


def serve(
    engine: Engine,
    metrics: Metrics | None,
    options: RunOptions,
    *,
    install_signals: bool = True,
    ready: threading.Event | None = None,
) -> int:
    """Run a prepared engine until it stops; return the messages finished.

    With ``metrics_port`` set, ``/metrics``, ``/state``, ``/state.json``,
    ``/healthz`` and ``/readyz`` are served on ``metrics_host`` for the whole run
    (from the engine's last published snapshot: never waiting for its lock); with
    ``redis_url`` the backpressure state is mirrored into Redis
    (:mod:`htmqc.observe.redis_mirror`). ``install_signals``: SIGTERM and SIGINT
    stop the engine (only possible on the main thread). ``ready`` is set once the
    servers are up and the engine starts; if they fail first, the engine is
    discarded (its consumer and sink closed) and the error raised.
    """
    from htmqc.observe import ObserveServer
    from htmqc.observe.redis_mirror import RedisMirror

    source = engine.snapshot  # readers never wait for the engine's lock
    server: ObserveServer | None = None
    mirror: RedisMirror | None = None
    running = False
    try:
        if metrics is not None:
            assert options.metrics_port is not None
            metrics.source = source
            server = ObserveServer(metrics, host=options.metrics_host, health=engine)
            server.start(options.metrics_port)
            log.info("metrics on %s/metrics, live state on %s/state", server.url, server.url)
        if options.redis_url:
            mirror = RedisMirror(options.redis_url, options.group, source)
            mirror.start()
            log.info("mirroring backpressure to redis key %s", mirror.key)
        running = True
        if ready is not None:
            ready.set()
        return engine.run(install_signals=install_signals)
    except BaseException:
        if not running:
            engine.discard()
        raise
    finally:
        if mirror is not None:
            mirror.stop()
        if server is not None:
            server.stop()
        flush_repeats()  # the count of every line held back, before the run ends
