"""Hostile messages against a real ``htmqc run`` (at-least-once, strict JSON handler).

Keys, values and headers of any bytes: invalid UTF-8, empty, null key and
null value, a huge key, a flood of 1000 headers, a value exactly at
``--max-message-bytes`` and one byte over. The consumer must neither crash
nor stall (it drains the topic and exits 0 on ``--idle-exit``), handle every
good message once, and put every bad one in ``<topic>.dlq`` with a reason
header. Every produced record carries a ``case`` header naming it; the DLQ
keeps the original headers, so each dead letter is matched to its case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from htmqc.broker import Broker

from .test_secrets import read_topic

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 100_000
Header = tuple[str, bytes | None]
Record = tuple[bytes | None, bytes | None, list[Header]]


def json_of_size(ident: int, size: int) -> bytes:
    """A JSON object ``{"id": ident, "pad": "..."}`` of exactly ``size`` bytes."""
    head = json.dumps({"id": ident, "pad": ""}).encode()
    value = json.dumps({"id": ident, "pad": "x" * (size - len(head))}).encode()
    assert len(value) == size
    return value


def cases() -> tuple[dict[str, Record], dict[str, str]]:
    """``(records, bad)``: name -> (key, value, extra headers); bad: name -> the
    start of its reason header (the error class)."""
    flood: list[Header] = [(f"h{i}", os.urandom(8)) for i in range(1000)]
    weird_headers: list[Header] = [("", b""), ("\xff-name", None), ("bin", b"\x00\xff\xfe")]
    good: dict[str, Record] = {
        "plain": (b"k1", b'{"id": 1}', []),
        "null-key": (None, b'{"id": 2}', []),
        "empty-key": (b"", b'{"id": 3}', []),
        "binary-key": (b"\xff\xfe\x00\x80", b'{"id": 4}', []),
        "huge-key": (os.urandom(50_000), b'{"id": 5}', []),
        "header-flood": (b"k6", b'{"id": 6}', flood),
        "weird-headers": (b"k7", b'{"id": 7}', weird_headers),
        "unicode": ("ключ-🔑".encode(), '{"id": 8, "name": "名前\u2028"}'.encode(), []),
        "at-limit": (b"k9", json_of_size(9, LIMIT), []),
    }
    bad_records: dict[str, tuple[bytes | None, bytes | None, list[Header], str]] = {
        "invalid-utf8": (b"k", b'{"id": 100, "x": "\xff\xfe"}', [], "Permanent: "),
        "empty-value": (b"k", b"", [], "Permanent: "),
        "null-value": (b"k", None, [], "Permanent: "),
        "not-json": (b"k", b"{id: 101", [], "Permanent: "),
        "json-array": (b"k", b"[1, 2, 3]", [], "Permanent: "),
        "string-id": (b"k", b'{"id": "102"}', [], "Permanent: "),
        "nul-bytes": (None, b"\x00" * 64, [], "Permanent: "),
        "flood-and-binary": (b"\xff", os.urandom(512), flood, "Permanent: "),
        "one-over-limit": (b"k", json_of_size(103, LIMIT + 1), [], "MessageTooLarge: "),
        "huge": (b"k", json_of_size(104, 500_000), [], "MessageTooLarge: "),
    }
    records = dict(good)
    records.update({name: (k, v, h) for name, (k, v, h, _kind) in bad_records.items()})
    return records, {name: kind for name, (_k, _v, _h, kind) in bad_records.items()}


def test_hostile_messages_end_in_the_dlq_and_the_rest_once(
    broker: Broker, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(2)
    records, bad = cases()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 2_000_000})
    errors: list[object] = []
    for round_ in range(2):  # every case twice, on both partitions
        for name, (key, value, headers) in records.items():
            producer.produce(
                topic,
                value=value,
                key=key,
                partition=round_,
                headers=[*headers, ("case", name.encode())],
                on_delivery=lambda err, _m: errors.append(err) if err else None,
            )
    assert producer.flush(30) == 0 and not errors, errors
    del producer
    seen = tmp_path / "handled.txt"
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [
                sys.executable, "-m", "htmqc", "run", "tests.security.handlers:strict_json",
                "--bootstrap", broker.bootstrap, "--topic", topic,
                "--group", f"hostile-{uuid.uuid4().hex[:6]}",
                "--max-message-bytes", str(LIMIT), "--workers", "4", "--idle-exit", "4",
                "--kafka-config", "fetch.message.max.bytes=2000000",
                # hostile records in a row would rightly open the circuit breaker
                "--breaker-consecutive", str(2**62), "--breaker-min-calls", str(2**62),
            ],
            env=dict(
                os.environ,
                PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}",
                HTMQC_SECURITY_OUT=str(seen),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,  # a stall fails here
        )  # fmt: skip
    output = log.read_text(errors="replace")
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    handled = sorted(int(line) for line in seen.read_text().split())
    assert handled == sorted(list(range(1, 10)) * 2), handled  # each good one, once per copy

    dead = read_topic(broker.bootstrap, f"{topic}.dlq", 2 * len(bad), timeout=30)
    assert len(dead) == 2 * len(bad)
    by_case: dict[str, list[str]] = {}
    for msg in dead:
        headers = msg.headers() or []
        case = [v or b"" for k, v in headers if k == "case"]
        reason = [v or b"" for k, v in headers if k == "htmqc-dlq-reason"]
        assert len(case) == 1 and len(reason) == 1, headers[-5:]
        by_case.setdefault(case[0].decode(), []).append(reason[0].decode("utf-8", "replace"))
        name = case[0].decode()
        key, value, _headers = records[name]
        assert (msg.key(), msg.value()) == (key, value), name  # the bytes kept as they were
        if name == "flood-and-binary":
            assert len(headers) >= 1001 + 2
    assert sorted(by_case) == sorted(bad)
    for name, reasons in by_case.items():
        assert len(reasons) == 2, (name, reasons)
        assert all(r.startswith(bad[name]) for r in reasons), (name, reasons)
    assert "not UTF-8" in by_case["invalid-utf8"][0]
    assert "null value" in by_case["null-value"][0]
    assert "larger than --max-message-bytes 100000" in by_case["one-over-limit"][0]
