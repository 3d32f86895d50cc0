"""The options of the ``htmqc-kafka`` source: Spark's Kafka connector's names and
meanings, checked when the query is defined (``load()``), not when it runs.

:func:`parse_options` turns the reader's options into a frozen
:class:`SourceOptions` or raises :class:`~htmqc.errors.UsageError` whose one line
names the option, the bad value and the fix. Option keys are case-insensitive
(as Spark's are); values keep their case except the words ``earliest``,
``latest``, ``true``, ``false``, ``error``.

Supported (see the README's Spark section for the table):

* ``kafka.bootstrap.servers`` (required) and any other ``kafka.``-prefixed
  setting, handed to librdkafka without the prefix (its names, which for the
  common settings are the Java client's: ``kafka.security.protocol`` ...);
  ``kafka.isolation.level`` defaults to ``read_committed`` (Spark's connector:
  ``read_uncommitted``);
* exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern``
  (a regular expression matched against whole topic names), ``assign``
  (JSON ``{"topic": [0, 1]}``);
* ``startingOffsets`` (``earliest``, ``latest``, or JSON
  ``{"topic": {"0": 42, "1": -2}}`` with -2 = earliest, -1 = latest, naming
  every partition read), ``startingOffsetsByTimestamp`` (JSON of epoch
  milliseconds per partition), ``startingTimestamp`` (one time for all),
  ``startingOffsetsByTimestampStrategy`` (``error`` or ``latest``: what a
  partition with no record at or after the time starts from); timestamps take
  precedence over offsets, as in Spark;
* batch queries only: ``endingOffsets`` (``latest`` or JSON, -1 = latest),
  ``endingOffsetsByTimestamp``, ``endingTimestamp``;
* streaming only: ``maxOffsetsPerTrigger`` (offsets per micro-batch over all
  partitions, split by each partition's backlog);
* ``includeHeaders`` (adds the ``headers`` column), ``failOnDataLoss`` (default
  ``true``), ``kafkaConsumer.pollTimeoutMs`` (how long a read waits for a missing
  record; default 120000).

Spark connector options this source does not implement (``minPartitions``,
``maxTriggerDelay`` ...) are rejected with a pointer to ``format("kafka")``; so
are the settings Spark forbids (``kafka.group.id`` is not used: no group is
joined) and htmqc's old names (``bootstrap``, ``topics``, ``maxRecordsPerBatch``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from htmqc.errors import UsageError

EARLIEST, LATEST = -2, -1
"""Spark's markers in offset JSON: -2 = the partition's earliest offset, -1 = its end."""

NAME = "htmqc-kafka"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

_OLD_NAMES = {
    "bootstrap": "kafka.bootstrap.servers",
    "topics": "subscribe",
    "maxrecordsperbatch": "maxOffsetsPerTrigger",
    "polltimeout": "kafkaConsumer.pollTimeoutMs (milliseconds)",
}
_SPARK_ONLY = (
    "minPartitions",
    "maxPartitions",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupIdPrefix",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "kafkaConsumer.fetchTimeoutMs",
)
_FORBIDDEN_KAFKA = {
    "group.id": "htmqc-kafka joins no consumer group; offsets live in the checkpoint",
    "auto.offset.reset": "use startingOffsets",
    "enable.auto.commit": "offsets live in the checkpoint",
    "key.deserializer": "keys are binary; cast them in a select",
    "value.deserializer": "values are binary; cast them in a select",
    "interceptor.classes": "librdkafka has no interceptors",
}
_KNOWN = (
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
    "maxOffsetsPerTrigger",
    "includeHeaders",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
)
_BATCH_ONLY = ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp")
_STREAM_ONLY = ("maxoffsetspertrigger",)


@dataclass(frozen=True)
class Offsets:
    """Where to start or end: ``earliest``/``latest`` everywhere, or per partition.

    ``per_partition`` maps ``(topic, partition)`` to an offset, or to
    :data:`EARLIEST` / :data:`LATEST`.
    """

    where: Literal["earliest", "latest", "specific"]
    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Timestamps:
    """Start or end by record time: epoch milliseconds per partition, or one for all."""

    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)
    everywhere: int | None = None
    if_none: Literal["error", "latest"] = "error"


Position = Offsets | Timestamps


@dataclass(frozen=True)
class SourceOptions:
    """The checked options of one ``htmqc-kafka`` query (see the module docs)."""

    bootstrap: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    starting: Position = Offsets("latest")
    ending: Position = Offsets("latest")
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    kafka: Mapping[str, str] = field(default_factory=dict)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is read by this query (subscribe, pattern or assign)."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign:
            return any(t == topic for t, _ in self.assign)
        return topic in self.subscribe

    def consumer_config(self) -> dict[str, str]:
        """librdkafka settings: ``kafka.*`` without the prefix (bootstrap included)."""
        return {"isolation.level": "read_committed", **self.kafka}


def _bad(option: str, value: str, why: str, fix: str) -> UsageError:
    shown = value if len(value) <= 80 else value[:77] + "..."
    return UsageError(f"{NAME}: option {option}={shown!r} {why}", fix)


def _json(option: str, value: str, example: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise _bad(option, value, "is not JSON nor a keyword", f"use e.g. {example}") from None


def _integer(option: str, value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise _bad(option, value, "is not an integer", f"pass an integer >= {minimum}") from None
    if number < minimum:
        raise _bad(option, value, f"is below {minimum}", f"pass an integer >= {minimum}")
    return number


def _boolean(option: str, value: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise _bad(option, value, "is not a boolean", "pass true or false")
    return word == "true"


def _topic(option: str, value: str, name: str) -> str:
    if not _TOPIC.match(name):
        raise _bad(option, value, f"names an invalid topic {name!r}", "use [A-Za-z0-9._-]")
    return name


def _per_partition(
    option: str, value: str, allowed: tuple[int, ...], example: str
) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": n}}`` as ``{(topic, 0): n}``; each ``n`` >= 0 or in ``allowed``."""
    data = _json(option, value, example)
    if not isinstance(data, dict) or not data:
        raise _bad(option, value, "is not a JSON object of topics", f"use e.g. {example}")
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        _topic(option, value, topic)
        if not isinstance(parts, dict) or not parts:
            raise _bad(option, value, f"has no partitions for {topic!r}", f"use e.g. {example}")
        for part, number in parts.items():
            if not (isinstance(part, str) and part.isdigit()):
                raise _bad(option, value, f"has partition {part!r}", "partitions are 0, 1, ...")
            if type(number) is not int or (number < 0 and number not in allowed):
                words = ", ".join(str(a) for a in allowed)
                raise _bad(
                    option, value, f"has {number!r} for {topic}/{part}",
                    f"offsets are integers >= 0{' or ' + words if words else ''}",
                )  # fmt: skip
            out[(topic, int(part))] = number
    return out


def _position(opts: dict[str, str], prefix: str, batch: bool) -> Position:
    """``startingOffsets`` & co (``prefix`` ``starting``) or ``ending...``."""
    ending = prefix == "ending"
    name = f"{prefix}Offsets"
    strategy_key = "startingoffsetsbytimestampstrategy"
    strategy = opts.get(strategy_key, "error").strip().lower() if not ending else "error"
    if strategy not in ("error", "latest"):
        raise _bad(
            "startingOffsetsByTimestampStrategy", opts[strategy_key], "is unknown",
            "pass error or latest",
        )  # fmt: skip
    if f"{prefix}timestamp" in opts:
        at = _integer(f"{prefix}Timestamp", opts[f"{prefix}timestamp"], 0)
        return Timestamps(everywhere=at, if_none=strategy)  # type: ignore[arg-type]
    if f"{prefix}offsetsbytimestamp" in opts:
        times = _per_partition(
            f"{name}ByTimestamp", opts[f"{prefix}offsetsbytimestamp"], (),
            '{"topic": {"0": 1700000000000}}',
        )  # fmt: skip
        return Timestamps(per_partition=times, if_none=strategy)  # type: ignore[arg-type]
    raw = opts.get(name.lower())
    default = "latest" if ending or not batch else "earliest"
    word = (raw if raw is not None else default).strip()
    if word.lower() == "earliest":
        if ending:
            raise _bad(name, word, "is not allowed", "end at latest or at given offsets")
        return Offsets("earliest")
    if word.lower() == "latest":
        if batch and not ending:
            raise _bad(name, word, "is not allowed for a batch read", "start at earliest")
        return Offsets("latest")
    allowed = (LATEST,) if ending else (EARLIEST, LATEST)
    example = '{"topic": {"0": 42, "1": -1}}'
    return Offsets("specific", _per_partition(name, word, allowed, example))


def _subscription(opts: dict[str, str]) -> dict[str, Any]:
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        problem = "needs one of" if not chosen else "takes only one of"
        raise UsageError(
            f"{NAME} {problem} the options subscribe, subscribePattern, assign",
            "e.g. .option('subscribe', 'topic1,topic2')",
        )
    key = chosen[0]
    value = opts[key]
    if key == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise _bad("subscribe", value, "names no topic", "pass topic1,topic2")
        return {"subscribe": tuple(_topic("subscribe", value, t) for t in topics)}
    if key == "subscribepattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise _bad("subscribePattern", value, f"is not a regex ({exc})", "fix it") from None
        return {"pattern": value}
    example = '{"topic": [0, 1]}'
    data = _json("assign", value, example)
    if not isinstance(data, dict) or not data:
        raise _bad("assign", value, "is not a JSON object of topics", f"use e.g. {example}")
    pairs: list[tuple[str, int]] = []
    for topic, parts in data.items():
        _topic("assign", value, topic)
        if not isinstance(parts, list) or not parts:
            raise _bad("assign", value, f"has no partition list for {topic!r}", example)
        for part in parts:
            if type(part) is not int or part < 0:
                raise _bad("assign", value, f"has partition {part!r}", "partitions are 0, 1, ...")
            pairs.append((topic, part))
    return {"assign": tuple(sorted(set(pairs)))}


def _check_named_topics(options: SourceOptions) -> None:
    """Topics named in offset JSON must be read by the query."""
    for where, position in (
        ("startingOffsets", options.starting),
        ("endingOffsets", options.ending),
    ):
        named = position.per_partition.keys()
        for topic, part in sorted(named):
            if not options.matches(topic):
                raise UsageError(
                    f"{NAME}: {where} names {topic}/{part}, which this query does not read",
                    "name only subscribed topics",
                )
            if options.assign and (topic, part) not in options.assign:
                raise UsageError(
                    f"{NAME}: {where} names {topic}/{part}, which assign does not list",
                    "name only assigned partitions",
                )


def parse_options(options: Mapping[str, str], *, batch: bool) -> SourceOptions:
    """Check ``options`` for a streaming (``batch=False``) or a batch read.

    :raises UsageError: a missing, unknown, misplaced or malformed option.
    """
    opts = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
    kafka: dict[str, str] = {}
    known = {k.lower() for k in _KNOWN}
    spark_only = {k.lower(): k for k in _SPARK_ONLY}
    for key, value in opts.items():
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            setting = key[len("kafka.") :]
            if setting in _FORBIDDEN_KAFKA:
                raise UsageError(
                    f"{NAME}: option kafka.{setting} is not supported", _FORBIDDEN_KAFKA[setting]
                )
            kafka[setting] = value
        elif key in _OLD_NAMES:
            raise UsageError(f"{NAME}: option {key} was renamed", f"use {_OLD_NAMES[key]}")
        elif key in spark_only:
            raise UsageError(
                f"{NAME}: option {spark_only[key]} is not supported",
                "use Spark's connector, format('kafka'), for it",
            )
        elif key not in known and key != "kafka.bootstrap.servers":
            raise UsageError(
                f"{NAME}: unknown option {key!r}",
                f"known: kafka.bootstrap.servers, kafka.*, {', '.join(_KNOWN)}",
            )
        elif (batch and key in _STREAM_ONLY) or (not batch and key in _BATCH_ONLY):
            kind = "streaming" if batch else "batch"
            raise UsageError(
                f"{NAME}: option {key} applies to {kind} queries only",
                "drop it, or use spark.read" if kind == "batch" else "drop it",
            )
    bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise UsageError(
            f"{NAME} needs the option kafka.bootstrap.servers",
            "e.g. .option('kafka.bootstrap.servers', 'host:9092')",
        )
    level = kafka.get("isolation.level", "read_committed")
    if level not in ("read_committed", "read_uncommitted"):
        raise _bad(
            "kafka.isolation.level", level, "is unknown", "read_committed or ..._uncommitted"
        )
    limit = opts.get("maxoffsetspertrigger")
    parsed = SourceOptions(
        bootstrap=bootstrap,
        **_subscription(opts),
        starting=_position(opts, "starting", batch),
        ending=_position(opts, "ending", batch),
        max_offsets_per_trigger=None
        if limit is None
        else _integer("maxOffsetsPerTrigger", limit, 1),
        include_headers=_boolean("includeHeaders", opts.get("includeheaders", "false")),
        fail_on_data_loss=_boolean("failOnDataLoss", opts.get("failondataloss", "true")),
        poll_timeout_ms=_integer(
            "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", "120000"), 1
        ),
        kafka={"bootstrap.servers": bootstrap, **kafka},
    )
    _check_named_topics(parsed)
    return parsed


def schema(include_headers: bool) -> str:
    """The rows' schema: Spark's Kafka source's columns, ``headers`` if asked for."""
    columns = (
        "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, "
        "timestamp TIMESTAMP, timestampType INT"
    )
    return columns + (
        ", headers ARRAY<STRUCT<key: STRING, value: BINARY>>" if include_headers else ""
    )
