"""The PostgreSQL sink (psycopg 3): effects and positions in one database.

Concurrency: ``commit`` locks each position row with ``SELECT ... FOR UPDATE``
before comparing its fence; ``claim`` bumps the fence with an ``UPDATE``, which
takes the same row lock. So a claim and a commit on one partition serialize:
either the commit runs first and the claim returns the new position, or the
claim runs first and the commit sees the new fence and is rolled back
(:class:`~htmqc.sinks.base.Fenced`). Under READ COMMITTED a locking read returns
the latest committed row, so the fence compared is never a stale snapshot.
Table creation takes a transaction-scoped advisory lock, so members starting
together do not race ``CREATE TABLE IF NOT EXISTS``.

Async handlers: when the runtime runs an ``async def`` handler it calls
:meth:`PostgresSink.serve_async_handler` with the shared handler loop before the
first claim. From then on (and after every reconnect) the sink's one connection
is a ``psycopg.AsyncConnection`` opened on that loop, the handler's ``tx`` is
one of its ``psycopg.AsyncCursor`` objects, and the sink's own statements
(savepoints, fences, positions, dead letters) run on the same connection through
:mod:`htmqc.sinks.loop_bridge`. Same transaction, same SQL, same exactly-once
contract as the synchronous connection; a ``def`` handler keeps that one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from htmqc.sinks.base import SinkUnavailable, check_no_transaction
from htmqc.sinks.loop_bridge import BridgedConnection
from htmqc.sinks.sql import SqlSink
from htmqc.sinks.urls import DEFAULT_TABLE_PREFIX, redact_url


class PostgresSink(SqlSink):
    """Exactly-once into PostgreSQL at ``conninfo`` (a ``postgresql://`` URL);
    the handler gets a ``psycopg.Cursor`` of the open transaction, or a
    ``psycopg.AsyncCursor`` when it is ``async def`` (module docs)."""

    name = "postgresql"
    param = "%s"
    now_sql = "now()"
    lock_suffix = " FOR UPDATE"
    db_error = psycopg.Error

    def __init__(
        self,
        conninfo: str,
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        connect_timeout: int = 10,
        display: str | None = None,
    ) -> None:
        super().__init__(display or redact_url(conninfo), table_prefix)
        self._conninfo = conninfo
        self.connect_timeout = connect_timeout
        #: The handler loop the connection lives on (``None``: a synchronous one).
        self.loop: asyncio.AbstractEventLoop | None = None

    def serve_async_handler(self, loop: asyncio.AbstractEventLoop) -> bool:
        """From now on connect with ``psycopg.AsyncConnection`` on ``loop`` and
        give the handler an ``AsyncCursor`` (module docs); an open synchronous
        connection is replaced at once. Returns ``True``.

        :raises SinkStateError: a transaction is open.
        :raises SinkUnavailable: the database cannot be reached."""
        check_no_transaction(self.name, "serve_async_handler", self._txn)
        self.loop = loop
        if self._conn is not None and not isinstance(self._conn, BridgedConnection):
            self.reconnect()
        return True

    def handler_cursor(self, conn: Any) -> Any:
        """A ``psycopg.AsyncCursor`` on the async connection, else a ``psycopg.Cursor``."""
        if isinstance(conn, BridgedConnection):
            return conn.async_cursor()
        return conn.cursor()

    def connect(self) -> Any:
        """Connect in autocommit mode (on :attr:`loop` with an
        ``AsyncConnection`` when set); failures name the redacted URL."""
        extra: dict[str, Any] = {}
        if "connect_timeout" not in self._conninfo:
            extra["connect_timeout"] = self.connect_timeout
        try:
            if self.loop is not None:
                return BridgedConnection.connect(self.loop, self._conninfo, **extra)
            return psycopg.connect(self._conninfo, autocommit=True, **extra)
        except psycopg.Error as exc:
            lines = str(exc).strip().splitlines()
            detail = redact_url(lines[-1] if lines else type(exc).__name__)
            password = _password_of(self._conninfo)
            if password:
                detail = detail.replace(password, "***")
            raise SinkUnavailable(
                f"cannot connect to PostgreSQL sink {self.display}: {detail.strip()}",
                "check that the server runs (pg_ctlcluster VERSION main start) and that "
                "the URL's host, port, user, password and database are right",
            ) from None

    def unavailable(self, exc: BaseException) -> bool:
        """psycopg's ``OperationalError`` family: the connection was lost or
        closed, the backend was terminated (``AdminShutdown``), a lock or
        statement timed out; ``InterfaceError``: the connection is unusable."""
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))

    def create_tables(self, cur: Any) -> None:
        """Create the positions table under an advisory lock."""
        cur.execute("BEGIN")
        try:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.positions_table,))
            cur.execute(
                f'CREATE TABLE IF NOT EXISTS "{self.positions_table}" ('
                "consumer_group TEXT NOT NULL, topic TEXT NOT NULL, "
                '"partition" INTEGER NOT NULL, committed BIGINT NOT NULL, '
                "finished_above TEXT NOT NULL DEFAULT '', fence BIGINT NOT NULL DEFAULT 0, "
                "updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                'PRIMARY KEY (consumer_group, topic, "partition"))'
            )
            cur.execute("COMMIT")
        except BaseException:
            self.rollback_quietly(cur)
            raise


def _password_of(conninfo: str) -> str:
    """The password in a ``postgresql://user:password@host`` URL, if any."""
    try:
        return str(psycopg.conninfo.conninfo_to_dict(conninfo).get("password") or "")
    except psycopg.Error:
        return ""
