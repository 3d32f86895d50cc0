"""``make demo``: exactly-once into SQLite across two SIGKILLs, with an audit.

Starts the bundled broker, creates an 8-partition topic, starts
``htmqc run examples.effects:record --mode exactly-once --sink sqlite:///...``
as a subprocess, produces ``--count`` messages with unique ids while it runs,
SIGKILLs the consumer twice at random moments (seeded; the moments are printed)
and restarts it each time, waits until every message's effect is stored, then
audits the SQLite file: produced, effects, distinct ids, lost, duplicated,
throughput, p50/p99 end-to-end latency (effect time - message timestamp).
Exits 1 if anything was lost or duplicated.

``--broker kafka`` (``make demo BROKER=kafka``) runs the same on a single-node
Apache Kafka in KRaft mode on loopback (the jars ``make setup`` fetched from
Maven Central) instead of the bundled broker.

Run: ``python -m benchmarks.demo [--count N] [--seed S] [--kills K] [--broker B]``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from htmqc.broker import create_topic, start_broker
from htmqc.errors import HtmqcError
from htmqc.kafka_cluster import start_kafka
from htmqc.produce import produce

PARTITIONS = 8
BROKERS = ("bundled", "kafka")


class Running(Protocol):
    """What the demo needs of a started broker."""

    @property
    def bootstrap(self) -> str: ...


def broker_of(kind: str) -> AbstractContextManager[Running]:
    """Start the broker the demo runs on (``bundled``: Tansu; ``kafka``: Apache Kafka)."""
    return start_kafka() if kind == "kafka" else start_broker()


def consumer(bootstrap: str, topic: str, db: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start one ``htmqc run`` of the demo handler."""
    env = dict(os.environ, HTMQC_CONTRACTS=os.environ.get("HTMQC_CONTRACTS", "0"))
    cmd = [
        sys.executable,
        "-m",
        "htmqc",
        "run",
        "examples.effects:record",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        "demo",
        "--mode",
        "exactly-once",
        "--sink",
        f"sqlite:///{db}",
        "--txn-messages",
        "2000",
        "--txn-ms",
        "200",
        "--kafka-config",
        "group.instance.id=demo-member",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def stored(db: Path, topic: str) -> int:
    """Messages the sink's positions cover (sum of committed offsets)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(committed), 0) FROM htmqc_positions WHERE topic = ?", (topic,)
            ).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])


def audit(db: Path, produced: int) -> dict[str, float]:
    """The audit figures from the effects table."""
    with sqlite3.connect(db) as conn:
        effects, distinct = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT id) FROM effects"
        ).fetchone()
        in_range = conn.execute(
            "SELECT COUNT(DISTINCT id) FROM effects WHERE id >= 0 AND id < ?", (produced,)
        ).fetchone()[0]
        first, last = conn.execute("SELECT MIN(effect_ms), MAX(effect_ms) FROM effects").fetchone()
        lat = [r[0] for r in conn.execute("SELECT effect_ms - produced_ms FROM effects ORDER BY 1")]

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

    return {
        "produced": produced,
        "effects": effects,
        "distinct_ids": distinct,
        "lost": produced - in_range,
        "duplicated": effects - distinct,
        "effect_span_s": ((last or 0) - (first or 0)) / 1000.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 if nothing was lost or duplicated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=170.0, help="give up after SECONDS")
    parser.add_argument("--broker", choices=BROKERS, default="bundled",
                        help="the bundled broker (default) or Apache Kafka")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except HtmqcError as exc:
        print(exc.line(), file=sys.stderr)
        return exc.exit_code


def run(args: argparse.Namespace) -> int:
    """The demo itself (see the module docs)."""
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="htmqc-demo-"))
    db, log = work / "demo.db", work / "consumer.log"
    print(f"demo: {args.count} messages, {PARTITIONS} partitions, seed {args.seed}, "
          f"{args.broker} broker, dir {work}")
    started = time.monotonic()
    with broker_of(args.broker) as broker:
        topic = "demo"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        proc = consumer(broker.bootstrap, topic, db, log)
        result: dict[str, float] = {}
        producer = threading.Thread(
            target=lambda: result.update(
                rate=produce(broker.bootstrap, topic, args.count, keys=1000, size=100).rate
            ),
            daemon=True,
        )
        producer.start()
        kills = sorted(rng.uniform(0.1, 0.8) for _ in range(args.kills))
        print(
            "demo: SIGKILL when these fractions are stored:", ", ".join(f"{k:.2f}" for k in kills)
        )
        deadline = started + args.timeout
        try:
            while time.monotonic() < deadline:
                done = stored(db, topic)
                if kills and done >= kills[0] * args.count:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    print(
                        f"demo: SIGKILL at {done} stored "
                        f"({time.monotonic() - started:.1f} s); restarting"
                    )
                    kills.pop(0)
                    proc = consumer(broker.bootstrap, topic, db, log)
                if done >= args.count and not producer.is_alive():
                    break
                if proc.poll() is not None:
                    print(f"demo: consumer exited with {proc.returncode}; see {log}")
                    proc = consumer(broker.bootstrap, topic, db, log)
                time.sleep(0.05)
            else:
                print(f"demo: timed out after {args.timeout:g} s with {stored(db, topic)} stored")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elapsed = time.monotonic() - started
    figures = audit(db, args.count)
    print(f"demo: producer rate {result.get('rate', 0):,.0f} msg/s")
    for name, value in figures.items():
        print(
            f"  {name:14s} {value:,.1f}" if isinstance(value, float) else f"  {name:14s} {value:,}"
        )
    print(f"  {'wall_s':14s} {elapsed:,.1f}")
    print(
        f"  {'throughput':14s} {figures['effects'] / max(elapsed, 1e-9):,.0f} msg/s "
        "(wall, incl. restarts)"
    )
    ok = figures["lost"] == 0 and figures["duplicated"] == 0 and figures["effects"] > 0
    print("demo: OK: nothing lost, nothing duplicated" if ok else "demo: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
