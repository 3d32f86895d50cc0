"""Apache Pulsar throughput: a raw pulsar-client reader loop against htmqc over Pulsar.

One private standalone broker (:mod:`htmqc.sources.pulsar_server`), one partitioned
topic of ``--partitions`` partitions holding ``--count`` x 100-byte messages
(:func:`htmqc.sources.pulsar.produce`, batched, 1,000 keys). Each variant reads the
whole topic, in this process, timed from its first message to its last (connections
and readers' creation left out):

* ``raw_loop``: pulsar-client alone, one non-durable reader per partition from the
  earliest message, each read by its own thread with ``read_next`` (key and
  properties read, as the adapter does), no offset mapping, no position stored: the
  ceiling of this client;
* ``at_least_once``: ``htmqc`` at-least-once (``--source pulsar``), the handler
  counts; commits go to the commit topic;
* ``exactly_once_sqlite``: ``htmqc`` exactly-once into SQLite with the exactly-once
  benchmark's handler (``examples.effects.record``: one INSERT per message).

Every variant runs ``--rounds`` times (default once), interleaved; the medians and
their ratios to ``raw_loop`` are printed and written to
``benchmarks/results/pulsar.json``.

Run with contracts off: ``HTMQC_CONTRACTS=0 python -m benchmarks.pulsar_bench``.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import source_bench
from benchmarks.source_bench import TOPIC, Producing, Variant, measure
from htmqc.sources.pulsar import PulsarClient, partition_topic, produce
from htmqc.sources.pulsar_server import start_pulsar


def raw_loop(url: str, topic: str, partitions: int, count: int) -> float:
    """msg/s of plain pulsar-client readers: one per partition and thread, from the
    earliest message, reading key, properties and value of each."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    readers = [
        client.create_reader(partition_topic(topic, p), pulsar.MessageId.earliest)
        for p in range(partitions)
    ]
    lock = threading.Lock()
    seen = [0]
    first = [0.0]
    done = threading.Event()

    def read(reader: Any) -> None:
        while not done.is_set():
            try:
                msg = reader.read_next(200)
            except pulsar.Timeout:
                continue
            msg.partition_key(), msg.properties(), msg.data(), msg.message_id()
            with lock:
                if not seen[0]:
                    first[0] = time.perf_counter()
                seen[0] += 1
                if seen[0] >= count:
                    done.set()

    threads = [threading.Thread(target=read, args=(r,)) for r in readers]
    try:
        for t in threads:
            t.start()
        done.wait(600)
        rate = count / (time.perf_counter() - first[0])
    finally:
        done.set()
        for t in threads:
            t.join()
        client.close()
    return rate


def _run(work: Path, args: argparse.Namespace, runs: dict[str, list[float]]) -> dict[str, Any]:
    """Start the broker, measure every variant, stop it."""
    with start_pulsar() as server:
        url = server.bootstrap  # the raw loop needs no admin port
        raw: dict[str, Variant] = {
            "raw_loop": lambda r: raw_loop(server.url, TOPIC, args.partitions, args.count)
        }
        measure("pulsar", url, Producing(PulsarClient(url), produce), raw, work, args, runs)
    return {}


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--rounds`` times, interleaved; print and store the medians."""
    from importlib.metadata import version

    return source_bench.main(
        argv, doc=__doc__ or "", name="pulsar", count=100_000, rounds=1, run=_run,
        versions=lambda: {"pulsar_client": version("pulsar-client")},
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
