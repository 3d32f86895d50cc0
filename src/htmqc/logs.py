"""Log set-up for the command line: ``--log-format text|json``, secrets scrubbed,
repeated lines rate-limited.

Records may carry the extra fields of :data:`JSON_FIELDS` (``topic``,
``partition``, ``offset``, ``error``, ``attempt``, ``destination``,
``suppressed``; passed as ``extra=`` by the runtime); the JSON format puts them
in their own fields, the text format appends ``[topic/partition@offset]``.
Every formatted line goes through :func:`htmqc.secrets.scrub`, so a secret that
reached a message (an exception text quoting a URL, say) is masked on the way
out.

JSON line (the schema is :data:`JSON_FIELDS`, documented in the README's
"Log lines" section; a test keeps the two equal)::

    {"ts": "2026-11-23T07:00:00.123Z", "level": "WARNING", "logger": "htmqc.runtime",
     "msg": "handler failed on orders/3@120 (attempt 2): ValueError: bad amount",
     "topic": "orders", "partition": 3, "offset": 120,
     "error": "ValueError: bad amount", "attempt": 2}

Repeated lines: :class:`RateLimit` lets the first ``burst`` lines of a kind
through per window and then says how many it held back in one summary line;
:func:`limit_repeats` puts it on htmqc's own loggers (:data:`LIMITED_LOGGERS`)
and on ``htmqc.librdkafka``, where confluent-kafka's ``logger`` setting sends
librdkafka's lines.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from htmqc import secrets
from htmqc.errors import UsageError

FORMATS = ("text", "json")
#: The longest exception text a log line carries (``error``), ellipsis included.
ERROR_LIMIT = 300
ELLIPSIS = "..."

#: The fields of a ``--log-format json`` line, in order, with what they hold.
#: The first four are on every line; the others only where they apply. The
#: README's "Log lines" table lists exactly these (tests/observe/test_log_lines.py).
JSON_FIELDS: dict[str, str] = {
    "ts": "time of the line, UTC, ISO 8601 with milliseconds (`2026-11-23T07:00:00.123Z`)",
    "level": "`DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL`",
    "logger": "the logger: `htmqc.runtime`, `htmqc.sinks`, `htmqc.librdkafka`, ...",
    "msg": "the message: the text format's line without its time, level, logger and "
    "`[topic/partition@offset]`",
    "topic": "topic of the message the line is about",
    "partition": "its partition (integer)",
    "offset": "its offset (integer)",
    "error": "the handler's exception: `Class: message` on one line (line breaks "
    f"become spaces), at most {ERROR_LIMIT} characters (a longer one ends in `...`)",
    "attempt": "failed attempts of the message so far, this one included (integer, from 1)",
    "destination": "where a dead letter was written: the DLQ topic (`orders.dlq`, "
    "`orders.dlq.poison`) or the sink's database and table "
    "(`sqlite:///data/out.db table htmqc_dead_letters`)",
    "suppressed": "on a summary line: how many similar lines were held back (integer)",
    "exc": "a traceback, when the line carries one",
}
#: Fields every JSON line has.
REQUIRED_FIELDS = ("ts", "level", "logger", "msg")
#: Fields taken from the record's attributes (``extra=``) when set.
_EXTRA_FIELDS = tuple(f for f in JSON_FIELDS if f not in (*REQUIRED_FIELDS, "exc"))



def one_line(text: str, limit: int = ERROR_LIMIT) -> str:
    """``text`` on one line (every run of whitespace that holds a line break
    becomes one space), at most ``limit`` characters: a longer text is cut and
    ends in ``...``. Secrets are not this function's business (the
    formatters scrub whole lines)."""
    if limit < len(ELLIPSIS):
        raise ValueError(f"limit must be >= {len(ELLIPSIS)}, got {limit}")
    folded = re.sub(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]\s*", " ", text).strip()
    if len(folded) <= limit:
        return folded
    return folded[: limit - len(ELLIPSIS)] + ELLIPSIS


def error_text(error_class: str, message: str, limit: int = ERROR_LIMIT) -> str:
    """``Class: message`` of an exception for a log line (:func:`one_line`).
    ``error_class`` may be ``module.Class``: only the last part is kept. An
    empty message leaves just the class."""
    name = error_class.rsplit(".", 1)[-1]
    return one_line(f"{name}: {message}" if message.strip() else name, limit)


def describe(exc: BaseException, limit: int = ERROR_LIMIT) -> str:
    """:func:`error_text` of ``exc`` (its class name and ``str(exc)``)."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not break the log line
        message = f"<unprintable {type(exc).__name__}>"
    return error_text(type(exc).__qualname__, message, limit)


class ScrubbingFormatter(logging.Formatter):
    """Text lines with the message's partition and offset, secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        topic = getattr(record, "topic", None)
        if topic is not None:
            where = f"{topic}/{getattr(record, 'partition', '?')}@{getattr(record, 'offset', '?')}"
            line += f" [{where}]"
        return secrets.scrub(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the fields of :data:`JSON_FIELDS` (only
    those, in that order), secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _EXTRA_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return secrets.scrub(json.dumps(doc, default=str))


# -- repeated lines ---------------------------------------------------------------------

#: htmqc's own loggers that :func:`limit_repeats` rate-limits (a logger's
#: filters see only the records logged on it, not its children's).
LIMITED_LOGGERS = ("htmqc.runtime", "htmqc.sinks", "htmqc.redis", "htmqc.spark.kafka")
#: The logger librdkafka's lines go to (confluent-kafka's ``logger`` setting).
LIBRDKAFKA_LOGGER = "htmqc.librdkafka"
#: htmqc's lines: the first :data:`BURST` of a kind per :data:`WINDOW` seconds.
BURST, WINDOW = 10, 60.0
#: librdkafka's lines: one of a kind per 30 s (it repeats ``Connection refused``
#: several times a second while a broker is down).
LIBRDKAFKA_BURST, LIBRDKAFKA_WINDOW = 1, 30.0
#: Seconds between two looks for windows that closed with lines held back.
SWEEP_EVERY = 1.0
#: Kinds of line remembered at once; past it the oldest is summarized and forgotten.
MAX_KINDS = 4096
_DIGITS = re.compile(r"\d+")
#: librdkafka's own count of the repeats it held back, appended inside a line's
#: closing parenthesis (``..., 1 identical error(s) suppressed)``): not part of its kind.
_LIBRDKAFKA_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")
_SUMMARY = "_htmqc_summary"


def line_kind(record: logging.LogRecord) -> tuple[str, int, str]:
    """What makes two records "the same line" for :class:`RateLimit`: logger,
    level and the rendered message with every run of digits replaced by ``#``
    (offsets, ports, counts and times vary between repeats; librdkafka's lines
    arrive already rendered, so the ``%`` template alone would lump them all), and
    without librdkafka's own count of the repeats it suppressed."""
    text = _LIBRDKAFKA_SUPPRESSED.sub("", record.getMessage())
    return record.name, record.levelno, _DIGITS.sub("#", text)


@dataclass(slots=True)
class _Window:
    start: float
    passed: int = 1
    held: int = 0
    last: str = ""


class RateLimit(logging.Filter):
    """Rate limit of repeated lines (a :class:`logging.Filter` for loggers).

    Contract: of the records of one :func:`line_kind`, the first ``burst`` of a
    window of ``window`` seconds (on ``clock``) pass; later ones in the window
    are held back. Once the window has closed (seen at the next record of that
    kind, at a sweep every :data:`SWEEP_EVERY` s on any record, or at
    :meth:`flush`) one summary record is logged on the same logger at the same
    level: the last held line's text plus ``(suppressed K similar lines in the
    last S s)``, with ``suppressed=K`` as an extra field; the next record of the
    kind opens a new window. So the first occurrence of every distinct line is
    always shown, and every held line is counted in exactly one summary (or
    dropped unsummarized only if the process dies before a flush).
    Thread-safe; the clock is injectable, which makes it deterministic.
    """

    def __init__(
        self,
        burst: int = BURST,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = MAX_KINDS,
    ) -> None:
        super().__init__()
        if burst < 1 or window <= 0 or max_kinds < 1:
            raise ValueError(f"need burst >= 1, window > 0, max_kinds >= 1; got "
                             f"{burst}, {window}, {max_kinds}")
        self.burst = burst
        self.window = window
        self.clock = clock
        self.max_kinds = max_kinds
        #: Lines held back since this filter was made (tests, diagnostics).
        self.held_total = 0
        self._kinds: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()
        self._next_sweep = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown (class docs); logs due summaries first."""
        if getattr(record, _SUMMARY, False):
            return True
        kind = line_kind(record)
        due: list[tuple[tuple[str, int, str], _Window, float]] = []
        with self._lock:
            now = self.clock()
            if now >= self._next_sweep:
                self._next_sweep = now + SWEEP_EVERY
                due.extend(self._closed(now))
            win = self._kinds.get(kind)
            if win is not None and now - win.start >= self.window:
                del self._kinds[kind]
                if win.held:
                    due.append((kind, win, now))
                win = None
            if win is None:
                if len(self._kinds) >= self.max_kinds:
                    oldest = next(iter(self._kinds))
                    old = self._kinds.pop(oldest)
                    if old.held:
                        due.append((oldest, old, now))
                self._kinds[kind] = _Window(start=now)
                show = True
            elif win.passed < self.burst:
                win.passed += 1
                show = True
            else:
                win.held += 1
                win.last = record.getMessage()
                self.held_total += 1
                show = False
        self._emit(due)
        return show

    def flush(self) -> None:
        """Log the summary of every kind with lines held back now and forget
        every window (end of a run)."""
        with self._lock:
            now = self.clock()
            due = [(k, w, now) for k, w in self._kinds.items() if w.held]
            self._kinds.clear()
        self._emit(due)

    def _closed(self, now: float) -> list[tuple[tuple[str, int, str], _Window, float]]:
        """Forget the windows that closed; those with lines held back, to summarize."""
        closed = [(k, w) for k, w in self._kinds.items() if now - w.start >= self.window]
        for k, _ in closed:
            del self._kinds[k]
        return [(k, w, now) for k, w in closed if w.held]

    @staticmethod
    def _emit(due: list[tuple[tuple[str, int, str], _Window, float]]) -> None:
        for (name, level, _), win, now in due:
            logger = logging.getLogger(name)
            record = logger.makeRecord(
                name, level, __file__, 0,
                "%s (suppressed %d similar lines in the last %.0f s)",
                (win.last, win.held, max(0.0, now - win.start)), None,
                extra={"suppressed": win.held, _SUMMARY: True},
            )
            logger.handle(record)


_installed: dict[str, RateLimit] = {}
_install_lock = threading.Lock()


def limit_repeats(
    htmqc: RateLimit | None = None, librdkafka: RateLimit | None = None
) -> tuple[RateLimit, RateLimit]:
    """Put one :class:`RateLimit` on every logger of :data:`LIMITED_LOGGERS`
    (``htmqc``; default :data:`BURST` per :data:`WINDOW`) and one on
    :data:`LIBRDKAFKA_LOGGER` (``librdkafka``; default
    :data:`LIBRDKAFKA_BURST` per :data:`LIBRDKAFKA_WINDOW`). Idempotent: the
    filters already installed stay unless others are passed, which replace
    them (tests inject clocks so). Returns the two filters in place."""
    with _install_lock:
        for role, given, names, default in (
            ("htmqc", htmqc, LIMITED_LOGGERS, (BURST, WINDOW)),
            ("librdkafka", librdkafka, (LIBRDKAFKA_LOGGER,),
             (LIBRDKAFKA_BURST, LIBRDKAFKA_WINDOW)),
        ):
            old = _installed.get(role)
            new = given if given is not None else old or RateLimit(*default)
            for name in names:
                logger = logging.getLogger(name)
                if old is not None and old is not new:
                    logger.removeFilter(old)
                if new not in logger.filters:
                    logger.addFilter(new)
            _installed[role] = new
        return _installed["htmqc"], _installed["librdkafka"]


def unlimit_repeats() -> None:
    """Take the filters of :func:`limit_repeats` off again, after a
    :meth:`RateLimit.flush` (tests)."""
    with _install_lock:
        for role, limit in list(_installed.items()):
            limit.flush()
            names = (LIBRDKAFKA_LOGGER,) if role == "librdkafka" else LIMITED_LOGGERS
            for name in names:
                logging.getLogger(name).removeFilter(limit)
        _installed.clear()


def flush_repeats() -> None:
    """:meth:`RateLimit.flush` the installed filters (end of a run)."""
    with _install_lock:
        limits = list(_installed.values())
    for limit in limits:
        limit.flush()


#: Client libraries whose own log lines (pika and rstream log a lost connection as
#: an ERROR with a traceback) repeat what htmqc reports itself in one line: shown at
#: ``--log-level DEBUG``. ``pulsar``: pulsar-client's C++ lines
#: (:func:`htmqc.sources.pulsar.client_logger`).
CLIENT_LOGGERS = ("pika", "rstream", "pulsar")
#: Client libraries whose INFO lines are chatter (py4j, PySpark's bridge to the JVM,
#: logs every connection it opens and closes, even from a garbage-collected client long
#: after the command's streams are gone): shown from WARNING up, all at ``DEBUG``.
CHATTY_LOGGERS = ("py4j",)


def setup(level: str = "INFO", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Configure the root logger once for a command (and quiet
    :data:`CLIENT_LOGGERS` and :data:`CHATTY_LOGGERS` below ``DEBUG``).

    :raises UsageError: unknown level or format.
    """
    if fmt not in FORMATS:
        raise UsageError(f"--log-format {fmt!r} is unknown", f"use one of: {', '.join(FORMATS)}")
    numeric = logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise UsageError(f"--log-level {level!r} is unknown", "use DEBUG, INFO, WARNING or ERROR")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ScrubbingFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if numeric <= logging.DEBUG
                                         else logging.CRITICAL)  # fmt: skip
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if numeric <= logging.DEBUG
                                         else logging.WARNING)  # fmt: skip
