"""htmqc.loopback: ports drawn below the kernel's ephemeral range, each free when drawn.

A broker restarted on its ports (Pulsar's ``restart``, a Kafka node or a Tansu broker
brought back in a chaos test) failed in CI with "Address already in use": a port the
kernel had handed out (``bind(0)``) went, while the broker was down, to some other
process's outgoing connection. These tests pin what prevents that.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from htmqc import loopback
from htmqc.loopback import FLOOR, HOST, ephemeral_low, free_port, free_ports


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(FLOOR <= port < ephemeral_low() for port in ports)
    assert all(_bindable(port) for port in ports)
    assert FLOOR <= free_port() < ephemeral_low()


def test_outgoing_connections_never_get_a_port_below_the_ephemeral_range() -> None:
    """The kernel's side of the contract: what makes a drawn port safe to bind again."""
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(512)
        target = listener.getsockname()
        clients = []
        try:
            for _ in range(300):
                clients.append(socket.create_connection(target))
                listener.accept()[0].close()
            assert min(c.getsockname()[1] for c in clients) >= ephemeral_low()
        finally:
            for client in clients:
                client.close()


@pytest.fixture
def drawn_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Make the draw try the ports of the yielded list first, in order."""
    first: list[int] = []
    real = loopback.secrets.randbelow

    def randbelow(n: int) -> int:
        return first.pop(0) - FLOOR if first else real(n)

    monkeypatch.setattr(loopback.secrets, "randbelow", randbelow)
    yield first


def test_a_port_with_a_listener_is_skipped(drawn_first: list[int]) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, free_port()))
        taken.listen()
        held = taken.getsockname()[1]
        drawn_first.append(held)
        port = free_port()
        assert port != held and not drawn_first  # drawn, refused, drawn again


def test_a_port_with_a_connection_in_time_wait_is_skipped(drawn_first: list[int]) -> None:
    """A broker that closed its connections first leaves them in TIME_WAIT on its
    port; binding it without SO_REUSEADDR fails there, so it is not offered."""
    port = free_port()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen()
        client = socket.create_connection((HOST, port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first: TIME_WAIT on `port`
        client.close()
    drawn_first.append(port)
    assert free_port() != port and not drawn_first


def test_a_narrow_range_leaves_the_choice_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopback, "ephemeral_low", lambda: FLOOR + 10)
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert all(port >= FLOOR + 10 for port in ports)  # the kernel's range, not ours


def test_the_ephemeral_range_is_read_from_the_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    assert ephemeral_low() == int(text.split()[0])
    fake = tmp_path / "range"
    fake.write_text("40000\t60999\n")
    monkeypatch.setattr(loopback, "_EPHEMERAL_RANGE", fake)
    assert ephemeral_low() == 40000
    monkeypatch.setattr(loopback, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert ephemeral_low() == 32768


def test_no_free_port_is_an_error_naming_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopback, "_bound", lambda host, port: None)
    with pytest.raises(OSError, match=f"no free TCP port on {HOST} in {FLOOR}-"):
        free_port()
