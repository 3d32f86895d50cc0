"""Handlers of the serializer tests (importable by ``htmqc run MODULE:FUNCTION``)."""

from __future__ import annotations

from typing import Any

from htmqc import DecodedMessage


def plain(decoded: Any) -> dict[str, Any]:
    """A decoded payment as a dict (a Protobuf message by its fields)."""
    if isinstance(decoded, dict):
        return decoded
    return {"id": decoded.id, "who": decoded.who}


def store_payment(msg: DecodedMessage, tx: Any) -> None:
    """Exactly-once: the decoded payment as a row of ``effects`` (its id the key)."""
    assert isinstance(msg.value(), bytes)  # value() stays the raw bytes
    value = plain(msg.decoded_value())
    tx.execute("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, who TEXT)")
    tx.execute("INSERT INTO effects (id, who) VALUES (?, ?)", (value["id"], value["who"]))
