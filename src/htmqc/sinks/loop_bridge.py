"""A synchronous DB-API face for a ``psycopg.AsyncConnection`` that lives on
the shared handler event loop (:class:`~htmqc.runtime.handlers.EventLoopThread`).

Theory of operation
-------------------
With an ``async def`` handler and the PostgreSQL sink, the sink's one
connection is a ``psycopg.AsyncConnection`` opened on the handler loop, so the
handler's ``tx`` can be its ``psycopg.AsyncCursor`` (``await tx.execute(...)``)
inside the very transaction that stores the positions and checks the fences.
The sink's own SQL (:mod:`htmqc.sinks.sql`: claim, savepoints, fenced commit)
stays the one synchronous code path: :class:`BridgedConnection` and
:class:`BridgedCursor` give it ``cursor()``, ``execute``, ``fetchone``,
``fetchall``, ``rowcount`` and ``close``, each running the async call on the
loop with :func:`asyncio.run_coroutine_threadsafe` and waiting for its result.

Contract:

* Called from any thread but the loop's own (the transaction worker, the poll
  thread); a call on the loop's thread would wait for itself and is refused
  with ``RuntimeError``.
* The handler's coroutine and the sink's calls never overlap: the transaction
  worker runs one at a time and waits for each (the handler's call too).
* Driver errors come through unchanged (``psycopg.Error`` subclasses), so the
  sink classifies them as it does the synchronous driver's. A loop that is no
  longer running (the runtime is shutting down) raises
  ``psycopg.InterfaceError`` instead of waiting forever: the sink treats that as
  an unusable connection (``close`` ignores it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

#: How often a waiting call checks that the loop still runs, in seconds.
_POLL_SECONDS = 0.5


class LoopCaller:
    """Runs coroutines on ``loop`` from other threads and waits for them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result (its exception is raised).

        :raises RuntimeError: called on the loop's own thread.
        :raises psycopg.InterfaceError: the loop is not running (anymore)."""
        if self._on_loop_thread():
            coro.close()
            raise RuntimeError(
                "a synchronous sink call on the handler event loop's thread would deadlock"
            )
        if self.loop.is_closed() or not self.loop.is_running():
            coro.close()
            raise psycopg.InterfaceError("the handler event loop is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return future.result(timeout=_POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                if not self.loop.is_running():
                    future.cancel()
                    raise psycopg.InterfaceError(
                        "the handler event loop stopped during a database call"
                    ) from None

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


class BridgedCursor:
    """The synchronous cursor the sink's own SQL uses (module docs)."""

    def __init__(self, caller: LoopCaller, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._caller = caller
        self._cursor = cursor

    def execute(self, query: Any, params: Any = None) -> BridgedCursor:
        """Run one statement (``await cursor.execute``); returns this cursor."""
        self._caller.call(self._cursor.execute(query, params))
        return self

    def executemany(self, query: Any, params_seq: Any) -> None:
        """Run one statement per parameter set (``await cursor.executemany``)."""
        self._caller.call(self._cursor.executemany(query, params_seq))

    def fetchone(self) -> Any:
        """The next row of the last query, or ``None``."""
        return self._caller.call(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        """The remaining rows of the last query."""
        return self._caller.call(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed or returned."""
        return self._cursor.rowcount


class BridgedConnection:
    """A ``psycopg.AsyncConnection`` in autocommit mode on the handler loop,
    with the synchronous ``cursor()``/``close()`` the sink uses (module docs);
    :meth:`async_cursor` is the handler's ``tx``."""

    def __init__(self, caller: LoopCaller, conn: psycopg.AsyncConnection[Any]) -> None:
        self.caller = caller
        self.async_connection = conn

    @classmethod
    def connect(
        cls, loop: asyncio.AbstractEventLoop, conninfo: str, **kwargs: Any
    ) -> BridgedConnection:
        """Open ``psycopg.AsyncConnection.connect(conninfo, autocommit=True,
        **kwargs)`` on ``loop`` (errors as psycopg raises them)."""
        caller = LoopCaller(loop)
        conn = caller.call(
            psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        )
        return cls(caller, conn)

    def cursor(self) -> BridgedCursor:
        """A new synchronous face of a new ``AsyncCursor`` of the connection."""
        return BridgedCursor(self.caller, self.async_connection.cursor())

    def async_cursor(self) -> psycopg.AsyncCursor[Any]:
        """A new ``psycopg.AsyncCursor`` of the connection (the handler's ``tx``)."""
        return self.async_connection.cursor()

    def close(self) -> None:
        """Close the connection on the loop (an open transaction rolls back)."""
        self.caller.call(self.async_connection.close())
