"""Several members of one group sharing a Pulsar topic (``?subscription=failover``,
:mod:`htmqc.sources.pulsar_members`) on a private standalone broker:

* adapter: a second member takes half of the partitions only after the first one
  revoked them and committed, so a clean join reads nothing twice; the first member's
  close hands the rest over at once; a bad ``subscription=`` is one line;
* ``htmqc run``, at-least-once: two members share 4 partitions, one is SIGKILLed, the
  other takes its partitions and nothing is lost;
* ``htmqc run``, exactly-once into PostgreSQL: two members share 4 partitions (both
  store effects), one is SIGKILLed mid-transaction, every message has exactly one
  effect, and the clean join fenced nobody.
The model of the hand-over is in test_pulsar_members.py.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.produce import parse_id
from htmqc.sources.pulsar import PulsarClient, PulsarConsumer, endpoint_of, produce
from htmqc.sources.pulsar_server import PulsarServer
from tests.runtime.test_modes_broker import kill, kill_left, pg_tables
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for
from tests.sources.support import (
    HANDLERS,
    ZombieFiles,
    check_traces,
    check_zombie_stored_nothing,
    stalling_member,
    traced,
)

pytestmark = pytest.mark.slow


def failover(url: str) -> str:
    """``url`` with ``subscription=failover``."""
    return f"{url}{'&' if '?' in url else '?'}subscription=failover"


class Member:
    """A :class:`PulsarConsumer` whose rebalance callbacks behave as the runtime's:
    a revoke commits what was handed out, synchronously, then lets go; it records
    when each assignment and revoke happened."""

    def __init__(self, url: str, group: str, topics: str | list[str]) -> None:
        self.consumer = PulsarConsumer(failover(url), group)
        self.got: list[Any] = []
        self.assigned: list[tuple[float, list[int]]] = []
        self.revoked: list[tuple[float, list[int]]] = []
        self.tps: set[tuple[str, int]] = set()
        topics = [topics] if isinstance(topics, str) else topics
        self.consumer.subscribe(topics, on_assign=self._assign, on_revoke=self._revoke)

    def _assign(self, consumer: Any, parts: list[KafkaTP]) -> None:
        self.assigned.append((time.monotonic(), sorted(p.partition for p in parts)))
        self.tps |= {(p.topic, p.partition) for p in parts}
        consumer.incremental_assign(parts)  # at the group's commits

    def _revoke(self, consumer: Any, parts: list[KafkaTP]) -> None:
        done = [p for p in consumer.position(parts) if p.offset >= 0]
        if done:
            consumer.commit(offsets=done, asynchronous=False)
        consumer.incremental_unassign(parts)
        self.revoked.append((time.monotonic(), sorted(p.partition for p in parts)))
        self.tps -= {(p.topic, p.partition) for p in parts}

    def held_tps(self) -> set[tuple[str, int]]:
        return set(self.tps)

    def held(self) -> set[int]:
        out: set[int] = set()
        for _at, parts in self.assigned:
            out |= set(parts)
        for _at, parts in self.revoked:
            out -= set(parts)
        return out

    def poll(self) -> None:
        self.got += self.consumer.consume(500, 0.05)


def _state(members: list[Member]) -> str:
    """What each member holds and has read, by partition (for a timeout's message)."""
    return "; ".join(
        f"member {i} holds {sorted(m.held())}, read "
        f"{dict(sorted(Counter(msg.partition() for msg in m.got).items()))}"
        for i, m in enumerate(members)
    )


def run_until(members: list[Member], done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what} ({_state(members)})"
        for member in members:
            member.poll()


def test_a_clean_join_hands_partitions_over_after_the_revoke_and_reads_nothing_twice(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    url, topic, group = pulsar_server.bootstrap, topic_name(), f"g{uuid.uuid4().hex[:6]}"
    produce(url, topic, 400, partitions=4, client=client)
    first = Member(url, group, topic)
    second: Member | None = None
    try:
        run_until([first], lambda: len(first.got) == 400, 30, "the first member's 400")
        assert first.held() == {0, 1, 2, 3}
        second = Member(url, group, topic)
        b = second
        run_until([first, b], lambda: len(b.held()) == 2 and len(first.held()) == 2, 30,
                  "the partitions to be shared")  # fmt: skip
        # The broker moves each partition by itself: one step or several.
        revoked_at = {p: at for at, parts in first.revoked for p in parts}
        assigned_at = {p: at for at, parts in b.assigned for p in parts}
        assigned = sorted(assigned_at)
        assert sorted(revoked_at) == assigned, "the second member got what the first let go of"
        for p in assigned:
            assert revoked_at[p] < assigned_at[p], f"{p} taken before the first let go of it"
            assert assigned_at[p] - revoked_at[p] < 5, "the release did not reach the new holder"
        produce(url, topic, 400, partitions=4, start_id=400, client=client)
        run_until([first, b], lambda: len(first.got) + len(b.got) == 800, 30, "the next 400")
        time.sleep(1)
        for member in (first, b):
            member.poll()
        ids = Counter(parse_id(m.value()) for m in [*first.got, *b.got])
        assert sorted(ids) == list(range(800)) and set(ids.values()) == {1}, "lost or twice"
        assert {m.partition() for m in b.got} == set(assigned)
        assert {parse_id(m.value()) % 4 for m in b.got} == set(assigned)
        first.consumer.close()
        began = time.monotonic()
        run_until([b], lambda: b.held() == {0, 1, 2, 3}, 10, "the rest after the close")
        assert time.monotonic() - began < 5, "a closed member's partitions move at once"
    finally:
        first.consumer.close()
        if second is not None:
            second.consumer.close()


def test_a_bad_subscription_is_one_line(pulsar_server: PulsarServer) -> None:
    with pytest.raises(UsageError, match="subscription 'shared' is not a way") as info:
        endpoint_of(f"{pulsar_server.bootstrap}&subscription=shared")
    assert "?subscription=failover" in info.value.line()
    assert endpoint_of(failover(pulsar_server.bootstrap)).subscription == "failover"
    assert endpoint_of(pulsar_server.bootstrap).subscription == "exclusive"


def _ids(path: Path) -> list[int]:
    return [int(line.split()[2]) for line in path.read_text().splitlines()] if path.exists() else []


def test_at_least_once_two_members_share_and_one_is_killed(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    url, topic, n, group = failover(pulsar_server.bootstrap), topic_name(), 6000, "g-share"
    produce(pulsar_server.bootstrap, topic, n, partitions=4, client=client)
    out1, out2 = tmp_path / "first.txt", tmp_path / "second.txt"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    args = [f"{HANDLERS}:slow_log_order", "--source", "pulsar", "--group", group]
    first = htmqc_run(url, topic, *args, *traced(trace1), env={"HTMQC_TEST_OUT": str(out1)},
                      log=log1)  # fmt: skip
    second = None
    try:
        wait_for(lambda: len(_ids(out1)) >= 300, 60, "the first member's work")
        second = htmqc_run(url, topic, *args, *traced(trace2), "--idle-exit", "3",
                           env={"HTMQC_TEST_OUT": str(out2)}, log=log2)  # fmt: skip
        wait_for(lambda: "took partitions" in log2.read_text(), 30, "the second member's share")
        wait_for(lambda: len(_ids(out2)) >= 200, 60, "the second member's work")
        assert "moved to other members; letting go" in log1.read_text()
        assert len(set(_ids(out1))) < n - 1000, "the first member should not be done yet"
    finally:
        kill(first)
    assert second is not None
    assert finish(second, 120) == 0, log2.read_text()[-2000:]
    ids1, ids2 = _ids(out1), _ids(out2)
    assert set(ids1) | set(ids2) == set(range(n)), "lost messages"
    assert len(ids2) == len(set(ids2)), "the survivor ran a message twice"
    assert sum(client.committed(group, topic, p) or 0 for p in range(4)) == n
    check_traces("at-least-once", trace1, trace2)


def test_exactly_once_two_members_share_and_one_is_killed_mid_transaction(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    url, topic, n = failover(pulsar_server.bootstrap), topic_name(), 5000
    group = f"g-eo-{uuid.uuid4().hex[:6]}"
    produce(pulsar_server.bootstrap, topic, n, partitions=4, client=client)
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    trace1, trace2 = tmp_path / "first.trace", tmp_path / "second.trace"
    with pg_tables() as pg:
        args = [f"{HANDLERS}:slow_table_record", "--source", "pulsar", "--group", group,
                "--mode", "exactly-once", "--sink", pg.sink, "--txn-messages", "100"]
        env = {"HTMQC_TEST_TABLE": pg.effects}
        first = htmqc_run(url, topic, *args, *traced(trace1), env=env, log=log1)
        second = None
        try:
            wait_for(lambda: pg.stored() >= 500, 60, "the first member's transactions")
            second = htmqc_run(url, topic, *args, *traced(trace2), "--idle-exit", "3", env=env,
                               log=log2)  # fmt: skip
            wait_for(lambda: "took partitions" in log2.read_text(), 30, "the second's share")
            wait_for(lambda: len({r[3] for r in pg.rows()}) == 2, 60, "both to store effects")
            assert pg.stored() < n - 500, "the first member should not be done yet"
        finally:
            kill(first)  # mid-transaction: --txn-messages 100 and a row every 0.5 ms
        try:
            assert finish(second, 120) == 0, log2.read_text()[-2000:]
        finally:
            kill_left(first, second)
        ids = Counter(r[0] for r in pg.rows())
        assert sorted(ids) == list(range(n)), "lost effects"
        assert [i for i, c in ids.items() if c > 1] == [], "an effect stored twice"
        assert pg.stored() == n
        for log in (log1, log2):
            assert "fenced" not in log.read_text(), "a clean join should fence nobody"
    check_traces("exactly-once", trace1, trace2)


def test_a_frozen_member_loses_its_partitions_and_its_late_transaction_is_fenced(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """The zombie of a shared topic: member A, exactly-once into PostgreSQL, is frozen
    (SIGSTOP) inside an open transaction while it holds both partitions. B joins and
    waits for A's release, which never comes; the broker drops A's consumer once the
    members topic is unloaded (what its load balancer does; a frozen client's
    keepalive would take longer), so B takes both partitions at once, claims them
    (bumping their fences) and stores everything. When A wakes, its late transaction
    is fenced: the row of the message it stalled on is B's, every message has
    exactly one effect, and both traces are behaviours of the model."""
    from htmqc.sources.pulsar import members_topic

    topic, n, stall_at = topic_name(), 2000, 600
    url, group = failover(pulsar_server.bootstrap), f"g-frozen-{uuid.uuid4().hex[:6]}"
    produce(pulsar_server.bootstrap, topic, n, partitions=2, client=client)
    files = ZombieFiles.under(tmp_path)
    flag, marker = files.flag, files.marker
    log_a, log_b, trace_a, trace_b = files.log_a, files.log_b, files.trace_a, files.trace_b
    with pg_tables() as pg:
        args, env = stalling_member("pulsar", group, pg, flag, stall_at, "--idle-exit", "20")
        a = htmqc_run(url, topic, *args, *traced(trace_a), env=env, log=log_a)
        b = None
        try:
            wait_for(marker.exists, 60, "A to stall inside a transaction")
            stalled_id, stalled_pid = map(int, marker.read_text().split())
            assert stalled_pid == a.pid
            a.send_signal(signal.SIGSTOP)
            flag.unlink()  # when A runs again, it goes on at once
            before = pg.stored()
            assert 0 < before < n, "A should have committed some transactions before stalling"
            b = htmqc_run(url, topic, *args, *traced(trace_b), env=env, log=log_b)
            wait_for(lambda: "for the release of partitions" in log_b.read_text(), 30,
                     "B to wait for A's release")  # fmt: skip
            assert pg.stored() == before, "B took a partition A still holds"
            lease = members_topic(group, topic).removeprefix("persistent://")
            pulsar_server.admin("PUT", f"/v2/persistent/{lease}/unload")
            wait_for(lambda: pg.stored() == n, 120, "B to take both partitions and store all")
            a.send_signal(signal.SIGCONT)  # the zombie wakes up inside its old transaction
            assert finish(a, 90) == 0, log_a.read_text()[-3000:]
            assert finish(b, 90) == 0, log_b.read_text()[-3000:]
        finally:
            kill_left(a, b)
        text = log_a.read_text()
        assert "fenced: " in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        check_zombie_stored_nothing(pg, n, stalled_id, b.pid)
    check_traces("exactly-once", trace_a, trace_b)


def test_a_member_whose_share_stays_in_doubt_stops(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    """The broker goes away (restarted) under a member sharing a topic: its Failover
    subscription is disconnected and its owners unreadable past the grace, so other
    members may hold its partitions now: it stops, in one line."""
    topic = topic_name()
    produce(pulsar_server.bootstrap, topic, 10, partitions=2, client=client)
    consumer = PulsarConsumer(failover(pulsar_server.bootstrap), "gd", lease_grace=1.0)
    try:
        consumer.subscribe([topic])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            got += consumer.consume(100, 0.2)
        assert len(got) == 10
        pulsar_server.restart()
        with pytest.raises(RuntimeFailure, match=r"share of group 'gd' .* was lost") as info:
            for _ in range(100):
                consumer.consume(100, 0.1)
        assert "\n" not in info.value.line() and "joins the group again" in info.value.line()
    finally:
        consumer.close()


def test_the_members_topic_grows_with_a_retry_topic_and_extra_partitions_are_ignored(
    pulsar_server: PulsarServer, client: PulsarClient, topic_name: Callable[[], str]
) -> None:
    """A run with ``--retry-topic`` reads one partition more than one without: the
    members topic grows to it (Pulsar cannot shrink a topic, so a later run without
    the retry topic ignores the extra partition)."""
    from htmqc.sources.pulsar import members_topic

    url, topic, group = pulsar_server.bootstrap, topic_name(), f"g{uuid.uuid4().hex[:6]}"
    produce(url, topic, 4, partitions=2, client=client)
    retry = client.create_retry_topic(topic)
    for topics, want in (([topic], 2), ([topic, retry], 3), ([topic], 2)):
        member = Member(url, group, topics)
        try:
            deadline = time.monotonic() + 20
            while len(member.held_tps()) < want and time.monotonic() < deadline:
                member.poll()
            assert sorted(member.held_tps()) == sorted(
                (t, p) for t in topics for p in range(2 if t == topic else 1)
            )
        finally:
            member.consumer.close()
    assert client.partitions(members_topic(group, topic)) == 3
