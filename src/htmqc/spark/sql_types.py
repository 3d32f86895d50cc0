"""Spark column types as SQL column types, and Spark values as driver values.

:func:`sql_type` maps a Spark type (its ``simpleString()``) to PostgreSQL's or
SQLite's type; arrays, structs and maps are stored as JSON (``JSONB`` in
PostgreSQL, text in SQLite), turned into JSON text by Spark itself
(:func:`prepare`: ``to_json``, binary inside them as base64). A type with no
SQL counterpart (intervals, variant) is a :class:`~htmqc.errors.UsageError`
naming the column. :func:`to_sql_value` makes one Python value fit the
driver: aware UTC datetimes for Spark timestamps, ISO text, ``0``/``1`` and
decimal text for SQLite.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from typing import Any

from htmqc.errors import UsageError

_POSTGRES = {
    "binary": "BYTEA",
    "boolean": "BOOLEAN",
    "tinyint": "SMALLINT",
    "smallint": "SMALLINT",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "REAL",
    "double": "DOUBLE PRECISION",
    "string": "TEXT",
    "date": "DATE",
    "timestamp": "TIMESTAMPTZ",
    "timestamp_ntz": "TIMESTAMP",
}
_SQLITE = {
    "binary": "BLOB",
    "boolean": "INTEGER",
    "tinyint": "INTEGER",
    "smallint": "INTEGER",
    "int": "INTEGER",
    "bigint": "INTEGER",
    "float": "REAL",
    "double": "REAL",
    "string": "TEXT",
    "date": "TEXT",
    "timestamp": "TEXT",
    "timestamp_ntz": "TEXT",
}
_COMPLEX = ("array<", "struct<", "map<")
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


def is_complex(simple: str) -> bool:
    return simple.startswith(_COMPLEX)


def sql_type(column: str, simple: str, postgres: bool) -> str:
    """The SQL type of a Spark column whose type's ``simpleString()`` is ``simple``."""
    if is_complex(simple):
        return "JSONB" if postgres else "TEXT"
    match = _DECIMAL.match(simple)
    if match:
        # SQLite's NUMERIC would round through a double: keep the digits as text.
        return f"NUMERIC({match[1]},{match[2]})" if postgres else "TEXT"
    table = _POSTGRES if postgres else _SQLITE
    if simple not in table:
        raise UsageError(
            f"column {column!r} has Spark type {simple}, which has no SQL type here",
            f"cast it in a select, e.g. cast({column} as string)",
        )
    return table[simple]


def prepare(df: Any) -> Any:
    """``df`` with arrays, structs and maps as JSON text (Spark's ``to_json``)."""
    from pyspark.sql import functions as F

    if not any(is_complex(f.dataType.simpleString()) for f in df.schema.fields):
        return df
    return df.select(
        *(
            F.to_json(F.col(f"`{f.name}`")).alias(f.name)
            if is_complex(f.dataType.simpleString())
            else F.col(f"`{f.name}`")
            for f in df.schema.fields
        )
    )


def to_sql_value(value: Any, simple: str, postgres: bool) -> Any:
    """One value of a column of Spark type ``simple`` as the driver takes it."""
    if value is None:
        return None
    if isinstance(value, bytearray):
        return bytes(value)
    if simple == "timestamp" and isinstance(value, dt.datetime) and value.tzinfo is None:
        value = value.astimezone(dt.UTC)  # PySpark hands local time without a zone
    if postgres:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value
