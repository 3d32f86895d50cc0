"""Ownership: which partitions this member holds, and the per-partition gate.

Theory of operation
-------------------
Kafka's group assigns partitions (:attr:`Ownership.assigned`); the core holds
the ones this member has claimed, each under a :class:`~htmqc.runtime.lanes.Lease`
(the workers' view of that assignment). Positions on assignment come from
Kafka's committed offsets (at-least-once) or the sink's ``claim``
(exactly-once, run by the transaction worker, which owns the sink; the
callback waits for it, bounded, and otherwise assigns the partition paused
and claims it when the worker gets to it).

Which assigned partitions may be fetched is the *gate*'s decision, a pure
table in the core (:class:`htmqc.core.gate.Gate`: Claiming, Active, Waiting
for a retry-topic record, Fenced, Reclaiming, Draining, Leaving; consumer-wide
holds for flow control and the circuit breaker). Every event goes to the gate
and its answer (Drop, Claim, Pause, Resume, Seek) is carried out here
(:meth:`Ownership.do`), and nothing else: this module keeps only what I/O
needs, the leases and fences of the claims, the claims on their way (a
claim's answer counts only if it is the partition's latest), the claims
deferred while the sink is away or a doomed transaction is being rolled back,
and seeks librdkafka refused (tried again each turn).

Revoke (``on_revoke``): ``revoking``; end the partitions' leases (no call of
theirs starts; the messages queued for them are dropped unrun: never
committed, the next owner reads them); wait for the calls of theirs still
running, at most ``--shutdown-seconds`` (a handler still running then is
abandoned, see :mod:`htmqc.runtime.workers`), not for the work of the
partitions kept; commit what is finished (at-least-once: the
watermark, synchronously; exactly-once: the open transaction, fenced); then
``revoked``. Exactly-once, if the transaction cannot be committed in time (the
worker is stuck in a handler), it is doomed and every partition is re-read
from the sink. Lost (``on_lost``): the same without waiting, and no Kafka
commit (exactly-once still tries the fenced sink commit, which the sink
rejects if the partition moved).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from htmqc.core.decisions import TopicPartition
from htmqc.core.gate import Claim, Drop, Gate, GateAction, GateState, Hold, Pause, Resume, Seek
from htmqc.errors import HtmqcError
from htmqc.ports import Position
from htmqc.runtime.lanes import Lease
from htmqc.sinks.base import Fenced
from htmqc.sinks.encoding import decode_metadata

if TYPE_CHECKING:
    from htmqc.runtime.loop import Engine

log = logging.getLogger("htmqc.runtime")

#: Exactly-once: real seconds a rebalance callback waits for the claim of its
#: partitions before it assigns them paused and lets the claim finish later.
CLAIM_WAIT = 1.0


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in tps)


#: Gate states waiting for a claim.
_CLAIMING = frozenset({GateState.CLAIMING, GateState.RECLAIMING})
#: Gate states of a partition already being revoked.
_LEAVING = frozenset({GateState.DRAINING, GateState.LEAVING})
#: Gate states that keep an idle run from ending (work is about to come back).
_UNSETTLED = _CLAIMING | {GateState.WAITING}


class Ownership:
    """Assignment, claims, revokes; the gate's decisions carried out (module docs)."""

    def __init__(self, engine: Engine, fence_grace: float) -> None:
        self.engine = engine
        #: The partition gate (the decisions): fence grace is the session timeout,
        #: by then the group has evicted a real zombie.
        self.gate = Gate(fence_grace)
        self.leases: dict[TopicPartition, Lease] = {}
        #: Exactly-once: the fence of each claim.
        self.fences: dict[TopicPartition, int] = {}
        #: The sink failed and is being reconnected (``/readyz``).
        self.sink_down = False
        #: Any partition assigned (read by ``/readyz`` from another thread).
        self.any_assigned = False
        #: Each partition's latest claim (an older answer is void).
        self._pending: dict[TopicPartition, int] = {}
        self._claims: dict[int, list[TopicPartition]] = {}
        self._tokens = itertools.count(1)
        #: Claims held back until the sink is back or the doomed transaction is gone.
        self._deferred: set[TopicPartition] = set()
        self._claims_blocked = False
        self._to_seek: dict[TopicPartition, int] = {}
        #: The consume call (:attr:`Engine.consumes`) during or after which each
        #: partition was last sought or assigned at a position.
        self._sought: dict[TopicPartition, int] = {}
        #: Partitions of a running ``on_assign``, and the pause each should get once
        #: librdkafka has them (a pause before ``incremental_assign`` is lost).
        self._assigning: set[TopicPartition] = set()
        self._after_assign: dict[TopicPartition, bool] = {}

    # -- views -----------------------------------------------------------------------------

    @property
    def assigned(self) -> set[TopicPartition]:
        """Partitions the group gave us (any gate state)."""
        return self.gate.partitions()

    @property
    def paused(self) -> set[TopicPartition]:
        """Partitions Kafka was last told to pause."""
        return self.gate.paused()

    @property
    def fenced(self) -> set[TopicPartition]:
        """Partitions fenced and waiting for the group's decision."""
        return {tp for tp in self.gate.partitions() if self.gate.state(tp) is GateState.FENCED}

    def fetchable(self, tp: TopicPartition) -> bool:
        """Whether messages of ``tp`` may run: the gate says Active, we hold it, and
        no seek is outstanding."""
        return self.gate.fetching(tp) and tp in self.leases and tp not in self._to_seek

    def settled(self) -> bool:
        """No partition waits for a claim, a retry-topic record or a seek."""
        gate = self.gate
        return (
            not self._to_seek
            and not self._deferred
            and not any(gate.state(tp) in _UNSETTLED for tp in gate.partitions())
        )

    def read_before_seek(self, tp: TopicPartition, batch: int) -> bool:
        """Whether consume call ``batch`` may have returned records of ``tp`` read
        from where the fetcher was before ``tp``'s latest seek or assignment.

        Such records are the log's, but the offsets between the core's ``next``
        and the first of them are not a gap the broker skipped: they may never
        have been read since the position moved (a rollback re-reads from the
        sink's position). Intake takes such a batch only if it starts at ``next``.
        """
        return self._sought.get(tp, -1) >= batch

    def lease(self, tp: TopicPartition) -> Lease | None:
        """The current lease of a held partition."""
        return self.leases.get(tp)

    # -- carrying out the gate's decisions --------------------------------------------------

    def do(self, actions: list[GateAction]) -> None:
        """Carry out the gate's ``actions``, in order."""
        consumer = self.engine.consumer
        for action in actions:
            if isinstance(action, Drop):
                for tp in action.tps:
                    self.drop(tp)
            elif isinstance(action, Claim):
                self.request_claim(list(action.tps))
            elif isinstance(action, Seek):
                self.seek(action.tp, action.offset)
            elif isinstance(action, (Pause, Resume)):
                pause = isinstance(action, Pause)
                now = [tp for tp in action.tps if tp not in self._assigning]
                for tp in action.tps:
                    if tp in self._assigning:
                        self._after_assign[tp] = pause
                if now:
                    parts = [KafkaTP(t, p) for t, p in sorted(now)]
                    (consumer.pause if pause else consumer.resume)(parts)
        self.any_assigned = bool(self.gate.partitions())

    def set_hold(self, reason: Hold, on: bool) -> None:
        """Flow control or the circuit breaker holds (or releases) fetching."""
        if on != (reason in self.gate.holds):
            self.do(self.gate.hold(reason) if on else self.gate.unhold(reason))

    def tick(self, now: float) -> None:
        """Each turn: the gate's timers (fence grace, retry-topic waits); seeks
        librdkafka refused before."""
        actions = self.gate.tick(now)
        if actions:
            due = [tp for a in actions if isinstance(a, Claim) for tp in a.tps]
            if due:
                log.warning("claiming again, still assigned after being fenced: %s", _names(due))
            self.do(actions)
        if self._to_seek:
            for tp, offset in list(self._to_seek.items()):
                self.seek(tp, offset)

    def reclaim_fenced(self, now: float) -> None:
        """:meth:`tick` (claim again the fenced partitions the group still gives us
        after the grace: the fence rejects whoever is stale, and pausing for ever
        would stall the partition)."""
        self.tick(now)

    def wait_until(self, tp: TopicPartition, offset: int, until: float) -> None:
        """Retry topic: the record at ``offset`` is due at ``until`` (the loop's
        clock): rewind to it and pause ``tp`` until then. The metadata budget
        holds a partition back the same way (:meth:`Intake.throttle`)."""
        self.do(self.gate.retry_wait(tp, offset, until))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Seek ``tp``; a seek librdkafka refuses (right after an assignment) is
        tried again next turn, and the partition is not fetched meanwhile."""
        if tp not in self.gate.partitions():
            self._to_seek.pop(tp, None)
            return
        try:
            self.engine.consumer.seek(KafkaTP(tp[0], tp[1], offset))
        except KafkaException as exc:
            log.debug("seek %s/%d@%d deferred: %s", tp[0], tp[1], offset, exc)
            self._to_seek[tp] = offset
            return
        self._to_seek.pop(tp, None)
        self._sought[tp] = self.engine.consumes

    # -- holding and letting go ------------------------------------------------------------

    def hold(self, tp: TopicPartition, position: Position | tuple[int, tuple[int, ...]]) -> int:
        """Assign ``tp`` in the core at ``position`` under a new lease; return the start."""
        e = self.engine
        if e.core.epoch(tp) is not None:
            self.drop(tp)
        if isinstance(position, Position):
            start, above = position.committed, position.finished_above
            # Before the core hears it: the trace records the fence with the assign.
            self.fences[tp] = position.fence
        else:
            start, above = position
        epoch = e.core.assign(tp, start, above)
        self.leases[tp] = Lease(tp, epoch)
        return start

    def drop(self, tp: TopicPartition) -> None:
        """Forget ``tp`` in the core (no commit) and end its lease (a gate Drop)."""
        e = self.engine
        e.core.revoked(tp)
        lease = self.leases.pop(tp, None)
        self.fences.pop(tp, None)
        if lease is not None:
            lease.end()
            e.stats.let_go(lease.count, lease.nbytes)
            e.workers.end(lease)
        e.failures.drop(tp)

    # -- claims ----------------------------------------------------------------------------

    def low(self, tp: TopicPartition) -> int:
        """The log start of ``tp`` (where a partition never seen starts)."""
        got = self.engine.consumer.get_watermark_offsets(KafkaTP(tp[0], tp[1]), timeout=10)
        return max(0, int(got[0])) if got else 0

    def kafka_positions(self, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        """At-least-once: the group's committed offsets (and finished-above metadata)."""
        consumer = self.engine.consumer
        out: dict[TopicPartition, Any] = {}
        for part in consumer.committed([KafkaTP(t, p) for t, p in tps], timeout=30):
            tp = (part.topic, part.partition)
            if part.offset is not None and part.offset >= 0:
                out[tp] = (part.offset, decode_metadata(part.offset, part.metadata))
            else:
                out[tp] = (self.low(tp), ())
        return out

    def request_claim(self, tps: list[TopicPartition]) -> int:
        """Ask for the positions of ``tps`` (a gate Claim); return the token. Held
        back while the sink is away or a doomed transaction is rolled back."""
        e = self.engine
        token = next(self._tokens)
        if self._claims_blocked:
            self._deferred.update(tps)
            return token
        for tp in tps:
            self._pending[tp] = token
        if e.eo is None:
            self.claimed(token, self.kafka_positions(tps), tps)
            return token
        self._claims[token] = list(tps)
        # Where a partition the sink never saw starts: asked here, on the poll thread
        # (librdkafka may leave another thread's query unanswered, see htmqc.sinks.kafka).
        starts = {tp: self.low(tp) for tp in tps}
        e.eo.worker.request(("claim", tps, token, starts))
        return token

    def claimed(
        self,
        token: int,
        positions: dict[TopicPartition, Any],
        tps: list[TopicPartition] | None = None,
    ) -> dict[TopicPartition, int]:
        """Positions came (a ``claimed`` report): hold each partition whose latest
        claim this is and that still waits for it; tell the gate."""
        wanted = tps if tps is not None else self._claims.pop(token, [])
        gate = self.gate
        starts: dict[TopicPartition, int] = {}
        late: dict[TopicPartition, int] = {}
        for tp in wanted:
            if self._pending.get(tp) != token or gate.state(tp) not in _CLAIMING:
                continue  # revoked, or claimed again, meanwhile
            del self._pending[tp]
            if tp not in positions:
                continue
            start = starts[tp] = self.hold(tp, positions[tp])
            if tp not in self._assigning and gate.state(tp) is GateState.CLAIMING:
                late[tp] = start  # assigned without a position: seek it there
        if late:
            log.info("claimed %s", ", ".join(f"{t}/{p}@{s}" for (t, p), s in late.items()))
            for tp, offset in late.items():
                self.seek(tp, offset)
        if starts:
            self.do(gate.claimed(starts))
        return starts

    # -- rebalance callbacks ---------------------------------------------------------------

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Take new partitions at their durable positions: at-least-once at once;
        exactly-once the transaction worker claims them, and the callback waits
        for it at most :data:`CLAIM_WAIT` seconds (the worker may be in a long
        handler); a claim that comes later is sought and the partition resumed
        then (assigned paused meanwhile)."""
        e = self.engine
        tps = [(p.topic, p.partition) for p in partitions]
        if not tps:
            consumer.incremental_assign([])
            return
        with e.lock:
            if e.metrics is not None:
                e.metrics.rebalanced()
            self._assigning.update(tps)
            e.stats.assignments += 1
            e.ever_assigned = True
            e.last_message = e.clock.monotonic()
            self.do(self.gate.assigned(tps))
        if e.eo is not None:
            e.await_(
                lambda: not any(self.gate.state(tp) in _CLAIMING for tp in tps),
                e.deadline(CLAIM_WAIT),
            )
        with e.lock:
            self._assigning.difference_update(tps)
            starts = {tp: self._claims_start(tp) for tp in tps}
        known = {tp: s for tp, s in starts.items() if s is not None}
        log.info(
            "assigned %s",
            ", ".join(f"{t}/{p}@{known[(t, p)]}" if (t, p) in known else f"{t}/{p}@claiming"
                      for t, p in tps),
        )
        consumer.incremental_assign(
            [KafkaTP(t, p, known[(t, p)]) if (t, p) in known else KafkaTP(t, p) for t, p in tps]
        )
        for tp in known:
            self._sought[tp] = e.consumes
        with e.lock:
            # librdkafka keeps a partition's pause across unassign and assign: say it
            # for each new partition, whichever way it goes (still claiming: paused).
            want = {tp: self._after_assign.pop(tp, True) for tp in tps}
            pause = sorted(tp for tp, p in want.items() if p)
            resume = sorted(tp for tp, p in want.items() if not p)
            if pause:
                consumer.pause([KafkaTP(t, p) for t, p in pause])
            if resume:
                consumer.resume([KafkaTP(t, p) for t, p in resume])
            # --idle-exit's quiet starts now, not before the claims: a claim that took
            # most of it would leave the first fetch too little time.
            e.last_message = e.clock.monotonic()

    def _claims_start(self, tp: TopicPartition) -> int | None:
        """The start of ``tp`` if it is held by now, else ``None``."""
        if tp in self.leases:
            return self.engine.core.tracker(tp).committed
        return None

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Finish (bounded), commit what is finished, let go (module docs)."""
        self._let_go(consumer, partitions, lost=False)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """The partitions are already someone else's (module docs)."""
        self._let_go(consumer, partitions, lost=True)

    def _let_go(self, consumer: Any, partitions: list[Any], *, lost: bool) -> None:
        e = self.engine
        tps = [(p.topic, p.partition) for p in partitions]
        deadline = e.deadline(e.options.shutdown_seconds)
        with e.lock:
            if e.metrics is not None and tps:
                e.metrics.rebalanced()
            ours = [tp for tp in tps if tp in self.gate.partitions()]
            leaving = [tp for tp in ours if self.gate.state(tp) not in _LEAVING]
            if not lost and leaving:
                self.do(self.gate.revoking(leaving))
            for tp in tps:
                e.core.revoking(tp)
            mine = [lease for tp in tps if (lease := self.leases.get(tp)) is not None]
            for lease in mine:
                lease.end()  # no call of theirs starts: the queued ones are the next owner's
        # The calls running for these partitions, not the work of the others.
        if not lost and not e.await_(lambda: not e.workers.running(mine), deadline):
            log.warning(
                "running work did not finish in %.1f s; abandoning it", e.options.shutdown_seconds
            )
        with e.lock:
            e.serve()  # what the last calls reported before they ended
        if e.eo is not None:
            if not e.eo.commit_now(deadline):
                self.doom()
            if not lost:  # the lag copy of what is stored, while the partitions are ours
                with e.lock:
                    e.eo.copy_lag(e.clock.monotonic(), force=True)
        else:
            with e.lock:
                e.alo.drain_acks(e.core)
                final = [c for c in (e.core.commit_requested(tp) for tp in tps) if c is not None]
                if final and not lost:
                    e.alo.commit(e.core, final, sync=True)
        with e.lock:
            ours = [tp for tp in tps if tp in self.gate.partitions()]
            if lost:
                self.do(self.gate.lost(ours))
            else:
                self.do(self.gate.revoked(ours))
            for tp in tps:
                if tp in self.leases:
                    self.drop(tp)
                self._to_seek.pop(tp, None)
                self._pending.pop(tp, None)
                self._deferred.discard(tp)
        log.info("%s %s", "lost" if lost else "revoked", _names(tps))
        consumer.incremental_unassign(partitions)

    # -- exactly-once: fences, doomed transactions, sink faults -----------------------------

    def fenced_by(self, exc: Fenced) -> None:
        """The transaction was rolled back: every partition restarts from the sink;
        the stale ones wait (paused) for the group to take them away."""
        e = self.engine
        gate = self.gate
        stale = set(exc.tps) if exc.tps else gate.partitions()
        log.warning("fenced: %s", exc.line())
        self.do(gate.rolled_back(stale & gate.partitions(), e.clock.monotonic()))

    def doom(self) -> None:
        """The open transaction could not be committed in time: roll it back and
        re-read every partition still ours from the sink once it is gone."""
        e = self.engine
        assert e.eo is not None
        log.warning("the open transaction could not be committed in time; rolling it back")
        e.eo.doom()
        self._block_claims()

    def sink_lost(self, exc: BaseException) -> None:
        """The sink failed (rolled back): hold nothing until it is back."""
        text = exc.line() if isinstance(exc, HtmqcError) else repr(exc)
        log.warning("sink failed, reconnecting: %s", text)
        self.sink_down = True
        self._block_claims()

    def _block_claims(self) -> None:
        """The core's state is gone with the transaction: claim everything again,
        once the sink answers (claims on their way are void)."""
        self._claims_blocked = True
        self._deferred.update(self._pending)
        self._pending.clear()
        self._claims.clear()
        self.do(self.gate.rolled_back((), self.engine.clock.monotonic()))

    def sink_ready(self) -> None:
        """The sink is back, or the doomed transaction is gone: claim again."""
        self.sink_down = False
        self._claims_blocked = False
        gate = self.gate
        again = sorted(tp for tp in self._deferred if gate.state(tp) in _CLAIMING)
        self._deferred.clear()
        if again:
            log.info("claiming again: %s", _names(again))
            self.request_claim(again)
