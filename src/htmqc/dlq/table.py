"""The SQL dead-letter table (exactly-once into SQLite or PostgreSQL).

A dead letter of a database sink is a row of ``htmqc_dead_letters`` (the
sink's table prefix + ``dead_letters``), inserted in the same transaction as
the consumer's position, so a message ends with its effect or its row, never
both and never neither. Columns:

=================  ======================================================
id                 row id (the DLQ entry's name in ``htmqc dlq``)
topic              original topic
partition          original partition
offset             original offset
msg_key            original key (NULL: no key)
msg_value          original value
msg_headers        original headers: JSON ``[[name, base64 or null], ...]``
kind               failed | permanent | poison | too_large
error_class        module.QualifiedName of the exception (scrubbed)
error_message      str(exception), scrubbed, at most 4096 bytes
stack              the traceback's last 8192 bytes, scrubbed
retries            failed attempts before the decision, minus one
first_failure_at   unix seconds
last_failure_at    unix seconds
consumer_group     the group that dead-lettered it
reason             one line: ``ErrorClass: first line of the message``
source             topic/partition/offset the dead-lettered copy was read from
dead_lettered_at   unix seconds when the row was written
redriven_at        unix seconds of the redrive that wrote it back; NULL until then
=================  ======================================================

``partition``, ``offset`` are quoted everywhere (reserved words).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from typing import Any

from htmqc.dlq.headers import kept_headers, origin_of, stored_reason, written_info
from htmqc.dlq.record import DeadLetterInfo

DEFAULT_PREFIX = "htmqc_"

#: Column names, in table order (``id`` first).
COLUMNS = (
    "id", "topic", '"partition"', '"offset"', "msg_key", "msg_value", "msg_headers", "kind",
    "error_class", "error_message", "stack", "retries", "first_failure_at", "last_failure_at",
    "consumer_group", "reason", "source", "dead_lettered_at", "redriven_at",
)  # fmt: skip


def table_name(prefix: str = DEFAULT_PREFIX) -> str:
    """The dead-letter table of a sink whose tables start with ``prefix``."""
    return f"{prefix}dead_letters"


def create_sql(table: str, dialect: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``dialect`` (``sqlite`` or ``postgresql``)."""
    if dialect == "postgresql":
        ident, blob, real = "BIGSERIAL PRIMARY KEY", "BYTEA", "DOUBLE PRECISION"
    else:
        ident, blob, real = "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB", "REAL"
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (id {ident}, topic TEXT NOT NULL, "
        f'"partition" INTEGER NOT NULL, "offset" BIGINT NOT NULL, msg_key {blob}, '
        f"msg_value {blob}, msg_headers TEXT NOT NULL, kind TEXT NOT NULL, "
        "error_class TEXT NOT NULL, error_message TEXT NOT NULL, stack TEXT NOT NULL, "
        f"retries INTEGER NOT NULL, first_failure_at {real} NOT NULL, "
        f"last_failure_at {real} NOT NULL, consumer_group TEXT NOT NULL, reason TEXT NOT NULL, "
        f"source TEXT NOT NULL, dead_lettered_at {real} NOT NULL, redriven_at {real})"
    )


def encode_headers(headers: Sequence[tuple[str, Any]]) -> str:
    """Headers as JSON ``[[name, base64 or null], ...]``."""
    return json.dumps(
        [[k, None if v is None else base64.b64encode(bytes(v)).decode()] for k, v in headers]
    )


def decode_headers(text: str) -> tuple[tuple[str, bytes | None], ...]:
    """Inverse of :func:`encode_headers`.

    :raises ValueError: ``text`` is not such JSON.
    """
    try:
        items = json.loads(text)
        out = []
        for name, value in items:
            if not isinstance(name, str) or not (value is None or isinstance(value, str)):
                raise ValueError("bad header")
            out.append((name, None if value is None else base64.b64decode(value, validate=True)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"stored headers are malformed: {exc}") from None
    return tuple(out)


def insert(cur: Any, table: str, dialect: str, msg: Any, info: DeadLetterInfo) -> None:
    """Create the table if needed and insert ``msg``'s dead letter (scrubbed and
    bounded like the Kafka headers) with ``cur``, in the caller's transaction."""
    clean = written_info(info)
    topic, partition, offset = origin_of(msg)
    param = "%s" if dialect == "postgresql" else "?"
    cur.execute(create_sql(table, dialect))
    cur.execute(
        f"INSERT INTO {table} ({', '.join(COLUMNS[1:-1])}) "
        f"VALUES ({', '.join([param] * (len(COLUMNS) - 2))})",
        (
            topic,
            partition,
            offset,
            msg.key(),
            msg.value(),
            encode_headers(kept_headers(msg.headers())),
            clean.kind,
            clean.error_class,
            clean.error_message,
            clean.stack,
            clean.retries,
            clean.first_failure_at,
            clean.last_failure_at,
            clean.group,
            stored_reason(info),
            f"{msg.topic()}/{msg.partition()}/{msg.offset()}",
            time.time(),
        ),
    )
