"""NATS JetStream as a source: :class:`NatsConsumer` implements
:class:`~htmqc.ports.ConsumerPort`, so the same core and runtime drive it.

Theory of operation
-------------------
*What maps to what.* A htmqc "topic" ``T`` with ``N`` partitions is ``N``
JetStream streams ``T-0`` .. ``T-(N-1)``, stream ``T-p`` holding the one
subject ``T.p`` (:func:`stream_name`, :func:`subject`). One stream per partition,
not one stream with ``N`` subjects: a stream's sequence numbers are dense and
increasing over *that stream*; with all partitions in one stream each
partition would see every other one's messages as holes, and its watermarks,
purge and retention would be shared. So a message's **offset** is its stream
sequence minus one: sequences start at 1, grow by one per stored message and
are never reused, hence offsets start at 0, are dense as written and increase
in delivery order. A message deleted or purged leaves its sequence unused:
the reader sees a hole, which the core treats as a gap, exactly as it treats
Kafka's transaction markers (nothing to run; the watermark passes it once
everything around it is done). Watermarks: ``low = first_seq - 1`` (0 for a
stream never written), ``high = last_seq`` (one past the last offset).

*Fetching.* Pull, not push: each assigned, unpaused partition has a pump task
on the adapter's private asyncio thread (nats-py is asyncio) that owns an
*ephemeral* pull consumer (``AckPolicy.NONE``, ``DeliverPolicy.BY_START_SEQUENCE``
at the partition's position + 1, ``inactive_threshold`` so a crashed member
leaves nothing behind) and sends it pull requests (``CONSUMER.MSG.NEXT``, up to
:data:`FETCH_BATCH` messages, lingering :data:`FETCH_WAIT` s on an idle
partition) whose messages a subscription callback collects into a bounded
per-partition buffer (nats-py's ``fetch`` waits for each message with its own
timeout, several times slower); :meth:`NatsConsumer.consume` hands them out
(blocking, ``timeout`` seconds at most). Nothing is acknowledged, so JetStream
never redelivers: every re-read is one the runtime asked for. The pull consumer
is a cursor only: ``seek`` (and a new assignment) drop the buffer and start a
new pull consumer at the new sequence; the old one is deleted. Pause stops the
pump and hides the buffer, as librdkafka's pause does. An idle partition whose
last messages were deleted moves its position to the log end once nothing can
have been missed (:meth:`NatsConsumer._past_deleted_tail`).

*Commits (at-least-once).* A commit stores ``{"offset", "metadata"}`` under
``GROUP.T.p`` in the KV bucket :data:`OFFSETS_BUCKET`; ``committed`` reads it
back. Why not JetStream acks (``AckPolicy.ALL``, ack of the last message below
the watermark)? (1) ``seek`` must recreate the consumer, and a recreated
consumer has lost its ack floor, so the commit would not survive the rollbacks,
breaker probes and re-reads the runtime seeks for; (2) a plain ack is not
confirmed, and the core must hear ``commit_acked`` only once the position is
durable (a KV put returns after the server stored it); (3) ``ack_wait``
redelivery and ``max_ack_pending`` would fight the runtime's own retries and
flow window (a message in a 30 s backoff would be redelivered, a window of
10,000 would stall at 1,000); (4) the commit's metadata (work finished above
the watermark, :mod:`htmqc.sinks.encoding`) has no place in an ack. An
asynchronous commit's outcome is reported through ``on_commit(err, parts)``
inside a later :meth:`NatsConsumer.consume`, as confluent-kafka does; commits
are stored in the order they were asked for.

*Exactly-once.* Positions come from the sink (its claim, then ``seek``), as
with Kafka; the KV bucket is not used.

*Group membership.* NATS has no consumer-group rebalance: one member of a
group consumes a topic, and holds a *lease* for it, the key ``GROUP.TOPIC`` in
the KV bucket :data:`LEASES_BUCKET` (entries expire :data:`LEASE_SECONDS` after
their last renewal; renewed every quarter of that). ``subscribe`` takes the
lease, waiting as a standby while another member holds it; once held,
``on_assign`` is called once, inside a ``consume``, with every partition of the
topic, and nothing is ever revoked. ``close`` deletes the lease, so a standby
takes over at once; a killed member's lease expires. While a renewal is overdue
(80 % of the lease's life) nothing is handed out; a renewal refused because the
lease moved on stops the run (``consume`` raises). The lease keeps two members
of a group from consuming the same topic, but it rests on timing: exactly-once,
the sink's fence is what makes a stale member harmless.

Every offset *decision* stays in the core: this module converts sequences to
offsets, keeps each partition's fetch position (one past the last message
returned, as ``position`` reports) and stores the commits it is given.

Keys and headers: NATS has no record key; the header :data:`KEY_HEADER`
carries it (UTF-8 text). Other headers are handed on as ``(name, bytes)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.dlq.record import retry_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sources.pumped import (
    BUFFER_MESSAGES,
    CALL_TIMEOUT,
    FETCH_BATCH,
    RETRY_SUFFIX,
    TP,
    CommitCallback,
    Deliveries,
    LogMessage,
    Numbered,
    NumberedProducer,
    PumpedConsumer,
    _Partition,
    check_plain,
    stop_loop,
)
from htmqc.sources.pumped import OFFSET_INVALID as OFFSET_INVALID
from htmqc.sources.pumped import stream_name as partition_stream
from htmqc.sources.tls import (
    TLS_PARAMS,
    TLS_REFUSALS,
    client_context,
    query_of,
    tls_refusal,
)

log = logging.getLogger("htmqc.nats")

T = TypeVar("T")

#: The KV bucket at-least-once commits go to (key ``GROUP.TOPIC.PARTITION``).
OFFSETS_BUCKET = "htmqc_offsets"
#: The KV bucket of membership leases (key ``GROUP.TOPIC``; entries expire).
LEASES_BUCKET = "htmqc_leases"
#: Seconds a lease lives without renewal (the bucket's TTL); renewed every quarter.
LEASE_SECONDS = 10.0
#: The header that carries a message's key.
KEY_HEADER = "Htmqc-Key"
#: Seconds one pull request lingers on an idle partition.
FETCH_WAIT = 1.0
#: Seconds an abandoned pull consumer lives on the server (a crashed member's).
INACTIVE_THRESHOLD = 30.0


def stream_name(topic: str, partition: int) -> str:
    """The stream of ``topic``'s ``partition``: ``TOPIC-P``; of a retry topic
    ``T.retry`` (one partition, ``--retry-topic``), ``T-retry``. NATS stream names
    cannot hold ``.``, and no topic's partition stream is named so (those end in
    ``-`` and a number).

    :raises ValueError: a retry topic's partition other than 0."""
    if topic.endswith(RETRY_SUFFIX):
        if partition != 0:
            raise ValueError(f"a retry topic has one partition, not {partition}")
        return f"{topic.removesuffix(RETRY_SUFFIX)}-retry"
    return partition_stream(topic, partition)


def subject(topic: str, partition: int) -> str:
    """The subject of ``topic``'s ``partition``: ``TOPIC.P`` (``T.retry.0`` for a
    retry topic)."""
    return f"{topic}.{partition}"


def offsets_key(group: str, topic: str, partition: int) -> str:
    """The KV key of a group's committed offset of a partition."""
    return f"{group}.{topic}.{partition}"


#: What a topic or group name names here (in the refusal).
WHAT_NAMES = "a NATS stream or subject token"


def check_name(what: str, name: str) -> None:
    """:raises UsageError: ``name`` is not letters, digits, ``_`` and ``-``."""
    check_plain(what, name, WHAT_NAMES)


#: What ``--bootstrap`` may carry beside the servers (:mod:`htmqc.sources.tls`;
#: ``creds``: a NATS ``.creds`` file, a user JWT and its NKey seed).
QUERY_PARAMS = (*TLS_PARAMS, "creds")
_HINT = "pass nats://HOST:PORT (tls://... for TLS)"


@dataclass(frozen=True)
class NatsAddress:
    """``--bootstrap`` for nats-py: the server URLs (userinfo kept: nats-py reads
    ``user:password@`` and ``token@`` from them; query removed) and the
    keyword arguments of ``nats.connect`` for TLS and a ``.creds`` file."""

    servers: tuple[str, ...]
    options: Mapping[str, Any]

    @property
    def credentials(self) -> bool:
        """Whether the address carries credentials (userinfo or a creds file)."""
        return "user_credentials" in self.options or any(
            "@" in urlsplit(s).netloc for s in self.servers
        )


def address_of(bootstrap: str) -> NatsAddress:
    """``--bootstrap`` (comma-separated URLs; ``nats://`` added when no scheme is
    given) as a :class:`NatsAddress`. TLS is on when a URL is ``tls://`` or names
    ``ca``, ``cert`` or ``key``; the server's certificate is then always verified.

    :raises UsageError: empty, a scheme other than ``nats``, ``tls``, ``ws``,
        ``wss``, an unknown query parameter, or a TLS file that cannot be read.
    """
    servers: list[str] = []
    params: dict[str, str] = {}
    tls = False
    for part in (p.strip() for p in bootstrap.split(",")):
        if not part:
            continue
        scheme, sep, _rest = part.partition("://")
        if not sep:
            part, scheme = f"nats://{part}", "nats"
        elif scheme not in {"nats", "tls", "ws", "wss"}:
            raise UsageError(f"--bootstrap {part!r} is not a NATS URL", _HINT)
        url = urlsplit(part)
        for key, value in query_of(url.query, QUERY_PARAMS, part).items():
            if params.setdefault(key, value) != value:
                raise UsageError(
                    f"--bootstrap gives {key!r} twice ({params[key]!r} and {value!r})",
                    f"give {key} once",
                )
        tls = tls or scheme in {"tls", "wss"}
        servers.append(urlunsplit(url._replace(query="")))
    if not servers:
        raise UsageError("--bootstrap is empty", _HINT)
    options: dict[str, Any] = {}
    if tls or any(k in params for k in TLS_PARAMS):
        options["tls"] = client_context(params)
        servers = [s.replace("nats://", "tls://", 1) for s in servers]
    if "creds" in params:
        if not os.path.isfile(params["creds"]):
            raise UsageError(
                f"cannot read the NATS credentials file {params['creds']}",
                "pass creds= the .creds file of the NATS user",
            )
        if importlib.util.find_spec("nkeys") is None:  # nats-py signs the nonce with it
            raise UsageError(
                "creds= needs the Python package nkeys, which is not installed",
                "pip install 'htmqc[nats]' (it brings nats-py[nkeys])",
            )
        options["user_credentials"] = params["creds"]
    return NatsAddress(tuple(servers), options)


# -- messages -------------------------------------------------------------------------------


class NatsMessage(LogMessage):
    """A consumed JetStream message: ``offset()`` is the stream sequence minus
    one; ``timestamp()`` the server's store time."""

    __slots__ = ()


def sequence_and_time(reply: str) -> tuple[int, int]:
    """``(stream sequence, store time in ms)`` from a JetStream ack subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>``, or
    the longer form with domain and account hash).

    :raises ValueError: not an ack subject.
    """
    tokens = reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5]), int(tokens[7]) // 1_000_000
    if len(tokens) >= 11 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[7]), int(tokens[9]) // 1_000_000
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


def consumer_sequence(reply: str) -> int:
    """The consumer sequence (deliveries so far) of a JetStream ack subject.

    :raises ValueError: not an ack subject."""
    tokens = reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[6])
    if len(tokens) >= 11 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[8])
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


def convert(topic: str, partition: int, msg: Any) -> NatsMessage:
    """A nats-py JetStream message as a :class:`NatsMessage`."""
    seq, ts = sequence_and_time(msg.reply)
    raw = msg.headers
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    if raw:
        headers = []
        for name, value in raw.items():
            if name == KEY_HEADER:
                key = value.encode()
            else:
                headers.append((name, value.encode()))
    return NatsMessage(topic, partition, seq - 1, key, msg.data, headers, ts)


# -- the consumer -----------------------------------------------------------------------------


class NatsConsumer(PumpedConsumer):
    """The blocking :class:`~htmqc.ports.ConsumerPort` over JetStream (module docs).

    ``bootstrap``: NATS URL(s); ``group``: the name commits are stored under;
    ``on_commit(err, partitions)``: the outcome of each asynchronous commit,
    called on the thread that calls :meth:`consume`.

    :raises RuntimeFailure: the server cannot be reached within ``connect_seconds``.
    """

    SOURCE, OPTION = "NATS", "nats"
    NAMES = WHAT_NAMES

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        on_commit: CommitCallback | None = None,
        connect_seconds: float = 10.0,
        fetch_batch: int = FETCH_BATCH,
        buffer_messages: int = BUFFER_MESSAGES,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        check_name("group", group)
        super().__init__(
            group,
            on_commit=on_commit,
            fetch_batch=fetch_batch,
            buffer_messages=buffer_messages,
            thread_name="htmqc-nats",
        )
        self.lease_seconds = lease_seconds
        self.member = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: The lease's revision while held.
        self._lease_revision: int | None = None
        self.address = address_of(bootstrap)
        self._kv: Any = None
        try:
            self._nc: Any = self._call(self._connect(connect_seconds), connect_seconds + 5)
        except BaseException:
            self._stop_loop()
            raise
        self._js: Any = self._nc.jetstream()

    def _lost_lease(self) -> RuntimeFailure:
        return RuntimeFailure(
            f"another member took the NATS lease of group {self.group!r} "
            f"({self._lease_key}): this one could not renew it in time",
            "run one member per group; restart this one to wait as a standby",
        )

    # -- the NATS thread ----------------------------------------------------------------------

    async def _connect(self, seconds: float) -> Any:
        self._commit_lock = asyncio.Lock()
        return await connect(
            self.address, seconds, disconnected_cb=self._disconnected, reconnected_cb=_reconnected
        )

    # -- topics -------------------------------------------------------------------------------

    def _stream(self, topic: str, partition: int) -> str:
        return stream_name(topic, partition)

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has: streams ``TOPIC-0``, ``TOPIC-1``, ...
        that exist, counted from 0 up to the first missing one."""
        return self._call(_count_partitions(self._js, topic))

    # -- coroutines (NATS thread) --------------------------------------------------------------

    async def _session(self, part: _Partition, generation: int) -> None:
        """One pull consumer's life (see :meth:`_pump`): pull requests of up to
        :attr:`fetch_batch` messages (each lingering :data:`FETCH_WAIT` seconds on an
        idle partition) while the buffer has room and the partition is not paused.

        :raises RuntimeError: the server ended the consumer or refused a pull.
        """
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        assert part.wake is not None
        stream = stream_name(part.topic, part.partition)
        arrived: list[Any] = []
        event = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            arrived.append(msg)
            event.set()

        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=on_msg)
        name: str | None = None
        try:
            received = 0  # the consumer sequence of the last delivery taken
            fetched = -1  # the next offset this session expects (once its consumer exists)
            while self._current(part, generation):
                with self._cond:
                    idle = part.idle = part.paused or len(part.buffer) >= self.buffer_messages
                    start, room = part.position, self.buffer_messages - len(part.buffer)
                    if idle:
                        part.wake.clear()
                if idle:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(part.wake.wait(), 0.5)
                    continue
                if start is None:
                    start = await self._start_of(part)
                    with self._cond:
                        if not self._current(part, generation):
                            return
                        if part.position is None:
                            part.position = start
                if name is None:
                    info = await self._js.add_consumer(
                        stream,
                        config=ConsumerConfig(
                            ack_policy=AckPolicy.NONE,
                            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                            opt_start_seq=start + 1,
                            inactive_threshold=INACTIVE_THRESHOLD,
                            max_waiting=16,
                        ),
                    )
                    name = str(info.name)
                    fetched = start
                want = max(1, min(self.fetch_batch, room))
                request = {"batch": want, "expires": int(FETCH_WAIT * 1e9)}
                await self._nc.publish(
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                    json.dumps(request).encode(),
                    reply=inbox,
                )
                got = 0
                ended = False
                deadline = time.monotonic() + FETCH_WAIT + 2.0
                while got < want and not ended and self._current(part, generation):
                    if not arrived:
                        event.clear()
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break  # the request was lost (a reconnect): ask again
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(event.wait(), left)
                        continue
                    batch = arrived.copy()
                    arrived.clear()
                    out: list[NatsMessage] = []
                    last = None
                    for msg in batch:
                        if not msg.reply:  # a status (JetStream data has an ack subject)
                            ended = _request_ended(msg.headers or {}) or ended
                            continue
                        last = msg
                        converted = convert(part.topic, part.partition, msg)
                        if converted.offset() < fetched:
                            continue  # delivered again (the server lost the cursor)
                        fetched = converted.offset() + 1
                        out.append(converted)
                    if last is None:
                        continue
                    got += len(out)
                    received = consumer_sequence(last.reply)
                    with self._cond:
                        if not self._current(part, generation):
                            return
                        part.buffer.extend(out)
                        self._cond.notify_all()
                if got == 0 and ended:
                    await self._past_deleted_tail(part, generation, stream, name, received)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if name is not None:
                with contextlib.suppress(Exception):
                    await self._js.delete_consumer(stream, name)

    async def _past_deleted_tail(
        self, part: _Partition, generation: int, stream: str, name: str, received: int
    ) -> None:
        """An idle partition whose last messages were deleted: move its position to
        the log end (``last_seq``), as librdkafka's position moves past records it
        never hands out (transaction markers), so the core sees the gap
        (``Engine.report_gaps``) and the watermark can reach the end.

        Only if nothing was missed: ``last_seq`` is read first; then the pull
        consumer ``name`` says nothing is pending and it made exactly the
        ``received`` deliveries the pump took (all handed out: the buffer is
        empty). Every sequence up to ``last_seq`` that was not handed out was
        therefore deleted or purged."""
        with self._cond:
            position = part.position
            if position is None or part.buffer or not self._current(part, generation):
                return
        last = (await self._watermarks_of((part.topic, part.partition)))[1]
        if last <= position:
            return
        info = await self._js.consumer_info(stream, name)
        if info.num_pending or int(info.delivered.consumer_seq or 0) != received:
            return
        with self._cond:
            if self._current(part, generation) and not part.buffer and part.position == position:
                part.position = last

    async def _hold_lease(self, parts: list[KafkaTP]) -> None:
        """Take the group's lease (waiting while another member holds it), then
        hand ``parts`` to the next :meth:`consume` and renew the lease every
        quarter of its life until :meth:`close`. A renewal refused because the
        lease moved on sets :attr:`_lease_lost`."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        key = self._lease_key
        assert key is not None
        value = json.dumps({"member": self.member}).encode()
        waited = False
        revision = None
        while revision is None and not self._closed:
            try:
                kv = await leases_bucket(self._js, self.lease_seconds)
                revision = await kv.create(key, value)
            except KeyWrongLastSequenceError:
                if not waited:
                    holder = "another member"
                    with contextlib.suppress(KeyNotFoundError, ValueError, KeyError):
                        entry = await kv.get(key)
                        holder = json.loads(entry.value or b"{}")["member"]
                    log.warning(
                        "group %s on topic %s is held by %s; waiting as a standby (it takes "
                        "over when that member stops, or %g s after it died)",
                        self.group, key.split(".", 1)[1], holder, self.lease_seconds,
                    )
                    waited = True
                await asyncio.sleep(0.5)
            except Exception as exc:
                log.warning("taking the NATS lease %s failed: %s: %s", key, type(exc).__name__, exc)
                await asyncio.sleep(1.0)
        if revision is None:
            return
        if waited:
            log.info("took the lease of group %s (%s)", self.group, key)
        with self._cond:
            self._lease_revision = revision
            self._lease_until = time.monotonic() + 0.8 * self.lease_seconds
            self._to_assign = parts
            self._cond.notify_all()
        failures = 0
        while not self._closed:
            await asyncio.sleep(self.lease_seconds / 4)
            if self._closed:
                return
            try:
                kv = await leases_bucket(self._js, self.lease_seconds)
                renewed = await _renew(kv, key, value, revision)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("renewing the NATS lease %s failed: %s", key, type(exc).__name__)
                continue
            if failures:
                log.info("renewed the NATS lease %s again", key)
            failures = 0
            with self._cond:
                if renewed is None:
                    self._lease_lost = True
                    self._lease_until = 0.0
                    self._cond.notify_all()
                    return
                revision = self._lease_revision = renewed
                self._lease_until = time.monotonic() + 0.8 * self.lease_seconds

    async def _watermarks_of(self, tp: TP) -> tuple[int, int]:
        info = await self._js.stream_info(stream_name(*tp))
        state = info.state
        marks = (max(int(state.first_seq or 0), 1) - 1, int(state.last_seq or 0))
        self._watermarks[tp] = marks
        return marks

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await offsets_bucket(self._js)
        return self._kv

    async def _read_commits(self, tps: Iterable[TP]) -> dict[TP, tuple[int, str | None]]:
        from nats.js.errors import KeyNotFoundError

        kv = await self._bucket()
        out: dict[TP, tuple[int, str | None]] = {}
        for tp in tps:
            try:
                entry = await kv.get(offsets_key(self.group, *tp))
            except KeyNotFoundError:
                continue
            if entry.value:
                stored = json.loads(entry.value)
                out[tp] = (int(stored["offset"]), stored.get("metadata"))
        return out

    async def _store_commits(self, parts: Sequence[KafkaTP]) -> None:
        assert self._commit_lock is not None
        async with self._commit_lock:  # FIFO: commits are stored in the order asked
            kv = await self._bucket()
            for p in parts:
                value = json.dumps({"offset": p.offset, "metadata": p.metadata})
                await kv.put(offsets_key(self.group, p.topic, p.partition), value.encode())

    async def _disconnected(self) -> None:
        if not self._closed:
            log.warning("disconnected from NATS; reconnecting")

    async def _close(self) -> None:
        pumps = list(self._pumps)
        for task in pumps:
            task.cancel()  # pumps delete their pull consumers on the way out
        if pumps:
            await asyncio.wait(pumps, timeout=3)
        revision, key = self._lease_revision, self._lease_key
        if revision is not None and key is not None and not self._lease_lost:
            with contextlib.suppress(Exception):  # a standby takes over at once
                kv = await leases_bucket(self._js, self.lease_seconds)
                await kv.delete(key, last=revision)
        with contextlib.suppress(Exception):
            await self._nc.drain()
        with contextlib.suppress(Exception):
            await self._nc.close()



def _request_ended(headers: dict[str, str]) -> bool:
    """Whether a status message ends the pull request it answers: ``100`` (a
    heartbeat) does not; ``404`` (no messages), ``408`` (expired) and ``409``
    (e.g. too many waiting requests) do.

    :raises RuntimeError: the consumer was deleted, or any other status."""
    code = headers.get("Status", "")
    if code == "100":
        return False
    if code in ("404", "408"):
        return True
    description = headers.get("Description", "")
    if code == "409" and "deleted" not in description.lower():
        return True
    raise RuntimeError(f"pull request answered {code} {description}".strip())


async def connect(address: NatsAddress, seconds: float, **callbacks: Any) -> Any:
    """A nats-py connection to ``address``, tried for ``seconds`` at most; once up
    it reconnects for ever (nats-py's own reconnect loop). ``callbacks``: nats-py's
    ``disconnected_cb`` and the like.

    :raises RuntimeFailure: no server answered in time, or one refused the
        credentials or the TLS handshake (at once: trying again cannot help).
    """
    import nats

    deadline = time.monotonic() + seconds
    where = ", ".join(_without_userinfo(s) for s in address.servers)
    while True:
        left = deadline - time.monotonic()
        # A refusal reaches nats-py's error_cb while its connect goes on retrying:
        # it ends the wait at once (another try cannot cure it).
        refusal = asyncio.get_running_loop().create_future()

        async def error(exc: Exception, refusal: asyncio.Future[str] = refusal) -> None:
            reason = _refusal(exc, address.credentials)
            if reason and not refusal.done():  # once connected, no one reads it
                refusal.set_result(reason)
            await _quiet(exc)

        # Bounded: nats-py's first connect retries as long as its reconnects do.
        attempt = asyncio.ensure_future(
            nats.connect(
                servers=list(address.servers),
                connect_timeout=max(0.2, min(2.0, left)),
                allow_reconnect=True,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=error,
                **address.options,
                **callbacks,
            )
        )
        await asyncio.wait({attempt, refusal}, timeout=max(1.0, left + 1.0),
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
            nc = attempt.result()
            nc.options["max_reconnect_attempts"] = -1  # connected: reconnect for ever
            nc.options["reconnect_time_wait"] = 0.5
            return nc
        attempt.cancel()
        last = "timed out"
        if attempt.done() and not attempt.cancelled():
            exc = attempt.exception()
            assert exc is not None
            last = type(exc).__name__
            reason = _refusal(exc, address.credentials)
            if reason and not refusal.done():
                refusal.set_result(reason)
        if refusal.done():
            # Let the cancelled connect and its refused transports close before the
            # caller stops this loop (else they are collected unclosed).
            await asyncio.wait({attempt}, timeout=1.0)
            await asyncio.sleep(0.05)
            reason = refusal.result()
            raise RuntimeFailure(f"NATS at {where} {reason}", _REFUSAL_HINTS[reason])
        if time.monotonic() >= deadline:
            raise RuntimeFailure(
                f"cannot reach NATS at {where}: {last}",
                "check --bootstrap and that nats-server runs with JetStream (-js)",
            )
        await asyncio.sleep(0.2)


_REFUSAL_HINTS = {
    "refused the credentials": "check the user:password@ or token@ in --bootstrap, or its creds=",
    "asks for credentials": "put user:password@ or token@ in --bootstrap, or pass creds=FILE",
    "requires TLS": "use tls://HOST:PORT (and ca= for a private authority)",
    **TLS_REFUSALS,
}


def _refusal(exc: BaseException, credentials: bool) -> str:
    """Why a server refused this client for good (a key of :data:`_REFUSAL_HINTS`),
    or ``""`` for what another try may cure (nothing listening, a timeout)."""
    tls = tls_refusal(exc)
    if tls:
        return tls
    text = str(exc).lower()
    if "authorization violation" in text or "authentication" in text:
        return "refused the credentials" if credentials else "asks for credentials"
    if "tls required" in text:
        return "requires TLS"
    return ""


def _without_userinfo(server: str) -> str:
    """A server URL as shown in messages: its userinfo (a password or token) dropped."""
    url = urlsplit(server)
    return urlunsplit(url._replace(netloc=url.netloc.rpartition("@")[2]))


class _NoEofNote(logging.Filter):
    """asyncio's ``returning true from eof_received() has no effect when using
    ssl``: logged each time a TLS server closes on nats-py (a refused client, a
    server stopping); it says nothing to a user and would follow a one-line error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("returning true from eof_received()")


logging.getLogger("asyncio").addFilter(_NoEofNote())


async def _quiet(exc: Exception) -> None:
    log.debug("nats: %s: %s", type(exc).__name__, exc)


async def _reconnected() -> None:
    log.info("reconnected to NATS")


async def _count_partitions(js: Any, topic: str) -> int:
    from nats.js.errors import NotFoundError

    count = 0
    while True:
        try:
            await js.stream_info(stream_name(topic, count))
        except NotFoundError:
            return count
        count += 1
        if topic.endswith(RETRY_SUFFIX):
            return count  # one partition


async def _renew(kv: Any, key: str, value: bytes, revision: int) -> int | None:
    """Renew the lease ``key`` held at ``revision``: its new revision, or ``None``
    if another member holds it now. A lease that expired or vanished (a server
    restart, an outage longer than its life) and that nobody took meanwhile is
    taken again; one whose last renewal's answer was lost (the value is ours) is
    kept at the revision found."""
    from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

    try:
        return int(await kv.update(key, value, last=revision))
    except KeyWrongLastSequenceError:
        pass
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        try:
            return int(await kv.create(key, value))
        except KeyWrongLastSequenceError:
            return None
    return int(entry.revision) if entry.value == value else None


async def leases_bucket(js: Any, ttl: float = LEASE_SECONDS) -> Any:
    """The KV bucket of membership leases (created if missing: file storage,
    one value per key, entries expire after ``ttl`` seconds without renewal)."""
    from nats.js.errors import BucketNotFoundError

    try:
        return await js.key_value(LEASES_BUCKET)
    except BucketNotFoundError:
        from nats.js.api import KeyValueConfig, StorageType

        with contextlib.suppress(Exception):
            await js.create_key_value(
                KeyValueConfig(
                    bucket=LEASES_BUCKET, history=1, ttl=ttl, storage=StorageType.FILE
                )
            )
        return await js.key_value(LEASES_BUCKET)


async def offsets_bucket(js: Any) -> Any:
    """The KV bucket of at-least-once commits (created if missing, file storage,
    one value per key)."""
    from nats.js.errors import BucketNotFoundError

    try:
        return await js.key_value(OFFSETS_BUCKET)
    except BucketNotFoundError:
        from nats.js.api import KeyValueConfig

        with contextlib.suppress(Exception):
            await js.create_key_value(KeyValueConfig(bucket=OFFSETS_BUCKET, history=1))
        return await js.key_value(OFFSETS_BUCKET)


# -- topics, producing, dead letters -------------------------------------------------------------


class NatsClient:
    """A blocking NATS connection on a private asyncio thread (admin, producing)."""

    def __init__(self, bootstrap: str, connect_seconds: float = 10.0) -> None:

        address = address_of(bootstrap)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="htmqc-nats-client", daemon=True
        )
        self._thread.start()

        try:
            self.nc: Any = self.call(connect(address, connect_seconds), connect_seconds + 5)
        except BaseException:
            stop_loop(self._loop, self._thread)
            raise
        self.js: Any = self.nc.jetstream()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the client's thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coro`` on the client's thread; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def partitions(self, topic: str) -> int:
        """Partitions of ``topic`` (see :meth:`NatsConsumer.partitions`)."""
        return self.call(_count_partitions(self.js, topic))

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create streams ``TOPIC-0`` .. for ``partitions`` (file storage, one
        subject each); existing ones are kept."""
        check_name("topic", topic)
        self._create_streams(topic, partitions)

    def create_retry_topic(self, topic: str) -> str:
        """Create ``topic``'s retry topic ``TOPIC.retry`` (``--retry-topic``): one
        partition, like Kafka's, the stream ``TOPIC-retry`` with the subject
        ``TOPIC.retry.0`` (kept if it exists); its name."""
        check_name("topic", topic)
        self._create_streams(retry_topic(topic), 1)
        return retry_topic(topic)

    def _create_streams(self, topic: str, partitions: int) -> None:
        async def create() -> None:
            from nats.js.api import StorageType, StreamConfig

            for p in range(partitions):
                with contextlib.suppress(Exception):
                    await self.js.stream_info(stream_name(topic, p))
                    continue
                await self.js.add_stream(
                    StreamConfig(
                        name=stream_name(topic, p),
                        subjects=[subject(topic, p)],
                        storage=StorageType.FILE,
                    )
                )

        self.call(create())

    def delete_message(self, topic: str, partition: int, offset: int) -> None:
        """Delete the message at ``offset`` (a hole: a gap for readers)."""
        self.call(self.js.delete_msg(stream_name(topic, partition), offset + 1))

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, high)`` of a partition (:meth:`NatsConsumer.get_watermark_offsets`)."""

        async def get() -> tuple[int, int]:
            state = (await self.js.stream_info(stream_name(topic, partition))).state
            return max(int(state.first_seq or 0), 1) - 1, int(state.last_seq or 0)

        return self.call(get())

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition (at-least-once), or ``None``."""
        from nats.js.errors import KeyNotFoundError

        async def get() -> int | None:
            kv = await offsets_bucket(self.js)
            try:
                entry = await kv.get(offsets_key(group, topic, partition))
            except KeyNotFoundError:
                return None
            return int(json.loads(entry.value)["offset"]) if entry.value else None

        return self.call(get())

    def publish_many(
        self, records: Iterable[tuple[str, bytes, dict[str, str] | None]], window: int = 1000
    ) -> int:
        """Publish ``(subject, payload, headers)`` records and wait for every
        JetStream ack (``window`` acks outstanding at most); return the count."""

        async def run() -> int:
            pending: deque[asyncio.Future[Any]] = deque()
            n = 0
            for subj, payload, headers in records:
                pending.append(asyncio.ensure_future(
                    self.js.publish(subj, payload, headers=headers)
                ))
                n += 1
                if len(pending) >= window:
                    await pending.popleft()
            for fut in pending:
                await fut
            return n

        return self.call(run(), 600)

    def close(self) -> None:
        """Drain and close the connection, stop the thread."""
        with contextlib.suppress(Exception):
            self.call(self.nc.drain(), 10)
        stop_loop(self._loop, self._thread)


def _publish_numbered(
    nc: NatsClient, topic: str, partitions: int, messages: Iterable[Numbered]
) -> int:
    """:data:`produce`'s messages, the id and key as headers, to their subjects."""
    from htmqc.produce import ID_HEADER

    def records() -> Iterable[tuple[str, bytes, dict[str, str] | None]]:
        for m in messages:
            headers = {ID_HEADER: str(m.id)}
            if m.key is not None:
                headers[KEY_HEADER] = m.key.decode()
            yield subject(topic, m.partition), m.value, headers

    return nc.publish_many(records())


#: ``produce(bootstrap, topic, count, *, partitions, keys=100, size=100, start_id=0,
#: client=None)``: numbered test messages to a topic's streams, created if missing
#: (:class:`~htmqc.sources.pumped.NumberedProducer`).
produce = NumberedProducer(NatsClient, _publish_numbered)


def _header_text(value: bytes | None) -> str:
    """A header value NATS can carry (one line of text)."""
    text = (value or b"").decode("utf-8", "backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n")


class NatsProducer(Deliveries):
    """The dead-letter and retry producer of a NATS source
    (:class:`~htmqc.ports.ProducerPort`): ``produce(TOPIC.dlq, ...)`` publishes to the
    subject ``TOPIC.dlq`` (or ``TOPIC.dlq.poison``), stored by the stream
    ``TOPIC-dlq`` (created if missing), ``produce(TOPIC.retry, ...)`` to
    ``TOPIC.retry.0`` (:meth:`NatsClient.create_retry_topic`); ``flush`` waits for the
    JetStream acks."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from htmqc.dlq.record import dlq_topic, poison_topic

        super().__init__()
        self.client = NatsClient(bootstrap)
        subjects = [dlq_topic(topic), poison_topic(topic)]

        async def ensure() -> None:
            from nats.js.api import StorageType, StreamConfig

            try:
                await self.client.js.stream_info(f"{topic}-dlq")
            except Exception:
                await self.client.js.add_stream(
                    StreamConfig(name=f"{topic}-dlq", subjects=subjects, storage=StorageType.FILE)
                )

        self.client.call(ensure())

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """Publish ``value`` (``key``, ``headers``) to the subject ``topic`` (a retry
        topic: its one partition's subject, ``TOPIC.retry.0``); ``on_delivery(err,
        None)`` once acked."""
        if topic.endswith(RETRY_SUFFIX):
            topic = subject(topic, 0)
        value = kwargs.get("value", args[0] if args else None)
        key = kwargs.get("key")
        headers = {name: _header_text(v) for name, v in (kwargs.get("headers") or [])}
        if key is not None:
            headers[KEY_HEADER] = _header_text(key)
        future = self.client.submit(self.client.js.publish(topic, value or b"", headers=headers))
        self.track(future, kwargs.get("on_delivery"))

    def close(self) -> None:
        """Close the connection."""
        self.client.close()
