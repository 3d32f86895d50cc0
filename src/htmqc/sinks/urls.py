"""Sink URLs: parsing, validation, and redaction of passwords.

Accepted forms (the ``--sink`` option)::

    sqlite:///relative/path.db        sqlite:////absolute/path.db
    postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?libpq options]   (or postgres://)
    kafka:TOPIC

``?table_prefix=NAME_`` (SQL sinks) names htmqc's tables ``NAME_positions``;
the default prefix is ``htmqc_``. Every message that shows a URL shows it
through :func:`redact_url`, so a password never reaches a log or a terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, urlencode

from htmqc.errors import UsageError

DEFAULT_TABLE_PREFIX = "htmqc_"
_FORMS = "use sqlite:///PATH.db, postgresql://USER@HOST:PORT/DB or kafka:TOPIC"
_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_PASSWORD_PARAM_RE = re.compile(
    r"((?:^|[?&;\s])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)", re.IGNORECASE
)
SinkKind = Literal["sqlite", "postgresql", "kafka"]


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***``: the one in the user
    info (``user:secret@host``) and ``password=``/``sslpassword=`` parameters
    (query string or libpq ``key=value`` form)."""
    out = url
    scheme, sep, rest = out.partition("://")
    if sep:
        authority_end = len(rest)
        for stop in "?#":
            if stop in rest:
                authority_end = min(authority_end, rest.index(stop))
        at = rest.rfind("@", 0, authority_end)
        if at >= 0 and ":" in rest[:at]:
            user = rest[:at].split(":", 1)[0]
            rest = f"{user}:***{rest[at:]}"
        out = f"{scheme}{sep}{rest}"
    return _PASSWORD_PARAM_RE.sub(lambda m: f"{m.group(1)}***", out)


@dataclass(frozen=True, slots=True)
class SinkUrl:
    """A parsed sink URL. ``target``: the SQLite path, the PostgreSQL
    connection URL without htmqc's own parameters, or the Kafka topic."""

    kind: SinkKind
    target: str
    table_prefix: str
    display: str  # the redacted URL, for messages


def parse_sink_url(url: str) -> SinkUrl:
    """Parse and validate ``url``; raise :class:`UsageError` (one line, no
    password) naming the problem and the fix."""
    shown = redact_url(url)
    if url.startswith("kafka:"):
        topic = url[len("kafka:") :]
        if not _TOPIC_RE.fullmatch(topic) or topic in {".", ".."}:
            raise UsageError(
                f"sink URL {shown!r} does not name a valid Kafka topic",
                "use kafka:TOPIC with letters, digits, '.', '_' or '-'",
            )
        return SinkUrl("kafka", topic, DEFAULT_TABLE_PREFIX, shown)
    if url.startswith("sqlite:"):
        return _parse_sqlite(url, shown)
    if url.startswith(("postgresql://", "postgres://")):
        return _parse_postgresql(url, shown)
    raise UsageError(f"unknown sink URL {shown!r}", _FORMS)


def _split_prefix(query: str, shown: str) -> tuple[str, list[tuple[str, str]]]:
    """htmqc's ``table_prefix`` parameter, and the remaining parameters."""
    prefix = DEFAULT_TABLE_PREFIX
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "table_prefix":
            if not _PREFIX_RE.fullmatch(value):
                raise UsageError(
                    f"table_prefix {value!r} in sink URL {shown!r} is not a plain SQL name",
                    "use letters, digits and '_' (at most 41), starting with a letter or '_'",
                )
            prefix = value
        else:
            rest.append((key, value))
    return prefix, rest


def _parse_sqlite(url: str, shown: str) -> SinkUrl:
    if not url.startswith("sqlite:///"):
        raise UsageError(
            f"SQLite sink URL {shown!r} needs three slashes",
            "use sqlite:///relative/path.db or sqlite:////absolute/path.db",
        )
    path, _, query = url[len("sqlite:///") :].partition("?")
    prefix, rest = _split_prefix(query, shown)
    if rest:
        raise UsageError(
            f"unknown parameter {rest[0][0]!r} in SQLite sink URL {shown!r}",
            "the only parameter is table_prefix=NAME_",
        )
    if not path or path.endswith("/"):
        raise UsageError(f"SQLite sink URL {shown!r} names no file", "use sqlite:///PATH.db")
    if path == ":memory:":
        raise UsageError(
            "an in-memory SQLite sink cannot keep positions across restarts",
            "use a file: sqlite:///PATH.db",
        )
    return SinkUrl("sqlite", path, prefix, shown)


def _parse_postgresql(url: str, shown: str) -> SinkUrl:
    base, _, query = url.partition("?")
    prefix, rest = _split_prefix(query, shown)
    target = f"{base}?{urlencode(rest)}" if rest else base
    return SinkUrl("postgresql", target, prefix, shown)
