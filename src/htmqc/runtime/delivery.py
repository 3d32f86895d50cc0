"""How finished work becomes durable: the two delivery modes, poll-thread side.

Theory of operation
-------------------
The loop asks the core what to commit (:meth:`ConsumerCore.commits`) and hands
the :class:`~htmqc.core.Commit` values to a *delivery*:

* :class:`AtLeastOnce` commits each partition's watermark to Kafka with an
  asynchronous ``commit`` (``finished_above`` goes into the commit metadata, so
  a restart skips work finished out of order); the ``on_commit`` callback
  arrives on the poll thread and is queued as acks/failures for the core. It is
  also the lanes' :class:`~htmqc.runtime.workers.Outbox`: dead letters and
  retry records are produced and waited for on the lane of the message's key.
* :class:`ExactlyOnce` is the poll thread's half of the commit handshake with
  the :class:`~htmqc.runtime.workers.TransactionWorker` (see there): it answers
  ``commit_due`` with the core's commits and the fences of the claims, acks
  them once ``committed`` comes back, asks for a commit when the worker is
  idle and a transaction period passed (so progress over gaps and dead letters
  is stored too), and commits on demand (revoke, shutdown) within a bound.

Lag the standard tools see (``--kafka-lag-commits``, on by default).
Exactly-once into a database stores positions only in the database, so the
group's offsets in Kafka would stay unset and ``kafka-consumer-groups``,
Burrow or KEDA would see no lag. With a sink that does not commit the group's
offsets itself (:attr:`~htmqc.ports.Sink.commits_group_offsets` false: SQL),
:class:`ExactlyOnce` hands the watermarks the core accepted as stored
(``commit_acked`` true after the database commit) to
:meth:`AtLeastOnce.mirror`: the at-least-once path's asynchronous Kafka
commit, without telling the core anything; at most once per ``--commit-ms``
(the latest of each partition; a Kafka commit per transaction was about 1,000
commits and 4,000 more context switches per million messages), and at once
when a revoke or the shutdown commits, before the partitions leave. It is a
copy for lag tools only: nothing reads it back (positions on assignment come
from the sink's ``claim``),
it may lag behind or fail; failures are counted (:attr:`AtLeastOnce.lag_failures`,
``htmqc_kafka_lag_commit_failures_total``) and logged at most once per
:data:`LAG_LOG_EVERY` seconds, and never stop the run.

Dead letters carry a :class:`~htmqc.dlq.record.DeadLetterInfo`. At-least-once
writes them to ``info.target(topic)`` (``<topic>.dlq``, or
``<topic>.dlq.poison``) with the headers of :mod:`htmqc.dlq.headers`, with a
producer, and waits for the broker's ack before the core hears
``dead_lettered``; exactly-once writes them in the sink transaction
(:meth:`~htmqc.ports.SinkTransaction.dead_letter`: the same topics for a Kafka
sink, a row of the dead-letter table for a database sink), so a message ends
with its effect or its dead letter, never neither and never both. Where a dead
letter goes is said by ``dead_letter_destination`` of whatever writes it
(:meth:`AtLeastOnce.dead_letter_destination`,
:meth:`~htmqc.ports.Sink.dead_letter_destination`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.core import Commit, ConsumerCore
from htmqc.core.decisions import TopicPartition
from htmqc.core.metadata_budget import DEFAULT_LIMIT, PREFIX_BYTES, fitting_prefix
from htmqc.dlq import table as dlq_table
from htmqc.dlq.headers import dlq_headers
from htmqc.dlq.record import DeadLetterInfo, dlq_topic
from htmqc.errors import RuntimeFailure
from htmqc.ports import ConsumerPort, Headers, Message, ProducerPort
from htmqc.runtime.workers import Payload, TransactionWorker
from htmqc.sinks.encoding import encode_metadata

if TYPE_CHECKING:
    from htmqc.observe.metrics import Metrics
    from htmqc.runtime.loop import Engine

log = logging.getLogger("htmqc.runtime")

#: Real seconds a commit on demand may always take, even past the bound it was given.
COMMIT_GRACE = 0.5
#: The dead-letter table of a SQL sink with the default table prefix.
DLQ_TABLE = dlq_table.table_name()

#: Real seconds between two log lines about failed lag commits (all are counted).
LAG_LOG_EVERY = 60.0

__all__ = ["DLQ_TABLE", "LAG_LOG_EVERY", "AtLeastOnce", "ExactlyOnce", "dlq_topic"]


class AtLeastOnce:
    """Kafka commits of the watermark, asynchronous, acked through the core; and,
    exactly-once into a database, the lag copy of the stored watermarks
    (:meth:`mirror`, module docs).

    ``metrics``: where failed lag commits are counted (optional)."""

    def __init__(
        self,
        consumer: ConsumerPort | None,
        producer_factory: Callable[[], ProducerPort],
        metadata_limit: int = DEFAULT_LIMIT,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.consumer = consumer
        #: The broker's ``offset.metadata.max.bytes`` (``--commit-metadata-bytes``).
        self.metadata_limit = metadata_limit
        #: Commits whose finished-above set was cut to fit (:meth:`metadata`).
        self.truncated = 0
        self._producer_factory = producer_factory
        self._producer: ProducerPort | None = None
        self._producer_lock = threading.Lock()
        self._pending: dict[tuple[TopicPartition, int], int] = {}
        self.acks: list[tuple[Any, list[Any]]] = []
        self._metrics = metrics
        #: :meth:`mirror` was called: commit outcomes the core is not waiting
        #: for are lag commits (their failures are counted).
        self.mirrors = False
        #: Partitions' watermarks handed to Kafka by :meth:`mirror`.
        self.lag_commits = 0
        #: Lag commits that failed (refused at once, or an error in ``on_commit``).
        self.lag_failures = 0
        self._lag_logged: float | None = None
        self._lag_unlogged = 0

    def on_commit(self, err: Any, partitions: list[Any]) -> None:
        """confluent-kafka's ``on_commit``: queue it for the poll loop."""
        self.acks.append((err, partitions))

    def drain_acks(self, core: ConsumerCore) -> None:
        """Report queued commit callbacks to the core."""
        while self.acks:
            err, partitions = self.acks.pop(0)
            for p in partitions:
                tp = (p.topic, p.partition)
                epoch = self._pending.pop((tp, p.offset), None)
                if epoch is None:
                    if self.mirrors and (err is not None or p.error is not None):
                        self._lag_failed(tp, p.error if p.error is not None else err)
                    continue
                if err is None and p.error is None:
                    core.commit_acked(tp, epoch, p.offset)
                else:
                    core.commit_failed(tp, epoch, p.offset)

    def commit(self, core: ConsumerCore, commits: list[Commit], *, sync: bool = False) -> None:
        """Commit ``commits`` to Kafka (asynchronously unless ``sync``)."""
        from confluent_kafka import KafkaException

        if not commits:
            return
        assert self.consumer is not None
        offsets = self.kafka_offsets(commits)
        for c in commits:
            self._pending[(c.tp, c.offset)] = c.epoch
        if not sync:
            self.consumer.commit(offsets=offsets, asynchronous=True)
            return
        try:
            result = self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            for c in commits:
                self._pending.pop((c.tp, c.offset), None)
                core.commit_failed(c.tp, c.epoch, c.offset)
            return
        self.acks.append((None, result or []))
        self.drain_acks(core)

    def mirror(self, commits: Sequence[Commit]) -> None:
        """Exactly-once into a database: commit ``commits`` (watermarks the core
        accepted as stored by the database transaction that just committed) to
        the group's offsets too, the way :meth:`commit` does, asynchronously.

        Contract: called only after the database commit succeeded, with the
        core's own :class:`~htmqc.core.Commit` values (nothing is computed
        here); the core hears nothing of it (no ``commit_acked``/``commit_failed``:
        the database is the only durable position, and this copy is never read
        back); it never blocks on the broker and never raises: a commit librdkafka
        refuses at once, or whose ``on_commit`` reports an error, is counted in
        :attr:`lag_failures` and logged at most once per :data:`LAG_LOG_EVERY`
        seconds."""
        if not commits:
            return
        assert self.consumer is not None
        self.mirrors = True
        try:
            self.consumer.commit(offsets=self.kafka_offsets(commits), asynchronous=True)
        except Exception as exc:  # a closed consumer, a refused request: best effort
            for c in commits:
                self._lag_failed(c.tp, exc)
            return
        self.lag_commits += len(commits)

    def _lag_failed(self, tp: TopicPartition, error: Any) -> None:
        """Count a failed lag commit; log it if none was logged for a while."""
        self.lag_failures += 1
        if self._metrics is not None:
            self._metrics.lag_commit_failed()
        now = time.monotonic()
        if self._lag_logged is not None and now - self._lag_logged < LAG_LOG_EVERY:
            self._lag_unlogged += 1
            return
        more = f" ({self._lag_unlogged} more since the last line)" if self._lag_unlogged else ""
        log.warning(
            "the group's offset of %s/%d (for lag tools only; the database holds the "
            "position) could not be committed: %s%s", tp[0], tp[1], error, more,
        )
        self._lag_logged, self._lag_unlogged = now, 0

    def kafka_offsets(self, commits: Sequence[Commit]) -> list[KafkaTP]:
        """The core's ``commits`` as the offsets of a Kafka commit: each watermark,
        with ``finished_above`` in the metadata (:meth:`metadata`)."""
        return [KafkaTP(c.tp[0], c.tp[1], c.offset, metadata=self.metadata(c)) for c in commits]

    def metadata(self, commit: Commit) -> str:
        """``commit``'s metadata; a finished-above set whose text would pass the limit
        (Kafka would refuse the commit, and the position would never move) keeps
        its longest prefix of runs that fits: the offsets left out run again after
        a restart, which at-least-once allows (the intake's throttle makes this rare)."""
        text = encode_metadata(commit.offset, commit.finished_above)
        if len(text) <= self.metadata_limit:
            return text
        self.truncated += 1
        kept = fitting_prefix(
            commit.offset, commit.finished_above, self.metadata_limit - PREFIX_BYTES
        )
        return encode_metadata(commit.offset, kept)

    def dead_letter(self, topic: str, msg: Message, info: DeadLetterInfo) -> None:
        """Write ``msg`` (same key and value, headers of :func:`dlq_headers`) to
        ``info.target(topic)`` and wait for the broker's ack.

        :raises RuntimeFailure: the dead letter could not be written (the message
            then stays unfinished, so nothing is committed past it).
        """
        self.send(
            self.dead_letter_destination(topic, info), msg.value(), msg.key(),
            dlq_headers(msg, info),
        )

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        """The DLQ topic of ``info`` (:meth:`DeadLetterInfo.target`)."""
        return info.target(topic)

    def forward(self, topic: str, msg: Message, headers: Headers) -> None:
        """Write ``msg`` to ``topic`` (the retry topic) and wait for the ack."""
        self.send(topic, msg.value(), msg.key(), headers)

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        """Produce one record and wait for the broker's ack (dead letters, retry
        records: the source offset may be finished only once its copy exists).

        :raises RuntimeFailure: the broker did not take it within 30 s.
        """
        with self._producer_lock:
            if self._producer is None:
                self._producer = self._producer_factory()
            producer = self._producer
        errors: list[Any] = []
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers,
            on_delivery=lambda err, _m: errors.append(err) if err is not None else None,
        )
        remaining = producer.flush(30)
        if remaining or errors:
            raise RuntimeFailure(
                f"could not write to {topic}: {errors[0] if errors else 'timed out'}",
                f"check that the topic {topic} exists and the broker is up",
            )

    def close(self) -> None:
        """Flush the dead-letter producer."""
        if self._producer is not None:
            self._producer.flush(10)


class ExactlyOnce:
    """The poll thread's half of exactly-once delivery (see module docs)."""

    def __init__(
        self,
        engine: Engine,
        worker: TransactionWorker,
        txn_seconds: float,
        *,
        lag: AtLeastOnce | None = None,
        lag_seconds: float = 0.0,
    ) -> None:
        self.engine = engine
        self.worker = worker
        self.txn_seconds = txn_seconds
        #: Where stored watermarks are copied to the group's offsets for lag
        #: tools (:meth:`AtLeastOnce.mirror`), or ``None`` (off, or a sink that
        #: commits the group's offsets itself).
        self.lag = lag
        #: At most one lag copy per this many seconds (``--commit-ms``): each is
        #: a Kafka commit, and a copy per transaction (about 1,000 per million
        #: messages) buys nothing a lag tool can see.
        self.lag_seconds = lag_seconds
        #: Stored watermarks not copied yet: the latest per partition.
        self._lag_due: dict[TopicPartition, Commit] = {}
        self._lag_copied = float("-inf")
        #: A ``commit_due`` was answered and its outcome has not come back.
        self.in_flight = False
        #: A commit was asked for (``commit`` request) and not answered yet.
        self.asked = False
        self.last_commit = engine.clock.monotonic()
        #: Commits acknowledged by the sink (tests, benchmarks).
        self.commits = 0
        #: The last :meth:`commit_now` timed out (the worker was in a handler).
        self.stuck = False

    def payload(self) -> Payload:
        """The core's commits with the fences of the claims (the ``commit_due`` answer)."""
        e = self.engine
        fences = e.ownership.fences
        return [(c, fences[c.tp]) for c in e.core.commits() if c.tp in fences]

    def serve(self, report: tuple[Any, ...]) -> None:
        """A commit report of the worker (``commit_due``, ``committed``, ``fenced``,
        ``aborted``). On ``committed`` the core hears each stored commit; those
        that moved its committed watermark go to :attr:`lag` (if set), after
        the database commit and never before."""
        e = self.engine
        kind = report[0]
        if kind == "commit_due":
            self.asked = False
            self.in_flight = True
            payload = self.payload()
            if payload:
                self.worker.sink.before_commit()
            self.worker.answer(payload)
            return
        self.in_flight = self.stuck = False
        self.last_commit = e.clock.monotonic()
        if kind == "committed":
            payload, seconds = report[1], report[2]
            stored = [
                commit
                for commit, _fence in payload
                if e.core.commit_acked(commit.tp, commit.epoch, commit.offset)
            ]
            if self.lag is not None and stored:
                # The core's committed watermarks, after the database commit.
                for commit in stored:
                    self._lag_due[commit.tp] = commit
                self.copy_lag(self.last_commit)
            self.commits += 1
            if payload and e.metrics is not None:
                e.metrics.observe_commit_latencies([seconds])
        elif kind == "fenced":
            e.ownership.fenced_by(report[1])
        elif kind == "aborted":
            e.ownership.sink_ready()

    def copy_lag(self, now: float, *, force: bool = False) -> None:
        """Copy the stored watermarks not copied yet to the group's offsets
        (:attr:`lag`) if :attr:`lag_seconds` passed since the last copy, or
        ``force`` (a revoke, the shutdown: before the partitions leave); only
        of partitions still held under the epoch the watermark was stored in."""
        if self.lag is None or not self._lag_due:
            return
        if force or now - self._lag_copied >= self.lag_seconds:
            self._lag_copied = now
            core = self.engine.core
            # Only partitions still ours under the same assignment: a lost or
            # revoked one's copy could land after the next owner's, backwards.
            due = [c for c in self._lag_due.values() if core.epoch(c.tp) == c.epoch]
            self._lag_due = {}
            self.lag.mirror(due)

    def settled(self) -> bool:
        """No commit asked for or under way."""
        return not self.asked and not self.in_flight

    def ask(self) -> None:
        """Ask the worker to commit before its next handler call."""
        if self.settled():
            self.asked = True
            self.worker.request(("commit",))

    def tick(self, now: float) -> None:
        """Each turn: with the worker idle and a transaction period over, commit
        whatever the core has (gaps, dead letters, the open transaction's tail);
        copy the stored watermarks for lag tools if that is due."""
        self.copy_lag(now)
        if (
            self.settled()
            and self.worker.idle
            and now - self.last_commit >= self.txn_seconds
        ):
            self.last_commit = now
            # Not ``core.commits()`` to see whether there is anything: asking the
            # core for its commits marks them requested (only the answer to the
            # worker's ``commit_due`` may). An empty handshake costs no sink call.
            self.ask()

    def commit_now(self, deadline: float) -> bool:
        """Commit the open transaction (and wait for the outcome) before the real
        time ``deadline`` (or :data:`COMMIT_GRACE` from now, if later: a worker that
        is idle gets that long to store it); False if it could not be done in time.
        After a failure, while the worker is still busy (the same handler call), a
        second ask fails at once: the grace is not paid twice (shutdown, then the
        revoke its ``close`` brings)."""
        if self.stuck and not self.worker.idle:
            return False
        deadline = max(deadline, time.monotonic() + COMMIT_GRACE)
        if not self.settled() and not self.engine.await_(self.settled, deadline):
            self.stuck = True
            return False  # the commit under way is older than what is asked for now
        self.ask()
        done = self.engine.await_(self.settled, deadline)
        self.stuck = not done
        return done

    def doom(self) -> None:
        """Roll back the open transaction (see :mod:`htmqc.runtime.workers`)."""
        self.asked = False
        self.worker.doom()
