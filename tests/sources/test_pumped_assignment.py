"""How :class:`htmqc.sources.pumped.PumpedConsumer` hands a moving membership to the
runtime (:meth:`~htmqc.sources.pumped.PumpedConsumer._change_assignment`), no broker:
revokes come before assignments, inside ``consume`` and before anything is handed
out; a partition lost before its assignment was delivered is neither assigned nor
revoked (and is returned, so the source can release it at once); every partition
the runtime lets go of reaches ``_released``."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.sources.pumped import TP, LogMessage, PumpedConsumer, _Partition


class Stub(PumpedConsumer):
    """A source whose pumps put one message per partition in the buffer, and whose
    membership the test moves by hand."""

    SOURCE = OPTION = NAMES = "stub"

    def __init__(self) -> None:
        super().__init__("g")
        self.released: list[TP] = []
        self._lease_until = math.inf

    async def _session(self, part: _Partition, generation: int) -> None:
        with self._cond:
            part.buffer.append(LogMessage(part.topic, part.partition, 0, None, b"v", None, 0))
            self._cond.notify_all()
        await asyncio.Event().wait()

    async def _close(self) -> None:
        for task in list(self._pumps):
            task.cancel()

    def _released(self, tps: list[TP]) -> None:
        self.released += tps


@pytest.fixture
def stub() -> Iterator[Stub]:
    consumer = Stub()
    yield consumer
    consumer.close()


def recorder(events: list[tuple[str, list[int]]]) -> dict[str, Any]:
    def on_assign(c: Any, parts: list[KafkaTP]) -> None:
        events.append(("assign", [p.partition for p in parts]))
        c.incremental_assign(parts)

    def on_revoke(c: Any, parts: list[KafkaTP]) -> None:
        events.append(("revoke", [p.partition for p in parts]))
        c.incremental_unassign(parts)

    return {"on_assign": on_assign, "on_revoke": on_revoke}


def test_revokes_come_first_and_before_anything_is_handed_out(stub: Stub) -> None:
    events: list[tuple[str, list[int]]] = []
    stub._callbacks = (recorder(events)["on_assign"], recorder(events)["on_revoke"], None)
    assert stub._change_assignment([("t", 0), ("t", 1)], []) == []
    got: list[Any] = []
    for _ in range(50):
        got += stub.consume(10, 0.05)
        if len(got) == 2:
            break
    assert events == [("assign", [0, 1])] and sorted(m.partition() for m in got) == [0, 1]
    stub._change_assignment([("t", 2)], [("t", 1)])
    stub.consume(10, 0)
    assert events[1:] == [("revoke", [1]), ("assign", [2])]
    assert stub.released == [("t", 1)]
    assert [p.partition for p in stub.position([KafkaTP("t", 1)])] == [1]
    assert stub.position([KafkaTP("t", 1)])[0].offset < 0, "partition 1 is not held"


def test_a_partition_lost_before_its_assignment_was_delivered_is_returned(stub: Stub) -> None:
    events: list[tuple[str, list[int]]] = []
    stub._callbacks = (recorder(events)["on_assign"], recorder(events)["on_revoke"], None)
    stub._change_assignment([("t", 0), ("t", 1)], [])
    assert stub._change_assignment([], [("t", 1)]) == [("t", 1)]
    stub.consume(10, 0)
    assert events == [("assign", [0])], "partition 1 was never the runtime's"
    assert stub._change_assignment([], [("t", 0)]) == [], "partition 0 was delivered"
    stub.consume(10, 0)
    assert events[1:] == [("revoke", [0])] and stub.released == [("t", 0)]


def test_without_a_revoke_callback_the_partition_is_let_go_of(stub: Stub) -> None:
    stub._change_assignment([("t", 0)], [])
    stub.consume(10, 0)
    stub._change_assignment([], [("t", 0)])
    stub.consume(10, 0)
    assert stub.released == [("t", 0)]
