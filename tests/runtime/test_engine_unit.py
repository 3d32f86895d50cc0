"""The engine against a fake consumer (no broker): ordering, flow control, revoke."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given
from hypothesis import strategies as st

from htmqc.errors import RuntimeFailure
from htmqc.runtime import Engine, RunOptions, loop
from htmqc.runtime.intake import ANY_READERS, READERS, drop_errors
from htmqc.sinks import open_sink
from htmqc.testing import FakeConsumer, FakeMessage, FakeProducer, make_logs

TOPIC = "t"


def engine_for(handler: Any, consumer: FakeConsumer, **options: Any) -> Engine:
    opts = RunOptions(bootstrap="fake:1", topic=TOPIC, group="g", **options)
    engine = Engine(handler, opts, consumer, seed=1)
    consumer.on_commit = engine.on_commit
    return engine


def engine_in(
    mode: str, tmp_path: Path, handler: Any, consumer: FakeConsumer, **options: Any
) -> Engine:
    """An engine in ``mode``; exactly-once into a SQLite file under ``tmp_path``."""
    url = f"sqlite:///{tmp_path / 'eo.db'}" if mode == "exactly-once" else None
    opts = RunOptions(bootstrap="fake:1", topic=TOPIC, group="g", mode=mode, sink=url,
                      **options)  # fmt: skip
    sink = None
    if url is not None:
        sink = open_sink(url)
        sink.open("g")
    engine = Engine(handler, opts, consumer, sink=sink, seed=1)
    consumer.on_commit = engine.on_commit
    return engine


def run_in_thread(engine: Engine) -> threading.Thread:
    t = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    t.start()
    return t


def revoke(consumer: FakeConsumer, tp: tuple[str, int] = (TOPIC, 0)) -> float:
    """Revoke ``tp`` at the engine's next poll; the seconds until it let ``tp`` go."""
    began = time.monotonic()
    consumer.rebalance("revoke", [tp])
    while time.monotonic() - began < 10 and tp in consumer.positions:
        time.sleep(0.01)
    assert tp not in consumer.positions, "the revoke did not end in 10 s"
    return time.monotonic() - began


def test_per_key_order_under_parallel_workers() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, 400, keys=7))
    seen: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    running: set[bytes] = set()
    overlap = {"max": 0, "same_key": 0}
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        key = (msg.partition(), msg.key())
        with lock:
            if msg.key() in running:
                overlap["same_key"] += 1
            running.add(msg.key())
            overlap["max"] = max(overlap["max"], len(running))
        time.sleep(0.0002)
        with lock:
            running.discard(msg.key())
            seen[key].append(msg.offset())

    engine = engine_for(handler, consumer, workers=4, max_messages=800, batch_size=50)
    engine.run(install_signals=False)
    assert sum(len(v) for v in seen.values()) == 800
    for offsets in seen.values():
        assert offsets == sorted(offsets)
    assert overlap["same_key"] == 0
    assert overlap["max"] > 1, "different keys never ran in parallel"
    assert consumer.commits[(TOPIC, 0)][0] == 400 and consumer.commits[(TOPIC, 1)][0] == 400


def test_max_in_flight_pauses_and_resumes() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 2, 300, keys=50))
    gate = threading.Event()
    peak = {"in_flight": 0}
    engine: Engine

    def handler(msg: Any) -> None:
        gate.wait(10)

    engine = engine_for(
        handler, consumer, workers=2, max_in_flight=40, batch_size=10, max_messages=600
    )
    thread = run_in_thread(engine)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not consumer.paused:
        time.sleep(0.01)
    assert consumer.paused, "partitions were never paused at max-in-flight"
    for _ in range(20):  # the loop keeps polling while paused, and fetches nothing
        peak["in_flight"] = max(peak["in_flight"], engine.in_flight)
        time.sleep(0.01)
    assert peak["in_flight"] <= 40 + 10  # at most one batch past the bound
    gate.set()
    thread.join(20)
    assert not thread.is_alive()
    assert engine.finished == 600
    assert consumer.resume_events >= 1


def test_revoke_waits_for_running_work_then_commits_the_watermark() -> None:
    """Four lanes, 20 messages of 20 keys handed out: the revoke lets the calls
    running finish and starts no other; what finished is committed up to the first
    offset that did not run, and nothing of the partition runs after it."""
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 20, keys=20))
    started = threading.Event()
    ran: list[int] = []

    def handler(msg: Any) -> None:
        ran.append(msg.offset())
        started.set()
        time.sleep(0.02)

    engine = engine_for(handler, consumer, workers=4, batch_size=20, shutdown_seconds=5)
    thread = run_in_thread(engine)
    assert started.wait(5)
    revoke(consumer)
    at_revoke = sorted(ran)
    time.sleep(0.1)
    engine.stop()
    thread.join(10)
    assert sorted(ran) == at_revoke, "a call of the revoked partition started after it"
    first_not_run = next(i for i in range(21) if i not in ran)
    assert consumer.commits[(TOPIC, 0)][0] == first_not_run
    assert engine.core.epoch((TOPIC, 0)) is None


def test_a_revoke_waits_for_its_partitions_work_not_for_the_others() -> None:
    """Partition 1's handler is stuck; partition 0 is revoked: the revoke waits for
    partition 0's work only (its lanes are other lanes than the stuck one), commits
    it and lets go at once, not after ``--shutdown-seconds``."""
    workers = 4
    stuck_key = b"stuck"
    keys = [k for k in (f"k{i}".encode() for i in range(200))
            if hash(k) % workers != hash(stuck_key) % workers][:10]  # fmt: skip
    logs = {
        (TOPIC, 0): [(keys[i % len(keys)], f"0:{i}".encode()) for i in range(40)],
        (TOPIC, 1): [(stuck_key, f"1:{i}".encode()) for i in range(5)],
    }
    consumer = FakeConsumer.from_logs(logs)
    gate, blocked = threading.Event(), threading.Event()
    ran: set[int] = set()

    def handler(msg: Any) -> None:
        if msg.partition() == 1:
            blocked.set()
            gate.wait(20)
        else:
            ran.add(msg.offset())

    engine = engine_for(handler, consumer, workers=workers, batch_size=50, shutdown_seconds=8)
    thread = run_in_thread(engine)
    try:
        assert blocked.wait(5)
        took = revoke(consumer)
        assert took < 2, f"the revoke waited {took:.1f} s for another partition's work"
        # What finished is committed (what was still queued, if any, was dropped).
        first_not_run = next(i for i in range(41) if i not in ran)
        assert consumer.commits[(TOPIC, 0)][0] == first_not_run
    finally:
        gate.set()
        engine.stop()
        thread.join(10)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_revoke_waits_for_the_running_call_only_and_the_rest_runs_once_later(
    mode: str, tmp_path: Path
) -> None:
    """One worker, a handler taking 1 s, 30 messages of one partition handed out: the
    revoke ends the partition's lease at once, so the call running finishes and the
    ones queued behind it never start. The revoke takes about one call (it used to
    wait for the whole queue, cut at ``--shutdown-seconds``: 8 s) and commits the call
    that finished; assigned again, the partition goes on from there: every message
    runs exactly once."""
    slow, started = threading.Event(), threading.Event()
    slow.set()
    calls: list[int] = []

    def handler(msg: Any, *tx: Any) -> None:
        calls.append(msg.offset())
        started.set()
        if slow.is_set():
            time.sleep(1.0)

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 30, keys=1))
    engine = engine_in(mode, tmp_path, handler, consumer, workers=1, batch_size=50,
                       shutdown_seconds=8, max_messages=30)  # fmt: skip
    thread = run_in_thread(engine)
    try:
        assert started.wait(5)
        time.sleep(0.3)
        took = revoke(consumer)
        assert took < 2.5, f"the revoke waited {took:.1f} s for work that had not started"
        assert calls == [0], "a call of a revoked partition started during its revoke"
        slow.clear()
        consumer.rebalance("assign", [(TOPIC, 0)])
        thread.join(20)
        assert not thread.is_alive()
        assert calls == list(range(30)), "lost, or run twice, across the revoke"
        if mode == "at-least-once":
            assert consumer.commits[(TOPIC, 0)][0] == 30
    finally:
        slow.clear()
        engine.stop()
        thread.join(10)


def test_completions_after_revoke_are_ignored_and_nothing_unfinished_is_committed() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 5, keys=5))
    gate = threading.Event()
    calls: list[int] = []

    def handler(msg: Any) -> None:
        calls.append(msg.offset())
        if msg.offset() == 2:
            gate.wait(10)

    engine = engine_for(handler, consumer, workers=2, batch_size=5, shutdown_seconds=0.1)
    thread = run_in_thread(engine)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and 2 not in calls:
        time.sleep(0.01)
    consumer.rebalance("revoke", [(TOPIC, 0)])
    while time.monotonic() < deadline and (TOPIC, 0) in consumer.positions:
        time.sleep(0.01)
    assert (TOPIC, 0) not in consumer.positions
    committed = consumer.commits.get((TOPIC, 0), (0, None))[0]
    assert committed <= 2, "committed past the unfinished offset 2"
    gate.set()  # offset 2 finishes after the revoke: a late completion
    time.sleep(0.3)
    engine.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert consumer.commits.get((TOPIC, 0), (0, None))[0] == committed


def test_failed_message_is_retried_and_holds_back_only_its_key() -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 6, keys=2))  # k0: 0,2,4  k1: 1,3,5
    order: list[int] = []
    failures = {"n": 0}

    def handler(msg: Any) -> None:
        if msg.offset() == 0 and failures["n"] < 2:
            failures["n"] += 1
            raise ValueError("flaky")
        order.append(msg.offset())

    engine = engine_for(handler, consumer, workers=1, max_messages=6)
    engine.run(install_signals=False)
    assert failures["n"] == 2
    k0 = [o for o in order if o % 2 == 0]
    assert k0 == [0, 2, 4]
    assert order.index(1) < order.index(0), "key k1 was held back by k0's failure"
    assert consumer.commits[(TOPIC, 0)][0] == 6


def test_start_resumes_from_committed_offset_and_skips_finished_above() -> None:
    from htmqc.sinks.encoding import encode_metadata

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 10, keys=3))
    consumer.commits[(TOPIC, 0)] = (4, encode_metadata(4, [6, 7]))
    ran: list[int] = []
    engine = engine_for(lambda m: ran.append(m.offset()), consumer, max_messages=4)
    engine.run(install_signals=False)
    assert ran == [4, 5, 8, 9]
    assert consumer.commits[(TOPIC, 0)][0] == 10


@pytest.mark.parametrize("workers", [1, 3])
def test_poison_message_is_dead_lettered_and_the_rest_proceeds(workers: int) -> None:
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 5, keys=1))
    producer = FakeProducer()

    def handler(msg: Any) -> None:
        if msg.offset() == 1:
            raise RuntimeError("poison")

    from htmqc.core import RetryPolicy

    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", workers=workers, max_messages=5)
    engine = Engine(
        handler,
        opts,
        consumer,
        producer_factory=lambda: producer,
        retry=RetryPolicy(max_retries=1, base_delay=0.001, max_delay=0.01),
    )
    consumer.on_commit = engine.on_commit
    engine.run(install_signals=False)
    letters = [
        (int((value or b"").split(b":")[1]), dict(headers)["htmqc-dlq-reason"].decode())
        for _topic, value, _key, headers in producer.records
    ]
    assert letters == [(1, "RuntimeError: poison")]
    assert consumer.commits[(TOPIC, 0)][0] == 5


def test_trace_records_core_transitions(tmp_path: Any) -> None:
    import json

    path = tmp_path / "trace.jsonl"
    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 3, keys=1))
    engine = engine_for(lambda m: None, consumer, max_messages=3, trace=str(path))
    engine.run(install_signals=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    events = [(x["ev"], x["off"]) for x in lines]
    assert events[:5] == [
        ("assign", 0),
        ("fetched", 0),
        ("fetched", 1),
        ("fetched", 2),
        ("started", 0),
    ]
    assert ("succeeded", 2) in events
    assert lines[-1]["state"]["committed"] == 3 or ("commit_acked", 3) in events
    assert all(x["p"] == f"{TOPIC}/0" for x in lines)


class _ErrorMessage(FakeMessage):
    """A consume result that is an error event (``error``), not a message."""

    def __init__(self, error: KafkaError) -> None:
        super().__init__(TOPIC, 0, -1, None, b"")
        self._error = error

    def error(self) -> Any:
        return self._error


@given(
    st.lists(st.tuples(st.sampled_from([TOPIC, f"{TOPIC}.retry"]), st.integers(0, 3)), max_size=60),
    st.booleans(),
)
def test_batches_are_grouped_by_partition_in_order(
    origins: list[tuple[str, int]], retry_topic: bool
) -> None:
    """However a consume batch interleaves partitions, dispatch sees each partition's
    messages once, in their order (with one topic the runs are found in C)."""
    if not retry_topic:
        origins = [(TOPIC, p) for _, p in origins]
    engine = engine_for(lambda m: None, FakeConsumer([]), retry_topic=retry_topic)
    for make, readers in (
        (lambda t, p, i: FakeMessage(t, p, i, None, b""), ANY_READERS),
        (lambda t, p, i: Message(topic=t, partition=p, offset=i), READERS[Message]),
    ):
        msgs = [make(t, p, i) for i, (t, p) in enumerate(origins)]
        expected: dict[tuple[str, int], list[Any]] = {}
        for m in msgs:
            expected.setdefault((m.topic(), m.partition()), []).append(m)
        grouped = list(engine.intake.by_partition(msgs, readers[1]))
        assert dict(grouped) == expected
        assert len(grouped) == len(expected)


def test_consumer_errors_are_dropped_and_a_fatal_one_stops_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A KafkaError in a batch is logged and dropped (it cannot be compared with
    None); a fatal one stops the run, also in the form ``consume`` hands it out:
    code ``_FATAL`` with ``fatal()`` false."""
    engine = engine_for(lambda m: None, FakeConsumer([]))
    ok = [FakeMessage(TOPIC, 0, i, None, b"v") for i in range(3)]
    transient = _ErrorMessage(KafkaError(KafkaError._TRANSPORT, "broker went away"))
    assert drop_errors([ok[0], transient, *ok[1:]], engine.options) == ok
    assert "broker went away" in caplog.text
    engine.dispatch([transient])  # nothing to run, nothing raised
    for fatal in (
        KafkaError(KafkaError._FATAL, "Fatal error: broker went away"),
        KafkaError(KafkaError.FENCED_INSTANCE_ID, "broker went away", fatal=True),
    ):
        with pytest.raises(RuntimeFailure, match=r"Kafka consumer failed: .*broker went away"):
            engine.dispatch([ok[0], _ErrorMessage(fatal)])


def test_a_member_id_in_use_under_the_consumer_protocol_is_one_line() -> None:
    engine = engine_for(lambda m: None, FakeConsumer([]), member_id="m-1")
    text = (
        "Fatal error: Broker: The instance ID is still used by another member in the "
        "consumer group: ConsumerGroupHeartbeat fatal error"
    )  # librdkafka 2.16's words for UNRELEASED_INSTANCE_ID
    with pytest.raises(RuntimeFailure) as info:
        engine.dispatch([_ErrorMessage(KafkaError(KafkaError._FATAL, text))])
    assert info.value.line().startswith(
        "--member-id 'm-1' is held by a live member of group 'g'; under --group-protocol "
        "consumer the new member is fenced; give each live member its own --member-id"
    )


def test_a_broker_that_is_down_is_said_once_and_shown_until_messages_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 16, item 6: with the broker killed librdkafka repeated ``Connection
    refused`` ~900 times and nothing showed it; now one line per error code per
    30 s, ``/readyz`` and the state say it, and the first message clears it."""
    engine = engine_for(lambda m: None, FakeConsumer([]))
    with engine.lock:
        engine.ownership.any_assigned = True
    down = _ErrorMessage(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    for _ in range(200):
        engine.dispatch([down])
    assert caplog.text.count("consumer error") == 1
    assert engine.broker_down is not None
    assert engine.ready() == (False, "the broker is unreachable")
    extra = engine.state_source().state()["extra"]
    assert extra["broker_down_s"] is not None
    engine.dispatch([FakeMessage(TOPIC, 1, 0, None, b"v")])  # not held: not run
    assert engine.broker_down is None and extra


def test_a_broker_down_said_by_error_cb_shows_until_the_errors_stop() -> None:
    """With a real librdkafka the broker-down errors reach ``error_cb`` only
    (``Engine.on_consumer_error``), once when all brokers go down and again at
    each failed reconnect; ``/readyz`` says so until they have stopped for
    ``BROKER_QUIET_SECONDS`` (an idle consumer gets no message to clear it)."""
    from htmqc.runtime.intake import BROKER_QUIET_SECONDS

    now = [100.0]
    opts = RunOptions(bootstrap="fake:1", topic=TOPIC, group="g")
    engine = Engine(lambda m: None, opts, FakeConsumer([]), seed=1, clock=lambda: now[0])
    with engine.lock:
        engine.ownership.any_assigned = True
    # One connection closed (an idle one, one broker of several): not down.
    engine.on_consumer_error(KafkaError(KafkaError._TRANSPORT, "Disconnected"))
    assert engine.ready() == (True, "")
    engine.on_consumer_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert engine.ready() == (False, "the broker is unreachable")
    for _ in range(3):  # still down: each failed reconnect says so again
        now[0] += BROKER_QUIET_SECONDS - 1
        engine.on_consumer_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
        engine.dispatch([])
        assert engine.ready()[0] is False
    assert engine.broker_down == 100.0
    now[0] += BROKER_QUIET_SECONDS + 0.1  # reconnected: nothing failed since
    engine.dispatch([])
    assert engine.broker_down is None and engine.ready() == (True, "")


def test_librdkafka_lines_repeat_at_most_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from htmqc.runtime.launch import librdkafka_logger

    logger = librdkafka_logger()
    with caplog.at_level(logging.INFO, logger=logger.name):
        for i in range(300):
            logger.error("FAIL [thrd:127.0.0.1:%d]: Connection refused (after %dms)", 9000 + i, i)
        logger.error("another line")
    lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(lines) == 2 and "Connection refused" in lines[0], lines


@pytest.mark.parametrize("wait_ms", [2.0, 100.0])
def test_an_idle_poll_waits_at_most_poll_wait_ms(wait_ms: float) -> None:
    """``--poll-wait-ms`` bounds how long a turn's consume call waits for its
    batch to fill while nothing runs (the low-latency profile's lever); a turn
    with work running waits at most ``_BUSY_WAIT`` (10 ms) there, or less if
    ``--poll-wait-ms`` is less, so arriving records wake it and a worker's report
    waits no longer than before. (Shutdown's keep-alive polls, one message each,
    have their own bound.)"""
    waits: list[float] = []

    class Recording(FakeConsumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            if num_messages > 1:
                waits.append(timeout)
            return super().consume(num_messages, timeout)

    consumer = Recording.from_logs(make_logs(TOPIC, 1, 50, keys=5))
    engine = engine_for(lambda msg: None, consumer, max_messages=50, poll_wait_ms=wait_ms)
    engine.run(install_signals=False)
    busy_wait = min(wait_ms / 1000.0, loop._BUSY_WAIT)
    assert waits and set(waits) <= {0, busy_wait, wait_ms / 1000.0}
    assert wait_ms / 1000.0 in waits


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_busy_turn_waits_in_consume_only_where_nothing_waits_on_the_loop(
    mode: str, tmp_path: Path
) -> None:
    """While handlers run, at-least-once turns wait in ``consume`` (up to
    ``_BUSY_WAIT``), so arriving records wake the loop and the lanes do not run
    dry; exactly-once turns never do: the transaction's commit handshake waits
    on the loop, which a wait in librdkafka cannot see. Either rule dropped
    fails it."""
    busy_waits: list[float] = []
    engine: Engine

    class Recording(FakeConsumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            if num_messages > 1 and not engine.workers.idle:
                busy_waits.append(timeout)
            return super().consume(num_messages, timeout)

    def handler(msg: Any, *tx: Any) -> None:
        time.sleep(0.001)

    consumer = Recording.from_logs(make_logs(TOPIC, 1, 200, keys=5))
    engine = engine_in(mode, tmp_path, handler, consumer, max_messages=200, batch_size=10,
                       txn_messages=20)
    engine.run(install_signals=False)
    assert busy_waits, "no turn ran while handlers were busy"
    if mode == "exactly-once":
        assert set(busy_waits) == {0}
    else:
        assert max(busy_waits) == loop._BUSY_WAIT



@pytest.mark.parametrize("users", [True, False])
def test_a_users_own_error_cb_is_called_and_the_engine_still_hears_the_error(
    users: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_engine`` chains an ``error_cb`` of the user's own (``kafka_config``)
    with the engine's: librdkafka calls the one in the consumer config, and both must
    hear "all brokers down" (the user's first), so ``/readyz`` still says so."""
    import confluent_kafka

    from htmqc.runtime import launch

    heard: list[Any] = []
    configs: list[dict[str, Any]] = []

    def consumer(config: dict[str, Any]) -> FakeConsumer:
        configs.append(config)
        return FakeConsumer([])

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    monkeypatch.setattr(launch, "check_topic", lambda *args, **kwargs: None)
    kafka_config: dict[str, Any] = {"error_cb": heard.append} if users else {}
    opts = RunOptions(bootstrap="fake:1", topic=TOPIC, group="g", kafka_config=kafka_config)
    engine = launch.build_engine(lambda m: None, opts)
    with engine.lock:
        engine.ownership.any_assigned = True
    assert engine.ready() == (True, "")
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    heard_by_engine = engine.on_consumer_error

    def engine_heard(err: Any) -> None:  # the order: the user's callback first
        heard.append(("engine", err))
        heard_by_engine(err)

    monkeypatch.setattr(engine, "on_consumer_error", engine_heard)
    (config,) = configs
    config["error_cb"](down)
    assert heard == ([down] if users else []) + [("engine", down)]
    assert engine.ready() == (False, "the broker is unreachable")


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_turn_waiting_only_for_a_retry_does_not_spin(mode: str, tmp_path: Path) -> None:
    """One message fails once and waits for its retry (~0.3 s), with nothing else
    to run: the loop waits (in consume, up to ``_BUSY_WAIT`` a turn) rather than
    turning as fast as it can. Exactly-once used to spin here (consume without a
    wait, then a report wait that returns at once with the worker idle)."""
    calls = [0]
    failures = [0]

    class Counting(FakeConsumer):
        def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
            calls[0] += 1
            return super().consume(num_messages, timeout)

    def handler(msg: Any, *tx: Any) -> None:
        # Exactly-once runs a failed piece again one message at a time before
        # the failure counts: fail that call too.
        if failures[0] < (2 if tx else 1):
            failures[0] += 1
            raise RuntimeError("once")

    consumer = Counting.from_logs(make_logs(TOPIC, 1, 1, keys=1))
    engine = engine_in(mode, tmp_path, handler, consumer, max_messages=1,
                       backoff_ms=2000.0, backoff_max_ms=2000.0)
    started = time.monotonic()
    engine.run(install_signals=False)
    waited = time.monotonic() - started
    assert failures[0] and engine.stats.finished == 1
    # At most a turn per _BUSY_WAIT while the retry waits (plus start and end).
    assert calls[0] <= waited / loop._BUSY_WAIT * 2 + 50, (calls[0], waited)


def test_a_busy_turn_waits_on_the_reports_while_fetching_is_held(tmp_path: Path) -> None:
    """At-least-once, handlers busy: a turn waits in consume only if records can
    come; with fetching held (flow control, the breaker) or a ``--poll-wait-ms``
    under librdkafka's millisecond, on the reports (which free the window)."""
    from htmqc.core.gate import Hold

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 10, keys=1))
    engine = engine_for(lambda msg: None, consumer)
    engine.workers._outstanding = 1  # a handler runs
    assert engine._wait_in_consume(0.1)
    assert not engine._wait_in_consume(0.0005)
    engine.ownership.set_hold(Hold.FLOW, True)
    assert not engine._wait_in_consume(0.1)
    engine.ownership.set_hold(Hold.FLOW, False)
    engine.workers._outstanding = 0  # only retries wait: no report can come
    assert engine._wait_in_consume(0.1)


class LateFirstFetch(FakeConsumer):
    """A log whose first messages arrive ``delay`` s after the assignment (a remote
    stream's first fetch)."""

    delay = 0.5
    assigned_at: float | None = None

    def incremental_assign(self, partitions: list[Any]) -> None:
        self.assigned_at = time.monotonic()
        super().incremental_assign(partitions)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self.assigned_at is None:
            return super().consume(0, 0)  # the assignment's callbacks; nothing yet
        if time.monotonic() - self.assigned_at < self.delay:
            time.sleep(0.01)
            return []
        return super().consume(num_messages, timeout)


def test_idle_exit_counts_from_the_end_of_a_slow_claim(tmp_path: Path) -> None:
    """--idle-exit waits for quiet after the assignment is done: the idle clock
    used to start before the claims, so a claim that took most of --idle-exit
    (within CLAIM_WAIT, 1 s) left too little time for the first fetch, and the
    run stopped having handled nothing (a RabbitMQ restart under load: 0 of the
    3,500 messages left)."""
    url = f"sqlite:///{tmp_path / 'eo.db'}"
    sink = open_sink(url)
    sink.open("g")
    claim = sink.claim

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.8)
        return claim(*args, **kwargs)

    sink.claim = slow_claim  # type: ignore[method-assign]
    consumer = LateFirstFetch.from_logs(make_logs(TOPIC, 2, 20, 4))
    opts = RunOptions(bootstrap="fake:1", topic=TOPIC, group="g", mode="exactly-once", sink=url,
                      idle_exit=1.0)  # fmt: skip
    engine = Engine(lambda m, txn: None, opts, consumer, sink=sink, seed=1)
    consumer.on_commit = engine.on_commit
    engine.run(install_signals=False)
    assert engine.stats.finished == 40


def test_the_sink_is_closed_even_when_a_handler_outlives_the_shutdown(tmp_path: Path) -> None:
    """Exactly-once, a handler still running at the shutdown's deadline is abandoned;
    once it returns, the transaction worker rolls its transaction back and closes the
    sink's connection (it used to be closed only when the worker was idle at the end,
    so an abandoned call left the connection open until the garbage collector
    found it: a ResourceWarning with PostgreSQL)."""
    release, running = threading.Event(), threading.Event()

    def handler(msg: Any, tx: Any) -> None:
        if msg.offset() == 3:
            running.set()
            release.wait(10)

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 5, keys=1))
    engine = engine_in("exactly-once", tmp_path, handler, consumer, shutdown_seconds=0.2)
    thread = run_in_thread(engine)
    try:
        assert running.wait(5)
        engine.stop()
        thread.join(10)
        assert not thread.is_alive()
        sink = engine.sink
        assert sink is not None
        release.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sink._conn is not None:  # type: ignore[attr-defined]
            time.sleep(0.01)
        assert sink._conn is None, "the sink's connection was left open"  # type: ignore[attr-defined]
    finally:
        release.set()
