"""Mirror the consumer's backpressure state into a Redis key (``--redis-url``).

Producers that want to slow down when consumers are saturated read
``htmqc:backpressure:<group>:<member>`` (one key per consumer process, written
every ``interval`` seconds with a time-to-live of ``ttl`` seconds, so a member
that stopped disappears). The value is JSON::

    {"group": "g", "member": "host:pid", "at": 1763850000.2,
     "window": 1000, "limit": 1000, "in_flight": 12, "in_flight_bytes": 12000,
     "paused": false, "paused_partitions": ["orders/3"]}

Readers list members with ``SCAN 0 MATCH htmqc:backpressure:<group>:*``.

The client is a minimal RESP speaker over one socket (``AUTH``, ``SELECT``,
``SET ... PX``): no dependency, and nothing but this one key is ever written.
A Redis outage never disturbs consuming: errors are logged (rate-limited) and
the connection is retried on the next tick. The URL's password is never
logged (:func:`htmqc.secrets.remember` is applied to it).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from htmqc import secrets
from htmqc.errors import UsageError
from htmqc.observe.state import StateSource

log = logging.getLogger("htmqc.redis")


def parse_redis_url(url: str) -> tuple[str, int, str | None, int]:
    """``(host, port, password, db)`` of ``redis://[:password@]host[:port][/db]``.

    :raises UsageError: not a redis:// URL, or a bad port or db number.
    """
    parts = urlsplit(url)
    if parts.scheme != "redis" or not parts.hostname:
        raise UsageError(
            "--redis-url must look like redis://[:password@]host[:port][/db]",
            "e.g. redis://127.0.0.1:6379/0",
        )
    try:
        port = parts.port or 6379
        path = parts.path.strip("/")
        db = int(path) if path else 0
    except ValueError:
        raise UsageError(
            "--redis-url has a bad port or database number", "e.g. redis://127.0.0.1:6379/0"
        ) from None
    password = unquote(parts.password) if parts.password else None
    if password:
        secrets.remember(password)
    return parts.hostname, port, password, db


def encode_command(*args: str | bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisMirror:
    """Writes the backpressure figures of ``source`` to Redis (see module docs)."""

    def __init__(
        self,
        url: str,
        group: str,
        source: StateSource,
        *,
        interval: float = 1.0,
        ttl: float = 5.0,
        member: str | None = None,
    ) -> None:
        self.host, self.port, self._password, self.db = parse_redis_url(url)
        self.group = group
        self.source = source
        self.interval = interval
        self.ttl = ttl
        self.member = member or f"{socket.gethostname()}:{os.getpid()}"
        self.key = f"htmqc:backpressure:{group}:{self.member}"
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = 0.0
        #: Successful writes (tests).
        self.writes = 0

    def document(self) -> dict[str, Any]:
        """The JSON value written (module docs)."""
        state = self.source.state()
        flow = state.get("flow") or {}
        return {
            "group": self.group,
            "member": self.member,
            "at": state.get("generated_at", time.time()),
            "window": flow.get("window"),
            "limit": flow.get("limit"),
            "in_flight": state.get("in_flight", 0),
            "in_flight_bytes": state.get("extra", {}).get("in_flight_bytes"),
            "paused": bool(flow.get("paused")) or state.get("paused_partitions", 0) > 0,
            "paused_partitions": [p["name"] for p in state.get("partitions", []) if p["paused"]],
        }

    def write_once(self) -> None:
        """Write the key now.

        :raises OSError: Redis could not be reached or refused the command.
        """
        value = json.dumps(self.document(), separators=(",", ":"))
        self._call("SET", self.key, value, "PX", str(int(self.ttl * 1000)))
        self.writes += 1

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=2.0)
        self._sock = sock
        if self._password:
            self._call("AUTH", self._password)
        if self.db:
            self._call("SELECT", str(self.db))
        return sock

    def _call(self, *args: str) -> bytes:
        sock = self._sock or self._connect()
        try:
            sock.sendall(encode_command(*args))
            reply = _read_line(sock)
        except OSError:
            self._close()
            raise
        if reply.startswith(b"-"):
            self._close()
            # The error text is Redis's, never the arguments (which may hold the password).
            raise OSError(f"redis refused {args[0]}: {reply[1:].decode(errors='replace')}")
        return reply

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def start(self) -> None:
        """Write every ``interval`` seconds in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._loop, name="htmqc-redis", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.write_once()
            except OSError as exc:
                now = time.monotonic()
                if now - self._last_error >= 60.0:
                    self._last_error = now
                    log.warning("cannot mirror backpressure to redis %s:%d: %s",
                                self.host, self.port, secrets.scrub(str(exc)))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop writing (the key expires after ``ttl``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()


def _read_line(sock: socket.socket) -> bytes:
    """One RESP reply line (simple string, error or integer; bulk replies are not
    used by the commands above)."""
    buf = bytearray()
    while not buf.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise OSError("redis closed the connection")
        buf += chunk
        if len(buf) > 65536:
            raise OSError("redis reply too long")
    return bytes(buf[:-2])
