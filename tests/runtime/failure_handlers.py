"""Handlers for the failure-handling tests (run by ``htmqc run`` subprocesses).

Switches come from the environment: ``HTMQC_TEST_FLAG`` (a file: while it
exists, handlers are slow), ``HTMQC_TEST_POISON`` (comma-separated ids that
always fail), ``HTMQC_TEST_FLAKY_EVERY`` (ids divisible by it fail with a
Retryable on their first attempt in this process).
"""

from __future__ import annotations

import os
import time
from typing import Any

from examples.effects import record

from htmqc import Retryable
from htmqc.produce import parse_id

_POISON = frozenset(int(x) for x in os.environ.get("HTMQC_TEST_POISON", "").split(",") if x)
_FLAKY = int(os.environ.get("HTMQC_TEST_FLAKY_EVERY", "0"))
_FLAG = os.environ.get("HTMQC_TEST_FLAG", "")
_tried: set[int] = set()


def slowdown(msg: Any) -> None:
    """At-least-once: 1 ms per message, 10 ms while the flag file exists."""
    time.sleep(0.01 if _FLAG and os.path.exists(_FLAG) else 0.001)


def poison_or_record(msg: Any, tx: Any) -> None:
    """Exactly-once: ids in ``HTMQC_TEST_POISON`` always fail; the rest record."""
    if parse_id(msg.value()) in _POISON:
        raise ValueError(f"poison id {parse_id(msg.value())}")
    record(msg, tx)


def flaky_record(msg: Any, tx: Any) -> None:
    """Exactly-once: a transient error on the first attempt of every N-th id, after
    writing (so the savepoint must undo the half-done effect), then record."""
    ident = parse_id(msg.value())
    record(msg, tx)
    if _FLAKY and ident % _FLAKY == 0 and ident not in _tried:
        _tried.add(ident)
        raise Retryable(f"transient sink error on {ident}")


def fail_twice_then_log(msg: Any) -> None:
    """At-least-once: ids in ``HTMQC_TEST_POISON`` fail on their first two attempts
    (counted by the retry topic's attempt header); id ``HTMQC_TEST_HOPELESS`` always
    fails. Successes append ``id topic handled_ms retry_after_ms`` to ``$HTMQC_TEST_OUT``."""
    from htmqc.runtime.retry_topic import prior_attempts, retry_after_ms

    ident = parse_id(msg.value())
    if ident == int(os.environ.get("HTMQC_TEST_HOPELESS", "-1")):
        raise ValueError(f"{ident} never works")
    if ident in _POISON and prior_attempts(msg) < 2:
        raise ValueError(f"{ident} not yet")
    with open(os.environ["HTMQC_TEST_OUT"], "a") as out:
        out.write(f"{ident} {msg.topic()} {time.time() * 1000:.0f} {retry_after_ms(msg)}\n")


class BadPayload(ValueError):
    """A user's exception type that retrying cannot help (``--permanent-errors``)."""
