"""Decoding without a broker or a registry: the option checks (one line, before
anything connects), the decoded message, plain JSON, how a deserializer's
failure is sorted into the record's fault or the registry's, and the engine's
rule for each (over the fakes of :mod:`htmqc.testing`).

The registry formats against a real Schema Registry (Apicurio Registry) and a
broker are in ``test_formats_broker.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest

import htmqc
from htmqc import Consumer
from htmqc.cli import main
from htmqc.errors import UsageError
from htmqc.runtime import Engine, RunOptions
from htmqc.runtime.decode import (
    DecodeError,
    Decoders,
    RegistryUnavailable,
    check_formats,
    decoding,
)
from htmqc.serde import JsonDecoder, build_decoders, sort_failure
from htmqc.testing import FakeConsumer, FakeMessage, FakeProducer
from tests.serde.payment_proto import Payment

BASE = {"bootstrap": "127.0.0.1:1", "topic": "t", "group": "g"}


@pytest.mark.parametrize(("kw", "needle"), [
    ({"value_format": "avro"}, "--value-format avro needs a Schema Registry"),
    ({"key_format": "json-schema"}, "--key-format json-schema needs a Schema Registry"),
    ({"value_format": "protobuf", "schema_registry": "http://r"},
     "--value-format protobuf needs the message class of the values"),
    ({"key_format": "protobuf", "schema_registry": "http://r"},
     "--key-format protobuf needs the message class of the keys"),
    ({"value_format": "xml"}, "--value-format 'xml' is unknown"),
])
def test_formats_that_cannot_work_fail_when_the_consumer_is_built(
    kw: dict[str, Any], needle: str
) -> None:
    with pytest.raises(UsageError) as caught:
        Consumer(**BASE, **kw)
    assert needle in caught.value.line() and "\n" not in caught.value.line()


def test_a_protobuf_class_is_given_as_an_object_or_a_name() -> None:
    by_object = Consumer(**BASE, value_format="protobuf", schema_registry="http://r",
                         protobuf_type=Payment, key_format="protobuf",
                         key_protobuf_type=Payment)
    assert by_object.options.message_types == {"value": Payment, "key": Payment}
    by_name = Consumer(**BASE, value_format="protobuf", schema_registry="http://r",
                       protobuf_type="tests.serde.payment_proto:Payment")
    decoders = build_decoders(by_name.options)
    assert decoders is not None and decoders.value is not None and decoders.key is None
    decoders.close()
    with pytest.raises(UsageError, match=r"--protobuf-type: json:dumps is not a Protobuf"):
        build_decoders(RunOptions(**BASE, value_format="protobuf", schema_registry="http://r",
                                  protobuf_type="json:dumps"))
    with pytest.raises(UsageError, match="--key-protobuf-type: handler module 'nope_x'"):
        build_decoders(RunOptions(**BASE, key_format="protobuf", schema_registry="http://r",
                                  key_protobuf_type="nope_x:Y"))


def test_bytes_decodes_nothing() -> None:
    assert build_decoders(RunOptions(**BASE)) is None
    check_formats(RunOptions(**BASE, value_format="json"))  # no registry needed


def test_the_cli_says_a_missing_registry_in_one_line_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """127.0.0.1:1 is no broker: the run would fail later; the format check comes first."""
    flags = [part for k, v in BASE.items() for part in (f"--{k}", v)]
    code = main(["run", "tests.serde.handlers:store_payment", *flags,
        "--mode", "exactly-once", "--sink", "sqlite:///unused.db", "--value-format", "avro"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == ("htmqc: error: --value-format avro needs a Schema Registry; pass "
                       "--schema-registry URL (e.g. http://127.0.0.1:8081)")


def test_a_start_refused_after_the_registry_client_and_sink_opened_closes_both(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decoders (a registry client) and the sink are built before the checks that
    need them; a later refusal must not leave them open (no broker is reached here)."""
    import htmqc.serde
    from htmqc.runtime.launch import build_engine
    from htmqc.sinks.sql import SqlSink

    closed: list[str] = []
    shared_close, sink_close = htmqc.serde._Shared.close, SqlSink.close
    monkeypatch.setattr(htmqc.serde._Shared, "close",
                        lambda self: (closed.append("registry"), shared_close(self))[1])
    monkeypatch.setattr(SqlSink, "close", lambda self: (closed.append("sink"), sink_close(self))[1])
    options = RunOptions(**BASE, mode="exactly-once", sink=f"sqlite:///{tmp_path}/eo.db",
                         retry_topic=True, value_format="avro", schema_registry="http://r")
    with pytest.raises(UsageError, match="--retry-topic with a database sink"):
        build_engine(lambda message, txn: None, options)
    assert sorted(closed) == ["registry", "sink"]


def test_plain_json_decodes_documents_and_refuses_the_rest() -> None:
    decode = JsonDecoder()
    assert decode(b'{"a": [1, 2]}', "t", "value", None) == {"a": [1, 2]}
    assert decode(b"7", "t", "key", None) == 7
    assert decode(None, "t", "value", None) is None  # a tombstone stays None
    with pytest.raises(DecodeError, match="not a JSON document"):
        decode(b'{"a":', "t", "value", None)
    with pytest.raises(DecodeError, match="not UTF-8 text"):
        decode(b'"\xc3\x28"', "t", "value", None)


def test_a_decoded_message_is_the_message_plus_its_decoded_sides() -> None:
    raw = FakeMessage("t", 2, 9, b'"k"', b'{"v": 1}', headers=[("h", b"1")])
    msg = Decoders(JsonDecoder(), JsonDecoder()).decode(raw)
    assert isinstance(msg, htmqc.DecodedMessage) and msg.raw is raw
    assert (msg.decoded_key(), msg.decoded_value()) == ("k", {"v": 1})
    assert (msg.topic(), msg.partition(), msg.offset()) == ("t", 2, 9)
    assert (msg.key(), msg.value(), msg.headers()) == (b'"k"', b'{"v": 1}', [("h", b"1")])
    assert len(msg) == len(raw) and msg.timestamp() == raw.timestamp() and msg.error() is None
    only_values = Decoders(JsonDecoder(), None).decode(raw)
    assert only_values.decoded_key() == b'"k"'  # a bytes side: the raw bytes
    with pytest.raises(DecodeError) as caught:
        Decoders(None, JsonDecoder()).decode(FakeMessage("t", 0, 3, b"{", b"x"))
    assert str(caught.value).startswith("json key of t/0@3: not a JSON document")


def test_decoding_wraps_one_message_or_a_batch() -> None:
    got: list[Any] = []
    decoders = Decoders(JsonDecoder(), None)
    one = decoding(lambda msg, tx: got.append((msg.decoded_value(), tx)), decoders, batch=False)
    one(FakeMessage("t", 0, 0, None, b"1"), "tx")
    many = decoding(lambda msgs: got.append([m.decoded_value() for m in msgs]), decoders,
                    batch=True)
    many([FakeMessage("t", 0, 1, None, b"2"), FakeMessage("t", 0, 2, None, b"3")])
    assert got == [(1, "tx"), [2, 3]]


def test_failures_are_the_records_fault_unless_the_registry_is_out_of_reach() -> None:
    from confluent_kafka.schema_registry.common._httpx_compat import httpx
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import SerializationError

    def sorted_as(exc: Exception) -> tuple[type, str]:
        out = sort_failure(exc)
        return type(out), str(out)

    assert sorted_as(SerializationError("Invalid magic byte")) == (
        DecodeError, "Invalid magic byte")
    assert sorted_as(EOFError()) == (DecodeError, "EOFError: EOFError")
    assert sorted_as(json.JSONDecodeError("Expecting value", "{", 1))[0] is DecodeError
    unknown = SchemaRegistryError(404, 40403, "Schema 987654 not found")
    assert sorted_as(unknown) == (
        DecodeError, "schema registry: Schema 987654 not found (HTTP status code 404, SR code "
        "40403)")
    for status in (500, 503, 429, 401, -1):
        assert sorted_as(SchemaRegistryError(status, -1, "x"))[0] is RegistryUnavailable
    assert sorted_as(httpx.ConnectError("refused"))[0] is RegistryUnavailable
    assert sorted_as(ConnectionResetError("reset"))[0] is RegistryUnavailable


class Spoiled:
    """A decoder whose every call fails with ``exc``."""

    format = "avro"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0
        self.closed = False

    def __call__(self, data: bytes | None, topic: str, side: str, headers: Any) -> Any:
        self.calls += 1
        raise self.exc

    def close(self) -> None:
        self.closed = True


def _engine(decoder: Spoiled, *, records: int, error_kinds: dict[type[BaseException], Any]
            | None = None, **kw: Any) -> tuple[Engine, FakeProducer, list[Any]]:
    calls: list[Any] = []
    producer = FakeProducer()
    consumer = FakeConsumer([FakeMessage("t", 0, i, None, b"v") for i in range(records)])
    engine = Engine(
        calls.append,
        RunOptions(**BASE, max_messages=records, backoff_ms=1.0, backoff_max_ms=1.0, **kw),
        consumer, producer_factory=lambda: producer, decoders=Decoders(decoder, None),
        error_kinds=error_kinds,
    )
    return engine, producer, calls


def test_an_undecodable_record_is_dead_lettered_at_once_whatever_the_user_says() -> None:
    """Even with every Exception declared retryable, and more bad records in a row
    than the breaker allows, each is dead-lettered on its first failure and the
    handler never runs; the decoders are closed when the run ends."""
    decoder = Spoiled(DecodeError("Invalid magic byte"))
    engine, producer, calls = _engine(
        decoder, records=6, error_kinds={Exception: htmqc.FailureKind.RETRYABLE},
        breaker_consecutive=2)
    engine.run(install_signals=False)
    assert calls == [] and decoder.calls == 6
    assert engine.dlq_counts == {"permanent": 6}
    assert producer.header_values("htmqc-dlq-retries") == ["0"] * 6
    assert producer.header_values("htmqc-dlq-error-message")[0] == (
        "avro value of t/0@0: Invalid magic byte")
    assert engine.breaker.closed and decoder.closed


def test_an_unreachable_registry_is_retried_then_dead_lettered_as_failed() -> None:
    decoder = Spoiled(RegistryUnavailable("schema registry unreachable: ConnectError"))
    engine, _producer, calls = _engine(decoder, records=1, max_retries=2)
    engine.run(install_signals=False)
    assert calls == [] and decoder.calls == 3
    assert engine.dlq_counts == {"failed": 1}


def test_the_real_deserializer_sorts_a_refused_connection_as_the_registrys_fault() -> None:
    """confluent-kafka's client against a port nobody listens on (it retries for
    about two seconds first): retried, not dead-lettered as the record's fault."""
    decoders = build_decoders(RunOptions(**BASE, value_format="avro",
                                         schema_registry="http://127.0.0.1:1"))
    assert decoders is not None
    try:
        with pytest.raises(RegistryUnavailable, match="avro value of t/0@1: schema registry "
                           "unreachable: ConnectError"):
            decoders.decode(FakeMessage("t", 0, 1, None, b"\x00\x00\x00\x00\x01\x02"))
        with pytest.raises(DecodeError, match="Invalid magic byte"):  # no registry needed
            decoders.decode(FakeMessage("t", 0, 2, None, b"\x07\x00\x00\x00\x01\x02"))
    finally:
        decoders.close()
