"""One chaos run: broker behind the proxy, consumers, paced producer, faults, audit.

:func:`run_chaos` does, in order:

1. start the proxy (:class:`~htmqc.chaos.proxy.ChaosProxy`) and a dedicated broker
   (Tansu, or with ``broker="kafka"`` one Apache Kafka node) that listens on a
   private port and advertises the proxy's (:func:`start_proxied_broker`), so
   every client connection passes the proxy;
2. create the topic with ``partitions`` partitions and the run's tables
   (:class:`~htmqc.chaos.store.RunStore`, its own prefix);
3. start ``consumers`` processes ``htmqc run htmqc.chaos.handler:record --mode
   exactly-once`` in one group, consumer ``i`` with ``client.id=chaos-c<i>``
   (what the proxy targets) and, with ``trace_dir``, ``--trace
   <dir>/c<i>-<incarnation>.jsonl`` (a restarted process writes a new file);
4. produce ``messages`` messages (:func:`htmqc.produce.produce`, ids
   ``0..messages-1``) in chunks spread over ``produce_seconds``, so faults land
   while work flows;
5. every :data:`POLL_SECONDS`: read the stored positions (progress, and the
   committed-offset history the audit checks for backward moves), start each
   scheduled fault (:mod:`htmqc.chaos.schedule`) once its share of messages is
   stored and its target is free, end the faults whose time is up (restart
   what was killed, SIGCONT what was stopped, heal the proxy, clear switches),
   and restart a consumer that exited on its own (counted in the report). A
   zombie is woken only once some partition's fence rose after it stopped
   (the group gave its partitions away: Tansu can take longer than the
   session timeout to notice), or :data:`ZOMBIE_GRACE_SECONDS` after its
   scheduled time;
6. when every fault has ended and every message is stored (or ``timeout``
   passed), stop the consumers (SIGTERM, then SIGKILL), and audit
   (:func:`htmqc.audit.audit`): produced ids, effects in commit order, the
   dead-letter table, the position history; beside it
   :class:`~htmqc.chaos.store.ClaimCheck` finds effects committed by a
   generation after a newer one had claimed the partition (PostgreSQL).
   With ``trace_dir`` each trace is validated by
   ``model_checks.trace_validation`` when that package is importable (a
   source checkout), reference replay only. One allowance: a
   process killed by SIGKILL can leave its last batch of trace lines
   incomplete (the lines of a batch carry the state after the whole batch and
   the kill can fall between two of them); the trace of a *killed*
   incarnation whose only violation is on its very last line is reported with
   ``"killed_tail": true`` and accepted. Any other violation fails the run.

The result is a :class:`ChaosResult`: ``ok`` iff the run completed, the audit
found no anomaly, no effect was committed by a fenced generation, every effect
had a commit stamp, every poison id was
dead-lettered, and every trace validated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htmqc.audit import AuditReport, CommitObservation, Produced, audit
from htmqc.broker import Broker, _spawn, _wait_ready, broker_binary, create_topic, free_port
from htmqc.chaos.handler import CONTROL_ENV, TABLE_ENV
from htmqc.chaos.proxy import ChaosProxy, Mode
from htmqc.chaos.schedule import (
    KINDS,
    NETWORK_KINDS,
    SWITCH_KINDS,
    Fault,
    build_schedule,
)
from htmqc.chaos.store import ClaimCheck, RunStore
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_cluster import KafkaCluster, start_kafka
from htmqc.kafka_defaults import LOCAL_BROKER_CONSUMER
from htmqc.produce import produce
from htmqc.progress import progress
from htmqc.sinks.sql import UNSAFE_DISABLE_FENCE_ENV

POLL_SECONDS = 0.1
#: A zombie stays stopped past its scheduled time until some partition was claimed
#: anew (the group moved its partitions), but at most this much longer.
ZOMBIE_GRACE_SECONDS = 30.0
STOP_SECONDS = 20.0
KEYS = 1000
_SWITCH_FIELD = {
    "sink-slow": "slow_ms",
    "sink-error": "sink_error_rate",
    "handler-error": "handler_error_rate",
}


@dataclass
class ChaosConfig:
    """Everything that shapes a run (the CLI's options)."""

    seed: int = 0
    partitions: int = 4
    consumers: int = 2
    messages: int = 100_000
    faults: int = 8
    kinds: tuple[str, ...] = KINDS
    db: str = "postgresql"
    pg_url: str = "postgresql://127.0.0.1:5432/test"
    produce_seconds: float = 40.0
    timeout: float = 280.0
    txn_messages: int = 500
    txn_ms: float = 100.0
    trace_dir: Path | None = None
    work_dir: Path | None = None
    keep_tables: bool = False
    unsafe_disable_fence: bool = False
    progress: bool = True
    broker: str = "tansu"
    """``tansu`` (the bundled broker) or ``kafka`` (:mod:`htmqc.kafka_cluster`)."""
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))

    def check(self) -> None:
        """:raises UsageError: an impossible shape (each named)."""
        for name in ("partitions", "consumers", "messages"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1", f"pass --{name} 1 or more")
        if self.faults < 0:
            raise UsageError("--faults must not be negative", "pass 0 or more")
        if self.db not in ("postgresql", "sqlite"):
            raise UsageError(f"unknown --db {self.db!r}", "use postgresql or sqlite")
        if self.db == "sqlite" and "zombie" in self.kinds and self.faults:
            raise UsageError(
                "the zombie fault needs PostgreSQL: a stopped SQLite writer holds the file lock",
                "use --db postgresql, or --kinds without zombie",
            )
        if self.broker not in BROKERS:
            raise UsageError(f"unknown --broker {self.broker!r}", "use tansu or kafka")
        if self.timeout <= 0 or self.produce_seconds < 0:
            raise UsageError("--timeout must be positive", "pass seconds > 0")


@dataclass
class ChaosResult:
    """What a run found (see module docs); :meth:`to_json` is the report."""

    config: ChaosConfig
    schedule: list[Fault]
    injected: list[dict[str, Any]]
    audit: AuditReport
    completed: bool
    wall_seconds: float
    stored: int
    positions: dict[int, int]
    restarts: dict[str, int]
    unexpected_exits: dict[str, int]
    fenced_commits: dict[str, int]
    proxy: dict[str, int]
    unstamped: int
    fenced_after_claim: ClaimCheck
    poison_missing: list[int]
    traces: list[dict[str, Any]]
    work_dir: str

    @property
    def ok(self) -> bool:
        """No anomaly of any kind."""
        return (
            self.completed
            and self.audit.ok
            and self.unstamped == 0
            and self.fenced_after_claim.count == 0
            and not self.poison_missing
            and all(t.get("ok", True) for t in self.traces)
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON report."""
        c = self.config
        return {
            "ok": self.ok,
            "seed": c.seed,
            "shape": {
                "partitions": c.partitions,
                "consumers": c.consumers,
                "messages": c.messages,
                "faults": c.faults,
                "kinds": list(c.kinds),
                "db": c.db,
                "produce_seconds": c.produce_seconds,
                "unsafe_disable_fence": c.unsafe_disable_fence,
            },
            "completed": self.completed,
            "wall_seconds": round(self.wall_seconds, 2),
            "stored": self.stored,
            "positions": {str(k): v for k, v in sorted(self.positions.items())},
            "schedule": [f.to_json() for f in self.schedule],
            "injected": self.injected,
            "faults_injected": len(self.injected),
            "restarts": self.restarts,
            "unexpected_exits": self.unexpected_exits,
            "fenced_commits": self.fenced_commits,
            "proxy": self.proxy,
            "unstamped_effects": self.unstamped,
            "fenced_after_claim": {
                "count": self.fenced_after_claim.count,
                "examples": self.fenced_after_claim.examples,
            },
            "poison_not_dead_lettered": self.poison_missing,
            "audit": self.audit.to_json(),
            "traces": self.traces,
            "work_dir": self.work_dir,
        }

    def summary(self) -> str:
        """A few lines for people."""
        kinds = sorted({i["kind"] for i in self.injected})
        lines = [
            f"chaos seed {self.config.seed}: {'OK' if self.ok else 'ANOMALIES'} - "
            f"{self.config.messages} messages, {self.config.partitions} partitions, "
            f"{self.config.consumers} consumers, {len(self.injected)} faults injected "
            f"({', '.join(kinds) or 'none'}), {self.wall_seconds:.1f} s",
            self.audit.summary(),
        ]
        restarted = {k: v for k, v in self.restarts.items() if v}
        fenced = {k: v for k, v in self.fenced_commits.items() if v}
        if restarted or fenced:
            lines.append(f"  restarts {restarted or 'none'}; fenced {fenced or 'none'}")
        exits = {k: v for k, v in self.unexpected_exits.items() if v}
        if exits:
            lines.append(f"  consumers that exited on their own (restarted): {exits}")
        if not self.completed:
            lines.append(
                f"  not completed: {self.stored}/{self.config.messages} stored in time; "
                f"stored positions {dict(sorted(self.positions.items()))}"
            )
        if self.fenced_after_claim.count:
            shown = json.dumps(self.fenced_after_claim.examples[:3])
            lines.append(
                f"  fenced-write (after a claim): {self.fenced_after_claim.count}, e.g. {shown}"
            )
        if self.unstamped:
            lines.append(f"  {self.unstamped} effect rows without a commit stamp")
        if self.poison_missing:
            lines.append(f"  poison ids not dead-lettered: {self.poison_missing}")
        bad = [t for t in self.traces if not t.get("ok", True)]
        if self.traces:
            tails = sum(1 for t in self.traces if t.get("killed_tail"))
            note = f" ({tails} killed mid-batch, last batch cut)" if tails else ""
            lines.append(f"  traces: {len(self.traces) - len(bad)}/{len(self.traces)} valid{note}")
        for t in bad[:3]:
            lines.append(f"    {t.get('summary', t.get('path'))}")
        return "\n".join(lines)


#: ``ChaosConfig.broker`` values.
BROKERS = ("tansu", "kafka")


@dataclass
class ProxiedKafka:
    """One Apache Kafka node behind the proxy, stopped like a Tansu :class:`Broker`.

    Clients get the proxy's address from metadata; the node's own replication
    and controller listeners are not proxied. Its logs stay in the run's work
    directory (``keep_log``).
    """

    cluster: KafkaCluster
    keep_log: bool = True

    @property
    def bootstrap(self) -> str:
        """The proxy's address, which the node advertises."""
        return self.cluster.bootstrap

    def stop(self) -> None:
        self.cluster.keep_logs = self.keep_log
        self.cluster.close()


def start_proxied_broker(
    work: Path, kind: str = "tansu"
) -> tuple[Broker | ProxiedKafka, ChaosProxy]:
    """A proxy and a dedicated broker (``kind``) that advertises the proxy's address.

    ``bootstrap`` is the proxy's address. Tansu's ``Broker.backend_port`` is
    the broker's own (used only to check it is ready).
    """
    if kind == "kafka":
        return _start_proxied_kafka(work)
    backend = free_port()
    proxy = ChaosProxy(("127.0.0.1", backend)).start()
    try:
        broker = _spawn(
            broker_binary(),
            "127.0.0.1",
            backend,
            work / "broker.log",
            advertised_port=proxy.port,
        )
    except BaseException:
        proxy.stop()
        raise
    if not _wait_ready(broker, 20.0):
        broker.keep_log = True
        broker.stop()
        proxy.stop()
        raise RuntimeFailure(
            f"the chaos run's broker did not start on port {backend}",
            f"see {work / 'broker.log'}",
        )
    return broker, proxy


def _start_proxied_kafka(work: Path) -> tuple[ProxiedKafka, ChaosProxy]:
    backend = free_port()
    proxy = ChaosProxy(("127.0.0.1", backend)).start()
    try:
        cluster = start_kafka(
            1, ports=[backend], advertised_ports={1: proxy.port}, work_dir=work / "kafka"
        )
    except BaseException:
        proxy.stop()
        raise
    return ProxiedKafka(cluster), proxy


class _Member:
    """One consumer slot: its current process and incarnation."""

    def __init__(self, index: int, start: Callable[[int, int], subprocess.Popen[bytes]]) -> None:
        self.index = index
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


class _Injector:
    """Starts and ends the scheduled faults (see module docs, step 5)."""

    def __init__(
        self,
        schedule: list[Fault],
        members: list[_Member],
        proxy: ChaosProxy,
        control: Path,
        salt: int,
        log: Callable[[str], None],
        fences: Callable[[], dict[int, int]],
    ) -> None:
        self.fences = fences
        self._stopped_at: dict[int, dict[int, int]] = {}  # fault index -> fences then
        self.pending = [f for f in schedule if f.kind != "poison"]
        self.members = members
        self.proxy = proxy
        self.control = control
        self.log = log
        self.switches: dict[str, Any] = {"salt": salt, "poison": []}
        for f in schedule:
            if f.kind == "poison":
                self.switches["poison"] = sorted({*self.switches["poison"], *f.ids})
        self.poison_ids: list[int] = list(self.switches["poison"])
        self.injected: list[dict[str, Any]] = [
            {"index": f.index, "kind": f.kind, "ids": list(f.ids), "t": 0.0}
            for f in schedule
            if f.kind == "poison"
        ]
        self.active: list[tuple[float, str, Fault]] = []  # (ends, resource, fault)
        self.started = time.monotonic()
        self.write_control()

    def write_control(self) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.switches))
        os.replace(tmp, self.control)

    @staticmethod
    def resource(f: Fault) -> str:
        if f.kind in NETWORK_KINDS:
            return "net"
        if f.kind in SWITCH_KINDS:
            return f"switch:{f.kind}"
        return f"member:{f.consumer}"

    @property
    def done(self) -> bool:
        return not self.pending and not self.active

    def step(self, fraction: float, now: float) -> None:
        for ends, res, f in list(self.active):
            if now >= ends and self._may_end(f, now - ends):
                self.active.remove((ends, res, f))
                self._end(f)
        busy = {res for _e, res, _f in self.active}
        for f in list(self.pending):
            res = self.resource(f)
            if f.at > fraction:
                break
            if res in busy:
                continue
            self.pending.remove(f)
            self._start(f)
            busy.add(res)
            self.active.append((now + f.seconds, res, f))

    def _may_end(self, f: Fault, overdue: float) -> bool:
        """A zombie ends once a claim happened since it stopped (or after the grace)."""
        if f.kind != "zombie" or overdue >= ZOMBIE_GRACE_SECONDS:
            return True
        before = self._stopped_at.get(f.index, {})
        now = self.fences()
        return any(fence > before.get(part, 0) for part, fence in now.items())

    def _start(self, f: Fault) -> None:
        t = round(time.monotonic() - self.started, 2)
        self.injected.append({"index": f.index, "kind": f.kind, "t": t, "fault": f.describe()})
        if f.kind == "zombie":
            self._stopped_at[f.index] = self.fences()
        self.log(f"chaos: t={t:.1f}s start {f.describe()}")
        if f.kind == "kill":
            self.members[f.consumer or 0].kill()
        elif f.kind == "zombie":
            self.members[f.consumer or 0].stop()
        elif f.kind in NETWORK_KINDS:
            mode: Mode = f.kind.removeprefix("net-")  # type: ignore[assignment]
            self.proxy.set(mode, self._target(f), delay_ms=f.delay_ms)
        else:
            self.switches[_SWITCH_FIELD[f.kind]] = f.delay_ms if f.kind == "sink-slow" else f.rate
            self.write_control()

    def _end(self, f: Fault) -> None:
        t = time.monotonic() - self.started
        self.log(f"chaos: t={t:.1f}s end #{f.index} {f.kind}")
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
        return None if f.consumer is None else f"chaos-c{f.consumer}"

    def end_all(self) -> None:
        for _ends, _res, f in list(self.active):
            self._end(f)
        self.active.clear()


def _paced_producer(
    bootstrap: str, topic: str, messages: int, seconds: float, errors: list[str]
) -> threading.Thread:
    """A thread producing ``messages`` in about 20 chunks spread over ``seconds``."""
    chunks = max(1, min(20, messages // 1000 or 1))
    step = -(-messages // chunks)

    def run() -> None:
        started = time.monotonic()
        try:
            for n, low in enumerate(range(0, messages, step)):
                due = started + seconds * n / chunks
                time.sleep(max(0.0, due - time.monotonic()))
                produce(
                    bootstrap, topic, min(step, messages - low), keys=KEYS, size=100, start_id=low
                )
        except Exception as exc:  # reported by the harness, not lost in a thread
            errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="htmqc-chaos-producer", daemon=True)
    thread.start()
    return thread


def _consumer_starter(
    config: ChaosConfig, bootstrap: str, topic: str, store: RunStore, control: Path, work: Path
) -> Callable[[int, int], subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env.setdefault("HTMQC_CONTRACTS", "0")
    env[TABLE_ENV] = store.effects_table
    env[CONTROL_ENV] = str(control)
    if config.unsafe_disable_fence:
        env[UNSAFE_DISABLE_FENCE_ENV] = "1"
    else:
        env.pop(UNSAFE_DISABLE_FENCE_ENV, None)

    def start(index: int, incarnation: int) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "htmqc", "run", "htmqc.chaos.handler:record",
            "--bootstrap", bootstrap, "--topic", topic, "--group", f"{topic}-group",
            "--mode", "exactly-once", "--sink", store.sink_url,
            "--txn-messages", str(config.txn_messages), "--txn-ms", str(config.txn_ms),
            "--kafka-config", f"client.id=chaos-c{index}",
        ]  # fmt: skip
        if config.trace_dir is not None:
            cmd += ["--trace", str(config.trace_dir / f"c{index}-{incarnation}.jsonl")]
        with (work / f"c{index}.log").open("ab") as out:
            out.write(f"--- incarnation {incarnation}\n".encode())
            out.flush()
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    return start


def _validate_traces(trace_dir: Path, killed: set[str]) -> list[dict[str, Any]]:
    """Validate each trace (see module docs); ``killed``: file names of SIGKILLed ones."""
    try:
        from model_checks.trace_validation import validate_trace
    except ImportError:
        return [{"path": str(trace_dir), "ok": True, "summary": "not validated (no model_checks)"}]
    out: list[dict[str, Any]] = []
    for path in sorted(trace_dir.glob("*.jsonl")):
        report = validate_trace(path, tlc=False, mode="exactly-once")
        entry: dict[str, Any] = {"path": str(path), "ok": report.ok, "summary": report.summary()}
        entry["killed"] = path.name in killed
        tail = [v.line for v in report.violations] == [report.lines]
        if not report.ok and entry["killed"] and tail and report.tlc is None:
            entry["ok"] = True
            entry["killed_tail"] = True
        out.append(entry)
    return out


def _fenced_commits(work: Path, members: list[_Member]) -> dict[str, int]:
    """How many late commits each consumer slot had rejected (``fenced:`` log lines)."""
    out: dict[str, int] = {}
    for m in members:
        try:
            text = (work / f"c{m.index}.log").read_text(errors="replace")
        except OSError:
            text = ""
        out[f"c{m.index}"] = text.count("fenced: ")
    return out


@dataclass
class _History:
    """The committed-offset observations (only changes are kept)."""

    last: dict[int, int] = field(default_factory=dict)
    observations: list[CommitObservation] = field(default_factory=list)

    def observe(self, committed: dict[int, int]) -> int:
        for part, off in sorted(committed.items()):
            if self.last.get(part) != off:
                self.last[part] = off
                self.observations.append(CommitObservation(part, off))
        return sum(committed.values())


def _produced(messages: int) -> Iterator[Produced]:
    for i in range(messages):
        yield Produced(str(i), f"k{i % KEYS}")


def run_chaos(config: ChaosConfig) -> ChaosResult:
    """Run one chaos experiment (see module docs).

    :raises UsageError: a bad configuration.
    :raises RuntimeFailure: the broker, the database or the producer failed.
    """
    config.check()
    session_s = float(LOCAL_BROKER_CONSUMER["session.timeout.ms"]) / 1000.0
    schedule = build_schedule(
        config.seed,
        config.faults,
        consumers=config.consumers,
        messages=config.messages,
        kinds=config.kinds,
        session_timeout_s=session_s,
    )
    work = config.work_dir or Path(tempfile.mkdtemp(prefix="htmqc-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if config.trace_dir is not None:
        config.trace_dir.mkdir(parents=True, exist_ok=True)
    log = config.log
    log(f"chaos: seed {config.seed}, work dir {work}")
    for f in schedule:
        log(f"chaos: scheduled {f.describe()}")
    if config.db == "postgresql":
        store = RunStore(pg_url=config.pg_url)
    else:
        store = RunStore(path=work / "chaos.db")
    store.create()
    try:
        return _run(config, schedule, store, work)
    finally:
        if not config.keep_tables:
            store.drop()
        store.close()


def _run(config: ChaosConfig, schedule: list[Fault], store: RunStore, work: Path) -> ChaosResult:
    """Steps 1-6 of the module docs with the tables in place."""
    log = config.log
    control = work / "control.json"
    started = time.monotonic()
    broker, proxy = start_proxied_broker(work, config.broker)
    broker.keep_log = True  # it is in the work directory, beside the consumers' logs
    members: list[_Member] = []
    history = _History()
    completed = False
    stored = 0
    try:
        topic = f"chaos-{config.seed}"
        create_topic(broker.bootstrap, topic, config.partitions)
        injector = _Injector(
            schedule, members, proxy, control, config.seed, log, fences=store.fences
        )
        start = _consumer_starter(config, broker.bootstrap, topic, store, control, work)
        members.extend(_Member(i, start) for i in range(config.consumers))
        errors: list[str] = []
        producer = _paced_producer(
            broker.bootstrap, topic, config.messages, config.produce_seconds, errors
        )
        deadline = started + config.timeout
        with progress(config.messages, "stored", enabled=config.progress) as advance:
            while time.monotonic() < deadline:
                stored_now = history.observe(store.committed())
                if stored_now > stored:
                    advance(stored_now - stored)
                    stored = stored_now
                if errors:
                    raise RuntimeFailure(f"the chaos producer failed: {errors[0]}", "see the logs")
                injector.step(stored / config.messages, time.monotonic())
                for m in members:
                    if not m.killed and not m.stopped and m.proc.poll() is not None:
                        m.unexpected_exits += 1
                        log(f"chaos: c{m.index} exited with {m.proc.returncode}; restarting")
                        m.restart()
                if injector.done and not producer.is_alive() and stored >= config.messages:
                    completed = True
                    break
                time.sleep(POLL_SECONDS)
        if not completed:
            log(f"chaos: timed out after {config.timeout:g} s with {stored} stored")
        injector.end_all()
    finally:
        stop_by = time.monotonic() + STOP_SECONDS
        for m in members:
            m.terminate()
        for m in members:
            m.finish(stop_by)
        proxy_stats = proxy.stats() if members else {}
        broker.stop()
        proxy.stop()
    stored = history.observe(store.committed())
    wall = time.monotonic() - started
    dead = store.dead_letters()
    claim_check = ClaimCheck(store.claims())
    report = audit(
        _produced(config.messages),
        store.effects(claim_check),
        dlq=dead,
        committed=history.observations,
    )
    dead_ids = {d.id for d in dead}
    poison_missing = [i for i in injector.poison_ids if str(i) not in dead_ids]
    unstamped = store.unstamped()
    killed = {f"c{m.index}-{n}.jsonl" for m in members for n in m.killed_incarnations}
    traces = _validate_traces(config.trace_dir, killed) if config.trace_dir is not None else []
    return ChaosResult(
        config=config,
        schedule=schedule,
        injected=injector.injected,
        audit=report,
        completed=completed,
        wall_seconds=wall,
        stored=stored,
        positions=dict(history.last),
        restarts={f"c{m.index}": m.incarnation for m in members},
        unexpected_exits={f"c{m.index}": m.unexpected_exits for m in members},
        fenced_commits=_fenced_commits(work, members),
        proxy=proxy_stats,
        unstamped=unstamped,
        fenced_after_claim=claim_check,
        poison_missing=poison_missing,
        traces=traces,
        work_dir=str(work),
    )
