"""One chaos run: broker behind the proxy, consumers, paced producer, faults, audit.

:func:`run_chaos` does, in order:

1. start the proxy and a dedicated broker that advertises the proxy's address
   (:func:`start_proxied_broker`), so every client connection passes the
   proxy: Tansu behind a :class:`~htmqc.chaos.proxy.ChaosProxy`; with
   ``broker="kafka"`` one Apache Kafka node, with ``"kafka-cluster"`` three
   (replication factor 3, min ISR 2), each listener of each node behind a
   :class:`~htmqc.chaos.cluster.ClusterFront` proxy (clients, replication,
   controllers);
2. create the topic with ``partitions`` partitions and one pipeline per sink
   of ``sinks`` (:mod:`htmqc.chaos.pipeline`): a consumer group and its
   tables (:class:`~htmqc.chaos.store.RunStore`, its own prefix) or output
   topic (:class:`~htmqc.chaos.kafka_store.KafkaRunStore`);
3. start ``consumers`` processes per pipeline, ``htmqc run
   htmqc.chaos.handler:record --mode exactly-once``; member ``k`` (numbered
   across pipelines) runs with ``client.id=chaos-c<k>`` (what the proxy
   targets), with the Kafka sink ``--member-id m<k>`` (its transactional id
   survives restarts), and with ``trace_dir`` ``--trace
   <dir>/c<k>-<incarnation>.jsonl`` (a restarted process writes a new file);
4. produce ``messages`` messages (:func:`htmqc.produce.produce`, ids
   ``0..messages-1``) in chunks spread over ``produce_seconds``, so faults land
   while work flows;
5. every :data:`POLL_SECONDS`: read each pipeline's stored positions
   (progress, and the committed-offset history the audit checks for backward
   moves), let the :class:`~htmqc.chaos.injector.Injector` start the faults
   whose share of messages is stored by *every* pipeline and end those whose
   time is up (broker faults: :mod:`htmqc.chaos.nemesis`), and restart a
   consumer that exited on its own (counted in the report);
6. when every fault has ended and every pipeline stored every message (or
   ``timeout`` passed), stop the consumers (SIGTERM, then SIGKILL) and judge
   each pipeline (:meth:`~htmqc.chaos.pipeline.Pipeline.judge`: the audit and
   the sink's own checks; a Kafka pipeline's output is read back while the
   brokers still run). With ``trace_dir`` each trace is validated by
   ``model_checks.trace_validation`` when that package is importable (a
   source checkout), reference replay only. One allowance: a
   process killed by SIGKILL can leave its last batch of trace lines
   incomplete (the lines of a batch carry the state after the whole batch and
   the kill can fall between two of them); the trace of a *killed*
   incarnation whose only violation is on its very last line is reported with
   ``"killed_tail": true`` and accepted. Any other violation fails the run.

The result is a :class:`ChaosResult`: ``ok`` iff the run completed, every
pipeline is ok (no audit anomaly, no finding, every poison id
dead-lettered), every broker fault did what it says, and every trace
validated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htmqc.broker import Broker, _spawn, _wait_ready, broker_binary, create_topic
from htmqc.chaos.cluster import ClusterFront
from htmqc.chaos.handler import CLIENT_ENV, CONTROL_ENV, TABLE_ENV
from htmqc.chaos.injector import Injector, Member
from htmqc.chaos.kafka_store import TXN_DIR_ENV, KafkaRunStore
from htmqc.chaos.nemesis import BrokerFault, Nemesis
from htmqc.chaos.pipeline import KEYS, Pipeline, PipelineResult
from htmqc.chaos.proxy import ChaosProxy
from htmqc.chaos.schedule import BROKER_KINDS, CONSUMER_KINDS, Fault, build_schedule
from htmqc.chaos.store import RunStore
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_cluster import TEST_SETTINGS, KafkaCluster, start_kafka
from htmqc.kafka_defaults import LOCAL_BROKER_CONSUMER
from htmqc.loopback import free_port
from htmqc.produce import produce
from htmqc.progress import progress
from htmqc.sinks.sql import UNSAFE_DISABLE_FENCE_ENV

POLL_SECONDS = 0.1
STOP_SECONDS = 20.0
#: ``ChaosConfig.broker`` values.
BROKERS = ("tansu", "kafka", "kafka-cluster")
#: ``ChaosConfig.sinks`` values.
SINKS = ("postgresql", "sqlite", "kafka")
CLUSTER_NODES = 3
#: A chunk of the paced producer may wait out a broker fault (a leader moving,
#: an isolated broker) before it is acknowledged.
PRODUCE_FLUSH_SECONDS = 300.0


def default_kinds(broker: str, sinks: tuple[str, ...]) -> tuple[str, ...]:
    """The fault kinds of ``--kinds all``: every consumer kind (without ``zombie``
    when a sink is SQLite: a stopped SQLite writer holds the file lock), and the
    broker kinds on ``kafka-cluster``."""
    kinds = tuple(k for k in CONSUMER_KINDS if not (k == "zombie" and "sqlite" in sinks))
    return kinds + (BROKER_KINDS if broker == "kafka-cluster" else ())


@dataclass
class ChaosConfig:
    """Everything that shapes a run (the CLI's options)."""

    seed: int = 0
    partitions: int = 4
    consumers: int = 2
    """Consumer processes per pipeline (per sink)."""
    messages: int = 100_000
    faults: int = 8
    kinds: tuple[str, ...] | None = None
    """The fault kinds to draw from; ``None``: :func:`default_kinds`."""
    sinks: tuple[str, ...] = ("postgresql",)
    """One pipeline (consumer group) per sink, on the same input topic."""
    pg_url: str = "postgresql://127.0.0.1:5432/test"
    produce_seconds: float = 40.0
    timeout: float = 280.0
    txn_messages: int = 500
    txn_ms: float = 100.0
    trace_dir: Path | None = None
    work_dir: Path | None = None
    keep_tables: bool = False
    unsafe_disable_fence: bool = False
    zombie_in_transaction: bool = False
    """A zombie fault stops its consumer from inside a handler call, right after
    the call's effect went into the open transaction (the ``stop_in_txn`` switch
    of :mod:`htmqc.chaos.handler`), instead of by a SIGSTOP at whatever moment the
    fault fires: its late transaction then surely holds effects. Without it the
    stop may fall just after a commit, with nothing to commit late."""
    progress: bool = True
    broker: str = "tansu"
    """``tansu`` (the bundled broker), ``kafka`` (one node) or ``kafka-cluster``
    (three nodes, :mod:`htmqc.kafka_cluster`)."""
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))

    def resolved_kinds(self) -> tuple[str, ...]:
        """:attr:`kinds`, or :func:`default_kinds` when it is ``None``."""
        return self.kinds if self.kinds is not None else default_kinds(self.broker, self.sinks)

    def check(self) -> None:
        """:raises UsageError: an impossible shape (each named)."""
        for name in ("partitions", "consumers", "messages"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1", f"pass --{name} 1 or more")
        if self.faults < 0:
            raise UsageError("--faults must not be negative", "pass 0 or more")
        unknown = [s for s in self.sinks if s not in SINKS]
        if unknown or not self.sinks or len(set(self.sinks)) != len(self.sinks):
            raise UsageError(
                f"bad --sink {','.join(self.sinks)!r}",
                f"pass one or more of {', '.join(SINKS)}, comma-separated, each once",
            )
        if self.broker not in BROKERS:
            raise UsageError(f"unknown --broker {self.broker!r}", f"use {', '.join(BROKERS)}")
        kinds = self.resolved_kinds()
        if "sqlite" in self.sinks and "zombie" in kinds and self.faults:
            raise UsageError(
                "the zombie fault needs PostgreSQL: a stopped SQLite writer holds the file lock",
                "use --sink postgresql, or --kinds without zombie",
            )
        broker_kinds = [k for k in kinds if k in BROKER_KINDS]
        if broker_kinds and self.broker != "kafka-cluster" and self.faults:
            raise UsageError(
                f"broker faults ({', '.join(broker_kinds)}) need the three-node cluster",
                "pass --broker kafka-cluster, or --kinds without broker-*",
            )
        if "kafka" in self.sinks and self.broker == "tansu":
            raise UsageError(
                "the Kafka sink cannot be judged on the bundled broker: Tansu shows aborted "
                "records to read_committed readers",
                "pass --broker kafka or --broker kafka-cluster",
            )
        if self.timeout <= 0 or self.produce_seconds < 0:
            raise UsageError("--timeout must be positive", "pass seconds > 0")


@dataclass
class ChaosResult:
    """What a run found (see module docs); :meth:`to_json` is the report."""

    config: ChaosConfig
    kinds: tuple[str, ...]
    schedule: list[Fault]
    injected: list[dict[str, Any]]
    pipelines: list[PipelineResult]
    completed: bool
    wall_seconds: float
    restarts: dict[str, int]
    unexpected_exits: dict[str, int]
    fenced_commits: dict[str, int]
    proxy: dict[str, int]
    broker_errors: list[str]
    traces: list[dict[str, Any]]
    work_dir: str

    @property
    def ok(self) -> bool:
        """No anomaly of any kind."""
        return (
            self.completed
            and all(p.ok for p in self.pipelines)
            and not self.broker_errors
            and all(t.get("ok", True) for t in self.traces)
        )

    def pipeline(self, sink: str) -> PipelineResult:
        """The result of the pipeline of ``sink``."""
        for p in self.pipelines:
            if p.sink == sink:
                return p
        raise KeyError(sink)

    def to_json(self) -> dict[str, Any]:
        """The JSON report."""
        c = self.config
        broker_faults = [i for i in self.injected if i["kind"] in BROKER_KINDS]
        return {
            "ok": self.ok,
            "seed": c.seed,
            "shape": {
                "broker": c.broker,
                "partitions": c.partitions,
                "consumers": c.consumers,
                "messages": c.messages,
                "faults": c.faults,
                "kinds": list(self.kinds),
                "sinks": list(c.sinks),
                "produce_seconds": c.produce_seconds,
                "unsafe_disable_fence": c.unsafe_disable_fence,
                "zombie_in_transaction": c.zombie_in_transaction,
            },
            "completed": self.completed,
            "wall_seconds": round(self.wall_seconds, 2),
            "schedule": [f.to_json() for f in self.schedule],
            "injected": self.injected,
            "faults_injected": len(self.injected),
            "broker_faults_injected": len(broker_faults),
            "broker_errors": self.broker_errors,
            "restarts": self.restarts,
            "unexpected_exits": self.unexpected_exits,
            "fenced_commits": self.fenced_commits,
            "proxy": self.proxy,
            "pipelines": [p.to_json() for p in self.pipelines],
            "traces": self.traces,
            "work_dir": self.work_dir,
        }

    def summary(self) -> str:
        """A few lines for people."""
        kinds = sorted({i["kind"] for i in self.injected})
        n_broker = sum(1 for i in self.injected if i["kind"] in BROKER_KINDS)
        c = self.config
        lines = [
            f"chaos seed {c.seed}: {'OK' if self.ok else 'ANOMALIES'} - {c.broker}, "
            f"{c.messages} messages, {c.partitions} partitions, {c.consumers} consumers x "
            f"{'+'.join(c.sinks)}, {len(self.injected)} faults injected ({n_broker} broker; "
            f"{', '.join(kinds) or 'none'}), {self.wall_seconds:.1f} s",
        ]
        for p in self.pipelines:
            lines.extend(p.summary())
        restarted = {k: v for k, v in self.restarts.items() if v}
        fenced = {k: v for k, v in self.fenced_commits.items() if v}
        if restarted or fenced:
            lines.append(f"  restarts {restarted or 'none'}; fenced {fenced or 'none'}")
        exits = {k: v for k, v in self.unexpected_exits.items() if v}
        if exits:
            lines.append(f"  consumers that exited on their own (restarted): {exits}")
        for error in self.broker_errors:
            lines.append(f"  broker fault failed: {error}")
        if not self.completed:
            stored = {p.sink: p.stored for p in self.pipelines}
            lines.append(f"  not completed: stored {stored} of {c.messages} in time")
        bad = [t for t in self.traces if not t.get("ok", True)]
        if self.traces:
            tails = sum(1 for t in self.traces if t.get("killed_tail"))
            note = f" ({tails} killed mid-batch, last batch cut)" if tails else ""
            lines.append(f"  traces: {len(self.traces) - len(bad)}/{len(self.traces)} valid{note}")
        for t in bad[:3]:
            lines.append(f"    {t.get('summary', t.get('path'))}")
        return "\n".join(lines)


@dataclass
class ProxiedKafka:
    """Apache Kafka behind a :class:`~htmqc.chaos.cluster.ClusterFront`, stopped
    like a Tansu :class:`Broker`. Its logs stay in the run's work directory
    (``keep_log``)."""

    cluster: KafkaCluster
    keep_log: bool = True

    @property
    def bootstrap(self) -> str:
        """The client proxies' addresses, which the nodes advertise."""
        return self.cluster.bootstrap

    def stop(self) -> None:
        self.cluster.keep_logs = self.keep_log
        self.cluster.close()


def start_proxied_broker(
    work: Path, kind: str = "tansu"
) -> tuple[Broker | ProxiedKafka, ChaosProxy | ClusterFront]:
    """A dedicated broker (``kind``) behind the proxy, which it advertises.

    ``bootstrap`` is the proxy's address. Tansu's ``Broker.backend_port`` is
    the broker's own (used only to check it is ready).
    """
    if kind != "tansu":
        return _start_proxied_kafka(work, CLUSTER_NODES if kind == "kafka-cluster" else 1)
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


def _start_proxied_kafka(work: Path, nodes: int) -> tuple[ProxiedKafka, ClusterFront]:
    front = ClusterFront()
    try:
        cluster = start_kafka(nodes, front=front, work_dir=work / "kafka", keep_logs=True)
    except BaseException:
        front.stop()
        raise
    try:
        cluster.warm_up()
    except BaseException:
        cluster.close()
        front.stop()
        raise
    return ProxiedKafka(cluster), front


def _paced_producer(
    bootstrap: str, topic: str, messages: int, seconds: float, errors: list[str]
) -> threading.Thread:
    """A thread producing ``messages`` in about 20 chunks (of 200 or more) spread
    over ``seconds``."""
    chunks = max(1, min(20, messages // 200))
    step = -(-messages // chunks)

    def run() -> None:
        started = time.monotonic()
        try:
            for n, low in enumerate(range(0, messages, step)):
                due = started + seconds * n / chunks
                time.sleep(max(0.0, due - time.monotonic()))
                produce(
                    bootstrap,
                    topic,
                    min(step, messages - low),
                    keys=KEYS,
                    size=100,
                    start_id=low,
                    flush_timeout=PRODUCE_FLUSH_SECONDS,
                    reach_timeout=60.0,
                )
        except Exception as exc:  # reported by the harness, not lost in a thread
            errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="htmqc-chaos-producer", daemon=True)
    thread.start()
    return thread


def _consumer_starter(
    config: ChaosConfig, bootstrap: str, topic: str, pipeline: Pipeline, control: Path, work: Path
) -> Callable[[int, int], subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env.setdefault("HTMQC_CONTRACTS", "0")
    env[CONTROL_ENV] = str(control)
    store = pipeline.store
    if isinstance(store, KafkaRunStore):
        env[TXN_DIR_ENV] = str(store.txn_dir)
    else:
        env[TABLE_ENV] = store.effects_table
    if config.unsafe_disable_fence:
        env[UNSAFE_DISABLE_FENCE_ENV] = "1"
    else:
        env.pop(UNSAFE_DISABLE_FENCE_ENV, None)

    def start(index: int, incarnation: int) -> subprocess.Popen[bytes]:
        client = f"chaos-c{index}"
        cmd = [
            sys.executable, "-m", "htmqc", "run", "htmqc.chaos.handler:record",
            "--bootstrap", bootstrap, "--topic", topic, "--group", pipeline.group,
            "--mode", "exactly-once", "--sink", pipeline.sink_url,
            "--txn-messages", str(config.txn_messages), "--txn-ms", str(config.txn_ms),
            "--kafka-config", f"client.id={client}",
        ]  # fmt: skip
        if isinstance(store, KafkaRunStore):
            cmd += ["--member-id", f"m{index}"]
        if config.trace_dir is not None:
            cmd += ["--trace", str(config.trace_dir / f"c{index}-{incarnation}.jsonl")]
        with (work / f"c{index}.log").open("ab") as out:
            out.write(f"--- incarnation {incarnation}\n".encode())
            out.flush()
            return subprocess.Popen(
                cmd, env={**env, CLIENT_ENV: client}, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

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


def _fenced_commits(work: Path, members: list[Member]) -> dict[str, int]:
    """How many late commits each consumer slot had rejected (``fenced:`` log lines)."""
    out: dict[str, int] = {}
    for m in members:
        try:
            text = (work / f"c{m.index}.log").read_text(errors="replace")
        except OSError:
            text = ""
        out[f"c{m.index}"] = text.count("fenced: ")
    return out


def run_chaos(config: ChaosConfig) -> ChaosResult:
    """Run one chaos experiment (see module docs).

    :raises UsageError: a bad configuration.
    :raises RuntimeFailure: the broker, the database or the producer failed.
    """
    config.check()
    kinds = config.resolved_kinds()
    session_s = float(LOCAL_BROKER_CONSUMER["session.timeout.ms"]) / 1000.0
    schedule = build_schedule(
        config.seed,
        config.faults,
        consumers=config.consumers * len(config.sinks),
        messages=config.messages,
        kinds=kinds,
        session_timeout_s=session_s,
        partitions=config.partitions,
        nodes=CLUSTER_NODES,
        broker_session_s=float(TEST_SETTINGS["broker.session.timeout.ms"]) / 1000.0,
    )
    work = config.work_dir or Path(tempfile.mkdtemp(prefix="htmqc-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if config.trace_dir is not None:
        config.trace_dir.mkdir(parents=True, exist_ok=True)
    log = config.log
    log(f"chaos: seed {config.seed}, work dir {work}")
    for f in schedule:
        log(f"chaos: scheduled {f.describe()}")
    databases: dict[str, RunStore] = {}
    try:
        for sink in config.sinks:
            if sink == "postgresql":
                databases[sink] = RunStore(pg_url=config.pg_url)
            elif sink == "sqlite":
                databases[sink] = RunStore(path=work / "chaos.db")
            else:
                continue
            databases[sink].create()
        return _run(config, kinds, schedule, databases, work)
    finally:
        for store in databases.values():
            if not config.keep_tables:
                store.drop()
            store.close()


def _run(
    config: ChaosConfig,
    kinds: tuple[str, ...],
    schedule: list[Fault],
    databases: dict[str, RunStore],
    work: Path,
) -> ChaosResult:
    """Steps 1-6 of the module docs with the database tables in place."""
    log = config.log
    control = work / "control.json"
    started = time.monotonic()
    broker, proxy = start_proxied_broker(work, config.broker)
    broker.keep_log = True  # it is in the work directory, beside the consumers' logs
    nemesis = Nemesis()
    members: list[Member] = []
    pipelines: list[Pipeline] = []
    completed = False
    try:
        topic = f"chaos-{config.seed}"
        create_topic(broker.bootstrap, topic, config.partitions)
        for sink in config.sinks:
            group = f"{topic}-{sink}"
            store: RunStore | KafkaRunStore | None = databases.get(sink)
            if store is None:
                assert isinstance(broker, ProxiedKafka)  # ChaosConfig.check: no Kafka sink on Tansu
                store = KafkaRunStore(broker.cluster, topic, group, work / f"txns-{group}")
                store.create(config.partitions)
            pipelines.append(Pipeline(sink, group, store, config.partitions))

        def coordinator_of(member: int) -> tuple[str, str]:
            """A Kafka pipeline's transaction coordinator when the run has one (its
            member ``member mod consumers``), else the group coordinator of the
            member's pipeline."""
            for k, pipeline in enumerate(pipelines):
                if pipeline.sink == "kafka":  # KafkaSink.transactional_id of --member-id m<k>
                    index = k * config.consumers + member % config.consumers
                    return "transaction", f"htmqc-{pipeline.group}-m{index}"
            return "group", pipelines[member // config.consumers].group

        broker_fault: Callable[[Fault], BrokerFault] | None = None
        if isinstance(broker, ProxiedKafka) and isinstance(proxy, ClusterFront):
            cluster, front = broker.cluster, proxy

            def make_fault(f: Fault) -> BrokerFault:
                return BrokerFault(
                    f, nemesis, cluster, front, topic, coordinator_of, injector.clock, log
                )

            broker_fault = make_fault

        injector = Injector(
            schedule, members, proxy, control, config.seed, log, broker_fault,
            zombie_in_transaction=config.zombie_in_transaction,
        )  # fmt: skip
        for pipeline in pipelines:
            start = _consumer_starter(config, broker.bootstrap, topic, pipeline, control, work)
            first = len(members)
            members.extend(Member(first + i, start, pipeline) for i in range(config.consumers))
        completed = _drive(config, broker.bootstrap, topic, injector, members, pipelines)
        _stop(members)
        for p in pipelines:
            p.observe(fresh=True)
        results = [p.judge(config.messages, injector.poison_ids) for p in pipelines]
        proxy_stats = proxy.stats()
    finally:
        _stop(members)
        broker.stop()
        proxy.stop()
        nemesis.close()  # after the cluster: the nodes it restarted die with its thread
    wall = time.monotonic() - started
    killed = {f"c{m.index}-{n}.jsonl" for m in members for n in m.killed_incarnations}
    traces = _validate_traces(config.trace_dir, killed) if config.trace_dir is not None else []
    return ChaosResult(
        config=config,
        kinds=kinds,
        schedule=schedule,
        injected=sorted(injector.injected, key=lambda r: (r["t"], r["index"])),
        pipelines=results,
        completed=completed,
        wall_seconds=wall,
        restarts={f"c{m.index}": m.incarnation for m in members},
        unexpected_exits={f"c{m.index}": m.unexpected_exits for m in members},
        fenced_commits=_fenced_commits(work, members),
        proxy=proxy_stats,
        broker_errors=injector.broker_errors,
        traces=traces,
        work_dir=str(work),
    )


def _drive(
    config: ChaosConfig,
    bootstrap: str,
    topic: str,
    injector: Injector,
    members: list[Member],
    pipelines: list[Pipeline],
) -> bool:
    """Step 5 (module docs): produce, inject, restart; True iff everything was
    stored in time. Ends every fault still in force before it returns."""
    log = config.log
    errors: list[str] = []
    producer = _paced_producer(bootstrap, topic, config.messages, config.produce_seconds, errors)
    deadline = injector.started + config.timeout
    total = config.messages * len(pipelines)
    shown = 0
    stored = [0]
    completed = False
    with progress(total, "stored", enabled=config.progress) as advance:
        while time.monotonic() < deadline:
            stored = [p.observe() for p in pipelines]
            if sum(stored) > shown:
                advance(sum(stored) - shown)
                shown = sum(stored)
            if errors:
                raise RuntimeFailure(f"the chaos producer failed: {errors[0]}", "see the logs")
            injector.step(min(stored) / config.messages, time.monotonic())
            for m in members:
                if not m.killed and not m.stopped and m.proc.poll() is not None:
                    m.unexpected_exits += 1
                    log(f"chaos: c{m.index} exited with {m.proc.returncode}; restarting")
                    m.restart()
            done = injector.done(time.monotonic())
            if done and not producer.is_alive() and min(stored) >= config.messages:
                completed = True
                break
            time.sleep(POLL_SECONDS)
    if not completed:
        log(f"chaos: timed out after {config.timeout:g} s with {min(stored)} stored")
    injector.end_all()
    return completed


def _stop(members: list[Member]) -> None:
    """SIGTERM every consumer, SIGKILL what is left after :data:`STOP_SECONDS`."""
    stop_by = time.monotonic() + STOP_SECONDS
    for m in members:
        m.terminate()
    for m in members:
        m.finish(stop_by)
