"""Run the contenders against one broker, take medians, write results.

``python -m benchmarks.peers`` (the full run: 1,000,000 messages per run,
100 B and 1 KiB values, 3 repeats, latency and the SIGKILL test);
``python -m benchmarks.peers --quick`` (a small smoke run of the same).

1. Start the bundled broker (or use ``--bootstrap``); for each size create a
   topic of 8 partitions and produce ``N`` messages (1,000 keys) once.
2. Throughput: for each repeat, every contender slot, every size
   (round-robin, so drifting load hits all alike), one worker process per run
   with a fresh consumer group (and a fresh output topic, deleted after the
   run); medians of rate, CPU s per million, peak RSS and the worker's whole
   process CPU (``RUSAGE_CHILDREN``) across repeats.
3. Latency (unless ``--latency-seconds 0``): for every slot, a fresh topic,
   a worker started first, then messages produced in this process at a paced
   ``--latency-rate`` for ``--latency-seconds`` while the worker consumes;
   p50/p99/p999 from the produce timestamp to the end of the handler
   (at-least-once) or to the commit of the transaction holding the message
   (exactly-once).
4. Duplicates (unless ``--no-kill``): :mod:`benchmarks.peers.kill`, a SIGKILL
   half-way and a restart per slot, stored effects counted by
   :func:`htmqc.audit.audit`.
5. The goals of issue 9 (:func:`goals`), printed and stored.
6. Write ``benchmarks/results/peers.json``, the PNG charts and the table in
   ``benchmarks/README.md`` between the marker comments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.brokers import BROKERS, describe, running, suffix
from benchmarks.peers import kill
from benchmarks.peers.contenders import BASELINE_ENV, BY_KEY, SLOTS, Slot

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
PARTITIONS = 8
KEYS = 1000
#: The full run (the defaults) and ``--quick`` (a smoke test of every measure).
FULL = {"count": 1_000_000, "repeat": 3, "latency_seconds": 10.0, "kill_count": 50_000,
        "timeout": 900.0}
QUICK = {"count": 20_000, "repeat": 1, "latency_seconds": 6.0, "kill_count": 4_000,
         "timeout": 180.0}
#: The goals per broker: ``(issue, htmqc K→K over Quix exactly-once K→K, htmqc
#: at-least-once over the raw loop)``: issue 9 on Tansu, issue 17 on Kafka.
GOALS: dict[str, tuple[str, float, float]] = {
    "tansu": ("issue 9", 2.0, 0.85),
    "kafka": ("issue 17", 2.0, 0.90),
}


def worker_command(slot: Slot, bootstrap: str, topic: str, count: int, group: str, out: Path,
                   *, latency: bool = False, store: str | None = None,
                   kill_at: int | None = None, journal: str | None = None,
                   out_topic: str | None = None,
                   idle_exit: float | None = None, timeout: float = 300.0) -> list[str]:
    """The argv that runs ``slot`` in its own process (see :mod:`benchmarks.peers.worker`)."""
    argv = [sys.executable, "-m", "benchmarks.peers.worker", slot.module, "--mode", slot.mode,
            "--bootstrap", bootstrap, "--topic", topic, "--count", str(count),
            "--group", group, "--out", str(out), "--timeout", str(timeout)]
    if slot.baseline:
        argv += ["--htmqc-src", baseline_src()]
    if latency:
        argv.append("--latency")
    for flag, value in (("--store", store), ("--kill-at", kill_at), ("--journal", journal),
                        ("--out-topic", out_topic), ("--idle-exit", idle_exit)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def baseline_src() -> str:
    """The older htmqc's ``src`` the ``base_*`` slots import (:data:`BASELINE_ENV`).

    :raises SystemExit: it is not set or holds no ``htmqc`` package (one line).
    """
    src = os.environ.get(BASELINE_ENV, "")
    if not (Path(src) / "htmqc" / "__init__.py").is_file():
        raise SystemExit(
            f"peers: the base_* slots need {BASELINE_ENV}=DIR/src of an exported htmqc "
            f"(git archive COMMIT src | tar -x -C DIR); got {src!r}"
        )
    return src


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "src")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HTMQC_CONTRACTS"] = "0"
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spawn(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` to its end (killed after ``timeout`` + 60 s); exit code, last stderr line."""
    try:
        done = subprocess.run(argv, env=_env(), capture_output=True, text=True,
                              timeout=timeout + 60, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout + 60:g}s"
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return done.returncode, tail[:300]


def _output_topic(bootstrap: str, slot: Slot, topic: str) -> str | None:
    if slot.mode != "exactly-once-kafka":
        return None
    from htmqc.broker import create_topic

    out = f"{topic}-{slot.key}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, out, PARTITIONS)
    return out


def _delete_topic(bootstrap: str, topic: str | None) -> None:
    """Best-effort delete (frees the broker's memory between runs)."""
    if topic is None:
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result
    try:
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result(timeout=30)
    except Exception as exc:  # the broker may not delete; the run's figures stand anyway
        print(f"  (could not delete {topic}: {exc})", flush=True)


def settle() -> None:
    """Write back the page cache's dirty pages before a run (``sync``).

    Contenders that write (Kafka->Kafka output, SQLite, the produced topics) leave
    gigabytes of dirty pages behind; the kernel writes them back when they expire,
    often during a later contender's run, whose figures then carry another's
    cost. Outside the measured time.
    """
    os.sync()


def run_worker(slot: Slot, bootstrap: str, topic: str, count: int, *,
               timeout: float = 300.0) -> dict[str, Any]:
    """Run one contender to completion; its figures, or ``{"error": ...}``.

    Adds ``cpu_s_process``: the worker process's whole CPU time (start-up,
    group join and shutdown included), from ``RUSAGE_CHILDREN``.
    """
    out_topic = _output_topic(bootstrap, slot, topic)
    settle()
    try:
        with tempfile.TemporaryDirectory(prefix="peers-") as work:
            out = Path(work) / "result.json"
            group = f"peers-{slot.key}-{uuid.uuid4().hex[:8]}"
            before = _children_cpu()
            code, err = spawn(worker_command(slot, bootstrap, topic, count, group, out,
                                             out_topic=out_topic, timeout=timeout), timeout)
            cpu = _children_cpu() - before
            if code != 0 or not out.exists():
                return {"error": f"exit {code}: {err}"}
            result: dict[str, Any] = json.loads(out.read_text())
            result["cpu_s_process"] = round(cpu, 3)
            return result
    finally:
        _delete_topic(bootstrap, out_topic)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one slot and size; errors kept verbatim."""
    ok = [r for r in runs if "error" not in r]
    summary: dict[str, Any] = {
        "repeats": len(runs),
        "ok": len(ok),
        "rate": _median([r.get("rate") for r in ok]),
        "cpu_s_per_million": _median([r.get("cpu_s_per_million") for r in ok]),
        "peak_rss_mib": _median([r.get("peak_rss_mib") for r in ok]),
        "cpu_s_process": _median([r.get("cpu_s_process") for r in ok]),
        "rates": [r.get("rate") for r in ok],
    }
    errors = sorted({r["error"] for r in runs if "error" in r})
    if errors:
        summary["errors"] = errors
    return summary


def throughput(bootstrap: str, slots: list[Slot], sizes: list[int], count: int, repeat: int,
               timeout: float) -> dict[str, Any]:
    """Round-robin runs of every slot on every size; ``{size: {slot: summary}}``."""
    from htmqc.produce import produce

    topics: dict[int, str] = {}
    for size in sizes:
        topic = f"peers-{size}-{uuid.uuid4().hex[:6]}"
        made = produce(bootstrap, topic, count, keys=KEYS, size=size, partitions=PARTITIONS)
        print(f"produced {count:,} x {size} B in {made.seconds:.1f}s", flush=True)
        topics[size] = topic
    raw_runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for n in range(repeat):
        for slot in slots:
            for size in sizes:
                slot_count = min(count, slot.count_cap) if slot.count_cap else count
                result = run_worker(slot, bootstrap, topics[size], slot_count, timeout=timeout)
                raw_runs.setdefault((size, slot.key), []).append(result)
                shown = result.get("rate", result.get("error"))
                print(f"[{n + 1}/{repeat}] {size:>5} B {slot.key:<10} {shown}", flush=True)
    out: dict[str, Any] = {}
    for (size, key), runs in raw_runs.items():
        summary = summarize(runs)
        slot = BY_KEY[key]
        summary["count"] = min(count, slot.count_cap) if slot.count_cap else count
        out.setdefault(str(size), {})[key] = summary
    return out


def paced_produce(bootstrap: str, topic: str, rate: float, seconds: float) -> dict[str, Any]:
    """Produce ``rate`` msg/s for ``seconds`` (100-byte values); count and achieved rate."""
    from confluent_kafka import Producer

    from htmqc.kafka_defaults import producer_config
    from htmqc.produce import message_key, message_value

    producer = Producer(producer_config(bootstrap, {"linger.ms": 1}))
    total = int(rate * seconds)
    sent = 0
    start = time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            try:
                producer.produce(topic, message_value(sent, 100), message_key(sent, KEYS))
                sent += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        time.sleep(0.001)
    elapsed = time.perf_counter() - start
    producer.flush(30)
    return {"count": total, "achieved_rate": round(total / elapsed) if elapsed > 0 else None}


def wait_assigned(bootstrap: str, group: str, topic: str, timeout: float) -> bool:
    """Wait until ``group`` is stable with all :data:`PARTITIONS` of ``topic``
    assigned (DescribeGroups); ``False`` if that was not seen within ``timeout``.
    The bundled broker lists no members of a stable group: there, stable is
    taken as assigned (it turns stable as its member gets the partitions)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            [described] = admin.describe_consumer_groups([group]).values()
            info = described.result(timeout=5)
        except Exception:  # not known yet, coordinator moving: ask again
            info = None
        if info is not None and info.state == ConsumerGroupState.STABLE:
            owned = {
                tp.partition
                for member in info.members
                for tp in member.assignment.topic_partitions
                if tp.topic == topic
            }
            if len(owned) == PARTITIONS or not info.members:
                return True
        time.sleep(0.1)
    return False


def latency(bootstrap: str, slots: list[Slot], rate: float, seconds: float,
            timeout: float) -> dict[str, Any]:
    """End-to-end latency of each slot at a paced offered load (producer runs concurrently)."""
    from htmqc.broker import create_topic

    out: dict[str, Any] = {}
    for slot in slots:
        topic = f"peers-lat-{slot.key}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, PARTITIONS)
        out_topic = _output_topic(bootstrap, slot, topic)
        total = int(rate * seconds)
        with tempfile.TemporaryDirectory(prefix="peers-lat-") as work:
            result_path = Path(work) / "result.json"
            group = f"peers-lat-{uuid.uuid4().hex[:8]}"
            argv = worker_command(slot, bootstrap, topic, total, group, result_path,
                                  latency=True, out_topic=out_topic, timeout=timeout)
            proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            try:
                # Latency is measured from the moment the group owns every partition:
                # a message produced before then waits out the join, which is a start-up
                # cost, not the consumer's latency (it gave the raw loop a 230 ms p99).
                ready = wait_assigned(bootstrap, group, topic, min(timeout, 60.0))
                produced = paced_produce(bootstrap, topic, rate, seconds)
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                out[slot.key] = {"error": f"timed out after {timeout:g}s"}
                continue
            finally:
                _delete_topic(bootstrap, out_topic)
            if proc.returncode != 0 or not result_path.exists():
                tail = (err.strip().splitlines() or ["no output"])[-1]
                out[slot.key] = {"error": f"exit {proc.returncode}: {tail[:300]}"}
                continue
            result = json.loads(result_path.read_text())
        out[slot.key] = {"offered_rate": rate, "seconds": seconds, "assigned_first": ready,
                         "achieved_rate": produced["achieved_rate"],
                         "ends_at": result["latency_at"], "latency_ms": result["latency_ms"],
                         "samples_ms": result["latency_samples_ms"]}
        print(f"latency {slot.key:<10} to {result['latency_at']}: {result['latency_ms']}",
              flush=True)
    return out


def duplicates(bootstrap: str, slots: list[Slot], count: int, timeout: float) -> dict[str, Any]:
    """:func:`benchmarks.peers.kill.duplicates_after_kill` for every slot."""
    out: dict[str, Any] = {}
    for slot in slots:
        def command(s: Slot, topic: str, n: int, group: str, path: Path,
                    **options: Any) -> list[str]:
            return worker_command(s, bootstrap, topic, n, group, path, timeout=timeout,
                                  **options)

        try:
            out[slot.key] = kill.duplicates_after_kill(bootstrap, slot, count, timeout,
                                                       command, spawn)
        except Exception as exc:  # one contender's failure must not lose the others' figures
            out[slot.key] = {"count": count, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"kill {slot.key:<10} {out[slot.key]}", flush=True)
    return out


def goals(doc: dict[str, Any], broker: str = "tansu") -> dict[str, Any]:
    """The issue's goals (:data:`GOALS` of ``broker``) per value size, from the
    throughput medians and the kill test.

    ``kk_vs_quix``: htmqc exactly-once Kafka→Kafka over Quix exactly-once
    Kafka→Kafka (goal ``kk_goal``); ``alo_vs_raw``: htmqc at-least-once over the
    raw loop (goal ``alo_goal``); ``kk_duplicates``: stored duplicates of htmqc
    K→K after the SIGKILL (goal 0). A ratio is None where a side was not measured.
    """
    issue, kk_goal, alo_goal = GOALS[broker]
    def ratio(by_slot: dict[str, Any], top: str, bottom: str) -> float | None:
        a = (by_slot.get(top) or {}).get("rate")
        b = (by_slot.get(bottom) or {}).get("rate")
        return round(a / b, 3) if a and b else None

    out: dict[str, Any] = {"issue": issue, "kk_goal": kk_goal, "alo_goal": alo_goal}
    for size, by_slot in doc.get("throughput", {}).items():
        kk = ratio(by_slot, "htmqc_kk", "quix_kk")
        alo = ratio(by_slot, "htmqc_alo", "raw")
        out[size] = {
            "kk_vs_quix": kk, "kk_vs_quix_met": None if kk is None else kk >= kk_goal,
            "alo_vs_raw": alo, "alo_vs_raw_met": None if alo is None else alo >= alo_goal,
        }
    killed = (doc.get("duplicates_after_kill") or {}).get("htmqc_kk") or {}
    if "duplicates" in killed:
        out["kk_duplicates"] = killed["duplicates"]
        out["kk_duplicates_met"] = killed["duplicates"] == 0 and killed["lost"] == 0
    return out


def goals_text(result: dict[str, Any]) -> str:
    """The goals check as lines for people."""
    def mark(met: bool | None) -> str:
        return "not measured" if met is None else ("MET" if met else "MISSED")

    lines = []
    for size, g in result.items():
        if not isinstance(g, dict):
            continue
        kk = "—" if g["kk_vs_quix"] is None else f"{g['kk_vs_quix']:.2f}x"
        alo = "—" if g["alo_vs_raw"] is None else f"{g['alo_vs_raw']:.0%}"
        lines.append(f"goal {size:>5} B: htmqc K->K vs Quix EO K->K {kk} (>= "
                     f"{result['kk_goal']:g}x: {mark(g['kk_vs_quix_met'])}); htmqc at-least-once "
                     f"vs raw {alo} (>= {result['alo_goal']:.0%}: {mark(g['alo_vs_raw_met'])})")
    if "kk_duplicates" in result:
        lines.append(f"goal htmqc K->K duplicates after SIGKILL: {result['kk_duplicates']} "
                     f"(0, nothing lost: {mark(result['kk_duplicates_met'])})")
    return "\n".join(lines)


def machine(broker: str = "tansu") -> dict[str, Any]:
    """Cores, memory, Python, librdkafka and broker versions, load."""
    from importlib.metadata import version

    import confluent_kafka

    mem_kib = 0
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "confluent_kafka": version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": describe(broker),
        "load_1m_at_start": round(os.getloadavg()[0], 2),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                     description="Benchmark htmqc against peer consumers.")
    parser.add_argument("--quick", action="store_true",
                        help=f"a small run of every measure (defaults {QUICK}, not {FULL})")
    parser.add_argument("--count", type=int, default=None,
                        help=f"messages per throughput run (default {FULL['count']:,})")
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes, comma-separated")
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"throughput runs per slot and size (default {FULL['repeat']})")
    parser.add_argument("--contenders", default=",".join(s.key for s in SLOTS),
                        help="slot keys, comma-separated: " + ",".join(s.key for s in SLOTS))
    parser.add_argument("--broker", choices=BROKERS, default="tansu",
                        help="the broker started for the run (results of each go to their own "
                             "files and README table)")
    parser.add_argument("--bootstrap", default=None,
                        help="use this running broker (of the kind --broker names) instead")
    parser.add_argument("--latency-rate", type=float, default=20_000.0)
    parser.add_argument("--latency-seconds", type=float, default=None, help="0 skips latency")
    parser.add_argument("--kill", action="store_true",
                        help="duplicates after SIGKILL (on by default; accepted for old commands)")
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL test")
    parser.add_argument("--kill-count", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None, help="per contender run, seconds")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--no-charts", action="store_true")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    keys = [k.strip() for k in args.contenders.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown contender {unknown[0]!r}; use some of {', '.join(BY_KEY)}")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be integers like 100,1024, got {args.sizes!r}")
    if any(s < 12 for s in args.sizes):
        parser.error("--sizes must be at least 12 bytes (the id is 12 digits)")
    if args.count <= 0 or args.repeat <= 0 or args.kill_count < 2:
        parser.error("--count and --repeat must be positive, --kill-count at least 2")
    if args.kill and args.no_kill:
        parser.error("--kill and --no-kill contradict each other; pass one")
    args.slots = [BY_KEY[k] for k in keys]
    return args


def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """Every measurement the arguments ask for, as the ``peers.json`` document."""
    doc: dict[str, Any] = {
        "command": "python -m benchmarks.peers " + " ".join(sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(args.broker),
        "count": args.count,
        "sizes": args.sizes,
        "repeat": args.repeat,
        "partitions": PARTITIONS,
        "slots": {s.key: {"label": s.label, "module": s.module, "mode": s.mode}
                  for s in args.slots},
    }
    started = time.monotonic()
    doc["throughput"] = throughput(bootstrap, args.slots, args.sizes, args.count, args.repeat,
                                   args.timeout)
    if args.latency_seconds > 0:
        doc["latency"] = latency(bootstrap, args.slots, args.latency_rate, args.latency_seconds,
                                 args.timeout)
    if not args.no_kill:
        doc["duplicates_after_kill"] = duplicates(bootstrap, args.slots, args.kill_count,
                                                  args.timeout)
    doc["goals"] = goals(doc, args.broker)
    doc["load_1m_at_end"] = round(os.getloadavg()[0], 2)
    doc["wall_seconds"] = round(time.monotonic() - started, 1)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Measure, then write JSON, charts and the README table; print the goals check."""
    from benchmarks.charts import write_charts
    from benchmarks.peers.table import update_readme

    args = parse_args(argv)
    if args.bootstrap:
        doc = measure(args, args.bootstrap)
    else:
        with running(args.broker) as bootstrap:
            doc = measure(args, bootstrap)
    args.results.mkdir(parents=True, exist_ok=True)
    end = suffix(args.broker)
    if not args.no_charts:
        doc["charts"] = [str(p.name) for p in write_charts(doc, args.results, end)]
    out = args.results / f"peers{end}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    update_readme(args.readme, doc, args.broker)
    print(goals_text(doc["goals"]))
    print(f"wrote {out} and the table in {args.readme} "
          f"({doc['wall_seconds']:.0f} s measuring)")
    return 0
