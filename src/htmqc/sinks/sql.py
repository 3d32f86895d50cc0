"""What the SQL sinks (SQLite, PostgreSQL) share: the positions table, claim,
the per-message savepoint, and the fenced commit.

Theory of operation
-------------------
One connection per sink, in autocommit mode, with transactions opened
explicitly. ``htmqc_positions`` holds one row per (consumer group, topic,
partition): ``committed``, ``finished_above`` (see :mod:`htmqc.sinks.encoding`)
and ``fence``.

* ``claim`` inserts a row for a partition never seen (at ``default_start``) and
  bumps ``fence`` with an ``UPDATE ... RETURNING``, all in one write transaction.
* ``begin`` opens a write transaction; the user's statements go through
  ``txn.handle`` (a cursor of the same connection).
* ``message()`` wraps one message in ``SAVEPOINT``/``RELEASE``, and on failure
  ``ROLLBACK TO`` the savepoint. Scopes are serialized by a lock, so handlers on
  several worker threads cannot interleave their savepoints; the lock is held
  while the handler runs.
* ``dead_letter`` writes a row of ``<prefix>dead_letters`` (:mod:`htmqc.dlq.table`)
  in its own message scope; SQL sinks cannot ``forward`` Kafka records.
* ``commit`` reads each partition's fence *under the write lock* (SQLite: the
  transaction began ``IMMEDIATE``, so the whole file is locked; PostgreSQL:
  ``SELECT ... FOR UPDATE`` on the position row, which a concurrent ``claim``'s
  ``UPDATE`` must wait for), and only if every fence is current stores the
  positions and commits. A stale fence rolls everything back and raises
  :class:`~htmqc.sinks.base.Fenced`. Rows are locked in (topic, partition)
  order in both claim and commit, so two members cannot deadlock.
* ``reposition`` (``htmqc positions reset|seek|skip``) moves stored positions
  in one write transaction and takes each partition's fence with the claim's
  own statement (:meth:`SqlSink.take_fence`), so a member still running with
  the old fence is refused on its next commit and cannot overwrite the new
  position; after its fence grace it claims the partition again and reads
  from there.

Faults: a driver error that means the database cannot be used for now
(:meth:`SqlSink.unavailable`: a lost connection, a terminated backend, a file
locked past the busy timeout) becomes :class:`~htmqc.sinks.base.SinkUnavailable`;
a transaction that had to be rolled back whole under a running batch raises
:class:`~htmqc.sinks.base.TransactionAborted`; :meth:`SqlSink.reconnect` drops
the connection and opens a new one. Other driver errors become a one-line
:class:`~htmqc.errors.RuntimeFailure`.

Subclasses give the dialect: placeholder, clock expression, how a write
transaction begins, the row-lock suffix, the DDL, the connection, and which
driver errors mean "unavailable".

Debug switch (unsafe, for showing that the chaos checker can fail): with
``HTMQC_UNSAFE_DISABLE_FENCE=1`` in the environment when :meth:`SqlSink.open`
runs, ``commit`` still locks and reads the fences but stores the positions even
when one is stale, so a zombie's late transaction is committed. ``open`` logs a
warning saying so. Never set it outside that test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from htmqc.core.decisions import Commit, TopicPartition
from htmqc.dlq import table as dlq_table
from htmqc.errors import HtmqcError, RuntimeFailure, UsageError
from htmqc.ports import ConsumerPort, Headers, Message
from htmqc.sinks.base import (
    Fenced,
    Position,
    SinkStateError,
    SinkUnavailable,
    TransactionAborted,
    check_no_transaction,
    partition_name,
)
from htmqc.sinks.encoding import decode_finished, encode_finished

if TYPE_CHECKING:
    from htmqc.dlq.record import DeadLetterInfo

_SAVEPOINT = "htmqc_msg"
#: Environment variable that disables the fence check (see module docs).
UNSAFE_DISABLE_FENCE_ENV = "HTMQC_UNSAFE_DISABLE_FENCE"

log = logging.getLogger("htmqc.sinks")


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A row of the positions table as :meth:`SqlSink.stored` reads it:
    the position (``fence``: the latest owner's token) and ``updated_at``."""

    position: Position
    updated_at: str


class SqlSink(ABC):
    """Base of :class:`~htmqc.sinks.sqlite.SqliteSink` and
    :class:`~htmqc.sinks.postgresql.PostgresSink` (see module docs)."""

    name: str
    #: SQL sinks write dead letters as rows, never Kafka records.
    writes_kafka = False
    #: Positions live in the database; the group's offsets are only a copy for
    #: lag tools (``--kafka-lag-commits``), written by the runtime.
    commits_group_offsets = False
    #: SQL transactions send no commit metadata (:class:`~htmqc.ports.Sink`).
    metadata_max_bytes: int | None = None
    #: DB-API placeholder of the driver.
    param: str
    #: SQL expression for the current time, stored in ``updated_at``.
    now_sql: str
    #: Statement that opens a transaction holding the write lock it needs.
    begin_sql: str = "BEGIN"
    #: Appended to the fence read in ``commit`` to lock the position row.
    lock_suffix: str = ""
    #: The driver's base exception class.
    db_error: type[Exception] = Exception

    def __init__(self, display: str, table_prefix: str) -> None:
        self.display = display
        self.positions_table = f"{table_prefix}positions"
        self.dead_letters_table = dlq_table.table_name(table_prefix)
        self.group = ""
        self._conn: Any = None
        self._txn: SqlTransaction | None = None
        #: ``False`` only under the unsafe debug switch (see module docs).
        self.fence_enabled = True

    # -- dialect -----------------------------------------------------------------------

    @abstractmethod
    def connect(self) -> Any:
        """A new DB-API connection in autocommit mode; raise :class:`RuntimeFailure`."""

    @abstractmethod
    def create_tables(self, cur: Any) -> None:
        """Create the positions table if missing (idempotent, safe when raced)."""

    def handler_cursor(self, conn: Any) -> Any:
        """The handle an exactly-once handler gets (``tx``) for a transaction
        on ``conn``: a new cursor of it (:class:`~htmqc.ports.SqlTx`). The
        PostgreSQL sink with an ``async def`` handler gives a
        ``psycopg.AsyncCursor`` instead (:meth:`serve_async_handler`)."""
        return conn.cursor()

    def serve_async_handler(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The handler is ``async def`` and runs on ``loop``: return whether this
        sink now gives it an awaitable handle. SQL sinks keep their
        synchronous cursor (SQLite's is in-process and quick; see the README)
        unless a subclass says otherwise (:class:`~htmqc.sinks.postgresql.PostgresSink`)."""
        return False

    def fix_for(self, action: str) -> str:
        """What to tell the user when ``action`` failed in the database."""
        return f"check that the {self.name} database {self.display} is reachable and writable"

    @abstractmethod
    def unavailable(self, exc: BaseException) -> bool:
        """Whether the driver error ``exc`` means the database cannot be used
        for now (lost connection, terminated backend, lock timeout)."""

    # -- Sink --------------------------------------------------------------------------

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """``<display> table <prefix>dead_letters``: the database (password
        redacted) and the table :meth:`SqlTransaction.dead_letter` writes to."""
        return f"{self.display} table {self.dead_letters_table}"

    def open(self, group: str) -> None:
        """Connect (once) and create the positions table if missing."""
        if not group:
            raise UsageError("the consumer group name is empty", "pass --group NAME")
        if self._conn is None:
            self._conn = self.connect()
        self.group = group
        self.fence_enabled = os.environ.get(UNSAFE_DISABLE_FENCE_ENV, "") != "1"
        if not self.fence_enabled:
            log.warning(
                "UNSAFE: %s=1: the %s sink %s does NOT check generation fences; a zombie's "
                "late transaction WILL be stored (duplicates, positions moving backwards). "
                "This switch exists only to show that the chaos checker catches it.",
                UNSAFE_DISABLE_FENCE_ENV,
                self.name,
                self.display,
            )
        with self.db_errors("creating the positions table"):
            self.create_tables(self._conn.cursor())

    def bind(self, consumer: ConsumerPort) -> None:  # noqa: B027 - a deliberate no-op
        """SQL sinks keep their positions themselves: nothing to bind."""

    def before_commit(self) -> None:  # noqa: B027 - a deliberate no-op
        """SQL commits need nothing from the consumer."""

    def reconnect(self) -> None:
        """Drop the connection (an open transaction dies with it) and connect again.

        :raises SinkUnavailable: the database cannot be reached yet."""
        if self._txn is not None:
            self._txn.abandon()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with suppress(Exception):
                conn.close()
        try:
            self._conn = self.connect()
        except SinkUnavailable:
            raise
        except RuntimeFailure as exc:
            raise SinkUnavailable(exc.problem, exc.fix) from exc

    def claim(
        self,
        tps: Sequence[TopicPartition],
        *,
        default_start: Callable[[TopicPartition], int],
    ) -> dict[TopicPartition, Position]:
        """Bump each partition's fence and return its stored position (see module docs)."""
        conn = self._connection()
        check_no_transaction(self.name, "claim", self._txn)
        ordered = sorted(set(tps))
        if not ordered:
            return {}
        t, p = self.positions_table, self.param
        with self.db_errors("reading stored positions"):
            cur = conn.cursor()
            cur.execute(
                f'SELECT topic, "partition" FROM "{t}" WHERE consumer_group = {p}', (self.group,)
            )
            known = {(str(topic), int(part)) for topic, part in cur.fetchall()}
        starts = {tp: default_start(tp) for tp in ordered if tp not in known}
        out: dict[TopicPartition, Position] = {}
        with self.db_errors("claiming partitions"):
            cur.execute(self.begin_sql)
            try:
                for tp in ordered:
                    out[tp] = self.take_fence(cur, tp, starts.get(tp))
                cur.execute("COMMIT")
            except BaseException:
                self.rollback_quietly(cur)
                raise
        return out

    def take_fence(self, cur: Any, tp: TopicPartition, start: int | None) -> Position:
        """Inside an open write transaction on ``cur``: become ``tp``'s owner the
        way :meth:`claim` does, and return its stored position with the new fence.

        Inserts the row at ``start`` when it is missing (``start`` ``None``: the
        row must exist), then bumps ``fence`` with ``UPDATE ... RETURNING``,
        which takes the row lock a member's ``commit`` reads the fence under.
        From the transaction's commit on, every member holding an older fence
        is refused (:class:`~htmqc.sinks.base.Fenced`) on its next commit. The
        one fence of the SQL sinks: ``claim`` and ``htmqc positions`` both use it.
        """
        t, p = self.positions_table, self.param
        key = (self.group, tp[0], tp[1])
        if start is not None:
            cur.execute(
                f'INSERT INTO "{t}" (consumer_group, topic, "partition", committed, '
                f"finished_above, fence, updated_at) "
                f"VALUES ({p}, {p}, {p}, {p}, '', 0, {self.now_sql}) "
                f'ON CONFLICT (consumer_group, topic, "partition") DO NOTHING',
                (*key, start),
            )
        cur.execute(
            f'UPDATE "{t}" SET fence = fence + 1, updated_at = {self.now_sql} '
            f'WHERE consumer_group = {p} AND topic = {p} AND "partition" = {p} '
            f"RETURNING committed, finished_above, fence",
            key,
        )
        committed, finished, fence = cur.fetchall()[0]
        return Position(int(committed), self._decode(tp, committed, finished), int(fence))

    def store_position(
        self, cur: Any, tp: TopicPartition, committed: int, finished_above: Sequence[int]
    ) -> None:
        """Inside an open write transaction on ``cur``: write ``tp``'s position
        (the row must exist; the fence is not touched)."""
        t, p = self.positions_table, self.param
        cur.execute(
            f'UPDATE "{t}" SET committed = {p}, finished_above = {p}, '
            f"updated_at = {self.now_sql} WHERE consumer_group = {p} "
            f'AND topic = {p} AND "partition" = {p}',
            (committed, encode_finished(committed, finished_above), self.group, *tp),
        )

    def stored(self, topic: str) -> dict[TopicPartition, StoredRow]:
        """Every stored position of ``topic`` for this group, read without a
        lock (a committed snapshot): what ``htmqc positions show`` prints."""
        conn = self._connection()
        t, p = self.positions_table, self.param
        with self.db_errors("reading stored positions"):
            cur = conn.cursor()
            cur.execute(
                f'SELECT "partition", committed, finished_above, fence, updated_at FROM "{t}" '
                f"WHERE consumer_group = {p} AND topic = {p}",
                (self.group, topic),
            )
            rows = cur.fetchall()
        out: dict[TopicPartition, StoredRow] = {}
        for part, committed, finished, fence, updated in rows:
            tp = (topic, int(part))
            out[tp] = StoredRow(
                Position(int(committed), self._decode(tp, committed, finished), int(fence)),
                str(updated),
            )
        return out

    def reposition(
        self,
        tps: Sequence[TopicPartition],
        decide: Callable[[TopicPartition, Position | None], tuple[int, tuple[int, ...]] | None],
    ) -> dict[TopicPartition, tuple[Position | None, Position]]:
        """Move the stored positions of ``tps`` in one write transaction, taking
        each partition's fence as a new owner does (:meth:`take_fence`).

        For each partition, in (topic, partition) order like ``claim`` and
        ``commit``: read its stored position under the write lock (``None``
        when it has none), ask ``decide(tp, stored)`` for the new
        ``(committed, finished_above)`` (``None``: leave the partition alone,
        fence included), take the fence (inserting the row if missing) and
        store the new position. Returns, per partition moved, the position
        before and after (with the new fence). If ``decide`` or the
        database raises, the transaction is rolled back: nothing moved and no
        fence was taken.
        """
        conn = self._connection()
        check_no_transaction(self.name, "reposition", self._txn)
        t, p = self.positions_table, self.param
        out: dict[TopicPartition, tuple[Position | None, Position]] = {}
        with self.db_errors("moving positions"):
            cur = conn.cursor()
            cur.execute(self.begin_sql)
            try:
                for tp in sorted(set(tps)):
                    cur.execute(
                        f'SELECT committed, finished_above, fence FROM "{t}" '
                        f'WHERE consumer_group = {p} AND topic = {p} AND "partition" = {p}'
                        f"{self.lock_suffix}",
                        (self.group, *tp),
                    )
                    row = cur.fetchone()
                    before = (
                        None
                        if row is None
                        else Position(int(row[0]), self._decode(tp, row[0], row[1]), int(row[2]))
                    )
                    decided = decide(tp, before)
                    if decided is None:
                        continue
                    committed, finished = decided
                    fenced = self.take_fence(cur, tp, committed if before is None else None)
                    self.store_position(cur, tp, committed, finished)
                    kept = tuple(sorted(o for o in set(finished) if o >= committed))
                    out[tp] = (before, Position(committed, kept, fenced.fence))
                cur.execute("COMMIT")
            except BaseException:
                self.rollback_quietly(cur)
                raise
        return out

    def begin(self) -> SqlTransaction:
        """Open the write transaction; the handle is a cursor of it
        (:meth:`handler_cursor`)."""
        conn = self._connection()
        check_no_transaction(self.name, "begin", self._txn)
        with self.db_errors("beginning a transaction"):
            own = conn.cursor()
            own.execute(self.begin_sql)
        self._txn = SqlTransaction(self, own, self.handler_cursor(conn), conn.cursor())
        return self._txn

    def close(self) -> None:
        """Roll back an open transaction (a crash stores nothing) and disconnect."""
        if self._txn is not None:
            self._txn.abort()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with suppress(self.db_error):
                conn.close()

    # -- helpers -----------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None:
            raise SinkStateError(
                f"{self.name} sink {self.display} is not open", "call open(group) first"
            )
        return self._conn

    def _decode(self, tp: TopicPartition, committed: int, text: str) -> tuple[int, ...]:
        try:
            return decode_finished(int(committed), str(text or ""))
        except ValueError:
            raise RuntimeFailure(
                f"{self.name} sink: finished_above {text!r} stored for {partition_name(tp)} "
                f"in {self.positions_table} is malformed",
                "repair or delete that row (htmqc writes it as 'gap[:run],...')",
            ) from None

    @contextmanager
    def db_errors(self, action: str) -> Iterator[None]:
        """Turn the driver's errors into a one-line :class:`RuntimeFailure`
        (:class:`SinkUnavailable` when :meth:`unavailable` says so)."""
        try:
            yield
        except HtmqcError:
            raise
        except self.db_error as exc:
            raise self.failure(action, exc) from exc

    def failure(self, action: str, exc: BaseException) -> RuntimeFailure:
        """The one-line error for the driver error ``exc`` raised by ``action``."""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = SinkUnavailable if self.unavailable(exc) else RuntimeFailure
        return kind(f"{self.name} sink {self.display}: {action} failed: {detail}",
                    self.fix_for(action))

    def rollback_quietly(self, cur: Any) -> None:
        """``ROLLBACK``, ignoring a connection that is already gone."""
        with suppress(self.db_error):
            cur.execute("ROLLBACK")


class SqlTransaction:
    """One write transaction of a :class:`SqlSink` (see module docs)."""

    def __init__(self, sink: SqlSink, own: Any, handle: Any, letters: Any) -> None:
        #: The handler's ``tx`` (:meth:`SqlSink.handler_cursor`).
        self.handle = handle
        self._sink = sink
        self._own = own  # htmqc's statements; the handler's results stay undisturbed
        self._letters = letters  # dead-letter rows: synchronous even when handle is not
        self._lock = threading.Lock()
        self._done = False

    @contextmanager
    def message(self) -> Iterator[None]:
        """One message's effects: ``SAVEPOINT``, then ``RELEASE`` or ``ROLLBACK TO``."""
        with self._lock:
            self._check_open()
            sink = self._sink
            try:
                self._own.execute(f"SAVEPOINT {_SAVEPOINT}")
            except sink.db_error as exc:
                self._finish(rollback=True)
                raise self._lost("opening a message savepoint", exc) from exc
            try:
                yield
            except BaseException:
                self._undo_message()
                raise
            try:
                self._own.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            except sink.db_error as exc:
                # e.g. PostgreSQL: the handler swallowed a failed statement and the
                # transaction is in the aborted state; the message failed after all.
                self._undo_message()
                raise RuntimeFailure(
                    f"{sink.name} sink: a statement of this message failed in the database "
                    f"({str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r})",
                    "let database errors propagate out of the handler",
                ) from exc

    def _undo_message(self) -> None:
        try:
            self._own.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            self._own.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except self._sink.db_error as exc:
            self._finish(rollback=True)
            raise self._lost("undoing a failed message", exc) from exc

    def _lost(self, action: str, exc: BaseException) -> RuntimeFailure:
        """The error for a transaction rolled back whole by ``action``'s failure."""
        sink = self._sink
        if sink.unavailable(exc):
            return sink.failure(action, exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return TransactionAborted(
            f"{sink.name} sink: {action} failed ({first}); the whole transaction was rolled back",
            "run the batch again from the stored positions",
        )

    def dead_letter(self, topic: str, msg: Message, info: DeadLetterInfo) -> None:
        """A row of the sink's dead-letter table, in its own message scope."""
        with self.message():
            dlq_table.insert(
                self._letters, self._sink.dead_letters_table, self._sink.name, msg, info
            )

    def forward(self, topic: str, msg: Message, headers: Headers) -> None:
        """SQL transactions cannot write Kafka records.

        :raises SinkStateError: always."""
        raise SinkStateError(
            f"{self._sink.name} sink: cannot write a record to {topic} inside a database "
            "transaction",
            "use a kafka: sink for --retry-topic",
        )

    def commit(self, commits: Sequence[tuple[Commit, int]]) -> None:
        """Check the fences under the write lock, store the positions, commit."""
        with self._lock:
            self._check_open()
            if not commits:
                self._finish(rollback=True)
                return
            sink = self._sink
            t, p = sink.positions_table, sink.param
            ordered = sorted(commits, key=lambda item: item[0].tp)
            try:
                with sink.db_errors("committing"):
                    stale: list[TopicPartition] = []
                    for commit, fence in ordered:
                        self._own.execute(
                            f'SELECT fence FROM "{t}" WHERE consumer_group = {p} AND topic = {p} '
                            f'AND "partition" = {p}{sink.lock_suffix}',
                            (sink.group, *commit.tp),
                        )
                        row = self._own.fetchone()
                        if row is None or int(row[0]) != fence:
                            stale.append(commit.tp)
                    if stale and sink.fence_enabled:
                        raise Fenced.for_partitions(sink.name, stale)
                    for commit, _fence in ordered:
                        sink.store_position(
                            self._own, commit.tp, commit.offset, commit.finished_above
                        )
                    self._own.execute("COMMIT")
                    self._finish(rollback=False)
            finally:
                if not self._done:
                    self._finish(rollback=True)

    def abort(self) -> None:
        """Roll back the whole transaction (idempotent)."""
        with self._lock:
            if not self._done:
                self._finish(rollback=True)

    def abandon(self) -> None:
        """Forget the transaction without touching the connection (it is being
        dropped: the database rolls the transaction back)."""
        self._done = True
        if self._sink._txn is self:
            self._sink._txn = None

    def _finish(self, *, rollback: bool) -> None:
        if rollback:
            self._sink.rollback_quietly(self._own)
        self._done = True
        if self._sink._txn is self:
            self._sink._txn = None

    def _check_open(self) -> None:
        if self._done:
            raise SinkStateError(
                f"{self._sink.name} sink: this transaction is already committed or aborted",
                "call sink.begin() for a new one",
            )
