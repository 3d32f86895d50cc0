"""At-least-once example: print each message.

``htmqc run examples.printer:show --mode at-least-once ...``
"""

from __future__ import annotations

from typing import Any


def show(msg: Any) -> None:
    """Print ``topic/partition@offset key value`` of one message."""
    key = msg.key()
    value = msg.value() or b""
    print(
        f"{msg.topic()}/{msg.partition()}@{msg.offset()} "
        f"{key.decode(errors='replace') if key else '-'} {value[:60].decode(errors='replace')}",
        flush=True,
    )
