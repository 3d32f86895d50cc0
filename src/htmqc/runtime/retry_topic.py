"""The retry topic: long backoffs leave the partition (``--retry-topic``).

A message whose next backoff is at least ``--retry-topic-ms`` (or any failure
of a message that already came from the retry topic) is written to
``<topic>.retry`` with the headers below and counts as finished in its
partition (for the core it leaves like a dead letter: ``Failed ->
DeadLettered``), so the partition's watermark moves on and other keys are not
held back by a long wait. The consumer also reads ``<topic>.retry``: a record
runs once its ``htmqc-retry-after`` time has come; until then that retry
partition is paused and rewound to the record (records are in failure order,
so later ones usually wait longer). A retried message that fails again goes
back to the retry topic with the next backoff, until ``--max-retries`` is
used up; then it is dead-lettered to ``<topic>.dlq`` as ``failed``.

Per-key order: a message moved to the retry topic no longer holds back its
key. Later messages of the same key run before it, and it runs after them.
Use the retry topic only for handlers whose effects commute per key (or that
check versions); without it, a failing message holds back its key (and only
its key) in memory for the whole backoff.

Headers (values are ASCII)::

    htmqc-retry-after     unix milliseconds when it may run again
    htmqc-retry-attempt   failed attempts so far (1, 2, ...)
    htmqc-retry-of        topic/partition/offset where the message was first read
    htmqc-first-failure   unix milliseconds of its first failure
"""

from __future__ import annotations

from typing import Any

from htmqc.dlq.record import retry_topic as retry_topic

RETRY_AFTER = "htmqc-retry-after"
RETRY_ATTEMPT = "htmqc-retry-attempt"
RETRY_OF = "htmqc-retry-of"
FIRST_FAILURE = "htmqc-first-failure"
_OURS = (RETRY_AFTER, RETRY_ATTEMPT, RETRY_OF, FIRST_FAILURE)


def _header(msg: Any, name: str) -> bytes | None:
    for key, value in msg.headers() or ():
        if key == name:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


def _int_header(msg: Any, name: str) -> int | None:
    raw = _header(msg, name)
    if raw is None:
        return None
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


def retry_after_ms(msg: Any) -> int:
    """When ``msg`` (from the retry topic) may run; 0 if the header is missing or
    malformed (then it runs at once rather than never)."""
    return _int_header(msg, RETRY_AFTER) or 0


def prior_attempts(msg: Any) -> int:
    """Failed attempts recorded on a retry-topic record (0 for other records)."""
    value = _int_header(msg, RETRY_ATTEMPT)
    return value if value is not None and value > 0 else 0


def retry_headers(
    msg: Any, *, attempt: int, due_ms: int, first_failure_ms: int
) -> list[tuple[str, bytes]]:
    """The headers of ``msg``'s retry record (its own, minus ours, plus ours)."""
    origin = _header(msg, RETRY_OF) or f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode()
    first = _int_header(msg, FIRST_FAILURE) or first_failure_ms
    kept = [(k, v) for k, v in (msg.headers() or ()) if k not in _OURS]
    return [
        *kept,
        (RETRY_AFTER, str(due_ms).encode()),
        (RETRY_ATTEMPT, str(attempt).encode()),
        (RETRY_OF, origin),
        (FIRST_FAILURE, str(first).encode()),
    ]
