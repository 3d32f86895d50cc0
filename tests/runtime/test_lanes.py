"""Lanes against a model: what runs, in which order, and what is reported.

The model is the lane's contract from :mod:`htmqc.runtime.lanes`: messages run in
order; a failure holds its key, and later messages of that key are parked (in
order) while other keys go on; a retry runs the held message again and, on
success, its parked followers run until one fails; a release lets the parked
followers run. Every path of :class:`~htmqc.runtime.lanes.Lane` (untimed, which
runs a clean batch with nothing per message but the lease check and the call;
timed, one clock read per message; with and without offsets and sizes handed
in; interrupted, asked before each call) must produce the model's handler calls
and reports, and each report's byte count must be its messages' value bytes.
When the lease ends during a call, no call starts after it: the lane's calls and
reports are the model's up to that call.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from htmqc.runtime.lanes import Done, Lane, Lease
from htmqc.testing import FakeMessage

TP = ("t", 0)


class Recorder:
    """A :class:`~htmqc.runtime.lanes.Report` that keeps every report."""

    def __init__(self, sizes: dict[int, int]) -> None:
        self.sizes = sizes
        self.events: list[tuple[str, int]] = []

    def succeeded(self, lease: Lease, done: Done) -> None:
        assert lease.tp == TP and lease.epoch == 1 and done.offsets
        assert done.nbytes == sum(self.sizes[o] for o in done.offsets)
        self.events += [("ok", o) for o in done.offsets]

    def failed(self, lease: Lease, msg: Any, exc: BaseException) -> None:
        assert isinstance(exc, ValueError)
        self.events.append(("fail", msg.offset()))


class Model:
    """The lane's contract, one message at a time."""

    def __init__(self, fails: Any) -> None:
        self.fails = fails
        self.held: dict[Any, list[Any]] = {}
        #: The message each held key waits on (the one that failed).
        self.failed: dict[Any, Any] = {}
        self.calls: list[int] = []
        self.events: list[tuple[str, int]] = []

    def _call(self, msg: Any) -> bool:
        self.calls.append(msg.offset())
        if self.fails(msg):
            self.held.setdefault(msg.key(), [])  # a retry that fails keeps its parked
            self.failed[msg.key()] = msg
            self.events.append(("fail", msg.offset()))
            return False
        self.events.append(("ok", msg.offset()))
        return True

    def run(self, msgs: list[Any]) -> None:
        for msg in msgs:
            if msg.key() in self.held:
                self.held[msg.key()].append(msg)
            else:
                self._call(msg)

    def retry(self, msg: Any) -> None:
        if self._call(msg):
            self.release(msg.key())

    def release(self, key: Any) -> None:
        parked = self.held.pop(key, [])
        while parked:
            msg = parked.pop(0)
            if not self._call(msg):
                self.held[key].extend(parked)
                return


# A script: batches of (key, size, attempts that fail) and, after each batch,
# what happens to the held keys: retry the failed message or release its key.
batch = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", None]), st.integers(0, 40), st.integers(0, 3)),
    max_size=30,
)
script = st.lists(st.tuples(batch, st.lists(st.booleans(), max_size=4)), max_size=6)


def play(
    lane_kind: str, steps: list[Any], cut: int | None = None, pokes: frozenset[int] = frozenset()
) -> tuple[list[int], list[tuple[str, int]], Model]:
    """Run ``steps`` on a lane of ``lane_kind``; return its calls, its reports, and
    the model after the same steps (whose calls and reports it must equal). With
    ``cut``, the lease ends during handler call number ``cut``; during the calls
    numbered in ``pokes`` the poll thread asks for a progress report."""
    attempts: dict[int, int] = {}
    failing: dict[int, int] = {}
    sizes: dict[int, int] = {}
    calls: list[int] = []
    lease = Lease(TP, 1)

    def fails(msg: Any) -> bool:
        return attempts[msg.offset()] <= failing[msg.offset()]

    def handler(msg: Any) -> None:
        calls.append(msg.offset())
        attempts[msg.offset()] = attempts.get(msg.offset(), 0) + 1
        if len(calls) == cut:
            lease.end()
        if len(calls) in pokes:
            lease.attention = True
        if fails(msg):
            raise ValueError(msg.offset())

    model_attempts: dict[int, int] = {}

    def model_fails(msg: Any) -> bool:
        model_attempts[msg.offset()] = model_attempts.get(msg.offset(), 0) + 1
        return model_attempts[msg.offset()] <= failing[msg.offset()]

    lane = Lane(handler, timed=lane_kind == "timed", sized=True)
    report = Recorder(sizes)
    model = Model(model_fails)
    offset = 0
    for messages, actions in steps:
        msgs = []
        for key, size, fail_count in messages:
            msgs.append(FakeMessage("t", 0, offset, key, b"x" * size))
            sizes[offset] = size
            failing[offset] = fail_count
            offset += 1
        known = ([m.offset() for m in msgs], sum(map(len, msgs)))
        interrupt = (lambda: False) if lane_kind == "interrupted" else None
        lane.run(lease, msgs, report, known if lane_kind == "known" else None, interrupt)
        model.run(msgs)
        for retry, key in zip(actions, sorted(model.held, key=repr), strict=False):
            if retry:
                msg = model.failed[key]
                lane.retry(lease, msg, report)
                model.retry(msg)
            else:
                lane.release(lease, key, report)
                model.release(key)
    return calls, report.events, model


KINDS = ("untimed", "timed", "known", "interrupted")


@given(script)
def test_every_lane_path_matches_the_model(steps: list[Any]) -> None:
    for kind in KINDS:
        calls, events, model = play(kind, steps)
        assert calls == model.calls, kind
        assert events == model.events, kind


@given(script, st.integers(1, 40), st.frozensets(st.integers(1, 40)))
def test_no_call_starts_after_the_lease_ended(
    steps: list[Any], cut: int, pokes: frozenset[int]
) -> None:
    for kind in KINDS:
        calls, events, model = play(kind, steps, cut, pokes)
        assert calls == model.calls[:cut], kind
        assert events == model.events[:cut], kind


@given(script, st.frozensets(st.integers(1, 40)))
def test_progress_reports_on_demand_change_nothing_else(
    steps: list[Any], pokes: frozenset[int]
) -> None:
    for kind in KINDS:
        calls, events, model = play(kind, steps, pokes=pokes)
        assert calls == model.calls, kind
        assert events == model.events, kind


def test_a_progress_report_comes_while_the_batch_runs() -> None:
    """Asked for (``attention``), the untimed path reports what finished so far
    before the next call, not at the end of the batch."""
    msgs = [FakeMessage("t", 0, i, b"k", b"v") for i in range(5)]
    lease = Lease(TP, 1)
    report = Recorder({i: 1 for i in range(5)})
    seen_at_call: list[list[tuple[str, int]]] = []

    def handler(msg: Any) -> None:
        seen_at_call.append(list(report.events))
        if msg.offset() == 1:
            lease.attention = True

    Lane(handler, sized=True).run(lease, msgs, report, known=([0, 1, 2, 3, 4], 5))
    assert seen_at_call[2] == [("ok", 0), ("ok", 1)]
    assert report.events == [("ok", i) for i in range(5)] and not lease.attention


def test_a_failure_mid_batch_holds_only_its_key() -> None:
    """The untimed path's failure branch: what ran before is reported, the key is
    held, the other keys go on, and nothing runs twice."""
    msgs = [FakeMessage("t", 0, i, k, b"v" * i) for i, k in enumerate([b"a", b"b", b"a", b"c"])]
    calls: list[int] = []

    def handler(msg: Any) -> None:
        calls.append(msg.offset())
        if msg.offset() == 1:
            raise ValueError("boom")

    report = Recorder({i: i for i in range(4)})
    lane = Lane(handler, sized=True)
    lease = Lease(TP, 1)
    assert lane.run(lease, msgs, report) == 4
    assert calls == [0, 1, 2, 3]
    assert report.events == [("ok", 0), ("fail", 1), ("ok", 2), ("ok", 3)]
    assert lane.held == 0 and lane.holds(lease)


def test_run_atomic_reports_like_a_clean_run() -> None:
    msgs = [FakeMessage("t", 0, i, b"k", b"v" * i) for i in range(5)]
    for timed in (False, True):
        done = Lane(lambda m: None, timed=timed, sized=True).run_atomic(
            Lease(TP, 1), msgs, lambda m: None
        )
        assert done.offsets == [0, 1, 2, 3, 4]
        assert done.nbytes == 10
        assert (done.ticks is not None) == timed
        if timed:
            assert done.ticks is not None and len(done.ticks) == 6
