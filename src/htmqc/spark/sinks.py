"""Exactly-once ``foreachBatch`` sinks: a replayed micro-batch writes nothing twice,
and a batch record is never silently shared by two queries.

Spark replays a micro-batch after a failure with the same batch id and the
same rows (the source's offsets for that id are in the checkpoint). So each
sink records the last batch id it stored, and skips a batch id at or below it.
That record is *bound to the query* that wrote it: Spark's query id (kept in
the checkpoint, so it survives restarts) and the checkpoint's path. A query
with another id - a fresh checkpoint reusing a sink name or directory - fails
its first batch with one line naming both queries, instead of having its
batches 0, 1, 2 ... skipped as "already stored"; ``adopt=True``
(:class:`SqlBatchSink`) lets it take the record over and start its own batch
ids.

* :class:`SqlBatchSink` (SQLite, or PostgreSQL through psycopg). The rows never
  pass through the driver: each Spark task writes its rows to a staging table
  (``COPY`` for PostgreSQL), tagged with the batch attempt's token and the
  task's partition, in one transaction that first deletes that partition's
  rows of the same attempt (a retried task replaces, never adds). Then the
  driver, in *one* transaction, checks and advances the batch record in
  ``htmqc_spark_batches`` and moves the attempt's rows from staging into the
  table (``INSERT ... SELECT``, in Kafka order), or upserts them on the user's
  ``keys`` (the last row of a key in the batch wins). A crash anywhere leaves
  the table and the record unchanged; staging rows of dead attempts are
  deleted at the next batch. Column types: :mod:`htmqc.spark.sql_types`; a
  PostgreSQL table the sink creates gets a ``_htmqc_seq`` identity column
  (storage order, for ``htmqc audit``).
* :class:`ParquetBatchSink` writes each batch to ``DIR/batch=<id>`` through a
  temporary directory renamed into place (atomic on one filesystem); an
  existing ``batch=<id>`` means the batch is stored. ``DIR/_htmqc_query.json``
  binds the directory to its query; temporary directories a killed batch left
  are removed before the next batch writes. ``adopt=True`` stores a new
  query's batches after the ones already there (``batch=<base + n>``).

``query.stop()`` during a batch's Spark job: both sinks raise the interruption
as :class:`BatchInterrupted`, which Spark takes for a stop (PySpark's own error
made Spark's stream thread die of a ``StackOverflowError``); :func:`stoppable`
does the same for a ``foreachBatch`` function of your own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from htmqc.errors import UsageError
from htmqc.spark.sql_types import prepare, sql_type, to_sql_value

BATCHES_TABLE = "htmqc_spark_batches"
SEQ_COLUMN = "_htmqc_seq"
_TOKEN, _QUERY, _PART, _ROW = "_htmqc_token", "_htmqc_query", "_htmqc_part", "_htmqc_row"
_BINDING_FILE = "_htmqc_query.json"
log = logging.getLogger("htmqc.spark.sinks")


@dataclass(frozen=True)
class QueryIdentity:
    """Who writes a batch: Spark's query id and checkpoint (``direct`` outside a query)."""

    query_id: str
    checkpoint: str

    def describe(self) -> str:
        return f"query {self.query_id} (checkpoint {self.checkpoint or 'unknown'})"


DIRECT = QueryIdentity("direct", "")
"""A sink called by hand, not by a streaming query."""


def query_identity(df: Any) -> QueryIdentity:
    """The streaming query running this ``foreachBatch`` call (Spark's local
    property ``sql.streaming.queryId`` is set on the query's thread)."""
    from pyspark.sql import SparkSession

    session = df.sparkSession
    query_id = session.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        return DIRECT
    checkpoint = ""
    main = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    for query in main.streams.active:  # foreachBatch's session is a clone
        if query.id == query_id:
            try:
                checkpoint = str(query._jsq.streamingQuery().resolvedCheckpointRoot())
            except Exception:  # Spark Connect or an internal change: the id suffices
                checkpoint = ""
    return QueryIdentity(query_id, checkpoint)


class BindingError(RuntimeError):
    """A batch record written by another query (a fresh checkpoint, or another query)."""

    def __init__(self, where: str, owner: QueryIdentity, me: QueryIdentity, fix: str) -> None:
        super().__init__(
            f"{where} holds the batches of {owner.describe()}, not of this "
            f"{me.describe()}: its batch ids would be skipped as stored; {fix}"
        )


_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)
_SPARK_PROXY_ERROR = "py4j.protocol.Py4JJavaError: An error occurred while calling"


class BatchInterrupted(RuntimeError):
    """A batch's Spark job was interrupted or cancelled: the query is stopping.

    ``query.stop()`` interrupts the job a ``foreachBatch`` function is waiting
    for, and PySpark raises a ``Py4JJavaError`` whose text holds the JVM's
    stack trace (about 6 KB). Spark then decides whether the query failed or
    was stopped by matching the Python traceback against a regular expression
    (``StreamExecution.PROXY_ERROR``, ``...((.|\\r\\n|\\r|\\n)*)(...Interrupted...)``)
    that recurses once per character: over that traceback it overflows the
    stream thread's stack, which dies with a ``StackOverflowError`` from
    ``java.util.regex`` (issue 21). This exception's message is one line that
    ends the way that expression wants, so Spark sees a stop, in a few frames.
    Nothing of the batch is stored; a restart replays it.
    """

    def __init__(self, batch_id: int, java: str) -> None:
        super().__init__(
            f"htmqc: batch {batch_id} stopped: its Spark job was interrupted ({java[:120]}); "
            f"{_SPARK_PROXY_ERROR} the batch: java.lang.InterruptedException"
        )


def _interruption(exc: BaseException) -> str | None:
    """The Java exception's first line if ``exc`` is a ``Py4JJavaError`` for an
    interrupted or cancelled job, else ``None``."""
    if type(exc).__name__ != "Py4JJavaError":
        return None
    text = str(exc)
    head = text.split("\n", 2)[1].lstrip(": ") if text.count("\n") >= 1 else text
    if head.startswith(_INTERRUPTIONS) or (
        head.startswith("org.apache.spark.SparkException") and "cancelled" in head
    ):
        return head
    return None


@contextmanager
def interruption_as_stop(batch_id: int) -> Iterator[None]:
    """Around a ``foreachBatch`` function's Spark actions: an interrupted or
    cancelled job is raised as :class:`BatchInterrupted` (see there), any other
    error as it is."""
    try:
        yield
    except Exception as exc:
        java = _interruption(exc)
        if java is None:
            raise
        raise BatchInterrupted(batch_id, java) from None


def stoppable(func: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    """Wrap a ``foreachBatch`` function of your own (one that runs Spark jobs)
    so that ``query.stop()`` during one of its jobs stops the query cleanly,
    without Spark's ``StackOverflowError`` (:class:`BatchInterrupted`). The
    sinks here do this themselves."""

    @functools.wraps(func)
    def wrapped(df: Any, batch_id: int) -> None:
        with interruption_as_stop(batch_id):
            func(df, batch_id)

    return wrapped


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqlBatchSink:
    """``foreachBatch`` callable storing each batch once into ``table``.

    ``target``: a SQLite file path, or a ``postgresql://`` URL. ``query`` names
    the batch record (one per streaming query). ``mode``: ``append`` (insert
    every row) or ``upsert`` (insert or update on ``keys``; the table gets a
    primary key on them when the sink creates it, or needs a unique index).
    ``adopt``: take over a batch record another query wrote (see module docs).
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        table: str,
        query: str,
        *,
        mode: Literal["append", "upsert"] = "append",
        keys: Sequence[str] = (),
        adopt: bool = False,
    ) -> None:
        if mode not in ("append", "upsert"):
            raise UsageError(f"SqlBatchSink mode {mode!r} is unknown", "use append or upsert")
        if (mode == "upsert") != bool(keys):
            raise UsageError(
                "SqlBatchSink: upsert needs keys, and only upsert takes keys",
                "pass mode='upsert', keys=('id',) or neither",
            )
        self.target = str(target)
        self.table = table
        self.query = query
        self.mode = mode
        self.keys = tuple(keys)
        self.adopt = adopt
        self.postgres = self.target.startswith(("postgresql://", "postgres://"))

    # -- connections and the batch record -------------------------------------------------

    def _connect(self) -> Any:
        return _connect(self.target, self.postgres)

    def _p(self) -> str:
        return "%s" if self.postgres else "?"

    def _ensure_batches(self, cur: Any) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (query TEXT PRIMARY KEY, "
            "batch_id BIGINT NOT NULL, query_id TEXT, checkpoint TEXT)"
        )
        have = _columns(cur, BATCHES_TABLE, self.postgres)
        for column in ("query_id", "checkpoint"):  # records of the first htmqc-spark
            if column not in have:
                cur.execute(f"ALTER TABLE {BATCHES_TABLE} ADD COLUMN {column} TEXT")

    def _record(self, cur: Any, lock: bool = False) -> tuple[int, QueryIdentity] | None:
        p = self._p()
        cur.execute(
            f"SELECT batch_id, query_id, checkpoint FROM {BATCHES_TABLE} WHERE query = {p}"
            + (" FOR UPDATE" if lock and self.postgres else ""),
            (self.query,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return int(row[0]), QueryIdentity(row[1] or "unknown", row[2] or "")

    def last_batch(self) -> int | None:
        """The highest batch id stored under this sink's ``query`` name, or ``None``."""
        conn = self._connect()
        try:
            cur = conn.cursor()
            self._ensure_batches(cur)
            record = self._record(cur)
            conn.commit()
            return None if record is None or record[0] < 0 else record[0]
        finally:
            conn.close()

    def _decide(
        self, record: tuple[int, QueryIdentity] | None, me: QueryIdentity, batch: int
    ) -> str:
        """``write``, ``skip`` (stored), or ``adopt`` (write, taking the record over)."""
        if record is None:
            return "write"
        last, owner = record
        if owner.query_id != me.query_id:
            if not self.adopt:
                raise BindingError(
                    f"batch record {self.query!r} in {BATCHES_TABLE} ({self._where()})",
                    owner,
                    me,
                    "use a new sink query name, restart from that checkpoint, "
                    "or pass adopt=True to take the record over",
                )
            return "adopt"
        return "skip" if batch <= last else "write"

    def _where(self) -> str:
        return "PostgreSQL" if self.postgres else self.target

    # -- tables ----------------------------------------------------------------------------

    def _columns_sql(self, df: Any) -> list[tuple[str, str, str]]:
        """(name, Spark type, SQL type) per column."""
        return [
            (
                f.name,
                f.dataType.simpleString(),
                sql_type(f.name, f.dataType.simpleString(), self.postgres),
            )
            for f in df.schema.fields
        ]

    def _ensure_tables(self, cur: Any, columns: list[tuple[str, str, str]]) -> str:
        """Create the table (if missing) and this column set's staging table; its name."""
        defs = [f"{_quote(n)} {t}" for n, _, t in columns]
        extra = [f"{SEQ_COLUMN} BIGINT GENERATED BY DEFAULT AS IDENTITY"] if self.postgres else []
        key = [f"PRIMARY KEY ({', '.join(_quote(k) for k in self.keys)})"] if self.keys else []
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {_quote(self.table)} ({', '.join(defs + extra + key)})"
        )
        if self.keys:
            name = _quote(f"{self.table}_htmqc_keys")
            keys = ", ".join(_quote(k) for k in self.keys)
            cur.execute(
                f"CREATE UNIQUE INDEX IF NOT EXISTS {name} ON {_quote(self.table)} ({keys})"
            )
        digest = hashlib.sha1(repr(columns).encode()).hexdigest()[:10]
        stage = f"htmqc_stage_{digest}"
        meta = [
            f"{_TOKEN} TEXT NOT NULL",
            f"{_QUERY} TEXT NOT NULL",
            f"{_PART} INTEGER NOT NULL",
            f"{_ROW} BIGINT NOT NULL",
        ]
        cur.execute(f"CREATE TABLE IF NOT EXISTS {stage} ({', '.join(defs + meta)})")
        return stage

    def _move(self, cur: Any, stage: str, names: list[str], token: str) -> None:
        cols = ", ".join(_quote(n) for n in names)
        p = self._p()
        if self.mode == "append":
            cur.execute(
                f"INSERT INTO {_quote(self.table)} ({cols}) SELECT {cols} FROM {stage} "
                f"WHERE {_TOKEN} = {p} ORDER BY {_PART}, {_ROW}",
                (token,),
            )
            return
        keys = ", ".join(_quote(k) for k in self.keys)
        rest = [n for n in names if n not in self.keys]
        action = (
            "DO UPDATE SET " + ", ".join(f"{_quote(n)} = excluded.{_quote(n)}" for n in rest)
            if rest
            else "DO NOTHING"
        )
        cur.execute(
            f"INSERT INTO {_quote(self.table)} ({cols}) SELECT {cols} FROM ("
            f"SELECT {cols}, {_PART}, {_ROW}, ROW_NUMBER() OVER (PARTITION BY {keys} "
            f"ORDER BY {_PART} DESC, {_ROW} DESC) AS _htmqc_last FROM {stage} "
            f"WHERE {_TOKEN} = {p}) AS s WHERE _htmqc_last = 1 ORDER BY {_PART}, {_ROW} "
            f"ON CONFLICT ({keys}) {action}",
            (token,),
        )

    # -- one batch -----------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Store ``df`` as batch ``batch_id`` unless it is already stored."""
        me = query_identity(df)
        columns = self._columns_sql(df)  # before prepare(): JSON columns keep their type
        df = prepare(df)
        missing = [k for k in self.keys if k not in {n for n, _, _ in columns}]
        if missing:
            raise UsageError(f"SqlBatchSink: upsert keys {missing} are not columns", "fix keys")
        with _transaction(self.target, self.postgres) as cur:
            self._ensure_batches(cur)
            if self._decide(self._record(cur), me, batch_id) == "skip":
                return
            stage = self._ensure_tables(cur, columns)
            p = self._p()
            cur.execute(f"DELETE FROM {stage} WHERE {_QUERY} = {p}", (self.query,))  # dead attempts
        token = uuid.uuid4().hex
        writer = _StageWriter(self.target, self.postgres, stage, columns, token, self.query)
        try:
            with interruption_as_stop(batch_id):
                df.foreachPartition(writer)
            self._finish(batch_id, me, stage, [n for n, _, _ in columns], token)
        finally:
            writer.discard()

    def _finish(
        self, batch_id: int, me: QueryIdentity, stage: str, names: list[str], token: str
    ) -> None:
        """The batch's one transaction: record and rows, or neither."""
        p = self._p()
        with _transaction(self.target, self.postgres) as cur:
            if self.postgres:  # serialize writers of this record on its row
                cur.execute(
                    f"INSERT INTO {BATCHES_TABLE} (query, batch_id, query_id, checkpoint) "
                    "VALUES (%s, -1, %s, %s) ON CONFLICT DO NOTHING",
                    (self.query, me.query_id, me.checkpoint),
                )
            record = self._record(cur, lock=True)
            decision = self._decide(record, me, batch_id)
            if decision == "skip":  # another attempt of this batch got here first
                return
            if decision == "adopt" and record is not None:
                log.warning(
                    "SqlBatchSink: %s adopts batch record %r (at batch %d) from %s",
                    me.describe(), self.query, record[0], record[1].describe(),
                )  # fmt: skip
            self._move(cur, stage, names, token)
            cur.execute(
                f"INSERT INTO {BATCHES_TABLE} (query, batch_id, query_id, checkpoint) "
                f"VALUES ({p}, {p}, {p}, {p}) ON CONFLICT (query) DO UPDATE SET "
                "batch_id = excluded.batch_id, query_id = excluded.query_id, "
                "checkpoint = excluded.checkpoint",
                (self.query, batch_id, me.query_id, me.checkpoint),
            )
            cur.execute(f"DELETE FROM {stage} WHERE {_TOKEN} = {p}", (token,))


@contextmanager
def _transaction(target: str, postgres: bool) -> Iterator[Any]:
    """A cursor in one transaction: committed when the block ends (also by
    ``return``), rolled back when it raises."""
    conn = _connect(target, postgres)
    try:
        cur = conn.cursor()
        if not postgres:
            cur.execute("BEGIN IMMEDIATE")
        yield cur
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def _connect(target: str, postgres: bool) -> Any:
    if postgres:
        import psycopg

        return psycopg.connect(target, autocommit=False)
    conn = sqlite3.connect(target, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    return _SqliteTx(conn)


class _SqliteTx:
    """sqlite3 in autocommit mode with explicit ``BEGIN IMMEDIATE`` (a write lock
    from the start), behind psycopg's commit/rollback/cursor names."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def cursor(self) -> sqlite3.Cursor:
        return self.conn.cursor()

    def commit(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.rollback()
        self.conn.close()


def _columns(cur: Any, table: str, postgres: bool) -> set[str]:
    if postgres:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
        )
        return {row[0] for row in cur.fetchall()}
    cur.execute(f"PRAGMA table_info({table})")
    return {row[1] for row in cur.fetchall()}


class _StageWriter:
    """Runs in the executors (``foreachPartition``): one task's rows into staging."""

    def __init__(
        self,
        target: str,
        postgres: bool,
        stage: str,
        columns: list[tuple[str, str, str]],
        token: str,
        query: str,
    ) -> None:
        self.target, self.postgres, self.stage = target, postgres, stage
        self.columns, self.token, self.query = columns, token, query

    def __call__(self, rows: Iterator[Any]) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        names = [n for n, _, _ in self.columns] + [_TOKEN, _QUERY, _PART, _ROW]
        cols = ", ".join(_quote(n) for n in names)
        kinds = [s for _, s, _ in self.columns]
        tail = (self.token, self.query, part)

        def values() -> Iterator[tuple[Any, ...]]:
            for index, row in enumerate(rows):
                plain = (to_sql_value(v, k, self.postgres) for v, k in zip(row, kinds, strict=True))
                yield (*plain, *tail, index)

        with _transaction(self.target, self.postgres) as cur:
            p = "%s" if self.postgres else "?"
            cur.execute(
                f"DELETE FROM {self.stage} WHERE {_TOKEN} = {p} AND {_PART} = {p}",
                (self.token, part),
            )
            if self.postgres:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self.token}/{part}",))
                with cur.copy(f"COPY {self.stage} ({cols}) FROM STDIN") as copy:
                    for value in values():
                        copy.write_row(value)
            else:
                marks = ", ".join(["?"] * len(names))
                cur.executemany(f"INSERT INTO {self.stage} ({cols}) VALUES ({marks})", values())

    def discard(self) -> None:
        """Delete this attempt's staging rows (best effort; the next batch does it too)."""
        try:
            conn = _connect(self.target, self.postgres)
        except Exception:
            return
        try:
            cur = conn.cursor()
            p = "%s" if self.postgres else "?"
            cur.execute(f"DELETE FROM {self.stage} WHERE {_TOKEN} = {p}", (self.token,))
            conn.commit()
        except Exception:
            conn.rollback()
        finally:
            conn.close()


class ParquetBatchSink:
    """``foreachBatch`` callable writing batch ``n`` to ``directory/batch=n`` once.

    ``adopt``: take over a directory another query wrote (a fresh checkpoint on
    a used directory). Its batches are then stored after the ones already there,
    as ``batch=<base + n>`` with ``base`` one past the highest stored batch, so
    nothing of the old query is overwritten or skipped and ``batch`` order stays
    storage order (the audit's order). ``base`` is kept in the binding file, so
    the adopting query's replays land on the same directories.
    """

    def __init__(self, directory: str | os.PathLike[str], *, adopt: bool = False) -> None:
        self.directory = Path(directory)
        self.adopt = adopt

    def batch_dir(self, batch_id: int, base: int = 0) -> Path:
        """Where batch ``batch_id`` of a query bound with ``base`` is stored."""
        return self.directory / f"batch={base + batch_id}"

    def _stored(self) -> list[int]:
        """The batch numbers of the ``batch=N`` directories there now."""
        out = []
        for path in self.directory.glob("batch=*"):
            number = path.name.removeprefix("batch=")
            if number.isdigit():
                out.append(int(number))
        return out

    def _bind(self, me: QueryIdentity) -> int:
        """Claim the directory for ``me`` (or fail if another query holds it and
        ``adopt`` is off); the base added to ``me``'s batch ids."""
        binding = self.directory / _BINDING_FILE
        owner: QueryIdentity | None = None
        base = 0
        previous: dict[str, Any] = {}
        if binding.exists():
            previous = json.loads(binding.read_text())
            owner = QueryIdentity(
                previous.get("query_id", "unknown"), previous.get("checkpoint", "")
            )
            base = int(previous.get("base", 0))
        elif self._stored():
            owner = QueryIdentity("unknown", "")  # written before batches were bound
        if owner is not None and owner.query_id == me.query_id:
            return base
        if owner is not None:
            if not self.adopt:
                raise BindingError(
                    f"Parquet directory {self.directory}",
                    owner,
                    me,
                    "write to a new directory, restart from that checkpoint, "
                    "or pass adopt=True to store this query's batches after its batches",
                )
            base = max(self._stored(), default=-1) + 1
            log.warning(
                "ParquetBatchSink: %s adopts %s from %s; its batch 0 is batch=%d",
                me.describe(), self.directory, owner.describe(), base,
            )  # fmt: skip
        record = {"query_id": me.query_id, "checkpoint": me.checkpoint, "base": base}
        if owner is not None:
            record["adopted_from"] = {"query_id": owner.query_id, "checkpoint": owner.checkpoint}
        temp = binding.with_name(f"{_BINDING_FILE}.{uuid.uuid4().hex}")
        temp.write_text(json.dumps(record))
        os.rename(temp, binding)  # atomic: a crash leaves the old binding or the new one
        return base

    def __call__(self, df: Any, batch_id: int) -> None:
        """Store ``df`` as batch ``batch_id`` unless it is already stored."""
        me = query_identity(df)
        self.directory.mkdir(parents=True, exist_ok=True)
        base = self._bind(me)
        for stale in self.directory.glob("_tmp-batch=*"):  # a killed batch's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        for stale in self.directory.glob(f"{_BINDING_FILE}.*"):
            stale.unlink(missing_ok=True)
        final = self.batch_dir(batch_id, base)
        if final.exists():
            return  # stored by an earlier attempt of this batch
        temp = self.directory / f"_tmp-batch={base + batch_id}-{uuid.uuid4().hex}"
        try:
            with interruption_as_stop(batch_id):
                df.write.parquet(str(temp))
            os.rename(temp, final)  # atomic; fails if another attempt got there first
        except OSError:
            if not final.exists():
                raise
        finally:
            shutil.rmtree(temp, ignore_errors=True)
