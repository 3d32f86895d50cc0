"""The at-least-once pool against its contract: every message of a fetch's runs
runs once, each key's messages run in offset order on its lane (the one its
retries and dead letters go to, which holds the key when one fails), and what ran
is reported under its run's lease with the offsets it had."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from htmqc.dlq.record import DeadLetterInfo
from htmqc.runtime.lanes import Lease
from htmqc.runtime.workers import LanePool, Run
from htmqc.testing import FakeMessage


class NoOutbox:
    """The pool's outbox; these tests never dead-letter nor forward."""

    def dead_letter(self, topic: str, msg: Any, info: DeadLetterInfo) -> None:
        raise AssertionError("nothing is dead-lettered here")

    def dead_letter_destination(self, topic: str, info: DeadLetterInfo) -> str:
        raise AssertionError("nothing is dead-lettered here")

    def forward(self, topic: str, msg: Any, headers: Any) -> None:
        raise AssertionError("nothing is forwarded here")


#: One fetch: per partition, the keys of its messages (offsets 0, 1, ...).
fetches = st.lists(
    st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", None]), min_size=1, max_size=12),
    min_size=1,
    max_size=6,
)


def _runs(fetch: list[list[bytes | None]]) -> list[Run]:
    runs: list[Run] = []
    for p, keys in enumerate(fetch):
        msgs = [FakeMessage("t", p, o, k, b"v" * (o + 1)) for o, k in enumerate(keys)]
        offsets = [m.offset() for m in msgs]
        runs.append((Lease(("t", p), 1), msgs, (offsets, sum(map(len, msgs)))))
    return runs


@settings(max_examples=40, deadline=None)
@given(fetch=fetches, workers=st.integers(1, 4))
def test_a_fetch_runs_once_in_key_order_on_the_keys_lanes(
    fetch: list[list[bytes | None]], workers: int
) -> None:
    ran: list[tuple[int, int]] = []
    lanes_of: dict[tuple[int, bytes | None], set[str]] = defaultdict(set)
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        with lock:
            ran.append((msg.partition(), msg.offset()))
            lanes_of[(msg.partition(), msg.key())].add(threading.current_thread().name)

    pool = LanePool(workers, handler, NoOutbox())
    runs = _runs(fetch)
    pool.submit_many(runs)
    reports: list[tuple[Any, ...]] = []

    def serve() -> None:
        while not pool.reports.empty():
            reports.append(pool.reports.get_nowait())

    pool.start()
    pool.settle(serve)
    pool.close()

    # Each message ran once; each key's messages in offset order, on its lane.
    assert sorted(ran) == sorted((p, o) for p, keys in enumerate(fetch) for o in range(len(keys)))
    for p, keys in enumerate(fetch):
        for key in set(keys):
            order = [o for q, o in ran if q == p and keys[o] == key]
            assert order == sorted(order)
            # The lane its retries and dead letters go to, which holds the key.
            assert lanes_of[(p, key)] == {f"htmqc-lane-{pool.lane_of(key)}"}
    # What ran is reported under its run's lease, with its offsets and bytes.
    reported: dict[tuple[str, int], list[int]] = defaultdict(list)
    for kind, lease, done in reports:
        assert kind == "ok"
        reported[lease.tp] += done.offsets
    for lease, msgs, _ in runs:
        assert sorted(reported[lease.tp]) == [m.offset() for m in msgs]
