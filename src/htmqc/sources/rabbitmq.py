"""RabbitMQ Streams as a source: :class:`RabbitStreamConsumer` implements
:class:`~htmqc.ports.ConsumerPort` (through :class:`~htmqc.sources.pumped.PumpedConsumer`,
as the NATS adapter does), so the same core and runtime drive it.

Theory of operation
-------------------
*What maps to what.* A htmqc "topic" ``T`` with ``N`` partitions is ``N`` RabbitMQ
streams ``T-0`` .. ``T-(N-1)`` (:func:`stream_name`, the NATS adapter's scheme).
RabbitMQ 3.10 (Debian's) has no super streams and no single active consumer
(both 3.11), so partitions are plain streams and one member consumes a topic.
A message's **offset** is its stream offset: dense, from 0, increasing in
delivery order. Retention (``max-length-bytes``, ``max-age``) deletes whole
segments from the head: the first offset moves forward, and a reader that
asks for an offset no longer stored starts at the first one stored: the core
sees a gap (nothing to run). Watermarks: ``low`` is the first stored offset,
``high`` one past the last (:func:`watermarks`, read by two short-lived
subscriptions, since 3.10's stream protocol has no stream statistics; a stream
never written is ``(0, 0)``).

*Fetching.* Each assigned, unpaused partition has a pump (a *session*) on the
adapter's asyncio thread (rstream is asyncio): one subscription from the
partition's position (``OffsetType.OFFSET``; rstream drops the chunk's messages
below it) whose callback puts each message into the partition's bounded buffer,
waiting while it is full or paused (the server's credit is granted per chunk,
so a waiting callback stops the flow). ``seek`` ends the session and starts one
at the new offset. A subscription whose connection died ends its session; a new
one starts from the position.

*Commits (at-least-once).* A commit stores the watermark with the stream
protocol's offset tracking (``store_offset`` under the reference
:func:`offsets_reference` of the group) and waits until ``query_offset`` reads
it back (a store is not answered by the server); ``committed`` reads it with
``query_offset``. Offset tracking holds one number per stream and reference:
the commit's metadata (work finished above the watermark,
:mod:`htmqc.sinks.encoding`) is not kept, so after a restart the messages
finished above the watermark run again, which at-least-once allows (the NATS
adapter keeps them, in its KV bucket).

*Exactly-once.* Positions come from the sink (its claim, then ``seek``), as with
Kafka and NATS; offset tracking is not used.

*Group membership.* One member of a group consumes a topic: it holds a *lease*,
the exclusive AMQP 0-9-1 queue ``htmqc.lease.GROUP.TOPIC`` declared on its own
AMQP connection (``pika``). A second member is refused the queue
(``RESOURCE_LOCKED``) and waits as a standby, declaring it again every
:data:`STANDBY_POLL` s. The broker deletes an exclusive queue when its
connection closes: ``close``, a crash and a SIGKILL (the kernel closes the
socket) hand the lease over at once; a member that hangs loses it after two
missed heartbeats (:data:`LEASE_HEARTBEAT`). A member whose lease connection
closes stops (``consume`` raises): another may hold the lease now.
Exactly-once, the sink's fence is what makes a stale member harmless.

Every offset *decision* stays in the core: this module reads stream offsets,
keeps each partition's fetch position and stores the commits it is given.

Keys and headers: the key is the AMQP application property :data:`KEY_PROPERTY`;
other application properties are handed on as ``(name, bytes)`` headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.dlq.record import retry_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sources.pumped import (
    CALL_TIMEOUT,
    RETRY_SUFFIX,
    TP,
    Deliveries,
    LogMessage,
    Numbered,
    NumberedProducer,
    PumpedConsumer,
    _Partition,
    check_plain,
    stop_loop,
)
from htmqc.sources.pumped import stream_name as stream_name
from htmqc.sources.tls import TLS_PARAMS, TLS_REFUSALS, client_context, query_of, tls_refusal

log = logging.getLogger("htmqc.rabbitmq")

T = TypeVar("T")

#: The ``--bootstrap`` scheme.
SCHEME = "rabbitmq-stream"
#: The scheme of a node's TLS stream port.
TLS_SCHEME = "rabbitmq-stream+tls"
#: Default ports: the stream protocol, AMQP 0-9-1 (the lease).
STREAM_PORT, AMQP_PORT = 5552, 5672
#: RabbitMQ's default TLS ports (stream, AMQP).
STREAMS_PORT, AMQPS_PORT = 5551, 5671
#: The application property that carries a message's key.
KEY_PROPERTY = "Htmqc-Key"
#: Seconds a start-up probe of the login waits, and one for a TLS alert after it.
PROBE_SECONDS, ALERT_SECONDS = 2.0, 1.0
#: Seconds between a standby's attempts to take the lease.
STANDBY_POLL = 0.5
#: AMQP heartbeat of the lease connection (s): a hung member loses the lease after two.
LEASE_HEARTBEAT = 5
#: Seconds a watermark probe waits for a stream's first message (none: empty).
PROBE_WAIT = 0.5
#: Seconds between two background refreshes of a partition's cached watermarks.
WATERMARK_REFRESH = 2.0


def offsets_reference(group: str) -> str:
    """The offset-tracking reference of a group's at-least-once commits."""
    return f"htmqc.{group}"


def lease_queue(group: str, topic: str) -> str:
    """The exclusive AMQP queue whose holder consumes ``topic`` for ``group``."""
    return f"htmqc.lease.{group}.{topic}"


#: What a topic or group name names here (in the refusal).
WHAT_NAMES = "a RabbitMQ stream"


def check_name(what: str, name: str) -> None:
    """:raises UsageError: ``name`` is not letters, digits, ``_`` and ``-``."""
    check_plain(what, name, WHAT_NAMES)


@dataclass(frozen=True)
class Endpoint:
    """Where a node is: ``rabbitmq-stream[+tls]://[USER:PASSWORD@]HOST[:PORT][/VHOST]``
    with ``?amqp-port=N`` and, over TLS, ``ca=``, ``cert=``, ``key=``
    (:mod:`htmqc.sources.tls`); ``tls`` is the client context then, for the
    stream and the lease's AMQP connections alike."""

    host: str
    port: int = STREAM_PORT
    amqp_port: int = AMQP_PORT
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    tls: ssl.SSLContext | None = None


def endpoint_of(bootstrap: str) -> Endpoint:
    """``--bootstrap`` as an :class:`Endpoint`. ``rabbitmq-stream+tls://`` is TLS
    (default ports 5551 and 5671), the server's certificate and host name verified.

    :raises UsageError: another scheme, no host, a port that is not a number, an
        unknown parameter, TLS files without ``+tls``, or one that cannot be read."""
    hint = f"pass {SCHEME}://HOST:PORT (or {TLS_SCHEME}://HOST:PORT?ca=FILE)"
    if not bootstrap.strip():
        raise UsageError("--bootstrap is empty", hint)
    tls = bootstrap.startswith(f"{TLS_SCHEME}://")
    if not tls and not bootstrap.startswith(f"{SCHEME}://"):
        raise UsageError(f"--bootstrap {bootstrap!r} is not a RabbitMQ stream URL", hint)
    url = urlsplit(bootstrap)
    query = query_of(url.query, ("amqp-port", *TLS_PARAMS), bootstrap)
    try:
        amqp = int(query.get("amqp-port", AMQPS_PORT if tls else AMQP_PORT))
        port = url.port or (STREAMS_PORT if tls else STREAM_PORT)
    except ValueError:
        raise UsageError(f"--bootstrap {bootstrap!r} has a bad port", hint) from None
    if not url.hostname:
        raise UsageError(f"--bootstrap {bootstrap!r} names no host", hint)
    if not tls and any(k in query for k in TLS_PARAMS):
        raise UsageError(
            f"--bootstrap gives TLS files ({', '.join(k for k in TLS_PARAMS if k in query)}) "
            f"to a plain {SCHEME}:// URL",
            f"use {TLS_SCHEME}://HOST:PORT (the node's TLS stream port, 5551 by default)",
        )
    vhost = unquote(url.path[1:]) if len(url.path) > 1 else "/"
    return Endpoint(
        url.hostname, port, amqp, unquote(url.username or "guest"),
        unquote(url.password or "guest"), vhost, client_context(query) if tls else None,
    )  # fmt: skip


# -- messages -------------------------------------------------------------------------------


class RabbitMessage(LogMessage):
    """A consumed stream message: ``offset()`` is the stream offset; ``timestamp()``
    the chunk's store time."""

    __slots__ = ()


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (list, tuple)):
        return b"".join(_bytes(v) for v in value)
    return str(value).encode()


def convert(topic: str, partition: int, offset: int, timestamp: int, msg: Any) -> RabbitMessage:
    """An rstream AMQP 1.0 message (``amqp_decoder``'s) as a :class:`RabbitMessage`."""
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    props = msg.application_properties
    if props:
        headers = []
        for name, value in props.items():
            text = name.decode() if isinstance(name, bytes) else str(name)
            if text == KEY_PROPERTY:
                key = _bytes(value)
            else:
                headers.append((text, _bytes(value)))
    return RabbitMessage(topic, partition, offset, key, _bytes(msg.body), headers, timestamp)


def outgoing(value: bytes, key: bytes | None, headers: Iterable[tuple[str, bytes | None]]) -> Any:
    """An AMQP 1.0 message to publish (key and headers as application properties)."""
    from rstream import AMQPMessage

    props: dict[str, bytes] = {name: v or b"" for name, v in headers}
    if key is not None:
        props[KEY_PROPERTY] = key
    return AMQPMessage(body=value, application_properties=props or None)


# -- the stream protocol ----------------------------------------------------------------------


async def connect(endpoint: Endpoint, seconds: float) -> Any:
    """An rstream ``Consumer`` whose locator connection is up, tried for ``seconds``.

    :raises RuntimeFailure: the node did not answer in time, or it refused the
        credentials or the TLS handshake (at once: another try cannot help)."""
    from rstream import Consumer

    deadline = time.monotonic() + seconds
    last = "timed out"
    while True:
        refused = await _refusal(endpoint, max(1.0, deadline - time.monotonic()))
        if refused:
            await asyncio.sleep(0.05)  # the refused transports close before the loop stops
            where = f"{endpoint.host}:{endpoint.port}"
            raise RuntimeFailure(f"RabbitMQ at {where} {refused}", _REFUSAL_HINTS[refused])
        consumer = Consumer(
            endpoint.host, endpoint.port, username=endpoint.user, password=endpoint.password,
            vhost=endpoint.vhost, connection_name="htmqc", ssl_context=endpoint.tls,
        )  # fmt: skip
        try:
            await asyncio.wait_for(consumer.default_client, max(1.0, deadline - time.monotonic()))
            return consumer
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}".rstrip(": ")
            with contextlib.suppress(Exception):
                await consumer.close()
        if time.monotonic() >= deadline:
            raise RuntimeFailure(
                f"cannot reach RabbitMQ's stream port at {endpoint.host}:{endpoint.port}: {last}",
                "check --bootstrap and that the node runs the rabbitmq_stream plugin",
            )
        await asyncio.sleep(0.2)


_REFUSAL_HINTS = {
    "refused the login": (
        "check the USER:PASSWORD@ and the /VHOST in --bootstrap (default guest:guest and /)"
    ),
    **TLS_REFUSALS,
}


async def _refusal(endpoint: Endpoint, seconds: float) -> str:
    """One connection and login with rstream's plain client: why the node refused
    this client for good (a key of :data:`_REFUSAL_HINTS`), else ``""``. The
    ``Consumer`` itself retries a refused login until its caller gives up, and says
    only "timed out"."""
    from rstream import exceptions
    from rstream.client import Client

    client = Client(
        endpoint.host, endpoint.port, ssl_context=endpoint.tls, frame_max=1 << 20, heartbeat=60
    )
    login: asyncio.Future[Any] | None = None
    try:
        async with asyncio.timeout(min(seconds, PROBE_SECONDS)):
            await client.start()
            login = asyncio.ensure_future(
                client.authenticate(endpoint.vhost, endpoint.user, endpoint.password)
            )
            # The node may close the connection before rstream reads its answer (a
            # refused login's answer is sometimes lost with it), and rstream's reader
            # swallows a TLS alert that follows the handshake (TLS 1.3: a client
            # certificate the node wanted); either way the login waits for ever.
            while not login.done() and client.is_connection_alive():
                await asyncio.sleep(0.02)
            if login.done():
                await login
                return ""
    except exceptions.AuthenticationFailure:
        return "refused the login"
    except TimeoutError:
        return ""  # a slow node: the consumer's own tries go on
    except Exception as exc:
        return tls_refusal(exc)
    finally:
        if login is not None:
            login.cancel()
        with contextlib.suppress(Exception):
            await client.close()
        # rstream 1.1's close leaves a broken connection's socket open: close it here.
        connection = getattr(client, "_conn", None)
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
    alert = await _tls_alert(endpoint) if endpoint.tls is not None else ""
    return alert or "refused the login"


async def _tls_alert(endpoint: Endpoint) -> str:
    """A TLS connection that says nothing: the alert a node sends right after the
    handshake, as a refusal (``""``: none within :data:`ALERT_SECONDS`)."""
    writer = None
    try:
        async with asyncio.timeout(ALERT_SECONDS):
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=endpoint.tls
            )
            await reader.read(1)
    except Exception as exc:
        return tls_refusal(exc)
    finally:
        if writer is not None:
            writer.close()
    return ""


async def count_partitions(consumer: Any, topic: str) -> int:
    """Streams ``TOPIC-0``, ``TOPIC-1``, ... that exist, up to the first missing one."""
    count = 0
    while await consumer.stream_exists(stream_name(topic, count)):
        count += 1
    return count


async def _probe(consumer: Any, stream: str, first: bool) -> int | None:
    """The first stored offset (``first``), else the last one; ``None`` if the
    stream holds nothing (no delivery within :data:`PROBE_WAIT` s)."""
    from rstream import ConsumerOffsetSpecification, OffsetType

    seen: list[int] = []
    arrived = asyncio.Event()

    def on_message(_msg: Any, ctx: Any) -> None:
        seen.append(ctx.offset)
        arrived.set()

    spec = ConsumerOffsetSpecification(OffsetType.FIRST if first else OffsetType.LAST, None)
    sid = await consumer.subscribe(stream, on_message, offset_specification=spec, initial_credit=1)
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(arrived.wait(), PROBE_WAIT)
    finally:
        with contextlib.suppress(Exception):
            await consumer.unsubscribe(sid)
    if not seen:
        return None
    # A chunk's messages are delivered in one go: the last chunk's last is its max.
    return seen[0] if first else max(seen)


async def watermarks(consumer: Any, stream: str) -> tuple[int, int]:
    """``(first stored offset, last stored offset + 1)``, ``(0, 0)`` when empty."""
    low = await _probe(consumer, stream, first=True)
    if low is None:
        return 0, 0
    last = await _probe(consumer, stream, first=False)
    return low, (low if last is None else last) + 1


async def read_commit(consumer: Any, stream: str, reference: str) -> int | None:
    """The offset stored under ``reference`` on ``stream``, or ``None`` (none
    stored, or no such stream)."""
    from rstream import OffsetNotFound, StreamDoesNotExist

    try:
        return int(await consumer.query_offset(stream, reference))
    except (OffsetNotFound, StreamDoesNotExist):
        return None


async def _cancel_the_rest() -> None:
    """Cancel the loop's other tasks (rstream's readers and heartbeats outlive a
    close) and wait for them a little: the loop stops with none pending."""
    current = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not current]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=1)


# -- the consumer -----------------------------------------------------------------------------


class RabbitStreamConsumer(PumpedConsumer):
    """The blocking :class:`~htmqc.ports.ConsumerPort` over RabbitMQ streams (module docs).

    ``bootstrap``: a ``rabbitmq-stream://`` URL (:func:`endpoint_of`); ``group``: the
    name commits and the lease are kept under; ``on_commit(err, partitions)``: the
    outcome of each asynchronous commit, called inside :meth:`consume`.

    :raises RuntimeFailure: the node cannot be reached within ``connect_seconds``.
    """

    SOURCE, OPTION = "RabbitMQ", SCHEME
    NAMES = WHAT_NAMES

    def __init__(
        self, bootstrap: str, group: str, *, connect_seconds: float = 10.0, **options: Any
    ) -> None:
        """``options``: :class:`PumpedConsumer`'s (``on_commit``, ``fetch_batch``,
        ``buffer_messages``)."""
        check_name("group", group)
        super().__init__(group, thread_name="htmqc-rabbitmq", **options)
        self.endpoint = endpoint_of(bootstrap)
        self.reference = offsets_reference(group)
        self.connect_seconds = connect_seconds
        self._lease_thread: threading.Thread | None = None
        self._refreshed: dict[TP, float] = {}
        #: Per partition: its sessions one at a time (rstream subscribes a stream once).
        self._session_locks: dict[TP, asyncio.Lock] = {}
        try:
            self._call(self._connect(), 2 * connect_seconds + 5)
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self) -> None:
        """Two rstream consumers: one for the pumps' subscriptions, one for
        watermark probes, offsets and stream look-ups."""
        self._commit_lock = asyncio.Lock()
        self._probe_lock = asyncio.Lock()
        self._rs: Any = await connect(self.endpoint, self.connect_seconds)
        try:
            self._meta: Any = await connect(self.endpoint, self.connect_seconds)
        except BaseException:
            await self._rs.close()
            raise

    def _lost_lease(self) -> RuntimeFailure:
        return RuntimeFailure(
            f"the RabbitMQ lease of group {self.group!r} ({self._lease_key}) was lost: its "
            "AMQP connection closed, so another member may hold it now",
            "restart this member: it waits as a standby while another one consumes",
        )

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has: streams ``TOPIC-0``, ... that exist."""
        return self._call(count_partitions(self._meta, topic))

    def get_watermark_offsets(
        self, partition: KafkaTP, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int] | None:
        """As :meth:`PumpedConsumer.get_watermark_offsets`; a cached read refreshes
        in the background at most every :data:`WATERMARK_REFRESH` s (a read probes
        the stream twice)."""
        tp = (partition.topic, partition.partition)
        if cached:
            now = time.monotonic()
            if now - self._refreshed.get(tp, -math.inf) >= WATERMARK_REFRESH:
                self._refreshed[tp] = now
                self._loop.call_soon_threadsafe(self._track, self._watermarks_of(tp))
            return self._watermarks.get(tp)
        return super().get_watermark_offsets(partition, timeout)

    # -- coroutines (the rstream thread) -----------------------------------------------------

    async def _session(self, part: _Partition, generation: int) -> None:
        """One subscription from the partition's position (module docs: *Fetching*),
        after the partition's previous one ended (:meth:`_subscribed`)."""
        assert part.wake is not None
        wake = part.wake
        with self._cond:
            start = part.position
        if start is None:
            start = await self._start_of(part)
            with self._cond:
                if not self._current(part, generation):
                    return
                if part.position is None:
                    part.position = start
        expected = start

        async def on_message(msg: Any, ctx: Any) -> None:
            nonlocal expected
            if ctx.offset < expected:
                return  # delivered again
            converted = convert(part.topic, part.partition, ctx.offset, ctx.timestamp, msg)
            while True:
                with self._cond:
                    if not self._current(part, generation):
                        return
                    if not part.paused and len(part.buffer) < self.buffer_messages:
                        part.buffer.append(converted)
                        expected = ctx.offset + 1
                        self._cond.notify_all()
                        return
                    part.idle = True
                    wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.5)

        tp = (part.topic, part.partition)
        async with self._session_locks.setdefault(tp, asyncio.Lock()):
            if self._current(part, generation):
                await self._subscribed(part, generation, start, on_message)

    async def _subscribed(
        self, part: _Partition, generation: int, start: int, on_message: Any
    ) -> None:
        """Subscribe ``part``'s stream at ``start`` until ``generation`` ends.

        :raises ConnectionError: the subscription's connection died."""
        from rstream import ConsumerOffsetSpecification, OffsetType, amqp_decoder

        assert part.wake is not None
        wake = part.wake
        spec = ConsumerOffsetSpecification(OffsetType.OFFSET, start)
        stream = stream_name(part.topic, part.partition)
        sid = await self._rs.subscribe(
            stream, on_message, decoder=amqp_decoder, offset_specification=spec,
            initial_credit=max(2, self.buffer_messages // 2000),
        )  # fmt: skip
        try:
            while self._current(part, generation):
                wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.5)
                client = self._rs._clients.get(stream)
                if client is not None and not client.is_connection_alive():
                    raise ConnectionError(f"the connection reading {stream} closed")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._rs.unsubscribe(sid), 5)

    async def _hold_lease(self, parts: list[KafkaTP]) -> None:
        """Start the lease thread (:meth:`_lease`): pika is blocking."""
        thread = threading.Thread(
            target=self._lease, args=(parts,), name="htmqc-rabbitmq-lease", daemon=True
        )
        self._lease_thread = thread
        thread.start()

    def _lease(self, parts: list[KafkaTP]) -> None:
        """Take the lease queue (waiting as a standby), hand ``parts`` to the next
        :meth:`consume`, then serve the connection's heartbeats until :meth:`close`;
        a closed connection sets ``_lease_lost``."""
        import pika  # type: ignore[import-untyped]
        from pika.exceptions import ChannelClosedByBroker  # type: ignore[import-untyped]

        assert self._lease_key is not None
        queue = lease_queue(self.group, self._lease_key.split(".", 1)[1])
        ep = self.endpoint
        params = pika.ConnectionParameters(
            ep.host, ep.amqp_port, ep.vhost, pika.PlainCredentials(ep.user, ep.password),
            heartbeat=LEASE_HEARTBEAT, connection_attempts=1, socket_timeout=5,
            ssl_options=pika.SSLOptions(ep.tls, ep.host) if ep.tls is not None else None,
        )  # fmt: skip
        conn: Any = None
        waited = False
        while not self._closed:
            try:
                if conn is None or not conn.is_open:
                    conn = pika.BlockingConnection(params)
                conn.channel().queue_declare(queue, exclusive=True, auto_delete=True)
                break
            except ChannelClosedByBroker as exc:
                if exc.reply_code != 405:  # RESOURCE_LOCKED: another member holds it
                    log.warning("taking the RabbitMQ lease %s failed: %s", queue, exc)
                elif not waited:
                    log.warning(
                        "group %s on topic %s is held by another member; waiting as a standby "
                        "(it takes over when that member stops or dies)",
                        self.group, self._lease_key.split(".", 1)[1],
                    )  # fmt: skip
                    waited = True
            except Exception as exc:
                log.warning("taking the RabbitMQ lease %s failed: %s: %s",
                            queue, type(exc).__name__, exc)  # fmt: skip
                conn = None
            time.sleep(STANDBY_POLL)
        try:
            if self._closed:
                return
            if waited:
                log.info("took the lease of group %s (%s)", self.group, queue)
            with self._cond:
                self._lease_until = math.inf
                self._to_assign = parts
                self._cond.notify_all()
            while not self._closed:
                conn.process_data_events(time_limit=0.2)
        except Exception as exc:
            if not self._closed:
                log.warning("the RabbitMQ lease %s was lost: %s", queue, type(exc).__name__)
                with self._cond:
                    self._lease_lost = True
                    self._lease_until = 0.0
                    self._cond.notify_all()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()  # the queue goes: a standby takes over at once

    async def _watermarks_of(self, tp: TP) -> tuple[int, int]:
        async with self._probe_lock:  # rstream subscribes a stream once at a time
            marks = await watermarks(self._meta, stream_name(*tp))
        self._watermarks[tp] = marks
        return marks

    async def _read_commits(self, tps: Iterable[TP]) -> dict[TP, tuple[int, str | None]]:
        out: dict[TP, tuple[int, str | None]] = {}
        for tp in tps:
            offset = await read_commit(self._meta, stream_name(*tp), self.reference)
            if offset is not None:
                out[tp] = (offset, None)  # one number: the metadata is not kept
        return out

    async def _store_commits(self, parts: Sequence[KafkaTP]) -> None:
        assert self._commit_lock is not None
        async with self._commit_lock:  # FIFO: commits are stored in the order asked
            for p in parts:
                stream = stream_name(p.topic, p.partition)
                await self._meta.store_offset(stream, self.reference, p.offset)
                deadline = time.monotonic() + CALL_TIMEOUT / 3
                while await read_commit(self._meta, stream, self.reference) != p.offset:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"offset {p.offset} of {stream} was not stored")
                    await asyncio.sleep(0.005)

    async def _close(self) -> None:
        # Every generation ended (close): the pumps unsubscribe and return.
        pumps = list(self._pumps)
        if pumps:
            await asyncio.wait(pumps, timeout=3)
        thread = self._lease_thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 5)
        for rs in (self._rs, self._meta):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rs.close(), 5)
        await _cancel_the_rest()


# -- topics, producing, dead letters -------------------------------------------------------------


class RabbitStreamClient:
    """A blocking stream-protocol connection on a private asyncio thread (admin,
    producing): an rstream ``Producer`` and a ``Consumer`` (probes, offsets)."""

    def __init__(self, bootstrap: str, connect_seconds: float = 10.0) -> None:
        from rstream import Producer

        ep = self.endpoint = endpoint_of(bootstrap)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="htmqc-rabbitmq-client", daemon=True
        )
        self._thread.start()
        try:
            self.consumer: Any = self.call(connect(ep, connect_seconds), connect_seconds + 5)
        except BaseException:
            stop_loop(self._loop, self._thread)
            raise
        self.producer: Any = Producer(
            ep.host, ep.port, username=ep.user, password=ep.password, vhost=ep.vhost,
            default_batch_publishing_delay=0.01, ssl_context=ep.tls,
        )  # fmt: skip

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the client's thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coro`` on the client's thread; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def partitions(self, topic: str) -> int:
        """Partitions of ``topic`` (streams ``TOPIC-0``, ... that exist)."""
        return self.call(count_partitions(self.consumer, topic))

    def create_stream(self, name: str, **arguments: Any) -> None:
        """Create the stream ``name`` unless it exists, whatever its arguments
        (``arguments``: RabbitMQ's stream arguments, e.g. ``max_length_bytes=`` for
        ``max-length-bytes``)."""
        args = {k.replace("_", "-"): v for k, v in arguments.items()} or None

        async def create() -> None:
            if not await self.consumer.stream_exists(name):
                await self.consumer.create_stream(name, arguments=args, exists_ok=True)

        self.call(create())

    def create_topic(self, topic: str, partitions: int, **arguments: Any) -> None:
        """Create streams ``TOPIC-0`` .. for ``partitions``; existing ones are kept."""
        check_name("topic", topic)
        for p in range(partitions):
            self.create_stream(stream_name(topic, p), **arguments)

    def create_retry_topic(self, topic: str) -> str:
        """Create ``topic``'s retry topic ``TOPIC.retry`` (``--retry-topic``): one
        partition, like Kafka's, the stream ``TOPIC.retry-0`` (kept if it exists); its name."""
        check_name("topic", topic)
        self.create_stream(stream_name(retry_topic(topic), 0))
        return retry_topic(topic)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, high)`` of a partition (:func:`watermarks`)."""
        return self.call(watermarks(self.consumer, stream_name(topic, partition)))

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition (at-least-once), or ``None``."""
        stream = stream_name(topic, partition)
        return self.call(read_commit(self.consumer, stream, offsets_reference(group)))

    def publish_many(self, records: Iterable[tuple[str, Any]], batch: int = 500) -> int:
        """Publish ``(stream, message)`` records in batches and wait until every
        one is confirmed; return the count.

        :raises RuntimeFailure: a message was refused."""

        async def run() -> int:
            done = asyncio.Event()
            state = {"sent": 0, "confirmed": 0, "refused": 0, "closed": False}

            def confirmed(status: Any) -> None:
                state["confirmed" if status.is_confirmed else "refused"] += 1
                if state["closed"] and state["confirmed"] + state["refused"] >= state["sent"]:
                    done.set()

            pending: dict[str, list[Any]] = {}
            for stream, message in records:
                chunk = pending.setdefault(stream, [])
                chunk.append(message)
                if len(chunk) >= batch:
                    await self.producer.send_batch(stream, chunk, on_publish_confirm=confirmed)
                    state["sent"] += len(chunk)
                    pending[stream] = []
                    while state["sent"] - state["confirmed"] - state["refused"] > 20 * batch:
                        await asyncio.sleep(0.001)
            for stream, chunk in pending.items():
                if chunk:
                    await self.producer.send_batch(stream, chunk, on_publish_confirm=confirmed)
                    state["sent"] += len(chunk)
            state["closed"] = True
            if state["confirmed"] + state["refused"] < state["sent"]:
                await done.wait()
            if state["refused"]:
                raise RuntimeFailure(f"RabbitMQ refused {state['refused']} messages", "retry")
            return state["sent"]

        return self.call(run(), 600)

    def close(self) -> None:
        """Close both connections, stop the thread."""
        for closing in (self.producer.close(), self.consumer.close(), _cancel_the_rest()):
            with contextlib.suppress(Exception):
                self.call(closing, 10)
        stop_loop(self._loop, self._thread)


def _publish_numbered(
    rc: RabbitStreamClient, topic: str, partitions: int, messages: Iterable[Numbered]
) -> int:
    """:data:`produce`'s messages, the id as a header, to their streams."""
    from htmqc.produce import ID_HEADER

    return rc.publish_many(
        (stream_name(topic, m.partition), outgoing(m.value, m.key, [(ID_HEADER, b"%d" % m.id)]))
        for m in messages
    )


#: ``produce(bootstrap, topic, count, *, partitions, keys=100, size=100, start_id=0,
#: client=None)``: numbered test messages to a topic's streams, created if missing
#: (:class:`~htmqc.sources.pumped.NumberedProducer`).
produce = NumberedProducer(RabbitStreamClient, _publish_numbered)


class RabbitStreamProducer(Deliveries):
    """The dead-letter and retry producer of a RabbitMQ source
    (:class:`~htmqc.ports.ProducerPort`): ``produce(TOPIC.dlq, ...)`` publishes to the
    stream ``TOPIC.dlq`` (or ``TOPIC.dlq.poison``), created on first use;
    ``produce(TOPIC.retry, ...)`` to ``TOPIC.retry-0``; ``flush`` waits for the confirms."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.client = RabbitStreamClient(bootstrap)
        self._known: set[str] = set()

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """Publish ``value`` (``key``, ``headers``) to the stream ``topic`` (a retry
        topic: its one partition's stream, made at start); ``on_delivery(err, None)``
        once confirmed."""
        if topic.endswith(RETRY_SUFFIX):
            topic = stream_name(topic, 0)
        elif topic not in self._known:
            self.client.create_stream(topic)
            self._known.add(topic)
        value = kwargs.get("value", args[0] if args else None)
        message = outgoing(value or b"", kwargs.get("key"), kwargs.get("headers") or [])
        callback = kwargs.get("on_delivery")

        async def send() -> None:
            sent: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

            def confirmed(status: Any) -> None:
                if not sent.done():
                    sent.set_result(bool(status.is_confirmed))

            await self.client.producer.send_batch(topic, [message], on_publish_confirm=confirmed)
            if not await asyncio.wait_for(sent, CALL_TIMEOUT):
                raise RuntimeError(f"RabbitMQ refused a message to {topic}")

        self.track(self.client.submit(send()), callback)

    def close(self) -> None:
        """Close the connections."""
        self.client.close()
