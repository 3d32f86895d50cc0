"""A Kafka→Kafka enrichment: payment events in, the same events with a risk tier out.

``htmqc run examples.enrich:tier --mode exactly-once --sink kafka:payments-tiered ...``

Each event (``{"id": ..., "account": ..., "amount": cents}``, as in
:mod:`examples.payments`) is written to the sink's topic with a ``tier``
(``"small"`` under 100.00, ``"large"`` from 10,000.00, else ``"medium"``) and
its account as the key, inside the Kafka transaction that also commits the
consumer's offsets: a ``read_committed`` reader of the output sees every event
once, whatever crashed. An event that does not parse is dead-lettered
(:class:`htmqc.Permanent`).
"""

from __future__ import annotations

import json

from examples.payments import parse
from htmqc import KafkaTx, Message

#: ``(upper bound in cents, tier)``, in order; above the last bound: ``"large"``.
TIERS = ((10_000, "small"), (1_000_000, "medium"))


def tier_of(amount: int) -> str:
    """The tier of an amount in cents."""
    return next((name for bound, name in TIERS if amount < bound), "large")


def tier(msg: Message, tx: KafkaTx) -> None:
    """Send the event with its tier to the sink's topic (``tx``: the Kafka
    transaction, :class:`htmqc.KafkaTx`), keyed by account."""
    payment, account, amount = parse(msg.value())
    event = {"id": payment, "account": account, "amount": amount, "tier": tier_of(amount)}
    tx.send(None, json.dumps(event, separators=(",", ":")).encode(), key=account.encode())
