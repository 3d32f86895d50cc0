"""DLQ entries as ``htmqc dlq`` sees them, whatever their store, and the filters.

A :class:`StoredDeadLetter` is one dead letter read back from a DLQ topic
(:mod:`htmqc.dlq.kafka_source`) or from a SQL sink's dead-letter table
(:mod:`htmqc.dlq.sql_source`). Its ``id`` names it in that store:
``<dlq topic>/<partition>/<offset>`` for Kafka, the row id for SQL; the same
text goes into the ``htmqc-redrive-of`` header of its redriven copy.

:class:`Selection` is the filters of ``list`` and ``redrive``. ``partition``
and the offset range are the *original* message's (where it was first read),
bounds inclusive; ``since``/``until`` compare with the last failure time;
``error_class`` matches the full ``module.Name`` or just ``Name``.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from htmqc.dlq.headers import REDRIVE_OF
from htmqc.dlq.record import DLQ_KINDS, DeadLetterInfo
from htmqc.errors import UsageError


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredDeadLetter:
    """One dead letter in a DLQ store (see module docs).

    ``topic``/``partition``/``offset``: the original message's position.
    ``headers``: the original record's own headers. ``dead_lettered_at``: when
    the dead letter was written (unix seconds; the DLQ record's timestamp for
    Kafka). ``redriven``: a redrive already wrote it back (then a redrive
    skips it); ``redriven_at`` is known for SQL entries only.
    """

    id: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    info: DeadLetterInfo
    reason: str
    source: str | None
    dead_lettered_at: float | None
    redriven: bool
    redriven_at: float | None = None

    @property
    def origin(self) -> str:
        """``topic/partition/offset`` of the original message."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    def redrive_headers(self) -> list[tuple[str, bytes | None]]:
        """The headers of the redriven copy: the original ones (without an
        earlier ``htmqc-redrive-of``) plus ``htmqc-redrive-of=<id>``."""
        own = [(k, v) for k, v in self.headers if k != REDRIVE_OF]
        return [*own, (REDRIVE_OF, self.id.encode())]

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON-ready values. Bytes appear twice: as UTF-8 text
        (``null`` if not valid UTF-8) and base64 (``*_base64``)."""
        info = self.info
        return {
            "id": self.id,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            **_bytes_json("key", self.key),
            **_bytes_json("value", self.value),
            "headers": [{"name": k, **_bytes_json("value", v)} for k, v in self.headers],
            "kind": info.kind,
            "error_class": info.error_class,
            "error_message": info.error_message,
            "stack": info.stack,
            "retries": info.retries,
            "first_failure_at": iso_time(info.first_failure_at),
            "last_failure_at": iso_time(info.last_failure_at),
            "group": info.group,
            "reason": self.reason,
            "source": self.source,
            "dead_lettered_at": iso_time(self.dead_lettered_at),
            "redriven": self.redriven,
            "redriven_at": iso_time(self.redriven_at),
        }


def _bytes_json(name: str, raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {name: None, f"{name}_base64": None}
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {name: text, f"{name}_base64": base64.b64encode(raw).decode()}


def iso_time(seconds: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC with milliseconds (``None`` stays ``None``)."""
    if seconds is None:
        return None
    try:
        moment = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return repr(seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def show_bytes(raw: bytes | None, limit: int | None = None) -> str:
    """Bytes for a terminal: the text if printable UTF-8, else Python's ``b'...'``
    form; cut to ``limit`` characters with ``…``."""
    if raw is None:
        return "-"
    try:
        text = raw.decode("utf-8")
        if not text.isprintable():
            text = repr(raw)
    except UnicodeDecodeError:
        text = repr(raw)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    return text


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, option: str, *, now: float | None = None) -> float:
    """``--since``/``--until``: ISO 8601 (no zone = UTC), unix seconds, or a
    duration ago (``90s``, ``15m``, ``2h``, ``3d``).

    :raises UsageError: none of those.
    """
    value = text.strip()
    m = _DURATION.fullmatch(value)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option} {text!r} is not a time",
            "use ISO 8601 (2026-11-23T07:30:00Z), unix seconds, or a duration ago (15m, 2h, 3d)",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """The filters of ``htmqc dlq list`` and ``redrive`` (see module docs).

    ``topic``: the original topic (SQL stores may hold several). ``pending``:
    only entries not redriven yet. ``limit``: at most this many entries.
    """

    topic: str | None = None
    partition: int | None = None
    offset_from: int | None = None
    offset_to: int | None = None
    error_class: str | None = None
    kind: str | None = None
    since: float | None = None
    until: float | None = None
    pending: bool = False
    limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("partition", "offset_from", "offset_to"):
            value = getattr(self, name)
            if value is not None and value < 0:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} must be 0 or more, got {value}", f"pass {flag} 0 or more")
        if self.limit is not None and self.limit < 1:
            raise UsageError(
                f"--limit must be 1 or more, got {self.limit}", "pass --limit 1 or more"
            )
        if self.kind is not None and self.kind not in DLQ_KINDS:
            raise UsageError(f"unknown --kind {self.kind!r}", f"use one of {', '.join(DLQ_KINDS)}")
        lo, hi = self.offset_from, self.offset_to
        if lo is not None and hi is not None and lo > hi:
            raise UsageError(
                f"--offset-from {lo} is above --offset-to {hi}", "swap them (bounds are inclusive)"
            )
        if self.since is not None and self.until is not None and self.since > self.until:
            raise UsageError("--since is after --until", "swap them")

    def matches(self, entry: StoredDeadLetter) -> bool:
        """Whether ``entry`` passes every filter (``limit`` aside)."""
        info = entry.info
        if self.pending and entry.redriven:
            return False
        if self.topic is not None and entry.topic != self.topic:
            return False
        if self.partition is not None and entry.partition != self.partition:
            return False
        if self.offset_from is not None and entry.offset < self.offset_from:
            return False
        if self.offset_to is not None and entry.offset > self.offset_to:
            return False
        if self.kind is not None and info.kind != self.kind:
            return False
        if self.error_class is not None and not matches_class(info.error_class, self.error_class):
            return False
        if self.since is not None and info.last_failure_at < self.since:
            return False
        return self.until is None or info.last_failure_at <= self.until


def matches_class(error_class: str, wanted: str) -> bool:
    """``wanted`` is the full class name or its last dotted part."""
    return error_class == wanted or error_class.rsplit(".", 1)[-1] == wanted
