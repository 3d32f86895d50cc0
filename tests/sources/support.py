"""What the tests of every non-Kafka source share: draining a consumer, assigning
at given offsets, the sink's positions, and the checks that hold for each adapter
(seek and pause, ordered commits, exactly-once across a SIGKILL, each run's trace
valid against the reference model and the TLA+ spec, a secured server's run and
refusals)."""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.produce import ID_HEADER, parse_id
from htmqc.sources.pumped import OFFSET_INVALID
from model_checks.trace_validation import validate_trace
from tests.runtime.test_modes_broker import assigned_starts
from tests.runtime.test_run_broker import (
    effect_ids,
    exactly_once_args,
    finish,
    htmqc_run,
    stored,
    wait_for,
)

HANDLERS = "tests.runtime.handlers"


def traced(path: Path) -> list[str]:
    """The ``htmqc run`` arguments that write the core's transitions to ``path``."""
    return ["--trace", str(path)]


def check_traces(mode: str, *paths: Path) -> None:
    """Each run's trace (a SIGKILLed run's cut short) is a behaviour of the core
    the reference model accepts, and of the TLA+ spec where it is small enough
    for TLC (:func:`model_checks.trace_validation.validate_trace`): the adapter's
    positions drive the same machine as Kafka's."""
    for path in paths:
        report = validate_trace(path, mode=mode)
        assert report.lines > 0, f"{path.name}: no transitions traced"
        assert not report.violations, f"{path.name}: {report.violations[0]}"


def drain(consumer: Any, want: int, timeout: float = 10.0) -> list[Any]:
    """Consume until ``want`` messages came (or ``timeout``)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.consume(1000, 0.2)
    return got


def assign_at(offsets: dict[int, int]) -> Callable[[Any, list[KafkaTP]], None]:
    """An ``on_assign`` taking each partition at ``offsets`` (default 0)."""

    def on_assign(consumer: Any, parts: list[KafkaTP]) -> None:
        consumer.incremental_assign(
            [KafkaTP(p.topic, p.partition, offsets.get(p.partition, 0)) for p in parts]
        )

    return on_assign


def check_offsets(consumer: Any, topic: str, offsets: dict[int, list[int]], end: int) -> None:
    """Subscribed to ``topic``, one member gets one assignment of every partition and
    reads ``offsets`` (partition -> the offsets it holds, in order) of messages
    written by the source's ``produce``: message ``i`` on partition ``i % P`` at
    offset ``i // P``, key ``k{i % 100}``, its id header, a timestamp; every
    partition's position and high watermark are then ``end``."""
    assigned: list[list[KafkaTP]] = []

    def on_assign(c: Any, parts: list[KafkaTP]) -> None:
        assigned.append(parts)
        assign_at({})(c, parts)

    consumer.subscribe([topic], on_assign=on_assign)
    got = drain(consumer, sum(map(len, offsets.values())))
    assert len(assigned) == 1, "one member: one assignment of every partition"
    assert sorted(p.partition for p in assigned[0]) == sorted(offsets)
    by: dict[int, list[int]] = {}
    n = len(offsets)
    for msg in got:
        by.setdefault(msg.partition(), []).append(msg.offset())
        ident = parse_id(msg.value())
        assert (ident % n, ident // n) == (msg.partition(), msg.offset())
        assert msg.key() == f"k{ident % 100}".encode()
        assert (ID_HEADER, str(ident).encode()) in (msg.headers() or [])
        assert msg.topic() == topic and msg.error() is None
        assert msg.timestamp()[1] > 1_600_000_000_000
    assert by == offsets
    positions = consumer.position([KafkaTP(topic, p) for p in range(n)])
    assert [p.offset for p in positions] == [end] * n
    assert consumer.get_watermark_offsets(KafkaTP(topic, 1)) == (0, end)


def positions(db: Path) -> dict[int, int]:
    """Partition -> committed offset stored in the sink."""
    with sqlite3.connect(db) as conn:
        return {
            p: c for p, c in conn.execute('SELECT "partition", committed FROM htmqc_positions')
        }


def check_seek_and_pause(consumer: Any, topic: str) -> None:
    """On a 2-partition ``topic`` of 200 messages: a seek fetches again from its
    offset, a paused partition hands out nothing until resumed, and a partition
    not assigned cannot be sought."""
    consumer.subscribe([topic], on_assign=assign_at({}))
    assert len(drain(consumer, 200)) == 200
    consumer.seek(KafkaTP(topic, 0, 90))
    consumer.pause([KafkaTP(topic, 1)])
    consumer.seek(KafkaTP(topic, 1, 0))
    got = drain(consumer, 10)  # a seek re-subscribes: seconds on a loaded box
    seen = [(m.partition(), m.offset()) for m in got]
    assert seen == [(0, o) for o in range(90, 100)], seen
    assert consumer.consume(100, 0.5) == [], "a paused partition hands out nothing"
    consumer.resume([KafkaTP(topic, 1)])
    assert [m.offset() for m in drain(consumer, 100)] == list(range(100))
    with pytest.raises(Exception, match="cannot seek"):
        consumer.seek(KafkaTP(topic, 7, 0))


def check_commits(
    make: Callable[..., Any], topic: str, committed: Callable[[int], int | None], keeps: bool
) -> None:
    """On a 2-partition ``topic`` of 10 messages, with ``make(on_commit=...)`` a
    member of one group: asynchronous commits are stored in order and reported
    inside ``consume``, a synchronous one returns its partitions, ``committed``
    reads them back (with the metadata if the source ``keeps`` it), and a new
    member assigned without offsets starts at them."""
    acks: list[tuple[Any, list[KafkaTP]]] = []
    consumer = make(on_commit=lambda e, p: acks.append((e, p)))
    try:
        consumer.subscribe([topic], on_assign=assign_at({}))
        for offset in range(1, 6):  # asynchronous, in order: the last one stands
            consumer.commit(offsets=[KafkaTP(topic, 0, offset, metadata=f"m{offset}")])
        assert acks == [], "an outcome is reported inside consume, not on another thread"
        deadline = time.monotonic() + 5
        while len(acks) < 5 and time.monotonic() < deadline:
            consumer.consume(10, 0.1)
        assert [(e, p[0].offset) for e, p in acks] == [(None, o) for o in range(1, 6)]
        done = consumer.commit(offsets=[KafkaTP(topic, 1, 4)], asynchronous=False)
        assert [(p.partition, p.offset) for p in done] == [(1, 4)]
        got = consumer.committed([KafkaTP(topic, p) for p in range(2)] + [KafkaTP(topic, 9)])
        assert [(p.offset, p.metadata) for p in got] == [
            (5, "m5" if keeps else None), (4, None), (OFFSET_INVALID, None)
        ]
        assert committed(0) == 5
    finally:
        consumer.close()
    again = make()
    try:
        again.subscribe([topic])
        got = drain(again, 1, timeout=3) + drain(again, 10, timeout=1)
        # partition 0 holds offsets 0..4 (all committed), partition 1 committed up to 4
        assert sorted((m.partition(), m.offset()) for m in got) == [(1, 4)]
    finally:
        again.close()


def check_exactly_once_across_sigkill(
    url: str, topic: str, source: list[str], tmp_path: Path, n: int
) -> None:
    """``htmqc run`` exactly-once into SQLite over a 4-partition ``topic`` of ``n``
    messages (``source``: the ``--source`` arguments), SIGKILLed mid-transaction
    after 1,500 effects: the restart resumes at the sink's positions and every
    effect is stored exactly once."""
    db, log = tmp_path / "eo.db", tmp_path / "run.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    once = exactly_once_args(db, "g-eo", "--txn-messages", "300")
    args = [f"{HANDLERS}:slow_record", *source, *once]
    first = htmqc_run(url, topic, *args, *traced(trace1), log=log)
    try:
        wait_for(lambda: stored(db) >= 1500, 60, "the first transactions")
    finally:
        first.send_signal(signal.SIGKILL)  # mid-batch: a transaction is open
        first.wait(10)
    at_kill = positions(db)
    assert sum(at_kill.values()) < n
    assert len(effect_ids(db)) == sum(at_kill.values()), "effects and positions disagree"
    second_log = tmp_path / "second.log"
    second = htmqc_run(url, topic, *args, *traced(trace2), "--idle-exit", "2", log=second_log)
    assert finish(second, 90) == 0, second_log.read_text()[-2000:]
    starts = assigned_starts(second_log, topic)
    assert starts == {p: at_kill.get(p, 0) for p in range(4)}, "did not resume at the sink"
    ids = effect_ids(db)
    assert len(ids) == n, "lost or duplicated effects"
    assert sorted(ids) == list(range(n))
    assert stored(db) == n
    check_traces("exactly-once", trace1, trace2)


def check_exactly_once_through_kills(
    url: str, topic: str, source: list[str], tmp_path: Path, n: int, *, kills: int = 4,
    seed: int = 0,
) -> None:
    """Consumer faults, chaos-style: ``htmqc run`` exactly-once into SQLite over a
    4-partition ``topic`` of ``n`` messages is SIGKILLed ``kills`` times, each
    time after a random number (seeded) of further effects, and restarted (a
    restart may wait out the killed member's lease as a standby); a last run
    finishes the topic. After every kill the effects and the positions agree,
    with no effect twice; at the end every message has exactly one effect, and
    every process's trace is a behaviour of the reference model."""
    rng = random.Random(seed)
    db = tmp_path / "chaos.db"
    once = exactly_once_args(db, "g-chaos", "--txn-messages", "200")
    args = [f"{HANDLERS}:slow_record", *source, *once]
    traces: list[Path] = []
    for k in range(kills):
        traces.append(tmp_path / f"run{k}.trace")
        log = tmp_path / f"run{k}.log"
        target = min(n - 1, stored(db) + rng.randint(100, n // (kills + 1)))
        proc = htmqc_run(url, topic, *args, *traced(traces[-1]), log=log)
        try:
            wait_for(lambda t=target, p=proc: stored(db) >= t or p.poll() is not None, 120,
                     f"run {k}'s effects")  # fmt: skip
            assert proc.poll() is None, f"run {k} ended before its kill: " + log.read_text()[-2000:]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        ids = effect_ids(db)
        assert len(ids) == len(set(ids)), f"an effect twice after kill {k}"
        assert len(ids) == sum(positions(db).values()), f"effects and positions differ, kill {k}"
    traces.append(tmp_path / "last.trace")
    last_log = tmp_path / "last.log"
    # Stop on the count left, not on idleness: on a loaded box a restarted member
    # can be idle for seconds before its first delivery.
    left = n - len(effect_ids(db))
    stop = ["--max-messages", str(left)] if left else ["--idle-exit", "2"]
    last = htmqc_run(url, topic, *args, *traced(traces[-1]), *stop, log=last_log)
    assert finish(last, 180) == 0, last_log.read_text()[-2000:]
    ids = effect_ids(db)
    if sorted(ids) != list(range(n)):
        seen = Counter(ids)
        raise AssertionError(
            f"lost {sorted(set(range(n)) - set(seen))[:20]}, twice "
            f"{sorted(i for i, c in seen.items() if c > 1)[:20]}; positions {positions(db)}; "
            f"the last run's log ends:\n{last_log.read_text()[-3000:]}"
        )
    check_traces("exactly-once", *traces)


# -- a secured server (TLS, credentials) -----------------------------------------------------


def check_secured_run(
    source: str,
    bootstrap: str,
    client_of: Callable[[str], Any],
    produce: Callable[..., Any],
    topic: str,
    tmp_path: Path,
    *,
    shown: str,
    secret: str,
    n: int = 300,
) -> None:
    """``htmqc run --source SOURCE`` at ``bootstrap`` handles and commits all ``n``
    messages of a 2-partition ``topic`` (produced, and the commits read, with
    ``client_of(bootstrap)``); its log shows ``shown`` (the address, masked) and
    never ``secret``."""
    client = client_of(bootstrap)
    try:
        produce(bootstrap, topic, n, partitions=2, client=client)
        log, out = tmp_path / "run.log", tmp_path / "out.txt"
        proc = htmqc_run(
            bootstrap, topic, f"{HANDLERS}:log_order", "--source", source, "--group", "g",
            "--idle-exit", "2", "--log-level", "DEBUG", log=log,
            env={"HTMQC_TEST_OUT": str(out)},
        )  # fmt: skip
        assert finish(proc, 90) == 0, log.read_text()[-2000:]
        assert sum(client.committed("g", topic, p) or 0 for p in range(2)) == n
    finally:
        client.close()
    assert len(out.read_text().splitlines()) == n
    text = log.read_text()
    assert shown in text and secret not in text, text[:2000]


def check_mutual_tls(client_of: Callable[[str], Any], url_with: Callable[[str], str], pki: Any,
                     topic: str) -> None:  # fmt: skip
    """A client of ``url_with(query)`` with ``pki``'s CA and client certificate
    connects to a server that verifies clients, and makes and counts ``topic``."""
    client = client_of(url_with(f"ca={pki.ca}&cert={pki.client_cert}&key={pki.client_key}"))
    try:
        client.create_topic(topic, 1)
        assert client.partitions(topic) == 1
    finally:
        client.close()


def check_refusal(connect: Callable[[], Any], said: str, hint: str, *secrets: str) -> None:
    """``connect()`` (given a 20 s budget) is refused in under 5 s with one line
    saying ``said`` and ``hint``, and none of ``secrets``."""
    from htmqc.errors import RuntimeFailure

    started = time.monotonic()
    with pytest.raises(RuntimeFailure) as caught:
        connect()
    line = caught.value.line()
    took = time.monotonic() - started
    assert took < 5.0, (took, line)  # not the 20 s a server that is down gets
    assert said in line and hint in line and "\n" not in line, line
    assert not any(s in line for s in secrets), line


def check_cli_refusal(source: str, bootstrap: str, said: str, secret: str, tmp_path: Path) -> None:
    """``htmqc run`` at ``bootstrap`` ends non-zero with a last line that is the
    one-line error saying ``said``; no traceback and no ``secret`` anywhere."""
    log = tmp_path / "run.log"
    proc = htmqc_run(bootstrap, "t", f"{HANDLERS}:log_order", "--source", source, "--group", "g",
                     log=log)  # fmt: skip
    assert finish(proc, 60) != 0
    text = log.read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith("htmqc: error: ") and said in last, text
    assert "Traceback" not in text and secret not in text, text


@dataclass(frozen=True)
class ZombieFiles:
    """The files of a zombie test in ``tmp``: the stall ``flag`` (created: the member
    stalls while it exists), the ``marker`` the stalled handler writes (its message
    id and pid), and the logs and traces of members A and B."""

    flag: Path
    marker: Path
    log_a: Path
    log_b: Path
    trace_a: Path
    trace_b: Path

    @classmethod
    def under(cls, tmp: Path) -> ZombieFiles:
        flag = tmp / "stall"
        flag.touch()
        return cls(flag, Path(f"{flag}.stalled"), tmp / "a.log", tmp / "b.log",
                   tmp / "a.trace", tmp / "b.trace")  # fmt: skip


def stalling_member(
    source: str, group: str, pg: Any, flag: Path, stall_at: int, *extra: str
) -> tuple[list[str], dict[str, str]]:
    """``htmqc run`` arguments (after the URL and topic) and environment of a member,
    exactly-once into the PostgreSQL tables ``pg`` (transactions of 100), that stalls
    inside its open transaction on the first message from ``stall_at`` while ``flag``
    exists (:func:`tests.runtime.handlers.stalling_record`)."""
    args = [f"{HANDLERS}:stalling_record", "--source", source, "--group", group,
            "--mode", "exactly-once", "--sink", pg.sink, "--txn-messages", "100", *extra]
    env = {"HTMQC_TEST_TABLE": pg.effects, "HTMQC_TEST_STALL": str(flag),
           "HTMQC_TEST_STALL_AT": str(stall_at)}  # fmt: skip
    return args, env


def check_zombie_stored_nothing(pg: Any, n: int, stalled_id: int, successor: int) -> None:
    """Every one of the ``n`` messages has exactly one effect in ``pg``, and the
    stalled message's is the successor's (process ``successor``): the zombie's late
    transaction was not stored."""
    rows = pg.rows()
    ids = Counter(r[0] for r in rows)
    assert sorted(ids) == list(range(n)), "lost effects"
    assert [i for i, c in ids.items() if c > 1] == [], "the zombie's late transaction was stored"
    [stalled_row] = [r for r in rows if r[0] == stalled_id]
    assert stalled_row[3] == successor, "the stalled message's effect must be the successor's"
    assert pg.stored() == n
