"""The core against the naive reference model, event by event.

A Hypothesis ``RuleBasedStateMachine`` drives :class:`htmqc.core.ConsumerCore`
and :class:`model_checks.reference.ReferenceConsumer` with the same events, and
keeps a model of the exactly-once sink beside them: what each stored commit
left there (the watermark and the offsets finished above it), fenced per
assignment. After every step the core and the reference must agree on their
whole observable state, the core's invariant must hold, and no offset the sink
holds may be in flight (handed out to run again).

The events aim at the exactly-once paths, not only at random ones:

* fetched ranges whose end lies on, just below or just above an offset the sink
  holds, after crash/restore cycles that restore from the last *stored* commit
  (so held offsets arise from out-of-order completion) or from another member's
  progress while the partition was elsewhere;
* lifecycle batches from any state: legal ones, legal ones spoiled by one
  offset in another state (live, finished, a gap, held, unfetched) or a
  duplicate anywhere, empty ones, and every event of the table;
* commits stored and acked, acked twice, failed, lost, stored with the ack lost
  or reported failed; acks and commit failures at arbitrary offsets (late,
  duplicated, above the watermark, between ``requested`` and ``processed``),
  for stale epochs, epochs never issued and partitions not held.

The invariants carry the names of the TLA+ properties they mirror. The budget
(examples, steps) is the Hypothesis profile's (``tests/conftest.py``).
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
from model_checks.reference import DONE, LIFECYCLE, ReferenceConsumer, RefError, RefPartition

pytestmark = pytest.mark.formal

TP = tuple[str, int]
TPS: list[TP] = [("t", 0), ("t", 1)]
MAX_RETRIES = 2
NEVER_ISSUED = 10**6  # an epoch no assignment ever gets
tps = st.sampled_from(TPS)
EPOCH_KINDS = st.sampled_from(["current", "stale", "never"])


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
    """Core, reference model and sink side by side (see module docstring)."""

    @initialize()
    def setup(self) -> None:
        self.core = ConsumerCore(RetryPolicy(max_retries=MAX_RETRIES, base_delay=0.5, max_delay=4))
        self.ref = ReferenceConsumer(max_retries=MAX_RETRIES)
        # The sink: per partition, the watermark and the offsets finished above it
        # that the last stored commit left there, and the fence (the epoch of the
        # assignment allowed to store; None once another member took over).
        self.durable: dict[TP, tuple[int, tuple[int, ...]]] = {tp: (0, ()) for tp in TPS}
        self.fence: dict[TP, int | None] = {tp: None for tp in TPS}
        # The log: offsets a fetch found missing (compacted, or never written) stay
        # missing; an offset that arrived once may go missing later.
        self.missing: dict[TP, set[int]] = {tp: set() for tp in TPS}
        self.epochs: dict[TP, int] = {}
        self.starts: dict[TP, int] = {}
        self.old_epochs: list[tuple[TP, int]] = []
        self.pending_acks: list[tuple[Commit, int]] = []  # (commit, request number)
        self.requests = 0
        self.applied: dict[TP, int] = {tp: 0 for tp in TPS}
        self.now = 0.0

    # -- helpers -------------------------------------------------------------------------

    def held(self) -> list[TP]:
        return sorted(self.epochs)

    def part(self, tp: TP) -> RefPartition:
        return self.ref.parts[tp]

    def offsets_in(self, tp: TP, state: str) -> list[int]:
        return sorted(o for o, s in self.part(tp).states.items() if s == state)

    def sink_holds(self, tp: TP, offset: int) -> bool:
        committed, above = self.durable[tp]
        return offset < committed or offset in above

    def epoch_of_kind(self, data: st.DataObject, tp: TP, kind: str) -> int:
        stale = [e for t, e in self.old_epochs if t == tp]
        if kind == "stale" and stale:
            return data.draw(st.sampled_from(stale))
        if kind == "current" and tp in self.epochs:
            return self.epochs[tp]
        return NEVER_ISSUED

    def near(self, tp: TP) -> list[int]:
        """Offsets where the tracker's decisions change: its watermarks and held offsets."""
        if tp in self.ref.parts:
            part = self.part(tp)
            marks = {part.start, part.committed, part.requested, part.processed(), part.next}
            marks |= part.skip
        else:
            marks = set()
        committed, above = self.durable[tp]
        marks |= {committed, *above}
        return sorted(max(0, m + d) for m in marks for d in (-1, 0, 1))

    def take(self, tp: TP, committed: int, above: tuple[int, ...], restored: bool) -> None:
        epoch, ref_epoch = both(
            lambda: (self.core.restored if restored else self.core.assign)(tp, committed, above),
            lambda: (self.ref.restored if restored else self.ref.assign)(tp, committed, above),
        )
        # Only taking a partition already held is refused: whatever the sink
        # stored must be a position the partition can start from again.
        assert (epoch is None) == (tp in self.epochs), f"cannot start {tp} at {committed}, {above}"
        if epoch is not None:
            assert epoch == ref_epoch
            self.epochs[tp] = epoch
            self.starts[tp] = committed
            self.fence[tp] = epoch  # the new owner bumps the sink's fence

    def store(self, commit: Commit, number: int) -> bool:
        """The sink stores ``commit`` in its transaction unless the fence rejects it."""
        tp = commit.tp
        if self.fence[tp] != commit.epoch:
            return False
        # Transactions are stored in request order: what the sink holds may only
        # grow (but for offsets gone from the log), or a restart would run work twice.
        if number > self.applied[tp]:
            old_offset, old_above = self.durable[tp]
            held_before = set(range(old_offset)) | set(old_above)
            held_after = set(range(commit.offset)) | set(commit.finished_above)
            forgotten = held_before - held_after - self.missing[tp]
            assert not forgotten, f"the sink would forget {forgotten}"
            self.durable[tp] = (commit.offset, commit.finished_above)
            self.applied[tp] = number
        return True

    def ack(self, tp: TP, epoch: int, offset: int) -> None:
        moved, ref_moved = both(
            lambda: self.core.commit_acked(tp, epoch, offset),
            lambda: self.ref.commit_acked(tp, epoch, offset),
        )
        assert moved == ref_moved

    # -- assignment ----------------------------------------------------------------------

    @rule(tp=tps, roll=st.integers(0, 3))
    def assign(self, tp: TP, roll: int) -> None:
        if tp in self.epochs and roll:
            return  # assigning a held partition is illegal; try it now and then
        self.take(tp, *self.durable[tp], restored=False)

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

    @rule(roll=st.integers(0, 4))
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
        """Take a partition again from the last commit the sink stored."""
        tp = data.draw(st.sampled_from([t for t in TPS if t not in self.epochs]))
        self.take(tp, *self.durable[tp], restored=True)

    @precondition(lambda self: len(self.epochs) < len(TPS))
    @rule(data=st.data(), moved=st.integers(0, 3), new=st.sets(st.integers(0, 6), max_size=3))
    def another_member_progresses(self, data: st.DataObject, moved: int, new: set[int]) -> None:
        """While the partition is elsewhere, its owner stores commits of its own:
        the watermark moves on and other offsets finish out of order."""
        tp = data.draw(st.sampled_from([t for t in TPS if t not in self.epochs]))
        committed, above = self.durable[tp]
        start = committed + moved
        above_after = {o for o in above if o >= start} | {start + 1 + d for d in new}
        self.durable[tp] = (start, tuple(sorted(above_after)))
        self.fence[tp] = None
        self.applied[tp] = self.requests

    # -- fetching ------------------------------------------------------------------------

    @precondition(lambda self: self.epochs)
    @rule(
        data=st.data(),
        gap=st.integers(0, 2),
        width=st.integers(0, 8),
        aim_at_held=st.booleans(),
        shift=st.integers(-1, 1),
        last_arrives=st.booleans(),
        explicit_end=st.booleans(),
    )
    def fetch(self, data, gap, width, aim_at_held, shift, last_arrives, explicit_end) -> None:
        """A fetched range, often ending on, just below or just above a held offset."""
        tp = data.draw(st.sampled_from(self.held()))
        part = self.part(tp)
        start = part.next + gap
        if aim_at_held and part.skip:
            end = max(start, data.draw(st.sampled_from(sorted(part.skip))) + shift)
        else:
            end = start + width
        arrived = set(data.draw(st.sets(st.integers(start, max(start, end - 1)), max_size=8)))
        if last_arrives and end > start:
            arrived.add(end - 1)
        offsets = sorted(o for o in arrived - self.missing[tp] if o < end)
        end_arg = None if offsets and offsets[-1] == end - 1 and not explicit_end else end
        covered = range(part.next, end)
        run, ref_run = both(
            lambda: list(self.core.fetched(tp, self.epochs[tp], offsets, end_arg)),
            lambda: self.ref.fetched(tp, self.epochs[tp], offsets, end_arg),
        )
        assert run == ref_run
        if run is not None:
            self.missing[tp] |= set(covered) - set(offsets)

    @precondition(lambda self: self.epochs)
    @rule(data=st.data(), below=st.integers(1, 3))
    def fetch_below_next(self, data, below) -> None:
        tp = data.draw(st.sampled_from(self.held()))
        nxt = self.part(tp).next
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
        """A legal event through the consumer's API, one offset or a batch."""
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
    @rule(data=st.data())
    def run_everything(self, data) -> None:
        """The handlers catch up: every Pending message starts and every running one
        succeeds, in two batches (so fetched ranges get finished whole)."""
        tp = data.draw(st.sampled_from(self.held()))
        epoch = self.epochs[tp]
        for event, many in (
            ("started", self.core.started_many),
            ("succeeded", self.core.succeeded_many),
        ):
            ready = self.offsets_in(tp, LIFECYCLE[event][0])
            got, ref_got = both(
                lambda m=many, r=ready: m(tp, epoch, r),
                lambda e=event, r=ready: self.ref.event(e, tp, epoch, r),
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
        event=st.sampled_from(list(LIFECYCLE)),
        single=st.booleans(),
        spoil=st.sampled_from(["none", "live_elsewhere", "anywhere", "duplicate"]),
    )
    def any_batch(self, data, event, single, spoil) -> None:
        """Any event of the table on a batch from any states: legal (perhaps empty),
        or legal but for one offset anywhere in it: one live in another state, one
        finished, a gap, held, unfetched, or a duplicate."""
        tp = data.draw(st.sampled_from(self.held()))
        part = self.part(tp)
        source = LIFECYCLE[event][0]
        ready = self.offsets_in(tp, source)
        elsewhere = sorted(o for o, s in part.states.items() if s != source and s not in DONE)
        anywhere = st.one_of(
            st.sampled_from(self.near(tp)), st.integers(max(0, part.start - 1), part.next + 1)
        )
        offsets = []
        if ready:
            offsets = data.draw(st.lists(st.sampled_from(ready), max_size=4, unique=True))
        if spoil == "live_elsewhere" and elsewhere:
            extra = data.draw(st.sampled_from(elsewhere))
        elif spoil == "duplicate" and offsets:
            extra = data.draw(st.sampled_from(offsets))
        elif spoil != "none":
            extra = data.draw(anywhere)
        else:
            extra = None
        if extra is not None:
            offsets.insert(data.draw(st.integers(0, len(offsets))), extra)
        if single:
            offsets = offsets[:1] or [data.draw(anywhere)]
        tracker = self.core.tracker(tp)
        core_event = Event(event)
        both(
            lambda: (
                tracker.apply(core_event, offsets[0])
                if single
                else tracker.apply_many(core_event, offsets)
            ),
            lambda: self.ref.event(event, tp, self.epochs[tp], offsets),
        )

    # -- commits -------------------------------------------------------------------------

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def request_commit(self, data, tp: TP | None = None) -> None:
        if tp is None:
            tp = data.draw(st.sampled_from(self.held()))
        commit = self.core.commit_requested(tp)
        ref_offset = self.ref.commit_requested(tp)
        assert (commit.offset if commit else None) == ref_offset
        if commit is not None:
            assert commit.epoch == self.epochs[tp]
            assert list(commit.finished_above) == self.part(tp).observe()["finished_above"]
            self.requests += 1
            self.pending_acks.append((commit, self.requests))

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def commit_stored_and_acked(self, data) -> None:
        """The usual round: a commit is requested, stored and acked at once."""
        tp = data.draw(st.sampled_from(self.held()))
        waiting = len(self.pending_acks)
        self.request_commit(data, tp)
        if len(self.pending_acks) > waiting:
            commit, number = self.pending_acks.pop()
            assert self.store(commit, number)
            self.ack(tp, commit.epoch, commit.offset)

    @precondition(lambda self: self.pending_acks)
    @rule(
        data=st.data(),
        outcome=st.sampled_from(
            ["ack", "ack_twice", "fail", "lose", "stored_ack_lost", "stored_reported_failed"]
        ),
    )
    def deliver_ack(self, data, outcome) -> None:
        """Deliver one outstanding commit, in any order: stored and acked (once or
        twice), failed, lost, or stored with the answer lost or reported as failed."""
        i = data.draw(st.integers(0, len(self.pending_acks) - 1))
        commit, number = self.pending_acks.pop(i)
        tp, epoch = commit.tp, commit.epoch
        if outcome == "lose":
            return
        stored = outcome != "fail" and self.store(commit, number)
        if outcome == "stored_ack_lost" and stored:
            return
        if not stored or outcome == "stored_reported_failed":
            # Rejected (failed, or fenced: the partition was assigned again since
            # this commit was made), or the sink's answer was lost in a timeout.
            assert self.core.commit_failed(tp, epoch, commit.offset) == self.ref.commit_failed(
                tp, epoch, commit.offset
            )
            return
        for _ in range(2 if outcome == "ack_twice" else 1):
            self.ack(tp, epoch, commit.offset)

    @rule(data=st.data(), tp=tps, kind=EPOCH_KINDS)
    def arbitrary_ack(self, data, tp, kind) -> None:
        """An ack at any offset near the window: late, duplicated, between
        ``requested`` and ``processed``, above the watermark; any epoch."""
        epoch = self.epoch_of_kind(data, tp, kind)
        offset = data.draw(st.sampled_from(self.near(tp)))
        if epoch == self.epochs.get(tp):
            part = self.part(tp)
            if part.committed < offset <= part.processed() and offset > self.durable[tp][0]:
                return  # a sink never acks what it did not store
        self.ack(tp, epoch, offset)

    @rule(data=st.data(), tp=tps, kind=EPOCH_KINDS)
    def arbitrary_commit_failed(self, data, tp, kind) -> None:
        """A commit failure at any offset, for any epoch."""
        epoch = self.epoch_of_kind(data, tp, kind)
        offset = data.draw(st.sampled_from(self.near(tp)))
        failed, ref_failed = both(
            lambda: self.core.commit_failed(tp, epoch, offset),
            lambda: self.ref.commit_failed(tp, epoch, offset),
        )
        assert failed == ref_failed

    @precondition(lambda self: self.old_epochs)
    @rule(data=st.data(), offset=st.integers(0, 40))
    def stale_events_are_ignored(self, data, offset) -> None:
        tp, epoch = data.draw(st.sampled_from(self.old_epochs))
        assert self.core.succeeded(tp, epoch, offset) is False
        assert self.core.succeeded_many(tp, epoch, [offset]) is False
        assert self.core.started(tp, epoch, offset) is False
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
            assert tracker.finished_count == len(tracker.finished_above())

    @invariant()
    def CommittedWithinDurable(self) -> None:
        # A member's committed offset only reflects acks: it never runs ahead of
        # what the sink holds, and never falls behind where it started.
        for tp, _, tracker in self.core.partitions():
            assert self.starts[tp] <= tracker.committed <= self.durable[tp][0]

    @invariant()
    def NoDuplicateEffect(self) -> None:
        # No offset whose effects the sink holds is in flight: it was not handed
        # out to run again (what keeps TLA+'s effects[p][o] <= 1 in the code).
        for tp, _, tracker in self.core.partitions():
            again = [o for o in tracker.in_flight() if self.sink_holds(tp, o)]
            assert not again, f"{tp}: the sink holds {again}, yet they run again"


TestCoreVersusReference = CoreVersusReference.TestCase
