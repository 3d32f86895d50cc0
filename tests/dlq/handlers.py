"""Handlers the redrive tests run through ``htmqc run`` (subprocesses).

``HTMQC_TEST_BROKEN`` names a file of comma-separated message ids that are
"broken": while an id is listed, its message fails (ids divisible by 3 with
:class:`htmqc.Permanent`, the others with ``ValueError``). Emptying the file
is the fix. The file is read at every call, so a fix applies at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from examples.effects import record

from htmqc import Permanent
from htmqc.produce import parse_id


def _broken() -> frozenset[int]:
    path = Path(os.environ["HTMQC_TEST_BROKEN"])
    text = path.read_text() if path.exists() else ""
    return frozenset(int(x) for x in text.split(",") if x.strip())


def _check(msg: Any) -> int:
    ident = parse_id(msg.value())
    if ident in _broken():
        if ident % 3 == 0:
            raise Permanent(f"id {ident} cannot be handled yet")
        raise ValueError(f"id {ident} is broken")
    return ident


def record_unless_broken(msg: Any, tx: Any) -> None:
    """Exactly-once into SQL: the demo's effect row, unless the id is broken."""
    _check(msg)
    record(msg, tx)


def forward_unless_broken(msg: Any, out: Any) -> None:
    """Exactly-once Kafka->Kafka: the message's id to the output topic, unless broken."""
    out.send(None, str(_check(msg)).encode(), key=msg.key())
