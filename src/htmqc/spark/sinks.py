"""Exactly-once ``foreachBatch`` sinks: a replayed micro-batch writes nothing twice.

Spark replays a micro-batch after a failure with the same batch id and the
same rows (the source's offsets for that id are in the checkpoint). So:

* :class:`SqlBatchSink` (SQLite, or PostgreSQL through psycopg) inserts the
  batch's rows and records ``(query, batch id)`` in ``htmqc_spark_batches`` in
  the *same* transaction; a batch id at or below the recorded one is skipped.
  ``query`` must name the streaming query stably (one per checkpoint).
* :class:`ParquetBatchSink` writes each batch to ``DIR/batch=<id>`` through a
  temporary directory renamed into place (atomic on one local filesystem);
  an existing ``batch=<id>`` means the batch is already stored.

Rows are the batch DataFrame's columns, by name; the SQL table must exist or
is created with the DataFrame's column names (typed by SQLite's affinity, or
BYTEA/BIGINT/TEXT/TIMESTAMPTZ for PostgreSQL).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

BATCHES_TABLE = "htmqc_spark_batches"
_PG_TYPES = {"binary": "BYTEA", "int": "BIGINT", "bigint": "BIGINT", "timestamp": "TIMESTAMPTZ"}


class SqlBatchSink:
    """``foreachBatch`` callable storing each batch once into ``table``.

    ``target``: a SQLite file path, or a ``postgresql://`` URL.
    """

    def __init__(self, target: str | os.PathLike[str], table: str, query: str) -> None:
        self.target = str(target)
        self.table = table
        self.query = query
        self.postgres = self.target.startswith(("postgresql://", "postgres://"))

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg

            return psycopg.connect(self.target, autocommit=False)
        conn = sqlite3.connect(self.target, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def last_batch(self) -> int | None:
        """The highest batch id stored for this query, or ``None``."""
        conn = self._connect()
        try:
            self._ensure_batches(conn.cursor())
            return self._last(conn.cursor())
        finally:
            conn.commit() if self.postgres else None
            conn.close()

    def _ensure_batches(self, cur: Any) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} "
            "(query TEXT PRIMARY KEY, batch_id BIGINT NOT NULL)"
        )

    def _last(self, cur: Any) -> int | None:
        p = "%s" if self.postgres else "?"
        cur.execute(f"SELECT batch_id FROM {BATCHES_TABLE} WHERE query = {p}", (self.query,))
        row = cur.fetchone()
        return None if row is None else int(row[0])

    def _ensure_table(self, cur: Any, df: Any) -> None:
        if self.postgres:
            cols = ", ".join(
                f'"{f.name}" {_PG_TYPES.get(f.dataType.simpleString(), "TEXT")}'
                for f in df.schema.fields
            )
        else:
            cols = ", ".join(f'"{name}"' for name in df.columns)
        cur.execute(f'CREATE TABLE IF NOT EXISTS "{self.table}" ({cols})')

    def __call__(self, df: Any, batch_id: int) -> None:
        """Store ``df`` as batch ``batch_id`` unless it is already stored."""
        conn = self._connect()
        p = "%s" if self.postgres else "?"
        try:
            cur = conn.cursor()
            if not self.postgres:
                cur.execute("BEGIN IMMEDIATE")
            self._ensure_batches(cur)
            if self.postgres:  # serialize writers of this query on its row
                cur.execute(
                    f"INSERT INTO {BATCHES_TABLE} VALUES (%s, -1) ON CONFLICT DO NOTHING",
                    (self.query,),
                )
                cur.execute(
                    f"SELECT batch_id FROM {BATCHES_TABLE} WHERE query = %s FOR UPDATE",
                    (self.query,),
                )
            last = self._last(cur)
            if last is not None and batch_id <= last:
                conn.rollback() if self.postgres else cur.execute("ROLLBACK")
                return
            self._ensure_table(cur, df)
            names = ", ".join(f'"{n}"' for n in df.columns)
            marks = ", ".join([p] * len(df.columns))
            insert = f'INSERT INTO "{self.table}" ({names}) VALUES ({marks})'
            chunk: list[tuple[Any, ...]] = []
            for row in df.toLocalIterator():
                chunk.append(tuple(_plain(v) for v in row))
                if len(chunk) >= 5000:
                    cur.executemany(insert, chunk)
                    chunk = []
            if chunk:
                cur.executemany(insert, chunk)
            cur.execute(
                f"INSERT INTO {BATCHES_TABLE} (query, batch_id) VALUES ({p}, {p}) "
                "ON CONFLICT (query) DO UPDATE SET batch_id = excluded.batch_id",
                (self.query, batch_id),
            )
            conn.commit() if self.postgres else cur.execute("COMMIT")
        except BaseException:
            if self.postgres:
                conn.rollback()
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()


def _plain(value: Any) -> Any:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):  # headers: keep them readable in one column
        return repr([tuple(v) for v in value])
    return value


class ParquetBatchSink:
    """``foreachBatch`` callable writing batch ``n`` to ``directory/batch=n`` once."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def batch_dir(self, batch_id: int) -> Path:
        return self.directory / f"batch={batch_id}"

    def __call__(self, df: Any, batch_id: int) -> None:
        final = self.batch_dir(batch_id)
        if final.exists():
            return  # stored by an earlier attempt of this batch
        self.directory.mkdir(parents=True, exist_ok=True)
        temp = self.directory / f"_tmp-batch={batch_id}-{uuid.uuid4().hex}"
        try:
            df.write.parquet(str(temp))
            os.rename(temp, final)  # atomic; fails if another attempt got there first
        except OSError:
            if not final.exists():
                raise
        finally:
            shutil.rmtree(temp, ignore_errors=True)
