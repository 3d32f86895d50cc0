"""Exactly-once demo handler: one row in ``effects`` per message.

``htmqc run examples.effects:record --mode exactly-once --sink sqlite:///out.db ...``

The row goes through the sink transaction handle ``tx`` (a DB-API cursor, :class:`htmqc.SqlTx`), so
it is stored exactly when the consumer's position covering the message is.
The ``id`` column is deliberately *not* unique: a message processed twice
would show up as a duplicate in the audit instead of being hidden by a
constraint. ``produced_ms`` is the message timestamp and ``effect_ms`` the
time the handler ran, for end-to-end latency.
"""

from __future__ import annotations

import time

from htmqc import Message, SqlTx
from htmqc.produce import parse_id

TABLE = "effects"
_CREATE = (
    f'CREATE TABLE IF NOT EXISTS {TABLE} (id BIGINT NOT NULL, msg_key TEXT, "partition" INTEGER, '
    '"offset" BIGINT, produced_ms DOUBLE PRECISION, effect_ms DOUBLE PRECISION)'
)
_last: SqlTx | None = None
_insert = ""


def record(msg: Message, tx: SqlTx) -> None:
    """Insert ``(id, key, partition, offset, produced_ms, effect_ms)`` for ``msg``."""
    global _last, _insert
    if tx is not _last:  # a new transaction: make sure the table is there
        tx.execute(_CREATE)
        _last = tx
        p = "?" if type(tx).__module__.startswith("sqlite3") else "%s"
        _insert = (
            f'INSERT INTO {TABLE} (id, msg_key, "partition", "offset", produced_ms, effect_ms) '
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
        )
    key = msg.key()
    try:
        tx.execute(
            _insert,
            (
                parse_id(msg.value() or b""),
                key.decode() if key is not None else None,
                msg.partition(),
                msg.offset(),
                msg.timestamp()[1],
                time.time() * 1000.0,
            ),
        )
    except Exception:
        # The runtime may have rolled back a scope that held our CREATE TABLE
        # (another message in it failed): create it again on the next call.
        _last = None
        raise
