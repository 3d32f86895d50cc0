"""Where a broker run's CPU goes, thread by thread: this htmqc against an older one.

Issue 16 moved handlers off the poll thread; the peers' benchmark shows the
cost as a ratio of throughputs, which moves by ±0.05 from run to run on this
shared box. This splits it instead. It starts the bundled broker (or
single-node Apache Kafka), produces ``--count`` messages once, and runs each
tree's ``htmqc run`` (the peers' harness, :mod:`benchmarks.peers.htmqc_peer`,
at-least-once by default) in a child process of its own, ``--repeat`` times,
interleaved. The child reads ``/proc/self/task`` at the first and the last handler
call and prints each thread's CPU per message: the poll loop (the main thread), htmqc's worker
threads (``htmqc-*``: lanes, the transaction worker), librdkafka's
(``rdk:*``), and the process's whole CPU time, from the first handler call to
the last (thread times in clock ticks: 10 ms). CPU time is what this measures
well under load: the throughput it prints is only indicative.

Trees: ``this`` (the tree this runs from) and any ``NAME=DIR/src`` (e.g. one
exported with ``git archive REV src | tar -x -C DIR``). The handler is the
peers' own (:func:`~benchmarks.peers.htmqc_peer.handle_alo`: parse the id,
add it up); ``--handler-only`` times it alone over prebuilt messages, to tell
the handler's share of a worker thread from htmqc's.

Run: ``HTMQC_CONTRACTS=0 python -m benchmarks.thread_cpu base=/tmp/base/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("at-least-once", "exactly-once", "exactly-once-kafka")


def _threads() -> dict[int, tuple[str, float]]:
    """``{tid: (name, cpu seconds)}`` of this process's threads now."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def group_of(tid: int, name: str, pid: int) -> str:
    """The part a thread belongs to: ``poll`` (the main thread), ``htmqc-*``,
    ``rdk:*`` (librdkafka's, without the broker number), or ``other``."""
    if tid == pid:
        return "poll"
    if name.startswith("htmqc-"):
        return name.rstrip("0123456789").rstrip("-")
    if name.startswith("rdk:"):
        return name.rstrip("0123456789-/")
    return "other"


def child(bootstrap: str, topic: str, count: int, mode: str) -> dict[str, Any]:
    """Run one ``htmqc run`` here; its rate and CPU per message by thread group,
    from the first handler call to the last (as the peers' harness counts)."""
    from benchmarks.peers import common, htmqc_peer

    marks: list[tuple[float, float, dict[int, tuple[str, float]]]] = []
    handle = common.Meter.handle

    def marked(self: common.Meter, *args: Any, **kwargs: Any) -> None:
        handle(self, *args, **kwargs)
        if self.seen in (1, self.count):
            marks.append((time.perf_counter(), time.process_time(), _threads()))

    common.Meter.handle = marked  # type: ignore[method-assign]
    _name_htmqc_threads()
    htmqc_peer.run(bootstrap, topic, count, group=f"cpu-{uuid.uuid4().hex[:8]}", mode=mode)
    (wall0, cpu0, first), (wall1, cpu1, last) = marks
    groups: dict[str, float] = {}
    for tid, (name, seconds) in last.items():
        key = group_of(tid, name, os.getpid())
        groups[key] = groups.get(key, 0.0) + seconds - first.get(tid, (name, 0.0))[1]
    per = 1e6 / (count - 1)
    return {"rate": round((count - 1) / (wall1 - wall0)), "cpu_us": round((cpu1 - cpu0) * per, 3),
            "threads_us": {k: round(v * per, 3) for k, v in sorted(groups.items())}}


def _name_htmqc_threads() -> None:
    """Give each Python thread the kernel name of its Python name (15 bytes), so
    ``/proc`` tells htmqc's workers apart (Python 3.11 does not)."""
    import ctypes

    libc = ctypes.CDLL(None)
    original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        libc.prctl(15, self.name[:15].encode(), 0, 0, 0)  # PR_SET_NAME
        original(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


def handler_only(count: int) -> float:
    """µs of CPU per message of the peers' at-least-once handler alone."""
    from confluent_kafka import Message

    from benchmarks.peers import htmqc_peer
    from benchmarks.peers.common import Meter
    from htmqc.produce import message_key, message_value

    msgs = [Message(topic="t", partition=i % 8, offset=i, key=message_key(i, 1000),
                    value=message_value(i, 100), timestamp=(1, 1_700_000_000_000))
            for i in range(count)]
    best = float("inf")
    for _ in range(3):
        htmqc_peer.METER = Meter(count)
        started = time.thread_time()
        for msg in msgs:
            htmqc_peer.handle_alo(msg)
        best = min(best, time.thread_time() - started)
    return best / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="NAME=DIR/src: other trees to run beside this")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, default="at-least-once")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--handler-only", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("BOOTSTRAP", "TOPIC", "MODE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        bootstrap, topic, mode = args.child
        print(json.dumps(child(bootstrap, topic, args.count, mode)), flush=True)
        return 0
    if args.handler_only:
        print(f"handler alone: {handler_only(min(args.count, 300_000)):.3f} µs/msg")
        return 0
    trees = {"this": str(ROOT / "src")}
    for spec in args.trees:
        name, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "htmqc").is_dir():
            print(f"error: {spec!r} is not NAME=DIR/src with DIR/src/htmqc in it; "
                  "export one with `git archive REV src | tar -x -C DIR`", file=sys.stderr)
            return 2
        trees[name] = path
    from benchmarks.brokers import running
    from htmqc.produce import produce

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with running(args.broker) as bootstrap:
        topic = f"cpu-{uuid.uuid4().hex[:6]}"
        produce(bootstrap, topic, args.count, keys=1000, size=args.size, partitions=8)
        for n in range(args.repeat):
            for name, src in trees.items():
                env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{src}",
                       "HTMQC_CONTRACTS": "0"}
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.thread_cpu", "--count", str(args.count),
                     "--child", bootstrap, topic, args.mode],
                    env=env, capture_output=True, text=True, check=False, cwd=ROOT,
                )
                if done.returncode != 0:
                    print(f"error: {name}: {done.stderr.strip().splitlines()[-1:]}",
                          file=sys.stderr)
                    return 1
                row = json.loads(done.stdout.strip().splitlines()[-1])
                results[name].append(row)
                print(f"[{n + 1}/{args.repeat}] {name:<6} {row['rate']:>9,} msg/s  "
                      f"CPU {row['cpu_us']:.3f} µs/msg  " + "  ".join(
                          f"{k} {v:.3f}" for k, v in row["threads_us"].items() if v >= 0.005),
                      flush=True)
    print(f"medians of {args.repeat} ({args.mode}, {args.size} B, {args.count:,} messages, "
          f"{args.broker}), µs of CPU per message:")
    for name, rows in results.items():
        groups = sorted({k for r in rows for k in r["threads_us"]})
        parts = {k: statistics.median(r["threads_us"].get(k, 0.0) for r in rows) for k in groups}
        print(f"  {name:<6} whole {statistics.median(r['cpu_us'] for r in rows):.3f}  " +
              "  ".join(f"{k} {v:.3f}" for k, v in parts.items() if v >= 0.005))
    return 0


if __name__ == "__main__":
    sys.exit(main())
