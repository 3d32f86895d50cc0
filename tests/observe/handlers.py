"""Handlers for the running-consumer observability tests (run by ``htmqc run``)."""

from __future__ import annotations

import os
import time
from typing import Any

from htmqc.produce import parse_id


def stall_sevens(msg: Any) -> None:
    """At-least-once: ids ending in 7 wait while the file ``$HTMQC_TEST_FLAG``
    exists (so the consumer holds a steady state with work in flight)."""
    ident = parse_id(msg.value())
    flag = os.environ["HTMQC_TEST_FLAG"]
    if ident % 10 == 7:
        while os.path.exists(flag):
            time.sleep(0.02)
