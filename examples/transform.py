"""Kafka→Kafka exactly-once example: upper-case each value into the sink topic.

``htmqc run examples.transform:upper --mode exactly-once --sink kafka:OUT ...``

``tx`` is the sink's ``Output``: records sent through it are committed in the
same Kafka transaction as the consumer offsets (read them with
``isolation.level=read_committed``).
"""

from __future__ import annotations

from typing import Any


def upper(msg: Any, tx: Any) -> None:
    """Send the upper-cased value, same key, to the sink's topic (``kafka:TOPIC``)."""
    tx.send(None, (msg.value() or b"").upper(), key=msg.key())
