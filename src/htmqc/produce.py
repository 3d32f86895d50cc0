"""Write numbered test messages to a topic, fast; read their numbers back.

Message format (shared by ``htmqc produce``, the demo and the audits). Message
number ``i`` (0-based and unique within a produce run; ``start_id`` shifts it):

- key: ``f"k{i % keys}"`` as UTF-8, or no key when ``keys == 0``;
- value: ``f"{i:012d}"`` as ASCII, padded with ``b"."`` to ``size`` bytes
  (``size >= 12``), so :func:`parse_id` reads the id from the first 12 bytes;
- header: ``("htmqc-id", str(i))``;
- timestamp: the produce time (CreateTime, set by the client).

With ``transactional=True`` messages are written in transactions of
:data:`TRANSACTION_SIZE`; with ``abort_every=N`` every N-th transaction
(the N-th, 2N-th, ...) is aborted instead of committed. Aborted messages do not
count as produced and their ids are returned in ``ProduceReport.aborted_ids``.
Every transaction leaves its marker on each partition it touched, one offset
that no reader ever receives, so consumers see offset gaps.

Aborted records are kept in the client and purged by the abort, so the broker
sees only the abort marker. Reason: the bundled broker (Tansu 0.6) does not
hide aborted records that reached it from ``read_committed`` readers (real
Kafka does); ``tests/broker/test_produce.py`` pins that behaviour. To keep them
client-side the transactional producer lingers (``linger.ms`` of 30 s) until
commit; if a batch still leaves early (values so large that 1000 of them
exceed ``message.max.bytes``), ``ProduceReport.aborted_written`` counts the
aborted records that reached the broker.

An abort can overtake the registration of the transaction's partitions
(librdkafka issue 4849: EndTxn reaches the coordinator while it still holds the
transaction as empty, and Apache Kafka answers INVALID_TXN_STATE, fatal to the
producer). Nothing of that transaction is on the broker then, so produce
carries on with a new producer of the same transactional id, whose
``init_transactions`` would abort anything that was.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from htmqc.broker import create_topic, wait_reachable
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_defaults import producer_config
from htmqc.progress import progress as show_progress
from htmqc.records_file import Record

ID_WIDTH = 12
ID_HEADER = "htmqc-id"
PAD = b"."
TRANSACTION_SIZE = 1000
_TRANSACTIONAL_TIMING = {
    "linger.ms": 30_000,  # hold records until commit_transaction flushes them
    "message.timeout.ms": 60_000,  # must exceed linger.ms, at most transaction.timeout.ms
    "batch.num.messages": 1_000_000,
    "batch.size": 2_147_483_647,
}


def message_key(i: int, keys: int) -> bytes | None:
    """Key of message ``i``: ``k{i % keys}``, or ``None`` when ``keys == 0``."""
    return f"k{i % keys}".encode() if keys else None


def message_value(i: int, size: int) -> bytes:
    """Value of message ``i``: its zero-padded id, padded with dots to ``size`` bytes."""
    head = f"{i:0{ID_WIDTH}d}".encode()
    return head + PAD * (size - len(head))


def parse_id(value: bytes) -> int:
    """The message number written by :func:`message_value`."""
    return int(value[:ID_WIDTH])


@dataclass(frozen=True)
class ProduceReport:
    """What a produce run wrote: ``count`` committed messages in ``seconds``."""

    count: int
    seconds: float
    rate: float
    aborted_ids: tuple[int, ...] = field(default=())
    aborted_written: int = 0


def validate(count: int, keys: int, size: int, start_id: int, abort_every: int) -> None:
    """Raise :class:`UsageError` for arguments ``produce`` cannot honour."""
    if count <= 0:
        raise UsageError(f"--count must be positive, got {count}", "pass --count 1 or more")
    if size < ID_WIDTH:
        raise UsageError(
            f"--size must be at least {ID_WIDTH} bytes (the id), got {size}",
            f"pass --size {ID_WIDTH} or more",
        )
    if keys < 0:
        raise UsageError(f"--keys must be 0 or more, got {keys}", "pass --keys 0 for no keys")
    if start_id < 0:
        raise UsageError(f"--start-id must be 0 or more, got {start_id}", "pass --start-id 0")
    if abort_every < 0:
        raise UsageError(
            f"--abort-every must be 0 or more, got {abort_every}", "pass 0 to abort nothing"
        )


DeliveryCallback = Callable[[KafkaError | None, Message], None]


def _delivery_checker() -> tuple[DeliveryCallback, list[str]]:
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None and len(errors) < 5:
            errors.append(err.str())

    return on_delivery, errors


def _aborted_delivery_counter() -> tuple[DeliveryCallback, list[int]]:
    """Count aborted records that reached the broker; purge errors are expected."""
    written = [0]

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            written[0] += 1

    return on_delivery, written


Headers = list[tuple[str, str | bytes | None]]
#: ``make(i)``: the value, key and headers of message ``i``.
Make = Callable[[int], tuple[bytes, bytes | None, Headers | None]]


def _numbered(keys: int, size: int) -> Make:
    """Messages in the module's numbered format."""
    pad = PAD * (size - ID_WIDTH)

    def make(i: int) -> tuple[bytes, bytes | None, Headers | None]:
        key = f"k{i % keys}".encode() if keys else None
        return f"{i:0{ID_WIDTH}d}".encode() + pad, key, [(ID_HEADER, str(i))]

    return make


def _given(records: Sequence[Record], start_id: int) -> Make:
    """The caller's ``(key, value)`` records, message ``i`` being ``records[i - start_id]``."""

    def make(i: int) -> tuple[bytes, bytes | None, Headers | None]:
        key, value = records[i - start_id]
        return value, key, None

    return make


def _send(
    producer: Producer,
    topic: str,
    ids: range,
    make: Make,
    on_delivery: DeliveryCallback,
) -> None:
    for i in ids:
        value, key, headers = make(i)
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain it
    producer.poll(0)


def _abort_overtook_registration(exc: KafkaException) -> bool:
    """Whether ``abort_transaction`` failed as in librdkafka issue 4849 (module docs)."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_TXN_STATE


def _flush(producer: Producer, timeout: float) -> None:
    remaining = producer.flush(timeout)
    if remaining:
        raise RuntimeFailure(
            f"{remaining} messages were not delivered within {timeout:g}s",
            "check the broker is running and reachable",
        )


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    keys: int = 1000,
    size: int = 100,
    partitions: int | None = None,
    start_id: int = 0,
    transactional: bool = False,
    abort_every: int = 0,
    progress: bool = False,
    flush_timeout: float = 60.0,
    reach_timeout: float = 5.0,
    kafka_config: dict[str, Any] | None = None,
    records: Sequence[Record] | None = None,
) -> ProduceReport:
    """Write ``count`` messages numbered ``start_id..start_id+count-1`` to ``topic``.

    ``records``: send the first ``count`` of these ``(key, value)`` pairs instead
    of numbered messages (no ``htmqc-id`` header; ``keys`` and ``size`` unused),
    e.g. from :func:`htmqc.records_file.read_records`.

    Waits up to ``reach_timeout`` seconds for the broker, then creates the
    topic when ``partitions`` is given. Returns after every
    message is acknowledged (or its transaction committed/aborted); raises
    :class:`RuntimeFailure` if any delivery failed. ``kafka_config``: librdkafka
    settings for the producer (TLS, SASL...), applied before htmqc's own.
    """
    validate(count, keys, size, start_id, abort_every)
    if abort_every and not transactional:
        raise UsageError("--abort-every needs --transactional", "add --transactional")
    if records is not None:
        if abort_every:
            raise UsageError("--abort-every writes test messages only", "leave it out with --from")
        if count > len(records):
            raise UsageError(
                f"--count {count} is more than the {len(records)} records given",
                f"pass --count {len(records)} or less, or leave it out",
            )
    make = _numbered(keys, size) if records is None else _given(records, start_id)
    wait_reachable(bootstrap, timeout=reach_timeout, config=kafka_config)
    if partitions is not None:
        create_topic(bootstrap, topic, partitions, config=kafka_config)
    on_delivery, errors = _delivery_checker()
    on_aborted_delivery, aborted_written = _aborted_delivery_counter()
    tx_id = f"htmqc-produce-{uuid.uuid4().hex[:12]}" if transactional else None
    overrides = _TRANSACTIONAL_TIMING if transactional else None
    settings = {**(kafka_config or {}), **(overrides or {})}

    def new_producer() -> Producer:
        try:
            return Producer(producer_config(bootstrap, settings, transactional_id=tx_id))
        except KafkaException as exc:
            raise UsageError(
                f"invalid Kafka setting: {exc.args[0].str() if exc.args else 'unknown'}",
                "check the --kafka-config keys and values",
            ) from None

    producer = new_producer()
    aborted: list[int] = []
    started = time.perf_counter()
    try:
        with show_progress(count, "produced", enabled=progress) as advance:
            if not transactional:
                step = 10_000
                for low in range(start_id, start_id + count, step):
                    ids = range(low, min(low + step, start_id + count))
                    _send(producer, topic, ids, make, on_delivery)
                    advance(len(ids))
                _flush(producer, flush_timeout)
            else:
                producer.init_transactions(flush_timeout)
                for n, low in enumerate(range(start_id, start_id + count, TRANSACTION_SIZE), 1):
                    ids = range(low, min(low + TRANSACTION_SIZE, start_id + count))
                    producer.begin_transaction()
                    if abort_every and n % abort_every == 0:
                        _send(producer, topic, ids, make, on_aborted_delivery)
                        try:
                            producer.abort_transaction(flush_timeout)
                        except KafkaException as exc:
                            if not _abort_overtook_registration(exc):
                                raise
                            producer = new_producer()  # see the module docs
                            producer.init_transactions(flush_timeout)
                        producer.poll(0)  # run the purged records' callbacks
                        aborted.extend(ids)
                    else:
                        _send(producer, topic, ids, make, on_delivery)
                        producer.commit_transaction(flush_timeout)
                    advance(len(ids))
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        text = err.str() if isinstance(err, KafkaError) else str(err)
        raise RuntimeFailure(
            f"producing to {topic!r} failed: {text}", "check the broker log"
        ) from None
    seconds = time.perf_counter() - started
    if errors:
        raise RuntimeFailure(
            f"delivery to {topic!r} failed: {errors[0]}", "check the broker and the topic"
        )
    written = count - len(aborted)
    return ProduceReport(
        count=written,
        seconds=seconds,
        rate=written / seconds if seconds > 0 else float("inf"),
        aborted_ids=tuple(aborted),
        aborted_written=aborted_written[0],
    )
