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

The *gate* says for each assigned partition whether it may be fetched. Its
states, each a set or map here (the DECISION functions below read them, and
are what ``htmqc.core.gate`` will replace):

* ``fenced``: the sink rejected a transaction because someone else claimed the
  partition; paused until the group takes it away, or, still ours after a
  session timeout, claimed again (then the fence rejects whoever is stale);
* ``claiming``: waiting for its claim (a claim requested by a rebalance
  callback that timed out, a re-claim after a fence, a doomed transaction or a
  sink reconnection), paused;
* ``waiting``: a retry-topic partition rewound to a record not due yet, paused
  until then;
* flow: every partition paused while in-flight messages or bytes are at the
  window (:class:`~htmqc.core.flow.FlowWindow`).

:meth:`Ownership.sync_pauses` makes the consumer's paused set match the gate.

Revoke (``on_revoke``): ``revoking`` (nothing new starts), wait until the
workers reached a barrier behind all work sent so far, at most
``--shutdown-seconds``; end the partitions' leases (work still queued does not
start; a handler still running is abandoned, see
:mod:`htmqc.runtime.workers`); commit what is finished (at-least-once: the
watermark, synchronously; exactly-once: the open transaction, fenced); then
``revoked``. Exactly-once, if the transaction cannot be committed in time
(the worker is stuck in a handler), it is doomed and every partition is
re-read from the sink. Lost (``on_lost``): the same without waiting, and no
Kafka commit (exactly-once still tries the fenced sink commit, which the sink
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


class Ownership:
    """Assignment, claims, revokes and the gate (see module docs)."""

    def __init__(self, engine: Engine, fence_grace: float) -> None:
        self.engine = engine
        #: Seconds a fenced partition stays paused before it is claimed again if the
        #: group still assigns it to us: the session timeout (by then the group has
        #: evicted a real zombie).
        self.fence_grace = fence_grace
        self.assigned: set[TopicPartition] = set()
        self.leases: dict[TopicPartition, Lease] = {}
        #: Exactly-once: the fence of each claim.
        self.fences: dict[TopicPartition, int] = {}
        self.fenced: dict[TopicPartition, float] = {}
        self.claiming: set[TopicPartition] = set()
        #: Partitions to claim once the sink is back or the doomed transaction is gone.
        self.reclaim: set[TopicPartition] = set()
        self.waiting: dict[TopicPartition, float] = {}
        self.flow_paused = False
        #: The circuit breaker is open: nothing is fetched.
        self.breaker_paused = False
        #: The sink failed and is being reconnected (``/readyz``).
        self.sink_down = False
        #: What the consumer was told is paused.
        self.paused: set[TopicPartition] = set()
        self._claims: dict[int, list[TopicPartition]] = {}
        self._tokens = itertools.count(1)
        self._to_seek: dict[TopicPartition, int] = {}
        #: Partitions of a running ``on_assign``: their start goes into the assignment.
        self._assigning: set[TopicPartition] = set()

    # -- DECISION: the gate, to be replaced by htmqc.core.gate ----------------------------

    def fetchable(self, tp: TopicPartition) -> bool:
        """Whether messages of ``tp`` may run (held, and no gate state stops it)."""
        return (
            tp in self.leases
            and tp not in self._to_seek
            and tp not in self.fenced
            and tp not in self.waiting
            and tp not in self.claiming
            and tp not in self.reclaim
        )

    def should_pause(self, tp: TopicPartition) -> bool:
        """Whether the consumer should keep ``tp`` paused."""
        return (
            self.flow_paused
            or self.breaker_paused
            or (tp in self.assigned and not self.fetchable(tp))
        )

    def claim_due(self, now: float) -> list[TopicPartition]:
        """Fenced partitions whose grace is over (and no longer fenced)."""
        due = [tp for tp, at in self.fenced.items() if now - at >= self.fence_grace]
        for tp in due:
            del self.fenced[tp]
        return [tp for tp in due if tp in self.assigned and tp not in self.leases]

    @property
    def seeks_pending(self) -> bool:
        """Whether a claimed partition still waits for its seek (retried each turn)."""
        return bool(self._to_seek)

    # -- views -----------------------------------------------------------------------------

    def lease(self, tp: TopicPartition) -> Lease | None:
        """The current lease of a held partition."""
        return self.leases.get(tp)

    # -- pauses ----------------------------------------------------------------------------

    def sync_pauses(self) -> None:
        """Seek the partitions whose claim came (:meth:`claimed`), then pause and
        resume so that the consumer's paused set matches the gate."""
        if self._to_seek:
            self._seek_pending()
        want = {
            tp for tp in self.assigned if self.should_pause(tp) and tp not in self._assigning
        }
        pause, resume = want - self.paused, self.paused - want
        consumer = self.engine.consumer
        if pause:
            consumer.pause([KafkaTP(t, p) for t, p in sorted(pause)])
        self.paused = want
        if resume:
            consumer.resume([KafkaTP(t, p) for t, p in sorted(resume & self.assigned)])

    def wait_until(self, tp: TopicPartition, due: float) -> None:
        """Retry topic: pause ``tp`` until unix time ``due``."""
        self.waiting[tp] = due
        self.sync_pauses()

    def wake(self, wall: float) -> None:
        """Retry-topic partitions whose next record is due may be fetched again."""
        for tp in [tp for tp, at in self.waiting.items() if at <= wall]:
            del self.waiting[tp]

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
        """Forget ``tp`` in the core (no commit) and end its lease."""
        e = self.engine
        e.core.revoked(tp)
        lease = self.leases.pop(tp, None)
        self.fences.pop(tp, None)
        if lease is not None:
            lease.end()
            e.stats.let_go(lease.count, lease.nbytes)
            e.workers.end(lease)
        e.failures.drop(tp)

    def drop_all(self) -> list[TopicPartition]:
        """:meth:`drop` every held partition; return them."""
        held = list(self.leases)
        for tp in held:
            self.drop(tp)
        return held

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
        """Ask for positions of ``tps`` (paused until they come); return the token."""
        e = self.engine
        token = next(self._tokens)
        self.claiming.update(tps)
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
        """Positions came (a ``claimed`` report): hold each partition still ours."""
        wanted = tps if tps is not None else self._claims.pop(token, [])
        starts: dict[TopicPartition, int] = {}
        for tp in wanted:
            if tp not in self.claiming:
                continue  # revoked, or claimed again, meanwhile
            self.claiming.discard(tp)
            if tp in self.assigned and tp in positions:
                starts[tp] = self.hold(tp, positions[tp])
        later = {tp: s for tp, s in starts.items() if tp not in self._assigning}
        if later:
            log.info("claimed %s", ", ".join(f"{t}/{p}@{s}" for (t, p), s in later.items()))
            self._to_seek.update(later)
        self.sync_pauses()
        return starts

    def _seek_pending(self) -> None:
        """Seek partitions assigned before their claim came (a seek right after the
        assignment may be refused by librdkafka; it is tried again next turn)."""
        for tp, offset in list(self._to_seek.items()):
            if tp not in self.assigned:
                del self._to_seek[tp]
                continue
            try:
                self.engine.consumer.seek(KafkaTP(tp[0], tp[1], offset))
            except KafkaException as exc:
                log.debug("seek %s/%d@%d deferred: %s", tp[0], tp[1], offset, exc)
                continue
            del self._to_seek[tp]

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
            for tp in tps:
                self.fenced.pop(tp, None)
                self.reclaim.discard(tp)
                if tp in self.leases:
                    self.drop(tp)
            self.assigned.update(tps)
            self._assigning.update(tps)
            e.stats.assignments += 1
            e.ever_assigned = True
            e.last_message = e.clock.monotonic()
            token = self.request_claim(tps)
        if e.eo is not None:
            e.await_(lambda: token not in self._claims, e.deadline(CLAIM_WAIT))
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
        with e.lock:
            # librdkafka keeps a partition's pause across unassign and assign: say it
            # again for each new partition, whichever way it goes.
            new = set(tps)
            self.paused -= new
            want = {tp for tp in new if self.should_pause(tp)}
            if want:
                consumer.pause([KafkaTP(t, p) for t, p in sorted(want)])
            if new - want:
                consumer.resume([KafkaTP(t, p) for t, p in sorted(new - want)])
            self.paused |= want

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
            for tp in tps:
                e.core.revoking(tp)
        if not lost:
            barrier = e.workers.barrier()
            if not e.await_(lambda: barrier.done, deadline):
                log.warning(
                    "running work did not finish in %.1f s; abandoning it",
                    e.options.shutdown_seconds,
                )
        with e.lock:
            for tp in tps:
                lease = self.leases.get(tp)
                if lease is not None:
                    lease.end()  # nothing more starts
        if e.eo is not None:
            if not e.eo.commit_now(deadline):
                self.doom()
        else:
            with e.lock:
                e.alo.drain_acks(e.core)
                final = [c for c in (e.core.commit_requested(tp) for tp in tps) if c is not None]
                if final and not lost:
                    e.alo.commit(e.core, final, sync=True)
        with e.lock:
            for tp in tps:
                if tp in self.leases:
                    self.drop(tp)
                self.assigned.discard(tp)
                self.fenced.pop(tp, None)
                self.claiming.discard(tp)
                self.reclaim.discard(tp)
                self.waiting.pop(tp, None)
                self.paused.discard(tp)
                self._to_seek.pop(tp, None)
        log.info("%s %s", "lost" if lost else "revoked", _names(tps))
        consumer.incremental_unassign(partitions)

    # -- exactly-once: fences, doomed transactions, sink faults -----------------------------

    def fenced_by(self, exc: Fenced) -> None:
        """The transaction was rolled back: every partition restarts from the sink;
        the stale ones wait (paused) for the group to take them away."""
        e = self.engine
        stale = (set(exc.tps) if exc.tps else set(self.assigned)) & self.assigned
        log.warning("fenced: %s", exc.line())
        held = self.drop_all()
        now = e.clock.monotonic()
        for tp in stale:
            self.fenced[tp] = now
        again = [tp for tp in held if tp in self.assigned and tp not in self.fenced]
        if again:
            self.request_claim(again)
        self.sync_pauses()

    def doom(self) -> None:
        """The open transaction could not be committed in time: roll it back and
        re-read every partition still ours from the sink once it is gone."""
        e = self.engine
        assert e.eo is not None
        log.warning("the open transaction could not be committed in time; rolling it back")
        e.eo.doom()
        self.reclaim.update(tp for tp in self.drop_all() if tp in self.assigned)
        self.sync_pauses()

    def sink_lost(self, exc: BaseException) -> None:
        """The sink failed (rolled back): hold nothing until it is back."""
        text = exc.line() if isinstance(exc, HtmqcError) else repr(exc)
        log.warning("sink failed, reconnecting: %s", text)
        self.sink_down = True
        self.reclaim.update(tp for tp in self.drop_all() if tp in self.assigned)
        self.reclaim.update(self.claiming & self.assigned)
        self.claiming.clear()
        self._claims.clear()
        self.sync_pauses()

    def sink_ready(self) -> None:
        """The sink is back, or the doomed transaction is gone: claim again."""
        self.sink_down = False
        again = sorted(self.reclaim & self.assigned)
        self.reclaim.clear()
        if again:
            log.info("claiming again: %s", _names(again))
            self.request_claim(again)
        self.sync_pauses()

    def reclaim_fenced(self, now: float) -> None:
        """Claim again the fenced partitions the group still gives us after a
        session timeout. Normally the group takes a stale partition away within
        that time (we were a zombie); if it did not, another process claimed it
        in a race and was itself a zombie, or the group still trusts us: either
        way claiming is safe (the fence rejects whoever is stale) and pausing for
        ever would stall the partition."""
        mine = self.claim_due(now)
        if mine:
            log.warning("claiming again, still assigned after being fenced: %s", _names(mine))
            self.request_claim(mine)
        self.sync_pauses()
