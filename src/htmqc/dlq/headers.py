"""The Kafka headers of a dead-lettered record: writing and strict parsing.

A record on ``<topic>.dlq`` / ``<topic>.dlq.poison`` is the original record
(same key, same value) with its own headers kept, minus any earlier htmqc
dead-letter and retry-topic headers, plus these (values UTF-8 text)::

    htmqc-dlq-topic           original topic (where the message was first read)
    htmqc-dlq-partition       original partition (decimal)
    htmqc-dlq-offset          original offset (decimal)
    htmqc-dlq-key             original key (raw bytes; absent when the key is null)
    htmqc-dlq-kind            failed | permanent | poison | too_large
    htmqc-dlq-error-class     module.QualifiedName of the exception
    htmqc-dlq-error-message   str(exception), at most 4096 bytes
    htmqc-dlq-stack           the traceback, its last 8192 bytes
    htmqc-dlq-retries         failed attempts before the decision, minus one
    htmqc-dlq-first-failure   unix seconds (decimal, e.g. 1795419020.335)
    htmqc-dlq-last-failure    unix seconds
    htmqc-dlq-group           consumer group that dead-lettered it
    htmqc-dlq-reason          one line, "ErrorClass: first line of the message"
    htmqc-dlq-source          topic/partition/offset the dead-lettered copy was read
                              from (differs from the original for retry-topic records)

Error class, message, stack and reason pass through :func:`htmqc.secrets.scrub`
before they are written, so a remembered secret never reaches the DLQ.

For a record that came back from the retry topic, the original position is
taken from its ``htmqc-retry-of`` header, so a redrive writes it to the topic
it was first read from, not to ``<topic>.retry``.

:func:`parse_headers` is the strict inverse: anything that is not a
well-formed set of these headers raises :class:`ValueError` (and nothing else).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from htmqc import secrets
from htmqc.dlq.record import DeadLetterInfo

PREFIX = "htmqc-dlq-"
TOPIC = PREFIX + "topic"
PARTITION = PREFIX + "partition"
OFFSET = PREFIX + "offset"
KEY = PREFIX + "key"
KIND = PREFIX + "kind"
ERROR_CLASS = PREFIX + "error-class"
ERROR_MESSAGE = PREFIX + "error-message"
STACK = PREFIX + "stack"
RETRIES = PREFIX + "retries"
FIRST_FAILURE = PREFIX + "first-failure"
LAST_FAILURE = PREFIX + "last-failure"
GROUP = PREFIX + "group"
REASON = PREFIX + "reason"
SOURCE = PREFIX + "source"
#: The header a redriven record carries: the DLQ entry it was redriven from.
REDRIVE_OF = "htmqc-redrive-of"

#: Bounds (UTF-8 bytes) of the free-text headers.
MAX_CLASS_BYTES = 512
MAX_MESSAGE_BYTES = 4096
MAX_STACK_BYTES = 8192
MAX_REASON_BYTES = 1000

_RETRY_HEADERS = frozenset(
    {"htmqc-retry-after", "htmqc-retry-attempt", "htmqc-retry-of", "htmqc-first-failure"}
)
_REQUIRED = (
    TOPIC, PARTITION, OFFSET, KIND, ERROR_CLASS, ERROR_MESSAGE, STACK, RETRIES,
    FIRST_FAILURE, LAST_FAILURE, GROUP, REASON,
)  # fmt: skip
_KNOWN = frozenset({*_REQUIRED, KEY, SOURCE})
_INT_RE = re.compile(r"0|[1-9][0-9]{0,18}")
# repr(float): at most 17 significant digits, fixed notation from 1e-4 to 1e16, so at
# most 3 leading zeros plus 17 digits after the point.
_FLOAT_RE = re.compile(r"-?[0-9]{1,17}(?:\.[0-9]{1,20})?(?:e[+-]?[0-9]{1,3})?")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_ORIGIN_RE = re.compile(r"([A-Za-z0-9._-]{1,249})/(0|[1-9][0-9]{0,9})/(0|[1-9][0-9]{0,18})")

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class DlqRecordMeta:
    """What the headers of one dead-lettered record say (see module docs).

    ``headers``: the original record's own headers, in order, without htmqc's
    dead-letter headers. ``key`` is the original key (``None``: no key).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    info: DeadLetterInfo
    reason: str
    source: str | None
    headers: tuple[tuple[str, bytes | None], ...]

    @property
    def origin(self) -> str:
        """``topic/partition/offset`` of the original message."""
        return f"{self.topic}/{self.partition}/{self.offset}"


def clip(text: str, limit: int, *, tail: bool = False) -> str:
    """``text`` as valid UTF-8 of at most ``limit`` bytes: the head (or, with
    ``tail``, the end), never cutting a character in half. Characters that are
    not encodable (lone surrogates) become ``?``."""
    raw = text.encode("utf-8", "replace")
    if len(raw) > limit:
        raw = raw[-limit:] if tail else raw[:limit]
    return raw.decode("utf-8", "ignore")


def reason_line(error_class: str, error_message: str) -> str:
    """``ShortClass: first line of the message`` (the one line logs and lists show)."""
    short = error_class.rsplit(".", 1)[-1]
    first = error_message.splitlines()[0] if error_message.strip() else ""
    return " ".join((f"{short}: {first}" if first else short).splitlines())


def written_info(info: DeadLetterInfo) -> DeadLetterInfo:
    """``info`` as it is stored: secrets scrubbed, free text bounded (the value
    :func:`parse_headers` gives back, and what the SQL row holds)."""
    return DeadLetterInfo(
        kind=info.kind,
        error_class=clip(secrets.scrub(info.error_class), MAX_CLASS_BYTES),
        error_message=clip(secrets.scrub(info.error_message), MAX_MESSAGE_BYTES),
        stack=clip(secrets.scrub(info.stack), MAX_STACK_BYTES, tail=True),
        retries=info.retries,
        first_failure_at=info.first_failure_at,
        last_failure_at=info.last_failure_at,
        group=info.group.encode("utf-8", "replace").decode("utf-8"),
    )


def stored_reason(info: DeadLetterInfo) -> str:
    """The reason line stored with ``info`` (scrubbed, bounded)."""
    clean = written_info(info)
    return clip(reason_line(clean.error_class, clean.error_message), MAX_REASON_BYTES)


def origin_of(msg: Any) -> tuple[str, int, int]:
    """Where ``msg`` was first read: its ``htmqc-retry-of`` header if it came
    from the retry topic (and the header is well formed), else its own position."""
    for name, value in msg.headers() or ():
        if name == "htmqc-retry-of" and isinstance(value, bytes):
            m = _ORIGIN_RE.fullmatch(value.decode("utf-8", "replace"))
            if m:
                return m.group(1), int(m.group(2)), int(m.group(3))
    return msg.topic(), msg.partition(), msg.offset()


def kept_headers(headers: Sequence[tuple[str, Any]] | None) -> Headers:
    """A record's own headers without htmqc's dead-letter and retry-topic ones."""
    return [
        (k, v) for k, v in headers or () if not k.startswith(PREFIX) and k not in _RETRY_HEADERS
    ]


def _seconds(value: float) -> bytes:
    return repr(float(value)).encode()


def dlq_headers(msg: Any, info: DeadLetterInfo) -> list[tuple[str, bytes]]:
    """The headers of ``msg``'s dead-lettered copy (see module docs).

    ``msg`` is a confluent-kafka message (``topic()``, ``partition()``,
    ``offset()``, ``key()``, ``headers()``). Its own headers come first, kept
    as they are (a ``None`` value stays ``None``).
    """
    clean = written_info(info)
    topic, partition, offset = origin_of(msg)
    out: list[tuple[str, Any]] = list(kept_headers(msg.headers()))
    out += [
        (TOPIC, topic.encode()),
        (PARTITION, str(partition).encode()),
        (OFFSET, str(offset).encode()),
    ]
    key = msg.key()
    if key is not None:
        out.append((KEY, bytes(key)))
    out += [
        (KIND, clean.kind.encode()),
        (ERROR_CLASS, clean.error_class.encode()),
        (ERROR_MESSAGE, clean.error_message.encode()),
        (STACK, clean.stack.encode()),
        (RETRIES, str(clean.retries).encode()),
        (FIRST_FAILURE, _seconds(clean.first_failure_at)),
        (LAST_FAILURE, _seconds(clean.last_failure_at)),
        (GROUP, clean.group.encode()),
        (REASON, stored_reason(info).encode()),
        (SOURCE, f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode()),
    ]
    return out


def _text(name: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"header {name} is not UTF-8") from None


def _int(name: str, raw: bytes) -> int:
    text = _text(name, raw)
    if not _INT_RE.fullmatch(text):
        raise ValueError(f"header {name} is not a non-negative decimal integer: {text[:40]!r}")
    return int(text)


def _time(name: str, raw: bytes) -> float:
    text = _text(name, raw)
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError(f"header {name} is not unix seconds: {text[:40]!r}")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"header {name} is not a finite time: {text[:40]!r}")
    return value


def parse_headers(headers: Any) -> DlqRecordMeta:
    """Read the dead-letter headers of a DLQ record (strict inverse of
    :func:`dlq_headers`).

    ``headers``: a sequence of ``(str, bytes | None)`` pairs, as
    ``confluent_kafka.Message.headers()`` returns.

    :raises ValueError: ``headers`` is not such a sequence, a dead-letter header
        is missing, repeated, unknown or malformed. Never anything else.
    """
    if headers is None or isinstance(headers, (str, bytes, bytearray, dict)):
        raise ValueError("a dead letter needs a list of (name, value) headers")
    try:
        items = list(headers)
    except TypeError:
        raise ValueError("headers are not a sequence of (name, value) pairs") from None
    ours: dict[str, bytes] = {}
    own: list[tuple[str, bytes | None]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValueError("each header must be a (name, value) pair")
        name, value = item
        if not isinstance(name, str):
            raise ValueError("a header name is not a string")
        if value is not None and not isinstance(value, (bytes, bytearray)):
            raise ValueError(f"header {name[:60]!r} has a value that is not bytes")
        if not name.startswith(PREFIX):
            own.append((name, None if value is None else bytes(value)))
            continue
        if name not in _KNOWN:
            raise ValueError(f"unknown dead-letter header {name[:60]!r}")
        if name in ours:
            raise ValueError(f"dead-letter header {name} appears twice")
        if value is None:
            raise ValueError(f"dead-letter header {name} has no value")
        ours[name] = bytes(value)
    missing = [n for n in _REQUIRED if n not in ours]
    if missing:
        raise ValueError(f"not a dead letter: header {missing[0]} is missing")
    topic = _text(TOPIC, ours[TOPIC])
    if not _TOPIC_RE.fullmatch(topic):
        raise ValueError(f"header {TOPIC} is not a topic name: {topic[:60]!r}")
    source = _text(SOURCE, ours[SOURCE]) if SOURCE in ours else None
    if source is not None and not _ORIGIN_RE.fullmatch(source):
        raise ValueError(f"header {SOURCE} is not topic/partition/offset: {source[:60]!r}")
    partition = _int(PARTITION, ours[PARTITION])
    if partition > 2**31 - 1:
        raise ValueError(f"header {PARTITION} is out of range")
    info = DeadLetterInfo(  # kind is checked by DeadLetterInfo (ValueError)
        kind=_text(KIND, ours[KIND]),
        error_class=_text(ERROR_CLASS, ours[ERROR_CLASS]),
        error_message=_text(ERROR_MESSAGE, ours[ERROR_MESSAGE]),
        stack=_text(STACK, ours[STACK]),
        retries=_int(RETRIES, ours[RETRIES]),
        first_failure_at=_time(FIRST_FAILURE, ours[FIRST_FAILURE]),
        last_failure_at=_time(LAST_FAILURE, ours[LAST_FAILURE]),
        group=_text(GROUP, ours[GROUP]),
    )
    return DlqRecordMeta(
        topic=topic,
        partition=partition,
        offset=_int(OFFSET, ours[OFFSET]),
        key=ours.get(KEY),
        info=info,
        reason=_text(REASON, ours[REASON]),
        source=source,
        headers=tuple(own),
    )
