"""``--value-format`` end to end: records produced with confluent-kafka's own
serializers to a real Schema Registry and the bundled broker, consumed by htmqc
at-least-once and exactly-once into SQLite; every good record reaches the
handler decoded, every malformed one is dead-lettered with a reason naming the
format problem, at once (no retry), and the run goes on.

The registry is Apicurio Registry from Maven Central, run by
:func:`htmqc.schema_registry.start_registry` (fixture in ``conftest.py``), not a
fake: its Confluent-compatible API is what the serializers and htmqc's
deserializers talk to. ``json`` needs no registry (plain JSON documents).
"""

from __future__ import annotations

import json
import sqlite3
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from htmqc import Consumer
from htmqc.broker import Broker
from htmqc.cli import main
from htmqc.runtime.decode import DecodedMessage
from htmqc.schema_registry import SchemaRegistry
from tests.dlq.support import read_topic
from tests.serde.handlers import plain, store_payment
from tests.serde.payment_proto import Payment

pytestmark = [pytest.mark.broker]

AVRO_SCHEMA = json.dumps({
    "type": "record", "name": "Payment", "namespace": "htmqctest",
    "fields": [{"name": "id", "type": "long"}, {"name": "who", "type": "string"}],
})  # fmt: skip
JSON_SCHEMA = json.dumps({
    "type": "object",
    "properties": {"id": {"type": "integer"}, "who": {"type": "string"}},
    "required": ["id", "who"],
})  # fmt: skip
GOOD = 5


@dataclass(frozen=True)
class Bad:
    """A malformed record and the words its dead letter's reason must hold."""

    value: bytes
    reason: str


@dataclass(frozen=True)
class Case:
    """How a format's records are written (the good ones with the matching
    confluent serializer) and spoiled."""

    encode: Callable[[SchemaRegistryClient, str, list[dict[str, Any]]], list[bytes]]
    spoil: Callable[[bytes], list[Bad]]


def _serialize(serializer: Any, topic: str, objs: list[Any]) -> list[bytes]:
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [serializer(o, ctx) for o in objs]


def _avro(client: SchemaRegistryClient, topic: str, rows: list[dict[str, Any]]) -> list[bytes]:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return _serialize(AvroSerializer(client, AVRO_SCHEMA), topic, rows)


def _protobuf(client: SchemaRegistryClient, topic: str,
              rows: list[dict[str, Any]]) -> list[bytes]:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    serializer = ProtobufSerializer(Payment, client, {"use.deprecated.format": False})
    return _serialize(serializer, topic, [Payment(**r) for r in rows])


def _json_schema(client: SchemaRegistryClient, topic: str,
                 rows: list[dict[str, Any]]) -> list[bytes]:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    return _serialize(JSONSerializer(JSON_SCHEMA, client), topic, rows)


def _json(_client: SchemaRegistryClient, _topic: str, rows: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


def _unknown_id(good: bytes) -> bytes:
    """``good`` framed with a schema id the registry never handed out."""
    return b"\x00" + struct.pack(">I", 987_654) + good[5:]


CASES: dict[str, Case] = {
    "json": Case(_json, lambda good: [
        Bad(b'{"id": 1, "who":', "not a JSON document"),
        Bad(b'"\xc3\x28"', "not UTF-8 text"),
    ]),
    "avro": Case(_avro, lambda good: [
        Bad(b"\x07" + good[1:], "Invalid magic byte"),
        Bad(_unknown_id(good), "404"),
        Bad(good[:5] + b"\x02", "EOFError"),  # a record cut short: it does not match
    ]),
    "protobuf": Case(_protobuf, lambda good: [
        Bad(b'{"id": 1}', "Invalid magic byte"),
        Bad(good[:6] + b"\x0a\xff\xff\xff", "Error parsing message"),
    ]),
    "json-schema": Case(_json_schema, lambda good: [
        Bad(good[:5] + b'{"id": "seven", "who": "x"}', "'seven' is not of type 'integer'"),
        Bad(good[:5] + b'{"id": 7,', "JSONDecodeError"),
        Bad(_unknown_id(good), "404"),
    ]),
}


@pytest.fixture
def registry_client(schema_registry: SchemaRegistry) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        yield client


def write(bootstrap: str, topic: str, fmt: str,
          client: SchemaRegistryClient) -> tuple[list[dict[str, Any]], dict[int, Bad]]:
    """The good rows and the malformed records (by offset) written to ``topic``:
    good, bad, good, good, bad, ... (one partition, so offsets are the order)."""
    rows = [{"id": i, "who": f"payer-{i}"} for i in range(GOOD)]
    case = CASES[fmt]
    good = case.encode(client, topic, rows)
    bad = case.spoil(good[0])
    order: list[tuple[bytes, bytes, Bad | None]] = []
    spoiled = iter(bad)
    for i, value in enumerate(good):
        order.append((f"k{i}".encode(), value, None))
        if i % 2 == 0:
            broken = next(spoiled, None)
            if broken is not None:
                order.append((f"bad{i}".encode(), broken.value, broken))
    for broken in spoiled:
        order.append((b"bad-last", broken.value, broken))
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, _ in order:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    return rows, {offset: b for offset, (_, _, b) in enumerate(order) if b is not None}


def dead_letters_of_kafka(bootstrap: str, topic: str, count: int) -> dict[int, dict[str, str]]:
    """``<topic>.dlq``'s records by original offset: their htmqc-dlq-* headers."""
    found = {}
    for record in read_topic(bootstrap, f"{topic}.dlq", 1, count):
        headers = {k: (v or b"").decode() for k, v in record.headers() or []}
        found[int(headers["htmqc-dlq-offset"])] = headers
    return found


def dead_letters_of_sqlite(db: Path) -> dict[int, dict[str, str]]:
    """The SQLite sink's dead-letter rows by original offset, as the headers say them."""
    with closing(sqlite3.connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM htmqc_dead_letters").fetchall()
    return {
        int(r["offset"]): {
            "htmqc-dlq-kind": r["kind"],
            "htmqc-dlq-error-class": r["error_class"],
            "htmqc-dlq-error-message": r["error_message"],
            "htmqc-dlq-retries": str(r["retries"]),
        }
        for r in rows
    }


def check_dead_letters(found: dict[int, dict[str, str]], bad: dict[int, Bad], fmt: str,
                       topic: str) -> None:
    """Each malformed record dead-lettered once, at once, as a permanent DecodeError
    whose message names the format, the side, the position and the problem."""
    assert sorted(found) == sorted(bad)
    for offset, broken in bad.items():
        letter = found[offset]
        message = letter["htmqc-dlq-error-message"]
        assert letter["htmqc-dlq-kind"] == "permanent"
        assert letter["htmqc-dlq-error-class"] == "htmqc.runtime.decode.DecodeError"
        assert letter["htmqc-dlq-retries"] == "0"
        assert message.startswith(f"{fmt} value of {topic}/0@{offset}: "), message
        assert broken.reason in message, message


@pytest.mark.parametrize("fmt", list(CASES))
def test_at_least_once_decodes_and_dead_letters_each_format(
    fmt: str, broker: Broker, new_topic: Any, registry_client: SchemaRegistryClient,
    schema_registry: SchemaRegistry,
) -> None:
    topic = new_topic(partitions=1)
    rows, bad = write(broker.bootstrap, topic, fmt, registry_client)
    seen: list[tuple[bytes, Any]] = []

    def handle(msg: DecodedMessage) -> None:
        assert isinstance(msg, DecodedMessage) and isinstance(msg.value(), bytes)
        seen.append((msg.decoded_key(), plain(msg.decoded_value())))

    consumer = Consumer(
        handle, bootstrap=broker.bootstrap, topic=topic, group=f"serde-{uuid.uuid4().hex[:8]}",
        value_format=fmt, schema_registry=schema_registry.url, protobuf_type=Payment,
        max_messages=GOOD + len(bad), idle_exit=30, max_retries=5,
    )
    assert consumer.run() == GOOD + len(bad)
    assert sorted(seen, key=lambda s: s[1]["id"]) == [
        (f"k{r['id']}".encode(), r) for r in rows
    ]  # the key stays bytes (--key-format bytes)
    check_dead_letters(dead_letters_of_kafka(broker.bootstrap, topic, len(bad)), bad, fmt, topic)


@pytest.mark.parametrize("fmt", list(CASES))
def test_exactly_once_into_sqlite_decodes_and_dead_letters_each_format(
    fmt: str, broker: Broker, new_topic: Any, registry_client: SchemaRegistryClient,
    schema_registry: SchemaRegistry, tmp_path: Path,
) -> None:
    topic = new_topic(partitions=1)
    rows, bad = write(broker.bootstrap, topic, fmt, registry_client)
    db = tmp_path / "effects.db"
    consumer = Consumer(
        bootstrap=broker.bootstrap, topic=topic, group=f"serde-{uuid.uuid4().hex[:8]}",
        mode="exactly-once", sink=f"sqlite:///{db}", value_format=fmt,
        schema_registry=schema_registry.url, protobuf_type=Payment,
        max_messages=GOOD + len(bad), idle_exit=30,
    )
    consumer.handler(store_payment)
    assert consumer.run() == GOOD + len(bad)
    with closing(sqlite3.connect(db)) as conn:
        stored = conn.execute("SELECT id, who FROM effects ORDER BY id").fetchall()
    assert stored == [(r["id"], r["who"]) for r in rows]
    check_dead_letters(dead_letters_of_sqlite(db), bad, fmt, topic)


def test_the_cli_decodes_protobuf_with_a_named_class(
    broker: Broker, new_topic: Any, registry_client: SchemaRegistryClient,
    schema_registry: SchemaRegistry, tmp_path: Path,
) -> None:
    """``htmqc run --value-format protobuf --protobuf-type MODULE:CLASS``, exactly-once."""
    topic = new_topic(partitions=1)
    rows, bad = write(broker.bootstrap, topic, "protobuf", registry_client)
    db = tmp_path / "effects.db"
    code = main([
        "run", "tests.serde.handlers:store_payment", "--bootstrap", broker.bootstrap,
        "--topic", topic, "--group", f"serde-{uuid.uuid4().hex[:8]}", "--mode", "exactly-once",
        "--sink", f"sqlite:///{db}", "--value-format", "protobuf",
        "--protobuf-type", "tests.serde.payment_proto:Payment",
        "--schema-registry", schema_registry.url,
        "--max-messages", str(GOOD + len(bad)), "--idle-exit", "30",
    ])  # fmt: skip
    assert code == 0
    with closing(sqlite3.connect(db)) as conn:
        stored = conn.execute("SELECT id, who FROM effects ORDER BY id").fetchall()
    assert stored == [(r["id"], r["who"]) for r in rows]
    check_dead_letters(dead_letters_of_sqlite(db), bad, "protobuf", topic)


def test_keys_and_values_in_two_registry_formats(
    broker: Broker, new_topic: Any, registry_client: SchemaRegistryClient,
    schema_registry: SchemaRegistry,
) -> None:
    """``--key-format avro --value-format json-schema``: both sides decoded through
    one registry client (subjects ``<topic>-key`` and ``<topic>-value``); a key that
    does not decode dead-letters its record as well, naming the key."""
    from confluent_kafka.schema_registry.avro import AvroSerializer

    topic = new_topic(partitions=1)
    rows = [{"id": i, "who": f"payer-{i}"} for i in range(3)]
    values = _json_schema(registry_client, topic, rows)
    key_ctx = SerializationContext(topic, MessageField.KEY)
    keys = [AvroSerializer(registry_client, '"string"')(f"acct-{i}", key_ctx) for i in range(3)]
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for key, value in [*zip(keys, values, strict=True), (b"\x09not-avro", values[0])]:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    seen: list[tuple[Any, Any]] = []
    consumer = Consumer(
        lambda msg: seen.append((msg.decoded_key(), msg.decoded_value())),
        bootstrap=broker.bootstrap, topic=topic, group=f"serde-{uuid.uuid4().hex[:8]}",
        key_format="avro", value_format="json-schema", schema_registry=schema_registry.url,
        max_messages=4, idle_exit=30,
    )
    assert consumer.run() == 4
    assert sorted(seen, key=lambda s: s[1]["id"]) == [(f"acct-{r['id']}", r) for r in rows]
    letters = dead_letters_of_kafka(broker.bootstrap, topic, 1)
    assert list(letters) == [3]
    assert letters[3]["htmqc-dlq-error-message"] == (
        f"avro key of {topic}/0@3: Invalid magic byte")
