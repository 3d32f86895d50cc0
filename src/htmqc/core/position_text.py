"""A compact text form for ``finished_above``, the offsets finished out of order.

Offsets are stored relative to ``committed`` as runs of consecutive offsets:
each item is ``d`` or ``d:n``: a run of ``n`` offsets (default 1) that starts
``d`` offsets after the end of the previous run (for the first run: ``d`` after
``committed``). Example: committed 100 and offsets {102, 103, 104, 110} encode as
``"2:3,5"``: the run 102..104, then 110 = 105 + 5.
The empty string means no offsets. The form is short for the common case (a few
slow messages holding back a long run of finished ones), readable in a database
browser, and fits in Kafka's offset-commit metadata.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Marks htmqc's finished-above encoding inside Kafka offset-commit metadata.
METADATA_PREFIX = "htmqc1:"
#: At most this many offsets decode (the in-flight window is at most 10^7):
#: hostile metadata ("0:1000000000000") must not make the consumer allocate them.
MAX_DECODED_OFFSETS = 10_000_000


def encode_finished(committed: int, offsets: Iterable[int]) -> str:
    """Encode the offsets ``>= committed`` (lower ones are already covered)."""
    items: list[str] = []
    prev = committed
    run_start = run_len = 0
    for off in sorted({o for o in offsets if o >= committed}):
        if run_len and off == run_start + run_len:
            run_len += 1
            continue
        if run_len:
            items.append(_item(run_start - prev, run_len))
            prev = run_start + run_len
        run_start, run_len = off, 1
    if run_len:
        items.append(_item(run_start - prev, run_len))
    return ",".join(items)


def _item(gap: int, length: int) -> str:
    return str(gap) if length == 1 else f"{gap}:{length}"


def decode_finished(committed: int, text: str) -> tuple[int, ...]:
    """Inverse of :func:`encode_finished`; raises ``ValueError`` on malformed text
    or more than :data:`MAX_DECODED_OFFSETS` offsets."""
    if not text:
        return ()
    out: list[int] = []
    prev = committed
    for item in text.split(","):
        gap_s, colon, len_s = item.partition(":")
        gap, length = int(gap_s), int(len_s) if colon else 1
        if gap < 0 or length < 1:
            raise ValueError(f"bad finished-above item {item!r}")
        if len(out) + length > MAX_DECODED_OFFSETS:
            raise ValueError(f"finished-above holds more than {MAX_DECODED_OFFSETS} offsets")
        start = prev + gap
        out.extend(range(start, start + length))
        prev = start + length
    return tuple(out)


def encode_metadata(committed: int, offsets: Iterable[int]) -> str:
    """Kafka offset-commit metadata carrying ``finished_above``."""
    return METADATA_PREFIX + encode_finished(committed, offsets)


def decode_metadata(committed: int, metadata: str | None) -> tuple[int, ...]:
    """``finished_above`` from Kafka commit metadata; metadata that is not
    htmqc's (another tool's, or none) means no offsets finished above."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return ()
    return decode_finished(committed, metadata[len(METADATA_PREFIX) :])
