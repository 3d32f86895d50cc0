"""A consumer group's positions kept by Kafka, read and moved from outside the group.

What ``htmqc positions`` uses for groups that keep their positions in Kafka
(at-least-once, and the Kafka→Kafka sink), plus the topic facts every store
needs (partitions, watermarks).

Stored position: the group's committed offset; its offsets finished out of
order ride in the commit metadata (``htmqc1:...``,
:func:`~htmqc.sinks.encoding.decode_metadata`), or, where a broker dropped
the metadata, in the compacted positions topic
(:mod:`htmqc.sinks.kafka_positions`), whose record counts only while its
``committed`` equals the group's: the same reading as the Kafka sink's claim.

Moving (:meth:`KafkaGroupOffsets.move`): Kafka accepts offset commits from a
client outside the group only while the group has no members (Empty; a
non-empty group answers ``UNKNOWN_MEMBER_ID``), so the move is refused while
:meth:`KafkaGroupOffsets.live_state` says the group is not Empty/Dead, unless
``force`` (the broker keeps its own rule). The new offsets, with their
finished-above offsets in the metadata, go in one
``alter_consumer_group_offsets`` call: every partition moves or none. Before
it, each partition that has a record in the positions topic (or keeps more
finished offsets than the metadata holds) gets a new record ``(new position,
kept offsets)``, so an
older record can never apply to the new position and resurrect offsets the
move cleared. If the alteration then fails, the old position stays, and the
worst left behind is that a broker which drops commit metadata runs its
finished offsets once more: work is repeated, never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec as _OffsetSpec

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sinks.encoding import METADATA_PREFIX, decode_finished, encode_finished
from htmqc.sinks.kafka import METADATA_MAX_BYTES
from htmqc.sinks.kafka_positions import (
    DEFAULT_POSITIONS_TOPIC,
    _client_settings,
    read_positions,
    record_key,
    record_value,
)
from htmqc.sinks.moves import Move, Watermarks

#: ``OffsetSpec`` of confluent-kafka (untyped there).
OffsetSpec: Any = _OffsetSpec

#: Group states in which no member holds the group (a non-member may commit).
IDLE_STATES = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD})


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """A partition's position in the group: ``committed`` (``None``: none),
    ``finished_above``, and where they were read (``metadata``,
    ``positions topic`` or ``-``)."""

    committed: int | None
    finished_above: tuple[int, ...] = ()
    source: str = "-"


def _text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


class KafkaTopicInfo:
    """A topic's partitions and watermarks, through an AdminClient."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout = timeout
        self.extra = dict(kafka_config or {})
        settings = {**_client_settings(dict(kafka_config or {})), "bootstrap.servers": bootstrap}
        try:
            self.admin = AdminClient(settings)
        except KafkaException as exc:
            raise UsageError(
                f"invalid Kafka connection setting: {_text(exc)}",
                "check the security.protocol, ssl.* and sasl.* values of --kafka-config",
            ) from None

    def partitions(self) -> list[int]:
        """The topic's partition numbers.

        :raises UsageError: the topic does not exist. :raises RuntimeFailure:
            the broker does not answer."""
        try:  # every topic: asking for one by name makes some brokers create it
            meta = self.admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise RuntimeFailure(
                f"cannot read the metadata of topic {self.topic!r} from {self.bootstrap}: "
                f"{_text(exc)}",
                "check that the broker runs and --bootstrap is right",
            ) from None
        found = meta.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise UsageError(
                f"topic {self.topic!r} does not exist on {self.bootstrap}",
                "check --topic (and --bootstrap)",
            )
        return sorted(found.partitions)

    def exists(self, topic: str) -> bool:
        """Whether ``topic`` exists (``False`` when the broker does not say)."""
        try:
            found = self.admin.list_topics(timeout=self.timeout).topics.get(topic)
        except KafkaException:
            return False
        return found is not None and found.error is None and bool(found.partitions)

    def watermarks(self, partitions: Sequence[int]) -> dict[int, Watermarks]:
        """Each partition's low and high watermark (one ListOffsets round).

        :raises RuntimeFailure: the broker does not answer."""
        tps = [KafkaTP(self.topic, p) for p in partitions]
        lows = self._list_offsets({tp: OffsetSpec.earliest() for tp in tps})
        highs = self._list_offsets({tp: OffsetSpec.latest() for tp in tps})
        return {p: Watermarks(lows[p], highs[p]) for p in partitions}

    def _list_offsets(self, specs: dict[KafkaTP, Any]) -> dict[int, int]:
        try:
            futures = self.admin.list_offsets(specs, request_timeout=self.timeout)
            return {ktp.partition: int(f.result(self.timeout).offset) for ktp, f in futures.items()}
        except (KafkaException, TimeoutError) as exc:
            raise RuntimeFailure(
                f"cannot read the watermarks of {self.topic!r}: {_text(exc)}",
                "check that the broker runs and is reachable",
            ) from None


class KafkaGroupOffsets:
    """A group's positions on one topic as Kafka keeps them (module docs)."""

    def __init__(
        self,
        info: KafkaTopicInfo,
        group: str,
        *,
        positions_topic: str = DEFAULT_POSITIONS_TOPIC,
        metadata_max_bytes: int = METADATA_MAX_BYTES,
    ) -> None:
        self.info = info
        self.group = group
        self.positions_topic = positions_topic
        #: The broker's ``offset.metadata.max.bytes`` (``--commit-metadata-bytes``):
        #: a move whose metadata would be longer keeps its finished offsets in the
        #: positions topic only.
        self.metadata_max_bytes = metadata_max_bytes
        self._records: dict[int, tuple[int, str]] | None = None

    def _records_of(self, partitions: Sequence[int]) -> dict[int, tuple[int, str]]:
        """The latest positions-topic record per partition (empty when the topic is missing)."""
        if self._records is None:
            info = self.info
            self._records = {}
            if info.exists(self.positions_topic):
                found = read_positions(
                    info.bootstrap,
                    self.positions_topic,
                    self.group,
                    [(info.topic, p) for p in partitions],
                    info.extra,
                    info.timeout,
                )
                self._records = {tp[1]: rec for tp, rec in found.items()}
        return self._records

    def stored(self, partitions: Sequence[int]) -> dict[int, GroupPosition]:
        """The group's committed offsets and finished-above offsets (module docs).

        :raises RuntimeFailure: the broker does not answer, or the stored
            offsets are malformed."""
        info = self.info
        request = ConsumerGroupTopicPartitions(
            self.group, [KafkaTP(info.topic, p) for p in partitions]
        )
        try:
            answer = info.admin.list_consumer_group_offsets(
                [request], request_timeout=info.timeout
            )[self.group].result(info.timeout)
        except (KafkaException, TimeoutError) as exc:
            raise RuntimeFailure(
                f"cannot read the committed offsets of group {self.group!r}: {_text(exc)}",
                "check that the broker runs and is reachable",
            ) from None
        out: dict[int, GroupPosition] = {}
        need_topic = False
        for ktp in answer.topic_partitions:
            if ktp.offset < 0:
                out[ktp.partition] = GroupPosition(None)
                continue
            meta = ktp.metadata or ""
            if meta.startswith(METADATA_PREFIX):
                finished = self._decode(ktp.partition, ktp.offset, meta[len(METADATA_PREFIX) :])
                out[ktp.partition] = GroupPosition(ktp.offset, finished, "metadata")
            else:
                out[ktp.partition] = GroupPosition(ktp.offset)
                need_topic = True
        if need_topic:
            for p, (committed, text) in self._records_of(partitions).items():
                if p in out and out[p].committed == committed and text:
                    out[p] = GroupPosition(
                        committed, self._decode(p, committed, text), "positions topic"
                    )
        return out

    def _decode(self, partition: int, committed: int, text: str) -> tuple[int, ...]:
        try:
            return decode_finished(committed, text)
        except ValueError:
            raise RuntimeFailure(
                f"the finished-above offsets stored for {self.info.topic}[{partition}] in "
                f"group {self.group!r} ({text[:60]!r}) are malformed",
                "commit an offset for that partition without metadata to reset it",
            ) from None

    def live_state(self) -> str | None:
        """The group's state name when it has live members (not Empty/Dead), else ``None``.

        :raises RuntimeFailure: the broker does not answer."""
        info = self.info
        try:
            desc = info.admin.describe_consumer_groups(
                [self.group], request_timeout=info.timeout
            )[self.group].result(info.timeout)
        except (KafkaException, TimeoutError) as exc:
            raise RuntimeFailure(
                f"cannot describe group {self.group!r}: {_text(exc)}",
                "check that the broker runs and is reachable",
            ) from None
        if desc.state in IDLE_STATES:
            return None
        members = len(desc.members or ())
        name = getattr(desc.state, "name", str(desc.state)).lower()
        return f"{name}, {members} member{'s' if members > 1 else ''}" if members else name

    def move(self, moves: Sequence[Move]) -> None:
        """Store ``moves`` (only the changed ones): positions-topic records,
        then one ``alter_consumer_group_offsets`` call (module docs).

        :raises RuntimeFailure: the broker refused (nothing moved)."""
        changed = [m for m in moves if m.changed]
        if not changed:
            return
        info = self.info
        records = self._records_of([m.partition for m in moves])
        offsets = []
        overrides: list[tuple[bytes, bytes]] = []
        for m in changed:
            text = encode_finished(m.after, m.finished_after)
            metadata = METADATA_PREFIX + text
            if len(metadata) > self.metadata_max_bytes:
                metadata = ""  # too long for the metadata: the positions record holds it
            offsets.append(KafkaTP(info.topic, m.partition, m.after, metadata=metadata))
            if m.partition in records or (m.finished_after and not metadata):
                overrides.append(
                    (record_key(self.group, (info.topic, m.partition)), record_value(m.after, text))
                )
        if overrides:
            self._write_records(overrides)
        request = ConsumerGroupTopicPartitions(self.group, offsets)
        try:
            answer = info.admin.alter_consumer_group_offsets(
                [request], request_timeout=info.timeout
            )[self.group].result(info.timeout)
        except (KafkaException, TimeoutError) as exc:
            raise RuntimeFailure(
                f"the broker refused the new offsets of group {self.group!r}: {_text(exc)}",
                _refused_fix(exc),
            ) from None
        errors = [(t.partition, t.error) for t in answer.topic_partitions if t.error is not None]
        if errors:
            part, err = errors[0]
            raise RuntimeFailure(
                f"the broker refused the new offset of {info.topic}[{part}] for group "
                f"{self.group!r}: {err.str() if isinstance(err, KafkaError) else err}",
                _refused_fix(err),
            )

    def _write_records(self, records: list[tuple[bytes, bytes]]) -> None:
        info = self.info
        settings = {
            **_client_settings(info.extra),
            "bootstrap.servers": info.bootstrap,
            "enable.idempotence": True,
        }
        producer = Producer(settings)
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err.str() if isinstance(err, KafkaError) else str(err))

        for key, value in records:
            producer.produce(self.positions_topic, value=value, key=key, on_delivery=delivered)
        left = producer.flush(info.timeout)
        if left or failed:
            raise RuntimeFailure(
                f"cannot write to the positions topic {self.positions_topic!r}: "
                f"{failed[0] if failed else f'{left} records not acknowledged'}; "
                "no offset was moved",
                "check that the broker is reachable and the topic writable, then retry",
            )


def _refused_fix(err: object) -> str:
    code = err.code() if isinstance(err, KafkaError) else None
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        code = err.args[0].code()
    if code in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
                KafkaError.ILLEGAL_GENERATION):  # fmt: skip
        return "the group has live members: stop them (Kafka accepts no other commits), then retry"
    return "check the broker and retry; no offset was moved"
