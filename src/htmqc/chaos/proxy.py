"""A loopback TCP proxy whose behaviour can be changed while it runs.

Where it sits
-------------
A chaos run starts its own Tansu with ``--listener-url tcp://127.0.0.1:BROKER``
and ``--advertised-listener-url tcp://127.0.0.1:PROXY`` (see
:func:`htmqc.chaos.harness.start_proxied_broker`). A Kafka client bootstraps
somewhere, asks for metadata, and from then on talks only to the advertised
address, so *every* client connection of the run (consumers, producer, admin)
passes through the proxy. One proxy per consumer cannot work: the broker
advertises a single address, and every consumer would be sent to it.

How a connection is attributed to a consumer
--------------------------------------------
Each consumer runs with ``client.id=chaos-c<N>``. Every Kafka request starts
with ``int32 size, int16 api_key, int16 api_version, int32 correlation_id,
int16 client_id length, client_id bytes`` (all header versions), so with
``kafka_ids=True`` the proxy reads that header from the first request of each
connection (waiting at most :data:`IDENTIFY_SECONDS`), remembers the client id,
and forwards the bytes unchanged. A rule set for target ``"chaos-c1"`` applies to
the connections whose client id starts with that text; a rule for target
``None`` applies to every connection that no targeted rule covers. A
connection whose first bytes are not such a header has no client id.

Modes (a :class:`Rule`; the current rule of a connection is looked up per chunk)
---------------------------------------------------------------------------------
``pass``
    bytes flow both ways.
``drop``
    a blackhole: nothing is read or forwarded in either direction, existing
    and new connections alike; the kernel buffers fill and the peers see
    silence (request timeouts). When the rule is lifted the held bytes flow
    again, as after a network partition that healed before TCP gave up.
``delay``
    every chunk waits ``delay_ms`` before it is forwarded (order preserved).
``half-close``
    the proxy sends FIN towards the client (``write_eof``): the client reads
    end-of-stream while its own writes still reach the broker; the broker's
    answers are discarded. New connections are half-closed at once.
``reset``
    every connection is aborted with RST (``SO_LINGER`` 0); new connections
    are reset as soon as they are identified.

Threading: the proxy runs an asyncio loop in a daemon thread; :meth:`ChaosProxy.set`,
:meth:`ChaosProxy.heal` and :meth:`ChaosProxy.stats` may be called from any
thread and return once the change is in effect. :meth:`ChaosProxy.stop` is
idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from htmqc.errors import RuntimeFailure, UsageError

Mode = Literal["pass", "drop", "delay", "half-close", "reset"]
MODES: tuple[Mode, ...] = ("pass", "drop", "delay", "half-close", "reset")
#: Longest wait for a new connection's first request header.
IDENTIFY_SECONDS = 5.0
_CHUNK = 64 * 1024
_HEADER = struct.Struct(">ihhih")  # size, api_key, api_version, correlation_id, id length
_CONTROL_SECONDS = 10.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Rule:
    """What the proxy does to a connection's traffic (see module docs)."""

    mode: Mode = "pass"
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown proxy mode {self.mode!r}", f"use one of {', '.join(MODES)}")
        if self.delay_ms < 0 or (self.mode == "delay" and self.delay_ms == 0):
            raise UsageError(
                f"proxy delay must be positive, got {self.delay_ms:g} ms", "pass delay_ms > 0"
            )


PASS = Rule()


def client_id_of(header: bytes) -> str | None:
    """The client id in a Kafka request header, or ``None`` if ``header`` is not one.

    ``header`` must hold at least the fixed part (:data:`_HEADER`, 12 bytes) and
    then the id's bytes; extra bytes are ignored.
    """
    if len(header) < _HEADER.size:
        return None
    size, api_key, _version, _corr, n = _HEADER.unpack_from(header)
    if size < _HEADER.size - 4 or not 0 <= api_key < 10_000 or n < 0:
        return None
    raw = header[_HEADER.size : _HEADER.size + n]
    if len(raw) != n:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client side and the broker side."""

    client: asyncio.StreamWriter
    client_id: str | None = None
    read_first: bool = False  # the first request was read (or given up on)
    upstream: asyncio.StreamWriter | None = None
    half_closed: bool = False
    closed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class ChaosProxy:
    """Forward ``listen_host:listen_port`` to ``upstream``, faults on demand (module docs).

    ``listen_port=0`` picks a free port (:attr:`port` after :meth:`start`).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        kafka_ids: bool = True,
    ) -> None:
        self.upstream = upstream
        self.listen_host = listen_host
        self.kafka_ids = kafka_ids
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((listen_host, listen_port))
        except OSError as exc:
            self._sock.close()
            raise RuntimeFailure(
                f"chaos proxy cannot listen on {listen_host}:{listen_port}: {exc.strerror}",
                "pick another port or let it choose one (0)",
            ) from None
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])
        self._rules: dict[str | None, Rule] = {}
        self._links: set[_Link] = set()
        self._counts: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._flowing: dict[str | None, asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="htmqc-chaos-proxy", daemon=True)

    @property
    def address(self) -> str:
        """``host:port`` clients should connect to."""
        return f"{self.listen_host}:{self.port}"

    # -- control (any thread) -----------------------------------------------------------

    def start(self) -> ChaosProxy:
        """Start serving; returns once connections are accepted.

        :raises RuntimeFailure: the loop could not start.
        """
        self._thread.start()
        if not self._started.wait(_CONTROL_SECONDS) or self._failure is not None:
            self.stop()
            raise RuntimeFailure(
                f"the chaos proxy did not start ({type(self._failure).__name__})",
                "run again with --debug",
            )
        return self

    def set(self, mode: Mode, target: str | None = None, *, delay_ms: float = 0.0) -> None:
        """Apply ``mode`` to ``target``'s connections (``None``: all others), now and
        for new ones, until changed. ``pass`` for a target removes its rule."""
        rule = Rule(mode, delay_ms)
        self._call(self._apply(target, rule))

    def heal(self, target: str | None = None) -> None:
        """Back to ``pass`` for ``target`` (same as ``set("pass", target)``)."""
        self.set("pass", target)

    def rule(self, target: str | None = None) -> Rule:
        """The rule in force for a connection whose client id is ``target``."""
        return self._rule_for(target)

    def stats(self) -> dict[str, int]:
        """Counters: ``accepted``, ``identified``, ``reset``, ``half_closed``, ``open``..."""

        async def read() -> dict[str, int]:
            return {**self._counts, "open": len(self._links)}

        return self._call(read())

    def client_ids(self) -> list[str | None]:
        """Client ids of the open connections (``None``: its first request
        named none, or was not a Kafka request). A connection still waiting for
        its first request is not listed: nobody can say whose it is yet."""

        async def read() -> list[str | None]:
            return [link.client_id for link in self._links if link.read_first]

        return self._call(read())

    def stop(self) -> None:
        """Stop accepting, close every connection. Idempotent."""
        if self._thread.is_alive() and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CONTROL_SECONDS)
        self._sock.close()

    def __enter__(self) -> ChaosProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeFailure("the chaos proxy is not running", "start() it first")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(_CONTROL_SECONDS)

    # -- the loop -----------------------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, sock=self._sock)
            )
        except Exception as exc:  # pragma: no cover - set-up failure
            self._failure = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._server.close()
        for link in list(self._links):
            self._close(link, reset=False)
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.wait(tasks, timeout=2.0))
        self._loop.close()

    def _rule_for(self, client_id: str | None) -> Rule:
        return self._rules.get(self._rule_key(client_id), PASS)

    def _gate(self, link: _Link) -> asyncio.Event:
        """The event that is set while ``link`` may move bytes (not dropped)."""
        key = self._rule_key(link.client_id)
        gate = self._flowing.get(key)
        if gate is None:
            gate = self._flowing[key] = asyncio.Event()
            if self._rule_for(link.client_id).mode != "drop":
                gate.set()
        return gate

    def _rule_key(self, client_id: str | None) -> str | None:
        """The target whose rule governs ``client_id``: the longest matching prefix,
        else ``None`` (the rule for all)."""
        if client_id is not None:
            matches = [t for t in self._rules if t is not None and client_id.startswith(t)]
            if matches:
                return max(matches, key=len)
        return None

    async def _apply(self, target: str | None, rule: Rule) -> None:
        if rule.mode == "pass" and target is not None:
            self._rules.pop(target, None)
        else:
            self._rules[target] = rule
        self._counts[f"set_{rule.mode}"] += 1
        # Gates are per rule key; recompute them all (rules may have appeared/vanished).
        old = self._flowing
        self._flowing = {}
        for link in list(self._links):
            self._enforce(link)
        for gate in old.values():
            gate.set()  # wake pumps parked on a stale gate; they re-check the new one

    def _enforce(self, link: _Link) -> None:
        """Apply the rule in force to an identified, open link."""
        rule = self._rule_for(link.client_id)
        gate = self._gate(link)
        if rule.mode == "drop":
            gate.clear()
        else:
            gate.set()
        if rule.mode == "reset":
            self._close(link, reset=True)
        elif rule.mode == "half-close" and not link.half_closed and not link.closed:
            link.half_closed = True
            self._counts["half_closed"] += 1
            with contextlib.suppress(OSError, RuntimeError):
                if link.client.can_write_eof():
                    link.client.write_eof()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(client=writer)
        self._counts["accepted"] += 1
        self._links.add(link)
        try:
            first = b""
            if self.kafka_ids:
                first = await self._identify(reader, link)
            link.read_first = True
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                self._counts["upstream_refused"] += 1
                self._close(link, reset=False)
                return
            link.upstream = up_writer
            if link.closed:
                up_writer.close()
                return
            self._enforce(link)
            if link.closed:
                up_writer.close()
                return
            if first:
                up_writer.write(first)
            up = asyncio.ensure_future(self._pump(link, reader, up_writer, to_client=False))
            down = asyncio.ensure_future(self._pump(link, up_reader, writer, to_client=True))
            link.tasks = [up, down]
            await asyncio.wait(link.tasks, return_when=asyncio.ALL_COMPLETED)
        finally:
            self._close(link, reset=False)

    async def _identify(self, reader: asyncio.StreamReader, link: _Link) -> bytes:
        """Read the first request header; set ``link.client_id``; return the bytes read."""
        data = b""
        try:
            async with asyncio.timeout(IDENTIFY_SECONDS):
                data = await reader.readexactly(_HEADER.size)
                n = _HEADER.unpack_from(data)[4]
                if 0 < n <= 4096:
                    data += await reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            return data + exc.partial
        except (TimeoutError, OSError):
            return data
        link.client_id = client_id_of(data)
        if link.client_id is not None:
            self._counts["identified"] += 1
        return data

    async def _pump(
        self,
        link: _Link,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        *,
        to_client: bool,
    ) -> None:
        """Copy ``src`` to ``dst`` under the link's rule until end of stream or close."""
        try:
            while not link.closed:
                await self._wait_flowing(link)
                data = await src.read(_CHUNK)
                if not data:
                    break
                await self._wait_flowing(link)
                rule = self._rule_for(link.client_id)
                if rule.mode == "delay":
                    await asyncio.sleep(rule.delay_ms / 1000.0)
                if link.closed:
                    break
                if to_client and link.half_closed:
                    continue  # the client was told end-of-stream: discard answers
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError, RuntimeError):
            pass
        finally:
            if not link.closed and not (to_client and link.half_closed):
                with contextlib.suppress(OSError, RuntimeError):
                    if dst.can_write_eof():
                        dst.write_eof()
            if to_client:
                self._close(link, reset=False)  # the broker side ended: end the link

    async def _wait_flowing(self, link: _Link) -> None:
        while not link.closed:
            gate = self._gate(link)
            if gate.is_set():
                return
            await gate.wait()

    def _close(self, link: _Link, *, reset: bool) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        if reset:
            self._counts["reset"] += 1
        for writer in (link.client, link.upstream):
            if writer is None:
                continue
            if reset:
                with contextlib.suppress(OSError, AttributeError):
                    sock = writer.transport.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                writer.transport.abort()
            else:
                writer.close()
        current = asyncio.current_task(self._loop) if self._loop.is_running() else None
        for task in link.tasks:
            if task is not current:
                task.cancel()
