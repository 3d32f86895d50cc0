"""Contender: htmqc itself, driven through its command line (``htmqc run``).

Modes: ``at-least-once``; ``exactly-once`` into a SQLite file (the handler
writes nothing itself unless a ``store`` is given, the sink stores the offsets
per transaction); ``exactly-once-kafka``: each value forwarded to the output
topic (default ``TOPIC-htmqc-out``) in the sink's Kafka transaction; each with
``+low-latency`` (``at-least-once+low-latency``): the same under ``--profile
low-latency``. The CLI
runs in this (the contender's own) process with ``--max-messages COUNT`` so
rusage covers it; the handlers below call the shared
:class:`~benchmarks.peers.common.Meter` kept in :data:`METER`. Contracts are
switched off (``HTMQC_CONTRACTS=0``), as for production.

Effects for the duplicate count (``store``): at-least-once writes a row per
message through the meter (autocommit, like any at-least-once handler);
exactly-once into SQLite writes the row through the transaction handle ``tx``
into the sink's own database file ``store``, so it commits with the offsets;
Kafka→Kafka's effect is the output record itself (the sink gets a stable
member id, :func:`_stable_member_id`). Commit-time latency of the
exactly-once modes: every sink transaction commit calls ``METER.committed()``
when it returns.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.peers.common import INSERT_EFFECT, Meter, open_store, parse_id

MODES = ("at-least-once", "exactly-once", "exactly-once-kafka")
#: A mode may end with ``+PROFILE``: the run gets ``--profile PROFILE``
#: (``at-least-once+low-latency``).
PROFILE_MARK = "+"
METER: Meter | None = None
#: Whether :func:`handle_eo` writes an effect row through ``tx``.
STORE_THROUGH_TX = False


def _meter() -> Meter:
    if METER is None:
        raise RuntimeError("benchmarks.peers.htmqc_peer.METER is not set; call run()")
    return METER


def handle_alo(msg: Any) -> None:
    """at-least-once handler: the shared trivial handler."""
    _meter().handle(msg.value(), msg.timestamp()[1], msg.key(), msg.partition(), msg.offset())


def handle_eo(msg: Any, tx: Any) -> None:
    """exactly-once into SQLite: the shared trivial handler inside the transaction."""
    if STORE_THROUGH_TX:
        key = msg.key()
        tx.execute(INSERT_EFFECT, (parse_id(msg.value()), key.decode() if key else None,
                                   msg.partition(), msg.offset()))
    _meter().handle(msg.value(), msg.timestamp()[1])


def handle_kafka(msg: Any, tx: Any) -> None:
    """exactly-once Kafka→Kafka: the shared handler, then forward the value."""
    _meter().handle(msg.value(), msg.timestamp()[1])
    tx.send(None, msg.value(), key=msg.key())


def _time_commits(meter: Meter) -> None:
    """Call ``meter.committed()`` after every htmqc sink transaction commit returns."""
    from htmqc.sinks.kafka import KafkaTransaction
    from htmqc.sinks.sql import SqlTransaction

    for cls in (SqlTransaction, KafkaTransaction):
        original = cls.commit

        def commit(self: Any, commits: Any, _original: Any = original) -> None:
            _original(self, commits)
            meter.committed()

        cls.commit = commit  # type: ignore[method-assign]


#: The Kafka sink's member id in this harness (see :func:`_stable_member_id`).
MEMBER_ID = "peers"


def _stable_member_id() -> None:
    """Give the Kafka sink a stable member id, so its ``transactional.id`` is stable.

    ``htmqc run`` has no option for it: the sink draws a random member id per
    process (``htmqc.sinks.kafka.KafkaSink``), so a restarted process cannot
    fence the transaction a SIGKILLed one left open, and the bundled broker
    never times that transaction out: every ``read_committed`` reader of the
    output would wait behind it. One htmqc process per group runs at a time
    here, so one fixed id is safe (Quix gets the same treatment).
    """
    from htmqc.sinks import kafka as kafka_sink

    original = kafka_sink.KafkaSink.__init__

    def init(self: Any, *args: Any, member_id: str | None = None, **kwargs: Any) -> None:
        original(self, *args, member_id=member_id or MEMBER_ID, **kwargs)

    kafka_sink.KafkaSink.__init__ = init  # type: ignore[method-assign]


def run(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    group: str,
    mode: str = "at-least-once",
    latency: str | None = None,
    store: str | None = None,
    kill_at: int | None = None,
    journal: str | None = None,
    out_topic: str | None = None,
    idle_exit: float | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Consume ``count`` messages with ``htmqc run``; return the shared figures.

    With ``idle_exit`` htmqc also stops once nothing arrived for that many
    seconds (its ``--idle-exit``): how a restarted run finishes the topic.
    """
    global METER, STORE_THROUGH_TX
    os.environ.setdefault("HTMQC_CONTRACTS", "0")
    import tempfile
    from pathlib import Path

    from htmqc.cli import main as htmqc_main

    mode, _, profile = mode.partition(PROFILE_MARK)
    METER = Meter(count, latency=latency, kill_at=kill_at, journal=journal,
                  store=store if mode == "at-least-once" else None)
    _time_commits(METER)
    argv = ["run", "--bootstrap", bootstrap, "--topic", topic, "--group", group,
            "--max-messages", str(count), "--idle-exit", str(idle_exit or timeout),
            "--log-level", "WARNING"]
    if profile:
        argv += ["--profile", profile]
    if mode == "at-least-once":
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_alo", "--mode", "at-least-once"]
    elif mode == "exactly-once":
        if store is not None:
            open_store(store).close()  # the effects table, in the sink's own database
            STORE_THROUGH_TX = True
            db = store
        else:
            db = str(Path(tempfile.mkdtemp(prefix="htmqc-peer-")) / "sink.db")
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_eo", "--mode", "exactly-once",
                     "--sink", f"sqlite:///{db}"]
    elif mode == "exactly-once-kafka":
        _stable_member_id()
        argv[1:1] = ["benchmarks.peers.htmqc_peer:handle_kafka", "--mode", "exactly-once",
                     "--sink", f"kafka:{out_topic or topic + '-htmqc-out'}"]
    else:
        raise ValueError(f"unknown htmqc mode {mode!r}; use one of {', '.join(MODES)}")
    code = htmqc_main(argv)
    if code != 0:
        raise RuntimeError(f"htmqc run exited with {code}")
    return METER.result("htmqc", mode)
