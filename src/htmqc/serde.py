"""The decoders of ``--value-format`` / ``--key-format``: plain JSON, and
confluent-kafka's Schema Registry deserializers for Avro, Protobuf and JSON
Schema (the contract is :mod:`htmqc.runtime.decode`'s).

Theory of operation
-------------------
:func:`build_decoders` makes, once per run and before anything connects, one
decoder per side whose format is not ``bytes``. The registry formats share one
``SchemaRegistryClient`` (its schema cache and HTTP session; it connects only
when the first schema id is looked up, and :meth:`Decoders.close` closes it):

* ``avro``: ``AvroDeserializer`` with the writer's schema fetched by id (a dict
  per record, as fastavro reads it);
* ``protobuf``: ``ProtobufDeserializer`` with the generated message class
  (``--protobuf-type MODULE:CLASS`` or the class itself): a message of that class;
* ``json-schema``: ``JSONDeserializer`` with the writer's schema fetched by id,
  each record validated against it (a dict, or whatever JSON value);
* ``json``: ``json.loads`` of the bytes (UTF-8, or UTF-16/32 with their BOM), no
  registry and no framing.

Every failure of a deserializer is sorted into the record's fault
(:class:`~htmqc.runtime.decode.DecodeError`: dead-lettered at once) or the
registry's (:class:`~htmqc.runtime.decode.RegistryUnavailable`: retried): the
latter is a transport error (refused, timed out, reset) or an HTTP answer of 5xx,
401, 403, 408 or 429 from the registry; everything else (``Invalid magic byte``, an unknown
schema id, HTTP 404, a body the schema cannot read, a JSON document that does
not validate or parse) is the former. The text of the error keeps the
deserializer's own words, so the dead letter's reason names the problem.

The extras this needs are confluent-kafka's: ``pip install
'htmqc[serde]'`` (``confluent-kafka[schemaregistry,avro,json,protobuf]``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from htmqc.errors import UsageError
from htmqc.runtime.decode import (
    KEY,
    REGISTRY_FORMATS,
    VALUE,
    DecodeError,
    Decoders,
    RegistryUnavailable,
    check_formats,
)
from htmqc.runtime.options import RunOptions

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

#: The extra to install for the registry formats.
EXTRA = "pip install 'htmqc[serde]'"


def build_decoders(options: RunOptions) -> Decoders | None:
    """The run's decoders, or ``None`` when both formats are ``bytes``.

    :raises UsageError: a format that cannot work (:func:`check_formats`), a
        ``--protobuf-type`` that does not name a Protobuf message class, or
        confluent-kafka's Schema Registry extras not installed.
    """
    check_formats(options)
    if options.value_format == "bytes" and options.key_format == "bytes":
        return None
    client = _client(options) if {options.value_format, options.key_format} & set(
        REGISTRY_FORMATS
    ) else None
    shared = _Shared(client)
    try:
        value = _decoder(options.value_format, VALUE, options, shared)
        key = _decoder(options.key_format, KEY, options, shared)
    except BaseException:
        shared.close()
        raise
    return Decoders(value, key)


class _Shared:
    """The registry client both sides use, closed once."""

    def __init__(self, client: SchemaRegistryClient | None) -> None:
        self.client = client

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()


def _client(options: RunOptions) -> SchemaRegistryClient:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:
        raise UsageError(
            f"the Schema Registry formats need confluent-kafka's extras ({exc.name} is missing)",
            EXTRA,
        ) from None
    assert options.schema_registry is not None  # check_formats
    try:
        return SchemaRegistryClient({"url": options.schema_registry})
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"--schema-registry is not a usable URL: {exc}",
            "pass http(s)://HOST:PORT[/PATH], comma-separated for several",
        ) from None


def _decoder(fmt: str, side: str, options: RunOptions, shared: _Shared) -> Any:
    if fmt == "bytes":
        return None
    if fmt == "json":
        return JsonDecoder()
    assert shared.client is not None
    return RegistryDecoder(fmt, _deserializer(fmt, side, options, shared.client), shared)


#: The deserializers' settings: the writer's schema comes by the id in each record,
#: so the subject name (used only with ``use.latest.version``) is the topic
#: strategy's, without confluent-kafka's default ASSOCIATED strategy asking the
#: registry for the topic's associations first (an HTTP call and a dependency on an
#: API that registries other than Confluent's may lack; it falls back to the topic
#: strategy when there are none).
DESERIALIZER_CONFIG: dict[str, Any] = {"subject.name.strategy.type": "TOPIC"}


def _deserializer(fmt: str, side: str, options: RunOptions,
                  client: SchemaRegistryClient) -> Any:
    conf = dict(DESERIALIZER_CONFIG)
    try:
        if fmt == "avro":
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            return AvroDeserializer(client, conf=conf)
        if fmt == "json-schema":
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            return JSONDeserializer(None, schema_registry_client=client, conf=conf)
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        return ProtobufDeserializer(
            protobuf_class(options, side), conf, schema_registry_client=client
        )
    except ImportError as exc:
        raise UsageError(
            f"--{side}-format {fmt} needs {exc.name}, which is not installed", EXTRA
        ) from None


def protobuf_class(options: RunOptions, side: str) -> type:
    """The Protobuf message class of ``side``: the object given to the library
    API, else the ``MODULE:CLASS`` of ``--protobuf-type`` / ``--key-protobuf-type``.

    :raises UsageError: it cannot be imported or is not a message class.
    """
    from google.protobuf.message import Message as ProtobufMessage

    from htmqc.runtime.launch import load_handler

    flag = "--protobuf-type" if side == VALUE else "--key-protobuf-type"
    given = options.message_types.get(side)
    spec = None
    if given is None:
        spec = options.protobuf_type if side == VALUE else options.key_protobuf_type
        assert spec is not None  # check_formats
        try:
            given = load_handler(spec)
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc.problem}", exc.fix) from None
    if not (isinstance(given, type) and issubclass(given, ProtobufMessage)):
        raise UsageError(
            f"{flag}: {spec if spec else repr(given)} is not a Protobuf message class",
            "name a generated message class (module_pb2:MyMessage)",
        )
    return given


class JsonDecoder:
    """``json``: one JSON document per record, no registry (module docs)."""

    format = "json"

    def __call__(self, data: bytes | None, topic: str, side: str, headers: Any = None) -> Any:
        if data is None:
            return None
        try:
            return json.loads(data)
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8 text: {exc}") from exc
        except ValueError as exc:  # json.JSONDecodeError
            raise DecodeError(f"not a JSON document: {exc}") from exc

    def close(self) -> None:
        """Nothing to release."""


class RegistryDecoder:
    """``avro``, ``protobuf`` or ``json-schema`` through a confluent-kafka
    deserializer (module docs)."""

    def __init__(self, fmt: str, deserializer: Any, shared: _Shared) -> None:
        self.format = fmt
        self._deserializer = deserializer
        self._shared = shared

    def __call__(self, data: bytes | None, topic: str, side: str,
                 headers: Any = None) -> Any:
        from confluent_kafka.serialization import MessageField, SerializationContext

        if data is None:
            return None
        field = MessageField.VALUE if side == VALUE else MessageField.KEY
        try:
            return self._deserializer(data, SerializationContext(topic, field, headers))
        except Exception as exc:
            raise sort_failure(exc) from exc

    def close(self) -> None:
        """Close the registry client (shared by both sides)."""
        self._shared.close()


#: HTTP answers that are not the record's fault: unauthorized, forbidden (the
#: registry's settings), request timeout, too many requests.
_NOT_THE_RECORD = frozenset({401, 403, 408, 429})


def sort_failure(exc: Exception) -> DecodeError | RegistryUnavailable:
    """A deserializer's exception as the record's fault or the registry's (module docs)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        if status in _NOT_THE_RECORD or status >= 500 or status < 0:
            return RegistryUnavailable(f"schema registry: {exc}")
        return DecodeError(f"schema registry: {exc}")
    if _transport_error(exc):
        return RegistryUnavailable(
            f"schema registry unreachable: {type(exc).__name__}: {exc}"
        )
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    return DecodeError(text if name == "SerializationError" else f"{name}: {text}")


def _transport_error(exc: BaseException) -> bool:
    """An HTTP transport failure (httpx's or httpx2's ``TransportError``, or an ``OSError``)."""
    if isinstance(exc, OSError):
        return True
    return any(
        cls.__name__ in {"TransportError", "TimeoutException"}
        and cls.__module__.split(".")[0] in {"httpx", "httpx2"}
        for cls in type(exc).__mro__
    )
