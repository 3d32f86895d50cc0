"""Consumer processes and the fault injector of a chaos run (step 5 of the harness).

:class:`Member` is one consumer slot: its current ``htmqc run`` process and
incarnation (a restart is a new incarnation). :class:`Injector` starts each
scheduled fault once its share of messages is stored and every resource it
needs is free, and ends it when its time is up:

* consumer faults act on a member (SIGKILL then restart, SIGSTOP then SIGCONT),
  on the proxy (consumer network faults, by ``client.id``), or on the switch
  file the handlers read; a zombie is woken only once its pipeline moved on
  without it (:meth:`Ownership.moved_since`), or :data:`ZOMBIE_GRACE_SECONDS`
  after its scheduled time;
* broker faults (:mod:`htmqc.chaos.nemesis`) run their steps on threads; the
  injector starts the heal once the fault has held for its time, and frees the
  resource once the heal is done (the cluster back in sync).

Resources: a member (its process faults), ``net`` (all network rules, the
broker partitions included, so rules never overlap), a switch per kind, and
``broker`` (one broker fault at a time).

Every injected fault is one entry of :attr:`Injector.injected` (the report's
``injected``): ``index``, ``kind``, its Jepsen name, ``t`` (seconds since the
run started) and ``t_end``; broker faults add their node, role and steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from htmqc.chaos.nemesis import BrokerFault
from htmqc.chaos.proxy import Mode
from htmqc.chaos.schedule import BROKER_KINDS, JEPSEN, NETWORK_KINDS, SWITCH_KINDS, Fault

#: A zombie stays stopped past its scheduled time until its pipeline moved on
#: (a claim, a rebalance), but at most this much longer.
ZOMBIE_GRACE_SECONDS = 30.0
#: A run is over only this long after its last fault ended: what a fault sets in
#: motion (a woken zombie's late commit, a restarted consumer's first claim) gets
#: to happen, and be judged, before the consumers are stopped. Without it a zombie
#: woken once the others had stored everything was stopped at once, and its late
#: transaction, the very thing the fault is for, never had a chance to commit.
AFTERMATH_SECONDS = 3.0
#: How long a zombie asked to stop inside a handler call gets to do it.
STOP_IN_TXN_SECONDS = 10.0
_SWITCH_FIELD = {
    "sink-slow": "slow_ms",
    "sink-error": "sink_error_rate",
    "handler-error": "handler_error_rate",
}


class Proxy(Protocol):
    """What consumer network faults need: :class:`~htmqc.chaos.proxy.ChaosProxy`
    or :class:`~htmqc.chaos.cluster.ClusterFront`."""

    def set(self, mode: Mode, target: str | None = None, *, delay_ms: float = 0.0) -> None: ...

    def heal(self, target: str | None = None) -> None: ...

    def stats(self) -> dict[str, int]: ...


class Ownership(Protocol):
    """Whether a pipeline moved on since a snapshot (a zombie may wake)."""

    def snapshot(self) -> object: ...

    def moved_since(self, before: object) -> bool: ...


class Member:
    """One consumer slot: its current process and incarnation."""

    def __init__(
        self,
        index: int,
        start: Callable[[int, int], subprocess.Popen[bytes]],
        ownership: Ownership,
    ) -> None:
        self.index = index
        self.ownership = ownership
        self._start = start
        self.incarnation = 0
        self.proc = start(index, 0)
        self.stopped = False
        self.killed = False
        self.unexpected_exits = 0
        #: incarnations that ended by SIGKILL (their trace may end mid-batch)
        self.killed_incarnations: set[int] = set()

    @property
    def client_id(self) -> str:
        return f"chaos-c{self.index}"

    def kill(self) -> None:
        if self.stopped:
            self.cont()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.killed = True
        self.killed_incarnations.add(self.incarnation)

    def restart(self) -> None:
        self.incarnation += 1
        self.proc = self._start(self.index, self.incarnation)
        self.killed = False

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def is_stopped(self) -> bool:
        """Whether the process is stopped now (``T`` in ``/proc/PID/stat``)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] == "T"

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        if self.stopped:
            self.cont()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        try:
            self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.killed_incarnations.add(self.incarnation)


class _Active:
    """A fault in force: when it is due to end, what it holds, its record."""

    def __init__(self, fault: Fault, ends: float, record: dict[str, Any]) -> None:
        self.fault = fault
        self.ends = ends
        self.record = record
        self.broker: BrokerFault | None = None
        self.before: object = None  # a zombie's pipeline snapshot


def resources(f: Fault) -> frozenset[str]:
    """What a fault holds while it is in force (see module docs)."""
    if f.kind in ("broker-isolate", "broker-partition-clients"):
        return frozenset({"broker", "net"})
    if f.kind in BROKER_KINDS:
        return frozenset({"broker"})
    if f.kind in NETWORK_KINDS:
        return frozenset({"net"})
    if f.kind in SWITCH_KINDS:
        return frozenset({f"switch:{f.kind}"})
    return frozenset({f"member:{f.consumer}"})


class Injector:
    """Starts and ends the scheduled faults (see module docs).

    ``broker_fault``: makes the :class:`BrokerFault` of a broker kind (a
    cluster run), else ``None``.
    """

    def __init__(
        self,
        schedule: list[Fault],
        members: list[Member],
        proxy: Proxy,
        control: Path,
        salt: int,
        log: Callable[[str], None],
        broker_fault: Callable[[Fault], BrokerFault] | None = None,
        *,
        zombie_in_transaction: bool = False,
    ) -> None:
        self.pending = [f for f in schedule if f.kind != "poison"]
        self.zombie_in_transaction = zombie_in_transaction
        self.members = members
        self.proxy = proxy
        self.control = control
        self.log = log
        self.broker_fault = broker_fault
        self.switches: dict[str, Any] = {"salt": salt, "poison": []}
        for f in schedule:
            if f.kind == "poison":
                self.switches["poison"] = sorted({*self.switches["poison"], *f.ids})
        self.poison_ids: list[int] = list(self.switches["poison"])
        self.injected: list[dict[str, Any]] = [
            {"index": f.index, "kind": f.kind, "jepsen": JEPSEN[f.kind], "ids": list(f.ids),
             "t": 0.0}
            for f in schedule
            if f.kind == "poison"
        ]  # fmt: skip
        self.active: list[_Active] = []
        self.started = time.monotonic()
        #: ``step``'s clock reading when the last fault ended.
        self.last_end = self.started
        self.write_control()

    def clock(self) -> float:
        """Seconds since the run started, rounded for the report."""
        return round(time.monotonic() - self.started, 2)

    def write_control(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.switches))
        os.replace(tmp, self.control)

    def done(self, now: float) -> bool:
        """No fault pending or in force, the last one ended :data:`AFTERMATH_SECONDS` ago."""
        return not self.pending and not self.active and now - self.last_end >= AFTERMATH_SECONDS

    @property
    def broker_errors(self) -> list[str]:
        """The broker faults whose steps failed (each ``#index kind: error``)."""
        return [f"#{r['index']} {r['kind']}: {r['error']}" for r in self.injected if "error" in r]

    def step(self, fraction: float, now: float) -> None:
        """End what is due, then start what is scheduled by ``fraction`` and free."""
        for active in list(self.active):
            if self._try_end(active, now):
                self.active.remove(active)
                self.last_end = now
        busy = set().union(*(resources(a.fault) for a in self.active))
        for f in list(self.pending):
            if f.at > fraction:
                break
            needs = resources(f)
            if needs & busy:
                continue
            self.pending.remove(f)
            self.active.append(self._start(f, now))
            busy |= needs

    def _try_end(self, active: _Active, now: float) -> bool:
        """End ``active`` if due; True once it is over (its resources free)."""
        f, broker = active.fault, active.broker
        if broker is not None:
            if broker.running:
                return False
            if not broker.healed and "t_heal" not in broker.record:
                if broker.due(now):
                    self.log(f"chaos: t={self.clock():.1f}s heal #{f.index} {f.kind}")
                    broker.heal()
                return False
            active.record.setdefault("t_end", self.clock())
            return True
        if now < active.ends or not self._may_end(active, now - active.ends):
            return False
        self._end(f)
        active.record["t_end"] = self.clock()
        return True

    def _may_end(self, active: _Active, overdue: float) -> bool:
        """A zombie ends once its pipeline moved on (or after the grace)."""
        if active.fault.kind != "zombie" or overdue >= ZOMBIE_GRACE_SECONDS:
            return True
        member = self.members[active.fault.consumer or 0]
        return member.ownership.moved_since(active.before)

    def _start(self, f: Fault, now: float) -> _Active:
        self.log(f"chaos: t={self.clock():.1f}s start {f.describe()}")
        if f.kind in BROKER_KINDS:
            if self.broker_fault is None:  # pragma: no cover - refused by ChaosConfig.check
                raise ValueError(f"{f.kind} needs a Kafka cluster")
            broker = self.broker_fault(f)
            self.injected.append(broker.record)
            active = _Active(f, now, broker.record)
            active.broker = broker
            return active
        record = {
            "index": f.index,
            "kind": f.kind,
            "jepsen": JEPSEN[f.kind],
            "t": self.clock(),
            "fault": f.describe(),
        }
        self.injected.append(record)
        active = _Active(f, now + f.seconds, record)
        if f.kind == "kill":
            self.members[f.consumer or 0].kill()
        elif f.kind == "zombie":
            member = self.members[f.consumer or 0]
            active.before = member.ownership.snapshot()
            if self.zombie_in_transaction:
                record["stopped"] = self._stop_in_transaction(member, f.index)
            else:
                member.stop()
        elif f.kind in NETWORK_KINDS:
            mode: Mode = f.kind.removeprefix("net-")  # type: ignore[assignment]
            self.proxy.set(mode, self._target(f), delay_ms=f.delay_ms)
        else:
            self.switches[_SWITCH_FIELD[f.kind]] = f.delay_ms if f.kind == "sink-slow" else f.rate
            self.write_control()
        return active

    def _stop_in_transaction(self, member: Member, index: int) -> str:
        """Have ``member`` stop itself inside a handler call (the handler's
        ``stop_in_txn`` switch); ``in-transaction``, or ``outside`` when it did not
        within :data:`STOP_IN_TXN_SECONDS` (no message came) and was stopped here."""
        self.switches["stop_in_txn"] = f"{member.client_id}#{index}"
        self.write_control()
        deadline = time.monotonic() + STOP_IN_TXN_SECONDS
        while not member.is_stopped() and time.monotonic() < deadline:
            time.sleep(0.005)
        del self.switches["stop_in_txn"]
        self.write_control()
        if member.is_stopped():
            member.stopped = True
            return "in-transaction"
        member.stop()
        return "outside"

    def _end(self, f: Fault) -> None:
        self.log(f"chaos: t={self.clock():.1f}s end #{f.index} {f.kind}")
        if f.kind == "kill":
            self.members[f.consumer or 0].restart()
        elif f.kind == "zombie":
            self.members[f.consumer or 0].cont()
        elif f.kind in NETWORK_KINDS:
            self.proxy.heal(self._target(f))
        else:
            self.switches[_SWITCH_FIELD[f.kind]] = 0.0
            self.write_control()

    def _target(self, f: Fault) -> str | None:
        return None if f.consumer is None else self.members[f.consumer].client_id

    def end_all(self, wait: float = 300.0) -> None:
        """End every fault in force now (a timed-out run): heal broker faults and
        wait for them (at most ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        for active in list(self.active):
            broker = active.broker
            if broker is None:
                self._end(active.fault)
                active.record["t_end"] = self.clock()
                continue
            while broker.running and time.monotonic() < deadline:
                time.sleep(0.2)
            if not broker.running and "t_heal" not in broker.record:
                broker.heal()
            while broker.running and time.monotonic() < deadline:
                time.sleep(0.2)
            active.record.setdefault("t_end", self.clock())
        self.active.clear()
