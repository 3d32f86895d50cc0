"""Decoding keys and values before the handler sees them (``--value-format``,
``--key-format``).

Theory of operation
-------------------
With both formats ``bytes`` (the default) nothing here runs: the handler gets
the consumed ``confluent_kafka.Message`` as it always did. With either set, the
engine wraps the handler call (:func:`decoding`): each message is decoded on
the worker thread, just before the call, and the handler gets a
:class:`DecodedMessage`: the same ``Message`` (``value()`` and ``key()`` stay
the raw bytes, every other method is the message's own) plus
:meth:`DecodedMessage.decoded_value` and :meth:`DecodedMessage.decoded_key`.
A batch handler gets a list of them. The runtime itself (offsets, dead
letters, retries) keeps using the raw message, so a dead letter carries the
bytes exactly as they were read.

The formats (:data:`FORMATS`): ``bytes`` (no decoding: the decoded value is the
raw bytes), ``json`` (a plain UTF-8 JSON document, no registry), and through a
Confluent Schema Registry (``--schema-registry URL``, :data:`REGISTRY_FORMATS`)
``avro``, ``protobuf`` and ``json-schema`` in Confluent's wire format (magic byte
0, a 4-byte schema id, the body). ``protobuf`` needs the generated message
class (``--protobuf-type`` / ``--key-protobuf-type MODULE:CLASS``, or the class
itself through the library API). The decoders themselves are
:mod:`htmqc.serde`'s (confluent-kafka's deserializers); this module only says
what a decoder must do.

The decode-failure rule. A record that cannot be decoded is the record's fault,
and no retry can fix it: the decoder raises :class:`DecodeError`, a
:class:`~htmqc.Permanent`, so the message is dead-lettered at once with the
reason (format, key or value, position and the problem: a bad magic byte, a
schema id the registry does not know, JSON that does not parse, a record that
does not match its schema). It is never retried whatever
``--retryable-errors`` says, never crashes the run, and does not count towards
the circuit breaker (the handler never ran). Only the registry being out of
reach (a connection error; HTTP 5xx, 401, 403, 408, 429) is not the record's fault: that
is :class:`RegistryUnavailable`, a :class:`~htmqc.Retryable`, retried with the
usual backoff (and counted by the breaker, as any dependency's outage).

:func:`check_formats` refuses, in one line before anything connects, a
registry format without ``--schema-registry`` and ``protobuf`` without its
message class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from htmqc.core.retry import Permanent, Retryable
from htmqc.errors import UsageError
from htmqc.runtime.options import FORMATS, RunOptions

#: The formats read through a Confluent Schema Registry.
REGISTRY_FORMATS = ("avro", "protobuf", "json-schema")
#: The side of a record a decoder reads.
VALUE, KEY = "value", "key"


class DecodeError(Permanent):
    """A key or value could not be decoded in its format (module docs): always
    dead-lettered at once, never retried."""


class RegistryUnavailable(Retryable):
    """The Schema Registry could not be asked (unreachable, HTTP 5xx or 429, refused access):
    retried, as any failure of a dependency."""


class Decoder(Protocol):
    """Decodes one side of a record (see :mod:`htmqc.serde`)."""

    #: The format's name (one of :data:`FORMATS`).
    format: str

    def __call__(self, data: bytes | None, topic: str, side: str, headers: Any) -> Any:
        """The decoded ``data`` of ``side`` (:data:`VALUE` or :data:`KEY`) of a record
        of ``topic`` with ``headers`` (``None`` stays ``None``: a tombstone).

        :raises DecodeError: ``data`` is not a record of this format.
        :raises RegistryUnavailable: the registry could not be asked.
        """
        ...

    def close(self) -> None:
        """Release connections (the registry's HTTP session). Idempotent."""
        ...


class Decoders:
    """The decoders of a run: one for values, one for keys (``None``: raw bytes)."""

    def __init__(self, value: Decoder | None, key: Decoder | None) -> None:
        self.value = value
        self.key = key

    def decode(self, msg: Any) -> DecodedMessage:
        """``msg`` with its key and value decoded.

        :raises DecodeError: either side is malformed; the message names the
            format, the side and the position.
        :raises RegistryUnavailable: the registry could not be asked.
        """
        topic = msg.topic() or ""
        value = self._side(self.value, msg, msg.value(), topic, VALUE)
        key = self._side(self.key, msg, msg.key(), topic, KEY)
        return DecodedMessage(msg, value, key)

    @staticmethod
    def _side(decoder: Decoder | None, msg: Any, data: bytes | None, topic: str,
              side: str) -> Any:
        if decoder is None:
            return data
        try:
            return decoder(data, topic, side, msg.headers())
        except (DecodeError, RegistryUnavailable) as exc:
            where = f"{topic}/{msg.partition()}@{msg.offset()}"
            raise type(exc)(f"{decoder.format} {side} of {where}: {exc}") from exc

    def close(self) -> None:
        """Close both decoders."""
        for decoder in (self.value, self.key):
            if decoder is not None:
                decoder.close()


class DecodedMessage:
    """A consumed message with its decoded key and value (module docs).

    Every method of the message it wraps is here unchanged (``value()`` and
    ``key()`` are still the raw bytes); :meth:`decoded_value` and
    :meth:`decoded_key` are the decoded ones (the raw bytes for a ``bytes``
    side, ``None`` for a null one). :attr:`raw` is the wrapped message.
    """

    __slots__ = ("_key", "_value", "raw")

    def __init__(self, raw: Any, value: Any, key: Any) -> None:
        self.raw = raw
        self._value = value
        self._key = key

    def decoded_value(self) -> Any:
        """The value in ``--value-format``: a dict (avro, json-schema, a JSON
        object), a Protobuf message, any JSON value, or the bytes."""
        return self._value

    def decoded_key(self) -> Any:
        """The key in ``--key-format`` (see :meth:`decoded_value`)."""
        return self._key

    def topic(self) -> str | None:
        return self.raw.topic()  # type: ignore[no-any-return]

    def partition(self) -> int | None:
        return self.raw.partition()  # type: ignore[no-any-return]

    def offset(self) -> int | None:
        return self.raw.offset()  # type: ignore[no-any-return]

    def key(self) -> bytes | None:
        return self.raw.key()  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self.raw.value()  # type: ignore[no-any-return]

    def headers(self) -> Any:
        return self.raw.headers()

    def timestamp(self) -> tuple[int, int]:
        return self.raw.timestamp()  # type: ignore[no-any-return]

    def error(self) -> Any:
        return self.raw.error()

    def __len__(self) -> int:
        return len(self.raw)

    def __getattr__(self, name: str) -> Any:
        """Any other method of the wrapped message (``latency()``, ``leader_epoch()``...)."""
        return getattr(self.raw, name)

    def __repr__(self) -> str:
        return (f"DecodedMessage({self.topic()}/{self.partition()}@{self.offset()}, "
                f"key={self._key!r}, value={self._value!r})")


def decoding(
    call: Callable[..., Any], decoders: Decoders, *, batch: bool
) -> Callable[..., Any]:
    """``call`` (the handler, already synchronous) taking decoded messages: each
    message (a batch handler: each of the list) is decoded first, and a
    :class:`DecodeError` is raised before the handler runs."""
    decode = decoders.decode
    if batch:

        def many(msgs: Sequence[Any], *rest: Any) -> Any:
            return call([decode(m) for m in msgs], *rest)

        return many

    def one(msg: Any, *rest: Any) -> Any:
        return call(decode(msg), *rest)

    return one


def check_formats(options: RunOptions, message_types: dict[str, Any] | None = None) -> None:
    """Refuse formats that cannot work, before anything connects (module docs).

    ``message_types``: Protobuf classes given as objects (library API), by side.

    :raises UsageError: a registry format without ``--schema-registry``, or
        ``protobuf`` without its message class.
    """
    given = message_types if message_types is not None else options.message_types
    for side, fmt, type_flag, type_name in (
        (VALUE, options.value_format, "--protobuf-type", options.protobuf_type),
        (KEY, options.key_format, "--key-protobuf-type", options.key_protobuf_type),
    ):
        flag = f"--{side}-format"
        if fmt not in FORMATS:
            raise UsageError(f"{flag} {fmt!r} is unknown", f"use one of: {', '.join(FORMATS)}")
        if fmt in REGISTRY_FORMATS and not options.schema_registry:
            raise UsageError(
                f"{flag} {fmt} needs a Schema Registry",
                "pass --schema-registry URL (e.g. http://127.0.0.1:8081)",
            )
        if fmt == "protobuf" and not type_name and given.get(side) is None:
            raise UsageError(
                f"{flag} protobuf needs the message class of the {side}s",
                f"pass {type_flag} MODULE:CLASS (a generated *_pb2 class)",
            )


def wants_decoding(options: RunOptions) -> bool:
    """Whether either side has a format other than ``bytes``."""
    return options.value_format != "bytes" or options.key_format != "bytes"
