"""The handler of a chaos run: one effect per message, faults on switches.

``htmqc run htmqc.chaos.handler:record --mode exactly-once --sink ...`` with
``HTMQC_CHAOS_TABLE`` (the effects table, created by the harness:
:mod:`htmqc.chaos.store`) and ``HTMQC_CHAOS_CONTROL`` (a JSON file of fault
switches, rewritten atomically by the harness while the run goes on).

With ``--sink kafka:OUT`` (the handle has ``send``) the effect is one record on
``OUT`` instead, tagged with the transaction that wrote it, and with
``HTMQC_CHAOS_TXN_DIR`` each transaction the sink asks to commit is logged
first (:mod:`htmqc.chaos.kafka_store`; importing this module wraps
:meth:`htmqc.sinks.kafka.KafkaSink.begin` to number the transactions and
``KafkaTransaction._commit_with_retries``, the one place that calls
``commit_transaction``, to log them).

Each call inserts ``(id, msg_key, partition, offset, generation, pid)`` through
the sink's transaction handle, like :mod:`examples.effects` (``id`` is not
unique, so a duplicate shows up in the audit). ``generation`` is the fence this
process holds for the message's partition: importing this module wraps
:meth:`htmqc.sinks.sql.SqlSink.claim` to remember the fence each claim returns.
The runtime claims only with no transaction open, so every effect of one
transaction carries the fences its commit is checked against; an effect
committed with a fence lower than one already committed for its partition is
the checker's ``fenced-write``. (Test instrumentation, like a Jepsen client:
the runtime offers no public way for a handler to read its fence.)

Switches (the control file; missing keys are off; re-read at most every
:data:`RELOAD_SECONDS`):

``slow_ms``
    sleep this long before each message (a slow sink).
``sink_error_rate``
    the first attempt (in this process) of that share of messages runs a
    statement that fails in the database (a transient sink error); with the
    Kafka sink it raises the producer's ``_MSG_TIMED_OUT`` before sending (its
    output is dropped with the message scope).
``handler_error_rate``
    the first attempt of that share of messages raises :class:`InjectedError`.
``poison``
    ids that fail on every attempt (:class:`PoisonMessage`): they must end in
    the dead-letter table.
``salt``
    mixed into the share selection (the run's seed).
``stop_in_txn``
    ``CLIENT#N``: the consumer whose ``HTMQC_CHAOS_CLIENT`` is ``CLIENT`` stops
    itself (SIGSTOP) once, right after the effect of its next message went into
    the open transaction (Kafka sink: into the message's scope, produced into the
    transaction once the handler returns, after SIGCONT): a zombie whose late
    transaction surely holds effects
    (:class:`~htmqc.chaos.harness.ChaosConfig`'s ``zombie_in_transaction``).

Which messages are in a "share" is a hash of ``(salt, kind, id)``: the same
messages on every run with the same seed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from htmqc.chaos.kafka_store import TXN_DIR_ENV, TxnLog, encode_output
from htmqc.core.decisions import TopicPartition
from htmqc.produce import parse_id
from htmqc.sinks.base import Position
from htmqc.sinks.kafka import KafkaSink, KafkaTransaction
from htmqc.sinks.sql import SqlSink

TABLE_ENV = "HTMQC_CHAOS_TABLE"
CONTROL_ENV = "HTMQC_CHAOS_CONTROL"
#: The consumer's client id (``chaos-c<k>``), for the ``stop_in_txn`` switch.
CLIENT_ENV = "HTMQC_CHAOS_CLIENT"
RELOAD_SECONDS = 0.05
_FAILING_SQL = "SELECT * FROM htmqc_chaos_injected_sink_error"


class InjectedError(RuntimeError):
    """A transient handler failure the schedule asked for."""


class PoisonMessage(RuntimeError):
    """A message that fails on every attempt (it must be dead-lettered)."""


#: The fence of each partition as last claimed by this process.
held: dict[TopicPartition, int] = {}
_attempts: dict[tuple[str, int], int] = {}
#: The ``stop_in_txn`` tokens this process has stopped for (each stops it once).
_stopped_for: set[str] = set()


def _install_claim_probe() -> None:
    """Wrap :meth:`SqlSink.claim` so :data:`held` learns each claimed fence (once)."""
    original = SqlSink.claim
    if getattr(original, "_chaos_probe", False):
        return

    def claim(
        self: SqlSink,
        tps: Sequence[TopicPartition],
        *,
        default_start: Callable[[TopicPartition], int],
    ) -> dict[TopicPartition, Position]:
        out = original(self, tps, default_start=default_start)
        for tp, pos in out.items():
            held[tp] = pos.fence
        return out

    claim._chaos_probe = True  # type: ignore[attr-defined]
    SqlSink.claim = claim  # type: ignore[method-assign]


_install_claim_probe()

txn_log = TxnLog(os.environ.get(TXN_DIR_ENV))
#: The number of this process's open Kafka transaction (0: none began yet).
current_txn = 0


def _install_txn_probe() -> None:
    """Number each Kafka transaction at ``begin``; log it before its commit (once)."""
    begin, commit = KafkaSink.begin, KafkaTransaction._commit_with_retries
    if getattr(begin, "_chaos_probe", False):
        return

    def probed_begin(self: KafkaSink) -> KafkaTransaction:
        global current_txn
        txn = begin(self)
        current_txn += 1
        txn._chaos_txn = current_txn  # type: ignore[attr-defined]
        return txn

    def probed_commit(self: KafkaTransaction) -> None:
        txn_log.committing(getattr(self, "_chaos_txn", 0))
        commit(self)

    probed_begin._chaos_probe = True  # type: ignore[attr-defined]
    KafkaSink.begin = probed_begin  # type: ignore[method-assign]
    KafkaTransaction._commit_with_retries = probed_commit  # type: ignore[method-assign]


_install_txn_probe()


class Switches:
    """The control file's switches, re-read when it changed (see module docs)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.slow_ms = 0.0
        self.sink_error_rate = 0.0
        self.handler_error_rate = 0.0
        self.poison: frozenset[int] = frozenset()
        self.salt = 0
        self.stop_in_txn = ""
        self._checked = 0.0
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def refresh(self) -> Switches:
        """Reload the file if :data:`RELOAD_SECONDS` passed and it changed; return self.

        A file that is missing or cannot be parsed leaves the switches as they were.
        """
        now = time.monotonic()
        if self.path is None or now - self._checked < RELOAD_SECONDS:
            return self
        with self._lock:
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp == self._stamp:
                    return self
                with open(self.path, encoding="utf-8") as handle:
                    data = json.load(handle)
            except (OSError, ValueError):
                return self
            self._stamp = stamp
            self.slow_ms = float(data.get("slow_ms", 0.0))
            self.sink_error_rate = float(data.get("sink_error_rate", 0.0))
            self.handler_error_rate = float(data.get("handler_error_rate", 0.0))
            self.poison = frozenset(int(i) for i in data.get("poison", ()))
            self.salt = int(data.get("salt", 0))
            self.stop_in_txn = str(data.get("stop_in_txn", ""))
        return self


def chosen(salt: int, kind: str, ident: int, rate: float) -> bool:
    """Whether message ``ident`` is in the ``rate`` share for ``kind`` (a stable hash)."""
    if rate <= 0.0:
        return False
    return zlib.crc32(f"{salt}:{kind}:{ident}".encode()) < rate * 2**32


def _first_attempt(kind: str, ident: int) -> bool:
    key = (kind, ident)
    n = _attempts.get(key, 0)
    _attempts[key] = n + 1
    return n == 0


switches = Switches(os.environ.get(CONTROL_ENV))
_insert: dict[bool, str] = {}


def _insert_sql(tx: Any) -> str:
    qmark = type(tx).__module__.startswith("sqlite3")
    sql = _insert.get(qmark)
    if sql is None:
        p = "?" if qmark else "%s"
        table = os.environ[TABLE_ENV]
        sql = _insert[qmark] = (
            f'INSERT INTO {table} (id, msg_key, "partition", "offset", generation, pid) '
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
        )
    return sql


def record(msg: Any, tx: Any) -> None:
    """Store ``msg``'s effect through ``tx``, unless a switch makes it fail first."""
    ident = parse_id(msg.value())
    sw = switches.refresh()
    if ident in sw.poison:
        raise PoisonMessage(f"poison message {ident}")
    if sw.slow_ms > 0:
        time.sleep(sw.slow_ms / 1000.0)
    if chosen(sw.salt, "handler", ident, sw.handler_error_rate) and _first_attempt(
        "handler", ident
    ):
        raise InjectedError(f"injected handler error at message {ident}")
    kafka = hasattr(tx, "send")
    if chosen(sw.salt, "sink", ident, sw.sink_error_rate) and _first_attempt("sink", ident):
        if kafka:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "injected sink error"))
        tx.execute(_FAILING_SQL)  # no such table: the database refuses it
    topic, part = msg.topic(), msg.partition()
    key = msg.key()
    if kafka:
        text = key.decode() if key is not None else None
        tx.send(
            None,
            encode_output(ident, text, part, msg.offset(), txn_log.token, current_txn),
            key=key,
        )
    else:
        tx.execute(
            _insert_sql(tx),
            (
                ident,
                key.decode() if key is not None else None,
                part,
                msg.offset(),
                held.get((topic, part)),
                os.getpid(),
            ),
        )
    _stop_if_asked(sw.stop_in_txn)


def _stop_if_asked(token: str) -> None:
    """SIGSTOP this process once for a ``stop_in_txn`` token naming its client."""
    if not token or token in _stopped_for:
        return
    if token.partition("#")[0] != os.environ.get(CLIENT_ENV):
        return
    _stopped_for.add(token)
    os.kill(os.getpid(), signal.SIGSTOP)  # the harness sends SIGCONT
