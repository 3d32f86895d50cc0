"""The Kafka→Kafka side of a chaos run: output records, transaction history, read-back.

A Kafka pipeline's consumers run ``htmqc run htmqc.chaos.handler:record --sink
kafka:OUT``; for each message the handler sends one record to ``OUT`` (key: the
input key) whose value is :func:`encode_output`: the message id, key, input
partition and offset, and *which transaction wrote it*: the writing process's
random token and the number of its Kafka transaction. Before the sink asks the
broker to commit transaction ``n``, the process appends ``n`` to its
transaction log ``<dir>/<token>.txns`` (:class:`TxnLog`; a write to the file,
so a SIGKILL right after cannot lose it). A transaction whose number is not
in its process's log never reached ``commit_transaction``: it cannot have
committed, so Kafka aborted it (the next producer with the same transactional
id, or the transaction timeout). Like a Jepsen client's history, the log knows
what *definitely* failed; a commit that was asked for and whose answer was
lost is indeterminate and never flagged.

:class:`KafkaRunStore` reads back after the run, with a ``read_committed``
consumer (what a downstream reader sees):

* the effects, output partition by output partition in offset order (a key's
  records all land on one output partition, so per-key storage order is
  offset order there); every record is also checked by
  :class:`AbortedReadCheck`: a record of a transaction that never asked to
  commit was read, Jepsen's ``G1a`` (aborted read);
* the dead letters, from ``<input>.dlq`` and ``<input>.dlq.poison``;
* during the run, the group's committed offsets of the input (progress, and the
  history the audit checks for backward moves) and its members (a zombie is
  woken once the group moved on without it). Neither goes through
  librdkafka's admin API: its coordinator calls abort the process when a
  broker fault drops the connection (:mod:`htmqc.kafka_requests`).

Reading stops when every output partition's position reaches its high
watermark, so records of transactions still open (a killed consumer's, until
Kafka aborts it) are waited for, not skipped. ``isolation`` is a parameter so a
test can read ``read_uncommitted`` and watch :class:`AbortedReadCheck` fire.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition

from htmqc.audit import DlqEntry, Effect
from htmqc.audit.model import DEFAULT_EXAMPLES
from htmqc.broker import create_topic
from htmqc.errors import HtmqcError, RuntimeFailure
from htmqc.kafka_cluster import KafkaCluster
from htmqc.produce import parse_id

TXN_DIR_ENV = "HTMQC_CHAOS_TXN_DIR"
_SEP = "|"
_COMMITTED_EVERY_SECONDS = 1.0
_ADMIN_TIMEOUT = 3.0
_READ_TIMEOUT = 180.0  # > transaction.timeout.ms (60 s): a killed writer's txn gets aborted
DLQ_REASON_HEADER = "htmqc-dlq-reason"


def encode_output(
    ident: int, key: str | None, partition: int, offset: int, token: str, txn: int
) -> bytes:
    """An output record's value: ``id|key|partition|offset|token|txn`` (``key``: a
    message key decoded as UTF-8, without ``|``)."""
    return _SEP.join((str(ident), key or "", str(partition), str(offset), token, str(txn))).encode()


def decode_output(value: bytes) -> tuple[Effect, str, int]:
    """The effect, writer token and transaction number of an :func:`encode_output` value.

    :raises ValueError: not such a value.
    """
    ident, key, part, off, token, txn = value.decode().split(_SEP)
    return Effect(ident, key or None, int(part), int(off), None), token, int(txn)


class TxnLog:
    """One process's log of the transactions it asked to commit (see module docs)."""

    def __init__(self, directory: str | None) -> None:
        self.token = uuid.uuid4().hex[:12]
        self._file: IO[str] | None = None
        if directory:
            self._file = open(  # noqa: SIM115 - lives as long as the process
                os.path.join(directory, f"{self.token}.txns"), "a", buffering=1, encoding="ascii"
            )

    def committing(self, txn: int) -> None:
        """Record that transaction ``txn`` is about to be committed (written through)."""
        if self._file is not None:
            self._file.write(f"{txn}\n")

    def close(self) -> None:
        """Close the log (idempotent); the handler's lives until its process ends."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_txn_logs(directory: Path) -> dict[str, set[int]]:
    """``token -> transaction numbers that asked to commit``, from every ``*.txns``."""
    out: dict[str, set[int]] = {}
    for path in directory.glob("*.txns"):
        numbers = out.setdefault(path.stem, set())
        for line in path.read_text(encoding="ascii", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                numbers.add(int(line))
    return out


class AbortedReadCheck:
    """Records read from transactions that never asked to commit (G1a).

    ``committing``: :func:`read_txn_logs`. Feed :meth:`see` every record read.
    """

    def __init__(self, committing: dict[str, set[int]], limit: int = DEFAULT_EXAMPLES) -> None:
        self._committing = committing
        self.limit = limit
        self.count = 0
        self.examples: list[dict[str, Any]] = []

    def see(self, effect: Effect, token: str, txn: int, where: tuple[int, int]) -> None:
        """Check one record (``where``: its output partition and offset)."""
        if txn in self._committing.get(token, ()):
            return
        self.count += 1
        if len(self.examples) < self.limit:
            self.examples.append(
                {"id": effect.id, "writer": token, "txn": txn, "output": list(where)}
            )


class KafkaRunStore:
    """One Kafka pipeline's output topic, group and transaction logs (module docs)."""

    def __init__(
        self,
        cluster: KafkaCluster,
        topic: str,
        group: str,
        txn_dir: Path,
        *,
        isolation: str = "read_committed",
    ) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.topic = topic
        self.group = group
        self.output = f"{topic}.{group}.out"
        self.txn_dir = txn_dir
        self.isolation = isolation
        self.aborted_reads = AbortedReadCheck({})
        self._offsets: Consumer | None = None
        self._last: dict[int, int] = {}
        self._asked = 0.0

    @property
    def sink_url(self) -> str:
        return f"kafka:{self.output}"

    def create(self, partitions: int) -> None:
        """Create the output topic (as many partitions as the input) and the log folder."""
        self.txn_dir.mkdir(parents=True, exist_ok=True)
        create_topic(self.bootstrap, self.output, partitions)

    def committed(self, partitions: int, *, fresh: bool = False) -> dict[int, int]:
        """The group's committed offsets of the input's ``partitions`` (``partition ->
        offset``), through a consumer of the group that never joins it.

        Asked at most once a second unless ``fresh``; a failed ask (a broker
        fault) answers what the last one did.
        """
        now = time.monotonic()
        if not fresh and now - self._asked < _COMMITTED_EVERY_SECONDS:
            return dict(self._last)
        self._asked = now
        if self._offsets is None:
            self._offsets = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,  # OffsetFetch only: never subscribes
                    "enable.auto.commit": False,
                    "log_level": 0,
                }
            )
        asked = [KafkaTopicPartition(self.topic, p) for p in range(partitions)]
        try:
            found = self._offsets.committed(asked, timeout=_ADMIN_TIMEOUT)
        except KafkaException:
            return dict(self._last)
        for tp in found:
            if tp.error is None and tp.offset >= 0:
                self._last[tp.partition] = tp.offset
        return dict(self._last)

    def ownership(self) -> frozenset[str]:
        """The group's member ids now (empty if the coordinator did not answer)."""
        try:
            members = self.cluster.group_members(self.group, timeout=_ADMIN_TIMEOUT)
        except HtmqcError:
            return frozenset()
        return frozenset(member for member, _client in members)

    def moved_since(self, before: frozenset[str]) -> bool:
        """Whether the group's membership changed since ``before`` (a rebalance)."""
        now = self.ownership()
        return bool(now) and bool(before) and now != before

    def effects(self) -> Iterator[Effect]:
        """The output records as effects (see module docs); each goes through
        :attr:`aborted_reads` (rebuilt from the transaction logs first)."""
        check = self.aborted_reads = AbortedReadCheck(read_txn_logs(self.txn_dir))
        for (part, off), value, _headers in self._read(self.output):
            effect, token, txn = decode_output(value)
            check.see(effect, token, txn, (part, off))
            yield effect

    def dead_letters(self) -> list[DlqEntry]:
        """The dead letters on ``<input>.dlq`` and ``<input>.dlq.poison``."""
        out: list[DlqEntry] = []
        for topic in (f"{self.topic}.dlq", f"{self.topic}.dlq.poison"):
            for _where, value, headers in self._read(topic, missing_ok=True):
                reason = dict(headers).get(DLQ_REASON_HEADER, b"")
                out.append(DlqEntry(str(parse_id(value)), reason.decode(errors="replace")))
        return out

    def _read(
        self, topic: str, *, missing_ok: bool = False
    ) -> Iterator[tuple[tuple[int, int], bytes, list[tuple[str, bytes]]]]:
        """Every record of ``topic``, partition by partition, until each partition's
        position reaches its high watermark (see module docs)."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"htmqc-chaos-readback-{uuid.uuid4().hex[:8]}",  # never joined
                "enable.auto.commit": False,
                "isolation.level": self.isolation,
                "log_level": 0,
            }
        )
        try:
            try:
                meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
            except KafkaException as exc:
                raise RuntimeFailure(
                    f"chaos: cannot read {topic!r} back: {exc.args[0] if exc.args else exc}",
                    "see the brokers' logs in the run's work directory",
                ) from None
            if meta is None or meta.error is not None:
                if missing_ok:
                    return
                raise RuntimeFailure(f"chaos: topic {topic!r} is missing", "see the run's logs")
            for part in sorted(meta.partitions):
                yield from self._read_partition(consumer, topic, part)
        finally:
            consumer.close()

    def _read_partition(
        self, consumer: Consumer, topic: str, part: int
    ) -> Iterator[tuple[tuple[int, int], bytes, list[tuple[str, bytes]]]]:
        tp = KafkaTopicPartition(topic, part, OFFSET_BEGINNING)
        _low, high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
        consumer.assign([tp])
        deadline = time.monotonic() + _READ_TIMEOUT
        position = 0
        while position < high:
            if time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"chaos: reading {topic}/{part} stopped at offset {position} of {high} "
                    f"({self.isolation}) for {_READ_TIMEOUT:g} s",
                    "a transaction stayed open: see the brokers' logs",
                )
            for msg in consumer.consume(5000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeFailure(f"chaos: reading {topic}/{part}: {err.str()}", "retry")
                raw = cast(list[tuple[str, bytes | None]], msg.headers() or [])
                headers = [(name, value or b"") for name, value in raw]
                yield (part, int(msg.offset() or 0)), bytes(msg.value() or b""), headers
            [now] = consumer.position([KafkaTopicPartition(topic, part)])
            position = max(position, now.offset)
        consumer.unassign()

    def drop(self) -> None:
        """Nothing to drop: the run's cluster goes with it."""
        self.close()

    def close(self) -> None:
        """Close the offsets consumer (idempotent)."""
        offsets, self._offsets = self._offsets, None
        if offsets is not None:
            offsets.close()
