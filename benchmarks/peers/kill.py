"""Duplicates after one SIGKILL, counted as *stored effects* by :func:`htmqc.audit.audit`.

For one contender slot (:func:`duplicates_after_kill`):

1. a fresh topic of ``count`` 100-byte messages (8 partitions) and a fresh group;
2. run 1: the contender handles messages, writing one effect per message, and
   SIGKILLs itself right after its ``count // 2``-th handler call (a fixed crash
   point, :class:`~benchmarks.peers.common.Meter` ``kill_at``);
3. run 2, same group: a restarted contender finishes the topic. htmqc stops
   with its own ``--idle-exit``; the others handle exactly the messages past
   the group's committed offsets (:func:`remaining_in_group`), then stop the
   way they stop at ``count``;
4. the effects are audited against the produced ids ``0..count-1``.

Where the effects are stored (what a user of the contender would do):

- at-least-once contenders and Quix exactly-once without output: an SQLite
  file, one row per handler call, autocommit (:func:`~benchmarks.peers.common.open_store`);
- htmqc exactly-once into SQLite: the same table in the sink's database,
  written through the transaction handle, so it commits with the offsets;
- Kafka→Kafka (Quix ``to_topic``, htmqc ``kafka:`` sink): the records of the
  output topic, read with ``isolation.level=read_committed``
  (:func:`read_output`).

The bundled broker (Tansu) serves the records of an aborted transaction to
``read_committed`` readers: a transactional producer that wrote records and
was SIGKILLed, then fenced by ``init_transactions`` of the same
``transactional.id``, leaves records every reader sees (reproduced outside
this harness). Kafka hides them. So for Kafka→Kafka, run 1 keeps a
*journal* (handled ids, ``C`` after each commit, see
:class:`~benchmarks.peers.common.Meter`); the ids after its last ``C`` were
in the transaction open at the kill. :func:`hide_aborted` drops one stored
copy of each such id that is stored more than once (the aborted copy, which
precedes the restart's in its partition) before the audit: what a Kafka
broker's ``read_committed`` would have returned. Both counts are reported
(``as_served`` is the audit of the records exactly as the broker served them).
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.peers.common import parse_id
from benchmarks.peers.contenders import Slot

PARTITIONS = 8
KEYS = 1000
#: How long a restarted htmqc waits with nothing arriving before it stops.
HTMQC_IDLE_EXIT = 5.0
#: How long to wait for the output topic's transactions to settle (an open
#: transaction of the killed producer holds the last stable offset until the
#: broker aborts it: ``transaction.timeout.ms``, 60 s by default).
OUTPUT_SETTLE = 150.0

#: ``(argv, timeout) -> (returncode, last stderr line)``: runs a worker; the runner passes its own.
Spawn = Callable[[list[str], float], tuple[int, str]]


def is_kafka_output(slot: Slot) -> bool:
    """Whether ``slot``'s effects are records of an output topic."""
    return slot.mode == "exactly-once-kafka"


def remaining_in_group(bootstrap: str, group: str, topic: str, count: int,
                       partitions: int = PARTITIONS) -> int:
    """Messages of ``topic`` (``count`` produced from offset 0) past ``group``'s commits.

    Computed from the committed offsets alone: the bundled broker's high
    watermarks are not reliable (``ListOffsets`` answers 1 for every partition).
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        done = sum(max(0, tp.offset) for tp in consumer.committed(tps, timeout=60))
        return max(0, count - done)
    finally:
        consumer.close()


def read_output(bootstrap: str, topic: str, count: int, settle: float = OUTPUT_SETTLE,
                quiet: float = 3.0, partitions: int = PARTITIONS) -> tuple[list[Any], bool]:
    """Every committed record of ``topic`` as audit effects, in partition-offset order.

    Reads with ``read_committed`` from the beginning. It stops once every id
    ``0..count-1`` was read and nothing more arrived for ``quiet`` seconds (so
    late duplicates are counted too), or after ``settle`` seconds: records
    behind a transaction the killed producer left open become readable only
    once the broker aborts it. Returns the effects and whether every id was
    read (the bundled broker's high watermarks are not reliable, so the end
    is judged by the ids, not by offsets).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from htmqc.audit import Effect

    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"peers-audit-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    effects: list[Any] = []
    seen: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + settle
        last_record = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.consume(num_messages=1000, timeout=0.5)
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}: {error}")
                    continue
                ident = parse_id(message.value() or b"0")
                seen.add(ident)
                key = message.key()
                effects.append(Effect(str(ident), key.decode() if key is not None else None))
                last_record = time.monotonic()
            if len(seen) >= count and time.monotonic() - last_record >= quiet:
                return effects, True
        return effects, len(seen) >= count
    finally:
        consumer.close()


def open_transaction_ids(journal: Path) -> list[str]:
    """The ids a journal lists after its last commit line (``C``)."""
    try:
        lines = journal.read_text().split()
    except FileNotFoundError:
        return []
    last = max((n for n, line in enumerate(lines) if line == "C"), default=-1)
    return [line for line in lines[last + 1:] if line != "C"]


def hide_aborted(effects: list[Any], aborted_ids: list[str]) -> tuple[list[Any], int]:
    """``effects`` without the first copy of each id in ``aborted_ids`` stored twice or more.

    Returns the kept effects and how many were dropped.
    """
    copies: dict[str, int] = {}
    for effect in effects:
        copies[effect.id] = copies.get(effect.id, 0) + 1
    drop = {ident for ident in aborted_ids if copies.get(ident, 0) >= 2}
    kept: list[Any] = []
    for effect in effects:
        if effect.id in drop:
            drop.discard(effect.id)  # only the first (aborted) copy
            continue
        kept.append(effect)
    return kept, len(effects) - len(kept)


def audit_effects(count: int, effects: Any) -> dict[str, Any]:
    """Audit ``effects`` against the produced ids ``0..count-1``; the figures kept."""
    from htmqc.audit import Produced, audit

    report = audit((Produced(str(i)) for i in range(count)), effects)
    stored = report.totals["effects"]
    distinct = count - report.counts["lost"] + report.counts["unexpected"]
    return {
        "effects": stored,
        "duplicates": report.counts["duplicate"],  # ids stored more than once
        "extra_effects": stored - distinct,  # stored copies beyond the first
        "lost": report.counts["lost"],
        "anomalies": {k: v for k, v in report.counts.items() if v},
        "audit_ok": report.ok,
    }


def duplicates_after_kill(bootstrap: str, slot: Slot, count: int, timeout: float,
                          command: Callable[..., list[str]], spawn: Spawn) -> dict[str, Any]:
    """Kill ``slot`` once half-way, restart it, audit the stored effects.

    ``command(slot, topic, count, group, out, **options)`` builds a worker's
    argv (the runner's :func:`~benchmarks.peers.runner.worker_command`);
    ``spawn(argv, timeout)`` runs it to its end.
    """
    from htmqc.broker import create_topic
    from htmqc.produce import produce

    topic = f"peers-kill-{slot.key}-{uuid.uuid4().hex[:6]}"
    produce(bootstrap, topic, count, keys=KEYS, size=100, partitions=PARTITIONS)
    out_topic = f"{topic}-out" if is_kafka_output(slot) else None
    if out_topic:
        create_topic(bootstrap, out_topic, PARTITIONS)
    group = f"peers-kill-{uuid.uuid4().hex[:8]}"
    kill_at = count // 2
    with tempfile.TemporaryDirectory(prefix="peers-kill-") as work:
        store = None if out_topic else str(Path(work) / "store.db")
        started = time.monotonic()
        journal = Path(work) / "journal.txt" if out_topic else None
        first_code, first_err = spawn(
            command(slot, topic, count, group, Path(work) / "a.json", store=store,
                    kill_at=kill_at, out_topic=out_topic,
                    journal=str(journal) if journal else None), timeout)
        result: dict[str, Any] = {"count": count, "killed_after": kill_at, "store": (
            "output topic, read_committed" if out_topic else "SQLite effects table")}
        if first_code != -signal.SIGKILL:
            result["error"] = f"run 1 ended with {first_code}, not SIGKILL: {first_err}"
            return result
        if slot.module == "htmqc_peer":
            restart = count
            extra: dict[str, Any] = {"idle_exit": HTMQC_IDLE_EXIT}
        else:
            restart = remaining_in_group(bootstrap, group, topic, count)
            extra = {}
        result["restart_handled"] = 0
        if restart > 0:
            second = Path(work) / "b.json"
            code, err = spawn(command(slot, topic, restart, group, second,
                                      store=store, out_topic=out_topic, **extra), timeout)
            if code != 0 or not second.exists():
                result["error"] = f"run 2 exited with {code}: {err}"
                return result
            result["restart_handled"] = json.loads(second.read_text())["seen"]
        if out_topic and journal:
            served, settled = read_output(bootstrap, out_topic, count)
            result["output_settled"] = settled
            result["as_served"] = audit_effects(count, served)
            aborted = open_transaction_ids(journal)
            kept, dropped = hide_aborted(served, aborted)
            result["open_at_kill"] = len(aborted)
            result["aborted_copies_hidden"] = dropped
            result.update(audit_effects(count, kept))
        else:
            from htmqc.audit.load import effects_from_sqlite

            result.update(audit_effects(count, effects_from_sqlite(store or "")))
        result["seconds"] = round(time.monotonic() - started, 1)
    return result
