"""Free loopback ports for the servers htmqc starts (tests, benchmarks, demos).

Contract
--------
:func:`free_ports` returns ``count`` distinct TCP ports, each of which could be bound on
``host`` at the moment of the call, drawn at random from :data:`FLOOR` up to just below
the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by
default). :func:`free_port` is one of them.

Why below the ephemeral range: a server stopped and started again on the same port (a
broker restarted in a chaos test) must find its port free again. A port inside that
range may meanwhile become the local end of anybody's outgoing connection, even of a
client retrying that very port (Linux can connect a socket to itself), and the restart
fails with "Address already in use". The kernel never hands out a port outside the range
unless a program asks for it by number. Two callers may still draw the same port between
the probe and their server's bind (one chance in about 16,000); those that start servers
retry with fresh ports on a bind failure.

The probe binds without ``SO_REUSEADDR``, so a port with a connection in ``TIME_WAIT`` on
it counts as taken. Where the ephemeral range leaves less than :data:`MIN_SPAN` ports
above :data:`FLOOR`, the kernel picks (``bind(0)``), as before.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

HOST = "127.0.0.1"
#: The lowest port drawn: above the well-known and registered ports services default to.
FLOOR = 16384
#: Fewer candidates than this below the ephemeral range: let the kernel choose.
MIN_SPAN = 4096
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW = 32768
_DRAWS_PER_PORT = 64


def ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (32768 where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def _bound(host: str, port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        return None
    return sock


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` a moment ago (see the module docs).

    :raises OSError: no free port found after many draws (a machine out of ports).
    """
    top = ephemeral_low()
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            sock = None
            if top - FLOOR >= MIN_SPAN:
                for _ in range(_DRAWS_PER_PORT):
                    sock = _bound(host, FLOOR + secrets.randbelow(top - FLOOR))
                    if sock is not None:
                        break
            else:
                sock = _bound(host, 0)
            if sock is None:
                raise OSError(f"no free TCP port on {host} in {FLOOR}-{top - 1}")
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port(host: str = HOST) -> int:
    """One port free on ``host`` a moment ago (see the module docs)."""
    return free_ports(1, host)[0]
