"""The SQLite sink: effects and positions in one SQLite file.

Concurrency: one writer at a time holds the file's write lock. Every write
transaction (``claim``, ``begin``) starts ``BEGIN IMMEDIATE``, so the lock is
taken before anything is read: the fence check in ``commit`` and the writes are
atomic against another member's ``claim``, which waits (``busy_timeout``) until
this transaction ends. WAL mode lets readers go on meanwhile;
``synchronous=FULL`` makes a commit durable before ``commit()`` returns.
The connection may be used from worker threads (``check_same_thread=False``);
:class:`~htmqc.sinks.sql.SqlTransaction` serializes message scopes.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sinks.sql import SqlSink
from htmqc.sinks.urls import DEFAULT_TABLE_PREFIX


class SqliteSink(SqlSink):
    """Exactly-once into the SQLite file at ``path``; the handler gets a
    ``sqlite3.Cursor`` (``execute``/``executemany``) of the open transaction."""

    name = "sqlite"
    param = "?"
    now_sql = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    begin_sql = "BEGIN IMMEDIATE"
    db_error = sqlite3.Error

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        busy_timeout: float = 30.0,
        display: str | None = None,
    ) -> None:
        self.path = Path(path)
        super().__init__(display or f"sqlite:///{self.path}", table_prefix)
        self.busy_timeout = busy_timeout
        check_writable(self.path)

    def connect(self) -> Any:
        """Open the file in WAL mode with a busy timeout."""
        check_writable(self.path)
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise RuntimeFailure(
                f"cannot open SQLite sink {self.display}: {exc}",
                "check that the file is an SQLite database and its directory is writable",
            ) from exc
        return conn

    def create_tables(self, cur: Any) -> None:
        """``CREATE TABLE IF NOT EXISTS`` (the file lock serializes racing members)."""
        cur.execute(
            f'CREATE TABLE IF NOT EXISTS "{self.positions_table}" ('
            "consumer_group TEXT NOT NULL, topic TEXT NOT NULL, "
            '"partition" INTEGER NOT NULL, committed INTEGER NOT NULL, '
            "finished_above TEXT NOT NULL DEFAULT '', fence INTEGER NOT NULL DEFAULT 0, "
            "updated_at TEXT NOT NULL, "
            'PRIMARY KEY (consumer_group, topic, "partition"))'
        )

    def unavailable(self, exc: BaseException) -> bool:
        """A lock held past the busy timeout, or a connection that was closed."""
        text = str(exc).lower()
        if isinstance(exc, sqlite3.ProgrammingError):
            return "closed" in text
        return isinstance(exc, sqlite3.OperationalError) and (
            "locked" in text or "busy" in text or "disk i/o" in text
        )

    def fix_for(self, action: str) -> str:
        """Lock waits are the usual SQLite failure: say so."""
        return (
            f"check that {self.path} is writable and that no other process keeps it locked "
            f"longer than the busy timeout ({self.busy_timeout:g} s)"
        )


def check_writable(path: Path) -> None:
    """Raise :class:`UsageError` unless an SQLite file can be created or written at ``path``."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(
            f"SQLite sink path {path} is a directory", "name a file, e.g. sqlite:///out/sink.db"
        )
    if not parent.is_dir():
        raise UsageError(
            f"the directory {parent} of the SQLite sink {path} does not exist",
            f"create it (mkdir -p {parent}) or choose another path",
        )
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(
            f"SQLite sink {path} is not writable (the file and its directory must be, for WAL)",
            "fix the permissions or choose another path",
        )
