"""The Kafka sink when librdkafka does not return from a transactional call.

librdkafka 2.16 can block in ``send_offsets_to_transaction`` long past its
timeout after a broker fault (its issues 5456 and 5511); in the cluster chaos
runs that stopped the sink's consumers until ``max.poll.interval.ms`` threw them
out of the group. The sink bounds each transactional call: past the bound the
transaction is dropped with :class:`SinkUnavailable` (the runtime reconnects and
retries from the committed offsets) and the stuck producer is abandoned, never
closed, and replaced by one whose ``init_transactions`` fences it. No broker:
a stand-in producer blocks where librdkafka did.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from htmqc.core import Commit
from htmqc.sinks import SinkUnavailable
from htmqc.sinks import kafka as kafka_sink
from htmqc.sinks.kafka import KafkaSink

TP = ("in", 0)
TIMEOUT, GRACE = 0.2, 0.1
COMMIT = Commit(tp=TP, epoch=1, offset=5)


class StandIn:
    """A transactional producer whose ``stuck_in`` call blocks until released."""

    def __init__(self, stuck_in: str | None = None) -> None:
        self.stuck_in = stuck_in
        self.release = threading.Event()
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.stuck_in:
            self.release.wait()

    def begin_transaction(self) -> None:
        self._call("begin_transaction")

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self._call("send_offsets_to_transaction")

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit_transaction")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort_transaction")


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StandIn]]:
    """Every producer the sink makes (:meth:`KafkaSink._new_producer`), in order."""
    made: list[StandIn] = []
    monkeypatch.setattr(kafka_sink, "STUCK_GRACE_SECONDS", GRACE)
    yield made
    for producer in made:
        producer.release.set()


def open_sink(made: list[StandIn], stuck_in: str | None, monkeypatch: Any) -> KafkaSink:
    plan = iter([StandIn(stuck_in), StandIn()])

    def new_producer(self: KafkaSink) -> StandIn:
        made.append(next(plan))
        return made[-1]

    monkeypatch.setattr(KafkaSink, "_new_producer", new_producer)
    sink = KafkaSink("out", bootstrap="127.0.0.1:1", timeout=TIMEOUT)
    sink.group = "g"
    sink._producer = sink._new_producer()  # type: ignore[assignment]
    sink._fences[TP] = 1
    sink._group_metadata = object()
    return sink


def within(seconds: float, call: Any) -> BaseException | None:
    """Run ``call`` on a thread; its exception; fail if it outlasts ``seconds``."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {time.monotonic() - started:.1f} s"
    return raised[0]


@pytest.mark.parametrize("stuck_in", ["send_offsets_to_transaction", "commit_transaction"])
def test_a_commit_stuck_in_librdkafka_fails_within_its_bound_and_a_new_producer_takes_over(
    stand_ins: list[StandIn], stuck_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = open_sink(stand_ins, stuck_in, monkeypatch)
    txn = sink.begin()
    error = within(TIMEOUT + GRACE + 2, lambda: txn.commit([(COMMIT, 1)]))
    assert isinstance(error, SinkUnavailable), error
    assert stuck_in in error.line() and "\n" not in error.line()
    stuck = stand_ins[0]
    assert sink._producer is None and sink._abandoned == [stuck]
    assert "abort_transaction" not in stuck.calls  # it would conflict with the stuck call
    sink.reconnect()
    fresh = sink._producer
    assert fresh is stand_ins[1]
    sink._group_metadata = object()  # what before_commit reads from the consumer
    within(2, lambda: sink.begin().commit([(COMMIT, 1)]))
    assert fresh.calls == [
        "begin_transaction", "send_offsets_to_transaction", "commit_transaction"
    ]


def test_an_abort_stuck_in_librdkafka_returns_and_drops_the_producer(
    stand_ins: list[StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = open_sink(stand_ins, "abort_transaction", monkeypatch)
    txn = sink.begin()
    assert within(TIMEOUT + GRACE + 2, txn.abort) is None
    assert sink._producer is None and sink._abandoned == [stand_ins[0]]
    within(2, lambda: sink.begin().abort())  # begin makes a new producer
    assert stand_ins[1].calls == ["begin_transaction", "abort_transaction"]


def test_closing_needs_no_producer_close(
    stand_ins: list[StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Producer.close`` is new in confluent-kafka 2.13; the stand-in, like 2.12's
    producer (Quix pins it), has none: the sink still closes (it stopped every
    Kafka→Kafka run of the peers' benchmark with exit 1)."""
    sink = open_sink(stand_ins, None, monkeypatch)
    within(2, lambda: sink.begin().commit([(COMMIT, 1)]))
    assert not hasattr(stand_ins[0], "close")
    sink.close()
    assert sink._producer is None
