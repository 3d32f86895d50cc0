"""Log set-up for the command line: ``--log-format text|json``, secrets scrubbed.

Records may carry ``topic``, ``partition`` and ``offset`` (passed as ``extra=``
by the runtime); the JSON format puts them in their own fields, the text format
appends them as ``[topic/partition@offset]``. Every formatted line goes through
:func:`htmqc.secrets.scrub`, so a secret that reached a message (an exception
text quoting a URL, say) is masked on the way out.

JSON line::

    {"ts": "2026-11-23T07:00:00.123Z", "level": "WARNING", "logger": "htmqc.runtime",
     "msg": "handler failed on orders/3@120: ValueError",
     "topic": "orders", "partition": 3, "offset": 120}
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO

from htmqc import secrets
from htmqc.errors import UsageError

FORMATS = ("text", "json")
_FIELDS = ("topic", "partition", "offset")


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
    """One JSON object per line (module docs), secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return secrets.scrub(json.dumps(doc, default=str))


def setup(level: str = "INFO", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Configure the root logger once for a command.

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
