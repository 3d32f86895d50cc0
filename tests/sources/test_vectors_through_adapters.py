"""The core conformance vectors replayed through each adapter's offset mapping
(issue 20, item 2), with no broker: every offset a step names goes to the log's
native position, through the adapter's own conversion code, and back before the
core sees it, and every offset the core answers goes back through the adapter on
its way out (:func:`spec.conformance.replay.mapped_mismatches`); the replay must
match the vector exactly as the plain one does.

Per vector and partition the log holds exactly the offsets the vector names as
messages; every other offset between them is a hole, which each log shows in its
own way:

* NATS JetStream: message ``o`` is stream sequence ``o + 1``, delivered as a
  nats-py message whose ack subject (both forms, chosen by a seeded draw) carries
  the sequence, turned into a :class:`~htmqc.sources.nats.NatsMessage` by
  :func:`~htmqc.sources.nats.convert` (holes: sequences never delivered). A
  position ``p`` is a stream whose ``last_seq`` is ``p``, read back by
  ``NatsConsumer._watermarks_of``, and a commit stored and read back through
  ``_store_commits``/``_read_commits`` on a fake KV bucket.
* RabbitMQ Streams: the stream offset is wrapped by
  :func:`~htmqc.sources.rabbitmq.convert`; a position is stored with
  ``store_offset`` and read back by :func:`~htmqc.sources.rabbitmq.read_commit`,
  and is the high watermark :func:`~htmqc.sources.rabbitmq.watermarks` probes of a
  stream ending just below it.
* Apache Pulsar: a seeded layout of ledgers (ids growing with gaps) of entries of
  1-4 messages (batches; a single message unbatched), holes as entries a reader
  never sees (entry ids jump), served by a :class:`~htmqc.sources.pulsar.PulsarAdmin`
  whose HTTP call is answered from the layout (``internalStats`` and the entry's
  index headers), so ``locate``, ``ledgers``, ``entry`` are the real ones. A fetched
  batch is read by the real ``_Fetch`` with a real
  :class:`~htmqc.sources.pulsar.OffsetMapper` from a fake reader: one reader per
  session, continued while the batch goes on where the reader is, else a new one
  at ``locate(first offset)`` (a seek: the mapper starts again, messages below the
  start are dropped); a single offset is read by a session of its own. The test
  asserts the mapper gives back the vector's offsets (the replay compares them) and
  that the layouts had batches, ledger changes and holes. A position goes through
  :func:`~htmqc.sources.pulsar.encode_commit`/``decode_commits``.

Negative positions (``committed: -1``) are not log positions: they reach the core
unchanged, which refuses them.

Seen failing, each bug planted once in a copy and restored: ``nats.convert`` giving
``offset = seq`` (37 of the 39 NATS replays failed, e.g. ``happy_path step 1
(fetched ... [0, 1, 2]): raised unexpected AssertionError: assert 3 in {0, 1, 2}``:
the core ran offsets 1-3, one of them not in the log); an ``OffsetMapper`` that
derives a new ledger's entry 0 from the previous ledger instead of looking it up
(the Pulsar replays of ``gap_end_beyond_last`` and ``random_1..4``, whose layouts
have a hole at a ledger change, and the layouts test failed); ``_Fetch.read``
without its below-start filter (33 Pulsar replays failed, e.g. ``failed_while_revoking
step 1: answered [0, 0, 2, 2]; expected [0, 1, 2, 3]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.sources import nats, pulsar, rabbitmq
from spec.conformance import replay

CORE = [p for p in replay.vector_files() if replay.load(p).get("kind") is None]


def _split(tp: str) -> tuple[str, int]:
    return replay.parse_tp(tp)


# -- NATS JetStream -----------------------------------------------------------------------


class NatsMapping:
    """Offsets as JetStream sequences (module docs)."""

    def __init__(self, vector: dict[str, Any], rng: random.Random) -> None:
        self.stored = replay.offsets_named(vector)
        self.rng = rng
        self.loop = asyncio.new_event_loop()
        self.kv: dict[str, bytes] = {}
        self.last_seq = 0

        async def stream_info(_stream: str) -> Any:
            return SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=self.last_seq))

        async def bucket() -> Any:
            return self

        self.consumer = SimpleNamespace(
            _js=SimpleNamespace(stream_info=stream_info), _watermarks={}, group="g",
            _bucket=bucket, _commit_lock=None,
        )  # fmt: skip

    # the fake KV bucket (nats-py's ``KeyValue``: ``put``, ``get``)
    async def put(self, key: str, value: bytes) -> None:
        self.kv[key] = value

    async def get(self, key: str) -> Any:
        return SimpleNamespace(value=self.kv[key])

    def message(self, tp: str, offset: int) -> int:
        assert offset in self.stored[tp]
        seq = offset + 1
        stream = nats.stream_name(*_split(tp))
        if self.rng.random() < 0.5:
            reply = f"$JS.ACK.{stream}.c.1.{seq}.{self.rng.randint(1, 99)}.1700000000000000000.0"
        else:
            reply = f"$JS.ACK.dom.acc.{stream}.c.1.{seq}.7.1700000000000000000.0.tok"
        msg = SimpleNamespace(reply=reply, headers={nats.KEY_HEADER: "k"}, data=b"v")
        converted = nats.convert(*_split(tp), msg)
        assert converted.key() == b"k"
        return converted.offset()

    def batch(self, tp: str, offsets: list[int]) -> list[int]:
        return [self.message(tp, o) for o in offsets]

    def position(self, tp: str, offset: int) -> int:
        topic, partition = _split(tp)
        self.last_seq = offset  # a stream whose messages end just below the position
        _low, high = self.loop.run_until_complete(
            nats.NatsConsumer._watermarks_of(self.consumer, (topic, partition))  # type: ignore[arg-type]
        )
        assert high == offset, (tp, offset, high)
        self.consumer._commit_lock = asyncio.Lock()
        commit = KafkaTP(topic, partition, offset, metadata="m")
        self.loop.run_until_complete(nats.NatsConsumer._store_commits(self.consumer, [commit]))  # type: ignore[arg-type]
        got = self.loop.run_until_complete(
            nats.NatsConsumer._read_commits(self.consumer, [(topic, partition)])  # type: ignore[arg-type]
        )
        assert got[(topic, partition)][1] == "m"
        return got[(topic, partition)][0]

    def close(self) -> None:
        self.loop.close()


# -- RabbitMQ Streams -----------------------------------------------------------------------


class RabbitMapping:
    """Offsets as stream offsets (module docs)."""

    def __init__(self, vector: dict[str, Any], rng: random.Random) -> None:
        self.stored = replay.offsets_named(vector)
        self.loop = asyncio.new_event_loop()
        self.offsets: dict[tuple[str, str], int] = {}
        self.end = 0  # the fake stream holds offsets 0 .. end - 1

    # the fake rstream ``Consumer``
    async def store_offset(self, stream: str, reference: str, offset: int) -> None:
        self.offsets[(stream, reference)] = offset

    async def query_offset(self, stream: str, reference: str) -> int:
        return self.offsets[(stream, reference)]

    async def subscribe(self, _stream: str, on_message: Any, **kw: Any) -> int:
        from rstream import OffsetType

        if self.end:
            first = kw["offset_specification"].offset_type == OffsetType.FIRST
            on_message(None, SimpleNamespace(offset=0 if first else self.end - 1))
        return 1

    async def unsubscribe(self, _sid: int) -> None:
        return None

    def message(self, tp: str, offset: int) -> int:
        assert offset in self.stored[tp]
        msg = SimpleNamespace(application_properties={b"Htmqc-Key": b"k"}, body=b"v")
        return rabbitmq.convert(*_split(tp), offset, 0, msg).offset()

    def batch(self, tp: str, offsets: list[int]) -> list[int]:
        return [self.message(tp, o) for o in offsets]

    def position(self, tp: str, offset: int) -> int:
        stream = rabbitmq.stream_name(*_split(tp))
        self.end = offset
        _low, high = self.loop.run_until_complete(rabbitmq.watermarks(self, stream))
        assert high == offset, (tp, offset, high)
        self.loop.run_until_complete(self.store_offset(stream, "htmqc.g", offset))
        got = self.loop.run_until_complete(rabbitmq.read_commit(self, stream, "htmqc.g"))
        assert got is not None
        return got

    def close(self) -> None:
        self.loop.close()


# -- Apache Pulsar ----------------------------------------------------------------------------

#: A partition's layout: ledgers ``(id, [(messages, delivered), ...])``, oldest first.
Layout = list[tuple[int, list[tuple[int, bool]]]]


def pulsar_layout(stored: set[int], rng: random.Random) -> tuple[int, Layout]:
    """``(first offset, layout)`` of a partition holding exactly ``stored``: runs of
    stored offsets cut into entries of 1-4 messages, holes into entries a reader
    skips (one entry for a long hole), a new ledger before an entry one time in four."""
    if not stored:
        return 0, []
    ordered = sorted(stored)
    runs: list[tuple[int, bool]] = []  # (length, delivered)
    for i, o in enumerate(ordered):
        if i and o - ordered[i - 1] > 1:
            runs.append((o - ordered[i - 1] - 1, False))
        if runs and runs[-1][1] and i and o - ordered[i - 1] == 1:
            runs[-1] = (runs[-1][0] + 1, True)
        else:
            runs.append((1, True))
    entries: list[tuple[int, bool]] = []
    for length, delivered in runs:
        if not delivered and length > 4:
            entries.append((length, False))
            continue
        while length:
            size = min(length, rng.randint(1, 4))
            entries.append((size, delivered))
            length -= size
    ledger = rng.randint(1, 50)
    layout: Layout = [(ledger, [])]
    for entry in entries:
        if layout[-1][1] and rng.random() < 0.25:
            ledger += rng.randint(1, 9)
            layout.append((ledger, []))
        layout[-1][1].append(entry)
    return ordered[0], layout


class FakeReader:
    """A Pulsar reader over ``(ledger, entry, batch index)`` ids; ``read_next``
    times out at the end, as the client does."""

    def __init__(self, ids: list[tuple[int, int, int]]) -> None:
        self.ids = iter(ids)

    def read_next(self, _timeout_ms: int) -> Any:
        import pulsar as client

        here = next(self.ids, None)
        if here is None:
            raise client.Timeout()
        mid = SimpleNamespace(
            ledger_id=lambda: here[0], entry_id=lambda: here[1], batch_index=lambda: here[2]
        )
        return SimpleNamespace(
            message_id=lambda: mid, partition_key=lambda: "k", properties=lambda: {"h": "v"},
            data=lambda: b"v", publish_timestamp=lambda: 0,
        )  # fmt: skip


class LayoutAdmin(pulsar.PulsarAdmin):
    """The real admin calls, their HTTP answered from the layouts."""

    PATH = re.compile(r"^(.*-partition-\d+)/(?:internalStats|ledger/(\d+)/entry/(\d+))$")

    def __init__(self) -> None:
        super().__init__("http://layout.invalid")
        #: partition topic path -> ledger -> [Entry, ...]
        self.entries: dict[str, dict[int, list[pulsar.Entry]]] = {}
        self.calls = 0

    def add(self, topic: str, partition: int, first: int, layout: Layout) -> None:
        index = first - 1
        ledgers: dict[int, list[pulsar.Entry]] = {}
        for ledger, entries in layout:
            for messages, _delivered in entries:
                index += messages
                ledgers.setdefault(ledger, []).append(pulsar.Entry(index, messages))
        self.entries[f"{pulsar.topic_path(topic)}-partition-{partition}"] = ledgers

    def _get(
        self, path: str, method: str = "GET", body: Any = None
    ) -> tuple[bytes, dict[str, str]]:
        self.calls += 1
        match = self.PATH.match(path)
        assert match and method == "GET", path
        ledgers = self.entries.get(match[1], {})
        if match[2] is None:
            stats = {
                "ledgers": [{"ledgerId": i, "entries": len(e)} for i, e in ledgers.items()],
                "state": "LedgerOpened",
                "currentLedgerEntries": len(ledgers[max(ledgers)]) if ledgers else 0,
            }
            return json.dumps(stats).encode(), {}
        entry = ledgers[int(match[2])][int(match[3])]
        headers = {pulsar.INDEX_HEADER: str(entry.index)}
        if entry.messages > 1:
            headers[pulsar.BATCH_HEADER] = str(entry.messages)
        return b"", headers


class PulsarMapping:
    """Offsets as Pulsar message ids through the real mapper (module docs)."""

    def __init__(self, vector: dict[str, Any], rng: random.Random) -> None:
        self.admin = LayoutAdmin()
        #: per partition: the ids a reader delivers, in order, and their true offsets
        self.ids: dict[str, list[tuple[int, int, int]]] = {}
        self.truth: dict[str, list[int]] = {}
        self.sessions: dict[str, tuple[pulsar._Fetch, FakeReader, int]] = {}
        self.lookups = 0
        self.batches = self.ledger_changes = self.holes = 0
        for tp, stored in replay.offsets_named(vector).items():
            first, layout = pulsar_layout(stored, rng)
            self.admin.add(*_split(tp), first, layout)
            ids, truth, offset = [], [], first
            for ledger, entries in layout:
                for e, (messages, delivered) in enumerate(entries):
                    for b in range(messages):
                        if delivered:
                            ids.append((ledger, e, b if messages > 1 else -1))
                            truth.append(offset)
                        offset += 1
                    self.batches += delivered and messages > 1
                    self.holes += not delivered
            self.ledger_changes += max(0, len(layout) - 1)
            assert sorted(stored) == truth
            self.ids[tp], self.truth[tp] = ids, truth

    def _session(self, tp: str, start: int) -> tuple[pulsar._Fetch, FakeReader, int]:
        """A reader at ``locate(start)`` (from its entry's first message), as
        ``PulsarConsumer._session`` opens one; its ``_Fetch`` and where it is."""
        topic, partition = _split(tp)
        located = self.admin.locate(topic, partition, start)
        assert located is not None, (tp, start)
        ledger, entry, _batch = located
        ids = self.ids[tp]
        at = next(i for i, here in enumerate(ids) if here[:2] == (ledger, entry))

        def lookup(ledger: int, entry: int) -> pulsar.Entry:
            self.lookups += 1
            return self.admin.entry(topic, partition, ledger, entry)

        mapper = pulsar.OffsetMapper(lookup)
        fetch = pulsar._Fetch(topic, partition, start, mapper)
        return fetch, FakeReader(ids[at:]), self.truth[tp].index(start)

    def _read(self, tp: str, session: tuple[pulsar._Fetch, FakeReader, int], n: int) -> list[int]:
        fetch, reader, _ = session
        got = fetch.read(reader, n)
        assert [m.key() for m in got] == [b"k"] * len(got)
        return [m.offset() for m in got]

    def message(self, tp: str, offset: int) -> int:
        (got,) = self._read(tp, self._session(tp, offset), 1)
        return got

    def batch(self, tp: str, offsets: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(offsets)):
            return [self.message(tp, o) for o in offsets]  # not a delivery order
        truth, out = self.truth[tp], []
        run: list[int] = []
        for o in offsets:  # runs of consecutive stored messages: one read each
            if run and truth.index(o) != truth.index(run[-1]) + 1:
                out += self._run(tp, run)
                run = []
            run.append(o)
        return out + self._run(tp, run)

    def _run(self, tp: str, run: list[int]) -> list[int]:
        session = self.sessions.get(tp)
        here = self.truth[tp].index(run[0])
        if session is None or session[2] != here:
            session = self._session(tp, run[0])  # a seek: a new reader and mapper
        got = self._read(tp, session, len(run))
        self.sessions[tp] = (session[0], session[1], here + len(run))
        return got

    def position(self, tp: str, offset: int) -> int:
        _topic, partition = _split(tp)
        stored = pulsar.encode_commit(partition, offset, "m")
        return pulsar.decode_commits([stored])[partition][0]

    def close(self) -> None:
        return None


MAPPINGS: dict[str, Any] = {"nats": NatsMapping, "rabbitmq": RabbitMapping, "pulsar": PulsarMapping}


@contextlib.contextmanager
def _mapping(name: str, vector: dict[str, Any]) -> Iterator[Any]:
    mapping = MAPPINGS[name](vector, random.Random(f"{name}/{vector['name']}"))
    try:
        yield mapping
    finally:
        mapping.close()


@pytest.mark.parametrize("adapter", sorted(MAPPINGS))
@pytest.mark.parametrize("path", CORE, ids=[p.stem for p in CORE])
def test_the_vector_conforms_through_the_adapters_mapping(
    path: Path, adapter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rabbitmq, "PROBE_WAIT", 0.01)  # an empty fake stream answers at once
    vector = replay.load(path)
    with _mapping(adapter, vector) as mapping:
        assert list(replay.mapped_mismatches(vector, mapping)) == []


def test_the_pulsar_layouts_have_batches_ledger_changes_and_holes() -> None:
    """The seeded layouts meet what the mapper must get right (at least ten batches,
    ledger changes and holes over the vectors), and the mapper looked entries up."""
    totals = {"batches": 0, "ledger_changes": 0, "holes": 0}
    lookups = 0
    for path in CORE:
        vector = replay.load(path)
        mapping = PulsarMapping(vector, random.Random(f"pulsar/{vector['name']}"))
        assert list(replay.mapped_mismatches(vector, mapping)) == []
        for key in totals:
            totals[key] += getattr(mapping, key)
        lookups += mapping.lookups
    assert min(totals.values()) >= 10, totals
    assert lookups > 0


def test_a_mapping_that_shifts_offsets_is_caught() -> None:
    """The mapped replay compares what comes back: a mapping one off fails."""
    vector = replay.load(replay.VECTORS / "happy_path.json")

    class OneOff(NatsMapping):
        def message(self, tp: str, offset: int) -> int:
            return super().message(tp, offset) + 1

    mapping = OneOff(vector, random.Random(0))
    try:
        assert list(replay.mapped_mismatches(vector, mapping)) != []
    finally:
        mapping.close()
