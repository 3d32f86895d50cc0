"""Broker faults on a proxied Kafka cluster (the broker kinds of :mod:`htmqc.chaos.schedule`).

A :class:`BrokerFault` carries one scheduled broker fault through three
phases, each step run by the run's :class:`Nemesis` thread (a restart takes
seconds; the harness keeps polling meanwhile). That thread lives as long as
the cluster: a node dies with the thread that started it
(:mod:`htmqc.kafka_cluster`: ``PR_SET_PDEATHSIG``), so a node restarted by a
short-lived thread would be killed again the moment that thread ended.

1. ``begin``: look up the node the fault names (the leader of an input
   partition, the active controller, a coordinator; or the scheduled node) and
   break it: SIGKILL, SIGSTOP, or blackhole through the
   :class:`~htmqc.chaos.cluster.ClusterFront`; a rolling restart stops
   (SIGTERM, a controlled shutdown) and starts each node in turn, waiting for
   every replica to be back in sync before the next;
2. the fault holds for its ``seconds`` (the harness's clock, from the moment
   it was in force);
3. ``heal``: restart the killed node (same storage and ports), SIGCONT the
   paused one, or let the traffic flow; then wait until every partition's ISR
   is whole again (:meth:`~htmqc.kafka_cluster.KafkaCluster.wait_in_sync`), so
   the next broker fault never finds the cluster still degraded.

:attr:`BrokerFault.record` is the report's entry: the node and its role, and
times in seconds since the run started (``t`` begun, ``t_in_force``,
``t_heal``, ``t_end``; per node for a rolling restart); ``error`` names a step
that failed (the run then fails: it did not test what it says).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from htmqc.chaos.cluster import ClusterFront
from htmqc.chaos.schedule import JEPSEN, Fault
from htmqc.errors import HtmqcError, RuntimeFailure
from htmqc.kafka_cluster import KafkaCluster

#: How long to look for a leader (a partition may be between leaders).
LOOKUP_SECONDS = 30.0
RESTART_SECONDS = 120.0
IN_SYNC_SECONDS = 180.0


class Nemesis:
    """The one long-lived thread that runs every broker fault's steps, in order.

    :meth:`close` it after the cluster is closed (see module docs).
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="htmqc-chaos-nemesis")

    def submit(self, step: Callable[[], None]) -> Future[None]:
        return self._pool.submit(step)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


#: ``coordinator(consumer) -> (role, key)``: ``("transaction", transactional id)``
#: or ``("group", group id)``: whose coordinator a consumer's commits go through.
CoordinatorOf = Callable[[int], tuple[str, str]]


class BrokerFault:
    """One broker fault in progress (see module docs)."""

    def __init__(
        self,
        fault: Fault,
        nemesis: Nemesis,
        cluster: KafkaCluster,
        front: ClusterFront,
        topic: str,
        coordinator_of: CoordinatorOf,
        clock: Callable[[], float],
        log: Callable[[str], None],
    ) -> None:
        self.fault = fault
        self.nemesis = nemesis
        self.cluster = cluster
        self.front = front
        self.topic = topic
        self.coordinator_of = coordinator_of
        self.clock = clock
        self.log = log
        self.node: int | None = None
        self.in_force_at: float | None = None  # monotonic
        self.record: dict[str, Any] = {
            "index": fault.index,
            "kind": fault.kind,
            "jepsen": JEPSEN[fault.kind],
            "fault": fault.describe(),
            "t": self.clock(),
        }
        self._step: Future[None] | None = None
        self.healed = False
        self._run(self._begin)

    @property
    def running(self) -> bool:
        """Whether a step is under way."""
        return self._step is not None and not self._step.done()

    def due(self, now: float) -> bool:
        """Whether the fault has held for its ``seconds`` (and may heal)."""
        return (
            not self.running
            and self.in_force_at is not None
            and now >= self.in_force_at + self.fault.seconds
        ) or (not self.running and "error" in self.record)

    def heal(self) -> None:
        """Start the heal step (see module docs)."""
        self._run(self._heal)

    def _run(self, step: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                step()
            except Exception as exc:  # reported in the record; the run then fails
                text = exc.line() if isinstance(exc, HtmqcError) else repr(exc)
                self.record.setdefault("error", text)
                self.log(f"chaos: #{self.fault.index} {self.fault.kind} failed: {text}")

        self._step = self.nemesis.submit(guarded)

    # -- begin ----------------------------------------------------------------------

    def _begin(self) -> None:
        kind = self.fault.kind
        if kind == "broker-rolling-restart":
            self._rolling_restart()
            self.in_force_at = time.monotonic()
            return
        node, role = self._target()
        self.node = node
        self.record.update(node=node, role=role)
        if kind.startswith("broker-kill-"):
            self.cluster.kill(node)
        elif kind == "broker-pause":
            self.cluster.pause(node)
        elif kind == "broker-isolate":
            self.front.isolate(node)
        elif kind == "broker-partition-clients":
            self.front.cut_clients(node)
        else:  # pragma: no cover - the schedule draws only the kinds above
            raise ValueError(kind)
        self.in_force_at = time.monotonic()
        self.record["t_in_force"] = self.clock()
        self.log(f"chaos: t={self.clock():.1f}s #{self.fault.index} {kind}: node {node} ({role})")

    def _target(self) -> tuple[int, str]:
        """The node the fault names, and why (its role)."""
        f = self.fault
        if f.node is not None:
            return f.node, f"node {f.node}"
        if f.kind == "broker-kill-leader":
            part = f.partition or 0
            deadline = time.monotonic() + LOOKUP_SECONDS
            while True:
                leader = self.cluster.leader_of(self.topic, part)
                if leader > 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if leader <= 0:
                raise _failed(f"{self.topic}/{part} had no leader for {LOOKUP_SECONDS:g} s")
            return leader, f"leader of {self.topic}/{part}"
        if f.kind == "broker-kill-controller":
            return self.cluster.active_controller(LOOKUP_SECONDS), "active controller"
        what, key = self.coordinator_of(f.consumer or 0)
        if what == "transaction":
            found = self.cluster.transaction_coordinator(key, LOOKUP_SECONDS)
        else:
            found = self.cluster.group_coordinator(key, LOOKUP_SECONDS)
        return found, f"{what} coordinator of {key}"

    def _rolling_restart(self) -> None:
        steps: list[dict[str, Any]] = []
        self.record["steps"] = steps
        for node in self.cluster.nodes:
            step: dict[str, Any] = {"node": node.node_id, "t_stop": self.clock()}
            steps.append(step)
            self.log(f"chaos: t={self.clock():.1f}s rolling restart: stopping node {node.node_id}")
            self.cluster.stop(node.node_id)
            step["t_stopped"] = self.clock()
            self.cluster.start(node.node_id, RESTART_SECONDS)
            step["t_started"] = self.clock()
            self._wait_in_sync()
            step["t_in_sync"] = self.clock()

    # -- heal -----------------------------------------------------------------------

    def _heal(self) -> None:
        kind, node = self.fault.kind, self.node
        self.record["t_heal"] = self.clock()
        if node is not None:
            if kind.startswith("broker-kill-"):
                self.cluster.start(node, RESTART_SECONDS)
                self.record["t_restarted"] = self.clock()
            elif kind == "broker-pause":
                self.cluster.resume(node)
            else:
                self.front.rejoin(node)
        self._wait_in_sync()
        self.record["t_end"] = self.clock()
        self.healed = True

    def _wait_in_sync(self) -> None:
        if not self.cluster.wait_in_sync(IN_SYNC_SECONDS):
            raise _failed(f"the replicas were not back in sync within {IN_SYNC_SECONDS:g} s")


def _failed(problem: str) -> RuntimeFailure:
    """A step of a broker fault did not work out (reported; fails the run)."""
    return RuntimeFailure(problem, "see the brokers' logs in the run's work directory")
