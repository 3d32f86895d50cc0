"""The SQL dead-letter table of an exactly-once database sink: list, show, redrive.

``--sink sqlite:///PATH`` or ``postgresql://...`` (the same URL as ``htmqc
run``, ``?table_prefix=`` included) names the database; entries are rows of
its ``<prefix>dead_letters`` table (:mod:`htmqc.dlq.table`), named by row id.

Redrive writes each selected row whose ``redriven_at`` is NULL back to its
original topic and partition (same key, value and headers, plus
``htmqc-redrive-of=<row id>``) with an idempotent producer, in chunks. Per
chunk, inside one database transaction that locks the rows (SQLite:
``BEGIN IMMEDIATE``, the file's write lock; PostgreSQL: ``SELECT ... FOR
UPDATE SKIP LOCKED``): select the rows, produce them, ``flush`` and check that
the broker acknowledged every one, set ``redriven_at`` of the acknowledged
rows, commit. Two redrives at once therefore never write the same row.

Crash window: the broker and the database cannot share a transaction. If the
process dies (or the database commit fails) after the broker acknowledged a
chunk and before the database committed its ``redriven_at``, those rows are
still unmarked and the next redrive writes them again, so their messages
appear twice in the topic (an at-least-once redrive for that chunk). The
window is the time of one ``UPDATE`` and ``COMMIT``; chunks keep it to at
most ``chunk`` rows. A record that the broker refused is not marked, and the
redrive stops with an error after marking the acknowledged ones.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from htmqc.dlq.entries import Selection, StoredDeadLetter
from htmqc.dlq.kafka_source import RedriveReport
from htmqc.dlq.record import DeadLetterInfo
from htmqc.dlq.table import COLUMNS, decode_headers, table_name
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_defaults import producer_config
from htmqc.sinks.urls import parse_sink_url


class SqlDlq:
    """The dead-letter table of the SQL sink ``url`` (see module docs)."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        parsed = parse_sink_url(url)
        if parsed.kind == "kafka":
            raise UsageError(
                "a kafka: sink keeps its dead letters on <topic>.dlq, not in a table",
                "use --bootstrap B --topic T instead of --sink",
            )
        self.kind = parsed.kind
        self.display = parsed.display
        self.table = table_name(parsed.table_prefix)
        self.timeout = timeout
        self.param = "%s" if self.kind == "postgresql" else "?"
        self.conn = self._connect(parsed.target)

    def _connect(self, target: str) -> Any:
        if self.kind == "sqlite":
            if not Path(target).is_file():
                raise UsageError(
                    f"SQLite sink {self.display} does not exist",
                    "pass the --sink URL the consumer ran with",
                )
            try:
                conn = sqlite3.connect(target, isolation_level=None, timeout=self.timeout)
                conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            except sqlite3.Error as exc:
                raise RuntimeFailure(
                    f"cannot open SQLite sink {self.display}: {exc}", "check the file"
                ) from None
            return conn
        import psycopg

        try:
            return psycopg.connect(target, autocommit=True, connect_timeout=int(self.timeout))
        except psycopg.Error:
            raise RuntimeFailure(
                f"cannot connect to PostgreSQL sink {self.display}",
                "check that the server runs and the URL is right",
            ) from None

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def _exists(self) -> bool:
        cur = self.conn.cursor()
        if self.kind == "sqlite":
            cur.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
            )
        else:
            cur.execute("SELECT to_regclass(%s)", (self.table,))
            row = cur.fetchone()
            return row is not None and row[0] is not None
        return cur.fetchone() is not None

    def _where(self, selection: Selection, *, pending: bool = False) -> tuple[str, list[Any]]:
        p = self.param
        clauses: list[str] = []
        args: list[Any] = []

        def add(sql: str, value: Any) -> None:
            clauses.append(sql)
            args.append(value)

        if pending or selection.pending:
            clauses.append("redriven_at IS NULL")
        if selection.topic is not None:
            add(f"topic = {p}", selection.topic)
        if selection.partition is not None:
            add(f'"partition" = {p}', selection.partition)
        if selection.offset_from is not None:
            add(f'"offset" >= {p}', selection.offset_from)
        if selection.offset_to is not None:
            add(f'"offset" <= {p}', selection.offset_to)
        if selection.kind is not None:
            add(f"kind = {p}", selection.kind)
        if selection.error_class is not None:
            clauses.append(f"(error_class = {p} OR error_class LIKE {p} ESCAPE '!')")
            wanted = selection.error_class
            escaped = wanted.replace("!", "!!").replace("%", "!%").replace("_", "!_")
            args += [wanted, f"%.{escaped}"]
        if selection.since is not None:
            add(f"last_failure_at >= {p}", selection.since)
        if selection.until is not None:
            add(f"last_failure_at <= {p}", selection.until)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args

    def _rows(self, sql: str, args: list[Any]) -> list[StoredDeadLetter]:
        cur = self.conn.cursor()
        try:
            cur.execute(sql, args)
            rows = cur.fetchall()
        except Exception as exc:
            raise RuntimeFailure(
                f"reading {self.table} in {self.display} failed: {type(exc).__name__}: {exc}",
                "check that htmqc run --mode exactly-once of this version wrote it",
            ) from None
        return [_entry(row) for row in rows]

    def entries(self, selection: Selection) -> Iterator[StoredDeadLetter]:
        """The rows that pass ``selection``, by id, at most ``selection.limit``
        (read in pages of 500 rows, so memory stays bounded)."""
        if not self._exists():
            return
        where, args = self._where(selection)
        left = selection.limit
        after = -1
        while left is None or left > 0:
            page = 500 if left is None else min(500, left)
            clause = f"{where} AND id > {self.param}" if where else f" WHERE id > {self.param}"
            sql = (
                f"SELECT {', '.join(COLUMNS)} FROM {self.table}{clause} ORDER BY id "
                f"LIMIT {int(page)}"
            )
            rows = self._rows(sql, [*args, after])
            yield from rows
            if len(rows) < page:
                return
            after = int(rows[-1].id)
            if left is not None:
                left -= len(rows)

    def get(self, ident: str) -> StoredDeadLetter:
        """The row ``ident`` (its id).

        :raises UsageError: not a row id, or no such row.
        """
        text = ident.strip()
        if not text.isdigit() or len(text) > 18:
            raise UsageError(f"DLQ entry id {ident!r} is not a row id", "use the id `list` shows")
        rows = []
        if self._exists():
            sql = f"SELECT {', '.join(COLUMNS)} FROM {self.table} WHERE id = {self.param}"
            rows = self._rows(sql, [int(text)])
        if not rows:
            raise UsageError(
                f"no dead letter with id {text} in {self.display}", "run `htmqc dlq list` for ids"
            )
        return rows[0]

    def redrive(
        self,
        selection: Selection,
        *,
        bootstrap: str,
        kafka_config: Mapping[str, Any] | None = None,
        chunk: int = 200,
        progress: Callable[[int], Any] | None = None,
        on_total: Callable[[int], None] | None = None,
    ) -> RedriveReport:
        """Write the selected rows not redriven yet back to their topics and set
        their ``redriven_at`` (see module docs for the crash window).

        :raises RuntimeFailure: the broker refused a record (acknowledged ones
            are marked first) or the database failed.
        """
        from confluent_kafka import KafkaException, Producer

        started = time.monotonic()
        report = RedriveReport()
        if not self._exists():
            return report
        where, args = self._where(selection, pending=True)
        if on_total is not None:
            cur = self.conn.cursor()
            cur.execute(f"SELECT COUNT(*) FROM {self.table}{where}", args)
            count = int(cur.fetchone()[0])
            on_total(min(count, selection.limit) if selection.limit is not None else count)
        try:
            producer = Producer(producer_config(bootstrap, kafka_config))
        except KafkaException as exc:
            raise UsageError(
                f"invalid Kafka setting: {exc}", "check the --kafka-config keys and values"
            ) from None
        try:
            while selection.limit is None or report.redriven < selection.limit:
                size = chunk
                if selection.limit is not None:
                    size = min(chunk, selection.limit - report.redriven)
                done = self._redrive_chunk(producer, where, args, size, report)
                if progress is not None and done:
                    progress(done)
                if done < size:
                    break
        finally:
            producer.flush(5)
        report.seconds = time.monotonic() - started
        return report

    def _redrive_chunk(
        self, producer: Any, where: str, args: list[Any], size: int, report: RedriveReport
    ) -> int:
        """One chunk in one database transaction; the number of rows redriven."""
        cur = self.conn.cursor()
        lock = " FOR UPDATE SKIP LOCKED" if self.kind == "postgresql" else ""
        cur.execute("BEGIN IMMEDIATE" if self.kind == "sqlite" else "BEGIN")
        try:
            cur.execute(
                f"SELECT {', '.join(COLUMNS)} FROM {self.table}{where} ORDER BY id "
                f"LIMIT {int(size)}{lock}",
                args,
            )
            entries = [_entry(row) for row in cur.fetchall()]
            acked, errors = _produce_all(producer, entries, self.timeout)
            if acked:
                now = time.time()
                p = self.param
                cur.executemany(
                    f"UPDATE {self.table} SET redriven_at = {p} WHERE id = {p} "
                    "AND redriven_at IS NULL",
                    [(now, int(e.id)) for e in acked],
                )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        report.redriven += len(acked)
        report.transactions += 1
        report.ids += [e.id for e in acked]
        if errors:
            raise RuntimeFailure(
                f"redrive stopped: the broker refused {len(errors)} records ({errors[0]}); "
                f"{report.redriven} redriven and marked",
                "check the target topics and the broker, then redrive again",
            )
        return len(acked)


def _produce_all(
    producer: Any, entries: list[StoredDeadLetter], timeout: float
) -> tuple[list[StoredDeadLetter], list[str]]:
    """Produce ``entries`` and wait for the broker: (acknowledged, errors)."""
    acked: list[StoredDeadLetter] = []
    errors: list[str] = []

    def report(entry: StoredDeadLetter) -> Callable[[Any, Any], None]:
        def done(err: Any, _msg: Any) -> None:
            if err is None:
                acked.append(entry)
            else:
                errors.append(f"{entry.topic}/{entry.partition}: {err.str()}")

        return done

    for entry in entries:
        producer.produce(
            entry.topic,
            value=entry.value,
            key=entry.key,
            partition=entry.partition,
            headers=entry.redrive_headers(),
            on_delivery=report(entry),
        )
    if producer.flush(timeout) and not errors:
        errors.append(f"no acknowledgement within {timeout:g} s")
    return acked, errors


def _entry(row: tuple[Any, ...]) -> StoredDeadLetter:
    (ident, topic, partition, offset, key, value, headers, kind, error_class, error_message,
     stack, retries, first, last, group, reason, source, written, redriven_at) = row  # fmt: skip
    return StoredDeadLetter(
        id=str(ident),
        topic=topic,
        partition=int(partition),
        offset=int(offset),
        key=None if key is None else bytes(key),
        value=None if value is None else bytes(value),
        headers=decode_headers(headers),
        info=DeadLetterInfo(
            kind=kind,
            error_class=error_class,
            error_message=error_message,
            stack=stack,
            retries=int(retries),
            first_failure_at=float(first),
            last_failure_at=float(last),
            group=group,
        ),
        reason=reason,
        source=source,
        dead_lettered_at=float(written),
        redriven=redriven_at is not None,
        redriven_at=None if redriven_at is None else float(redriven_at),
    )
