"""The core against the naive reference model, event by event.

A Hypothesis ``RuleBasedStateMachine`` drives :class:`htmqc.core.ConsumerCore`
and :class:`model_checks.reference.ReferenceConsumer` with the same events:
fetches with gaps, out-of-order completion, failures, retries and
dead-lettering, commits whose acks come late, twice, out of order or never,
failed commits, revoke/assign, crash/restore from the durable position, events
from stale epochs, and illegal events. After every step the two must agree on
their whole observable state and the core's invariant must hold. The
invariants carry the names of the TLA+ properties they mirror.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from htmqc.core import (
    Commit,
    ConsumerCore,
    CoreError,
    DeadLetter,
    Event,
    FailureKind,
    RetryAt,
    RetryPolicy,
    tracker_invariant,
)
from model_checks.reference import LIFECYCLE, ReferenceConsumer, RefError

pytestmark = pytest.mark.formal

TPS = [("t", 0), ("t", 1)]
MAX_RETRIES = 2
tps = st.sampled_from(TPS)


def both(core_call, ref_call):
    """Run an event on both; they must both accept or both refuse it."""
    try:
        got_core = core_call()
    except CoreError as exc:
        core_err: Exception | None = exc
        got_core = None
    else:
        core_err = None
    try:
        got_ref = ref_call()
    except RefError as exc:
        ref_err: Exception | None = exc
        got_ref = None
    else:
        ref_err = None
    assert (core_err is None) == (ref_err is None), (core_err, ref_err)
    return got_core, got_ref


class CoreVersusReference(RuleBasedStateMachine):
    """Core and reference model side by side (see module docstring)."""

    @initialize()
    def setup(self) -> None:
        self.core = ConsumerCore(RetryPolicy(max_retries=MAX_RETRIES, base_delay=0.5, max_delay=4))
        self.ref = ReferenceConsumer(max_retries=MAX_RETRIES)
        # The durable store: what the broker/sink holds per partition.
        self.durable: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {
            tp: (0, ()) for tp in TPS
        }
        self.epochs: dict[tuple[str, int], int] = {}
        self.starts: dict[tuple[str, int], int] = {}
        self.starts_epoch: dict[tuple[str, int], int] = {}  # the sink's fence per partition
        self.old_epochs: list[tuple[tuple[str, int], int]] = []
        self.pending_acks: list[tuple[Commit, int]] = []  # (commit, request number)
        self.requests = 0
        self.applied: dict[tuple[str, int], int] = {tp: 0 for tp in TPS}
        self.now = 0.0

    # -- helpers -------------------------------------------------------------------------

    def held(self) -> list[tuple[str, int]]:
        return sorted(self.epochs)

    def offsets_in(self, tp: tuple[str, int], state: str) -> list[int]:
        part = self.ref.parts[tp]
        return sorted(o for o, s in part.states.items() if s == state)

    # -- assignment ----------------------------------------------------------------------

    @rule(tp=tps, roll=st.integers(0, 3))
    def assign(self, tp: tuple[str, int], roll: int) -> None:
        if tp in self.epochs and roll:
            return  # assigning a held partition is illegal; try it now and then
        committed, above = self.durable[tp]
        epoch, ref_epoch = both(
            lambda: self.core.assign(tp, committed, above),
            lambda: self.ref.assign(tp, committed, above),
        )
        if epoch is not None:
            assert epoch == ref_epoch
            self.epochs[tp] = epoch
            self.starts[tp] = committed
            self.starts_epoch[tp] = epoch

    @precondition(lambda self: self.epochs)
    @rule(data=st.data(), drain_first=st.booleans(), roll=st.integers(0, 3))
    def revoke(self, data: st.DataObject, drain_first: bool, roll: int) -> None:
        if roll:
            return
        tp = data.draw(st.sampled_from(self.held()))
        if drain_first:
            self.core.revoking(tp)
            self.ref.revoking(tp)
        commit = self.core.revoked(tp)
        ref_offset = self.ref.revoked(tp)
        assert (commit.offset if commit else None) == ref_offset
        if commit is not None:
            self.requests += 1
            self.pending_acks.append((commit, self.requests))
        self.old_epochs.append((tp, self.epochs.pop(tp)))

    @rule(roll=st.integers(0, 9))
    def crash(self, roll: int) -> None:
        if roll:  # crashes are rare, so that runs build up state between them
            return
        self.core.crashed()
        self.ref.crashed()
        self.old_epochs.extend(self.epochs.items())
        self.epochs.clear()

    @precondition(lambda self: len(self.epochs) < len(TPS))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from([t for t in TPS if t not in self.epochs]))
        committed, above = self.durable[tp]
        epoch = self.core.restored(tp, committed, above)
        assert epoch == self.ref.restored(tp, committed, above)
        self.epochs[tp] = epoch
        self.starts[tp] = committed
        self.starts_epoch[tp] = epoch

    # -- fetching ------------------------------------------------------------------------

    @precondition(lambda self: self.epochs)
    @rule(
        data=st.data(),
        skip=st.integers(0, 2),
        width=st.integers(0, 8),
        present=st.lists(st.booleans(), min_size=8, max_size=8),
        extra_end=st.integers(0, 3),
        explicit_end=st.booleans(),
    )
    def fetch(self, data, skip, width, present, extra_end, explicit_end) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        start = self.ref.parts[tp].next + skip
        offsets = [start + i for i in range(width) if present[i]]
        end = None
        if explicit_end or not offsets:
            end = (offsets[-1] + 1 if offsets else start) + extra_end
        run, ref_run = both(
            lambda: list(self.core.fetched(tp, self.epochs[tp], offsets, end)),
            lambda: self.ref.fetched(tp, self.epochs[tp], offsets, end),
        )
        assert run == ref_run

    @precondition(lambda self: self.epochs)
    @rule(data=st.data(), below=st.integers(1, 3))
    def fetch_below_next(self, data, below) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        nxt = self.ref.parts[tp].next
        if nxt - below < 0:
            return
        both(
            lambda: self.core.fetched(tp, self.epochs[tp], [nxt - below, nxt + 1]),
            lambda: self.ref.fetched(tp, self.epochs[tp], [nxt - below, nxt + 1]),
        )

    # -- lifecycle -----------------------------------------------------------------------

    @precondition(lambda self: self.epochs)
    @rule(data=st.data(), batch=st.booleans())
    def lifecycle(self, data, batch) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        possible = [
            e
            for e in ("started", "succeeded", "retry_due", "dead_lettered")
            if self.offsets_in(tp, LIFECYCLE[e][0])
        ]
        if not possible:
            return
        event = data.draw(st.sampled_from(possible))
        ready = self.offsets_in(tp, LIFECYCLE[event][0])
        chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=4, unique=True))
        epoch = self.epochs[tp]
        core_single = {
            "started": self.core.started,
            "succeeded": self.core.succeeded,
            "retry_due": self.core.retry_due,
            "dead_lettered": self.core.dead_lettered,
        }[event]
        core_many = {
            "started": self.core.started_many,
            "succeeded": self.core.succeeded_many,
            "dead_lettered": self.core.dead_lettered_many,
        }.get(event)
        if batch and core_many is not None:
            got, ref_got = both(
                lambda: core_many(tp, epoch, chosen),
                lambda: self.ref.event(event, tp, epoch, chosen),
            )
            assert got == ref_got
        else:
            for o in chosen:
                got, ref_got = both(
                    lambda o=o: core_single(tp, epoch, o),
                    lambda o=o: self.ref.event(event, tp, epoch, [o]),
                )
                assert got == ref_got

    @precondition(lambda self: self.epochs)
    @rule(data=st.data(), permanent=st.booleans(), jitter=st.floats(0, 1))
    def fail(self, data, permanent, jitter) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        running = self.offsets_in(tp, "Processing")
        if not running:
            return
        o = data.draw(st.sampled_from(running))
        kind = FailureKind.PERMANENT if permanent else FailureKind.UNKNOWN
        decision = self.core.failed(tp, self.epochs[tp], o, kind, self.now, jitter)
        expected = self.ref.failed(tp, self.epochs[tp], o, permanent)
        if expected == "retry":
            assert isinstance(decision, RetryAt)
            assert self.now <= decision.at <= self.now + 4
        else:
            assert isinstance(decision, DeadLetter)
            assert decision.permanent == permanent
        self.now += 1.0

    @precondition(lambda self: self.epochs)
    @rule(
        data=st.data(),
        event=st.sampled_from(["started", "succeeded", "retry_due", "dead_lettered"]),
        batch=st.booleans(),
        delta=st.integers(-3, 3),
    )
    def illegal_or_any_event(self, data, event, batch, delta) -> None:
        """Any event on any offset near the window: legal or not, both must agree."""
        tp = data.draw(st.sampled_from(self.held()))
        part = self.ref.parts[tp]
        o = max(0, data.draw(st.sampled_from([part.processed(), part.next, part.start])) + delta)
        offsets = [o, o] if batch else [o]
        epoch = self.epochs[tp]
        core_event = Event(event)
        tracker = self.core.tracker(tp)
        both(
            lambda: (tracker.apply_many if batch else lambda ev, offs: tracker.apply(ev, offs[0]))(
                core_event, offsets
            ),
            lambda: self.ref.event(event, tp, epoch, offsets),
        )

    # -- commits -------------------------------------------------------------------------

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def request_commit(self, data) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        commit = self.core.commit_requested(tp)
        ref_offset = self.ref.commit_requested(tp)
        assert (commit.offset if commit else None) == ref_offset
        if commit is not None:
            assert commit.epoch == self.epochs[tp]
            assert list(commit.finished_above) == self.ref.parts[tp].observe()["finished_above"]
            self.requests += 1
            self.pending_acks.append((commit, self.requests))

    @precondition(lambda self: self.pending_acks)
    @rule(data=st.data(), outcome=st.sampled_from(["ack", "ack_twice", "fail", "lose"]))
    def deliver_ack(self, data, outcome) -> None:
        """Deliver one outstanding commit, in any order: ack, duplicate, failure or loss."""
        i = data.draw(st.integers(0, len(self.pending_acks) - 1))
        commit, number = self.pending_acks.pop(i)
        tp, epoch = commit.tp, commit.epoch
        if outcome == "lose":
            return
        if outcome == "fail":
            assert self.core.commit_failed(tp, epoch, commit.offset) == self.ref.commit_failed(
                tp, epoch, commit.offset
            )
            return
        if self.starts_epoch.get(tp) != epoch:
            # Fenced: the partition was assigned again since this commit was made,
            # so an exactly-once sink rejects it and the member hears of a failure.
            assert self.core.commit_failed(tp, epoch, commit.offset) is False
            return
        # The sink stored it, in request order (one transaction after another): what
        # it holds as finished may only grow, or a restart would run work twice.
        if number > self.applied[tp]:
            old_offset, old_above = self.durable[tp]
            held_before = set(range(old_offset)) | set(old_above)
            held_after = set(range(commit.offset)) | set(commit.finished_above)
            assert held_before <= held_after, f"the sink would forget {held_before - held_after}"
            self.durable[tp] = (commit.offset, commit.finished_above)
            self.applied[tp] = number
        for _ in range(2 if outcome == "ack_twice" else 1):
            moved, ref_moved = both(
                lambda: self.core.commit_acked(tp, epoch, commit.offset),
                lambda: self.ref.commit_acked(tp, epoch, commit.offset),
            )
            assert moved == ref_moved

    @precondition(lambda self: self.old_epochs)
    @rule(data=st.data(), offset=st.integers(0, 40))
    def stale_events_are_ignored(self, data, offset) -> None:
        tp, epoch = data.draw(st.sampled_from(self.old_epochs))
        assert self.core.succeeded(tp, epoch, offset) is False
        assert self.core.commit_acked(tp, epoch, offset) is False
        assert self.core.commit_failed(tp, epoch, offset) is False
        assert list(self.core.fetched(tp, epoch, [offset])) == []
        assert self.core.failed(tp, epoch, offset, FailureKind.UNKNOWN, 0.0, 0.5) is None

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def SameObservableState(self) -> None:
        assert self.core.snapshot() == self.ref.snapshot()

    @invariant()
    def OffsetOrder(self) -> None:
        for _, _, tracker in self.core.partitions():
            assert tracker.committed <= tracker.processed <= tracker.next
            assert tracker_invariant(tracker)

    @invariant()
    def CommittedWithinDurable(self) -> None:
        # A member's committed offset only reflects acks: it never runs ahead of
        # what the broker/sink holds, and never falls behind where it started.
        for tp, _, tracker in self.core.partitions():
            assert self.starts[tp] <= tracker.committed <= self.durable[tp][0]

TestCoreVersusReference = CoreVersusReference.TestCase
