"""The Redis mirror of the backpressure state, against the real Redis on loopback."""

from __future__ import annotations

import json
import socket
import time

import pytest

from htmqc import secrets
from htmqc.errors import UsageError
from htmqc.loopback import free_port
from htmqc.observe.redis_mirror import RedisMirror, encode_command, parse_redis_url
from tests.observe.conftest import Scenario
from tests.services import REDIS, require_redis


def _get(key: str) -> tuple[bytes | None, int]:
    """GET and PTTL of ``key`` through a raw RESP exchange."""
    with socket.create_connection(REDIS, timeout=2) as s:
        s.sendall(encode_command("GET", key) + encode_command("PTTL", key))
        data = b""
        deadline = time.monotonic() + 2
        while data.count(b"\r\n") < 3 and time.monotonic() < deadline:
            if data.startswith(b"$-1\r\n") and data.count(b"\r\n") >= 2:
                break
            data += s.recv(65536)
    if data.startswith(b"$-1\r\n"):
        return None, int(data.split(b"\r\n")[1][1:])
    _, value, ttl, _ = data.split(b"\r\n", 3)
    return value, int(ttl[1:])


@pytest.fixture(autouse=True)
def _need_redis() -> None:
    require_redis()


def test_mirror_writes_the_backpressure_document(scenario: Scenario) -> None:
    mirror = RedisMirror("redis://127.0.0.1:6379/0", "g-mirror", scenario.source(),
                         interval=0.05, ttl=2.0, member="test:1")
    mirror.start()
    try:
        deadline = time.monotonic() + 5
        while mirror.writes < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        value, ttl = _get("htmqc:backpressure:g-mirror:test:1")
    finally:
        mirror.stop()
    assert value is not None and 0 < ttl <= 2000
    doc = json.loads(value)
    state = scenario.source().state()
    assert doc["window"] == state["flow"]["window"]
    assert doc["in_flight"] == state["in_flight"]
    assert doc["paused_partitions"] == ["orders/1"]
    assert doc["paused"] is True


def test_a_redis_outage_does_not_stop_the_mirror(scenario: Scenario) -> None:
    dead = free_port()
    mirror = RedisMirror(f"redis://127.0.0.1:{dead}/0", "g", scenario.source(), interval=0.01)
    mirror.start()
    time.sleep(0.1)
    mirror.stop()
    assert mirror.writes == 0
    with pytest.raises(OSError):
        mirror.write_once()


def test_url_parsing_and_the_password_is_a_secret() -> None:
    secrets.forget_all()
    assert parse_redis_url("redis://:s3cretpw@10.0.0.1:6380/2") == ("10.0.0.1", 6380, "s3cretpw", 2)
    assert secrets.scrub("auth s3cretpw") == "auth ***"
    assert parse_redis_url("redis://localhost") == ("localhost", 6379, None, 0)
    for bad in ("http://x", "redis://", "redis://h:notaport", "redis://h/db"):
        with pytest.raises(UsageError):
            parse_redis_url(bad)
    secrets.forget_all()


def test_wrong_password_is_an_error_without_the_password(scenario: Scenario) -> None:
    mirror = RedisMirror("redis://:wrong-pass-123@127.0.0.1:6379/0", "g", scenario.source())
    with pytest.raises(OSError) as caught:
        mirror.write_once()
    assert "wrong-pass-123" not in str(caught.value)
    secrets.forget_all()
