"""The sources' ``produce`` (:class:`htmqc.sources.pumped.NumberedProducer`): what is
common to the three, without a broker; each source's own publishing is tested by its
run tests."""

from __future__ import annotations

from collections.abc import Iterable

from htmqc.produce import message_key, message_value
from htmqc.sources.pumped import Numbered, NumberedProducer


class Log:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.calls: list[object] = []

    def create_topic(self, topic: str, partitions: int) -> None:
        self.calls.append(("create", topic, partitions))

    def close(self) -> None:
        self.calls.append("close")


def publish(log: Log, topic: str, partitions: int, messages: Iterable[Numbered]) -> int:
    got = list(messages)
    log.calls.append(("publish", topic, partitions, got))
    return len(got)


def test_numbered_messages_go_to_id_mod_partitions_in_order() -> None:
    made: list[Log] = []

    def connect(bootstrap: str) -> Log:
        made.append(Log(bootstrap))
        return made[-1]

    produce = NumberedProducer(connect, publish)
    assert produce("b:1", "t", 5, partitions=3, keys=2, size=20, start_id=7) == 5
    (log,) = made
    assert log.bootstrap == "b:1"
    want = [Numbered(i, i % 3, message_value(i, 20), message_key(i, 2)) for i in range(7, 12)]
    assert log.calls == [("create", "t", 3), ("publish", "t", 3, want), "close"]
    assert [m.key for m in want] == [b"k1", b"k0", b"k1", b"k0", b"k1"]


def test_a_given_client_is_used_and_left_open() -> None:
    def connect(bootstrap: str) -> Log:
        raise AssertionError("a client was given")

    log = Log("b:1")
    assert NumberedProducer(connect, publish)("b:1", "t", 2, partitions=1, client=log) == 2
    assert log.calls[0] == ("create", "t", 1) and "close" not in log.calls
