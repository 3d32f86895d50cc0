"""Handlers the runtime tests run through ``htmqc run`` in subprocesses."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from htmqc.produce import parse_id

_lock = threading.Lock()


def log_order(msg: Any) -> None:
    """At-least-once: append ``partition key id`` to the file ``$HTMQC_TEST_OUT``."""
    time.sleep(0.0005)
    line = (
        f"{msg.partition()} {msg.key().decode()} {parse_id(msg.value())} {threading.get_ident()}\n"
    )
    with _lock, open(os.environ["HTMQC_TEST_OUT"], "a") as out:
        out.write(line)


def slow_record(msg: Any, tx: Any) -> None:
    """Exactly-once: the demo's effect row, after a short sleep (so kills land mid-batch)."""
    from examples.effects import record

    time.sleep(0.001)
    record(msg, tx)


NOT_CALLABLE = 42


def poison_five(msg: Any) -> None:
    """At-least-once: message id 5 always fails (it ends in the DLQ)."""
    if parse_id(msg.value()) == 5:
        raise ValueError("id 5 is poison")
