"""How long Apache Kafka takes to start here (:func:`htmqc.kafka_cluster.start_kafka`).

For each cluster size (1 and 3 nodes) it starts and closes the cluster
``--runs`` times and prints each run and the median of:

- ``ready``: from the call until ``start_kafka`` returns (storage formatted,
  every node logged its start, metadata lists every broker);
- ``first_txn``: from then until a transactional producer has committed one
  record and a ``read_committed`` group consumer has read it (creates the
  transaction state log and the offsets topic, as the first test does);
- ``close``: :meth:`KafkaCluster.close` (every JVM killed and reaped).

``load_1m`` is the 1-minute load average before each run: the machine is
shared, so compare figures taken under similar load. ``--jvm throughput``
starts the nodes with both JIT compilers (``THROUGHPUT_JVM_OPTIONS``) instead
of the default client JIT only (``JVM_OPTIONS``).

Usage::

    python -m benchmarks.kafka_startup [--runs 3] [--nodes 1,3] [--jvm default|throughput]
                                       [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from htmqc.broker import create_topic
from htmqc.kafka_cluster import JVM_OPTIONS, THROUGHPUT_JVM_OPTIONS, start_kafka
from htmqc.kafka_defaults import consumer_config, producer_config


def first_transaction(bootstrap: str) -> None:
    """One committed transactional record, read back by a read_committed group."""
    topic = f"startup-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    producer = Producer(producer_config(bootstrap, transactional_id=f"{topic}-tx"))
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"x")
    producer.commit_transaction(60)
    consumer = Consumer(consumer_config(bootstrap, f"{topic}-g"))
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if any(m.error() is None for m in consumer.consume(1, 0.2)):
                return
        raise RuntimeError("the first record was not read within 60 s")
    finally:
        consumer.close()


JVMS = {"default": JVM_OPTIONS, "throughput": THROUGHPUT_JVM_OPTIONS}


def one_run(nodes: int, jvm_options: tuple[str, ...]) -> dict[str, float]:
    load = os.getloadavg()[0]
    started = time.monotonic()
    cluster = start_kafka(nodes, jvm_options=jvm_options)
    try:
        ready = time.monotonic() - started
        mark = time.monotonic()
        first_transaction(cluster.bootstrap)
        first_txn = time.monotonic() - mark
    finally:
        mark = time.monotonic()
        cluster.close()
        close = time.monotonic() - mark
    return {"load_1m": load, "ready": ready, "first_txn": first_txn, "close": close}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", default="1,3", help="comma-separated cluster sizes")
    parser.add_argument("--jvm", choices=sorted(JVMS), default="default")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for nodes in (int(n) for n in args.nodes.split(",")):
        runs = []
        for i in range(args.runs):
            run = one_run(nodes, JVMS[args.jvm])
            runs.append(run)
            print(
                f"{nodes} node(s) run {i + 1}: ready {run['ready']:.1f} s, first transaction "
                f"{run['first_txn']:.1f} s, close {run['close']:.1f} s "
                f"(load {run['load_1m']:.1f})",
                flush=True,
            )
        median = {k: statistics.median(r[k] for r in runs) for k in ("ready", "first_txn", "close")}
        print(
            f"{nodes} node(s) median of {args.runs}: ready {median['ready']:.1f} s, "
            f"first transaction {median['first_txn']:.1f} s, close {median['close']:.1f} s",
            flush=True,
        )
        results[str(nodes)] = {"jvm": args.jvm, "runs": runs, "median": median}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
