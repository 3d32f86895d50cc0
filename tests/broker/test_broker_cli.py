"""``htmqc broker`` and ``htmqc produce`` as a user runs them, in subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from htmqc.broker import Broker
from htmqc.loopback import free_port
from tests.broker.readback import TopicFactory, read_all

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}


def htmqc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "htmqc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "code", "text"),
    [
        (["--count", "0"], 2, "--count must be positive, got 0; pass --count 1 or more"),
        (["--count", "5", "--size", "4"], 2, "--size must be at least 12 bytes"),
        (["--count", "5", "--keys", "-2"], 2, "--keys must be 0 or more"),
        (["--count", "5", "--abort-every", "3"], 2, "--abort-every needs --transactional"),
        (["--count", "five"], 2, "argument --count: invalid int value"),
    ],
)
def test_produce_bad_input_is_one_line(extra: list[str], code: int, text: str) -> None:
    result = htmqc("produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", *extra)
    assert result.returncode == code
    line = one_error_line(result)
    assert line.startswith("htmqc: error: ")
    assert text in line


def test_produce_unreachable_broker_is_one_line() -> None:
    port = free_port()
    result = htmqc("produce", "--bootstrap", f"127.0.0.1:{port}", "--topic", "t", "--count", "3")
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"htmqc: error: cannot reach broker at 127.0.0.1:{port}; "
        "start one with `htmqc broker` or check --bootstrap"
    )


def test_produce_cli_writes_and_summarises(broker: Broker, new_topic: TopicFactory) -> None:
    topic = new_topic(partitions=2)
    result = htmqc(
        "produce", "--bootstrap", broker.bootstrap, "--topic", topic, "--count", "2500",
        "--start-id", "10", "--transactional", "--abort-every", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"produced 1500 messages to {topic} in ")
    assert result.stdout.rstrip().endswith("msg/s), 1000 aborted")
    ids = sorted(r.id for r in read_all(broker.bootstrap, topic))
    assert ids == list(range(10, 1010)) + list(range(2010, 2510))


def test_broker_command_prints_bootstrap_and_stops_on_sigterm() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "htmqc", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first == f"bootstrap: 127.0.0.1:{port}\n"
        result = htmqc(
            "produce", "--bootstrap", f"127.0.0.1:{port}", "--topic", "x", "--count", "5"
        )
        assert result.returncode == 0, result.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr = process.stderr.read() if process.stderr else ""
        if process.stdout:
            process.stdout.close()
        if process.stderr:
            process.stderr.close()
    assert "Traceback" not in stderr
    # the broker child went with it: nothing listens on the port any more
    time.sleep(0.2)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


@pytest.mark.tansu_only
def test_broker_command_on_a_taken_port_is_one_line(broker: Broker) -> None:
    result = htmqc("broker", "--port", str(broker.port))
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"htmqc: error: port {broker.port} on 127.0.0.1 is already in use; "
        "pick another with --port or omit it"
    )
