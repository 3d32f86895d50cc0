"""Contender: htmqc itself, driven through its command line (``htmqc run``).

Modes: ``at-least-once``; ``exactly-once`` into a fresh SQLite file (the
handler writes nothing itself, the sink stores the offsets per transaction);
``exactly-once-kafka``: each value forwarded to ``TOPIC-htmqc-out`` in the
sink's Kafka transaction. The CLI runs in this (the contender's own) process
with ``--max-messages COUNT`` so rusage covers it; the handlers below call the
shared :class:`~benchmarks.peers.common.Meter` kept in :data:`METER`.
Contracts are switched off (``HTMQC_CONTRACTS=0``), as for production.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.peers.common import Meter

MODES = ("at-least-once", "exactly-once", "exactly-once-kafka")
METER: Meter | None = None


def _meter() -> Meter:
    if METER is None:
        raise RuntimeError("benchmarks.peers.htmqc_peer.METER is not set; call run()")
    return METER


def handle_alo(msg: Any) -> None:
    """at-least-once handler: the shared trivial handler."""
    _meter().handle(msg.value(), msg.timestamp()[1])


def handle_eo(msg: Any, tx: Any) -> None:
    """exactly-once into SQLite: the shared trivial handler inside the transaction."""
    _meter().handle(msg.value(), msg.timestamp()[1])


def handle_kafka(msg: Any, tx: Any) -> None:
    """exactly-once Kafka→Kafka: the shared handler, then forward the value."""
    _meter().handle(msg.value(), msg.timestamp()[1])
    tx.send(None, msg.value(), key=msg.key())


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "at-least-once",
    latency: bool = False,
    ids_path: str | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with ``htmqc run``; return the shared figures."""
    global METER
    os.environ.setdefault("HTMQC_CONTRACTS", "0")
    from htmqc.cli import main as htmqc_main

    METER = Meter(count, latency=latency, ids_path=ids_path)
    argv = ["run", "--bootstrap", bootstrap, "--topic", topic, "--group", group,
            "--max-messages", str(count), "--idle-exit", str(timeout), "--log-level", "WARNING"]
    if mode == "at-least-once":
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_alo", "--mode", "at-least-once"]
    elif mode == "exactly-once":
        db = Path(tempfile.mkdtemp(prefix="htmqc-peer-")) / "sink.db"
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_eo", "--mode", "exactly-once",
                     "--sink", f"sqlite:///{db}"]
    elif mode == "exactly-once-kafka":
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_kafka", "--mode", "exactly-once",
                     "--sink", f"kafka:{topic}-htmqc-out"]
    else:
        raise ValueError(f"unknown htmqc mode {mode!r}; use one of {', '.join(MODES)}")
    code = htmqc_main(argv)
    if code != 0:
        raise RuntimeError(f"htmqc run exited with {code}")
    return METER.result("htmqc", mode)
