"""Handlers for the security tests (run by ``htmqc run`` in a child process).

Each appends one line per handled message to the file named by
``$HTMQC_SECURITY_OUT`` (opened, written and closed per message, so a reader
sees every finished line).
"""

from __future__ import annotations

import json
import os
from typing import Any

from htmqc import Permanent
from htmqc.produce import parse_id


def _append(line: str) -> None:
    with open(os.environ["HTMQC_SECURITY_OUT"], "a", encoding="utf-8") as out:
        out.write(line + "\n")


def record_id(msg: Any) -> None:
    """At-least-once: record the id of an ``htmqc produce`` message."""
    _append(str(parse_id(msg.value())))


def strict_json(msg: Any) -> None:
    """At-least-once: accept only a UTF-8 JSON object with an integer ``id``.

    Anything else (no value, invalid UTF-8, not JSON, another shape) raises
    :class:`htmqc.Permanent`, so the message goes to ``<topic>.dlq`` at once.
    The reason names the problem, never the bytes.
    """
    value = msg.value()
    if value is None:
        raise Permanent("null value")
    try:
        doc = json.loads(value.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Permanent(f"value is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise Permanent(f"value is not JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or type(doc.get("id")) is not int:
        raise Permanent("value is not an object with an integer id")
    _append(str(doc["id"]))


def fail_quoting_secret(msg: Any, _tx: Any = None) -> None:
    """Either mode: fail every message with an error that quotes the secret
    in ``$HTMQC_SECURITY_SECRET`` (a careless handler), so it must be scrubbed
    from logs, DLQ headers and everything else."""
    secret = os.environ["HTMQC_SECURITY_SECRET"]
    raise Permanent(f"could not log in with password {secret} for id {parse_id(msg.value())}")
