"""Kafka→Kafka exactly-once example: upper-case each value into the sink topic.

``htmqc run examples.transform:upper --mode exactly-once --sink kafka:OUT ...``

``tx`` is the sink's :class:`htmqc.KafkaTx`: records sent through it are committed in the
same Kafka transaction as the consumer offsets (read them with
``isolation.level=read_committed``).
"""

from __future__ import annotations

from htmqc import KafkaTx, Message


def upper(msg: Message, tx: KafkaTx) -> None:
    """Send the upper-cased value, same key, to the sink's topic (``kafka:TOPIC``)."""
    tx.send(None, (msg.value() or b"").upper(), key=msg.key())
